"""Scores of an ensemble of Gaussian or quantile members: the predictive of distributional heads.

With a ``gaussian`` head (``ripieno.framework.nn.distributional_heads``) each member ``m`` of a row
predicts ``N(mu_m, s_m^2)`` and the ensemble's predictive is their equally weighted mixture
``(1/M) sum_m N(mu_m, s_m^2)``:

* ``mixture_moments``: its mean ``mean_m mu_m`` and variance ``mean_m s_m^2 + var_m mu_m`` (the
  members' aleatoric variance plus their disagreement, population variance);
* ``mixture_nll``: ``-log (1/M) sum_m N(y; mu_m, s_m^2)``, by ``logsumexp``;
* ``mixture_crps``: its CRPS in closed form, ``E|X - y| - E|X - X'| / 2`` with ``X, X'``
  independent draws (Grimit et al., 2006), both means of ``E|N(a, b^2)|`` over components (pairs);
  with one shared variance it is ``ripieno.framework.metrics.uq.gaussian_mixture_crps``.

``MixtureNLL`` and ``MixtureCRPS`` accumulate them, ``MixtureCalibrationError`` the regression ECE of
the mixture's central intervals (Kuleshov et al., 2018), ``QuantileLoss`` the pinball loss of quantile
predictions averaged over levels, and ``IntervalCoverage`` the share of targets inside
``[lower, upper]``. Sums are float64 states summed across DDP ranks; updates run in float32 with
autocast disabled.

Example:
    >>> import torch
    >>> mean, var = mixture_moments(torch.tensor([[0.0, 2.0]]), torch.tensor([[1.0, 1.0]]))
    >>> mean, var  # 1 + var(0, 2)
    (tensor([1.]), tensor([2.]))
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torchmetrics import Metric

from ripieno.framework.metrics.uq import _MeanState, _normal_abs_moment
from ripieno.framework.nn.distributional_heads import pinball_loss

_LOG_2PI = math.log(2 * math.pi)


def _check(means: Tensor, variances: Tensor, target: Tensor) -> None:
    if means.ndim != 2 or variances.shape != means.shape or target.shape != means.shape[:1]:
        raise ValueError(f"Expected means and variances shaped (rows, members) and a target shaped (rows,);"
                         f" got {tuple(means.shape)}, {tuple(variances.shape)} and {tuple(target.shape)}.")


def mixture_moments(means: Tensor, variances: Tensor) -> tuple[Tensor, Tensor]:
    """Mean and variance ``(N,)`` of the mixtures ``(1/M) sum_m N(means_m, variances_m)``, rows ``(N, M)``."""
    mu, var = means.float(), variances.float()
    return mu.mean(1), var.mean(1) + mu.var(1, correction=0)


def mixture_nll(means: Tensor, variances: Tensor, target: Tensor) -> Tensor:
    """Negative log density ``(N,)`` of ``target`` under each row's equal-weight Gaussian mixture.

    Args:
        means: ``(N, M)`` component means.
        variances: ``(N, M)`` component variances (positive).
        target: ``(N,)`` observations.

    Example:
        >>> round(float(mixture_nll(torch.zeros(1, 3), torch.ones(1, 3), torch.zeros(1))), 4)  # log(2 pi) / 2
        0.9189
    """
    _check(means, variances, target)
    mu, var, y = means.float(), variances.float(), target.float()
    log_n = -0.5 * (_LOG_2PI + var.log() + (y[:, None] - mu) ** 2 / var)
    return math.log(mu.shape[1]) - torch.logsumexp(log_n, dim=1)


def mixture_crps(means: Tensor, variances: Tensor, target: Tensor) -> Tensor:
    """CRPS ``(N,)`` of each row's equal-weight Gaussian mixture, in closed form.

    ``mean_m E|N(mu_m - y, s_m^2)| - mean_{m, m'} E|N(mu_m - mu_m', s_m^2 + s_m'^2)| / 2``, with
    ``E|N(a, b^2)| = b sqrt(2/pi) exp(-a^2 / (2 b^2)) + a (1 - 2 Phi(-a/b))``. It costs ``M^2`` per row.

    Args:
        means: ``(N, M)`` component means.
        variances: ``(N, M)`` component variances (positive).
        target: ``(N,)`` observations.

    Example:
        >>> one = torch.ones(1, 1)  # N(0, 1) at y = 0: (sqrt 2 - 1) / sqrt pi
        >>> round(float(mixture_crps(0 * one, one, torch.zeros(1))), 4)
        0.2337
    """
    _check(means, variances, target)
    mu, var, y = means.float(), variances.float(), target.float()
    first = _normal_abs_moment(y[:, None] - mu, var.sqrt()).mean(1)
    pair_sd = (var[:, :, None] + var[:, None, :]).sqrt()
    second = _normal_abs_moment(mu[:, :, None] - mu[:, None, :], pair_sd).mean((1, 2))
    return first - 0.5 * second


class MixtureNLL(_MeanState):
    """Mean ``mixture_nll`` of Gaussian member predictions (lower is better; in nats).

    Shape:
        - Input: ``means`` and ``variances`` ``(B, M)``, ``target`` ``(B,)``.
        - Output: a 0-d tensor.

    Example:
        >>> metric = MixtureNLL()
        >>> metric.update(torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2))
        >>> metric.compute()
        tensor(0.9189)
    """

    is_differentiable = True
    higher_is_better = False

    def update(self, means: Tensor, variances: Tensor, target: Tensor) -> None:
        """Accumulate a batch of member means and variances and their targets."""
        with torch.autocast(means.device.type, enabled=False):
            self._accumulate(mixture_nll(means, variances, target))


class MixtureCRPS(_MeanState):
    """Mean ``mixture_crps`` of Gaussian member predictions (lower is better; target units).

    Shape:
        - Input: ``means`` and ``variances`` ``(B, M)``, ``target`` ``(B,)``.
        - Output: a 0-d tensor.

    Example:
        >>> metric = MixtureCRPS()
        >>> metric.update(torch.zeros(1, 2), torch.ones(1, 2), torch.zeros(1))
        >>> metric.compute()
        tensor(0.2337)
    """

    is_differentiable = True
    higher_is_better = False

    def update(self, means: Tensor, variances: Tensor, target: Tensor) -> None:
        """Accumulate a batch of member means and variances and their targets."""
        with torch.autocast(means.device.type, enabled=False):
            self._accumulate(mixture_crps(means, variances, target))


def mixture_cdf(means: Tensor, variances: Tensor, target: Tensor) -> Tensor:
    """``P(X <= target)`` ``(N,)`` under each row's equal-weight Gaussian mixture (the PIT value).

    Example:
        >>> mixture_cdf(torch.tensor([[0.0, 2.0]]), torch.ones(1, 2), torch.tensor([1.0]))  # symmetric
        tensor([0.5000])
    """
    _check(means, variances, target)
    mu, sd = means.double(), variances.double().sqrt()
    z = (target.double()[:, None] - mu) / sd
    return (0.5 * torch.erfc(-z / math.sqrt(2.0))).mean(1).float()


CALIBRATION_LEVELS: tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(1, 10))
"""Central-interval levels of ``MixtureCalibrationError``: 10%, 20%, ..., 90%."""


class MixtureCalibrationError(Metric):
    """Regression ECE: mean ``|coverage(p) - p|`` of the mixture's central ``p`` intervals (lower is better).

    A row's central ``p`` interval holds its target when its PIT value ``F(y)`` (``mixture_cdf``)
    lies in ``[(1 - p) / 2, (1 + p) / 2]``; the metric averages, over ``levels``, the gap between the
    share of rows covered and ``p`` (Kuleshov et al., 2018). Counts per level are summed across
    DDP ranks.

    Args:
        levels: the nominal levels ``p`` in ``(0, 1)``.
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``means`` and ``variances`` ``(B, M)``, ``target`` ``(B,)``.
        - Output: a 0-d tensor in ``[0, 1]``.

    Example:
        >>> metric = MixtureCalibrationError(levels=[0.5])
        >>> metric.update(torch.zeros(4, 1), torch.ones(4, 1), torch.tensor([0.0, 0.1, 3.0, -3.0]))
        >>> metric.compute()  # half of the rows in the central 50% interval: no gap
        tensor(0.)
    """

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, levels: Sequence[float] = CALIBRATION_LEVELS, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.levels = tuple(float(p) for p in levels)
        if not self.levels or not all(0.0 < p < 1.0 for p in self.levels):
            raise ValueError(f"levels must be nominal coverages in (0, 1), got {list(levels)}.")
        self.add_state("covered", default=torch.zeros(len(self.levels), dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, means: Tensor, variances: Tensor, target: Tensor) -> None:
        """Accumulate a batch of member means and variances and their targets."""
        with torch.autocast(means.device.type, enabled=False):
            distance = (mixture_cdf(means, variances, target).double() - 0.5).abs()[:, None]
            half = torch.tensor(self.levels, dtype=torch.float64, device=distance.device)[None] / 2
            self.covered += (distance <= half).double().sum(0)
            self.total += target.shape[0]

    def compute(self) -> Tensor:
        """Mean gap between the empirical and nominal coverage over the levels."""
        levels = torch.tensor(self.levels, dtype=torch.float64, device=self.covered.device)
        return (self.covered / self.total - levels).abs().mean().float()


class QuantileLoss(_MeanState):
    """Pinball loss of quantile predictions, averaged over levels and rows (lower is better).

    Args:
        levels: the quantile levels, in the order of the predictions' last axis.
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``quantiles`` ``(B, L)``, ``target`` ``(B,)``.
        - Output: a 0-d tensor (target units).

    Example:
        >>> metric = QuantileLoss([0.1, 0.9])
        >>> metric.update(torch.tensor([[0.0, 0.0]]), torch.tensor([1.0]))  # (0.1 + 0.9) / 2
        >>> metric.compute()
        tensor(0.5000)
    """

    is_differentiable = True
    higher_is_better = False

    def __init__(self, levels: Sequence[float], **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.levels = tuple(float(q) for q in levels)

    def update(self, quantiles: Tensor, target: Tensor) -> None:
        """Accumulate a batch of quantile predictions ``(B, L)`` and targets ``(B,)``."""
        if quantiles.ndim != 2 or quantiles.shape != (target.shape[0], len(self.levels)):
            raise ValueError(f"Expected quantiles shaped (rows, {len(self.levels)}) for a target shaped"
                             f" {tuple(target.shape)}, got {tuple(quantiles.shape)}.")
        with torch.autocast(quantiles.device.type, enabled=False):
            self._accumulate(pinball_loss(quantiles, target, self.levels).mean(-1))


class IntervalCoverage(_MeanState):
    """Share of targets inside ``[lower, upper]``; compare it with the nominal level (higher is not better).

    Shape:
        - Input: ``lower``, ``upper``, ``target`` ``(B,)``.
        - Output: a 0-d tensor in ``[0, 1]``.

    Example:
        >>> metric = IntervalCoverage()
        >>> metric.update(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0]), torch.tensor([0.5, 2.0]))
        >>> metric.compute()
        tensor(0.5000)
    """

    is_differentiable = False
    higher_is_better = None

    def update(self, lower: Tensor, upper: Tensor, target: Tensor) -> None:
        """Accumulate a batch of interval bounds and targets."""
        y = target.float()
        self._accumulate(((lower.float() <= y) & (y <= upper.float())).float())
