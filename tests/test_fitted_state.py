"""Fitted preprocessing lives in checkpoints, not in hyperparameters (issue 21 item 8).

``hparams.yaml`` and every logger get the compact spec (what sizes the network, plus a digest
of the fitted state); the checkpoint keeps the fitted state under its own key, loads with
``weights_only=True`` and predicts new rows exactly as the model in memory.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pandas as pd
import pytest
import torch
import yaml

from ripieno.datamodules import LoaderSettings, TabularDataModule
from ripieno.datamodules.tabular import spec_from_checkpoint
from ripieno.datamodules.tabular_sources import SOURCES
from ripieno.framework.cli import main
from ripieno.framework.methods import TabularEnsembleModule, TabularMLP
from ripieno.framework.specs.base import DIGEST_KEY, FITTED_STATE_KEY, fitted_digest

QUICK = ["--data.init_args.max_rows=600", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
         "--trainer.limit_val_batches=1", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--test_after_fit=false"]
FITTED = {"preprocessing", "bins"}


@pytest.fixture(scope="module")
def churn_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run folder of one short epoch of the shipped ``tabular/lometab_churn`` recipe."""
    root = tmp_path_factory.mktemp("churn")
    main(["fit", "-c", "tabular/lometab_churn", f"--trainer.default_root_dir={root}", *QUICK])
    return next(root.rglob("hparams.yaml")).parent


def _new_rows(n: int = 50) -> pd.DataFrame:
    """Churn customers without their target, columns shuffled (the model finds them by name)."""
    frame = SOURCES["mlc_churn"].load().drop(columns=["churn"]).sample(n=n, random_state=3)
    return frame[list(reversed(frame.columns))]


def test_hparams_yaml_of_the_recipe_is_small_and_holds_the_compact_spec(churn_run):
    path = churn_run / "hparams.yaml"
    assert path.stat().st_size < 5 * 1024
    spec = yaml.safe_load(path.read_text())["data_spec"]
    assert not FITTED & spec.keys()
    assert spec["task"] == "binary" and spec["n_classes"] == 2
    assert len(spec["bin_counts"]) == spec["n_num_features"]
    assert len(spec[DIGEST_KEY]) == 16


def test_the_checkpoint_holds_the_fitted_state_and_loads_with_weights_only(churn_run):
    ckpt = next(churn_run.rglob("last.ckpt"))
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    hparams, fitted = checkpoint["hyper_parameters"]["data_spec"], checkpoint[FITTED_STATE_KEY]
    assert set(fitted) == FITTED and not FITTED & hparams.keys()
    assert hparams[DIGEST_KEY] == fitted_digest(fitted)  # the digest stands for exactly this state
    assert [len(edges) - 1 for edges in fitted["bins"]] == hparams["bin_counts"]
    spec = spec_from_checkpoint(str(ckpt))  # what `predict --ckpt_path` prepares new rows with
    assert spec.preprocessing == fitted["preprocessing"] and spec.hparams_dict() == hparams
    model = TabularEnsembleModule.load_from_checkpoint(ckpt, weights_only=True, map_location="cpu")
    assert model.spec == spec and model.hparams.data_spec == hparams
    assert model.predict_frame(_new_rows()).shape[0] == 50


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory
            ) -> tuple[TabularEnsembleModule, TabularDataModule, Path]:
    """A LoMETab ensemble on churn rows (piecewise-linear bins), in memory and as a checkpoint."""
    folder = tmp_path_factory.mktemp("trained")
    dm = TabularDataModule(dataset="mlc_churn", max_rows=500, n_bins=8, loader=LoaderSettings(batch_size=64))
    torch.manual_seed(0)
    model = TabularEnsembleModule(dm.spec, k=4, d_block=16)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=folder)
    trainer.fit(model, datamodule=dm)
    ckpt = folder / "model.ckpt"
    trainer.save_checkpoint(ckpt)
    return model.eval(), dm, ckpt


def test_a_loaded_checkpoint_predicts_new_rows_exactly_as_the_model_in_memory(trained):
    model, dm, ckpt = trained
    assert model.spec == dm.spec and not FITTED & model.hparams.data_spec.keys()
    loaded = TabularEnsembleModule.load_from_checkpoint(ckpt, weights_only=True, map_location="cpu")
    assert loaded.spec == model.spec  # bins, preprocessing, class names: all back
    assert loaded.hparams == model.hparams and loaded.hparams_initial == model.hparams_initial
    rows = _new_rows()
    pd.testing.assert_frame_equal(loaded.predict_frame(rows), model.predict_frame(rows), check_exact=True)


def test_selected_members_keep_the_fitted_state(trained):
    model, dm, _ = trained
    small = model.select_members(2, datamodule=dm)
    assert small.spec == model.spec and small.hparams.data_spec == model.hparams.data_spec
    assert small.predict_frame(_new_rows()).shape[0] == 50


def test_a_checkpoint_with_the_whole_spec_in_its_hparams_still_loads(trained, tmp_path):
    """Checkpoints written before the split keep the fitted state in ``hyper_parameters``."""
    model, _, ckpt = trained
    checkpoint = torch.load(ckpt, map_location="cpu", weights_only=True)
    checkpoint["hyper_parameters"]["data_spec"] = model.spec.to_dict()
    del checkpoint[FITTED_STATE_KEY]
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    loaded = TabularEnsembleModule.load_from_checkpoint(old, weights_only=True, map_location="cpu")
    rows = _new_rows()
    pd.testing.assert_frame_equal(loaded.predict_frame(rows), model.predict_frame(rows), check_exact=True)
    assert spec_from_checkpoint(str(old)) == model.spec


def test_tabular_mlp_saves_its_fitted_state_too(trained, tmp_path):
    _, dm, _ = trained
    mlp = TabularMLP(dm.spec, hidden=[8])
    assert not FITTED & mlp.hparams.data_spec.keys()
    trainer = L.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    trainer.fit(mlp, datamodule=dm)
    trainer.save_checkpoint(tmp_path / "mlp.ckpt")
    loaded = TabularMLP.load_from_checkpoint(tmp_path / "mlp.ckpt", weights_only=True, map_location="cpu")
    rows = _new_rows()
    expected = mlp.eval().predict_frame(rows)
    pd.testing.assert_frame_equal(loaded.predict_frame(rows), expected, check_exact=True)
