"""The M-cover and GeoReg callbacks under ddp_spawn: every rank ends with the same state."""

import lightning as L
import pytest
import torch
from helpers.ddp import DestroyGlooAtExit
from transformers import BertConfig, BertModel

from ripieno.callbacks import ElasticAveraging, GeoReg, ReplicaCoupling, RoutingResampler
from ripieno.datamodules import ImageDataModule, LayerEmbeddingDataModule, LoaderSettings, TextDataModule
from ripieno.datamodules.layer_embedding_config import BackboneConfig, FeatureCacheConfig, SelectionConfig
from ripieno.framework import FusionClassifier, MCoverClassifier
from ripieno.framework.backbones.loading import minilm_dir


class _GatherState(L.Callback):
    """Gather each rank's tensors at the end of training and save them on rank 0."""

    def __init__(self, path, tensors):
        self.path, self.tensors = str(path), tensors

    def on_train_end(self, trainer, pl_module):
        gathered = {name: trainer.strategy.all_gather(fn(pl_module, trainer).contiguous())
                    for name, fn in self.tensors.items()}
        if trainer.is_global_zero:
            torch.save(gathered, self.path)


def _copy_weights(module, trainer):
    return torch.cat([p.detach().flatten() for p in module.net.copy_parameters()])


def _easgd_centre(module, trainer):
    easgd = next(c for c in trainer.callbacks if isinstance(c, ElasticAveraging))
    return torch.cat([c.flatten() for c in easgd.centre])


def _bank(module, trainer):
    return module.bank_perms


def _head(module, trainer):
    return torch.cat([p.detach().flatten() for p in module.head.parameters()])


def _train_isotropy(module, trainer):
    return trainer.callback_metrics["georeg/train/isotropy"].reshape(1)


def _ddp(tmp_path, callbacks, epochs=1):
    return L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=epochs, logger=False,
                     enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
                     default_root_dir=str(tmp_path), callbacks=[*callbacks, DestroyGlooAtExit()])


@pytest.mark.slow
def test_replica_coupling_and_easgd_keep_ranks_identical(tmp_path):
    torch.manual_seed(0)
    dm = ImageDataModule("digits", max_train_rows=192, loader=LoaderSettings(batch_size=32))
    model = MCoverClassifier(dm.spec, m=3, hidden=[16], kernel="uniform", bank_size=4)
    easgd = ElasticAveraging(alpha=0.1)
    gather = _GatherState(tmp_path / "state.pt", {"weights": _copy_weights, "centre": _easgd_centre,
                                                  "bank": _bank})
    _ddp(tmp_path, [RoutingResampler(every_n_steps=1), ReplicaCoupling(gamma0=0.1), easgd, gather]).fit(
        model, datamodule=dm)
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    for name in ("weights", "centre", "bank"):
        assert torch.equal(state[name][0], state[name][1]), name


@pytest.mark.slow
def test_georeg_under_ddp_logs_and_keeps_ranks_identical(tmp_path):
    torch.manual_seed(0)
    backbone = tmp_path / "bert"
    BertModel(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64)).save_pretrained(backbone)
    source = TextDataModule("rotten_tomatoes", tokenizer_dir=str(minilm_dir()), max_rows=200, max_length=16)
    dm = LayerEmbeddingDataModule(source, backbone=BackboneConfig(dir=str(backbone)),
                                  selection=SelectionConfig(method="all"),
                                  cache=FeatureCacheConfig(dir=str(tmp_path / "cache")), progress=False,
                                  batch_size=32)
    model = FusionClassifier(dm.spec, d_proj=8)
    gather = _GatherState(tmp_path / "state.pt", {"head": _head, "isotropy": _train_isotropy})
    _ddp(tmp_path, [GeoReg(weight=1.0), gather], epochs=2).fit(model, datamodule=dm)
    state = torch.load(tmp_path / "state.pt", weights_only=True)
    assert torch.equal(state["head"][0], state["head"][1])
    assert torch.equal(state["isotropy"][0], state["isotropy"][1])  # synced across ranks
