"""Resume: 2 epochs + 2 resumed epochs == 4 epochs straight (weights and callback state)."""

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from ripieno.callbacks import DiversityMonitor
from ripieno.datamodules import LoaderSettings, TabularDataModule
from ripieno.framework import TabularEnsembleModule


def _run(tmp_path, max_epochs, ckpt_path=None):
    L.seed_everything(0)
    dm = TabularDataModule("mlc_churn", max_rows=500, n_bins=8, loader=LoaderSettings(batch_size=64))
    model = TabularEnsembleModule(dm.spec, k=4, d_block=32, dropout=0.2, adapter="lometab")
    monitor = DiversityMonitor()
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = L.Trainer(max_epochs=max_epochs, deterministic=True, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[monitor, checkpoint], default_root_dir=tmp_path)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path, weights_only=True)
    return model, monitor, checkpoint


def test_resume_equals_straight_run(tmp_path):
    straight, straight_monitor, _ = _run(tmp_path / "straight", 4)
    _, _, first = _run(tmp_path / "resumed", 2)
    resumed, resumed_monitor, _ = _run(tmp_path / "resumed2", 4, ckpt_path=first.last_model_path)
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    # The callback's history was restored and continued, not restarted.
    assert [h["epoch"] for h in resumed_monitor.history] == [0, 1, 2, 3]
    assert resumed_monitor.history == straight_monitor.history
