"""Distributional regression heads: what each member's outputs mean, and the losses that train them.

A ``point`` head outputs one value per member. A ``gaussian`` head outputs two, a mean and a raw
variance (``variance = softplus(raw) + MIN_VARIANCE``), trained with the Gaussian negative
log-likelihood, optionally beta-weighted (Seitzer et al., 2022, "On the pitfalls of heteroscedastic
uncertainty estimation with probabilistic neural networks": each row's loss is multiplied by
``stop_gradient(variance) ** beta``; ``beta = 0`` is the plain NLL, ``beta = 1`` gives the mean the
gradient of a squared error). A ``quantile`` head outputs one value per level, sorted along the
output axis so that the quantiles never cross, trained with the pinball loss averaged over levels.

Everything here is written for standardised targets (the units the network learns in) and has no
Lightning in it; ``ripieno.framework.metrics.mixture`` scores the ensemble's predictive.

Example:
    >>> import torch
    >>> mean, variance = gaussian_head(torch.tensor([[[1.0, 0.0]]]))  # (B=1, K=1, 2)
    >>> mean, variance
    (tensor([[1.]]), tensor([[0.6931]]))
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor

from ripieno.framework.errors import RipienoInputError

RegressionHead = Literal["point", "gaussian", "quantile"]
REGRESSION_HEADS: tuple[str, ...] = get_args(RegressionHead)
MIN_VARIANCE = 1e-6
"""Added to ``softplus(raw)``: the smallest variance a Gaussian head predicts (standardised units)."""
DEFAULT_QUANTILE_LEVELS: tuple[float, ...] = (0.05, 0.5, 0.95)
"""``(alpha / 2, 0.5, 1 - alpha / 2)`` with ``alpha = 0.1``: a 90% interval and the median."""


def check_regression_head(head: str, task: str, quantile_levels: Sequence[float], beta_nll: float
                          ) -> tuple[float, ...]:
    """Check a head's settings; returns the quantile levels as a sorted tuple of floats.

    Raises:
        RipienoInputError: an unknown head, a distributional head on a classification task, levels
            that are not distinct values in ``(0, 1)`` including ``0.5``, or ``beta_nll`` outside
            ``[0, 1]``; the message names the fix.

    Example:
        >>> check_regression_head("quantile", "regression", [0.9, 0.5, 0.1], 0.0)
        (0.1, 0.5, 0.9)
    """
    if head not in REGRESSION_HEADS:
        raise RipienoInputError(f"regression_head must be one of {REGRESSION_HEADS}, got {head!r}.")
    if head != "point" and task != "regression":
        raise RipienoInputError(f"regression_head={head!r} needs a regression task, but the data's task is"
                                f" {task!r}; use regression_head='point'.")
    levels = tuple(sorted(float(q) for q in quantile_levels))
    distinct = len(set(levels)) == len(levels)
    if not (levels and distinct and all(0 < q < 1 for q in levels) and 0.5 in levels):
        raise RipienoInputError(f"quantile_levels must be distinct values in (0, 1) that include 0.5 (the"
                                f" point prediction), got {list(quantile_levels)}; e.g. [0.05, 0.5, 0.95].")
    if not 0.0 <= beta_nll <= 1.0:
        raise RipienoInputError(f"beta_nll must be in [0, 1], got {beta_nll}; 0 is the plain Gaussian NLL,"
                                " 0.5 the value Seitzer et al. recommend.")
    return levels


def head_width(head: RegressionHead, quantile_levels: Sequence[float]) -> int:
    """Outputs per member of a regression head: 1 (``point``), 2 (``gaussian``) or one per level.

    Example:
        >>> head_width("gaussian", DEFAULT_QUANTILE_LEVELS), head_width("quantile", DEFAULT_QUANTILE_LEVELS)
        (2, 3)
    """
    return {"point": 1, "gaussian": 2}.get(head, len(quantile_levels))


def gaussian_head(raw: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and variance ``(..., )`` of a Gaussian head's outputs ``(..., 2)``, in float32.

    ``variance = softplus(raw[..., 1]) + MIN_VARIANCE`` (in the units of the mean, squared).
    """
    x = raw.float()
    return x[..., 0], F.softplus(x[..., 1]) + MIN_VARIANCE


def sorted_quantiles(raw: Tensor) -> Tensor:
    """A quantile head's outputs ``(..., L)`` sorted along the last axis: quantiles that never cross.

    Sorting is differentiable (each level's gradient goes to the output that lands there), so the
    head trains through it, as in Chernozhukov et al. (2010)'s rearrangement.

    Example:
        >>> sorted_quantiles(torch.tensor([[2.0, -1.0, 0.5]]))
        tensor([[-1.0000,  0.5000,  2.0000]])
    """
    return raw.float().sort(dim=-1).values


def gaussian_nll(mean: Tensor, variance: Tensor, target: Tensor, beta: float = 0.0) -> Tensor:
    """Per-entry Gaussian NLL, constant included, beta-weighted; the shape of ``mean``.

    ``0.5 (log 2 pi + log variance + (target - mean)^2 / variance)`` as
    ``torch.nn.functional.gaussian_nll_loss(full=True)``, times ``variance.detach() ** beta``.

    Args:
        mean: ``(B, K)`` member means.
        variance: ``(B, K)`` member variances (positive).
        target: ``(B,)`` observations, or broadcastable to ``mean``.
        beta: the beta-NLL exponent (0: the plain NLL).

    Example:
        >>> round(float(gaussian_nll(torch.zeros(1, 1), torch.ones(1, 1), torch.zeros(1))), 4)  # log(2pi)/2
        0.9189
    """
    y = target.float()
    y = (y[:, None] if y.ndim == mean.ndim - 1 else y).expand_as(mean)
    loss = F.gaussian_nll_loss(mean, y, variance, full=True, eps=MIN_VARIANCE, reduction="none")
    return loss * variance.detach() ** beta if beta else loss


def pinball_loss(quantiles: Tensor, target: Tensor, levels: Tensor | Sequence[float]) -> Tensor:
    """Per-entry pinball (quantile) loss ``max(q (y - x), (q - 1) (y - x))``; the shape of ``quantiles``.

    Args:
        quantiles: ``(..., L)`` predicted quantiles, one per level.
        target: observations shaped ``quantiles.shape[:-1]`` or broadcastable to it (``(B,)`` for
            ``(B, K, L)`` quantiles).
        levels: the ``L`` levels in ``(0, 1)``.

    Example:
        >>> pinball_loss(torch.tensor([[0.0, 0.0]]), torch.tensor([1.0]), [0.1, 0.9])  # y above: q (y - x)
        tensor([[0.1000, 0.9000]])
    """
    x = quantiles.float()
    q = torch.as_tensor(levels, dtype=x.dtype, device=x.device)
    y = target.float()
    while y.ndim < x.ndim - 1:
        y = y[..., None]
    diff = y[..., None] - x
    return torch.maximum(q * diff, (q - 1) * diff)
