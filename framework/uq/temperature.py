"""Temperature scaling's fit: one ``T`` minimising the member-mean NLL (Guo et al., 2017).

The math behind ``ripieno.callbacks.TemperatureScaling`` and
``ripieno.framework.uq.calibrators.TemperatureCalibration``, in float64 on CPU, deterministic: a grid
over ``log T``, then golden-section search in the bracket of the best grid point.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_CHUNK = 1 << 22  # elements of (rows, members, classes) per float64 NLL evaluation
_INV_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def member_mean_nll(log_probs: Tensor, target: Tensor, temperature: float) -> float:
    """``-mean_i log (1/M) sum_m softmax(z_im / T)[y_i]`` in float64.

    Args:
        log_probs: ``(N, M, C)`` member logits (or log-probabilities: the same up to a
            per-row constant).
        target: ``(N,)`` class labels.
        temperature: ``T > 0``.
    """
    n, m, c = log_probs.shape
    rows = max(1, _CHUNK // max(m * c, 1))
    total = 0.0
    for start in range(0, n, rows):
        z = log_probs[start:start + rows].double() / temperature
        y = target[start:start + rows].long()[:, None, None].expand(-1, m, 1)
        log_py = torch.log_softmax(z, -1).gather(-1, y).squeeze(-1)  # (rows, M)
        total -= float((torch.logsumexp(log_py, 1) - math.log(m)).sum())
    return total / n


def fit_temperature(log_probs: Tensor, target: Tensor, bounds: tuple[float, float] = (0.01, 100.0),
                    grid_size: int = 41, tol: float = 1e-6) -> float:
    """The ``T`` in ``bounds`` that minimises ``member_mean_nll`` (grid, then golden section).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(4000, 1, 3, generator=g)
        >>> y = torch.multinomial(z[:, 0].softmax(-1), 1, generator=g)[:, 0]  # labels ~ softmax(z)
        >>> round(fit_temperature(2.0 * z, y), 1)  # logits twice as sharp as the labels
        2.0

    Args:
        log_probs: ``(N, M, C)`` member logits or log-probabilities.
        target: ``(N,)`` class labels in ``[0, C)``.
        bounds: the search interval ``(low, high)`` of ``T``.
        grid_size: grid points over ``log T`` before the golden-section refinement.
        tol: width in ``log T`` at which the refinement stops.

    Raises:
        ValueError: no rows, or inputs of the wrong shape.
    """
    if log_probs.ndim != 3 or target.shape != log_probs.shape[:1]:
        raise ValueError(f"Expected member logits (N, M, C) and targets (N,), got"
                         f" {tuple(log_probs.shape)} and {tuple(target.shape)}.")
    if log_probs.shape[0] == 0:
        raise ValueError("fit_temperature needs at least one labelled row.")
    lp, y = log_probs.detach().cpu(), target.detach().cpu()

    def nll(log_t: float) -> float:
        return member_mean_nll(lp, y, math.exp(log_t))

    lo, hi = math.log(bounds[0]), math.log(bounds[1])
    grid = [lo + (hi - lo) * k / (grid_size - 1) for k in range(grid_size)]
    values = [nll(g) for g in grid]
    k = min(range(grid_size), key=values.__getitem__)
    a, b = grid[max(k - 1, 0)], grid[min(k + 1, grid_size - 1)]
    c, d = b - _INV_PHI * (b - a), a + _INV_PHI * (b - a)
    fc, fd = nll(c), nll(d)
    while b - a > tol:
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - _INV_PHI * (b - a)
            fc = nll(c)
        else:
            a, c, fc = c, d, fd
            d = a + _INV_PHI * (b - a)
            fd = nll(d)
    _, best = min((values[k], grid[k]), (fc, c), (fd, d))
    return math.exp(best)
