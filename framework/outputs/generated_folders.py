r"""Folders ripieno generates (tokenizers, random or converted backbones): built once, atomically, locked.

A generated folder is described by a ``record`` (what determines its contents: the source
weights' SHA-256, a model's config and seed, a tokenizer's training texts and settings) and
written by a ``write(folder)`` function. ``build_once`` does the rest:

* a folder whose marker (``ripieno_generated.json``, written last) holds the record is kept
  as it is and nothing is written;
* otherwise the folder is built under a temporary name beside the target, the marker is
  written last, and the folder is renamed into place, so a kill at any moment leaves either
  nothing or a whole folder under the target's name;
* a file lock beside the target makes concurrent callers (DDP ranks, parallel jobs) build
  once: the first builds, the others wait and then read it. Leftover staging folders of a
  killed build are removed under that lock.

Inside ripieno's cache folder (``ripieno.framework.outputs.output_files.cache_root``) everything is
ripieno's own, so a folder without the right marker (half-built by an older ripieno, or
anything else found there) is rebuilt. Outside it, only an empty folder is filled: a folder
that holds anything else is the user's and is refused (``FileExistsError``) unless the caller
asks to ``overwrite`` it. ``generated_dir`` names a folder in the cache after its record, so
different records never share a folder.

Example:
    >>> import os, tempfile
    >>> from pathlib import Path
    >>> from unittest import mock
    >>> def write(folder: Path) -> dict:
    ...     _ = (folder / "vocab.txt").write_text("a\nb\n")
    ...     return {}
    >>> with mock.patch.dict(os.environ, {"RIPIENO_CACHE": tempfile.mkdtemp()}):
    ...     target = generated_dir("tokenizers", "demo", {"vocab": 2})
    ...     first = build_once(target, {"vocab": 2}, write)
    ...     second = build_once(target, {"vocab": 2}, write)
    >>> [first[1], second[1], sorted(p.name for p in first[0].iterdir())]
    [True, False, ['ripieno_generated.json', 'vocab.txt']]
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ripieno.framework.outputs.output_files import cache_dir, cache_root

#: The file whose presence (written last) marks a finished generated folder, and what it holds.
MARKER = "ripieno_generated.json"
_STAGING = ".tmp-"
_OLD = ".old-"


def record_key(record: dict[str, Any]) -> str:
    """A short digest of a record (its JSON with sorted keys): the name part of a cache folder.

    Example:
        >>> record_key({"b": 1, "a": [2, 3]}) == record_key({"a": [2, 3], "b": 1})
        True
        >>> len(record_key({"a": 1}))
        16
    """
    return hashlib.sha256(json.dumps(record, sort_keys=True, default=str).encode()).hexdigest()[:16]


def generated_dir(kind: str, name: str, record: dict[str, Any]) -> Path:
    """The cache folder ``<cache>/<kind>/<name>-<record_key(record)>`` (not created).

    Example:
        >>> import os
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"RIPIENO_CACHE": "/tmp/rc"}):
        ...     str(generated_dir("backbones", "random-gpt2", {"n_layer": 4}))  # doctest: +ELLIPSIS
        '/tmp/rc/backbones/random-gpt2-...'
    """
    return cache_dir(kind, f"{name}-{record_key(record)}")


def in_cache(path: str | Path) -> bool:
    """Whether ``path`` lies inside ripieno's cache folder (where every folder is ripieno's own).

    Example:
        >>> import os
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"RIPIENO_CACHE": "/tmp/rc"}):
        ...     in_cache("/tmp/rc/backbones/x"), in_cache("/tmp/models/x")
        (True, False)
    """
    return Path(path).expanduser().resolve().is_relative_to(cache_root().expanduser().resolve())


def finished_record(folder: str | Path) -> dict[str, Any] | None:
    """The marker of a finished generated folder, or ``None`` (no marker, or not readable).

    Example:
        >>> import tempfile
        >>> finished_record(tempfile.mkdtemp()) is None
        True
    """
    try:
        data = json.loads((Path(folder) / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def holds(folder: Path, record: dict[str, Any]) -> bool:
    """Whether ``folder`` is a finished generated folder whose marker holds every entry of ``record``."""
    written = finished_record(folder) if folder.is_dir() else None
    return written is not None and all(written.get(key) == value for key, value in record.items())


def build_once(target_dir: str | Path, record: dict[str, Any], write: Callable[[Path], dict[str, Any] | None],
               overwrite: bool = False, source: str = "other contents") -> tuple[Path, bool]:
    """Build ``target_dir`` with ``write`` unless it already holds ``record`` (module docstring).

    Args:
        target_dir: the folder to build (created; its parent too).
        record: what determines the folder's contents; a finished folder whose marker holds
            every entry of it is kept.
        write: writes the files into the folder it is given (the staging folder) and returns
            extra entries for the marker (e.g. a measured self-check gap), or ``None``.
        overwrite: replace an existing folder outside the cache, finished or not.
        source: names what another generated folder was made from, for the error.

    Returns:
        ``(folder, built)``: the resolved ``target_dir`` and whether this call built it.

    Raises:
        FileExistsError: ``target_dir`` is outside ripieno's cache, holds something else and
            ``overwrite`` is false (nothing was written).
    """
    from filelock import FileLock

    target = Path(target_dir).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.with_name(f".{target.name}.lock"))):
        _remove_leftovers(target)
        if target.exists() and holds(target, record) and not overwrite:
            return target, False
        if target.exists() and not (overwrite or in_cache(target) or _empty_folder(target)):
            what = f"a generated folder of {source}" if finished_record(target) is not None else (
                "files ripieno did not generate")
            raise FileExistsError(f"{target} exists and holds {what}; pass overwrite=True to replace it"
                                  " or choose another target_dir.")
        staging = target.with_name(f".{target.name}{_STAGING}{uuid.uuid4().hex[:8]}")
        old = target.with_name(f".{target.name}{_OLD}{uuid.uuid4().hex[:8]}")
        staging.mkdir()
        try:
            extra = write(staging)
            marker = {**record, **(extra or {})}
            text = json.dumps(marker, indent=2, sort_keys=True, default=str) + "\n"
            (staging / MARKER).write_text(text, encoding="utf-8")  # last: it marks a finished folder
            if target.exists():
                target.rename(old)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        _remove(old)
    return target, True


def publish_once(target_dir: str | Path, record: dict[str, Any],
                 write: Callable[[Path], dict[str, Any] | None], overwrite: bool = False,
                 source: str = "other contents") -> Path:
    """``build_once``'s folder alone (what the converters return).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> folder = Path(tempfile.mkdtemp()) / "converted"
        >>> publish_once(folder, {"weights": "abc"}, lambda staging: None) == folder.resolve()
        True
    """
    return build_once(target_dir, record, write, overwrite, source)[0]


def _empty_folder(path: Path) -> bool:
    return path.is_dir() and not any(path.iterdir())


def _remove_leftovers(target: Path) -> None:
    """Remove staging and replaced folders of earlier builds (a killed build leaves them; lock held)."""
    for pattern in (f".{target.name}{_STAGING}*", f".{target.name}{_OLD}*"):
        for leftover in target.parent.glob(pattern):
            _remove(leftover)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink(missing_ok=True)
