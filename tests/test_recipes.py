"""Every recipe round-trips through --print_config and runs through the ripieno CLI."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from sklearn.datasets import load_wine

from ripieno.framework.cli import main

# spaces: test_tune.py; benchmarks: test_benchmark.py
RECIPES = sorted(p for p in Path("recipes").rglob("*.yaml") if p.parts[1] not in ("spaces", "benchmarks"))
QUICK = ["--data.init_args.max_rows=600", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false"]
QUICK_UQ = ["--data.init_args.max_train_rows=300", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false"]


def _quick_layer_embeddings(config):
    """A small source (its own max_rows); the session's feature cache.

    The real encoders' sources are cut as in ``experiments.claims_loes.ENCODERS_REDUCED`` (same rows, same
    splits), so their embeddings are extracted once per session (``tests/test_claims_loes.py`` runs them too).
    """
    args = config["data"]["init_args"]
    source = args["source"]
    init = dict(source.get("init_args") or {})
    init["max_rows" if source["class_path"].endswith("TextDataModule") else "max_train_rows"] = 120
    converted = (args.get("backbone") or {}).get("convert")
    if converted and source["class_path"].endswith("BackboneImageDataModule"):
        init["test_size"] = 0.02  # a real ImageNet encoder at 224 px: keep the carved test split small
    if source["class_path"].endswith("AudioDataModule"):
        # 30 s Whisper windows are costly: 50 clips, of which 10 validate (one per digit)
        init.update(max_train_rows=50, val_size=0.2)
    out = [f"--data.init_args.source={json.dumps({'class_path': source['class_path'], 'init_args': init})}",
           "--data.init_args.progress=false",
           "--data.init_args.selection.scores_path=null", "--trainer.enable_progress_bar=false",
           "--trainer.enable_model_summary=false"]
    return out  # backbones, tokenizers and embeddings go to the session's cache folder (conftest.py)


def _quick(recipe):
    config = yaml.safe_load(recipe.read_text())
    data = config["data"]["class_path"]
    if data.endswith("LayerEmbeddingDataModule"):
        return _quick_layer_embeddings(config)
    if data.endswith("TeacherStudentDataModule"):
        return ["--data.init_args.n_inputs=50", "--trainer.enable_progress_bar=false",
                "--trainer.enable_model_summary=false"]
    if data.endswith("TextDataModule"):
        return QUICK
    return QUICK_UQ if data.endswith("ImageDataModule") else QUICK


def _printed_config(capsys, args):
    with pytest.raises(SystemExit) as exit_info:
        main(args + ["--print_config"])
    assert exit_info.value.code in (0, None)
    return capsys.readouterr().out


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p))
def test_print_config_round_trips(recipe, capsys, tmp_path):
    first = _printed_config(capsys, ["fit", "-c", str(recipe)])
    printed = tmp_path / "printed.yaml"
    printed.write_text(first)
    second = _printed_config(capsys, ["fit", "-c", str(printed)])
    assert yaml.safe_load(first) == yaml.safe_load(second)
    config = yaml.safe_load(first)
    assert config["seed_everything"] == yaml.safe_load(recipe.read_text())["seed_everything"]
    assert "data_spec" not in config["model"]["init_args"]  # linked from data at run time


@pytest.mark.parametrize("recipe", [p for p in RECIPES if "paper" not in p.parts], ids=lambda p: p.stem)
def test_recipe_runs_fast_dev_run(recipe, tmp_path, capsys):
    own = []
    if recipe.stem == "lometab_csv":  # the recipe for a user's own file: give it one
        load_wine(as_frame=True).frame.to_csv(tmp_path / "own.csv", index=False)
        own = [f"--data.init_args.path={tmp_path / 'own.csv'}", "--data.init_args.target=target"]
    main(["fit", "-c", str(recipe), "--trainer.fast_dev_run=2",
          f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", *_quick(recipe), *own])
    out = capsys.readouterr().out
    assert "ripieno: test metrics" in out
    assert ("test/rmse" in out) or ("test/accuracy" in out)
    if "uq" in recipe.parts:
        assert "uq/test/nll" in out and "uq/test/lppd" in out
        if "fashion" in recipe.stem:
            assert "uq/test/varroc_ood" in out
    if "mcover" in recipe.parts and "perceptron" not in recipe.stem:
        assert "test/collapsed_accuracy" in out and "test/copy_accuracy" in out


def test_default_recipe_trains_and_tests_end_to_end(tmp_path, capsys):
    """A short real run: the model learns (test R^2 well above 0) and outputs are where it says."""
    main(["fit", "-c", "recipes/tabular/lometab_diamonds.yaml", "--trainer.max_epochs=2",
          "--data.init_args.max_rows=3000", "--trainer.enable_progress_bar=false",
          f"--trainer.default_root_dir={tmp_path}"])
    out = capsys.readouterr().out
    r2 = float(next(line.split()[-1] for line in out.splitlines() if "test/r2" in line))
    assert r2 > 0.8
    config = next(line.split()[-1] for line in out.splitlines() if line.startswith("ripieno: config"))
    assert Path(config).is_file()
    ckpt = next(line.split()[-1] for line in out.splitlines() if line.startswith("ripieno: checkpoint"))
    assert Path(ckpt).is_file()


def test_validate_and_predict_subcommands(tmp_path, capsys):
    main(["fit", "-c", "recipes/tabular/lometab_churn.yaml", "--trainer.max_epochs=1",
          "--test_after_fit=false", f"--trainer.default_root_dir={tmp_path}", *QUICK])
    ckpt = next(Path(tmp_path).rglob("last.ckpt"))
    main(["validate", "-c", "recipes/tabular/lometab_churn.yaml", f"--ckpt_path={ckpt}",
          f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", *QUICK])
    main(["predict", "-c", "recipes/tabular/lometab_churn.yaml", f"--ckpt_path={ckpt}",
          f"--trainer.default_root_dir={tmp_path}", "--trainer.logger=false", *QUICK])
    assert f"predictions written to {tmp_path}" in capsys.readouterr().out
    frame = pd.read_csv(tmp_path / "predictions.csv")
    saved = torch.load(tmp_path / "predictions.pt", weights_only=True)
    assert len(frame) == 120  # the test split of 600 rows
    # test-split rows, named by their row number in the 600 sampled rows of the table
    assert list(frame.columns) == ["row", "proba_no", "proba_yes", "prediction", "member_std", "disagreement"]
    assert frame["row"].is_unique and frame["row"].between(0, 4999).all()
    assert np.allclose(frame[["proba_no", "proba_yes"]].sum(axis=1), 1.0, atol=1e-5)
    assert np.allclose(frame["proba_yes"], saved["prediction"][:, 1].numpy(), atol=1e-6)
    assert saved["member_predictions"].shape == (120, 16, 2)
    assert torch.allclose(saved["member_predictions"].mean(1), saved["prediction"], atol=1e-6)


def test_bad_yaml_value_fails_before_training(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    config = yaml.safe_load(Path("recipes/tabular/lometab_churn.yaml").read_text())
    config["model"]["init_args"]["adapter"] = "lowrank"
    bad.write_text(yaml.safe_dump(config))
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", str(bad)])
    first = str(stop.value.code).splitlines()[0]
    assert "model" in first and "lowrank" in str(stop.value.code)
