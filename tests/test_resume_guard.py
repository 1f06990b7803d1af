"""``--ckpt_path`` resumes only the model the config describes (issue 13, item 1).

Plain LightningCLI copies a checkpoint's hyperparameters over the config: a TabM recipe given
a LoMETab checkpoint trained LoMETab under TabM's name, and ``--model.init_args.lr`` was
silently ignored. Here the config decides; any difference stops the run before the first
training step, listing the differences and the ways on, and each way on is run to show it
works.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import torch

from ripieno.framework import TabularEnsembleModule
from ripieno.framework.cli import main

QUICK = ["--data.init_args.max_rows=600", "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=1",
         "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
         "--test_after_fit=false"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``last.ckpt`` of one epoch of the LoMETab churn recipe (rank 4, lr 0.002)."""
    root = tmp_path_factory.mktemp("trained")
    main(["fit", "-c", "tabular/lometab_churn", "--trainer.max_epochs=1",
          f"--trainer.default_root_dir={root}", *QUICK])
    return next(root.rglob("last.ckpt"))


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any training step runs."""
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a training step ran")
    monkeypatch.setattr(TabularEnsembleModule, "training_step", refuse)


def _stopped(args: list[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(args)
    return str(stop.value.code)


def _suggested(message: str) -> list[str]:
    """The arguments of the ``ripieno ...`` command the message suggests."""
    command = re.search(r": ripieno (fit .+?--ckpt_path \S+)", message)
    assert command is not None, message
    return shlex.split(command.group(1))


def test_another_recipe_stops_before_training_and_lists_the_differences(trained, tmp_path, no_training):
    message = _stopped(["fit", "-c", "tabular/tabm_churn", f"--ckpt_path={trained}", "--trainer.max_epochs=2",
                        f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert message.startswith(f"ripieno: error: {trained} holds another model than this config describes")
    assert "model.init_args.adapter: checkpoint 'lometab', config 'rank1'" in message
    assert "model.init_args.sigma_init: checkpoint 3.0, config 0.3" in message
    assert "leave out --ckpt_path" in message and "--resume_hparams checkpoint" in message
    assert f"-c {trained.parent.parent / 'config.yaml'}" in message  # the checkpoint's own run config
    assert not any(p.is_file() for p in tmp_path.rglob("*"))  # nothing was written: no run started
    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    shown = [line.strip() for line in page.splitlines() if line.startswith("  model.init_args.")]
    assert shown and all(line in message for line in shown)  # the README quotes this message as it is


def test_overrides_that_change_the_model_are_not_dropped(trained, tmp_path, no_training):
    message = _stopped(["fit", "-c", "tabular/lometab_churn", f"--ckpt_path={trained}",
                        "--model.init_args.lr=0.5", "--model.init_args.rank=8",
                        f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert "model.init_args.lr: checkpoint 0.002, config 0.5" in message
    assert "model.init_args.rank: checkpoint 4, config 8" in message
    assert "What differs (2)" in message


def test_another_data_spec_is_found_once_the_data_is_prepared(trained, tmp_path, no_training):
    args = ["fit", "-c", "tabular/lometab_churn", f"--ckpt_path={trained}",
            f"--trainer.default_root_dir={tmp_path}", *QUICK,
            "--data.init_args.max_rows=700"]  # other rows: other bins and quantiles
    message = _stopped(args)
    assert "model.init_args.data_spec.fitted_digest" in message  # bins and quantiles: fitted state
    assert "data_spec is what the datamodule learned" in message
    assert not list(tmp_path.rglob("*.ckpt")) and not list(tmp_path.rglob("metrics.csv"))
    assert not list(tmp_path.rglob("version_*"))  # the claimed run folder was released


def test_the_suggested_command_resumes_the_checkpoint(trained, tmp_path):
    message = _stopped(["fit", "-c", "tabular/tabm_churn", f"--ckpt_path={trained}",
                        f"--trainer.default_root_dir={tmp_path / 'refused'}", *QUICK])
    main([*_suggested(message), "--trainer.max_epochs=2",
          f"--trainer.default_root_dir={tmp_path / 'resumed'}", *QUICK])
    last = torch.load(next((tmp_path / "resumed").rglob("last.ckpt")), map_location="cpu", weights_only=True)
    first = torch.load(trained, map_location="cpu", weights_only=True)
    assert last["epoch"] == 1 and last["global_step"] == 2 * first["global_step"]  # continued, one more epoch
    assert last["hyper_parameters"]["adapter"] == "lometab" and last["hyper_parameters"]["rank"] == 4


def test_without_its_run_config_the_checkpoints_settings_are_suggested_as_overrides(trained, tmp_path):
    alone = tmp_path / "alone.ckpt"
    alone.write_bytes(trained.read_bytes())  # no config.yaml beside it
    message = _stopped(["fit", "-c", "tabular/tabm_churn", f"--ckpt_path={alone}",
                        f"--trainer.default_root_dir={tmp_path / 'refused'}", *QUICK])
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["alone.ckpt"]  # explaining wrote nothing
    args = _suggested(message)
    assert Path(args[args.index("-c") + 1]).name == "tabm_churn.yaml"  # this config, its settings over it
    assert "--model.init_args.adapter=lometab" in args and "--model.init_args.sigma_init=3.0" in args
    main([*args, "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path / 'resumed'}", *QUICK])
    assert torch.load(next((tmp_path / "resumed").rglob("last.ckpt")), weights_only=True)["epoch"] == 1


def test_resume_hparams_checkpoint_keeps_plain_lightning_behaviour(trained, tmp_path):
    main(["fit", "-c", "tabular/tabm_churn", f"--ckpt_path={trained}", "--resume_hparams=checkpoint",
          "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}", *QUICK])
    last = torch.load(next(tmp_path.rglob("last.ckpt")), map_location="cpu", weights_only=True)
    assert last["hyper_parameters"]["adapter"] == "lometab" and last["epoch"] == 1


def test_the_same_config_resumes(trained, tmp_path):
    main(["fit", "-c", "tabular/lometab_churn", f"--ckpt_path={trained}", "--trainer.max_epochs=2",
          f"--trainer.default_root_dir={tmp_path}", *QUICK])
    assert torch.load(next(tmp_path.rglob("last.ckpt")), weights_only=True)["epoch"] == 1


def test_test_and_predict_follow_the_same_rule(trained, tmp_path, no_training):
    for subcommand in ("test", "predict"):
        message = _stopped([subcommand, "-c", "tabular/lometab_churn", f"--ckpt_path={trained}",
                            "--model.init_args.k=8", f"--trainer.default_root_dir={tmp_path}", *QUICK[:-1]])
        assert "model.init_args.k: checkpoint 16, config 8" in message
