"""Silence Lightning's per-run messages for one block of code, restoring everything after."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning")


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
