"""Products with one thin operand, in the orientation the host's BLAS runs fast.

``a @ b`` with a thin ``b`` (a few columns: ridge targets, a rank-r factor) can also be
computed as ``(b^T a^T)^T``, the thin operand as the GEMM's rows. The two do the same
multiply-adds, yet MKL runs one of them 2-6x slower than the other, and which one depends on
the CPU and on the big operand's layout (measured, 32 members of ``(512, 512) @ (512, 4)``:
on an AVX-512 Xeon the plain product 6 ms against 30 ms; on a 2-core AMD EPYC with AVX-512,
MKL 2024.2, 9.5 ms against 1.7 ms; ``(2000, 384)^T @ (2000, 2)`` in float64 on that EPYC
1.17 ms against 0.23 ms). So ``thin_matmul`` times both once per shape, layout and dtype on
CPU and keeps the faster, the way cuDNN's benchmark mode picks a convolution algorithm.
The transposed form copies ``b^T`` into rows first (a few columns, cheap): MKL's sgemm reads a
transposed view of it 2.5x slower (``(2000, 384) @ (384, 2)`` in float32 on the EPYC: 0.37 ms
from the view, 0.15 ms from the copy, 0.48 ms as written).
Hand-written because no library chooses between the orientations of a GEMM.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import torch
from torch import Tensor

#: ``b`` with at least this many columns is not thin: ``a @ b`` as written (the two orientations
#: were on par from about 100 columns on, in both measurements above).
THIN_COLUMNS = 128
#: How much faster the plain ``a @ b`` must be to be kept over the transposed form, a gap that
#: timing noise does not flip, so a program's arithmetic does not change between runs on one host.
PLAIN_MARGIN = 1.5
#: ``(shape of a, a is a transposed view, columns of b, dtype)`` -> whether ``a @ b`` was faster.
_PLAIN_FASTER: dict[tuple[tuple[int, ...], bool, int, torch.dtype], bool] = {}


def _best_seconds(fn: Callable[[], object], repeats: int = 2) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up call."""
    fn()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def plain_is_faster(a: Tensor, columns: int) -> bool:
    """Whether ``a @ b`` beats ``(b^T a^T)^T`` for ``a`` of this shape and layout and a ``b`` of ``columns``.

    Timed on constant tensors (no random numbers drawn) the first time a key is seen on CPU,
    a few milliseconds once per process. Off CPU, and while ``torch.compile`` traces, the
    transposed form is used without timing.

    Args:
        a: The big operand, 2-D or batched 3-D; only its shape, layout, dtype and device count.
        columns: Columns of the thin operand.

    Returns:
        ``True`` if the plain product was ``PLAIN_MARGIN`` times faster.
    """
    if a.device.type != "cpu" or torch.compiler.is_compiling():
        return False
    transposed = a.stride(-1) != 1
    key = (tuple(a.shape), transposed, columns, a.dtype)
    if key not in _PLAIN_FASTER:
        with torch.no_grad():
            if transposed:  # the same layout: a transposed view of a contiguous tensor
                big = torch.full((*a.shape[:-2], a.shape[-1], a.shape[-2]), 0.5, dtype=a.dtype).mT
            else:
                big = torch.full(tuple(a.shape), 0.5, dtype=a.dtype)
            thin = torch.full((*a.shape[:-2], a.shape[-1], columns), 0.25, dtype=a.dtype)
            plain = _best_seconds(lambda: torch.matmul(big, thin))
            swapped = _best_seconds(lambda: _swapped(big, thin))
        _PLAIN_FASTER[key] = plain * PLAIN_MARGIN < swapped
    return _PLAIN_FASTER[key]


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
