"""A user's table as it is: text, boolean and category columns found by themselves, numbers written as
text reported, one recipe for classification and regression.

Oracles: exact identities. The inferred columns are exactly the text, boolean and ``category``
columns; the datamodule, the benchmark's models and the scikit-learn estimators use that same list;
a column of numbers written as text is one line naming it and a value, never a guess; the own-table
recipe trains a regression and a classification target from the same file name pattern.
"""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest
import yaml

from ripieno.datamodules import TabularDataModule
from ripieno.framework.cli.main import main
from ripieno.framework.messages import command_output
from ripieno.framework.methods.estimators import EnsembleClassifier
from ripieno.framework.specs.tabular_preprocessing import TabularPreprocessingError, infer_categorical


def _houses(rows: int = 240, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "region": rng.choice(["north", "south", "east"], rows),
        "rooms": rng.integers(1, 6, rows).astype(float),
        "garden": rng.choice([True, False], rows),
        "area": rng.normal(80, 20, rows),
    })
    frame.loc[rng.choice(rows, 15, replace=False), "area"] = np.nan
    frame.loc[rng.choice(rows, 10, replace=False), "region"] = None
    frame["price"] = frame["area"].fillna(80) * 10 + frame["rooms"] * 50 + (frame["region"] == "north") * 200
    frame["label"] = np.where(frame["price"] > frame["price"].median(), "expensive", "cheap")
    return frame


def test_text_boolean_and_category_columns_are_categorical_and_numbers_are_not():
    frame = pd.DataFrame({
        "x": [1.0, 2.0, None], "n": [1, 2, 3], "city": ["a", None, "b"], "flag": [True, False, True],
        "kind": pd.Categorical(["u", "v", "u"]), "empty": [None, None, None], "y": ["p", "q", "p"],
    })
    assert infer_categorical(frame, exclude=["y"]) == ["city", "flag", "kind"]
    assert infer_categorical(frame) == ["city", "flag", "kind", "y"]


@pytest.mark.parametrize(("values", "example"), [
    (["12,777.48", "9.5", "1,000"], "12,777.48"),
    (["$5", "$12.50", "$7"], "$5"),
    (["12 %", "7 %", "3 %"], "12 %"),
    ([str(v) for v in range(40)] + ["?"], "?"),
])
def test_a_column_of_numbers_written_as_text_is_reported_not_guessed(values, example):
    with pytest.raises(TabularPreprocessingError) as error:
        infer_categorical(pd.DataFrame({"price": values}))
    assert str(error.value).startswith(f"Column 'price' holds numbers written as text, such as {example!r};")


def test_a_users_csv_needs_no_categorical_list_and_says_what_it_inferred(tmp_path):
    _houses().drop(columns=["label"]).to_csv(tmp_path / "houses.csv", index=False)
    datamodule = TabularDataModule(dataset=None, path=str(tmp_path / "houses.csv"), target="price",
                                   missing="impute")
    stream = io.StringIO()
    with command_output(stream):
        splits = datamodule.table_splits()
    assert splits.categorical == ["region", "garden"] and splits.task == "regression"
    assert stream.getvalue().splitlines()[0] == (
        "ripieno: data: 2 text or boolean columns taken as categorical: region, garden (set"
        " data.init_args.categorical to choose them yourself, [] for none)"
    )
    listed = TabularDataModule(dataset=None, path=str(tmp_path / "houses.csv"), target="price",
                               missing="impute", categorical=["region"], drop=["garden"])
    assert listed.table_splits().categorical == ["region"]  # a list given is the list used


def test_the_estimators_infer_the_same_columns_and_refuse_numbers_written_as_text():
    frame = _houses()
    model = EnsembleClassifier(k=2, d_block=16, n_blocks=1, max_epochs=1, missing="impute", random_state=0)
    model.fit(frame.drop(columns=["price", "label"]), frame["label"])
    assert model.preprocessor_.categorical == ["region", "garden"]
    frame["area"] = frame["area"].map(lambda v: f"{v:,.2f}" if v == v else None).str.replace("8", "8,", n=1)
    with pytest.raises(TabularPreprocessingError, match=r"Column 'area' holds numbers written as text"):
        EnsembleClassifier(k=2, max_epochs=1).fit(frame.drop(columns=["price", "label"]), frame["label"])


def test_a_benchmark_of_a_csv_with_text_columns_runs_with_no_categorical_list(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _houses(400).drop(columns=["price"]).to_csv("houses.csv", index=False)
    config = {
        "name": "houses", "seeds": [0], "data": {"missing": "impute"},
        "datasets": [{"name": "houses", "path": "houses.csv", "target": "label"}],
        "models": {"xgboost": {"kind": "xgboost", "params": {"n_estimators": 20}},
                   "tabm": {"kind": "ensemble", "params": {"adapter": "rank1", "k": 2, "d_block": 16,
                                                           "n_blocks": 1, "max_epochs": 2}}},
    }
    (tmp_path / "bench.yaml").write_text(yaml.safe_dump(config))
    main(["benchmark", "-c", "bench.yaml", "--out", "out"])
    results = pd.read_csv("out/results.csv")
    assert len(results) == 2 and (results["state"] == "COMPLETE").all()


@pytest.mark.parametrize(("target", "task", "metric"), [("price", "regression", "test/rmse"),
                                                        ("label", "binary", "test/accuracy")])
def test_the_own_table_recipe_trains_regression_and_classification(tmp_path, monkeypatch, capsys, target,
                                                                    task, metric):
    monkeypatch.chdir(tmp_path)
    _houses().drop(columns=["label" if target == "price" else "price"]).to_csv("houses.csv", index=False)
    main(["fit", "-c", "tabular/lometab_csv", "--data.init_args.path=houses.csv",
          f"--data.init_args.target={target}", "--trainer.max_epochs=2", "--model.init_args.k=4",
          "--model.init_args.d_block=32"])
    out = capsys.readouterr().out
    assert f"inferred {task} for target {target!r}" in out
    assert f"  {metric} " in out and "ripieno: checkpoint runs/tabular/lometab_csv/" in out
    assert "  conformal/test/coverage " in out  # 10% of the rows calibrate the recipe's 90% sets / intervals

    # The README's predict line on new rows: the checkpoint alone carries the conformal thresholds.
    (best,) = (tmp_path / "runs").rglob("best-*.ckpt")
    _houses(30, seed=1).drop(columns=["label", "price"]).to_csv("new.csv", index=False)
    main(["predict", "-c", "tabular/lometab_csv", f"--ckpt_path={best}",
          "--data.init_args.predict_path=new.csv", "--model.init_args.k=4", "--model.init_args.d_block=32"])
    (written,) = (tmp_path / "runs").rglob("predictions.csv")
    table = pd.read_csv(written)
    assert len(table) == 30
    if task == "regression":
        assert (table["lower"] <= table["prediction"]).all() and (table["prediction"] <= table["upper"]).all()
    else:
        assert set(table["set_size"]) <= {0, 1, 2}
        assert all(str(p) in str(s).split("|") for p, s, n in zip(table["prediction"], table["set"],
                                                                   table["set_size"], strict=True) if n)
