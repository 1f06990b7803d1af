"""Every checkpoint load in the package, its experiments and its tests passes ``weights_only=True``.

A checkpoint is a pickle: loading one with ``weights_only=False`` runs whatever code it holds.
The default has moved between torch and Lightning releases, so every call says it explicitly:
``torch.load``, ``load_from_checkpoint`` and the Trainer methods given a ``ckpt_path``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("framework", "callbacks", "datamodules", "experiments", "bench", "tests")
LOADERS = {"load", "load_from_checkpoint"}
TRAINER_METHODS = {"fit", "validate", "test", "predict"}


def _loads_without_weights_only(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line`` of each checkpoint-loading call that does not pass ``weights_only=True``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name = node.func.attr
        keywords = {k.arg: k.value for k in node.keywords}
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        loads = ((name == "load" and owner == "torch") or name == "load_from_checkpoint"
                 or (name in TRAINER_METHODS and "ckpt_path" in keywords))
        flag = keywords.get("weights_only")
        if loads and not (isinstance(flag, ast.Constant) and flag.value is True):
            found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_the_checker_finds_a_load_without_the_flag(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import torch\nx = torch.load('a.pt')\ny = torch.load('b.pt', weights_only=True)\n"
                      "trainer.test(m, ckpt_path='c.ckpt')\n"
                      "M.load_from_checkpoint('d', weights_only=False)\n"
                      "trainer.test(m, ckpt_path='e.ckpt', weights_only=True)\n")
    assert _loads_without_weights_only(sample, tmp_path) == ["sample.py:2", "sample.py:4", "sample.py:5"]


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_checkpoint_load_passes_weights_only_true(folder: str) -> None:
    offenders = [hit for path in sorted((ROOT / folder).rglob("*.py"))
                 for hit in _loads_without_weights_only(path)]
    assert offenders == [], f"add weights_only=True to: {offenders}"
