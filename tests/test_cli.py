"""The ripieno command: shipped recipes by name, outputs under default_root_dir, no leftovers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ripieno.framework.cli import main
from ripieno.framework.runner.command import resolve_config_args
from ripieno.framework.runner.recipes import RECIPES_DIR, RecipeNotFoundError, find_recipe, list_recipes

ROOT = Path(__file__).resolve().parents[1]
LOMETAB = RECIPES_DIR / "tabular" / "lometab_churn.yaml"


@pytest.mark.parametrize("name", ["tabular/lometab_churn", "tabular/lometab_churn.yaml",
                                  "recipes/tabular/lometab_churn.yaml"])
def test_a_shipped_recipe_is_found_by_name_from_any_folder(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_recipe(name) == LOMETAB


def test_a_users_own_file_wins_over_a_shipped_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    own = tmp_path / "tabular" / "lometab_churn.yaml"
    own.parent.mkdir()
    own.write_text("seed_everything: 1\n")
    assert find_recipe("tabular/lometab_churn.yaml") == Path("tabular/lometab_churn.yaml")
    assert resolve_config_args(["fit", "--config=tabular/lometab_churn.yaml", "-c", "uq/ll_glm_boston"]) == [
        "fit", "--config=tabular/lometab_churn.yaml", "-c", str(RECIPES_DIR / "uq" / "ll_glm_boston.yaml")]


def test_an_unknown_recipe_names_the_closest_ones(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RecipeNotFoundError, match="Did you mean tabular/lometab_churn"):
        find_recipe("tabular/lometab_chrun")
    with pytest.raises(SystemExit, match="ripieno recipes"):
        main(["fit", "-c", "tabular/no_such_recipe"])


def test_recipes_lists_every_shipped_file_with_its_description(capsys):
    main(["recipes"])
    out = capsys.readouterr().out
    files = sorted(p.relative_to(ROOT / "recipes").with_suffix("").as_posix()
                   for p in (ROOT / "recipes").rglob("*.yaml"))
    not_recipes = ("spaces/", "benchmarks/")  # ripieno tune's spaces, ripieno benchmark's files
    assert [r.name for r in list_recipes()] == [f for f in files if not f.startswith(not_recipes)]
    for recipe in list_recipes():
        assert recipe.name in out
    for benchmark in (f for f in files if f.startswith("benchmarks/")):  # ripieno benchmark's files
        assert benchmark in out
        assert recipe.description, f"{recipe.name} has no leading comment"
    assert "LoMETab: K members share one MLP" in out


def test_default_root_dir_moves_every_output_and_main_restores_its_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("JSONARGPARSE_DEPRECATION_WARNINGS", raising=False)
    main(["fit", "-c", "tabular/lometab_churn", "--data.init_args.max_rows=600", "--trainer.max_epochs=1",
          "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
          "--trainer.limit_test_batches=1",
          "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
          "--trainer.default_root_dir=elsewhere"])
    assert "JSONARGPARSE_DEPRECATION_WARNINGS" not in os.environ  # set for the call only
    run = tmp_path / "elsewhere" / "logs" / "version_0"
    assert (run / "metrics.csv").is_file()
    assert (run / "config.yaml").is_file()
    assert list((run / "checkpoints").glob("best-*.ckpt"))
    assert not (tmp_path / "runs").exists()  # the recipe's own default_root_dir is not used
