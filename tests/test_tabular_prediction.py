"""A tabular checkpoint is a complete predictor: raw new rows in, named predictions out."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import lightning as L
import numpy as np
import pandas as pd
import pytest
import torch
from helpers.tables import make_table

from ripieno.datamodules import LoaderSettings, TabularDataError, TabularDataModule
from ripieno.datamodules.tabular import spec_from_checkpoint
from ripieno.framework.cli import main
from ripieno.framework.methods import TabularEnsembleModule, TabularMLP


def _messy_table(task: str, n: int = 240, seed: int = 0) -> pd.DataFrame:
    frame = make_table(n=n, seed=seed, task=task)
    frame.insert(0, "customer", [f"c{i:04d}" for i in range(n)])
    frame.loc[::9, "x2"] = np.nan  # numeric gaps
    frame.loc[3::11, "colour"] = None  # categorical gaps
    frame["flat"] = 1.0  # constant: dropped with a warning
    return frame


def _new_rows(task: str) -> pd.DataFrame:
    """Next month's rows: no target, shuffled columns, an unseen category, an extra column, gaps."""
    rows = _messy_table(task, n=30, seed=7).drop(columns="y")
    rows.loc[4, "colour"] = "purple"
    rows.loc[5, "x1"] = np.nan
    rows["comment"] = "extra"
    rows = rows[list(reversed(rows.columns))]
    rows.index = np.arange(100, 130)
    return rows


def _fit(tmp_path, task: str, module_cls=TabularEnsembleModule, frame: pd.DataFrame | None = None):
    path = tmp_path / "train.csv"
    (_messy_table(task) if frame is None else frame).to_csv(path, index=False)
    dm = TabularDataModule(dataset=None, path=str(path), target="y", categorical=["colour"], missing="impute",
                           id_column="customer", n_bins=8, loader=LoaderSettings(batch_size=64))
    kwargs = {"k": 4, "d_block": 16} if module_cls is TabularEnsembleModule else {}
    with pytest.warns(UserWarning, match=r"Dropping constant column\(s\) \['flat'\]"):
        model = module_cls(dm.spec, **kwargs)
    trainer = L.Trainer(max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path)
    trainer.fit(model, datamodule=dm)
    ckpt = tmp_path / "model.ckpt"
    trainer.save_checkpoint(ckpt)
    return model, dm, ckpt


@pytest.mark.parametrize("task", ["binary", "multiclass", "regression"])
def test_a_fresh_process_predicts_new_rows_from_the_checkpoint_alone(tmp_path, task):
    model, _, ckpt = _fit(tmp_path, task)
    rows = _new_rows(task)
    rows.to_parquet(tmp_path / "new.parquet")
    script = textwrap.dedent(f"""
        import pandas as pd
        from ripieno.framework.methods import TabularEnsembleModule
        model = TabularEnsembleModule.load_from_checkpoint({str(ckpt)!r}, weights_only=True)
        model.predict_frame(pd.read_parquet({str(tmp_path / "new.parquet")!r})).to_parquet(
            {str(tmp_path / "out.parquet")!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    out = pd.read_parquet(tmp_path / "out.parquet")
    with pytest.warns(UserWarning, match=r"unseen in training.*\{'colour': 1\}"):
        in_memory = model.predict_frame(rows)
    pd.testing.assert_frame_equal(out, in_memory)
    assert list(out.index) == list(rows.index) and out["customer"].tolist() == rows["customer"].tolist()
    if task == "regression":
        assert list(out.columns) == ["customer", "prediction", "member_std"]
        assert np.isfinite(out["prediction"]).all() and (out["member_std"] >= 0).all()
    else:
        classes = ["no", "yes"] if task == "binary" else ["class_0", "class_1", "class_2"]
        proba = [f"proba_{c}" for c in classes]
        assert list(out.columns) == ["customer", *proba, "prediction", "member_std", "disagreement"]
        np.testing.assert_allclose(out[proba].sum(axis=1), 1.0, atol=1e-6)
        assert out["prediction"].tolist() == [classes[i] for i in out[proba].to_numpy().argmax(1)]
        assert out["disagreement"].between(0, 1).all()


@pytest.mark.parametrize("module_cls", [TabularEnsembleModule, TabularMLP])
def test_predict_frame_of_raw_test_rows_equals_trainer_predict_on_the_prepared_split(tmp_path, module_cls):
    model, dm, _ = _fit(tmp_path, "multiclass", module_cls)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, default_root_dir=tmp_path)
    batches = trainer.predict(model, datamodule=dm)
    expected = torch.cat([b["prediction"] for b in batches]).numpy()
    name, ids = dm.prediction_ids(list(range(len(expected))))
    frame = _messy_table("multiclass").set_index("customer").loc[ids].reset_index()
    got = model.predict_frame(frame)
    assert name == "customer" and got["customer"].tolist() == ids
    np.testing.assert_allclose(got.filter(like="proba_").to_numpy(), expected, atol=1e-6)


def test_member_spread_columns_match_their_definitions(tmp_path):
    model, _, _ = _fit(tmp_path, "multiclass")
    rows = _new_rows("multiclass").drop(index=[104])
    out = model.predict_frame(rows)
    x_num, x_cat = model.preprocessor.transform(rows)
    with torch.no_grad():
        model.eval()
        probs = torch.softmax(model(torch.as_tensor(x_num), torch.as_tensor(x_cat)), -1).numpy()
    label = probs.mean(1).argmax(1)
    chosen = probs[np.arange(len(label)), :, label]
    np.testing.assert_allclose(out["member_std"], chosen.std(1), atol=1e-6)
    np.testing.assert_allclose(out["disagreement"], (probs.argmax(-1) != label[:, None]).mean(1))


def test_missing_columns_are_an_error_naming_them_and_extra_ones_a_note(tmp_path, caplog):
    model, _, _ = _fit(tmp_path, "binary")
    rows = _new_rows("binary").drop(index=[104])
    with pytest.raises(ValueError, match=r"lack column\(s\) \['x1', 'count'\]"):
        model.predict_frame(rows.drop(columns=["x1", "count"]))
    with caplog.at_level("INFO"):
        model.predict_frame(rows)
    assert "['comment']" in caplog.text and "'flat'" not in caplog.text.split("ignored:")[-1]


def test_cli_predict_on_new_rows_writes_one_named_row_per_input_row(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _messy_table("binary").to_csv("train.csv", index=False)
    data = ["--data=ripieno.datamodules.TabularDataModule", "--data.init_args.dataset=null",
            "--data.init_args.path=train.csv", "--data.init_args.target=y",
            "--data.init_args.categorical=[colour]", "--data.init_args.missing=impute",
            "--data.init_args.id_column=customer", "--data.init_args.n_bins=8"]
    model = ["--model=ripieno.framework.methods.TabularEnsembleModule", "--model.init_args.k=4",
             "--model.init_args.d_block=16"]
    quiet = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
             "--trainer.default_root_dir=run"]
    main(["fit", *data, *model, *quiet, "--trainer.max_epochs=1"])
    ckpt = next((tmp_path / "run").rglob("*.ckpt"))
    rows = _new_rows("binary")
    rows.to_csv("new.csv", index=False)
    (tmp_path / "train.csv").unlink()  # predicting needs the checkpoint, not the training file
    out_dir = tmp_path / "predictions"
    main(["predict", *data, *model, *quiet, f"--ckpt_path={ckpt}", "--data.init_args.predict_path=new.csv",
          "--trainer.callbacks+=ripieno.callbacks.MemberPredictionWriter",
          f"--trainer.callbacks.output_dir={out_dir}"])
    written = pd.read_csv(out_dir / "predictions.csv")
    loaded = TabularEnsembleModule.load_from_checkpoint(ckpt, weights_only=True)
    expected = loaded.predict_frame(pd.read_csv("new.csv")).reset_index(drop=True)
    assert written["customer"].tolist() == rows["customer"].tolist()
    pd.testing.assert_frame_equal(written, expected, check_dtype=False, atol=1e-6)


def test_predict_path_needs_the_trained_columns_and_keeps_ids(tmp_path):
    _, _, ckpt = _fit(tmp_path, "binary")
    rows = _new_rows("binary")
    rows.drop(columns=["customer"]).to_csv(tmp_path / "no_ids.csv", index=False)
    dm = TabularDataModule(dataset=None, predict_path=str(tmp_path / "no_ids.csv"),
                           preprocessing_from=str(ckpt))
    loader = dm.predict_dataloader()
    assert len(loader.dataset) == len(rows)
    assert dm.prediction_ids([0, 29]) == ("row", [0, 29])
    rows.drop(columns=["colour"]).to_csv(tmp_path / "bad.csv", index=False)
    bad = TabularDataModule(dataset=None, predict_path=str(tmp_path / "bad.csv"),
                            preprocessing_from=str(ckpt))
    with pytest.raises(TabularDataError, match=r"lack column\(s\) \['colour'\]"):
        bad.predict_dataloader()
    with pytest.raises(TabularDataError, match="No train split"):
        dm.train_dataloader()


def test_integer_labels_come_back_as_integers_in_numeric_class_order(tmp_path, caplog):
    frame = _messy_table("multiclass")
    frame["y"] = frame["y"].map({"class_0": 10, "class_1": 2, "class_2": 1})
    model, _, ckpt = _fit(tmp_path, "multiclass", frame=frame)
    assert spec_from_checkpoint(str(ckpt)).class_labels() == [1, 2, 10]
    frame.to_csv(tmp_path / "labelled.csv", index=False)
    dm = TabularDataModule(dataset=None, predict_path=str(tmp_path / "labelled.csv"),
                           preprocessing_from=str(ckpt))
    with caplog.at_level("INFO"):
        assert len(dm.predict_dataloader().dataset) == len(frame)
    assert "model does not use" not in caplog.text  # the integer target column is the model's own
    out = model.predict_frame(pd.read_csv(tmp_path / "labelled.csv"))
    proba = ["proba_1", "proba_2", "proba_10"]
    assert list(out.columns) == ["customer", *proba, "prediction", "member_std", "disagreement"]
    assert pd.api.types.is_integer_dtype(out["prediction"])
    assert out["prediction"].tolist() == [[1, 2, 10][i] for i in out[proba].to_numpy().argmax(1)]
