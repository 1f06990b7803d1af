"""Reading a checkpoint file safely, with errors that say which file and what to do.

``torch.load`` reports a damaged file as a bare ``EOFError``, ``OSError: [Errno 22]`` or an
unpickling error that advises ``weights_only=False``, which is the wrong advice for a corrupt
file and an unsafe one for a file of unknown origin. ``read_checkpoint`` checks the file
first (present, not empty, a zip archive as ``torch.save`` writes) and loads it with
``weights_only=True`` and ``mmap=True`` (tensors are mapped, not read), so asking for the
hyperparameters of a large checkpoint costs little memory.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp())
    >>> torch.save({"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"lr": 0.1}}, folder / "a.ckpt")
    >>> read_checkpoint(folder / "a.ckpt")["hyper_parameters"]
    {'lr': 0.1}
    >>> (folder / "empty.ckpt").write_bytes(b"")
    0
    >>> try:
    ...     read_checkpoint(folder / "empty.ckpt")
    ... except CheckpointFileError as error:
    ...     print(str(error).split(": ", 1)[1].split(";")[0])
    is empty (0 bytes), probably written by a run that stopped while saving
"""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from os import PathLike
from pathlib import Path
from typing import Any

import torch

from ripieno.framework.errors import RipienoInputError, file_problem, first_line

_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)")
"""A ``weights_only`` refusal of a global, in torch's older (``Unsupported global: GLOBAL os.system``)
and newer (``Trying to load unsupported GLOBAL posix.system whose module posix is blocked``) words."""
CODE_RUNNING_MODULES = frozenset({
    "os", "posix", "nt", "sys", "subprocess", "_posixsubprocess", "shutil", "socket", "runpy", "importlib",
    "pty", "code", "ctypes", "webbrowser", "marshal", "pickle", "_pickle", "multiprocessing", "operator",
})
CODE_RUNNING_BUILTINS = frozenset({
    "eval", "exec", "compile", "__import__", "getattr", "setattr", "delattr", "open", "breakpoint", "input",
})
"""Modules (and builtins) whose globals in a pickle mean loading the file would run commands or code."""
OTHER_CHECKPOINT = "give {option} another checkpoint of that run (last.ckpt or a best-*.ckpt), or train again"


class CheckpointFileError(RipienoInputError):
    """A checkpoint file is missing, empty, damaged, unsafe to load or not a Lightning checkpoint."""


def read_checkpoint(path: str | PathLike[str], option: str = "--ckpt_path") -> dict[str, Any]:
    """Load a Lightning checkpoint with ``weights_only=True``, or say what is wrong with it.

    Args:
        path: The checkpoint file.
        option: The setting that named it, quoted in the messages (``--ckpt_path``).

    Returns:
        The checkpoint's dictionary (tensors memory-mapped from the file).

    Raises:
        CheckpointFileError: The file is missing, a folder, empty, not a ``torch.save`` zip
            archive, truncated or damaged, holds objects that safe loading refuses, or has no
            ``state_dict``. The message names the file, the problem and the fix.
    """
    file = Path(path).expanduser()
    lent = lent_checkpoint(file)
    if lent is not None:
        return lent
    if not file.exists():
        raise CheckpointFileError(file_problem(file, "does not exist", f"check {option}"))
    if file.is_dir():
        raise CheckpointFileError(file_problem(file, "is a folder, not a checkpoint file",
                                               f"give {option} a .ckpt file inside it, e.g. last.ckpt"))
    if file.stat().st_size == 0:
        raise CheckpointFileError(file_problem(
            file, "is empty (0 bytes), probably written by a run that stopped while saving",
            OTHER_CHECKPOINT.format(option=option)))
    if not zipfile.is_zipfile(file):
        raise CheckpointFileError(file_problem(
            file, "is not a PyTorch checkpoint (not the zip archive torch.save writes: damaged, truncated or"
            " another kind of file)", OTHER_CHECKPOINT.format(option=option)))
    try:
        checkpoint = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as error:
        refused = _GLOBAL.search(str(error))
        if refused is None:  # a garbled pickle: torch reports its bytes as unsupported operands
            raise CheckpointFileError(file_problem(file, _damaged(error),
                                                   OTHER_CHECKPOINT.format(option=option))) from None
        blocked = "is blocked" in str(error)  # torch's own list of modules that run commands
        raise CheckpointFileError(_refused_global(file, refused.group(1), option, blocked)) from None
    except (RuntimeError, OSError, EOFError, ValueError) as error:
        raise CheckpointFileError(file_problem(file, _damaged(error),
                                               OTHER_CHECKPOINT.format(option=option))) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise CheckpointFileError(file_problem(
            file, "is not a Lightning checkpoint (it has no state_dict)",
            f"give {option} a file saved by a Lightning Trainer (ModelCheckpoint or"
            " trainer.save_checkpoint)"))
    return checkpoint


_LENT: dict[Path, tuple[tuple[int, int, int], dict[str, Any]]] = {}
"""Checkpoints read already, by resolved path, with the file's identity then (``lending_checkpoint``)."""


@contextmanager
def lending_checkpoint(path: str | PathLike[str], checkpoint: dict[str, Any]) -> Iterator[None]:
    """Within the block, ``read_checkpoint(path)`` returns ``checkpoint`` while the file is unchanged.

    A command that reads its checkpoint once lends it to the code it calls (a datamodule reading
    its preprocessing, the Trainer restoring the weights), so the file is opened once. Each
    borrower gets a shallow copy; a file replaced or rewritten since is read again.
    """
    file = Path(path).expanduser().resolve()
    _LENT[file] = (_identity(file), checkpoint)
    try:
        yield
    finally:
        _LENT.pop(file, None)


def lent_checkpoint(path: str | PathLike[str]) -> dict[str, Any] | None:
    """A shallow copy of the checkpoint lent for ``path`` (``lending_checkpoint``), file unchanged."""
    if not _LENT:
        return None
    file = Path(path).expanduser().resolve()
    identity, checkpoint = _LENT.get(file, (None, None))
    if checkpoint is None or identity != _identity(file):
        return None
    return dict(checkpoint)


def _identity(file: Path) -> tuple[int, int, int]:
    try:
        stat = os.stat(file)
    except OSError:
        return (-1, -1, -1)
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _refused_global(file: Path, name: str, option: str, blocked: bool = False) -> str:
    """The message for a pickle that names ``name`` (``module.attr``), which safe loading refused.

    ``blocked``: torch refused the global's whole module (its list of modules that run commands).

    A global of a module that runs commands or code (``posix.system``, ``builtins.eval``) is what
    a malicious file holds: loading it would run that code, so the message says so and offers
    no way to load it. Any other global (a class of the user's) is refused as unsafe to load
    unless the file is trusted.
    """
    module, _, attribute = name.rpartition(".")
    top = module.split(".", 1)[0]
    builtin = top in ("builtins", "__builtin__", "") and attribute in CODE_RUNNING_BUILTINS
    if blocked or builtin or top in CODE_RUNNING_MODULES:
        return file_problem(
            file, f"is unsafe: its pickle would call {name}, which runs code or commands on this machine"
            " when loaded (safe loading, weights_only=True, refused it before anything ran; ripieno and"
            " Lightning never write this)",
            f"do not load it; delete it unless you know who made it and why, and give {option} a"
            " checkpoint from a run you trust")
    return file_problem(
        file, f"holds Python objects that safe loading (weights_only=True) refuses ({name}): loading"
        " them would import and run code the file names",
        "save checkpoints with plain tensors, numbers, strings, lists and dicts (ripieno's own modules"
        " do); load this one by hand with weights_only=False only if you trust where it came from")


def _damaged(error: BaseException) -> str:
    return f"is truncated or damaged ({type(error).__name__}: {first_line(error)[:200]})"
