"""task: auto infers classification for integer labels with few values, and says so."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.tables import make_table
from sklearn.preprocessing import LabelEncoder

from ripieno.datamodules import TabularDataModule
from ripieno.datamodules.tabular import MAX_INFERRED_CLASSES, class_order, infer_task
from ripieno.framework.cli import main


@pytest.mark.parametrize(("values", "task"), [
    ([0, 1, 1, 0], "binary"),
    ([3, 1, 2, 1], "multiclass"),
    (list(range(MAX_INFERRED_CLASSES)), "multiclass"),
    (list(range(MAX_INFERRED_CLASSES + 1)), "regression"),
    ([True, False, True], "binary"),
    ([0.0, 1.0, 1.0], "regression"),
    ([0.5, 1.25, 3.0], "regression"),
    (["no", "yes", "no"], "binary"),
    (["a", "b", "c"], "multiclass"),
])
def test_infer_task_follows_the_documented_rule(values, task):
    assert infer_task(pd.Series(values))[0] == task


def test_integer_classes_are_ordered_by_value_as_label_encoder_orders_them():
    labels = pd.Series([10, 2, 1, 2, 10, 33])
    names, label_type = class_order(labels)
    assert names == [str(c) for c in LabelEncoder().fit(labels).classes_] == ["1", "2", "10", "33"]
    assert label_type == "integer"
    assert class_order(pd.Series(["b", "a", "b"])) == (["a", "b"], "text")
    assert class_order(pd.Series([True, False])) == (["False", "True"], "boolean")


def _int_label_table(n: int = 300, labels: tuple[int, ...] = (0, 1), seed: int = 0) -> pd.DataFrame:
    """``make_table``'s learnable signal cut into integer labels ``labels`` (ordered by the signal)."""
    frame = make_table(n=n, seed=seed)
    signal = frame.pop("y")
    cuts = np.quantile(signal, np.linspace(0, 1, len(labels) + 1)[1:-1])
    frame["y"] = np.asarray(labels)[np.digitize(signal, cuts)]
    frame.insert(0, "customer", [f"c{i:04d}" for i in range(n)])
    return frame


def test_integer_labels_become_classes_in_numeric_order_row_for_row(tmp_path, caplog):
    frame = _int_label_table(labels=(10, 2, 1))
    frame.to_csv(tmp_path / "t.csv", index=False)
    dm = TabularDataModule(dataset=None, path=str(tmp_path / "t.csv"), target="y", categorical=["colour"],
                           id_column="customer", n_bins=8)
    with caplog.at_level("INFO"):
        spec = dm.spec
    assert (spec.task, spec.class_names, spec.label_type) == ("multiclass", ["1", "2", "10"], "integer")
    assert spec.class_labels() == [1, 2, 10]
    assert "task: auto inferred multiclass for target 'y' because it holds integers with 3" in caplog.text
    assert "set data.init_args.task" in caplog.text
    _, ids = dm.prediction_ids(list(range(len(dm._split("test")))))
    expected = LabelEncoder().fit(frame["y"]).transform(frame.set_index("customer").loc[ids, "y"])
    assert torch.equal(dm._split("test").y, torch.as_tensor(expected))


def test_a_float_target_is_regression_and_the_log_says_why(table_csv, caplog):
    with caplog.at_level("INFO"):
        spec = TabularDataModule(dataset=None, path=table_csv("regression"), target="y",
                                 categorical=["colour"], n_bins=8).spec
    assert spec.task == "regression"
    assert "inferred regression for target 'y' because it holds floats" in caplog.text


def test_an_integer_target_with_many_values_stays_regression(tmp_path):
    frame = make_table(n=200)
    frame["y"] = np.round(frame["y"] * 100).astype(int)  # a count-like target
    assert frame["y"].nunique() > MAX_INFERRED_CLASSES
    frame.to_csv(tmp_path / "t.csv", index=False)
    spec = TabularDataModule(dataset=None, path=str(tmp_path / "t.csv"), target="y", categorical=["colour"],
                             n_bins=8).spec
    assert spec.task == "regression"


def _fit_cli(tmp_path, recipe: str, *extra: str):
    csv = tmp_path / "users.csv"
    _int_label_table().drop(columns="customer").to_csv(csv, index=False)
    root = tmp_path / "run"
    main(["fit", "-c", recipe, "--data.init_args.dataset=null", f"--data.init_args.path={csv}",
          "--data.init_args.target=y", "--data.init_args.categorical=[colour]", "--data.init_args.n_bins=8",
          "--model.init_args.k=4", "--model.init_args.d_block=16", "--trainer.max_epochs=1",
          "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
          "--tensorboard=false", f"--trainer.default_root_dir={root}", *extra])
    checkpoint = torch.load(next(root.rglob("best-*.ckpt")), map_location="cpu", weights_only=True)
    metrics = pd.read_csv(next(root.rglob("metrics.csv")))
    return checkpoint["hyper_parameters"]["data_spec"], metrics


def test_cli_trains_a_0_1_integer_label_as_binary_classification(tmp_path):
    spec, metrics = _fit_cli(tmp_path, "tabular/lometab_churn")
    assert (spec["task"], spec["class_names"], spec["label_type"]) == ("binary", ["0", "1"], "integer")
    assert metrics["val/nll"].notna().any() and metrics["test/accuracy"].notna().any()


def test_cli_task_regression_overrides_the_inference(tmp_path):
    spec, metrics = _fit_cli(tmp_path, "tabular/lometab_diamonds", "--data.init_args.task=regression")
    assert spec["task"] == "regression" and spec["class_names"] == []
    assert metrics["val/rmse"].notna().any()
