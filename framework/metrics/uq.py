"""Uncertainty-quantification metrics for models with members or posterior samples.

Classification inputs are per-sample outputs ``(B, S, C)`` (logits or probabilities,
samples on axis 1, see ``ripieno.framework.members``) or one prediction ``(B, C)``; the predictive
distribution is the mean over samples of the per-sample distributions. Regression
inputs are per-sample means ``(B, S, ...)`` with an observation-noise variance, or a
predictive mean and variance shaped like the target.

* ``ExpectedCalibrationError``: top-label l1 ECE of the predictive mean probability,
  through torchmetrics' ``MulticlassCalibrationError``.
* ``PredictiveNLL``: ``-mean_i log mean_s p_s(y_i)``.
* ``BrierScore``: ``mean_i sum_c (pbar_ic - 1[y_i = c])^2`` of the predictive mean ``pbar``
  (summed over classes, not halved: range ``[0, 2]``).
* ``LogPointwisePredictiveDensity``: ``mean_i log mean_s p(y_i | theta_s)`` for
  classification (``= -PredictiveNLL``) or a Gaussian likelihood (regression).
* ``GaussianNLL``: Gaussian NLL of a predictive mean and variance, constant included
  (as ``torch.nn.GaussianNLLLoss(full=True)``).
* ``EnsembleCRPS``: CRPS of the members' empirical distribution, torchmetrics'
  ``ContinuousRankedProbabilityScore`` (``E|X - y| - E|X - X'| / 2``), or of the equal-weight
  Gaussian mixture around them when an observation-noise variance is given (closed form).
* ``VarROC``: AUROC of the across-sample variance of the predicted-class probability,
  separating misclassified (``id``) or out-of-distribution (``ood``) points from
  correctly classified ones ("Is the last layer sufficient for uncertainty
  quantification?"); the predicted class is the predictive mean's or, as in that paper's
  code, the trained (MAP) network's.

Sums accumulate in float64 states reduced with ``sum`` (scores for AUROC with ``cat``)
across DDP ranks, and every update runs with autocast disabled, in float32. RMSE is
torchmetrics' ``MeanSquaredError(squared=False)`` on the predictive mean.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.classification import MulticlassCalibrationError
from torchmetrics.functional.classification import binary_auroc
from torchmetrics.regression import ContinuousRankedProbabilityScore
from torchmetrics.utilities import dim_zero_cat, rank_zero_warn

from ripieno.framework.metrics.diversity import member_log_probs

InputKind = Literal["logits", "probs"]
_INPUT_KINDS = ("logits", "probs")
_LOG_2PI = math.log(2 * math.pi)


def _check_kind(input_kind: str) -> None:
    if input_kind not in _INPUT_KINDS:
        raise ValueError(f"Unknown input kind {input_kind!r}; use 'logits' or 'probs'.")


def _as_samples(outputs: Tensor, num_classes: int | None = None) -> Tensor:
    """View ``(B, C)`` as ``(B, 1, C)`` and check ``(B, S, C)``."""
    x = outputs.unsqueeze(1) if outputs.ndim == 2 else outputs
    if x.ndim != 3 or x.shape[-1] < 2:
        raise ValueError(
            "Expected classification outputs shaped (batch, samples, classes) or (batch, classes) "
            f"with at least 2 classes, got {tuple(outputs.shape)}."
        )
    if num_classes is not None and x.shape[-1] != num_classes:
        raise ValueError(f"Expected {num_classes} classes on the last axis, got {tuple(outputs.shape)}.")
    return x


def _check_target(target: Tensor, x: Tensor, validate: bool, skip: Tensor | None = None) -> None:
    """Check integer class targets ``(B,)`` for sample outputs ``x`` ``(B, S, C)``."""
    if target.ndim != 1 or target.shape[0] != x.shape[0]:
        raise ValueError(
            f"Expected class targets shaped (batch,) = ({x.shape[0]},), got {tuple(target.shape)}."
        )
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise ValueError(f"Expected integer class targets, got dtype {target.dtype}.")
    if validate:
        checked = target if skip is None else target[~skip]
        if checked.numel() and (checked.min() < 0 or checked.max() >= x.shape[-1]):
            raise ValueError(f"Class targets must lie in [0, {x.shape[-1] - 1}].")


def _check_probs(x: Tensor, input_kind: str, validate: bool) -> None:
    if validate and input_kind == "probs" and x.numel() and (x.min() < 0 or x.max() > 1):
        raise ValueError("input_kind='probs' expects values in [0, 1]; pass input_kind='logits' for logits.")


def sample_probs(outputs: Tensor, input_kind: InputKind = "logits") -> Tensor:
    """Per-sample class probabilities ``(B, S, C)`` in float32.

    Args:
        outputs: ``(B, S, C)`` per-sample logits or probabilities, or ``(B, C)``.
        input_kind: ``logits`` or ``probs``.

    Returns:
        Probabilities, shape ``(B, S, C)`` (``S = 1`` for a ``(B, C)`` input).
    """
    _check_kind(input_kind)
    x = _as_samples(outputs).float()
    return torch.softmax(x, dim=-1) if input_kind == "logits" else x


def log_predictive_probability(outputs: Tensor, target: Tensor, input_kind: InputKind = "logits") -> Tensor:
    """``log mean_s p_s(y_i)`` per point, by ``logsumexp`` over samples minus ``log S``.

    Args:
        outputs: ``(B, S, C)`` per-sample logits or probabilities, or ``(B, C)``.
        target: ``(B,)`` integer class labels.
        input_kind: ``logits`` or ``probs`` (probabilities are clamped at float32 ``tiny``).

    Returns:
        Log predictive probability of the target, shape ``(B,)``, float32.
    """
    _check_kind(input_kind)
    x = _as_samples(outputs)
    log_p = member_log_probs(x, input_kind)  # (B, S, C)
    index = target.long()[:, None, None].expand(-1, log_p.shape[1], 1)
    log_py = log_p.gather(-1, index).squeeze(-1)  # (B, S)
    return torch.logsumexp(log_py, dim=1) - math.log(log_py.shape[1])


def _regression_shapes(preds: Tensor, target: Tensor) -> Tensor:
    """Return ``preds`` as samples ``(B, S, ...)``; a prediction shaped like ``target`` gets ``S = 1``."""
    if preds.shape == target.shape:
        return preds.unsqueeze(1)
    if preds.ndim == target.ndim + 1 and (preds.shape[0], *preds.shape[2:]) == target.shape:
        return preds
    expected = (target.shape[0], "samples", *target.shape[1:])
    raise ValueError(
        f"Expected predictions shaped like the target {tuple(target.shape)} or per-sample "
        f"{expected}, got {tuple(preds.shape)}."
    )


def _variance(var: Tensor | float, target: Tensor, validate: bool, name: str) -> Tensor:
    """A positive variance as a float32 tensor broadcast to ``target``'s shape."""
    v = torch.as_tensor(var, dtype=torch.float32, device=target.device)
    try:
        shape = torch.broadcast_shapes(v.shape, target.shape)
    except RuntimeError:
        shape = None
    if shape != target.shape:
        raise ValueError(
            f"Expected {name} to be a scalar or broadcastable to the target shape "
            f"{tuple(target.shape)}, got {tuple(v.shape)}."
        )
    if validate and v.numel() and not bool((v > 0).all()):
        raise ValueError(f"{name} must be positive.")
    return v.expand(target.shape)


def gaussian_log_predictive_density(preds: Tensor, target: Tensor, noise_var: Tensor | float) -> Tensor:
    """``log mean_s N(y_i; mu_s, sigma2_i)`` per output, by ``logsumexp`` over samples.

    Args:
        preds: per-sample means ``(B, S, ...)``, or one mean shaped like ``target``.
        target: ``(B, ...)`` observations.
        noise_var: observation-noise variance ``sigma2``, a scalar or broadcastable to ``target``.

    Returns:
        Log predictive density, shape of ``target``, float32.
    """
    y = target.float()
    mu = _regression_shapes(preds, target).float()
    var = _variance(noise_var, y, validate=False, name="noise_var").unsqueeze(1)
    log_n = -0.5 * (_LOG_2PI + var.log() + (y.unsqueeze(1) - mu) ** 2 / var)  # (B, S, ...)
    return torch.logsumexp(log_n, dim=1) - math.log(mu.shape[1])


class _MeanState(Metric):
    """Mean of per-point values: a float64 ``sum`` and a count, both summed across ranks."""

    full_state_update = False

    def __init__(self, validate_args: bool = True, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.validate_args = validate_args
        self.add_state("value_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _accumulate(self, values: Tensor) -> None:
        self.value_sum += values.double().sum()
        self.total += values.numel()

    def compute(self) -> Tensor:
        """Mean over all accumulated points."""
        return (self.value_sum / self.total).float()


class ExpectedCalibrationError(MulticlassCalibrationError):
    """Top-label l1 ECE of the predictive mean ``mean_s p_s`` with equal-width bins.

    A thin front to torchmetrics' ``MulticlassCalibrationError(norm="l1")``: only the
    input changes (samples are averaged in probability space first), so states
    (``cat``), binning and the result are torchmetrics'.

    Args:
        num_classes: number of classes ``C``.
        n_bins: number of equal-width confidence bins on ``[0, 1]``.
        input_kind: ``probs`` or ``logits`` (softmax per sample before averaging).
        validate_args: check target range and probability range (costs a device sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``outputs`` ``(B, S, C)``: batch, samples (members), classes; logits or
          probabilities, or one prediction ``(B, C)``; ``target`` ``(B,)`` integer labels.
        - Output: a 0-d tensor in ``[0, 1]``.

    Example:
        >>> metric = ExpectedCalibrationError(num_classes=2)
        >>> probs = torch.tensor([[[1.0, 0.0], [0.8, 0.2]], [[0.6, 0.4], [0.6, 0.4]]])  # (B=2, S=2, C=2)
        >>> metric.update(probs, torch.tensor([0, 1]))
        >>> metric.compute()  # confidences 0.9 (right), 0.6 (wrong): (|0.9 - 1| + |0.6 - 0|) / 2
        tensor(0.3500)
    """

    def __init__(
        self,
        num_classes: int,
        n_bins: int = 15,
        input_kind: InputKind = "probs",
        validate_args: bool = True,
        **kwargs,  # noqa: ANN003
    ) -> None:
        _check_kind(input_kind)
        super().__init__(num_classes, n_bins=n_bins, norm="l1", validate_args=validate_args, **kwargs)
        self.input_kind = input_kind

    def update(self, outputs: Tensor, target: Tensor) -> None:
        """Accumulate a batch.

        Args:
            outputs: ``(B, S, C)`` per-sample logits or probabilities, or ``(B, C)``.
            target: ``(B,)`` integer class labels.
        """
        x = _as_samples(outputs, self.num_classes)
        _check_target(target, x, self.validate_args)
        _check_probs(x, self.input_kind, self.validate_args)
        with torch.autocast(x.device.type, enabled=False):
            mean_probs = sample_probs(x, self.input_kind).mean(1)
        super().update(mean_probs, target)


class _ClassProbsMean(_MeanState):
    """A mean over points of a score of class probabilities ``(B, S, C)`` (or ``(B, C)``)."""

    is_differentiable = True
    higher_is_better = False

    def __init__(self, input_kind: InputKind = "logits", validate_args: bool = True, **kwargs) -> None:  # noqa: ANN003
        _check_kind(input_kind)
        super().__init__(validate_args=validate_args, **kwargs)
        self.input_kind = input_kind

    def _samples(self, outputs: Tensor, target: Tensor) -> Tensor:
        """``outputs`` as ``(B, S, C)``, with the targets and probabilities checked."""
        x = _as_samples(outputs)
        _check_target(target, x, self.validate_args)
        _check_probs(x, self.input_kind, self.validate_args)
        return x


class PredictiveNLL(_ClassProbsMean):
    """Negative log predictive likelihood ``-mean_i log mean_s p_s(y_i)`` (nats).

    Args:
        input_kind: ``logits`` or ``probs``.
        validate_args: check target range and probability range (costs a device sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``outputs`` ``(B, S, C)``: batch, samples (members), classes; logits or
          probabilities, or one prediction ``(B, C)``; ``target`` ``(B,)`` integer labels.
        - Output: a 0-d tensor (nats).

    Example:
        >>> metric = PredictiveNLL(input_kind="probs")
        >>> metric.update(torch.tensor([[[0.2, 0.8], [0.8, 0.2]]]), torch.tensor([1]))  # (B=1, S=2, C=2)
        >>> metric.compute()  # -log((0.8 + 0.2) / 2) = log(2)
        tensor(0.6931)
    """

    is_differentiable = True
    higher_is_better = False

    def update(self, outputs: Tensor, target: Tensor) -> None:
        """Accumulate a batch.

        Args:
            outputs: ``(B, S, C)`` per-sample logits or probabilities, or ``(B, C)``.
            target: ``(B,)`` integer class labels.
        """
        x = self._samples(outputs, target)
        with torch.autocast(x.device.type, enabled=False):
            self._accumulate(-log_predictive_probability(x, target, self.input_kind))


class BrierScore(_ClassProbsMean):
    """Multiclass Brier score of the predictive mean, ``mean_i sum_c (pbar_ic - 1[y_i = c])^2``.

    ``pbar = mean_s p_s`` is averaged over samples in probability space first, as for
    ``PredictiveNLL``. Scale: the squared error is *summed* over classes and not halved
    (Brier's original score), so values lie in ``[0, 2]``; this is scikit-learn's
    ``brier_score_loss(y, pbar, scale_by_half=False)``, its default for three or more
    classes. For two classes it is twice the binary Brier score ``mean_i (pbar_i1 - y_i)^2``
    (scikit-learn's binary default).

    Args:
        input_kind: ``logits`` or ``probs``.
        validate_args: check target range and probability range (costs a device sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``outputs`` ``(B, S, C)``: batch, samples (members), classes; logits or
          probabilities, or one prediction ``(B, C)``; ``target`` ``(B,)`` integer labels.
        - Output: a 0-d tensor in ``[0, 2]``.

    Example:
        >>> metric = BrierScore(input_kind="probs")
        >>> metric.update(torch.tensor([[0.8, 0.2], [0.4, 0.6]]), torch.tensor([0, 0]))
        >>> metric.compute()  # ((0.2^2 + 0.2^2) + (0.6^2 + 0.6^2)) / 2
        tensor(0.4000)
    """

    is_differentiable = True
    higher_is_better = False

    def update(self, outputs: Tensor, target: Tensor) -> None:
        """Accumulate a batch.

        Args:
            outputs: ``(B, S, C)`` per-sample logits or probabilities, or ``(B, C)``.
            target: ``(B,)`` integer class labels.
        """
        x = self._samples(outputs, target)
        with torch.autocast(x.device.type, enabled=False):
            mean_probs = sample_probs(x, self.input_kind).mean(1)
            onehot = torch.nn.functional.one_hot(target.long(), mean_probs.shape[-1]).float()
            self._accumulate((mean_probs - onehot).square().sum(-1))


class LogPointwisePredictiveDensity(_MeanState):
    """Mean over points of ``log (1/S) sum_s p(y_i | theta_s)`` (higher is better).

    Gelman et al.'s lppd is the sum over points; this reports the mean so that it does
    not grow with the data set. Classification gives ``-PredictiveNLL``; regression
    uses the Gaussian likelihood ``N(y; mu_s, sigma2)`` with observation-noise
    variance ``sigma2``.

    Args:
        task: ``classification`` or ``regression``.
        input_kind: ``logits`` or ``probs`` (classification only).
        validate_args: check targets, probabilities and ``noise_var > 0`` (costs a device sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: classification: ``outputs`` ``(B, S, C)``: batch, samples (members), classes;
          logits or probabilities, or one prediction ``(B, C)``; ``target`` ``(B,)``.
          Regression: ``outputs`` ``(B, S, *)`` per-sample means or one mean ``(B, *)``,
          ``target`` ``(B, *)``, ``noise_var`` a scalar or broadcastable to ``target``.
        - Output: a 0-d tensor (nats).

    Example:
        >>> metric = LogPointwisePredictiveDensity(task="regression")
        >>> metric.update(torch.tensor([[-1.0, 1.0]]), torch.tensor([1.0]), noise_var=1.0)  # (B=1, S=2)
        >>> metric.compute()  # log((N(1; -1, 1) + N(1; 1, 1)) / 2) = -log(2 pi) / 2 + log((e^-2 + 1) / 2)
        tensor(-1.4852)
    """

    is_differentiable = True
    higher_is_better = True

    def __init__(
        self,
        task: Literal["classification", "regression"] = "classification",
        input_kind: InputKind = "logits",
        validate_args: bool = True,
        **kwargs,  # noqa: ANN003
    ) -> None:
        if task not in ("classification", "regression"):
            raise ValueError(f"Unknown task {task!r}; use 'classification' or 'regression'.")
        _check_kind(input_kind)
        super().__init__(validate_args=validate_args, **kwargs)
        self.task = task
        self.input_kind = input_kind

    def update(self, outputs: Tensor, target: Tensor, noise_var: Tensor | float | None = None) -> None:
        """Accumulate a batch.

        Args:
            outputs: classification: ``(B, S, C)`` per-sample logits or probabilities, or
                ``(B, C)``. Regression: per-sample means ``(B, S, ...)``, or one mean shaped
                like ``target``.
            target: ``(B,)`` class labels, or regression observations ``(B, ...)``.
            noise_var: regression only (required): observation-noise variance, a scalar or
                broadcastable to ``target``.
        """
        if self.task == "classification":
            if noise_var is not None:
                raise ValueError("noise_var applies to task='regression' only.")
            x = _as_samples(outputs)
            _check_target(target, x, self.validate_args)
            _check_probs(x, self.input_kind, self.validate_args)
            with torch.autocast(x.device.type, enabled=False):
                self._accumulate(log_predictive_probability(x, target, self.input_kind))
            return
        if noise_var is None:
            raise ValueError("task='regression' needs noise_var, the observation-noise variance.")
        _regression_shapes(outputs, target)
        _variance(noise_var, target, self.validate_args, "noise_var")
        with torch.autocast(outputs.device.type, enabled=False):
            self._accumulate(gaussian_log_predictive_density(outputs, target, noise_var))


class GaussianNLL(_MeanState):
    """Gaussian NLL ``0.5 log(2 pi var) + (y - mean)^2 / (2 var)``, mean over outputs.

    The ``0.5 log 2 pi`` constant is included (``GaussianNLLLoss(full=True)``), so values
    compare across papers that report full log-likelihoods. With per-sample means the
    predictive distribution is moment-matched: ``mean = mean_s mu_s``,
    ``var = var_s mu_s`` (population, ``ddof=0``) ``+ noise_var``.

    Args:
        validate_args: check ``var > 0`` (costs a device sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``preds`` ``(B, *)`` predictive means, or ``(B, S, *)``: batch, samples
          (members), outputs; ``target`` ``(B, *)``; ``var`` a scalar or broadcastable to ``target``.
        - Output: a 0-d tensor (nats).

    Example:
        >>> metric = GaussianNLL()
        >>> metric.update(torch.tensor([[-1.0, 1.0]]), torch.tensor([0.0]), var=1.0)  # (B=1, S=2)
        >>> metric.compute()  # mean 0, variance 1 + 1: log(2 pi * 2) / 2 + 0
        tensor(1.2655)
    """

    is_differentiable = True
    higher_is_better = False

    def update(self, preds: Tensor, target: Tensor, var: Tensor | float) -> None:
        """Accumulate a batch.

        Args:
            preds: predictive mean shaped like ``target`` (``var`` is then the predictive
                variance), or per-sample means ``(B, S, ...)`` (``var`` is then the
                observation-noise variance added to the sample variance).
            target: observations ``(B, ...)``.
            var: a scalar or a tensor broadcastable to ``target`` (see ``preds``).
        """
        mu = _regression_shapes(preds, target)
        v = _variance(var, target, self.validate_args, "var")
        with torch.autocast(preds.device.type, enabled=False):
            mu = mu.float()
            mean = mu.mean(1)
            total_var = v + mu.var(1, correction=0)  # zero for a single prediction
            nll = 0.5 * (_LOG_2PI + total_var.log() + (target.float() - mean) ** 2 / total_var)
        self._accumulate(nll)


def _normal_abs_moment(mean: Tensor, sd: Tensor) -> Tensor:
    """``E|Z|`` for ``Z ~ N(mean, sd^2)``: ``mean (2 Phi(mean/sd) - 1) + 2 sd phi(mean/sd)``."""
    z = mean / sd
    return mean * (2 * torch.special.ndtr(z) - 1) + 2 * sd * torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def gaussian_mixture_crps(preds: Tensor, target: Tensor, noise_var: Tensor) -> Tensor:
    """CRPS of ``(1/M) sum_m N(preds_m, noise_var)`` per row, in closed form.

    ``CRPS = E|X - y| - E|X - X'| / 2`` with ``X, X'`` independent draws of the mixture;
    both expectations are means of ``E|N(mu, v)|`` (Grimit et al., 2006).

    Args:
        preds: ``(N, M)`` mixture means.
        target: ``(N,)`` observations.
        noise_var: ``(N,)`` positive component variance.

    Returns:
        ``(N,)`` CRPS values, float32.
    """
    mu, y = preds.float(), target.float()
    sd = noise_var.float().sqrt()[:, None]
    first = _normal_abs_moment(y[:, None] - mu, sd).mean(1)
    second = _normal_abs_moment(mu[:, :, None] - mu[:, None, :], math.sqrt(2.0) * sd[:, :, None]).mean((1, 2))
    return first - 0.5 * second


class EnsembleCRPS(ContinuousRankedProbabilityScore):
    """Continuous ranked probability score of member (or posterior-sample) predictions.

    Lower is better; in the target's units. Without ``noise_var`` it is torchmetrics'
    ``ContinuousRankedProbabilityScore``, the CRPS of the members' empirical distribution:
    ``mean_m |x_m - y| - sum_{m, m'} |x_m - x_m'| / (2 M^2)``. Additions, so that every
    regression module can log it: one member (``M = 1``, which torchmetrics refuses) scores
    ``|x - y|``, the CRPS of a point mass (a single network reports its MAE); ``(B, M, 1)``
    and multi-output ``(B, M, D)`` inputs (each output one forecast); autocast disabled; a
    0-d result. With ``noise_var`` ``sigma^2`` it scores the predictive a posterior sampler
    means, the mixture ``(1/M) sum_m N(x_m, sigma^2)``, in closed form (``gaussian_mixture_crps``;
    it tends to the empirical CRPS as ``sigma^2 -> 0``).

    Args:
        validate_args: check ``noise_var > 0`` (costs a device sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``preds`` ``(B, M)``: batch, members; ``(B, M, 1)`` for a ``(B,)`` target, or
          ``(B, M, *)`` for a ``(B, *)`` target; ``target`` ``(B,)`` or ``(B, *)``; ``noise_var``
          (optional) a scalar or broadcastable to ``target``.
        - Output: a 0-d tensor (target units).

    Example:
        >>> metric = EnsembleCRPS()
        >>> metric.update(torch.tensor([[0.0, 2.0]]), torch.tensor([0.0]))  # (B=1, M=2)
        >>> metric.compute()  # (|0 - 0| + |2 - 0|) / 2 - (|0 - 2| + |2 - 0|) / (2 * 4)
        tensor(0.5000)
    """

    def __init__(self, validate_args: bool = True, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.validate_args = validate_args

    def update(self, preds: Tensor, target: Tensor, noise_var: Tensor | float | None = None) -> None:
        """Accumulate a batch.

        Args:
            preds: member predictions ``(B, M)``, ``(B, M, 1)`` (for a ``(B,)`` target) or
                ``(B, M, *target.shape[1:])``.
            target: observations ``(B,)`` or ``(B, ...)``.
            noise_var: observation-noise variance of a Gaussian around each member, a scalar
                or broadcastable to ``target``; ``None`` for the members' empirical distribution.
        """
        if preds.ndim == target.ndim + 2 and preds.shape[-1] == 1:
            preds = preds[..., 0]
        if preds.ndim != target.ndim + 1 or (preds.shape[0], *preds.shape[2:]) != target.shape:
            expected = (target.shape[0], "members", *target.shape[1:])
            raise ValueError(f"Expected member predictions shaped {expected} for a target shaped"
                             f" {tuple(target.shape)}, got {tuple(preds.shape)}.")
        var = None if noise_var is None else _variance(noise_var, target, self.validate_args, "noise_var")
        with torch.autocast(preds.device.type, enabled=False):
            x = preds.float().movedim(1, -1).reshape(-1, preds.shape[1])  # (B * D, M)
            y = target.float().reshape(-1)
            if var is not None:
                self.score += gaussian_mixture_crps(x, y, var.reshape(-1)).sum()
                self.total += y.numel()
            elif x.shape[1] == 1:
                self.score += (x[:, 0] - y).abs().sum()
                self.total += y.numel()
            else:
                super().update(x, y)

    def compute(self) -> Tensor:
        """Mean CRPS over all accumulated forecasts (0-d)."""
        return (self.score / self.total).reshape(())


_ID_CORRECT, _ID_WRONG, _OOD = 0, 1, 2
#: Whose argmax is ``VarROC``'s predicted class.
VARROC_PREDICTIONS = ("predictive_mean", "map")


class VarROC(Metric):
    """AUROC of sample variance as a detector of misclassified or OOD points.

    The predicted class is the argmax of the predictive mean ``mean_s p_s``
    (``prediction="predictive_mean"``) or of the trained network's own output
    (``prediction="map"``, passed to ``update`` as ``map_outputs``: the choice of the
    LinearSampling paper's code, which scores GLM samples around the MAP prediction). It
    decides which points count as correctly classified and which class is scored; the
    score is ``var_s p_s(predicted class)`` (population variance, ``ddof=0``; AUROC does
    not depend on that scale), or with ``score="sum"`` the variance summed over classes.
    Negatives are always correctly classified in-distribution points; positives are:

    * ``mode="id"``: misclassified in-distribution points (OOD rows are ignored);
    * ``mode="ood"``: OOD points (misclassified ID rows are ignored).

    Both modes accept the same stream of updates, so an ``id`` and an ``ood`` instance
    can be fed identical calls. Every row is kept (``cat`` states) and split at
    compute. When the kept rows hold only one label (say no misclassified point in a
    small validation set), ``compute`` warns and returns ``nan`` instead of raising,
    so that a training loop logging this metric goes on.

    Args:
        mode: ``id`` or ``ood``.
        input_kind: ``logits`` or ``probs``.
        score: ``predicted`` (variance of the predicted-class probability) or ``sum``.
        prediction: whose argmax is the predicted class: ``predictive_mean`` or ``map``.
        validate_args: check target range and probability range (costs a device sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``outputs`` ``(B, S, C)``: batch, samples (members, ``S >= 2``), classes;
          ``target`` ``(B,)``; ``is_ood`` a bool or ``(B,)``; ``map_outputs`` ``(B, C)``.
        - Output: a 0-d tensor in ``[0, 1]`` (``nan`` when one label is missing).

    Example:
        >>> probs = torch.tensor([[[0.9, 0.1], [0.9, 0.1]], [[0.9, 0.1], [0.1, 0.9]]])  # (B=2, S=2, C=2)
        >>> metric = VarROC(mode="id", input_kind="probs", prediction="map")
        >>> metric.update(probs, torch.tensor([0, 1]), map_outputs=torch.tensor([[2.0, 0.0], [1.0, 0.0]]))
        >>> metric.compute()  # MAP says class 0 twice: row 2 is wrong and the only one with variance
        tensor(1.)
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(
        self,
        mode: Literal["id", "ood"] = "id",
        input_kind: InputKind = "logits",
        score: Literal["predicted", "sum"] = "predicted",
        prediction: Literal["predictive_mean", "map"] = "predictive_mean",
        validate_args: bool = True,
        **kwargs,  # noqa: ANN003
    ) -> None:
        if mode not in ("id", "ood"):
            raise ValueError(f"Unknown mode {mode!r}; use 'id' or 'ood'.")
        if score not in ("predicted", "sum"):
            raise ValueError(f"Unknown score {score!r}; use 'predicted' or 'sum'.")
        if prediction not in VARROC_PREDICTIONS:
            raise ValueError(f"Unknown prediction {prediction!r}; use 'predictive_mean' or 'map'.")
        _check_kind(input_kind)
        super().__init__(**kwargs)
        self.mode, self.input_kind, self.score, self.prediction = mode, input_kind, score, prediction
        self.validate_args = validate_args
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("groups", default=[], dist_reduce_fx="cat")

    def update(self, outputs: Tensor, target: Tensor | None = None, is_ood: Tensor | bool = False,
               map_outputs: Tensor | None = None) -> None:
        """Accumulate a batch of in-distribution and/or OOD points.

        Args:
            outputs: ``(B, S, C)`` per-sample logits or probabilities, ``S >= 2``.
            target: ``(B,)`` class labels; values on OOD rows are ignored (any integer,
                e.g. ``-1``). May be ``None`` when every row is OOD.
            is_ood: ``True``/``False`` for the whole batch, or a ``(B,)`` bool mask.
            map_outputs: ``(B, C)`` output of the trained network (logits or
                probabilities: only its argmax is used); required with ``prediction="map"``
                and ignored otherwise.
        """
        if outputs.ndim != 3 or outputs.shape[1] < 2 or outputs.shape[-1] < 2:
            raise ValueError(
                "VarROC needs per-sample outputs (batch, samples >= 2, classes >= 2), "
                f"got {tuple(outputs.shape)}."
            )
        b = outputs.shape[0]
        ood = torch.as_tensor(is_ood, device=outputs.device)
        if ood.dtype != torch.bool or ood.ndim not in (0, 1) or (ood.ndim == 1 and ood.shape[0] != b):
            raise ValueError(
                f"Expected is_ood to be a bool or a bool tensor shaped ({b},), "
                f"got {ood.dtype} shaped {tuple(ood.shape)}."
            )
        ood = ood.expand(b)
        if target is None:
            if not bool(ood.all()):
                raise ValueError("target is required for in-distribution rows (is_ood False).")
            target = torch.zeros(b, dtype=torch.long, device=outputs.device)
        _check_target(target, outputs, self.validate_args, skip=ood)
        _check_probs(outputs, self.input_kind, self.validate_args)
        if self.prediction == "map":
            if map_outputs is None:
                raise ValueError("VarROC(prediction='map') needs map_outputs, the trained network's"
                                 " (B, C) output.")
            if map_outputs.shape != (b, outputs.shape[-1]):
                raise ValueError(f"Expected map_outputs shaped ({b}, {outputs.shape[-1]}), got"
                                 f" {tuple(map_outputs.shape)}.")
        with torch.autocast(outputs.device.type, enabled=False):
            probs = sample_probs(outputs, self.input_kind)  # (B, S, C)
            if self.prediction == "map":
                predicted = map_outputs.float().argmax(-1).to(probs.device)
            else:
                predicted = probs.mean(1).argmax(-1)
            if self.score == "sum":
                scores = probs.var(1, correction=0).sum(-1)
            else:
                index = predicted[:, None, None].expand(-1, probs.shape[1], 1)
                scores = probs.gather(-1, index).squeeze(-1).var(1, correction=0)
        groups = torch.where(predicted == target, _ID_CORRECT, _ID_WRONG)
        groups = torch.where(ood, _OOD, groups)
        self.scores.append(scores)
        self.groups.append(groups.long())

    def compute(self) -> Tensor:
        """AUROC in ``[0, 1]`` (``nan`` with a warning when one label is missing)."""
        scores = dim_zero_cat(self.scores) if len(self.scores) else torch.zeros(0, device=self.device)
        groups = dim_zero_cat(self.groups) if len(self.groups) else torch.zeros(0, device=self.device)
        positive = _ID_WRONG if self.mode == "id" else _OOD
        ignored = _OOD if self.mode == "id" else _ID_WRONG
        keep = groups != ignored
        scores, labels = scores[keep], (groups[keep] == positive).long()
        n_pos, n = int(labels.sum()), labels.numel()
        if n_pos == 0 or n_pos == n:
            rank_zero_warn(
                f"VarROC(mode={self.mode!r}) needs both positives and correctly classified ID "
                f"negatives; got {n_pos} positives of {n} rows. Returning nan."
            )
            return torch.tensor(float("nan"), device=self.device)
        return binary_auroc(scores, labels, validate_args=False)
