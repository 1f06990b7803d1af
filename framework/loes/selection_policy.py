"""The conditions every LOES selector runs under: autocast off, and optionally fewer CPU threads.

Selection is float64 linear algebra (ridge solves, spectra): ``without_autocast`` keeps an enclosing
``torch.autocast`` from lowering it. ``SELECTION_THREADS`` is opt-in (below); ``on_selection_threads``
applies it around a selector and restores torch's setting after.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

import numpy as np
import torch
from torch import Tensor

_P = ParamSpec("_P")
_R = TypeVar("_R")


def without_autocast(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` with autocast off, so ridge solves and spectra stay in the selection dtype."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            return fn(*args, **kwargs)

    return wrapper


#: CPU threads LOES selection runs on, or ``None`` (the default): leave torch's setting alone, as a
#: library must. Opt in (``selection.SELECTION_THREADS = 1``, or here) on a machine whose cores other work
#: shares: a selection whose largest layer Gram costs at most ``SELECTION_THREADS_MAX_WORK``
#: multiply-adds (``N * D^2``) is a chain of small dense operations where MKL's threaded ``eigh`` and
#: OpenMP's fork/join cost more than a second thread saves when the cores are busy, while on idle
#: cores one thread is slower (``bench/loes_selection.py --selection-threads`` compares). Larger
#: selections keep torch's threads. The previous setting is restored when the selection returns.
SELECTION_THREADS: int | None = None
SELECTION_THREADS_MAX_WORK = 2**31


def _layer_work(layers: Any) -> int:
    """``N * max D^2`` of the layers as given (list of ``(N, D)`` arrays or one ``(N, L, D)`` array)."""
    try:
        if isinstance(layers, Tensor | np.ndarray):
            return int(layers.shape[0]) * int(layers.shape[-1]) ** 2
        return max(int(layer.shape[0]) * int(layer.shape[-1]) ** 2 for layer in layers)
    except (AttributeError, IndexError, TypeError, ValueError):
        return 0  # invalid input: prepare_layers says why


@contextlib.contextmanager
def _selection_threads(layers: Any = None) -> Iterator[None]:
    """Run the enclosed CPU work on ``SELECTION_THREADS`` threads, restoring torch's setting after."""
    previous = torch.get_num_threads()
    if (SELECTION_THREADS is None or SELECTION_THREADS == previous
            or _layer_work(layers) > SELECTION_THREADS_MAX_WORK):
        yield
        return
    torch.set_num_threads(SELECTION_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def on_selection_threads(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` (whose first argument is the layers) inside ``_selection_threads``."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _selection_threads(args[0] if args else kwargs.get("layers")):
            return fn(*args, **kwargs)

    return wrapper
