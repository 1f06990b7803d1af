"""Writing outputs without losing anything: atomically, never over another file, errors in one line.

Every file ripieno writes goes through here (checkpoints through ``AtomicCheckpointIO``):

* ``atomic_output(path)`` writes into a temporary file in the *same folder*, flushes it to
  disk and renames it into place, so a kill or a full disk at any moment leaves either the
  old file or the new one under ``path``, never a part of one. (Lightning writes to
  ``$TMPDIR`` and copies, which is not atomic when the run folder is on another filesystem.)
  With ``replace=False`` it never replaces an existing file: the file is published with
  ``link(2)``, which fails if the name is taken, even when two processes race.
* ``write_new_file(path, data)`` writes to ``path`` or, when that exists, to the first free
  ``stem_1.suffix``, ``stem_2.suffix``, ... (a second ``predict`` keeps the first one's table).
* an ``OSError`` while writing (disk full, read-only folder, a name too long, a file where a
  folder belongs) becomes an ``OutputWriteError``: one line that names the file, the problem
  and the fix.
* ``cache_root()`` is ripieno's cache folder (``RIPIENO_CACHE``, default
  ``$XDG_CACHE_HOME/ripieno`` or ``~/.cache/ripieno``): where generated tokenizers, random or
  converted backbones and feature caches go, never into a folder the user named as input.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp())
    >>> with atomic_output(folder / "a.txt", "w") as file:
    ...     _ = file.write("first")
    >>> [write_new_file(folder / "a.txt", "second").name, (folder / "a.txt").read_text()]
    ['a_1.txt', 'first']
    >>> sorted(p.name for p in folder.iterdir())
    ['a.txt', 'a_1.txt']
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ripieno.framework.errors import RipienoInputError, exception_chain, file_problem

CACHE_VARIABLE = "RIPIENO_CACHE"
MAX_NUMBERED = 100_000
"""How many numbered names (``stem_N.suffix``) a new output tries before giving up."""
PARTIAL_SUFFIX = ".partial"
"""Suffix of a file being written (``.<name>.<random>.partial``: hidden, never a checkpoint name)."""

_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)
_NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS)


class OutputWriteError(RipienoInputError):
    """An output could not be written (disk full, no permission, bad name); nothing was half-written."""


def cache_root() -> Path:
    """The cache folder: ``$RIPIENO_CACHE``, else ``$XDG_CACHE_HOME/ripieno``, else ``~/.cache/ripieno``.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> with mock.patch.dict("os.environ", {"RIPIENO_CACHE": "/tmp/ripieno-cache-example"}):
        ...     str(cache_root())
        '/tmp/ripieno-cache-example'
    """
    configured = os.environ.get(CACHE_VARIABLE)
    if configured:
        return Path(configured).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "ripieno"


def cache_dir(*parts: str) -> Path:
    """A folder inside ``cache_root()`` (not created)."""
    return cache_root().joinpath(*parts)


def os_error_message(error: OSError, path: str | os.PathLike[str] | None = None,
                     what: str = "the output", verb: str = "write") -> str:
    """One line naming the file, what the operating system refused and the fix.

    Args:
        error: The ``OSError`` raised while writing.
        path: The file being written (default: the error's own ``filename``).
        what: What was being written, e.g. ``"the checkpoint"``.
        verb: What was being done to it (``write``; ``use`` when it may have been a read).

    Example:
        >>> import errno
        >>> os_error_message(OSError(errno.ENOSPC, "No space left on device"), "runs/last.ckpt",
        ...                  "the checkpoint")  # doctest: +ELLIPSIS
        'runs/last.ckpt: cannot write the checkpoint: no space left on the device...'
    """
    where = path if path is not None else error.filename
    code = error.errno
    if code in _NO_SPACE:
        problem = "no space left on the device (disk full or quota reached)"
        fix = ("free space there or choose another folder (--trainer.default_root_dir); the previous file,"
               " if any, is intact")
    elif code in _NOT_WRITABLE:
        problem = "the folder is not writable (permission denied or a read-only file system)"
        fix = "choose a folder you can write to (--trainer.default_root_dir) or fix its permissions"
    elif code == errno.ENAMETOOLONG:
        problem = "a file or folder name is longer than the file system allows (usually 255 bytes)"
        fix = "use a shorter folder name (--trainer.default_root_dir, logger name, checkpoint filename)"
    elif code in (errno.ENOTDIR, errno.EEXIST) and not str(where).endswith(PARTIAL_SUFFIX):
        problem = "a part of the path is a file, not a folder"
        fix = "choose a folder path (--trainer.default_root_dir names a folder, not a file)"
    else:
        problem = (error.strerror or type(error).__name__).rstrip(".").lower()
        fix = "check the folder and the disk, or choose another folder (--trainer.default_root_dir)"
    if where is None:  # e.g. a write to an open file: the OS names no file
        return f"a file could not be written: {problem}; {fix.rstrip('.')}."
    return file_problem(where, f"cannot {verb} {what}: {problem}", fix)


def check_writable(folder: str | os.PathLike[str], what: str = "the outputs") -> Path:
    """Create ``folder`` if needed and check that a file can be created in it.

    Raises:
        OutputWriteError: One line naming the folder, the problem and the fix.
    """
    target = Path(folder)
    try:
        target.mkdir(parents=True, exist_ok=True)
        probe = target / f".ripieno-write-check-{uuid.uuid4().hex[:8]}{PARTIAL_SUFFIX}"
        probe.touch(exist_ok=False)
        probe.unlink()
    except OSError as error:
        raise OutputWriteError(os_error_message(error, target, what)) from None
    return target


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike[str], mode: str = "wb", *, replace: bool = True,
                  what: str = "the output", encoding: str | None = None) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; on success flush, sync and rename it to ``path``.

    Args:
        path: The file to write (its folder is created).
        mode: ``"wb"`` or ``"w"``.
        replace: Whether an existing ``path`` is replaced (atomically). ``False``: raise
            ``FileExistsError`` and leave the existing file alone.
        what: What is written, for the error message.
        encoding: Text encoding (``mode="w"``; default UTF-8).

    Raises:
        FileExistsError: ``replace`` is false and ``path`` exists (nothing was written there).
        OutputWriteError: The operating system refused a write (disk full, permissions, a
            name too long); the temporary file is removed and ``path`` is as it was.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_output writes new files: mode 'wb' or 'w', got {mode!r}.")
    target = Path(path)
    temp = target.parent / f".{target.name}.{uuid.uuid4().hex[:8]}{PARTIAL_SUFFIX}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not replace and target.exists():
            raise FileExistsError(errno.EEXIST, "File exists", str(target))
        text = {"encoding": encoding or "utf-8", "newline": ""} if mode == "w" else {}
        with open(temp, mode.replace("w", "x"), **text) as file:  # noqa: PTH123 - mode is chosen above
            yield file
            file.flush()
            os.fsync(file.fileno())
        _publish(temp, target, replace)
        _sync_folder(target.parent)
    except FileExistsError:
        _remove(temp)
        raise
    except BaseException as error:
        _remove(temp)
        # torch.save reports a full disk as a RuntimeError of its zip writer, caused by the OSError
        refused = next((e for e in exception_chain(error) if isinstance(e, OSError)), None)
        if refused is None:
            raise
        raise OutputWriteError(os_error_message(refused, target, what)) from error


def numbered_names(path: str | os.PathLike[str]) -> Iterator[Path]:
    """``path``, then ``stem_1.suffix``, ``stem_2.suffix``, ...: the names a new output may take.

    Example:
        >>> [p.name for p, _ in zip(numbered_names("out/predictions.csv"), range(3))]
        ['predictions.csv', 'predictions_1.csv', 'predictions_2.csv']
    """
    target = Path(path)
    yield target
    for n in range(1, MAX_NUMBERED):
        yield target.with_name(f"{target.stem}_{n}{target.suffix}")


def write_new_file(path: str | os.PathLike[str], data: bytes | str, *, what: str = "the output") -> Path:
    """Write ``data`` to ``path``, or to its first free sibling ``stem_N.suffix`` if ``path`` exists.

    Returns:
        The file written.
    """
    target = Path(path)
    mode = "w" if isinstance(data, str) else "wb"
    for candidate in numbered_names(target):
        try:
            with atomic_output(candidate, mode, replace=False, what=what) as file:
                file.write(data)
            return candidate
        except FileExistsError:
            continue
    raise OutputWriteError(file_problem(target, f"has {MAX_NUMBERED} numbered siblings already",
                                        "choose another output folder"))


def _publish(temp: Path, target: Path, replace: bool) -> None:
    """Rename ``temp`` to ``target``; without ``replace`` only if ``target`` does not exist (atomically)."""
    if replace:
        os.replace(temp, target)
        return
    try:
        os.link(temp, target)  # fails with EEXIST if the name is taken, even under a race
    except OSError as error:
        if error.errno not in _NO_HARD_LINKS:
            raise
        if target.exists():  # a file system without hard links: check, then rename
            raise FileExistsError(errno.EEXIST, "File exists", str(target)) from None
        os.replace(temp, target)
        return
    _remove(temp)


def _sync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (best effort: not every system can open a folder)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
