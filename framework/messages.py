r"""ripieno's messages: the ``ripieno`` logger, the command's terminal output, quiet Lightning.

Every library message goes through a logger under ``ripieno`` (``get_logger(__name__)`` in each
module: ``ripieno.datamodules.text``, ``ripieno.callbacks.glm_sampler``, ...), filtered to rank
zero as Lightning's ``rank_zero_info`` is, so a user silences or redirects ripieno with the
standard library alone (``logging.getLogger("ripieno").setLevel(logging.WARNING)``). As a
library ripieno adds no handler and changes no level: the host program decides where INFO
goes. The ``ripieno`` command (an application) shows INFO lines on stdout for the duration of
one call (``command_output``) unless the user configured the ``ripieno`` logger already.

Example:
    >>> import io, logging
    >>> stream = io.StringIO()
    >>> with command_output(stream):
    ...     get_logger("ripieno.example").info("ripieno: hello")
    >>> stream.getvalue()
    'ripieno: hello\n'
    >>> logging.getLogger("ripieno").handlers
    []
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TextIO

LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning")
LOGGER_NAME = "ripieno"


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK")
"""Where launchers put a process's global rank (Lightning's ``_get_rank`` reads the same)."""


class RankZeroFilter(logging.Filter):
    """Pass records only on global rank zero (``rank_zero_only.rank``, which Lightning sets).

    Before Lightning is imported (``ripieno --help`` imports no Lightning), the rank is read from
    the launcher's environment variables, as Lightning reads it.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether this process is rank zero."""
        rank_zero = sys.modules.get("lightning.fabric.utilities.rank_zero")
        rank = getattr(getattr(rank_zero, "rank_zero_only", None), "rank", None)
        if rank is None:
            rank = next((int(os.environ[v]) for v in RANK_VARIABLES if os.environ.get(v, "").isdigit()), 0)
        return rank == 0


def get_logger(name: str) -> logging.Logger:
    """The logger ``name`` (a module's ``__name__``, under ``ripieno``), filtered to rank zero.

    Args:
        name: a dotted name under ``ripieno``.

    Raises:
        ValueError: for a name outside the ``ripieno`` hierarchy.
    """
    if name != LOGGER_NAME and not name.startswith(LOGGER_NAME + "."):
        raise ValueError(f"ripieno's loggers live under {LOGGER_NAME!r}, got {name!r}.")
    logger = logging.getLogger(name)
    if not any(isinstance(f, RankZeroFilter) for f in logger.filters):
        logger.addFilter(RankZeroFilter())
    return logger


@contextmanager
def command_output(stream: TextIO | None = None) -> Iterator[None]:
    """Show ripieno's INFO messages on ``stream`` (default stdout) inside the block, as a command does.

    Nothing changes when the ``ripieno`` logger already has a handler or a level (the user
    configured it); otherwise one handler is added and the level set to INFO, and both are
    removed on exit.
    """
    logger = logging.getLogger(LOGGER_NAME)
    if logger.handlers or logger.level != logging.NOTSET:
        yield
        return
    handler = logging.StreamHandler(stream if stream is not None else sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        handler.flush()
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


@contextmanager
def quiet_lightning(level: int = logging.WARNING, messages: Sequence[str] = (),
                    modules: str | None = None) -> Iterator[None]:
    """Raise Lightning's loggers to ``level`` and ignore some warnings inside the block.

    Args:
        level: the lowest level Lightning's loggers print inside the block.
        messages: regexes of warning messages to ignore.
        modules: regex of modules whose warnings are all ignored (``None``: none).

    Example:
        >>> with quiet_lightning(logging.ERROR):
        ...     logging.getLogger("lightning.pytorch").getEffectiveLevel() == logging.ERROR
        True
    """
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        for pattern in messages:
            warnings.filterwarnings("ignore", message=pattern)
        if modules is not None:
            warnings.filterwarnings("ignore", module=modules)
        for lg in loggers:
            lg.setLevel(level)
        try:
            yield
        finally:
            for lg, lvl in zip(loggers, levels, strict=True):
                lg.setLevel(lvl)
