"""Mixing kernels ``Q`` for M-cover routing and Sinkhorn balancing.

``Q`` is ``(M, M)`` and non-negative; ``Q[a, b]`` is the strength of routing ``b -> a``
(destination copy ``a`` reads its inputs from source copy ``b``). A permutation ``rho``
has weight ``prod_a Q[a, rho(a)]`` (``ripieno.framework.mcover.permutations``).

* ``diagonal``: ``Q = I``; only the identity has weight: M independent trainings.
* ``uniform``: ``Q = 1``; every permutation equally likely (global mixing).
* ``gaussian_ring``: copies on a ring;
  ``Q[a, b] = exp(-d(b - a - mu)^2 / (2 sigma^2))`` with ``d`` the ring distance
  (``min(|t| mod M, M - |t| mod M)``). ``sigma -> 0`` (with ``mu = 0``) is diagonal,
  ``sigma -> inf`` uniform; ``mu`` shifts the preferred source around the ring.
* ``matrix``: a user matrix (validated).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

KernelKind = Literal["diagonal", "uniform", "gaussian_ring", "matrix"]
KERNELS: tuple[str, ...] = ("diagonal", "uniform", "gaussian_ring", "matrix")


def ring_distance(m: int) -> Tensor:
    """``D[a, b]`` = distance from ``a`` to ``b`` around a ring of ``m`` copies (float64)."""
    idx = torch.arange(m, dtype=torch.float64)
    diff = (idx[None, :] - idx[:, None]).remainder(m)
    return torch.minimum(diff, m - diff)


def gaussian_ring_kernel(m: int, sigma: float, mu: float = 0.0) -> Tensor:
    """``Q[a, b] = exp(-d_ring(b - a - mu)^2 / (2 sigma^2))`` (float64, ``(m, m)``).

    ``mu`` may be fractional; the ring distance of ``b - a - mu`` is taken modulo ``m``.
    """
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma} (use kernel='diagonal' for no mixing).")
    idx = torch.arange(m, dtype=torch.float64)
    shift = (idx[None, :] - idx[:, None] - mu).remainder(m)
    dist = torch.minimum(shift, m - shift)
    return torch.exp(-(dist**2) / (2 * sigma**2))


def validate_kernel(q: Tensor) -> Tensor:
    """``q`` as float64 after checking that some permutation has positive weight.

    Raises:
        ValueError: ``q`` not square, negative or non-finite entries, or no permutation
            with positive weight (a zero permanent: e.g. an all-zero row).
    """
    q = torch.as_tensor(q, dtype=torch.float64)
    if q.dim() != 2 or q.shape[0] != q.shape[1] or q.shape[0] < 1:
        raise ValueError(f"A mixing kernel must be a square (M, M) matrix, got shape {tuple(q.shape)}.")
    if not torch.isfinite(q).all() or (q < 0).any():
        raise ValueError("A mixing kernel needs finite, non-negative entries.")
    from scipy.optimize import linear_sum_assignment  # a zero permanent <=> no positive assignment

    support = (q > 0).double().numpy()
    rows, cols = linear_sum_assignment(-support)
    if support[rows, cols].sum() < q.shape[0]:
        raise ValueError("No permutation has positive weight under this kernel (its permanent is 0);"
                         " every copy needs a source, e.g. add the identity to Q.")
    return q


def make_kernel(kind: KernelKind, m: int, sigma: float = 1.0, mu: float = 0.0,
                matrix: Sequence[Sequence[float]] | Tensor | None = None) -> Tensor:
    """Build a kernel by name (float64, ``(m, m)``).

    Args:
        kind: ``diagonal``, ``uniform``, ``gaussian_ring`` or ``matrix``.
        m: number of copies ``M``.
        sigma: ring width (``gaussian_ring``).
        mu: ring shift (``gaussian_ring``).
        matrix: the user's ``Q`` (``matrix``).
    """
    if m < 1:
        raise ValueError(f"M must be >= 1, got {m}.")
    if kind == "diagonal":
        return torch.eye(m, dtype=torch.float64)
    if kind == "uniform":
        return torch.ones(m, m, dtype=torch.float64)
    if kind == "gaussian_ring":
        return gaussian_ring_kernel(m, sigma, mu)
    if kind == "matrix":
        if matrix is None:
            raise ValueError("kernel='matrix' needs matrix=[[...], ...] (an M x M list).")
        q = validate_kernel(torch.as_tensor(matrix, dtype=torch.float64))
        if q.shape[0] != m:
            raise ValueError(f"The kernel matrix is {q.shape[0]} x {q.shape[0]} but M={m}.")
        return q
    raise ValueError(f"Unknown kernel {kind!r}; choose one of {KERNELS}.")


def sinkhorn(q: Tensor, n_iters: int = 1000, tol: float = 1e-10) -> Tensor:
    """Doubly stochastic ``diag(u) Q diag(v)`` by alternate row/column normalisation.

    The permutation distribution ``prod_a Q[a, rho(a)]`` is unchanged by the scaling (each
    permutation's weight is multiplied by ``prod u prod v``), so samplers may balance ``Q``
    first (better conditioned acceptance ratios). The balanced matrix is a doubly stochastic
    summary of ``Q``, not the exact marginals ``P(rho(a) = b)`` (those come from samples).
    """
    p = validate_kernel(q).clone()
    for _ in range(n_iters):
        p = p / p.sum(1, keepdim=True)
        p = p / p.sum(0, keepdim=True)
        if (p.sum(1) - 1).abs().max() < tol:
            break
    return p
