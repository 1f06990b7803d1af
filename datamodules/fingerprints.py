"""Cheap fingerprints of a datamodule's raw inputs and preprocessing (embedding cache keys).

A split's fingerprint names what its batches are made of without making them: raw texts,
file paths with their size and modification time, or the raw array rows, plus the
processor's configuration. ``LayerEmbeddingDataModule`` keys its cache on it, so a cache
hit never runs the tokenizer, feature extractor or image processor.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np


class Fingerprint:
    """An incremental SHA-256 over typed parts (each part is tagged, so boundaries are kept).

    Example:
        >>> a = Fingerprint("text").add(["a b", "c"]).hexdigest()
        >>> b = Fingerprint("text").add(["a", "b c"]).hexdigest()
        >>> a != b
        True
    """

    def __init__(self, kind: str) -> None:
        self._digest = hashlib.sha256(kind.encode())

    def add(self, value: Any) -> Fingerprint:  # noqa: ANN401
        """Mix in strings, lists of strings, numbers, dicts (as JSON) or numpy arrays."""
        if isinstance(value, np.ndarray):
            array = np.ascontiguousarray(value)
            self._digest.update(f"array{array.dtype}{array.shape}".encode())
            self._digest.update(array.view(np.uint8).tobytes())
        elif isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            self._digest.update(f"strings{len(value)}".encode())
            for item in value:
                encoded = item.encode("utf-8", errors="surrogatepass")
                self._digest.update(len(encoded).to_bytes(8, "little") + encoded)
        else:
            self._digest.update(json.dumps(value, sort_keys=True, default=str).encode())
        return self

    def hexdigest(self) -> str:
        """The fingerprint."""
        return self._digest.hexdigest()


def file_stamps(paths: Iterable[str | Path]) -> list[str]:
    """``path, size, mtime_ns`` of each file, in order (no file is read)."""
    stamps = []
    for path in paths:
        resolved = Path(path).expanduser().resolve()
        stat = resolved.stat()
        stamps.append(f"{resolved}\0{stat.st_size}\0{stat.st_mtime_ns}")
    return stamps


def folder_files_digest(folder: str | Path, names: Iterable[str] | None = None) -> str:
    """SHA-256 of the bytes of a (small) processor folder's files, e.g. tokenizer files."""
    root = Path(folder).expanduser()
    wanted = set(names) if names is not None else None
    digest = hashlib.sha256(b"folder-files")
    for path in sorted(p for p in root.iterdir() if p.is_file()):
        if wanted is not None and path.name not in wanted:
            continue
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()
