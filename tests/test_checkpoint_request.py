"""``--ckpt_path`` is handled by one ``CheckpointRequest`` (issue 21, item 7).

The oracles: a counting spy on ``torch.load`` (every reader of a checkpoint goes through it:
``read_checkpoint``, Lightning's restore, ``load_from_checkpoint``) shows each command opens
its checkpoint exactly once; a spy on the comparison shows each saved hyperparameter is
compared exactly once; listings of every folder the command could write to, taken before and
after, show that explaining a mismatch writes nothing.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from ripieno.framework.cli import main
from ripieno.framework.runner import checkpoint_request
from ripieno.framework.runner.checkpoint_request import CheckpointMismatchError, CheckpointRequest
from ripieno.framework.runner.resume_check import IGNORED_KEYS

QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def _table(rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 2))
    colour = rng.choice(["red", "green", "blue"], size=rows)
    y = (x[:, 0] + 0.5 * (colour == "red") + 0.3 * rng.normal(size=rows) > 0).astype(int)
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "colour": colour, "y": y})


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A one-epoch run on a small table: its folder, checkpoint, command-line arguments and config."""
    folder = tmp_path_factory.mktemp("trained")
    _table(240, 0).to_csv(folder / "train.csv", index=False)
    _table(20, 1).drop(columns="y").to_csv(folder / "new.csv", index=False)
    args = ["--data=ripieno.datamodules.TabularDataModule", "--data.init_args.dataset=null",
            f"--data.init_args.path={folder / 'train.csv'}", "--data.init_args.target=y",
            "--data.init_args.categorical=[colour]", "--data.init_args.n_bins=8",
            "--model=ripieno.framework.methods.TabularEnsembleModule", "--model.init_args.k=4",
            "--model.init_args.d_block=16", *QUIET]
    main(["fit", *args, "--trainer.max_epochs=1", f"--trainer.default_root_dir={folder / 'run'}"])
    ckpt = next((folder / "run").rglob("*.ckpt"))
    config = next((folder / "run").rglob("config.yaml"))
    return {"folder": folder, "ckpt": ckpt, "args": args, "config": config}


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[Path | None]:
    """Every ``torch.load`` call from now on, by the file it reads (``None``: not a named file)."""
    calls: list[Path | None] = []
    load = torch.load

    def counting_load(f: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        name = f if isinstance(f, str | os.PathLike) else getattr(f, "path", None) or getattr(f, "name", None)
        calls.append(Path(name).resolve() if isinstance(name, str | os.PathLike) else None)
        return load(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", counting_load)
    return calls


def _stopped(args: list[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(args)
    return str(stop.value.code)


def _listing(*folders: Path) -> dict[Path, int]:
    """Every file and folder under ``folders`` with its modification time."""
    return {p: p.stat().st_mtime_ns for folder in folders for p in [folder, *folder.rglob("*")]}


def test_names_that_lightning_resolves_are_passed_through_unread(reads):
    for name in ("best", "last", "hpc", "registry", "registry:my-model:latest"):
        request = CheckpointRequest(name)
        assert request.file is None
        with request.lend():  # nothing to lend: nothing is read
            pass
        with pytest.raises(ValueError, match="resolved by Lightning"):
            request.checkpoint  # noqa: B018
    assert CheckpointRequest("last", lightning_names=False).file == Path("last")  # select_members' own file
    assert reads == []


def test_a_resume_opens_the_checkpoint_once_and_compares_each_setting_once(run, tmp_path, reads,
                                                                           monkeypatch):
    compared: list[set[str]] = []
    compare = checkpoint_request.compare_hparams

    def counting_compare(checkpoint: Any, config: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        compared.append((set(checkpoint) | set(config)) - set(kwargs.get("skip", ())) - IGNORED_KEYS)
        return compare(checkpoint, config, **kwargs)

    monkeypatch.setattr(checkpoint_request, "compare_hparams", counting_compare)
    main(["fit", *run["args"], f"--ckpt_path={run['ckpt']}", "--trainer.max_epochs=2",
          f"--trainer.default_root_dir={tmp_path}"])
    assert reads.count(run["ckpt"].resolve()) == 1
    saved = torch.load(run["ckpt"], weights_only=True)
    resumed = torch.load(next(tmp_path.rglob("*.ckpt")), weights_only=True)
    assert resumed["epoch"] == 1 and resumed["global_step"] == 2 * saved["global_step"]  # really restored
    keys = set(saved["hyper_parameters"]) - IGNORED_KEYS
    assert sum(len(c) for c in compared) == len(keys) and set().union(*compared) == keys  # each key once


def test_resume_hparams_checkpoint_opens_the_checkpoint_once(run, tmp_path, reads):
    main(["fit", *run["args"], "--model.init_args.k=8", f"--ckpt_path={run['ckpt']}",
          "--resume_hparams=checkpoint", "--trainer.max_epochs=2", f"--trainer.default_root_dir={tmp_path}"])
    assert reads.count(run["ckpt"].resolve()) == 1
    resumed = torch.load(next(tmp_path.rglob("*.ckpt")), weights_only=True)
    assert resumed["hyper_parameters"]["k"] == 4 and resumed["epoch"] == 1  # the checkpoint's k, as Lightning


def test_predict_on_new_rows_opens_the_checkpoint_once(run, tmp_path, reads):
    out = tmp_path / "predictions"
    main(["predict", *run["args"], f"--ckpt_path={run['ckpt']}",
          f"--data.init_args.predict_path={run['folder'] / 'new.csv'}",
          f"--trainer.default_root_dir={tmp_path}",
          "--trainer.callbacks+=ripieno.callbacks.MemberPredictionWriter",
          f"--trainer.callbacks.output_dir={out}"])
    assert reads.count(run["ckpt"].resolve()) == 1  # the preprocessing and the weights from one read
    assert len(pd.read_csv(out / "predictions.csv")) == 20


def test_select_members_opens_the_checkpoint_once(run, tmp_path, reads):
    main(["select_members", "-c", str(run["config"]), f"--ckpt_path={run['ckpt']}", "--k=2",
          f"--out={tmp_path / 'best2.ckpt'}"])
    assert reads.count(run["ckpt"].resolve()) == 1
    assert torch.load(tmp_path / "best2.ckpt", weights_only=True)["hyper_parameters"]["k"] == 2


def test_a_mismatch_is_explained_without_writing_anything(run, tmp_path, reads, monkeypatch):
    alone = tmp_path / "checkpoints" / "alone.ckpt"  # no run config.yaml beside it: the hint is built
    alone.parent.mkdir()
    alone.write_bytes(run["ckpt"].read_bytes())
    (tmp_path / "cwd").mkdir()
    (tmp_path / "tmp").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    before = _listing(tmp_path)
    message = _stopped(["fit", *run["args"], "--model.init_args.k=8", "--model.init_args.lr=0.5",
                        f"--ckpt_path={alone}", f"--trainer.default_root_dir={tmp_path / 'run'}"])
    assert _listing(tmp_path) == before  # no run folder, no rebuilt config, no temporary file
    assert "What differs (2)" in message and "model.init_args.k: checkpoint 4, config 8" in message
    assert "add --model.init_args.k=4 --model.init_args.lr=0.002 to this command" in message  # the way on
    assert reads.count(alone.resolve()) == 1


def test_the_request_explains_with_overrides_it_checked(tmp_path):
    file = tmp_path / "m.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"_class_path": "pkg.M", "rank": 4, "name": "a b",
                                                       "sizes": [1, 2], "data_spec": {"n": 2}}}, file)
    offered: list[dict[str, Any]] = []
    parses: Callable[[dict[str, Any]], bool] = lambda sections: offered.append(sections) is None  # noqa: E731
    request = CheckpointRequest(file, command="test", config_files=("my config.yaml",), parses=parses)
    configured = {"_class_path": "pkg.M", "rank": 8, "name": "a", "sizes": [1, 2], "data_spec": {"n": 3}}
    with pytest.raises(CheckpointMismatchError) as error:
        request.check_config(configured, {})
    lines = str(error.value).splitlines()
    assert lines[1:3] == ["  model.init_args.name: checkpoint 'a b', config 'a'",
                          "  model.init_args.rank: checkpoint 4, config 8"]  # the data spec: once it is known
    assert offered == [{"model": {"class_path": "pkg.M", "init_args": {"name": "a b", "rank": 4}}}]
    assert ("ripieno test -c 'my config.yaml' '--model.init_args.name=a b' --model.init_args.rank=4"
            f" --ckpt_path {file}") in str(error.value)
    with pytest.raises(CheckpointMismatchError, match=r"data_spec\.n: checkpoint 2, config 3"):
        request.check_linked(configured)
    request.check_linked({**configured, "data_spec": {"n": 2}})  # the same spec: nothing to say
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ckpt"]


def test_a_file_changed_since_it_was_read_is_read_again(tmp_path, reads):
    file = tmp_path / "m.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1)}}, file)
    request = CheckpointRequest(file)
    with request.lend():
        from ripieno.framework.checkpoint_file import read_checkpoint

        assert read_checkpoint(file)["state_dict"]["w"] is request.checkpoint["state_dict"]["w"]
        torch.save({"state_dict": {"w": torch.ones(3)}}, file.with_suffix(".new"))
        file.with_suffix(".new").replace(file)  # replaced while the command runs
        assert read_checkpoint(file)["state_dict"]["w"].tolist() == [1.0, 1.0, 1.0]
    assert reads.count(file.resolve()) == 2
