"""The one line the ``ripieno`` command prints for an error the user can act on.

Three kinds of error end a command with one line and no traceback:

* a ``RipienoInputError`` (bad config, data, model folder or checkpoint) or a
  ``NonFiniteTrainingError``: its own message;
* the environment refusing a file (disk full, quota, read-only or permission denied, a name
  too long, a file where a folder belongs): the file, the problem and the fix;
* running out of memory (host or accelerator): what was being built, how much was asked
  for and what to make smaller.

Anything else is a bug and keeps its traceback. Errors are found anywhere in the exception
chain: jsonargparse wraps an error raised while instantiating a class from the config in its
own ``ValueError``, Lightning re-raises after its own clean-up.

Example:
    >>> import errno
    >>> one_line_error(RuntimeError("wrapped")) is None
    True
    >>> try:
    ...     raise OSError(errno.EROFS, "Read-only file system", "runs/x/metrics.csv")
    ... except OSError as error:
    ...     print(one_line_error(error).split(":")[1])
     cannot write it
"""

from __future__ import annotations

import errno
import re

import torch

from ripieno.framework.errors import NonFiniteTrainingError, RipienoInputError, exception_chain, first_line
from ripieno.framework.outputs.output_files import os_error_message

ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM,
                                errno.ENAMETOOLONG, errno.ENOTDIR})
"""``OSError`` codes that mean the machine refused a file, not that ripieno has a bug."""
_CLASS_PATH = re.compile(r"class_path='([\w.]+)'")
_ALLOCATION = re.compile(r"tried to allocate (\d+) bytes|Tried to allocate ([\d.]+ [KMGT]?i?B)")


def one_line_error(error: BaseException) -> str | None:
    """The message to print for ``error`` without a traceback, or ``None`` (a bug: keep the traceback)."""
    chain = list(exception_chain(error))
    for cause in chain:
        if isinstance(cause, RipienoInputError | NonFiniteTrainingError):
            return str(cause)
    for cause in chain:
        if isinstance(cause, OSError) and cause.errno in ENVIRONMENT_ERRNOS:
            verb = "write" if cause.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) else "use"
            return os_error_message(cause, cause.filename, "it", verb)
    for cause in chain:
        if is_out_of_memory(cause):
            return _out_of_memory(cause, chain)
    return None


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a failed allocation (host ``MemoryError``, torch's CPU or device allocator)."""
    if isinstance(error, MemoryError | torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def _out_of_memory(error: BaseException, chain: list[BaseException]) -> str:
    built = next((m.group(1) for c in chain if (m := _CLASS_PATH.search(str(c)))), None)
    where = f" while building {built}" if built else ""
    asked = _ALLOCATION.search(str(error))
    size = ""
    if asked is not None:
        size = (f" ({int(asked.group(1)) / 2**30:.1f} GiB asked for at once)" if asked.group(1)
                else f" ({asked.group(2)} asked for at once)")
    return (f"out of memory{where}{size}: {first_line(error)[:160]}; make the model or the batches smaller"
            " (e.g. --model.init_args.d_block, n_blocks or k, --data.init_args.loader.batch_size) or run on a"
            " machine with more memory.")

