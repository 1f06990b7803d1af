"""``A^-1 b`` from the lower Cholesky factor of ``A`` by two triangular solves, without copying the factor.

``torch.cholesky_solve`` copies its factor into a fresh column-major matrix on every call (its CPU
helper clones both operands), which costs more than the solve itself for a thin ``b``:
``D = 384``, ``b`` ``(384, 2)``, float64 on a 2-core AMD EPYC: 0.116 ms against 0.058 ms for the two
``torch.linalg.solve_triangular`` calls here, which read the factor (or its transpose) in place and
run the same two triangular solves as LAPACK's ``potrs`` (bitwise the same result there).
"""

from __future__ import annotations

import torch
from torch import Tensor


def cholesky_solve(rhs: Tensor, factor: Tensor) -> Tensor:
    """``(L L^T)^-1 rhs`` for a lower-triangular ``factor`` ``L`` ``(D, D)`` and ``rhs`` ``(D, T)``.

    The argument order follows ``torch.cholesky_solve`` (lower factor only).

    Example:
        >>> x = torch.randn(50, 4, dtype=torch.float64)
        >>> a = x.T @ x
        >>> b = torch.randn(4, 2, dtype=torch.float64)
        >>> w = cholesky_solve(b, torch.linalg.cholesky(a))
        >>> torch.allclose(a @ w, b)
        True
    """
    half = torch.linalg.solve_triangular(factor, rhs, upper=False)
    return torch.linalg.solve_triangular(factor.mT, half, upper=True)
