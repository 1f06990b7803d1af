"""Tuning and benchmarking as a library: the Python API returns what the command writes, and shares its store.

Oracles: the files the same call wrote (``trials.csv``, ``best.yaml``, ``results.csv``), Optuna's
own best trial, and the command line continuing what the Python call started (and the other way).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
import yaml

from ripieno.framework.benchmark import BenchmarkOptions, run_benchmark
from ripieno.framework.cli import main
from ripieno.framework.cli.benchmark_command import build_parser as benchmark_parser
from ripieno.framework.cli.tune_command import build_parser as tune_parser
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.tuning import TuneOptions, tune

WINE = "tabular/lometab_wine"
SPACE = """\
params:
  model.init_args.rank: {type: categorical, choices: [1, 4]}
  model.init_args.lr: {type: float, low: 1.0e-3, high: 5.0e-3, log: true}
"""
FAST = ["--trainer.max_epochs=2", "--model.init_args.k=4", "--model.init_args.d_block=32"]


@pytest.mark.parametrize(("options", "parser", "required"), [
    (TuneOptions, tune_parser, ["-c", "x"]),
    (BenchmarkOptions, benchmark_parser, ["-c", "x"]),
])
def test_the_command_has_one_option_per_field_with_the_same_default(options, parser, required):
    parsed = vars(parser().parse_args(required))
    parsed.pop("config")
    defaults = {f.name: f.default for f in dataclasses.fields(options)}
    assert parsed == defaults


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n_trials": 0}, "--n_trials must be at least 1, got 0."),
    ({"workers": 1.5}, "--workers must be a whole number, got 1.5."),
    ({"pruner": "medain"}, "--pruner must be one of median, hyperband, none, got 'medain'."),
    ({"timeout": -1.0}, "--timeout must be a positive number of seconds, got -1."),
])
def test_a_bad_tune_option_from_python_is_one_line(kwargs, message):
    with pytest.raises(RipienoInputError) as error:
        TuneOptions(**kwargs)
    assert str(error.value) == message


def test_one_name_is_one_data_set_not_its_letters():
    assert BenchmarkOptions(datasets="wine", models=("a", "b")).datasets == ["wine"]
    assert BenchmarkOptions(models=("a", "b")).models == ["a", "b"]


def test_a_study_from_python_returns_the_study_and_best_configuration_and_the_command_continues_it(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    space, study_dir = tmp_path / "space.yaml", tmp_path / "study"
    space.write_text(SPACE)
    result = tune(WINE, FAST, n_trials=2, seed=0, space=str(space), study_dir=study_dir)
    trials = pd.read_csv(study_dir / "trials.csv")
    assert len(result.trials) == len(trials) == 2 and result.finished == 2
    assert result.best.number == result.study.best_trial.number  # Optuna's own best
    assert result.best.value == trials["val/nll"].min()
    assert result.best_yaml == study_dir / "best.yaml"
    assert result.best_config == yaml.safe_load(result.best_yaml.read_text())
    assert result.study_dir == study_dir and not result.interrupted
    assert "ripieno: best       trial" in "\n".join(result.summary_lines())
    capsys.readouterr()
    main(["tune", "-c", WINE, "--n_trials", "3", "--seed", "0", "--space", str(space),
          "--study_dir", str(study_dir), *FAST])
    out = capsys.readouterr().out
    assert out.count("ripieno: trial ") == 1 and "3/3 trials finished" in out  # one more, not three
    with pytest.raises(RipienoInputError, match="was made with"):
        tune(WINE, [*FAST, "--trainer.max_epochs=3"], n_trials=3, seed=0, space=str(space),
             study_dir=study_dir)  # the same study from other inputs: refused, as the command refuses it


def test_a_benchmark_from_python_returns_the_table_it_wrote_and_the_command_finishes_it(
    tmp_path, capsys, tiny_benchmark
):
    config, out = tiny_benchmark(), tmp_path / "out"
    result = run_benchmark(config, out=out, datasets="mlc_churn")
    assert (result.cells, result.finished, result.complete) == (2, 2, 2)
    pd.testing.assert_frame_equal(result.results, pd.read_csv(result.results_csv), check_dtype=False)
    assert result.report == out / "report.md" and result.report.stat().st_size > 0
    assert result.figures and all(path.read_bytes()[:4] == b"\x89PNG" for path in result.figures)
    capsys.readouterr()
    main(["benchmark", "-c", str(config), "--out", str(out)])  # the other table's two cells only
    assert capsys.readouterr().out.count("ripieno: cell ") == 2
    again = run_benchmark(config, out=out, report_only=True)
    assert (again.cells, again.complete) == (4, 4) and out / "ranks.png" in again.figures
    assert set(again.results["dataset"]) == {"mlc_churn", "diamonds"}
    changed = tiny_benchmark(data={"max_rows": 300, "missing": "impute"})
    with pytest.raises(RipienoInputError, match="--refit_changed"):
        run_benchmark(changed, out=out)
    assert Path(out / "results.csv").exists()
