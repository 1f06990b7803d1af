"""DiversityMonitor with a user's own module, under DDP and across resume."""

import itertools

import lightning as L
import numpy as np
import pytest
import torch
from helpers.ddp import DestroyGlooAtExit
from scipy.special import softmax
from scipy.stats import entropy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ripieno.callbacks import DiversityMonitor

K, C = 4, 3


class UserEnsemble(L.LightningModule):
    """Not a ripieno module: K linear heads, returns member logits (B, K, C)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.heads = nn.Linear(5, K * C)

    def forward(self, x):
        return self.heads(x).view(-1, K, C)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x).flatten(0, 1), y.repeat_interleave(K))

    def validation_step(self, batch, batch_idx):
        return {"member_outputs": self(batch[0])}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data(n=64):
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(n, 5, generator=g), torch.randint(0, C, (n,), generator=g))


def _reference(model, data):
    with torch.no_grad():
        probs = softmax(model(data.tensors[0]).numpy(), axis=-1)
    kl = np.mean([entropy(p[i], p[j]) for p in probs for i, j in itertools.permutations(range(K), 2)])
    votes = probs.argmax(-1)
    dis = np.mean([v[i] != v[j] for v in votes for i, j in itertools.permutations(range(K), 2)])
    return kl, dis


def _trainer(tmp_path, extra_callbacks=(), **kwargs):
    return L.Trainer(accelerator="cpu", logger=False, enable_progress_bar=False,
                     enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path,
                     callbacks=[DiversityMonitor(output_kind="logits"), *extra_callbacks], **kwargs)


def test_user_module_diversity_matches_scipy(tmp_path):
    model, data = UserEnsemble(), _data()
    result = _trainer(tmp_path, devices=1).validate(model, DataLoader(data, batch_size=8))[0]
    kl, dis = _reference(model, data)
    assert result["diversity/val/pairwise_kl"] == pytest.approx(kl, rel=1e-4)
    assert result["diversity/val/disagreement"] == pytest.approx(dis, abs=1e-6)


@pytest.mark.slow
def test_ddp_two_processes_log_the_same_numbers(tmp_path):
    data = _data(64)  # divisible by 2 ranks x batch 8: DistributedSampler adds no padding
    single = _trainer(tmp_path, devices=1).validate(UserEnsemble(), DataLoader(data, batch_size=8))[0]
    ddp = _trainer(tmp_path, devices=2, strategy="ddp_spawn", extra_callbacks=[DestroyGlooAtExit()]).validate(
        UserEnsemble(), DataLoader(data, batch_size=8))[0]
    for name in ("diversity/val/pairwise_kl", "diversity/val/disagreement"):
        assert ddp[name] == pytest.approx(single[name], rel=1e-5), name


def test_missing_member_outputs_error_names_the_key(tmp_path):
    class NoMembers(UserEnsemble):
        def validation_step(self, batch, batch_idx):
            return {"loss": self(batch[0]).sum()}

    with pytest.raises(ValueError, match="'member_outputs' shaped \\(batch, members"):
        _trainer(tmp_path, devices=1).validate(NoMembers(), DataLoader(_data(), batch_size=8))


def test_auto_kind_needs_member_output_kind(tmp_path):
    trainer = L.Trainer(logger=False, enable_progress_bar=False, callbacks=[DiversityMonitor()])
    with pytest.raises(ValueError, match="member_output_kind"):
        trainer.validate(UserEnsemble(), DataLoader(_data(), batch_size=8))


def test_history_round_trips_through_state_dict():
    monitor = DiversityMonitor()
    monitor.history = [{"epoch": 0, "step": 3, "diversity/val/pairwise_kl": 0.5}]
    other = DiversityMonitor()
    other.load_state_dict(monitor.state_dict())
    assert other.history == monitor.history
    assert other.state_key == monitor.state_key
