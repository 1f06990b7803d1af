"""A missing, empty, damaged or unsafe checkpoint stops with one line naming it and the fix."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from ripieno.framework.checkpoint_file import CheckpointFileError, read_checkpoint
from ripieno.framework.cli import main


class Opaque:
    """An object ``weights_only`` loading refuses (it is not a tensor, number, string or container)."""


def _good(path: Path) -> Path:
    torch.save({"state_dict": {"w": torch.arange(4.0)}, "hyper_parameters": {"lr": 0.1}}, path)
    return path


def _damaged(path: Path, how: str) -> Path:
    """A checkpoint file broken in one of the ways users meet."""
    if how == "empty":
        path.write_bytes(b"")
    elif how == "random bytes":
        path.write_bytes(np.random.default_rng(0).bytes(100))
    elif how == "truncated":
        data = _good(path).read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif how == "folder":
        path.mkdir()
    elif how == "unsafe object":
        torch.save({"state_dict": {}, "extra": Opaque()}, path)
    elif how == "no state_dict":
        torch.save({"weights": torch.ones(2)}, path)
    elif how == "damaged record":
        data = _good(path).read_bytes()
        with zipfile.ZipFile(path) as archive:
            info = next(i for i in archive.infolist() if i.filename.endswith("data.pkl"))
        start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
        path.write_bytes(data[:start] + b"\x00" * info.compress_size + data[start + info.compress_size:])
    return path


CASES = {
    "empty": "is empty (0 bytes)",
    "random bytes": "is not a PyTorch checkpoint",
    "truncated": "is not a PyTorch checkpoint",
    "folder": "is a folder, not a checkpoint file",
    "unsafe object": "holds Python objects that safe loading (weights_only=True) refuses",
    "no state_dict": "is not a Lightning checkpoint",
    "damaged record": "is truncated or damaged",
}


def test_a_good_checkpoint_reads_like_torch_load(tmp_path: Path) -> None:
    path = _good(tmp_path / "good.ckpt")
    read = read_checkpoint(path)
    assert read["hyper_parameters"] == {"lr": 0.1}
    assert torch.equal(read["state_dict"]["w"], torch.load(path, weights_only=True)["state_dict"]["w"])


@pytest.mark.parametrize("how", sorted(CASES))
def test_each_bad_file_is_named_with_its_problem_and_a_fix(tmp_path: Path, how: str) -> None:
    path = _damaged(tmp_path / "model.ckpt", how)
    with pytest.raises(CheckpointFileError) as error:
        read_checkpoint(path)
    message = str(error.value)
    assert message.startswith(f"{path}: {CASES[how]}")
    assert "\n" not in message and message.endswith(".")
    assert "weights_only=False" not in message or "only if you trust" in message  # never the bare advice


def test_a_missing_file_names_the_option(tmp_path: Path) -> None:
    with pytest.raises(CheckpointFileError, match=r"nothing\.ckpt: does not exist; check --ckpt_path\.$"):
        read_checkpoint(tmp_path / "nothing.ckpt")


@pytest.mark.parametrize("how", ["empty", "random bytes", "truncated", "unsafe object"])
def test_the_command_stops_with_one_line_before_building_anything(tmp_path: Path, how: str) -> None:
    path = _damaged(tmp_path / "model.ckpt", how)
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", "tabular/lometab_churn", f"--ckpt_path={path}",
              f"--trainer.default_root_dir={tmp_path / 'run'}"])
    message = str(stop.value.code)
    assert message.startswith(f"ripieno: error: {path}: {CASES[how]}") and "\n" not in message
    assert not (tmp_path / "run").exists()  # nothing was prepared or written
