"""What every converter of shipped weights shares: convert once, atomically, under a lock.

A converter (``convert_efficientnet``, ``convert_whisper``, ``convert_dinov2``) describes its
source in a ``record`` (packages, versions, the weights' SHA-256, the output format) and
writes the converted folder with a ``write(folder)`` function; ``publish_once`` does the
rest: a finished folder whose marker (``ripieno_conversion.json``, written last) holds the
same record is kept as it is; otherwise the folder is built under a temporary name beside
the target and renamed into place, and a file lock beside it makes concurrent callers (DDP
ranks, parallel jobs) convert once.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: The file whose presence (written last) marks a finished conversion, and what it converted.
MARKER = "ripieno_conversion.json"


def sha256_file(path: str | Path) -> str:
    """SHA-256 of a file, read in 1 MiB blocks.

    Example:
        >>> import tempfile, os
        >>> with tempfile.NamedTemporaryFile(delete=False) as f:
        ...     _ = f.write(b"abc")
        >>> sha256_file(f.name)[:12]
        'ba7816bf8f01'
        >>> os.unlink(f.name)
    """
    digest = hashlib.sha256()
    with Path(path).open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def finished_record(folder: Path) -> dict[str, Any] | None:
    """The marker of a finished conversion in ``folder``, or ``None`` (none, or unreadable)."""
    try:
        return json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def publish_once(target_dir: str | Path, record: dict[str, Any], write: Callable[[Path], dict[str, Any]],
                 overwrite: bool = False, source: str = "other weights") -> Path:
    """Convert into ``target_dir`` unless it already holds this conversion.

    Args:
        target_dir: the folder to write (created; its parent too).
        record: what identifies this conversion; a finished folder whose marker holds every
            entry of it is kept.
        write: writes the converted files into the folder it is given (the staging folder)
            and returns extra entries for the marker (e.g. a measured self-check gap).
        overwrite: replace an existing folder, finished or not.
        source: names what another conversion converted, for the error.

    Returns:
        The resolved ``target_dir``.

    Raises:
        FileExistsError: ``target_dir`` holds something else and ``overwrite`` is false.
    """
    from filelock import FileLock

    target = Path(target_dir).expanduser().resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.with_name(f".{target.name}.lock"))):
        if target.exists() and not overwrite:
            written = finished_record(target) if target.is_dir() else None
            if written is not None and all(written.get(k) == v for k, v in record.items()):
                return target
            if not target.is_dir() or any(target.iterdir()):
                what = f"a conversion of {source}" if written is not None else "no finished conversion"
                raise FileExistsError(f"{target} exists and holds {what}; pass overwrite=True to replace it"
                                      " or choose another target_dir.")
        staging = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        staging.mkdir()
        try:
            extra = write(staging)
            marker = {**record, **(extra or {})}
            text = json.dumps(marker, indent=2, sort_keys=True) + "\n"
            (staging / MARKER).write_text(text, encoding="utf-8")  # last: it marks a finished folder
            if target.exists():
                target.rename(old)
            staging.rename(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        elif old.exists():
            old.unlink()
    return target
