"""Out-of-distribution scores, OOD detection metrics and selective-prediction metrics.

Three groups, torch and torchmetrics only (no Lightning):

* **Scores** from member outputs ``(n, members, C)`` (members on axis 1, see
  ``ripieno.framework.members``; one model passes ``members = 1``), one value per row, higher
  meaning more uncertain / more likely out-of-distribution: ``max_softmax_uncertainty``,
  ``predictive_entropy``, ``energy_score`` (from logits), ``mutual_information``,
  ``member_disagreement`` and ``member_variance``. They are computed in float64 under disabled
  autocast and returned in the input's dtype promoted to at least float32.
* **Detection** of OOD rows from a score (label ``1`` = OOD = positive): ``fpr_at_tpr``
  (FPR95 by default), ``ood_auroc``, ``aupr_out`` and ``aupr_in``, and the ``Metric`` classes
  ``FPRAtTPR``, ``OODAUROC``, ``AUPROut``, ``AUPRIn`` that accumulate scores and labels over
  batches (``cat`` states, gathered across DDP ranks) and compute the same function on all rows.
* **Selective prediction** (misclassification detection) from an uncertainty and a per-row
  loss (``1.0`` for a misclassified row, ``0.0`` otherwise, or any real loss):
  ``risk_coverage_curve``, ``risk_at_coverage``, ``aurc`` / ``AURC`` and ``augrc`` / ``AUGRC``.

Bad input raises ``OODInputError`` (a ``RipienoInputError``, so a ``ValueError``) with one line
naming the input, the problem and the fix.

Example:
    >>> probs = torch.tensor([[[0.7, 0.2, 0.1], [0.7, 0.2, 0.1]], [[0.6, 0.3, 0.1], [0.0, 0.3, 0.7]]])
    >>> max_softmax_uncertainty(probs)  # 1 - max of the mean (0.7, 0.2, 0.1) and (0.3, 0.3, 0.4)
    tensor([0.3000, 0.6000])
    >>> fpr_at_tpr(torch.tensor([0.9, 0.8, 0.7, 0.1]), torch.tensor([1, 0, 1, 0]), tpr=0.95)
    tensor(0.5000)
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.functional.classification import binary_auroc, binary_average_precision
from torchmetrics.utilities import dim_zero_cat

from ripieno.framework.errors import RipienoInputError

__all__ = [
    "AUGRC",
    "AUPRIn",
    "AUPROut",
    "AURC",
    "FPRAtTPR",
    "OODAUROC",
    "OODInputError",
    "augrc",
    "aupr_in",
    "aupr_out",
    "aurc",
    "energy_score",
    "fpr_at_tpr",
    "max_softmax_uncertainty",
    "member_disagreement",
    "member_variance",
    "mutual_information",
    "ood_auroc",
    "predictive_entropy",
    "risk_at_coverage",
    "risk_coverage_curve",
]

#: How far a row of probabilities may sum from 1 (and a probability exceed 1).
PROBABILITY_TOLERANCE = 1e-4


class OODInputError(RipienoInputError):
    """Bad input to a score or metric of ``ripieno.framework.metrics.ood``; one line: input, problem, fix.

    Example:
        >>> try:
        ...     predictive_entropy(torch.ones(4, 3))
        ... except OODInputError as error:
        ...     print(error)
        probs: expected shape (n, members, classes) with members >= 1 and classes >= 2, got (4, 3); \
for a single model add the members axis: probs.unsqueeze(1).
    """


def _problem(name: str, problem: str, fix: str) -> str:
    return f"{name}: {problem}; {fix.rstrip('.')}."


def _out_dtype(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


# ----------------------------------------------------------------------------------------- input checks
def _check_finite(x: Tensor, name: str) -> None:
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        raise OODInputError(_problem(name, f"{bad} of {x.numel()} values are NaN or infinite",
                                     "drop or fix those rows first"))


def _check_members(x: Tensor, name: str, validate_args: bool, probabilities: bool) -> None:
    """Check member outputs ``(n, members, classes)``; probabilities also in [0, 1], rows summing to 1."""
    if x.ndim != 3 or x.shape[1] < 1 or x.shape[2] < 2:
        fix = (f"for a single model add the members axis: {name}.unsqueeze(1)" if x.ndim == 2
               else f"reshape {name} to (n, members, classes)")
        raise OODInputError(_problem(name, "expected shape (n, members, classes) with members >= 1 and "
                                     f"classes >= 2, got {tuple(x.shape)}", fix))
    if not x.is_floating_point():
        raise OODInputError(_problem(name, f"expected a floating-point tensor, got {x.dtype}",
                                     f"pass {name}.float()"))
    if not validate_args or x.numel() == 0:
        return
    _check_finite(x, name)
    if probabilities:
        low, high = float(x.min()), float(x.max())
        if low < 0 or high > 1 + PROBABILITY_TOLERANCE:
            raise OODInputError(_problem(name, f"probabilities must lie in [0, 1], got values in "
                                         f"[{low:.4g}, {high:.4g}]",
                                         "pass softmax probabilities (or logits to energy_score)"))
        sums = x.detach().double().sum(-1)
        off = (sums - 1).abs()
        if bool((off > PROBABILITY_TOLERANCE).any()):
            bad = int((off > PROBABILITY_TOLERANCE).sum())
            worst = float(sums.flatten()[off.flatten().argmax()])
            raise OODInputError(_problem(name, f"each (row, member) must sum to 1 within "
                                         f"{PROBABILITY_TOLERANCE:g}, but {bad} of {sums.numel()} do "
                                         f"(worst sums to {worst:.6g})",
                                         "normalise over the last axis (softmax of the logits)"))


def _check_scores_labels(scores: Tensor, labels: Tensor, validate_args: bool) -> None:
    """Check 1-d scores and 0/1 labels of the same length."""
    if scores.ndim != 1:
        raise OODInputError(_problem("scores", f"expected a 1-d tensor (one score per row), got shape "
                                     f"{tuple(scores.shape)}", "pass one score per row, e.g. "
                                     "max_softmax_uncertainty(probs)"))
    if labels.shape != scores.shape:
        raise OODInputError(_problem("labels", f"expected shape ({scores.shape[0]},) like the scores, got "
                                     f"{tuple(labels.shape)}",
                                     "pass one label per score (1 = OOD, 0 = in-distribution)"))
    if scores.is_complex() or scores.dtype == torch.bool:
        raise OODInputError(_problem("scores", f"expected real scores, got {scores.dtype}",
                                     "pass scores.float()"))
    if not validate_args or scores.numel() == 0:
        return
    _check_finite(scores, "scores")
    bad = labels[(labels != 0) & (labels != 1)]
    if bad.numel():
        raise OODInputError(_problem("labels", f"values must be 0 (in-distribution) or 1 (OOD), found "
                                     f"{bad[0].item()!r}", "map the labels to 0/1 with 1 = OOD"))


def _check_both_kinds(labels: Tensor, metric: str) -> None:
    """A ranking metric needs OOD and in-distribution rows."""
    n, positives = labels.numel(), int((labels == 1).sum())
    if positives == 0:
        raise OODInputError(_problem("labels", f"none of the {n} rows is OOD (1)",
                                     f"{metric} needs OOD and in-distribution rows, so add OOD rows"))
    if positives == n:
        raise OODInputError(_problem("labels", f"all {n} rows are OOD (1)", f"{metric} needs OOD and "
                                     "in-distribution rows, so add in-distribution (0) rows"))


def _check_selective(uncertainty: Tensor, loss: Tensor, validate_args: bool) -> None:
    """Check a 1-d uncertainty and a float loss of the same length, at least one row."""
    if uncertainty.ndim != 1:
        raise OODInputError(_problem("uncertainty", "expected a 1-d tensor (one score per row, higher = "
                                     f"less certain), got shape {tuple(uncertainty.shape)}",
                                     "pass one score per row, e.g. max_softmax_uncertainty(probs)"))
    if loss.dtype == torch.bool:
        raise OODInputError(_problem("loss", "got a bool tensor, which could mean errors or correctness",
                                     "pass float losses, e.g. (~correct).float() or "
                                     "(pred != target).float()"))
    if loss.shape != uncertainty.shape:
        raise OODInputError(_problem("loss", f"expected shape ({uncertainty.shape[0]},) like the "
                                     f"uncertainty, got {tuple(loss.shape)}", "pass one loss per row "
                                     "(e.g. 1.0 for a misclassified row, 0.0 otherwise)"))
    if uncertainty.is_complex() or uncertainty.dtype == torch.bool:
        raise OODInputError(_problem("uncertainty", f"expected real scores, got {uncertainty.dtype}",
                                     "pass uncertainty.float()"))
    if uncertainty.numel() == 0:
        raise OODInputError(_problem("uncertainty", "no rows", "pass at least one row"))
    if validate_args:
        _check_finite(uncertainty, "uncertainty")
        _check_finite(loss, "loss")


def _check_fraction(value: float, name: str, example: str) -> None:
    if not (isinstance(value, int | float) and 0 < value <= 1):
        raise OODInputError(_problem(name, f"must lie in (0, 1], got {value!r}", f"pass e.g. {example}"))


# ------------------------------------------------------------------------------------------------ scores
def _entropy(p: Tensor) -> Tensor:
    """Shannon entropy (nats) over the last axis, with ``0 log 0 = 0``."""
    return -torch.special.xlogy(p, p).sum(-1)


def max_softmax_uncertainty(probs: Tensor, *, validate_args: bool = True) -> Tensor:
    """``1 - max_c pbar_c`` of the mean member probability ``pbar`` (MSP, Hendrycks & Gimpel 2017).

    Args:
        probs: member probabilities ``(n, members, C)``.
        validate_args: check for NaN and that every member row is a distribution (a host sync).

    Returns:
        ``(n,)`` values in ``[0, 1 - 1/C]``; higher is more uncertain.

    Example:
        >>> max_softmax_uncertainty(torch.tensor([[[0.9, 0.1], [0.5, 0.5]]]))  # 1 - (0.9 + 0.5) / 2
        tensor([0.3000])
    """
    _check_members(probs, "probs", validate_args, probabilities=True)
    with torch.autocast(probs.device.type, enabled=False):
        mean = probs.double().mean(1)
        return (1 - mean.max(-1).values).to(_out_dtype(probs))


def predictive_entropy(probs: Tensor, *, validate_args: bool = True) -> Tensor:
    """Entropy ``H(pbar) = -sum_c pbar_c log pbar_c`` (nats) of the mean member probability.

    Args:
        probs: member probabilities ``(n, members, C)``.
        validate_args: check for NaN and that every member row is a distribution (a host sync).

    Returns:
        ``(n,)`` values in ``[0, log C]``; higher is more uncertain.

    Example:
        >>> predictive_entropy(torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]))  # H(0.5, 0.5) = log 2
        tensor([0.6931])
    """
    _check_members(probs, "probs", validate_args, probabilities=True)
    with torch.autocast(probs.device.type, enabled=False):
        return _entropy(probs.double().mean(1)).to(_out_dtype(probs))


def energy_score(logits: Tensor, temperature: float = 1.0, *, validate_args: bool = True) -> Tensor:
    """Free energy ``E(x) = -T logsumexp_c(fbar_c(x) / T)`` of the mean member logit ``fbar`` (Liu 2020).

    Sign convention: this returns Liu et al.'s energy ``E`` itself. In-distribution inputs get
    *low* energy, so ``E`` is already "higher = more OOD", like the other scores here; Liu et
    al.'s detector thresholds the negative energy ``-E`` as an in-distribution score, so their
    ``-E`` is ``-energy_score(...)``. For members the logits are averaged first
    (``fbar = mean_m f_m``), not the member energies (``logsumexp`` is convex, so those differ).

    Args:
        logits: member logits ``(n, members, C)``.
        temperature: ``T > 0`` (Liu et al. use ``T = 1``).
        validate_args: check for NaN and infinities (a host sync).

    Returns:
        ``(n,)`` energies; higher is more likely OOD.

    Example:
        >>> energy_score(torch.tensor([[[2.0, 0.0], [0.0, 0.0]]]))  # fbar = (1, 0): -log(e + 1)
        tensor([-1.3133])
    """
    _check_members(logits, "logits", validate_args, probabilities=False)
    if not (isinstance(temperature, int | float) and temperature > 0 and math.isfinite(temperature)):
        raise OODInputError(_problem("temperature", f"must be positive and finite, got {temperature!r}",
                                     "pass e.g. 1.0 (Liu et al. 2020)"))
    with torch.autocast(logits.device.type, enabled=False):
        mean = logits.double().mean(1)
        return (-temperature * torch.logsumexp(mean / temperature, dim=-1)).to(_out_dtype(logits))


def mutual_information(probs: Tensor, *, validate_args: bool = True) -> Tensor:
    """Epistemic part of the predictive entropy, ``H(pbar) - mean_m H(p_m)`` (nats; BALD).

    Non-negative by the concavity of entropy (float rounding below zero is clamped to 0); exactly
    0 for one member, and 0 whenever the members agree.

    Args:
        probs: member probabilities ``(n, members, C)``.
        validate_args: check for NaN and that every member row is a distribution (a host sync).

    Returns:
        ``(n,)`` values in ``[0, log C]``; higher is more (epistemically) uncertain.

    Example:
        >>> mutual_information(torch.tensor([[[1.0, 0.0], [0.0, 1.0]], [[0.5, 0.5], [0.5, 0.5]]]))
        tensor([0.6931, 0.0000])
    """
    _check_members(probs, "probs", validate_args, probabilities=True)
    with torch.autocast(probs.device.type, enabled=False):
        p = probs.double()
        return (_entropy(p.mean(1)) - _entropy(p).mean(1)).clamp_min(0).to(_out_dtype(probs))


def member_disagreement(probs: Tensor, *, validate_args: bool = True) -> Tensor:
    """Fraction of members whose argmax differs from the ensemble's (the argmax of ``pbar``).

    Ties in an argmax go to the lowest class index (``torch.argmax``). One member gives 0.
    (``ripieno.framework.metrics.MemberDisagreement`` is a different quantity: the fraction of
    member *pairs* that disagree, averaged over rows.)

    Args:
        probs: member probabilities ``(n, members, C)``.
        validate_args: check for NaN and that every member row is a distribution (a host sync).

    Returns:
        ``(n,)`` fractions in ``[0, 1 - 1/members]``.

    Example:
        >>> probs = torch.tensor([[[0.9, 0.1], [0.8, 0.2], [0.3, 0.7]]])  # votes 0, 0, 1; pbar votes 0
        >>> member_disagreement(probs)
        tensor([0.3333])
    """
    _check_members(probs, "probs", validate_args, probabilities=True)
    with torch.autocast(probs.device.type, enabled=False):
        p = probs.double()
        ensemble = p.mean(1).argmax(-1)  # (n,)
        differs = p.argmax(-1) != ensemble[:, None]  # (n, members)
        return differs.double().mean(1).to(_out_dtype(probs))


def member_variance(preds: Tensor, *, validate_args: bool = True) -> Tensor:
    """Across-member variance (population, ``ddof = 0``) of regression predictions or probabilities.

    Regression predictions ``(n, members)`` give ``var_m y_m``; probabilities
    ``(n, members, C)`` give ``mean_c var_m p_mc``, the mean over classes of the across-member
    variance. One member gives 0.

    Args:
        preds: member regression predictions ``(n, members)`` or member probabilities
            ``(n, members, C)``.
        validate_args: check for NaN (and for probabilities that every member row is a
            distribution; a host sync).

    Returns:
        ``(n,)`` variances; higher is more uncertain.

    Example:
        >>> member_variance(torch.tensor([[1.0, 3.0], [2.0, 2.0]]))  # ((1 - 2)^2 + (3 - 2)^2) / 2
        tensor([1., 0.])
        >>> member_variance(torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]))  # each class: var(1, 0) = 0.25
        tensor([0.2500])
    """
    if preds.ndim == 2:
        if preds.shape[1] < 1 or not preds.is_floating_point():
            raise OODInputError(_problem("preds", f"expected floating-point member predictions (n, members) "
                                         f"with members >= 1, got {preds.dtype} shaped {tuple(preds.shape)}",
                                         "pass preds.float() with the members on axis 1"))
        if validate_args and preds.numel():
            _check_finite(preds, "preds")
        with torch.autocast(preds.device.type, enabled=False):
            return preds.double().var(1, correction=0).to(_out_dtype(preds))
    if preds.ndim != 3:
        raise OODInputError(_problem("preds", "expected regression predictions (n, members) or probabilities "
                                     f"(n, members, classes), got shape {tuple(preds.shape)}",
                                     "put the members on axis 1"))
    _check_members(preds, "preds", validate_args, probabilities=True)
    with torch.autocast(preds.device.type, enabled=False):
        return preds.double().var(1, correction=0).mean(-1).to(_out_dtype(preds))


# --------------------------------------------------------------------------------------------- detection
def _dense_ranks(scores: Tensor) -> Tensor:
    """Scores mapped to ``[0, 1]`` by dense rank, float64: same order, same ties.

    torchmetrics' binary curves pass scores outside ``[0, 1]`` through a sigmoid (decided per
    call), which in float saturates and merges distinct large scores into ties; ranks keep the
    ordering exact.
    """
    unique, inverse = torch.unique(scores, sorted=True, return_inverse=True)
    return inverse.double() / max(unique.numel() - 1, 1)


def _roc_counts(scores: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """False- and true-positive counts at every distinct threshold, highest first, after ``(0, 0)``.

    A row counts as positive (OOD) at threshold ``t`` when its score is ``>= t``: the points of
    ``sklearn.metrics.roc_curve(..., drop_intermediate=False)``.
    """
    s = scores.double()
    order = torch.argsort(s, descending=True, stable=True)
    s, y = s[order], labels[order].long()
    ends = torch.nonzero(s[1:] != s[:-1]).flatten()
    ends = torch.cat([ends, ends.new_tensor([s.numel() - 1])])
    tps = torch.cumsum(y, 0)[ends]
    fps = ends + 1 - tps
    zero = tps.new_zeros(1)
    return torch.cat([zero, fps]), torch.cat([zero, tps])


def fpr_at_tpr(scores: Tensor, labels: Tensor, tpr: float = 0.95, *, validate_args: bool = True) -> Tensor:
    """False-positive rate at the first threshold whose true-positive rate reaches ``tpr`` (FPR95).

    Convention: the ROC curve has a point at every distinct score (rows scoring ``>= t`` are
    flagged OOD), and the result is the smallest FPR among the points with ``TPR >= tpr``, which
    is the FPR at the first such point when the threshold is lowered from the top. This is
    ``fpr[tpr_curve >= tpr].min()`` on ``sklearn.metrics.roc_curve(labels, scores,
    drop_intermediate=False)``; with sklearn's default ``drop_intermediate=True`` collinear
    points are dropped and the same rule can land on a later point with a higher FPR. TPR is
    compared as ``true positives / positives`` in float64, as sklearn computes it.

    Args:
        scores: ``(n,)`` scores, higher = more likely OOD.
        labels: ``(n,)`` ``1`` for OOD (positive) rows, ``0`` for in-distribution rows.
        tpr: target true-positive rate in ``(0, 1]``.
        validate_args: check scores for NaN and labels for values other than 0/1 (a host sync).

    Returns:
        A 0-d float32 tensor in ``[0, 1]``; lower is better.

    Example:
        >>> scores, labels = torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.tensor([1, 0, 1, 0])
        >>> fpr_at_tpr(scores, labels, tpr=0.5), fpr_at_tpr(scores, labels, tpr=1.0)
        (tensor(0.), tensor(0.5000))
    """
    _check_fraction(tpr, "tpr", "0.95 for FPR95")
    _check_scores_labels(scores, labels, validate_args)
    _check_both_kinds(labels, "fpr_at_tpr")
    fps, tps = _roc_counts(scores.detach(), labels.detach())
    reached = tps.double() / tps[-1].double() >= tpr
    first = torch.argmax(reached.to(torch.uint8))  # the first True: fps is non-decreasing
    return (fps[first].double() / fps[-1].double()).float()


def ood_auroc(scores: Tensor, labels: Tensor, *, validate_args: bool = True) -> Tensor:
    """Area under the ROC curve of ``scores`` for OOD (label 1) against in-distribution rows.

    torchmetrics' ``binary_auroc`` on the scores' dense ranks (order and ties kept; ties count
    half, as in ``sklearn.metrics.roc_auc_score``).

    Args:
        scores: ``(n,)`` scores, higher = more likely OOD.
        labels: ``(n,)`` ``1`` for OOD rows, ``0`` for in-distribution rows.
        validate_args: check scores for NaN and labels for values other than 0/1 (a host sync).

    Returns:
        A 0-d float32 tensor in ``[0, 1]``; higher is better.

    Example:
        >>> ood_auroc(torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.tensor([1, 0, 1, 0]))  # 3 of 4 pairs
        tensor(0.7500)
    """
    _check_scores_labels(scores, labels, validate_args)
    _check_both_kinds(labels, "ood_auroc")
    with torch.autocast(scores.device.type, enabled=False):
        ranks = _dense_ranks(scores.detach())
        return binary_auroc(ranks, labels.detach().long(), validate_args=False).float()


def aupr_out(scores: Tensor, labels: Tensor, *, validate_args: bool = True) -> Tensor:
    """AUPR-out: average precision with the OOD rows (label 1) as positives, ranked by ``scores``.

    torchmetrics' ``binary_average_precision`` (``sum_k (R_k - R_{k-1}) P_k`` over distinct
    thresholds, as ``sklearn.metrics.average_precision_score``) on the scores' dense ranks.

    Args:
        scores: ``(n,)`` scores, higher = more likely OOD.
        labels: ``(n,)`` ``1`` for OOD rows, ``0`` for in-distribution rows.
        validate_args: check scores for NaN and labels for values other than 0/1 (a host sync).

    Returns:
        A 0-d float32 tensor in ``[0, 1]``; higher is better.

    Example:
        >>> aupr_out(torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.tensor([1, 0, 1, 0]))  # (1 + 2/3) / 2
        tensor(0.8333)
    """
    _check_scores_labels(scores, labels, validate_args)
    _check_both_kinds(labels, "aupr_out")
    with torch.autocast(scores.device.type, enabled=False):
        ranks = _dense_ranks(scores.detach())
        return binary_average_precision(ranks, labels.detach().long(), validate_args=False).float()


def aupr_in(scores: Tensor, labels: Tensor, *, validate_args: bool = True) -> Tensor:
    """AUPR-in: average precision with the in-distribution rows (label 0) as positives, ranked by ``-scores``.

    Args:
        scores: ``(n,)`` scores, higher = more likely OOD.
        labels: ``(n,)`` ``1`` for OOD rows, ``0`` for in-distribution rows.
        validate_args: check scores for NaN and labels for values other than 0/1 (a host sync).

    Returns:
        A 0-d float32 tensor in ``[0, 1]``; higher is better.

    Example:
        >>> aupr_in(torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.tensor([1, 0, 1, 0]))  # ID ranks 1, 3
        tensor(0.8333)
    """
    _check_scores_labels(scores, labels, validate_args)
    _check_both_kinds(labels, "aupr_in")
    with torch.autocast(scores.device.type, enabled=False):
        ranks = _dense_ranks(-scores.detach())
        return binary_average_precision(ranks, 1 - labels.detach().long(), validate_args=False).float()


class _ScoreLabelMetric(Metric):
    """Accumulates ``(n,)`` scores and 0/1 labels (``cat`` states) and computes ``_function`` on all rows."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, validate_args: bool = True, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.validate_args = validate_args
        self.add_state("scores", default=[], dist_reduce_fx="cat")
        self.add_state("labels", default=[], dist_reduce_fx="cat")

    def update(self, scores: Tensor, labels: Tensor) -> None:
        """Accumulate a batch.

        Args:
            scores: ``(n,)`` scores, higher = more likely OOD.
            labels: ``(n,)`` ``1`` for OOD rows, ``0`` for in-distribution rows.
        """
        _check_scores_labels(scores, labels, self.validate_args)
        self.scores.append(scores.detach().double())
        self.labels.append(labels.detach().long())

    def _rows(self) -> tuple[Tensor, Tensor]:
        if not len(self.scores):
            raise OODInputError(_problem(type(self).__name__, "no rows were accumulated",
                                         "call update() with scores and labels before compute()"))
        return dim_zero_cat(self.scores), dim_zero_cat(self.labels)


class FPRAtTPR(_ScoreLabelMetric):
    """False-positive rate at the first threshold whose TPR reaches ``tpr`` (FPR95), over all batches.

    ``fpr_at_tpr`` on every accumulated row; see it for the convention (the smallest FPR among
    ROC points with ``TPR >= tpr``, every distinct score a point).

    Args:
        tpr: target true-positive rate in ``(0, 1]``.
        validate_args: check scores for NaN and labels for values other than 0/1 (a host sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``scores`` ``(n,)`` (higher = more likely OOD), ``labels`` ``(n,)`` (1 = OOD, 0 = ID).
        - Output: a 0-d float32 tensor in ``[0, 1]``.

    Example:
        >>> metric = FPRAtTPR(tpr=0.95)
        >>> metric.update(torch.tensor([4.0, 3.0]), torch.tensor([1, 0]))
        >>> metric.update(torch.tensor([2.0, 1.0]), torch.tensor([1, 0]))
        >>> metric.compute()  # TPR reaches 1 at threshold 2.0, where 1 of the 2 ID rows is flagged
        tensor(0.5000)
    """

    higher_is_better = False

    def __init__(self, tpr: float = 0.95, validate_args: bool = True, **kwargs) -> None:  # noqa: ANN003
        _check_fraction(tpr, "tpr", "0.95 for FPR95")
        super().__init__(validate_args=validate_args, **kwargs)
        self.tpr = tpr

    def compute(self) -> Tensor:
        """FPR at the target TPR over all accumulated rows."""
        return fpr_at_tpr(*self._rows(), tpr=self.tpr, validate_args=False)


class OODAUROC(_ScoreLabelMetric):
    """AUROC of OOD (label 1) against in-distribution rows over all batches (``ood_auroc``).

    Args:
        validate_args: check scores for NaN and labels for values other than 0/1 (a host sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``scores`` ``(n,)`` (higher = more likely OOD), ``labels`` ``(n,)`` (1 = OOD, 0 = ID).
        - Output: a 0-d float32 tensor in ``[0, 1]``.

    Example:
        >>> metric = OODAUROC()
        >>> metric.update(torch.tensor([4.0, 3.0]), torch.tensor([1, 0]))
        >>> metric.update(torch.tensor([2.0, 1.0]), torch.tensor([1, 0]))
        >>> metric.compute()
        tensor(0.7500)
    """

    def compute(self) -> Tensor:
        """AUROC over all accumulated rows."""
        return ood_auroc(*self._rows(), validate_args=False)


class AUPROut(_ScoreLabelMetric):
    """Average precision with OOD rows (label 1) as positives, over all batches (``aupr_out``).

    Args:
        validate_args: check scores for NaN and labels for values other than 0/1 (a host sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``scores`` ``(n,)`` (higher = more likely OOD), ``labels`` ``(n,)`` (1 = OOD, 0 = ID).
        - Output: a 0-d float32 tensor in ``[0, 1]``.

    Example:
        >>> metric = AUPROut()
        >>> metric.update(torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.tensor([1, 0, 1, 0]))
        >>> metric.compute()
        tensor(0.8333)
    """

    def compute(self) -> Tensor:
        """AUPR-out over all accumulated rows."""
        return aupr_out(*self._rows(), validate_args=False)


class AUPRIn(_ScoreLabelMetric):
    """Average precision with in-distribution rows (label 0) positive, ranked by ``-scores`` (``aupr_in``).

    Args:
        validate_args: check scores for NaN and labels for values other than 0/1 (a host sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``scores`` ``(n,)`` (higher = more likely OOD), ``labels`` ``(n,)`` (1 = OOD, 0 = ID).
        - Output: a 0-d float32 tensor in ``[0, 1]``.

    Example:
        >>> metric = AUPRIn()
        >>> metric.update(torch.tensor([4.0, 3.0, 2.0, 1.0]), torch.tensor([1, 1, 0, 0]))
        >>> metric.compute()  # the ID rows rank first by -scores
        tensor(1.)
    """

    def compute(self) -> Tensor:
        """AUPR-in over all accumulated rows."""
        return aupr_in(*self._rows(), validate_args=False)


# ------------------------------------------------------------------------------------ selective prediction
def _cumulative_loss(uncertainty: Tensor, loss: Tensor) -> Tensor:
    """``L(k)``, the summed loss of the ``k`` most certain rows, ``k = 1..n``, float64; ties grouped.

    Rows are sorted by uncertainty ascending. Within a group of equal uncertainties every order
    is equally justified, so ``L`` runs linearly across the group from the sum before it to the
    sum after it: the expectation of ``L(k)`` over random orders of the tied rows.
    """
    u, losses = uncertainty.detach().double(), loss.detach().double()
    order = torch.argsort(u, stable=True)
    u, losses = u[order], losses[order]
    _, counts = torch.unique_consecutive(u, return_counts=True)
    group_end = torch.cumsum(losses, 0)[torch.cumsum(counts, 0) - 1]  # L at each group's last row
    group_start = torch.cat([group_end.new_zeros(1), group_end[:-1]])
    group = torch.repeat_interleave(torch.arange(counts.numel(), device=u.device), counts)
    first = torch.cumsum(counts, 0) - counts  # 0-based index of each group's first row
    step = (torch.arange(u.numel(), device=u.device) - first[group] + 1).double() / counts[group].double()
    return torch.lerp(group_start[group], group_end[group], step)


def risk_coverage_curve(uncertainty: Tensor, loss: Tensor, *,
                        validate_args: bool = True) -> tuple[Tensor, Tensor]:
    """Selective risk against coverage, accepting the most certain rows first (Geifman & El-Yaniv 2017).

    Rows are sorted by ``uncertainty`` ascending; at coverage ``k/n`` (``k = 1..n``) the
    selective risk is the mean loss of the ``k`` most certain rows. Ties: rows of equal
    uncertainty are grouped, and inside a group the summed loss grows linearly (each tied row
    counts with the group's mean loss), which is the expected curve over random orders of the
    tied rows; at a group's last row the value is exact. With confidences pass
    ``uncertainty = -confidence``.

    Args:
        uncertainty: ``(n,)`` scores, higher = less certain (rejected first).
        loss: ``(n,)`` float losses, e.g. ``(pred != target).float()`` for misclassification.
        validate_args: check both for NaN and infinities (a host sync).

    Returns:
        ``(coverage, risk)``, each ``(n,)`` float32: ``k / n`` and ``L(k) / k``.

    Example:
        >>> coverage, risk = risk_coverage_curve(torch.tensor([0.3, 0.1, 0.2]), torch.tensor([1.0, 0.0, 0.0]))
        >>> coverage, risk
        (tensor([0.3333, 0.6667, 1.0000]), tensor([0.0000, 0.0000, 0.3333]))
    """
    _check_selective(uncertainty, loss, validate_args)
    with torch.autocast(uncertainty.device.type, enabled=False):
        cumulative = _cumulative_loss(uncertainty, loss)
        k = torch.arange(1, cumulative.numel() + 1, device=cumulative.device, dtype=torch.float64)
        return (k / cumulative.numel()).float(), (cumulative / k).float()


def risk_at_coverage(uncertainty: Tensor, loss: Tensor, coverage: float, *,
                     validate_args: bool = True) -> Tensor:
    """Selective risk at the smallest ``k`` with ``k / n >= coverage`` on ``risk_coverage_curve``.

    Args:
        uncertainty: ``(n,)`` scores, higher = less certain (rejected first).
        loss: ``(n,)`` float losses.
        coverage: the fraction of rows to accept, in ``(0, 1]``.
        validate_args: check both for NaN and infinities (a host sync).

    Returns:
        A 0-d float32 tensor: the mean loss of the ``k`` most certain rows (ties as in the curve).

    Example:
        >>> u, loss = torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.tensor([0.0, 1.0, 0.0, 1.0])
        >>> risk_at_coverage(u, loss, 0.5), risk_at_coverage(u, loss, 0.6)  # k = 2: 1/2; k = 3: 1/3
        (tensor(0.5000), tensor(0.3333))
    """
    _check_fraction(coverage, "coverage", "0.8 to accept the 80% most certain rows")
    _check_selective(uncertainty, loss, validate_args)
    n = uncertainty.numel()
    k = min(max(math.ceil(coverage * n), 1), n)
    while k > 1 and (k - 1) / n >= coverage:  # guard float rounding in coverage * n
        k -= 1
    while k < n and k / n < coverage:
        k += 1
    with torch.autocast(uncertainty.device.type, enabled=False):
        return (_cumulative_loss(uncertainty, loss)[k - 1] / k).float()


def aurc(uncertainty: Tensor, loss: Tensor, *, validate_args: bool = True) -> Tensor:
    """Area under the risk-coverage curve, ``(1/n) sum_{k=1..n} L(k) / k`` (Geifman & El-Yaniv 2017).

    The common discrete form: the mean over ``k`` of the selective risk at coverage ``k / n``
    (``risk_coverage_curve``, ties grouped). For 0/1 losses with ``e`` errors the best ranking
    (all correct rows first) gives ``(1/n) sum_k max(0, k - (n - e)) / k``; a ranking that
    carries no information (all uncertainties equal) gives ``e / n``.

    Args:
        uncertainty: ``(n,)`` scores, higher = less certain (rejected first).
        loss: ``(n,)`` float losses.
        validate_args: check both for NaN and infinities (a host sync).

    Returns:
        A 0-d float32 tensor; lower is better.

    Example:
        >>> aurc(torch.tensor([0.3, 0.1, 0.2]), torch.tensor([1.0, 0.0, 0.0]))  # (0 + 0 + 1/3) / 3
        tensor(0.1111)
    """
    _check_selective(uncertainty, loss, validate_args)
    with torch.autocast(uncertainty.device.type, enabled=False):
        cumulative = _cumulative_loss(uncertainty, loss)
        k = torch.arange(1, cumulative.numel() + 1, device=cumulative.device, dtype=torch.float64)
        return (cumulative / k).mean().float()


def augrc(uncertainty: Tensor, loss: Tensor, *, validate_args: bool = True) -> Tensor:
    """Area under the generalized risk-coverage curve (Traub et al. 2024), as their code computes it.

    The generalized risk at coverage ``k / n`` is ``L(k) / n`` (the loss of the accepted rows
    over *all* rows, i.e. coverage times selective risk); AUGRC is the trapezoid under it from
    ``(0, 0)``, ``(1/n) sum_{k=1..n} (L(k-1) + L(k)) / (2n)`` with ``L(0) = 0`` (ties grouped as in
    ``risk_coverage_curve``), so that published values compare. For 0/1 losses with error rate
    ``r = e / n`` and failure AUROC ``A`` (uncertainty ranking errors above correct rows, ties half)
    it equals ``r - r^2/2 - r (1 - r) A``: the best ranking (``A = 1``) gives ``e^2 / (2 n^2)``, an
    uninformative one (``A = 1/2``) ``e / (2 n)``.

    Args:
        uncertainty: ``(n,)`` scores, higher = less certain (rejected first).
        loss: ``(n,)`` float losses.
        validate_args: check both for NaN and infinities (a host sync).

    Returns:
        A 0-d float32 tensor; lower is better.

    Example:
        >>> augrc(torch.tensor([0.3, 0.1, 0.2]), torch.tensor([1.0, 0.0, 0.0]))  # (0 + 0 + 1/2) / 3 / 3
        tensor(0.0556)
    """
    _check_selective(uncertainty, loss, validate_args)
    with torch.autocast(uncertainty.device.type, enabled=False):
        cumulative = _cumulative_loss(uncertainty, loss)
        n = cumulative.numel()
        return ((cumulative.mean() - cumulative[-1] / (2 * n)) / n).float()  # trapezoids from (0, 0)


class _SelectiveMetric(Metric):
    """Accumulates ``(n,)`` uncertainties and losses (``cat`` states) and computes on all rows."""

    is_differentiable = False
    higher_is_better = False
    full_state_update = False

    def __init__(self, validate_args: bool = True, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.validate_args = validate_args
        self.add_state("uncertainty", default=[], dist_reduce_fx="cat")
        self.add_state("loss", default=[], dist_reduce_fx="cat")

    def update(self, uncertainty: Tensor, loss: Tensor) -> None:
        """Accumulate a batch.

        Args:
            uncertainty: ``(n,)`` scores, higher = less certain.
            loss: ``(n,)`` float losses, e.g. ``(pred != target).float()``.
        """
        _check_selective(uncertainty, loss, self.validate_args)
        self.uncertainty.append(uncertainty.detach().double())
        self.loss.append(loss.detach().double())

    def _rows(self) -> tuple[Tensor, Tensor]:
        if not len(self.uncertainty):
            raise OODInputError(_problem(type(self).__name__, "no rows were accumulated",
                                         "call update() with uncertainty and loss before compute()"))
        return dim_zero_cat(self.uncertainty), dim_zero_cat(self.loss)


class AURC(_SelectiveMetric):
    """Area under the risk-coverage curve over all batches (``aurc``; lower is better).

    Args:
        validate_args: check uncertainty and loss for NaN and infinities (a host sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``uncertainty`` ``(n,)`` (higher = less certain), ``loss`` ``(n,)`` float losses.
        - Output: a 0-d float32 tensor.

    Example:
        >>> metric = AURC()
        >>> metric.update(torch.tensor([0.3, 0.1]), torch.tensor([1.0, 0.0]))
        >>> metric.update(torch.tensor([0.2]), torch.tensor([0.0]))
        >>> metric.compute()  # risks 0, 0, 1/3 at coverage 1/3, 2/3, 1
        tensor(0.1111)
    """

    def compute(self) -> Tensor:
        """AURC over all accumulated rows."""
        return aurc(*self._rows(), validate_args=False)


class AUGRC(_SelectiveMetric):
    """Area under the generalized risk-coverage curve over all batches (``augrc``; lower is better).

    Args:
        validate_args: check uncertainty and loss for NaN and infinities (a host sync).
        kwargs: passed to ``torchmetrics.Metric``.

    Shape:
        - Input: ``uncertainty`` ``(n,)`` (higher = less certain), ``loss`` ``(n,)`` float losses.
        - Output: a 0-d float32 tensor.

    Example:
        >>> metric = AUGRC()
        >>> metric.update(torch.tensor([0.3, 0.1]), torch.tensor([1.0, 0.0]))
        >>> metric.update(torch.tensor([0.2]), torch.tensor([0.0]))
        >>> metric.compute()  # generalized risks 0, 0, 1/3: trapezoids 0, 0, 1/6, over 3
        tensor(0.0556)
    """

    def compute(self) -> Tensor:
        """AUGRC over all accumulated rows."""
        return augrc(*self._rows(), validate_args=False)
