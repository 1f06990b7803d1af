"""Products with one thin operand, in the orientation the host's BLAS runs fast.

``a @ b`` with a thin ``b`` (a few columns: ridge targets, a rank-r factor) can also be
computed as ``(b^T a^T)^T``, the thin operand as the GEMM's rows. The two do the same
multiply-adds, yet MKL runs one of them 2-6x slower than the other, and which one depends on
the CPU and on the big operand's layout (measured, 32 members of ``(512, 512) @ (512, 4)``:
on an AVX-512 Xeon the plain product 6 ms against 30 ms; on a 2-core AMD EPYC with AVX-512,
MKL 2024.2, 9.5 ms against 1.7 ms; ``(2000, 384)^T @ (2000, 2)`` in float64 on that EPYC
1.17 ms against 0.23 ms). So ``thin_matmul`` times both on CPU per shape, layout and dtype and
keeps the faster, the way cuDNN's benchmark mode picks a convolution algorithm, with two guards
against a timing taken in a noisy second deciding for the whole process (a machine shared with
other work, several workers of one benchmark): each timing is ``ROUNDS`` paired rounds, both
orientations back to back in alternating order, and the decision is the median of the rounds'
ratios, so a slow spell slows both sides of a ratio alike; and a key is timed again after
``RETIME_AT`` uses, switching only when the other orientation wins by ``PLAIN_MARGIN`` (hysteresis:
ratios between ``1 / PLAIN_MARGIN`` and ``PLAIN_MARGIN`` keep the current choice).
The transposed form copies ``b^T`` into rows first (a few columns, cheap): MKL's sgemm reads a
transposed view of it 2.5x slower (``(2000, 384) @ (384, 2)`` in float32 on the EPYC: 0.37 ms
from the view, 0.15 ms from the copy, 0.48 ms as written).
Hand-written because no library chooses between the orientations of a GEMM.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

#: ``b`` with at least this many columns is not thin: ``a @ b`` as written (the two orientations
#: were on par from about 100 columns on, in both measurements above).
THIN_COLUMNS = 128
#: How much faster one orientation must be to replace the other: the plain ``a @ b`` is chosen
#: over the transposed form (the first choice) only if it is this much faster, and a key switches
#: back only if the transposed form is this much faster again; a gap that noise does not flip.
PLAIN_MARGIN = 1.5
#: Paired timing rounds per timing (each times both orientations, in alternating order).
ROUNDS = 5
#: A key's uses after which it is timed again (geometric: the timings' cost fades with the run).
RETIME_AT = frozenset({16, 256, 4096})


@dataclass
class _Choice:
    """The orientation chosen for one key, its uses so far and the ratios that chose it."""

    plain: bool
    uses: int = 0
    ratios: tuple[float, ...] = ()


#: ``(shape of a, a is a transposed view, columns of b, dtype)`` -> the current choice.
_CHOICES: dict[tuple[tuple[int, ...], bool, int, torch.dtype], _Choice] = {}


def _seconds(fn: Callable[[], object]) -> float:
    """One timed call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def paired_ratio(plain: Callable[[], object], swapped: Callable[[], object], rounds: int = ROUNDS) -> float:
    """Median over ``rounds`` of ``time(plain) / time(swapped)``, each round timing both back to back.

    The order alternates between rounds, and each side is called once first (warm-up), so a
    slow spell of the machine lands on both sides of a round's ratio, and the median drops the
    rounds that one preemption hit.
    """
    plain()
    swapped()
    ratios = []
    for index in range(rounds):
        if index % 2:
            second = _seconds(swapped)
            first = _seconds(plain)
        else:
            first = _seconds(plain)
            second = _seconds(swapped)
        ratios.append(first / max(second, 1e-9))
    return statistics.median(ratios)


def _time_key(a: Tensor, columns: int) -> float:
    """``time(a @ b) / time((b^T a^T)^T)`` on constant tensors of ``a``'s shape, layout and dtype."""
    with torch.no_grad():
        if a.stride(-1) != 1:  # the same layout: a transposed view of a contiguous tensor
            big = torch.full((*a.shape[:-2], a.shape[-1], a.shape[-2]), 0.5, dtype=a.dtype).mT
        else:
            big = torch.full(tuple(a.shape), 0.5, dtype=a.dtype)
        thin = torch.full((*a.shape[:-2], a.shape[-1], columns), 0.25, dtype=a.dtype)
        return paired_ratio(lambda: torch.matmul(big, thin), lambda: _swapped(big, thin))


def plain_is_faster(a: Tensor, columns: int) -> bool:
    """Whether to run ``a @ b`` as written for ``a`` of this shape and layout and a ``b`` of ``columns``.

    Timed on constant tensors (no random numbers drawn) the first time a key is seen on CPU and
    again after ``RETIME_AT`` uses, a few milliseconds each (module docstring). Off CPU, and while
    ``torch.compile`` traces, the transposed form is used without timing.

    Args:
        a: The big operand, 2-D or batched 3-D; only its shape, layout, dtype and device count.
        columns: Columns of the thin operand.

    Returns:
        ``True`` if the plain product is the current choice.
    """
    if a.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    key = (tuple(a.shape), a.stride(-1) != 1, columns, a.dtype)
    choice = _CHOICES.get(key)
    if choice is None:
        ratio = _time_key(a, columns)
        choice = _CHOICES[key] = _Choice(plain=ratio * PLAIN_MARGIN < 1, ratios=(ratio,))
        return choice.plain
    choice.uses += 1
    if choice.uses in RETIME_AT:
        ratio = _time_key(a, columns)
        choice.ratios += (ratio,)
        if choice.plain and ratio > PLAIN_MARGIN:
            choice.plain = False
        elif not choice.plain and ratio * PLAIN_MARGIN < 1:
            choice.plain = True
    return choice.plain


def thin_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` for a 2-D (or batched 3-D) ``a`` and a thin ``b``, in the host's fast orientation.

    Example:
        >>> a, b = torch.randn(50, 8), torch.randn(8, 2)
        >>> torch.allclose(thin_matmul(a, b), a @ b, atol=1e-6)
        True
        >>> g, factor = torch.randn(3, 16, 16), torch.randn(3, 16, 4)  # batched, as a bmm
        >>> torch.allclose(thin_matmul(g, factor), torch.bmm(g, factor), atol=1e-5)
        True
    """
    if b.shape[-1] >= THIN_COLUMNS or plain_is_faster(a, b.shape[-1]):
        return torch.matmul(a, b)
    return _swapped(a, b)


def _swapped(a: Tensor, b: Tensor) -> Tensor:
    """``(b^T a^T)^T``, with ``b^T`` copied into rows (the layout the BLAS reads fastest)."""
    return torch.matmul(b.mT.contiguous(), a.mT).mT
