"""Smoke tests of experiments on a tiny grid, with behavioural oracles."""

import csv
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from experiments import (
    diversity_over_training,
    diversity_sweep,
    loes_comparison,
    mcover_seeds,
    perceptron_alpha,
    recipe_table,
    runs,
    uq_comparison,
)
from experiments.runs import prepare_recipe
from ripieno.framework.recipes import find_recipe

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "docs" / "results"
RECIPE = "tabular/lometab_churn"
TINY = ["--override", "data.init_args.max_rows=600"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _assert_png(path: Path) -> None:
    assert path.is_file(), path
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000, path


@pytest.mark.parametrize("recipe", [RECIPE, "recipes/tabular/lometab_churn.yaml", str(find_recipe(RECIPE))])
def test_prepare_recipe_drops_checkpointing_and_keeps_monitor(recipe):
    config = yaml.safe_load(prepare_recipe(recipe))
    names = [c["class_path"].rsplit(".", 1)[-1] for c in config["trainer"]["callbacks"]]
    assert "ModelCheckpoint" not in names and "EarlyStopping" not in names
    assert names.count("DiversityMonitor") == 1


@pytest.mark.parametrize(("parse", "argv", "recipe", "out"), [
    (diversity_sweep.parse_args, [], "tabular/lometab_churn", "diversity_sweep"),
    (diversity_over_training.parse_args, [], "tabular/lometab_churn", "diversity_over_training"),
    (uq_comparison.parse_args, [], "uq/ll_glm_fashion_mnist", "uq_fashion_mnist"),
    (recipe_table.parse_args, ["--recipes", "tabular/mlp_churn"], None, "tabular_recipes"),
    (loes_comparison.parse_args, ["--mode", "georeg"], None, "loes_minilm_rotten_tomatoes"),
    (mcover_seeds.parse_args, ["--family", "committee"], None, "mcover_committee_fashion_mnist"),
    (perceptron_alpha.parse_args, [], None, "mcover_perceptron"),
])
def test_defaults_do_not_depend_on_the_current_folder(tmp_path, monkeypatch, parse, argv, recipe, out):
    """From any folder: the default recipe is the shipped one, outputs go to the repo's docs/results."""
    monkeypatch.chdir(tmp_path)
    args = parse(argv)
    assert args.out == RESULTS / out and args.out.is_absolute()
    if recipe is not None:
        assert args.recipe == find_recipe(recipe) and args.recipe.is_file()


def test_explicit_out_stays_as_given(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert diversity_sweep.parse_args(["--out", "here"]).out == Path("here")


def test_recipe_accepts_names_and_paths_from_any_folder(tmp_path, monkeypatch):
    own = tmp_path / "mine.yaml"
    own.write_text(find_recipe(RECIPE).read_text())
    monkeypatch.chdir(tmp_path)
    assert diversity_sweep.parse_args(["--recipe", "mine.yaml"]).recipe == Path("mine.yaml")
    for name in ("tabular/mlp_churn", "tabular/mlp_churn.yaml", "recipes/tabular/mlp_churn.yaml"):
        assert recipe_table.parse_args(["--recipes", name]).recipes == [find_recipe("tabular/mlp_churn")]


def test_unknown_recipe_fails_before_any_run(capsys):
    with pytest.raises(SystemExit):
        diversity_sweep.parse_args(["--recipe", "tabular/lometab_chrun"])
    err = capsys.readouterr().err
    assert "tabular/lometab_churn" in err and "ripieno recipes" in err


def test_runs_pass_args_and_leave_sys_argv_alone(tmp_path, monkeypatch):
    """The CLI gets the run's command line as ``args`` while ``sys.argv`` stays the experiment's."""
    argv = ["python -m experiments.diversity_sweep", "--not-a-cli-option"]
    monkeypatch.setattr(sys, "argv", argv)
    seen: list[list[str]] = []

    class SpyCLI(runs.RipienoCLI):
        def before_instantiate_classes(self) -> None:
            seen.append(list(sys.argv))
            super().before_instantiate_classes()

    monkeypatch.setattr(runs, "RipienoCLI", SpyCLI)
    diversity_sweep.main(["--ranks", "1", "--sigmas", "0.1", "--max_epochs", "1",
                          "--out", str(tmp_path), *TINY])
    assert seen == [argv]
    assert sys.argv is argv and argv == ["python -m experiments.diversity_sweep", "--not-a-cli-option"]
    assert (tmp_path / "diversity_sweep.csv").is_file()


def test_importing_experiments_changes_nothing_in_the_process():
    """No environment variable, warning filter or torch thread count is set at import."""
    code = (
        "import os, warnings, torch, lightning, pandas, matplotlib.figure, ripieno.framework.cli\n"
        "import ripieno.callbacks, ripieno.framework.mcover.perceptron\n"
        "env, filters, threads = dict(os.environ), list(warnings.filters), torch.get_num_threads()\n"
        "import experiments.diversity_sweep, experiments.diversity_over_training, experiments.recipe_table\n"
        "import experiments.loes_comparison, experiments.mcover_seeds, experiments.uq_comparison\n"
        "import experiments.perceptron_alpha\n"
        "assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())\n"
        "assert list(warnings.filters) == filters, [f for f in warnings.filters if f not in filters]\n"
        "assert torch.get_num_threads() == threads\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_diversity_sweep_tiny_grid(tmp_path, capsys):
    out = tmp_path / "sweep"
    diversity_sweep.main(["--recipe", RECIPE, "--ranks", "1", "2", "--sigmas", "0.1", "3.0",
                          "--max_epochs", "1", "--out", str(out), *TINY])
    printed = capsys.readouterr().out
    csv_path = out / "diversity_sweep.csv"
    assert str(csv_path) in printed

    rows = _read_csv(csv_path)
    assert {(int(r["rank"]), float(r["sigma_init"])) for r in rows} == {
        (1, 0.1), (1, 3.0), (2, 0.1), (2, 3.0)}
    assert len(rows) == 4
    expected = {"rank", "sigma_init", "init_pairwise_kl", "init_disagreement", "pairwise_kl",
                "disagreement", "val_accuracy", "val_nll", "n_params", "wall_time_s", "epochs"}
    assert expected <= set(rows[0])
    for row in rows:
        assert int(row["epochs"]) == 1
        assert 0.0 <= float(row["val_accuracy"]) <= 1.0
        assert float(row["pairwise_kl"]) >= 0.0 and float(row["init_pairwise_kl"]) >= 0.0
        assert float(row["wall_time_s"]) > 0.0
    by_cell = {(int(r["rank"]), float(r["sigma_init"])): r for r in rows}
    # Rank adds adapter parameters; sigma_init does not change the architecture.
    assert int(by_cell[2, 0.1]["n_params"]) > int(by_cell[1, 0.1]["n_params"])
    assert by_cell[1, 0.1]["n_params"] == by_cell[1, 3.0]["n_params"]
    # Behaviour: a 30x larger multiplicative perturbation at init makes members differ more.
    for rank in (1, 2):
        assert float(by_cell[rank, 3.0]["init_pairwise_kl"]) > float(
            by_cell[rank, 0.1]["init_pairwise_kl"])

    for name in ("heatmap_init_pairwise_kl", "heatmap_final_pairwise_kl",
                 "heatmap_val_accuracy", "heatmap_val_nll"):
        _assert_png(out / f"{name}.png")


def test_diversity_sweep_rejects_bad_grid(tmp_path):
    with pytest.raises(SystemExit):
        diversity_sweep.main(["--recipe", RECIPE, "--ranks", "0", "--out", str(tmp_path)])


def test_diversity_sweep_failing_cell_raises(tmp_path):
    with pytest.raises(RuntimeError, match="rank=1, sigma_init=0.1"):
        diversity_sweep.main(["--recipe", RECIPE, "--ranks", "1", "--sigmas", "0.1",
                              "--max_epochs", "1", "--out", str(tmp_path), *TINY,
                              "--override", "data.init_args.val_size=1.5"])


def test_diversity_over_training_compares_adapters(tmp_path, capsys):
    out = tmp_path / "over"
    diversity_over_training.main(["--recipe", RECIPE, "--compare", "additive", "--rank", "2",
                                  "--sigma", "0.3", "--max_epochs", "2", "--out", str(out),
                                  *TINY])
    printed = capsys.readouterr().out
    csv_path = out / "diversity_over_training.csv"
    assert str(csv_path) in printed
    rows = _read_csv(csv_path)
    assert list(rows[0]) == ["adapter", "epoch", "step", "pairwise_kl", "disagreement",
                             "val_accuracy", "val_nll"]
    for adapter in ("lometab", "additive"):
        mine = [r for r in rows if r["adapter"] == adapter]
        assert [int(r["epoch"]) for r in mine] == [0, 1, 2]  # at init, then each epoch
        steps = [int(r["step"]) for r in mine]
        assert steps[0] == 0 and steps[1] > 0 and steps[2] == 2 * steps[1]
    assert len(rows) == 6
    # Same seed and data: both adapters train on the same batches, so steps agree.
    assert [r["step"] for r in rows[:3]] == [r["step"] for r in rows[3:]]
    _assert_png(out / "diversity_over_training.png")


def test_diversity_over_training_rejects_same_adapter(tmp_path):
    with pytest.raises(ValueError, match="already in the comparison"):
        diversity_over_training.main(["--recipe", RECIPE, "--compare", "lometab",
                                      "--max_epochs", "1", "--out", str(tmp_path), *TINY])


def test_recorder_matches_diversity_monitor_history(tmp_path):
    """The recorder reads each validation's own values, the ones DiversityMonitor logged."""
    from experiments.runs import build_run, run_overrides

    run = build_run(prepare_recipe(RECIPE),
                    [*run_overrides(max_epochs=2, root_dir=tmp_path),
                     "--data.init_args.max_rows=600"])
    run.validate()
    run.fit()
    assert len(run.recorder.rows) == len(run.monitor.history) == 3
    for recorded, logged in zip(run.recorder.rows, run.monitor.history, strict=True):
        assert recorded["step"] == logged["step"]
        for name in ("pairwise_kl", "disagreement"):
            assert recorded[f"diversity/val/{name}"] == pytest.approx(logged[f"diversity/val/{name}"])
    assert run.recorder.rows[1]["val/nll"] != run.recorder.rows[2]["val/nll"]


def test_recipe_table_tests_the_best_checkpoint(tmp_path):
    recipe_table.main(["--recipes", "tabular/mlp_churn", str(find_recipe("tabular/tabm_churn")),
                       "--out", str(tmp_path), "--override", "data.init_args.max_rows=600",
                       "--override", "trainer.max_epochs=2"])
    frame = pd.read_csv(tmp_path / "recipe_table.csv")
    assert list(frame["recipe"]) == ["mlp_churn", "tabm_churn"]
    assert frame["test/accuracy"].between(0, 1).all()
    assert frame["best_epoch"].between(0, 1).all()
    # Diversity exists only for the ensemble (the MLP recipe has one member, no monitor).
    assert frame["diversity/test/pairwise_kl"].isna().tolist() == [True, False]
    assert (tmp_path / "recipe_table.md").read_text().count("\n") == 4
    # No logger in the recipes: the CLI's CSV logger writes under trainer.default_root_dir.
    for recipe in ("mlp_churn", "tabm_churn"):
        assert (tmp_path / "runs" / recipe / "seed0" / "logs" / "version_0" / "metrics.csv").is_file()
