"""Epoch-level metrics under ddp_spawn are reduced across ranks, with no "use sync_dist" warning.

Two CPU ranks see different rows (the distributed sampler deals them out alternately), so each
rank's own epoch loss differs; the oracle is the closed-form mean over every row. The module's
member logits are fixed functions of the input (its one parameter has learning rate 0), so the
closed form holds at every step.
"""

import warnings
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from helpers.ddp import DestroyGlooAtExit
from torch import nn
from torch.utils.data import DataLoader

from ripieno.callbacks import DiversityMonitor, MCDropoutSampler, TemperatureScaling
from ripieno.framework.methods.member_module import MemberModule
from ripieno.framework.metrics.diversity import MemberDisagreement, PairwiseKLDivergence

RECOMMENDED = "It is recommended to use"


def _rows(n):
    """``n`` rows: ``x`` spread over ``[-2, 2]``, labels alternating, so the two ranks get a class each."""
    return [{"x": torch.tensor([4.0 * i / (n - 1) - 2.0]), "y": torch.tensor(i % 2)} for i in range(n)]


def _member_logits(x):
    """Two members' logits ``(B, 2, 2)``, fixed functions of ``x`` ``(B, 1)``."""
    return torch.stack([torch.cat([x, -x], 1), torch.cat([0.5 * x, torch.ones_like(x)], 1)], 1)


def _stack(rows):
    return torch.stack([r["x"] for r in rows]), torch.stack([r["y"] for r in rows])


class FixedMembers(MemberModule):
    """A member module whose outputs never change; ``forward`` (MC dropout's input) drops out."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.drop = nn.Dropout(0.5)
        self.init_members("logits", 2)

    def forward(self, x):
        return self.drop(_member_logits(x)[:, 0] * self.scale)

    def forward_members(self, batch):
        return _member_logits(batch["x"]) * self.scale

    def build_optimizer(self, parameters):
        return torch.optim.SGD(parameters, lr=0.0)


class Rows(L.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.train, self.val, self.test = _rows(16), _rows(8), _rows(12)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=4)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=4)

    def test_dataloader(self):
        return DataLoader(self.test, batch_size=3)


class RecordWarnings(L.Callback):
    """Each rank records its warnings from setup to teardown in ``<folder>/<stage>-<rank>.txt``.

    ``control`` logs one unsynced epoch value on validation and test: the warning it must draw
    shows that the recording sees Lightning's warning.
    """

    def __init__(self, folder):
        self.folder = str(folder)

    def setup(self, trainer, pl_module, stage):
        self._catcher = warnings.catch_warnings(record=True)
        self._records = self._catcher.__enter__()
        warnings.simplefilter("always")

    def on_validation_epoch_end(self, trainer, pl_module):
        pl_module.log("control", 1.0)

    on_test_epoch_end = on_validation_epoch_end

    def on_train_end(self, trainer, pl_module):
        names = ("train/loss", "diversity/val/pairwise_kl", "diversity/val/disagreement")
        values = torch.stack([trainer.callback_metrics[name] for name in names])
        gathered = trainer.strategy.all_gather(values)
        if trainer.is_global_zero:
            torch.save(gathered, Path(self.folder) / "fit.pt")

    def teardown(self, trainer, pl_module, stage):
        self._catcher.__exit__(None, None, None)
        lines = [str(w.message).replace("\n", " ") for w in self._records]
        stage = getattr(stage, "value", stage)  # Lightning passes a TrainerFn
        (Path(self.folder) / f"{stage}-{trainer.global_rank}.txt").write_text("\n".join(lines))


def _diversity(rows):
    x, _ = _stack(rows)
    kl, disagreement = PairwiseKLDivergence(), MemberDisagreement()
    kl.update(_member_logits(x))
    disagreement.update(_member_logits(x))
    return float(kl.compute()), float(disagreement.compute())


@pytest.mark.slow
def test_epoch_metrics_are_the_mean_over_ranks_without_the_sync_dist_warning(tmp_path):
    data, scaling = Rows(), TemperatureScaling()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=1, logger=False,
                        num_sanity_val_steps=0, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, default_root_dir=str(tmp_path),
                        callbacks=[DiversityMonitor(), scaling, MCDropoutSampler(n_samples=2),
                                   RecordWarnings(tmp_path), DestroyGlooAtExit()])
    model = FixedMembers()
    trainer.fit(model, datamodule=data)
    scaling.load_state_dict({"temperature": 2.0})  # the workers' fitted one stays in the workers
    result = trainer.test(model, datamodule=data, verbose=False)[0]

    # train/loss: the mean over all 16 rows, though rank 0 holds the even rows (class 0) and rank 1 the odd
    x, y = _stack(data.train)
    per_row = F.cross_entropy(_member_logits(x).flatten(0, 1), y.repeat_interleave(2), reduction="none")
    per_row = per_row.view(-1, 2).mean(1)
    assert float(per_row[0::2].mean()) != pytest.approx(float(per_row[1::2].mean()), rel=0.1)
    fit = torch.load(tmp_path / "fit.pt", weights_only=True)  # (rank, metric)
    assert fit[:, 0].tolist() == pytest.approx([float(per_row.mean())] * 2, rel=1e-6)
    # diversity on validation and test: torchmetrics states over every row of the split
    for rank in (0, 1):
        assert fit[rank, 1:].tolist() == pytest.approx(list(_diversity(data.val)), rel=1e-6)
    expected_kl, expected_disagreement = _diversity(data.test)
    assert result["diversity/test/pairwise_kl"] == pytest.approx(expected_kl, rel=1e-6)
    assert result["diversity/test/disagreement"] == pytest.approx(expected_disagreement, rel=1e-6)
    assert {"uq/test/nll", "calibrated/test/nll", "calibrated/test/temperature"} <= set(result)

    # no epoch value of ripieno's is logged unsynced: the only recommendation is the control's
    for stage in ("fit", "test"):
        recorded = (tmp_path / f"{stage}-0.txt").read_text().splitlines()
        recommended = [line for line in recorded if RECOMMENDED in line]
        assert recommended and all("'control'" in line for line in recommended), recommended
