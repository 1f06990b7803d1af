"""What every converter of shipped weights shares: convert once, atomically, under a lock.

A converter (``convert_efficientnet``, ``convert_whisper``, ``convert_dinov2``) describes its
source in a ``conversion_record()`` (packages, versions, the weights' SHA-256, the output
format) and writes the converted folder with a ``write(folder)`` function;
``publish_once`` (``ripieno.framework.outputs.generated_folders``, shared with every folder ripieno
generates) does the rest: a finished folder whose marker (``ripieno_generated.json``,
written last) holds the same record is kept as it is; otherwise the folder is built under a
temporary name beside the target and renamed into place, and a file lock beside it makes
concurrent callers (DDP ranks, parallel jobs) convert once. ``LayerEmbeddingDataModule``
converts into ripieno's cache folder, in a folder named after the record.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from ripieno.framework.outputs.generated_folders import MARKER as MARKER  # re-exported: the marker file name
from ripieno.framework.outputs.generated_folders import finished_record as finished_record
from ripieno.framework.outputs.generated_folders import publish_once as publish_once


def sha256_file(path: str | Path) -> str:
    """SHA-256 of a file, read in 1 MiB blocks (remembered per file size and modification time).

    Example:
        >>> import tempfile, os
        >>> with tempfile.NamedTemporaryFile(delete=False) as f:
        ...     _ = f.write(b"abc")
        >>> sha256_file(f.name)[:12]
        'ba7816bf8f01'
        >>> os.unlink(f.name)
    """
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return _sha256_stamped(str(resolved), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _sha256_stamped(path: str, size: int, mtime_ns: int) -> str:  # noqa: ARG001 - size and mtime key the cache
    digest = hashlib.sha256()
    with open(path, "rb") as file:  # noqa: PTH123
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

