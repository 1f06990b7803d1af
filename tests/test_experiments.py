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
from experiments.runs import prepare_recipe, results_dir, shown_path
from ripieno.framework.runner.recipes import find_recipe

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
        "import os, warnings, torch, lightning, pandas, matplotlib.figure, ripieno.framework.runner.command\n"
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
                              "--override", "data.init_args.split.val_size=1.5"])


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


@pytest.mark.slow
def test_claims_uq_reduced_rows_are_well_formed(tmp_path):
    """The UQ claims experiment in its CI setting: four claim rows, tables and settings written."""
    from experiments import claims_uq
    from experiments.claim_rows import VERDICTS, ClaimRow

    rows = claims_uq.claim_rows(tmp_path, reduced=True)
    assert len(rows) == 4 and all(isinstance(r, ClaimRow) for r in rows)
    for row in rows:
        assert row.verdict in VERDICTS and row.verdict == "inconclusive"  # reduced: too small to say
        assert row.method == "LL-GLM / DNN-GLM" and "--reduced" in row.command
        assert all([row.claim, row.data, row.reference, row.ours, row.baseline, row.seeds, row.note])
    assert "VARROC-OOD" in rows[0].reference and "LinearSampling" in rows[0].reference
    table = pd.read_csv(tmp_path / "uq_methods.csv")
    methods = list(table["method"])
    for name in ("MAP", "LL-GLM (LinearSampling)", "DNN-GLM (LinearSampling)", "LL-GLM (exact GGN)",
                 "DNN-GLM (GGN", "MC-dropout", "SWAG", "deep ensemble"):
        assert any(m.startswith(name) for m in methods), name
    glms = table[table["varroc"] == "map"]
    assert len(glms) == 6 and glms[["varroc_id", "varroc_ood"]].notna().all().all()
    paper = table.set_index("method").loc["LL-GLM (LinearSampling, paper's gamma, scale 1)"]
    assert (paper["gamma"], paper["predictive_scale"]) == (1.0, 1.0)
    chosen = table.loc[table["method"] == "DNN-GLM (LinearSampling)", "gamma"].item()
    assert chosen in claims_uq.GAMMA_GRID["DNN-GLM"]
    assert (table["peak_mib"].dropna() >= 0).all() and table["accuracy"].between(0, 1).all()
    for name in ("uq_methods.md", "claims.md", "settings.json", "linear_sampling_grid.csv"):
        assert (tmp_path / name).is_file(), name
    assert "DNN-GLM separates OOD inputs" in (tmp_path / "claims.md").read_text()


@pytest.mark.slow
def test_claims_lometab_reduced_rows_are_well_formed(tmp_path):
    """The LoMETab claims experiment in its CI setting: four rows, every CSV and plot written."""
    from experiments import claims_lometab
    from experiments.claim_rows import VERDICTS, ClaimRow

    rows = claims_lometab.claim_rows(tmp_path, reduced=True)
    assert len(rows) == 4 and all(isinstance(r, ClaimRow) for r in rows)
    for row in rows:
        assert row.method == "LoMETab" and row.verdict in VERDICTS
        assert "python -m experiments.claims_lometab --reduced" in row.command and row.seeds == "0"
        assert all([row.claim, row.data, row.reference, row.ours, row.baseline, row.note])
    assert "lometab/plain" in rows[0].reference and "lometab/rank_normalized" in rows[0].ours
    assert "additive/plain" in rows[0].baseline and "additive/relative" in rows[0].baseline
    budget = claims_lometab.REDUCED
    grid = pd.read_csv(tmp_path / "grid.csv")
    cells = len(budget.ranks) * len(budget.sigmas) * len(budget.seeds)
    assert len(grid) == len(claims_lometab.TABLES) * len(claims_lometab.VARIANTS) * cells
    # every variant was built with the adapter and draw it is named after
    assert set(grid["variant"]) == set(grid["adapter"] + "/" + grid["adapter_init"])
    assert set(grid["variant"]) == set(claims_lometab.VARIANTS)
    assert (grid[["init_pairwise_kl", "pairwise_kl"]] >= 0).all().all()
    curves = pd.read_csv(tmp_path / "over_training.csv")
    assert set(curves["table"]) == set(claims_lometab.TABLES) and curves["epoch"].min() == 0
    summary = pd.read_csv(tmp_path / "grid_summary.csv")
    assert len(summary) == 2 * len(claims_lometab.TABLES) * len(claims_lometab.VARIANTS)
    for name in ("grid_summary.md", "over_training_summary.csv", "over_training_summary.md",
                 "claims.md", "summary.md", "settings.json"):
        assert (tmp_path / name).is_file(), name
    for table in claims_lometab.TABLES:
        _assert_png(tmp_path / f"over_training_{table}.png")
        _assert_png(tmp_path / "heatmaps" / f"{table}_lometab_plain_init_pairwise_kl.png")
    # the tables can be rebuilt from the CSVs without training
    again = claims_lometab.write_report(claims_lometab.read_rows(tmp_path / "grid.csv"),
                                        claims_lometab.read_rows(tmp_path / "over_training.csv"),
                                        tmp_path, reduced=True, wall=0.0)
    assert [r.reference for r in again] == [r.reference for r in rows]


def test_sweep_and_curves_take_adapter_inits_and_seeds(tmp_path):
    """--adapter_inits and --seeds: one run per draw and seed, each built with its draw."""
    out = tmp_path / "sweep"
    diversity_sweep.main(["--recipe", RECIPE, "--ranks", "2", "--sigmas", "1.0", "--max_epochs", "1",
                          "--adapter_inits", "plain", "rank_normalized", "--seeds", "0", "1",
                          "--out", str(out), *TINY])
    rows = _read_csv(out / "diversity_sweep.csv")
    assert [(r["adapter_init"], r["seed"]) for r in rows] == [
        ("plain", "0"), ("plain", "1"), ("rank_normalized", "0"), ("rank_normalized", "1")]
    # plain: A_k B_k^T has std sqrt(2) * 1.0^2 > 1.0 (rank_normalized): members differ more at init
    kl = {(r["adapter_init"], r["seed"]): float(r["init_pairwise_kl"]) for r in rows}
    assert all(kl["plain", s] > kl["rank_normalized", s] for s in ("0", "1"))
    for init in ("plain", "rank_normalized"):
        _assert_png(out / f"heatmap_init_pairwise_kl_{init}.png")

    out = tmp_path / "over"
    diversity_over_training.main(["--recipe", RECIPE, "--adapter_inits", "plain", "rank_normalized",
                                  "--compare", "additive:relative", "--seeds", "0", "1",
                                  "--max_epochs", "1", "--out", str(out), *TINY])
    rows = _read_csv(out / "diversity_over_training.csv")
    assert list(rows[0])[:5] == ["adapter", "adapter_init", "seed", "epoch", "step"]
    variants = [(r["adapter"], r["adapter_init"], r["seed"]) for r in rows if r["epoch"] == "0"]
    assert variants == [("lometab", "plain", "0"), ("lometab", "plain", "1"),
                        ("lometab", "rank_normalized", "0"), ("lometab", "rank_normalized", "1"),
                        ("additive", "relative", "0"), ("additive", "relative", "1")]
    with pytest.raises(ValueError, match="already in the comparison"):
        diversity_over_training.main(["--recipe", RECIPE, "--adapter_inits", "plain",
                                      "--compare", "lometab:plain", "--max_epochs", "1",
                                      "--out", str(out), *TINY])


def test_a_claim_rows_command_names_a_default_output_folder_relative_to_the_repository(tmp_path):
    """Rows are committed: their commands must rerun on any checkout, not only in the folder they ran in."""
    assert shown_path(results_dir("claims/benchmark")) == "docs/results/claims/benchmark"
    assert shown_path(tmp_path / "out") == str(tmp_path / "out")  # outside the repository: as given
