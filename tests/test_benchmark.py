"""``ripieno benchmark``: the store, resuming, shared workers, a user's table, the report's statistics."""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import optuna
import pandas as pd
import pytest
import yaml
from optuna.trial import TrialState

from ripieno.framework.benchmark import cells
from ripieno.framework.benchmark.config import load_benchmark
from ripieno.framework.benchmark.models import scores
from ripieno.framework.benchmark.report import compare, overall, ranks, summary
from ripieno.framework.cli.main import main
from ripieno.framework.runner.recipes import list_recipes
from ripieno.framework.runner.worker_threads import threads_per_worker

TINY = {"k": 2, "n_blocks": 1, "d_block": 16, "max_epochs": 2, "patience": 2, "n_bins": 8, "batch_size": 128}


def _write(path: Path, config: dict) -> Path:
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _trials(out: Path, name: str = "tiny") -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name=f"benchmark:{name}", storage=f"sqlite:///{out / 'benchmark.db'}")
    return study.get_trials(deepcopy=False)


def _complete_per_cell(trials) -> dict[str, int]:
    done: dict[str, int] = {}
    for t in trials:
        if t.state == TrialState.COMPLETE:
            done[t.user_attrs[cells.CELL_ATTR]] = done.get(t.user_attrs[cells.CELL_ATTR], 0) + 1
    return done


def test_scores_match_their_definitions():
    y = np.array([0, 1, 2, 1])
    proba = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.3, 0.3, 0.4], [0.6, 0.3, 0.1]])
    result = scores("multiclass", y, proba, 3)
    assert set(result) == {"accuracy", "nll", "ece", "brier"}  # ECE and Brier: test_benchmark_uncertainty.py
    assert result["accuracy"] == 0.75
    assert result["nll"] == pytest.approx(-np.mean(np.log([0.7, 0.8, 0.4, 0.3])))
    assert scores("regression", np.array([1.0, 3.0]), np.array([2.0, 2.0]))["rmse"] == pytest.approx(1.0)


def test_ranks_average_ties_and_wins_need_more_than_the_seed_spread():
    results = pd.DataFrame([
        {"dataset": d, "model": m, "kind": k, "task": t, "seed": s, "test_accuracy": a, "test_rmse": r,
         "test_nll": 0.1, "seconds": 1.0, "n_parameters": 10}
        for d, t, rows in (
            ("a", "binary", [("lometab", "ensemble", 0.90, 0.91), ("tabm", "ensemble", 0.80, 0.81),
                             ("xgboost", "xgboost", 0.85, 0.86)]),
            ("b", "binary", [("lometab", "ensemble", 0.70, 0.71), ("tabm", "ensemble", 0.70, 0.71),
                             ("xgboost", "xgboost", 0.90, 0.91)]),
            ("c", "regression", [("lometab", "ensemble", 1.0, 1.0), ("tabm", "ensemble", 2.0, 2.0),
                                 ("xgboost", "xgboost", 3.0, 3.0)]),
        )
        for m, k, v0, v1 in rows for s, v in ((0, v0), (1, v1))
        for a, r in ((v if t != "regression" else math.nan, v if t == "regression" else math.nan),)
    ])
    table = summary(results)
    rank = ranks(table)
    assert rank.loc["a"].tolist() == [1.0, 3.0, 2.0]
    assert rank.loc["b"].tolist() == [2.5, 2.5, 1.0]  # a tie shares ranks 2 and 3
    assert rank.loc["c"].tolist() == [1.0, 2.0, 3.0]  # regression: lower RMSE ranks first
    best = overall(table).set_index("model")
    assert best.loc["lometab", "mean_rank"] == pytest.approx((1 + 2.5 + 1) / 3)
    assert best.loc["lometab", "first"] == 2 and best.loc["xgboost", "first"] == 1
    assert compare(table, "lometab", "tabm") == {"win": 2, "tie": 1, "loss": 0}
    assert compare(table, "lometab", best_gbdt=True) == {"win": 2, "tie": 0, "loss": 1}


def test_a_benchmark_writes_its_store_and_report_and_a_rerun_fits_nothing(tmp_path, capsys, tiny_benchmark):
    config, out = tiny_benchmark(), tmp_path / "out"
    main(["benchmark", "-c", str(config), "--out", str(out)])
    results = pd.read_csv(out / "results.csv")
    assert len(results) == 4 and (results["state"] == "COMPLETE").all()
    assert set(results["dataset"]) == {"mlc_churn", "diamonds"}
    churn = results[results["dataset"] == "mlc_churn"]
    assert churn["test_accuracy"].between(0, 1).all() and (churn["test_nll"] > 0).all()
    assert (results.loc[results["dataset"] == "diamonds", "test_rmse"] > 0).all()
    assert results.groupby("dataset")["train_rows"].nunique().eq(1).all()  # every model, the same rows
    report = (out / "report.md").read_text()
    assert "| mlc_churn | binary | accuracy |" in report and "mean rank" in report
    assert (out / "ranks.png").read_bytes()[:4] == b"\x89PNG"
    # 2 epochs with patience 2: early stopping cannot end a fit, the epoch cap does (and the report says so)
    ensembles = results[results["kind"] == "ensemble"]
    assert (ensembles["iteration_cap"] == 2).all() and ensembles["capped"].all()
    assert (results["capped"] == (results["iterations"] >= results["iteration_cap"])).all()
    assert f"{int(results['capped'].sum())} of 4 cells" in report and "## Budget" in report
    before = [(t.number, t.datetime_complete) for t in _trials(out)]
    capsys.readouterr()
    main(["benchmark", "-c", str(config), "--out", str(out)])
    assert [(t.number, t.datetime_complete) for t in _trials(out)] == before  # nothing refitted
    assert "4/4 cells finished" in capsys.readouterr().out
    assert pd.read_csv(out / "results.csv").equals(results)


def test_a_stopped_benchmark_runs_only_its_missing_cells_and_retries_a_dead_one(tmp_path, tiny_benchmark):
    config, out = tiny_benchmark(), tmp_path / "out"
    out.mkdir()
    left = optuna.create_study(study_name="benchmark:tiny", storage=f"sqlite:///{out / 'benchmark.db'}")
    left.enqueue_trial({}, user_attrs={cells.CELL_ATTR: "default/diamonds/lometab/0"})  # a stopped run's
    main(["benchmark", "-c", str(config), "--out", str(out), "--models", "xgboost"])  # stopped after these
    first = {t.user_attrs[cells.CELL_ATTR]: t.datetime_complete for t in _trials(out)
             if t.state == TrialState.COMPLETE}
    assert set(first) == {"default/mlc_churn/xgboost/0", "default/diamonds/xgboost/0"}  # only its models'
    assert len(pd.read_csv(out / "results.csv")) == 2
    # a worker that died mid-cell: its trial runs, its heartbeat stopped 3 s ago
    url = f"sqlite:///{out / 'benchmark.db'}"
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=1, grace_period=2)
    study = optuna.load_study(study_name="benchmark:tiny", storage=storage)
    study.enqueue_trial({}, user_attrs={cells.CELL_ATTR: "default/mlc_churn/lometab/0"})
    dead = study.ask()
    storage.record_heartbeat(dead._trial_id)
    time.sleep(3)
    main(["benchmark", "-c", str(config), "--out", str(out), "--heartbeat", "1"])
    trials = _trials(out)
    assert _complete_per_cell(trials) == {c.key: 1 for c in cells.wanted_cells(load_benchmark(config))}
    assert {t.user_attrs[cells.CELL_ATTR]: t.datetime_complete for t in trials
            if t.user_attrs[cells.CELL_ATTR] in first and t.state == TrialState.COMPLETE} == first
    assert next(t for t in trials if t.number == dead.number).state == TrialState.FAIL


def test_two_workers_on_a_journal_file_fit_every_cell_once(tmp_path, tiny_benchmark):
    config = tiny_benchmark(seeds=[0, 1])
    out, journal = tmp_path / "out", tmp_path / "shared" / "store.log"
    main(["benchmark", "-c", str(config), "--out", str(out), "--storage", str(journal), "--workers", "2"])
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    trials = optuna.load_study(study_name="benchmark:tiny", storage=storage).get_trials(deepcopy=False)
    assert _complete_per_cell(trials) == {c.key: 1 for c in cells.wanted_cells(load_benchmark(config))}
    results = pd.read_csv(out / "results.csv")
    assert len(results) == 8
    assert (results["threads"] == threads_per_worker(2)).all()  # each worker its share of the cores


def test_every_model_runs_on_a_users_csv_with_a_category_and_missing_values(tmp_path):
    rng = np.random.default_rng(0)
    n = 300
    city = rng.choice(["north", "south", "east"], n).astype(object)
    x = rng.normal(size=n)
    frame = pd.DataFrame({"x": x, "z": rng.normal(size=n), "city": city,
                          "label": np.where(x + (city == "north") > 0.3, "yes", "no")})
    frame.loc[[3, 17], "x"] = np.nan
    frame.loc[5, "city"] = None
    table = tmp_path / "mine.csv"
    frame.to_csv(table, index=False)
    config = _write(tmp_path / "mine.yaml", {
        "name": "mine", "seeds": [0], "data": {"missing": "impute"},
        "datasets": [{"name": "mine", "path": str(table), "target": "label", "categorical": ["city"]}],
        "common": {"ensemble": TINY},
        "models": {"lometab": {"kind": "ensemble", "params": {"adapter": "lometab"}},
                   "tabm": {"kind": "ensemble", "params": {"adapter": "rank1"}},
                   "tabm_mini": {"kind": "ensemble", "params": {"adapter": "mini"}},
                   "mlp": {"kind": "ensemble", "params": {"adapter": "shared", "k": 1}},
                   "additive": {"kind": "ensemble", "params": {"adapter": "additive"}},
                   "xgboost": {"kind": "xgboost", "params": {"n_estimators": 20}},
                   "lightgbm": {"kind": "lightgbm", "params": {"n_estimators": 20}},
                   "catboost": {"kind": "catboost", "params": {"iterations": 20}}},
    })
    import hashlib

    before = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir() if p.is_file()}
    main(["benchmark", "-c", str(config), "--out", str(tmp_path / "out")])
    after = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in tmp_path.iterdir() if p.is_file()}
    assert after == before  # the user's table and benchmark file are read, never written
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert sorted(results["model"]) == sorted(["lometab", "tabm", "tabm_mini", "mlp", "additive", "xgboost",
                                               "lightgbm", "catboost"])
    assert (results["state"] == "COMPLETE").all() and results["test_accuracy"].between(0, 1).all()
    assert results.loc[results["model"] == "mlp", "n_parameters"].iloc[0] < \
        results.loc[results["model"] == "tabm", "n_parameters"].iloc[0]


def test_an_output_folder_of_other_files_is_refused_before_any_fit(tmp_path, tiny_benchmark):
    config, out = tiny_benchmark(), tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("mine\n")
    with pytest.raises(SystemExit, match="holds files ripieno did not write"):
        main(["benchmark", "-c", str(config), "--out", str(out)])
    assert (out / "results.csv").read_text() == "mine\n" and not (out / "benchmark.db").exists()


def test_a_base_file_that_leads_back_to_itself_is_one_line(tmp_path):
    from ripieno.framework.benchmark.config import BenchmarkConfigError

    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(f"base: {second}\n")
    second.write_text(f"base: {first}\n")
    with pytest.raises(BenchmarkConfigError, match="leads back to itself"):
        load_benchmark(first)


@pytest.mark.parametrize(("change", "expected"), [
    ({"protocl": "default"}, "unknown key 'protocl' (did you mean 'protocol'?)"),
    ({"datasets": ["mlc_chrun"]}, "unknown data set 'mlc_chrun' (did you mean 'mlc_churn'?)"),
    ({"models": {"lometab": {"kind": "ensemble", "params": {"rnak": 2}}}},
     "'rnak' is not an argument of its ensemble model (did you mean 'rank'?)"),
    ({"models": {"xgb": {"kind": "xgbost"}}}, "kind 'xgbost' (did you mean 'xgboost'?)"),
    ({"datasets": [{"name": "mine", "path": "/nowhere/mine.csv", "target": "y"}]},
     "no file '/nowhere/mine.csv'"),
    ({"models": {"lometab": {"kind": "ensemble", "params": {"max_epochs": "3"}}}},
     "model 'lometab': EnsembleClassifier: max_epochs must be an int >= 1, got '3' (str)."),
    ({"datasets": [{"name": "a/b", "dataset": "wine"}]},
     "data set name 'a/b' must be a non-empty name without '/'; rename it."),
])
def test_a_bad_benchmark_file_is_one_line_before_any_fit(tmp_path, change, expected, tiny_benchmark):
    config, out = tiny_benchmark(**change), tmp_path / "out"
    with pytest.raises(SystemExit) as stopped:
        main(["benchmark", "-c", str(config), "--out", str(out)])
    message = str(stopped.value)
    assert expected in message and "\n" not in message
    assert not (out / "benchmark.db").exists()


def test_shipped_benchmarks_parse_and_are_not_recipes():
    from ripieno.datamodules.tabular_sources import BENCHMARK_SUITE, SOURCES
    from ripieno.framework.benchmark.config import list_benchmarks

    names = list_benchmarks()
    assert {"benchmarks/tabular_ci", "benchmarks/tabular_cpu", "benchmarks/tabular_paper"} <= set(names)
    for name in names:
        config = load_benchmark(name, known=tuple(SOURCES))
        assert config.models and config.datasets
    for name in ("benchmarks/tabular_cpu", "benchmarks/tabular_paper"):
        assert [d.name for d in load_benchmark(name).datasets] == list(BENCHMARK_SUITE)
    from ripieno.datamodules.tabular_sources import HELD_OUT

    holdout, cpu = load_benchmark("benchmarks/tabular_holdout"), load_benchmark("benchmarks/tabular_cpu")
    assert [d.name for d in holdout.datasets] == list(HELD_OUT)  # the kept-back tables, the suite's defaults
    assert (holdout.models, holdout.data, holdout.seeds) == (cpu.models, cpu.data, cpu.seeds)
    assert not any(r.name.startswith("benchmarks/") for r in list_recipes())


def test_the_shipped_ci_benchmark_runs(tmp_path):
    """What CI runs: 2 tables, 2 neural models and XGBoost, 1 seed (benchmarks/tabular_ci)."""
    main(["benchmark", "-c", "benchmarks/tabular_ci", "--out", str(tmp_path)])
    results = pd.read_csv(tmp_path / "results.csv")
    assert len(results) == 6 and (results["state"] == "COMPLETE").all()
    assert "## Overall" in (tmp_path / "report.md").read_text()


def test_the_tuned_protocol_fits_each_seed_with_the_best_values_of_one_shared_study(tmp_path, tiny_benchmark):
    space = {"rank": {"type": "categorical", "choices": [1, 2]},
             "sigma_init": {"type": "float", "low": 0.1, "high": 3.0, "log": True}}
    config = tiny_benchmark(protocol="tuned", seeds=[0, 1], datasets=["mlc_churn"],
                          tuning={"n_trials": 3, "startup_trials": 3},
                          models={"lometab": {"kind": "ensemble", "params": {"adapter": "lometab"},
                                              "space": space}})
    out = tmp_path / "out"
    main(["benchmark", "-c", str(config), "--out", str(out)])
    results = pd.read_csv(out / "results.csv")
    assert len(results) == 2 and (results["protocol"] == "tuned").all()
    storage = f"sqlite:///{out / 'benchmark.db'}"
    (name,) = [n for n in optuna.get_all_study_names(storage)
               if n.startswith("benchmark:tiny:tune:mlc_churn:lometab:")]  # named by its fingerprint
    study = optuna.load_study(study_name=name, storage=storage)
    trials = [t for t in study.get_trials() if t.state == TrialState.COMPLETE]
    assert len(trials) == 3  # one study for both seeds' cells
    best = max(trials, key=lambda t: t.value)  # validation accuracy
    for params in results["params"]:
        assert yaml.safe_load(params) == best.user_attrs["values"]


def _cells(rows):
    return pd.DataFrame([
        {"dataset": d, "model": m, "kind": "xgboost" if m in ("xgboost", "catboost") else "ensemble",
         "task": "binary", "seed": s, "test_accuracy": v + 0.001 * s, "test_nll": 0.3, "seconds": 1.0,
         "n_parameters": n, "params": p, "state": "COMPLETE"}
        for d, m, v, n, p in rows for s in (0, 1, 2)])


def test_benchmark_claim_rows_follow_ranks_and_wins():
    from experiments.claims_benchmark import default_rows, tuned_rows

    # LoMETab first on 2 of 3 tables, TabM last on all: mean ranks 4/3 and 3; beats xgboost twice
    default = _cells([(d, m, v, 100, "{}") for d, row in
                      (("a", {"lometab": 0.9, "tabm": 0.7, "xgboost": 0.8}),
                       ("b", {"lometab": 0.9, "tabm": 0.7, "xgboost": 0.8}),
                       ("c", {"lometab": 0.8, "tabm": 0.7, "xgboost": 0.9}))
                      for m, v in row.items()])
    rank, gbdt = default_rows(default, "cmd", reduced=False, data="synthetic")
    assert "LoMETab mean rank 1.33" in rank.reference and "TabM mean rank 3.00" in rank.baseline
    assert rank.verdict == "reproduced" and "3 wins / 0 ties / 0 losses" in rank.baseline
    assert gbdt.verdict == "reproduced" and "xgboost: 2 wins / 0 ties / 1 losses" in gbdt.reference
    tuned = _cells([(d, m, v, n, p) for d in ("a", "b") for m, v, n, p in
                    (("lometab", 0.7, 300, '{"rank": 4}'), ("tabm", 0.9, 100, '{"k": 64}'))])
    scaling, params = tuned_rows(tuned, "cmd", reduced=False, data="synthetic")
    assert scaling.verdict == "not reproduced" and "chosen: [64]" in scaling.baseline
    assert params.verdict == "not reproduced" and "LoMETab / TabM = 3.00" in params.baseline
    assert {r.verdict for r in tuned_rows(tuned, "cmd", reduced=True, data="x")} == {"inconclusive"}


def test_table_splits_are_the_datamodules_rows_and_a_fit_keeps_no_copy():
    from ripieno.datamodules import TabularDataModule

    datamodule = TabularDataModule(dataset="diamonds", max_rows=500)
    datamodule.setup()
    assert datamodule._table_splits is None  # an ordinary fit (and its DDP pickles) carries no raw copy
    tables = datamodule.table_splits()
    for split in ("train", "val", "test"):
        assert np.allclose(tables.targets[split], datamodule._splits[split].y.numpy(), atol=1e-6)
        assert len(tables.features[split]) == len(datamodule._splits[split])
    assert set(tables.categorical) <= set(tables.features["train"].columns)
    assert "price" not in tables.features["train"]  # the target is not a feature


def test_xgboost_node_count_equals_the_dataframe_and_survives_a_boolean_split():
    """Oracle: ``trees_to_dataframe``'s row count; a boolean column (an indicator split) breaks only it."""
    import xgboost

    from ripieno.framework.methods.gbdt import xgboost_node_count

    rng = np.random.default_rng(0)
    x = pd.DataFrame({"a": rng.normal(size=400), "c": pd.Categorical(rng.choice(list("xyz"), 400))})
    y = x["a"] + (x["c"] == "x") + 0.1 * rng.normal(size=400)
    booster = xgboost.XGBRegressor(n_estimators=20, enable_categorical=True).fit(x, y).get_booster()
    assert xgboost_node_count(booster) == len(booster.trees_to_dataframe()) > 20
    x["flag"] = rng.normal(size=400) > 0
    model = xgboost.XGBRegressor(n_estimators=20, enable_categorical=True)
    booster = model.fit(x, y + x["flag"]).get_booster()
    assert "[flag]" in "".join(booster.get_dump())  # the indicator split the text parser rejects
    with pytest.raises(ValueError, match="text dump"):
        booster.trees_to_dataframe()
    dumped = sum(line.strip() != "" for tree in booster.get_dump() for line in tree.splitlines())
    assert xgboost_node_count(booster) == dumped  # one dump line per node


def test_a_cell_fitted_again_after_its_failure_is_one_row_and_not_reported_failed(tmp_path, tiny_benchmark):
    bad = {"xgboost": {"kind": "xgboost", "params": {"n_estimators": 30, "max_depth": -3}}}
    config, out = tiny_benchmark(models=bad), tmp_path / "out"
    with pytest.raises(SystemExit, match=r"none of the 2 cells finished: each failed by its own error"):
        main(["benchmark", "-c", str(config), "--out", str(out)])  # every cell failed: a non-zero exit
    failed = pd.read_csv(out / "results.csv")
    assert len(failed) == 2 and (failed["state"] == "FAILED").all()
    config = tiny_benchmark(models={"xgboost": {"kind": "xgboost", "params": {"n_estimators": 30}}})
    main(["benchmark", "-c", str(config), "--out", str(out), "--retry_failed"])
    assert sum(t.state == TrialState.FAIL for t in _trials(out)) == 2  # the store keeps both outcomes
    results = pd.read_csv(out / "results.csv")
    assert len(results) == 2 and (results["state"] == "COMPLETE").all()
    assert "failed" not in (out / "report.md").read_text()


def test_the_split_group_and_the_flat_split_seed_of_earlier_files_make_the_same_cells(tiny_benchmark):
    """A store fitted from ``split_seed: 0`` resumes under ``split: {seed: 0}``: the same fingerprint."""
    from ripieno.framework.errors import RipienoDeprecationWarning

    data = {"max_rows": 400, "split": {"seed": 0}, "missing": "impute"}
    grouped = load_benchmark(tiny_benchmark(data=data))
    with pytest.warns(RipienoDeprecationWarning, match="data: split_seed is now split.seed"):
        flat = load_benchmark(tiny_benchmark(data={"max_rows": 400, "split_seed": 0, "missing": "impute"}))
    assert flat.data == grouped.data == {"max_rows": 400, "missing": "impute", "split": {"seed": 0}}
    cell = cells.Cell("default", "mlc_churn", "xgboost", 0)
    tables = {"mlc_churn": {"files": {}}}
    fingerprint = cells.cell_fingerprint(grouped, cell, tables)
    assert fingerprint == cells.cell_fingerprint(flat, cell, tables)
    # what a store written before the groups recorded: the flat name
    assert fingerprint["data"]["args"] == {"max_rows": 400, "missing": "impute", "split_seed": 0,
                                           "dataset": "mlc_churn"}
