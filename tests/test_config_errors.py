"""Config mistakes lead with the offending key and the closest valid one, before any work is done."""

from __future__ import annotations

from pathlib import Path

import pytest

from ripieno.framework.cli import main
from ripieno.framework.runner.config_errors import explain_config_error


def _first_line(args: list[str], capsys: pytest.CaptureFixture) -> str:
    with pytest.raises(SystemExit) as stop:
        main(args)
    text = str(stop.value.code)
    assert "usage:" not in text and "usage:" not in capsys.readouterr().err  # no 50 lines of usage
    return text.splitlines()[0]


@pytest.mark.parametrize(("override", "expected"), [
    ("--model.init_args.rnak=8", "ripieno: error: model.init_args.rnak is not an argument of"
     " ripieno.framework.TabularEnsembleModule; did you mean model.init_args.rank?"),
    ("--data.init_args.datset=wine", "ripieno: error: data.init_args.datset is not an argument of"
     " ripieno.datamodules.TabularDataModule; did you mean data.init_args.dataset?"),
    ("--trainer.max_epochz_x=3", "ripieno: error: trainer.max_epochz_x is not a setting of this command"
     " (given as --trainer.max_epochz_x=3); did you mean --trainer.max_epochs?"),
    ("--trainer.max_epochs=abc", "ripieno: error: trainer.max_epochs expects int or None, got 'abc'."),
    ("--model.init_args.adapter=lowrank", "ripieno: error: model.init_args.adapter of"
     " ripieno.framework.TabularEnsembleModule expects one of ['shared', 'rank1', 'lometab', 'additive',"
     " 'packed'], got 'lowrank'."),
])
def test_an_override_typo_names_the_key_and_the_closest_one(override, expected, capsys):
    assert _first_line(["fit", "-c", "tabular/lometab_churn", override], capsys) == expected


def test_a_typo_in_a_yaml_file_is_named_the_same_way(tmp_path, capsys):
    own = tmp_path / "mine.yaml"
    own.write_text("model:\n  class_path: ripieno.framework.TabularEnsembleModule\n  init_args:\n"
                   "    sigma_int: 0.3\n")
    line = _first_line(["fit", "-c", "tabular/lometab_churn", "-c", str(own)], capsys)
    assert line.endswith("model.init_args.sigma_int is not an argument of"
                         " ripieno.framework.TabularEnsembleModule; did you mean model.init_args.sigma_init?")


def test_a_broken_yaml_file_is_named(tmp_path, capsys):
    own = tmp_path / "broken.yaml"
    own.write_text("trainer:\n  max_epochs: [\n")
    line = _first_line(["fit", "-c", str(own)], capsys)
    assert str(own) in line and "not a valid YAML config" in line and "line 3" in line


def test_an_unknown_message_keeps_the_parsers_first_problem():
    text = explain_config_error('Parser key "trainer.callbacks":\n  - Expected a path but Foo is invalid',
                                option_names=[])
    assert text.splitlines()[0] == "trainer.callbacks: Expected a path but Foo is invalid."


def test_a_monitor_the_task_does_not_log_stops_before_training(tmp_path: Path):
    recipe = (Path(__file__).resolve().parents[1] / "recipes/tabular/lometab_diamonds.yaml").read_text()
    own = tmp_path / "regression_monitoring_nll.yaml"
    own.write_text(recipe.replace("monitor: val/rmse", "monitor: val/nll"))
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", str(own), "--data.init_args.max_rows=300",
              f"--trainer.default_root_dir={tmp_path / 'run'}"])
    message = str(stop.value.code)
    assert message.startswith("ripieno: error: EarlyStopping and ModelCheckpoint monitor 'val/nll' (did you"
                              " mean 'val/loss'?), which TabularEnsembleModule does not log on this data"
                              " (regression); it logs val/crps, val/loss, val/mae,")
    assert "val/rmse" in message and "data.init_args.task" in message
    assert not list((tmp_path / "run").rglob("*.*"))  # no file written: training never started
