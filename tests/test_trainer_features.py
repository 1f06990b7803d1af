"""Trainer flags users rely on: bf16-mixed, DDP on CPU, TensorBoard beside CSV logs."""

import importlib.util

import lightning as L
import pytest
import torch
from helpers.ddp import DestroyGlooAtExit

from ripieno.callbacks import DiversityMonitor
from ripieno.datamodules import LoaderSettings, TabularDataModule
from ripieno.framework import TabularEnsembleModule
from ripieno.framework.cli import main


def _fit(tmp_path, **trainer_kwargs):
    L.seed_everything(0)
    dm = TabularDataModule("mlc_churn", max_rows=600, n_bins=8, loader=LoaderSettings(batch_size=64,
                           eval_batch_size=60))
    model = TabularEnsembleModule(dm.spec, k=4, d_block=32, adapter="lometab")
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False,
                        default_root_dir=tmp_path, callbacks=[DiversityMonitor(), DestroyGlooAtExit()],
                        **trainer_kwargs)
    trainer.fit(model, datamodule=dm)
    return trainer, model, dm


def test_bf16_mixed_trains_and_keeps_float32_weights(tmp_path):
    trainer, model, dm = _fit(tmp_path, precision="bf16-mixed")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(torch.isfinite(p).all() for p in model.parameters())
    metrics = trainer.validate(model, datamodule=dm, verbose=False)[0]
    assert metrics["diversity/val/pairwise_kl"] >= 0.0
    assert 0.0 <= metrics["val/accuracy"] <= 1.0


@pytest.mark.slow
def test_ddp_spawn_fit_matches_single_process_metrics(tmp_path):
    """Two CPU processes: validation metrics equal a one-process validation of the same weights."""
    trainer, model, dm = _fit(tmp_path, accelerator="cpu", devices=2, strategy="ddp_spawn")
    ddp_metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith(("val/", "div"))}
    single = L.Trainer(logger=False, enable_progress_bar=False, callbacks=[DiversityMonitor()])
    single_metrics = single.validate(model, datamodule=dm, verbose=False)[0]
    # 120 validation rows = 2 ranks x 60: DistributedSampler adds no duplicates.
    for name in ("val/accuracy", "val/nll", "diversity/val/pairwise_kl", "diversity/val/disagreement"):
        assert ddp_metrics[name] == pytest.approx(single_metrics[name], rel=1e-4, abs=1e-6), name


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")
def test_tensorboard_logs_beside_csv(tmp_path, capsys):
    main(["fit", "-c", "recipes/tabular/lometab_churn.yaml", "--trainer.max_epochs=1",
          "--data.init_args.max_rows=600", "--trainer.enable_progress_bar=false",
          f"--trainer.default_root_dir={tmp_path}"])
    out = capsys.readouterr().out
    version_dir = next(tmp_path.rglob("metrics.csv")).parent
    assert list(version_dir.glob("events.out.tfevents.*")), "TensorBoard events next to metrics.csv"
    assert "tensorboard --logdir" in out


@pytest.mark.slow
def test_prediction_writer_under_ddp_covers_every_row_once(tmp_path):
    from ripieno.callbacks import MemberPredictionWriter

    dm = TabularDataModule("mlc_churn", max_rows=600, n_bins=8, loader=LoaderSettings(eval_batch_size=32))
    model = TabularEnsembleModule(dm.spec, k=3, d_block=16)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False,
                        enable_progress_bar=False, default_root_dir=tmp_path,
                        callbacks=[MemberPredictionWriter(output_dir=str(tmp_path)), DestroyGlooAtExit()])
    trainer.predict(model, datamodule=dm, return_predictions=False)
    parts = [torch.load(tmp_path / f"predictions_rank{r}.pt", weights_only=True) for r in (0, 1)]
    index = torch.cat([p["index"] for p in parts])
    assert sorted(index.tolist()) == list(range(120))  # the test split, no row lost or doubled
    single = L.Trainer(logger=False, enable_progress_bar=False, default_root_dir=tmp_path / "one",
                       callbacks=[MemberPredictionWriter(output_dir=str(tmp_path / "one"))])
    single.predict(model, datamodule=dm, return_predictions=False)
    ref = torch.load(tmp_path / "one" / "predictions.pt", weights_only=True)
    merged = torch.cat([p["prediction"] for p in parts])[index.argsort()]
    assert torch.allclose(merged, ref["prediction"][ref["index"].argsort()], atol=1e-6)
