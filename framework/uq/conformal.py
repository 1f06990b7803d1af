r"""Split conformal prediction from any model's outputs: sets for classes, intervals for values.

A model of ripieno gives probabilities ``(n, C)`` for classification, and for regression a point
prediction ``(n,)``, optionally the members' spread ``(n,)`` or lower/upper quantile predictions. Split
conformal prediction turns these into sets or intervals that contain the truth with probability at
least ``1 - alpha`` on exchangeable data, whatever the model: a score ``s(x, y)`` (large when ``y`` fits
the model's output badly) is computed on ``n`` held-out calibration rows, its threshold ``qhat`` is the
``k``-th smallest of them with ``k = ceil((n + 1)(1 - alpha))`` (``conformal_quantile``), and a new row's
set holds every candidate whose score is at most ``qhat``.

Scores (the names are MAPIE 1.6's ``conformity_score`` names where MAPIE has the score):

* classification: ``lac`` (``1 - p_y``), ``aps`` (the probability mass of the labels ranked at or above
  ``y``, less ``u * p_y`` for a uniform ``u`` unless ``randomized=False``), ``raps`` (APS plus
  ``lam * max(0, rank(y) - k_reg)``); ``mondrian=True`` gives one threshold per class
  (class-conditional coverage);
* regression: ``absolute`` (``|y - yhat|``), ``normalized`` (``|y - yhat| / sigma`` with the members'
  spread ``sigma``, ripieno's ensemble-native score) and ``cqr`` (conformalised quantile regression on
  the lower/upper predictions).

The math lives in plain functions; ``SplitConformal`` holds a method, ``alpha`` and the fitted
threshold(s) so that scikit-learn estimators, a Lightning callback and the benchmark share one object.
Thresholds and scores are computed in float64; inputs may be tensors or numpy arrays.

Agreement with MAPIE 1.6 (``tests/test_conformal.py`` checks sets and intervals against MAPIE's
``SplitConformalClassifier``, ``SplitConformalRegressor`` and ``ConformalizedQuantileRegressor`` with
``prefit=True`` on the same outputs):

* the threshold is MAPIE's ``mapie.utils._compute_classification_quantile`` /
  ``_compute_regression_quantile`` (see ``conformal_quantile``);
* classification sets compare with MAPIE's tolerance ``EPSILON = 1e-8``
  (``mapie._machine_precision``): ``1 - p_k - qhat <= 1e-8`` for LAC and the same slack in APS/RAPS;
* where too few calibration rows exist for ``alpha`` MAPIE raises, while ripieno returns ``qhat = +inf``
  (every class in every set, infinite intervals) unless ``SplitConformal(allow_infinite=False)``.

Example:
    >>> import torch
    >>> probs = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.3, 0.3, 0.4], [0.8, 0.1, 0.1]])
    >>> labels = torch.tensor([0, 2, 2, 0])
    >>> fitted = SplitConformal("lac", alpha=0.25).calibrate(probs, labels)
    >>> round(fitted.qhat, 3)  # k = ceil(5 * 0.75) = 4: the largest of the four scores
    0.7
    >>> fitted.predict_sets(torch.tensor([[0.5, 0.4, 0.1]]))
    tensor([[ True,  True, False]])
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeAlias, cast

import numpy as np
import torch
from torch import Tensor

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.uq.checked_inputs import class_labels, real_float64

__all__ = [
    "CLASSIFICATION_METHODS",
    "EPSILON",
    "PROBABILITY_SUM_TOLERANCE",
    "REGRESSION_METHODS",
    "ConformalError",
    "SplitConformal",
    "absolute_intervals",
    "absolute_scores",
    "aps_scores",
    "aps_sets",
    "candidate_scores",
    "class_quantiles",
    "conformal_quantile",
    "conformal_rank",
    "coverage",
    "cqr_intervals",
    "cqr_quantiles",
    "cqr_scores",
    "lac_scores",
    "lac_sets",
    "mean_set_size",
    "mean_width",
    "min_calibration_rows",
    "normalized_intervals",
    "normalized_scores",
    "raps_scores",
    "raps_sets",
    "threshold_sets",
    "winkler_score",
]

TensorLike: TypeAlias = Tensor | np.ndarray | Sequence[float] | Sequence[int]
"""What the functions accept for data: a tensor, a numpy array or a (nested) list."""

Method = Literal["lac", "aps", "raps", "absolute", "normalized", "cqr"]
ClassificationMethod = Literal["lac", "aps", "raps"]
IncludeLastLabel = bool | Literal["randomized"]

CLASSIFICATION_METHODS: tuple[str, ...] = ("lac", "aps", "raps")
REGRESSION_METHODS: tuple[str, ...] = ("absolute", "normalized", "cqr")

EPSILON = 1e-8
"""Slack of the set comparisons, MAPIE's ``mapie._machine_precision.EPSILON``: a label whose score
exceeds the threshold by at most this much is kept (it only ever enlarges a set)."""

PROBABILITY_SUM_TOLERANCE = 1e-4
"""How far a row of probabilities may sum from 1 (float32 softmax over many classes rounds by ~1e-5)."""


class ConformalError(RipienoInputError):
    """Input that conformal prediction cannot use; the one-line message names the problem and the fix.

    Example:
        >>> try:
        ...     conformal_quantile(torch.tensor([0.1, 0.2]), alpha=1.5)
        ... except ConformalError as error:
        ...     print(error)
        conformal_quantile: alpha=1.5 is outside (0, 1); give the miscoverage level,
        e.g. 0.1 for 90% coverage.
    """


# ---------------------------------------------------------------- input checks


_REAL = (int, float, np.integer, np.floating)


def _alpha(alpha: float, where: str) -> float:
    if isinstance(alpha, bool) or not isinstance(alpha, _REAL) or not 0.0 < float(alpha) < 1.0:
        raise ConformalError(f"{where}: alpha={alpha!r} is outside (0, 1); give the miscoverage level,"
                             " e.g. 0.1 for 90% coverage.")
    return float(alpha)


def _float64(values: TensorLike, name: str, where: str) -> Tensor:
    return real_float64(values, name, where, ConformalError)


def _vector(values: TensorLike, name: str, where: str, n: int | None = None) -> Tensor:
    tensor = _float64(values, name, where)
    if tensor.ndim != 1 or (n is not None and tensor.shape[0] != n):
        wanted = f"({n},)" if n is not None else "(n,)"
        raise ConformalError(f"{where}: {name} has shape {tuple(tensor.shape)}; give a vector of shape"
                             f" {wanted}, one value per row.")
    return tensor


def _probs(probs: TensorLike, where: str) -> Tensor:
    tensor = _float64(probs, "probs", where)
    if tensor.ndim != 2 or tensor.shape[1] < 2:
        raise ConformalError(f"{where}: probs has shape {tuple(tensor.shape)}; give probabilities of shape"
                             " (n, C) with C >= 2 classes.")
    if tensor.numel() and (tensor.min() < 0 or tensor.max() > 1):
        raise ConformalError(f"{where}: probs has values outside [0, 1] (min {tensor.min().item():.3g}, max"
                             f" {tensor.max().item():.3g}); pass probabilities (the softmax of the logits),"
                             " not logits.")
    sums = tensor.sum(1)
    if sums.numel() and ((sums - 1).abs() > PROBABILITY_SUM_TOLERANCE).any():
        raise ConformalError(f"{where}: probs rows sum to between {sums.min().item():.6g} and"
                             f" {sums.max().item():.6g}, not 1 (tolerance {PROBABILITY_SUM_TOLERANCE:g});"
                             " pass probabilities that sum to 1 over the classes.")
    return tensor


def _labels(labels: TensorLike, n: int, num_classes: int, where: str, rows_of: str = "probs") -> Tensor:
    return class_labels(labels, n, num_classes, where, ConformalError, name="labels", rows_of=rows_of,
                        order="the columns of probs")


def _uniforms(u: TensorLike | None, n: int, generator: torch.Generator | None, where: str) -> Tensor:
    if u is None:
        return torch.rand(n, generator=generator, dtype=torch.float64)
    draws = _vector(u, "u", where, n)
    if draws.numel() and (draws.min() < 0 or draws.max() > 1):
        raise ConformalError(f"{where}: u has values outside [0, 1]; give uniform draws in [0, 1], one per"
                             " row.")
    return draws


def _threshold(qhat: float | TensorLike, where: str) -> Tensor:
    tensor = _float64(qhat, "qhat", where)
    if tensor.ndim > 1:
        raise ConformalError(f"{where}: qhat has shape {tuple(tensor.shape)}; give one threshold, or one per"
                             " class (shape (C,)).")
    return tensor


def _include_last_label(value: IncludeLastLabel, where: str) -> IncludeLastLabel:
    if not (isinstance(value, bool) or value == "randomized"):
        raise ConformalError(f"{where}: include_last_label={value!r} is not a choice; use True, False or"
                             " 'randomized'.")
    return value


def _regularisation(k_reg: int, lam: float, where: str) -> tuple[int, float]:
    if isinstance(k_reg, bool) or not isinstance(k_reg, int | np.integer) or k_reg < 0:
        raise ConformalError(f"{where}: k_reg={k_reg!r} is not a whole number >= 0; give the rank after which"
                             " labels are penalised, e.g. 1.")
    if isinstance(lam, bool) or not isinstance(lam, _REAL) or not 0.0 <= float(lam) < math.inf:
        raise ConformalError(f"{where}: lam={lam!r} is not a finite number >= 0; give the penalty per rank"
                             " beyond k_reg, e.g. 0.01.")
    return int(k_reg), float(lam)


# ---------------------------------------------------------------- the threshold


def conformal_rank(n: int, alpha: float) -> int:
    """The rank ``k = ceil((n + 1)(1 - alpha))`` of the split-conformal threshold among ``n`` scores.

    Computed in float64 exactly as MAPIE does (``np.ceil((n + 1) * (1 - alpha))``), so that the two agree
    where ``(n + 1)(1 - alpha)`` is a whole number up to rounding.

    Args:
        n: The number of calibration scores.
        alpha: The miscoverage level in ``(0, 1)``.

    Returns:
        ``k``; ``k > n`` means too few rows for that ``alpha`` (the threshold is ``+inf``).

    Example:
        >>> conformal_rank(500, 0.1), conformal_rank(5, 0.1)
        (451, 6)
    """
    alpha = _alpha(alpha, "conformal_rank")
    return math.ceil((n + 1) * (1 - alpha))


def min_calibration_rows(alpha: float) -> int:
    """The fewest calibration rows that give a finite threshold at ``alpha`` (about ``1/alpha - 1``).

    Args:
        alpha: The miscoverage level in ``(0, 1)``.

    Returns:
        The smallest ``n >= 1`` with ``conformal_rank(n, alpha) <= n``.

    Example:
        >>> min_calibration_rows(0.1), min_calibration_rows(0.05), min_calibration_rows(0.5)
        (9, 19, 1)
    """
    alpha = _alpha(alpha, "min_calibration_rows")
    n = max(1, math.ceil((1 - alpha) / alpha) - 1)
    while conformal_rank(n, alpha) > n:
        n += 1
    while n > 1 and conformal_rank(n - 1, alpha) <= n - 1:
        n -= 1
    return n


def conformal_quantile(scores: TensorLike, alpha: float) -> float:
    """The split-conformal threshold: the ``k``-th smallest of ``n`` scores, ``k = ceil((n + 1)(1 - alpha))``.

    A new row's score is at most this threshold with probability at least ``1 - alpha`` (and at most
    ``1 - alpha + 1/(n + 1)`` when scores do not tie) if the rows are exchangeable.

    When ``k > n`` (fewer than ``min_calibration_rows(alpha)`` rows, e.g. ``n = 5`` at ``alpha = 0.1``),
    no finite threshold gives the guarantee: the result is ``+inf``, so every set holds every class and
    every interval is infinite. MAPIE raises in that case instead.

    Identity with MAPIE 1.6: ``mapie.utils._compute_classification_quantile`` (LAC, APS, RAPS) and
    ``mapie.utils._compute_regression_quantile`` (absolute, CQR) both compute
    ``np.quantile(scores, ceil((n + 1)(1 - alpha)) / n, method="lower")``. numpy's ``"lower"`` takes the
    sorted score at index ``floor((n - 1) * k / n) = k - 1`` for ``1 <= k <= n`` (``k - k/n`` lies at
    least ``1/n`` inside ``(k - 1, k)`` when ``k < n`` and equals ``n - 1`` when ``k = n``, so float
    rounding cannot move it): the ``k``-th smallest score, which is this function's value.

    Args:
        scores: The ``n`` calibration scores, shape ``(n,)``, no NaN (``+inf`` is allowed).
        alpha: The miscoverage level in ``(0, 1)``.

    Returns:
        The threshold as a float64 Python float, ``+inf`` when ``k > n``.

    Raises:
        ConformalError: ``scores`` is empty, not a vector or holds NaN, or ``alpha`` is outside ``(0, 1)``.

    Example:
        >>> scores = torch.arange(1.0, 11.0)  # 1, 2, ..., 10
        >>> conformal_quantile(scores, 0.2)  # k = ceil(11 * 0.8) = 9
        9.0
        >>> conformal_quantile(scores[:5], 0.1)  # k = 6 > 5: too few rows for alpha = 0.1
        inf
    """
    where = "conformal_quantile"
    alpha = _alpha(alpha, where)
    values = _vector(scores, "scores", where)
    n = values.shape[0]
    if n == 0:
        raise ConformalError(f"{where}: scores is empty; calibrate on at least one row (check the"
                             " calibration mask).")
    k = conformal_rank(n, alpha)
    if k > n:
        return math.inf
    return float(torch.sort(values).values[k - 1].item())


def class_quantiles(scores: TensorLike, labels: TensorLike, num_classes: int, alpha: float) -> Tensor:
    """Mondrian (class-conditional) thresholds: ``conformal_quantile`` of each class's own rows.

    The set of a new row then holds class ``c`` when its score for ``c`` is at most the threshold of
    ``c``, which gives coverage ``>= 1 - alpha`` within every class, not only on average. A class with
    fewer than ``min_calibration_rows(alpha)`` calibration rows (none included) gets ``+inf``: every set
    then contains it.

    Args:
        scores: Each calibration row's score of its true label, shape ``(n,)``.
        labels: The rows' classes, integers in ``0..num_classes - 1``, shape ``(n,)``.
        num_classes: ``C``.
        alpha: The miscoverage level in ``(0, 1)``.

    Returns:
        The ``C`` thresholds, float64, shape ``(C,)``.

    Example:
        >>> scores = torch.tensor([0.1, 0.2, 0.3, 0.9, 0.8])
        >>> class_quantiles(scores, torch.tensor([0, 0, 0, 1, 1]), 3, alpha=0.5)
        tensor([0.2000, 0.9000,    inf], dtype=torch.float64)
    """
    where = "class_quantiles"
    alpha = _alpha(alpha, where)
    values = _vector(scores, "scores", where)
    classes = _labels(labels, values.shape[0], num_classes, where, "scores")
    out = torch.full((num_classes,), math.inf, dtype=torch.float64)
    for c in range(num_classes):
        mine = values[classes == c]
        if mine.numel():
            out[c] = conformal_quantile(mine, alpha)
    return out


# ---------------------------------------------------------------- classification


def _ranked_mass(probs: Tensor, k_reg: int | None = None, lam: float = 0.0) -> tuple[Tensor, Tensor]:
    """Each label's cumulated mass (labels ranked by decreasing probability, plus the RAPS penalty).

    Returns ``(cum, rank)`` in the labels' own order: ``cum[i, c]`` is the total probability of the labels
    ranked at or above ``c`` (plus ``lam * max(0, rank - k_reg)``), ``rank[i, c]`` is ``c``'s 1-based rank.
    Tied probabilities are ranked in label order (MAPIE's ``np.argsort`` orders them arbitrarily).
    """
    order = torch.sort(probs, dim=1, descending=True, stable=True).indices
    cum_sorted = torch.cumsum(probs.gather(1, order), dim=1)
    ranks = torch.arange(1, probs.shape[1] + 1, dtype=torch.float64).expand_as(cum_sorted)
    if k_reg is not None and lam:
        cum_sorted = cum_sorted + lam * torch.clamp(ranks - k_reg, min=0)
    back = torch.argsort(order, dim=1)
    return cum_sorted.gather(1, back), ranks.gather(1, back)


def candidate_scores(probs: TensorLike, method: ClassificationMethod, *, randomized: bool = True,
                     u: TensorLike | None = None, generator: torch.Generator | None = None,
                     k_reg: int | None = None, lam: float | None = None) -> Tensor:
    """The score of every candidate label of every row, shape ``(n, C)``.

    ``lac``: ``1 - p_c``. ``aps``: the mass of the labels ranked at or above ``c`` by probability, less
    ``u_i * p_c`` when ``randomized`` (one uniform ``u_i`` per row). ``raps``: the APS score plus
    ``lam * max(0, rank(c) - k_reg)``. A row's calibration score is the entry of its true label
    (``lac_scores``, ``aps_scores``, ``raps_scores``); Mondrian sets compare every entry with its class's
    threshold (``threshold_sets``).

    Args:
        probs: Probabilities, shape ``(n, C)``, rows summing to 1.
        method: ``"lac"``, ``"aps"`` or ``"raps"``.
        randomized: Subtract ``u * p_c`` (APS/RAPS). MAPIE always does at calibration.
        u: The uniform draws, shape ``(n,)``; drawn from ``generator`` (torch's global one when ``None``)
            when not given.
        generator: The random generator for ``u``.
        k_reg: RAPS: the rank after which labels are penalised.
        lam: RAPS: the penalty per rank beyond ``k_reg``.

    Returns:
        The scores, float64, shape ``(n, C)``.

    Example:
        >>> probs = torch.tensor([[0.5, 0.3, 0.2]])
        >>> candidate_scores(probs, "aps", randomized=False)
        tensor([[0.5000, 0.8000, 1.0000]], dtype=torch.float64)
        >>> candidate_scores(probs, "raps", randomized=False, k_reg=1, lam=0.1)
        tensor([[0.5000, 0.9000, 1.2000]], dtype=torch.float64)
    """
    return _candidate_scores(probs, method, randomized, u, generator, k_reg, lam, "candidate_scores")


def _candidate_scores(probs: TensorLike, method: str, randomized: bool, u: TensorLike | None,
                      generator: torch.Generator | None, k_reg: int | None, lam: float | None,
                      where: str) -> Tensor:
    p = _probs(probs, where)
    if method == "lac":
        return 1 - p
    if method not in ("aps", "raps"):
        raise ConformalError(f"{where}: method={method!r} is not a classification score; use 'lac', 'aps'"
                             " or 'raps'.")
    k, lam_ = (None, 0.0)
    if method == "raps":
        if k_reg is None or lam is None:
            raise ConformalError(f"{where}: method='raps' needs k_reg and lam; give both, e.g. k_reg=1,"
                                 " lam=0.01.")
        k, lam_ = _regularisation(k_reg, lam, where)
    cum, ranks = _ranked_mass(p)
    scores = cum
    if randomized:
        scores = cum - _uniforms(u, p.shape[0], generator, where)[:, None] * p
    if k is not None and lam_:
        scores = scores + lam_ * torch.clamp(ranks - k, min=0)
    return scores


def _true_label(candidates: Tensor, labels: TensorLike, where: str) -> Tensor:
    n, num_classes = candidates.shape
    return candidates.gather(1, _labels(labels, n, num_classes, where)[:, None])[:, 0]


def lac_scores(probs: TensorLike, labels: TensorLike) -> Tensor:
    """LAC scores (MAPIE ``"lac"``, Sadinle et al. 2019): ``1 - p_y`` for each row's true label ``y``.

    Args:
        probs: Probabilities, shape ``(n, C)``.
        labels: True classes in ``0..C-1``, shape ``(n,)``.

    Returns:
        The scores, float64, shape ``(n,)``.

    Example:
        >>> lac_scores(torch.tensor([[0.7, 0.3], [0.4, 0.6]]), torch.tensor([0, 0]))
        tensor([0.3000, 0.6000], dtype=torch.float64)
    """
    return _true_label(_candidate_scores(probs, "lac", False, None, None, None, None, "lac_scores"), labels,
                       "lac_scores")


def threshold_sets(candidates: TensorLike, qhat: float | TensorLike) -> Tensor:
    """The labels whose score is at most the threshold: ``candidates - qhat <= EPSILON``.

    With one threshold this is the LAC set (and the plain conformal set of any score); with one threshold
    per class (``class_quantiles``) it is the Mondrian set. ``+inf`` thresholds keep every label.

    Args:
        candidates: Every label's score, shape ``(n, C)`` (``candidate_scores``).
        qhat: One threshold, or one per class, shape ``(C,)``.

    Returns:
        The sets, boolean, shape ``(n, C)``.

    Example:
        >>> threshold_sets(torch.tensor([[0.2, 0.5, 0.9]]), torch.tensor([0.1, 0.6, 1.0]))
        tensor([[False,  True,  True]])
    """
    where = "threshold_sets"
    scores = _float64(candidates, "candidates", where)
    q = _threshold(qhat, where)
    if scores.ndim != 2 or (q.ndim == 1 and q.shape[0] != scores.shape[1]):
        raise ConformalError(f"{where}: candidates has shape {tuple(scores.shape)} and qhat"
                             f" {tuple(q.shape)}; give scores of shape (n, C) and one threshold or C.")
    return scores - q <= EPSILON


def lac_sets(probs: TensorLike, qhat: float | TensorLike) -> Tensor:
    """LAC sets (MAPIE ``"lac"``): ``{c : 1 - p_c <= qhat}`` (within ``EPSILON``, as MAPIE compares).

    Args:
        probs: Probabilities, shape ``(n, C)``.
        qhat: The threshold of ``lac_scores``, or one per class (Mondrian).

    Returns:
        The sets, boolean, shape ``(n, C)``.

    Example:
        >>> lac_sets(torch.tensor([[0.6, 0.3, 0.1]]), qhat=0.75)
        tensor([[ True,  True, False]])
    """
    return threshold_sets(_candidate_scores(probs, "lac", False, None, None, None, None, "lac_sets"), qhat)


def aps_scores(probs: TensorLike, labels: TensorLike, *, randomized: bool = True, u: TensorLike | None = None,
               generator: torch.Generator | None = None) -> Tensor:
    """APS scores (MAPIE ``"aps"``, Romano et al. 2020): the mass ranked at or above ``y``, less ``u * p_y``.

    MAPIE's ``APSConformityScore.get_conformity_scores`` (``mapie/conformity_scores/sets/aps.py``) always
    randomises, with ``u = check_random_state(random_state).uniform(size=n)``; pass those draws as ``u``
    to reproduce MAPIE (``np.random.RandomState(seed).uniform(size=n)`` for an integer seed), or a
    ``generator`` for ripieno's own draws. ``randomized=False`` gives the plain cumulated mass.

    Args:
        probs: Probabilities, shape ``(n, C)``.
        labels: True classes in ``0..C-1``, shape ``(n,)``.
        randomized: Subtract ``u * p_y``.
        u: Uniform draws in ``[0, 1]``, shape ``(n,)``.
        generator: Draws ``u`` when ``u`` is not given (torch's global generator when ``None``).

    Returns:
        The scores, float64, shape ``(n,)``.

    Example:
        >>> probs = torch.tensor([[0.5, 0.3, 0.2]])
        >>> aps_scores(probs, torch.tensor([1]), randomized=False)
        tensor([0.8000], dtype=torch.float64)
        >>> aps_scores(probs, torch.tensor([1]), u=torch.tensor([0.5]))  # 0.8 - 0.5 * 0.3
        tensor([0.6500], dtype=torch.float64)
    """
    candidates = _candidate_scores(probs, "aps", randomized, u, generator, None, None, "aps_scores")
    return _true_label(candidates, labels, "aps_scores")


def raps_scores(probs: TensorLike, labels: TensorLike, *, k_reg: int, lam: float, randomized: bool = True,
                u: TensorLike | None = None, generator: torch.Generator | None = None) -> Tensor:
    """RAPS scores (MAPIE ``"raps"``, Angelopoulos et al. 2021): APS plus ``lam * max(0, rank(y) - k_reg)``.

    MAPIE (``mapie/conformity_scores/sets/raps.py``) tunes ``k_reg`` (its ``k_star``: the conformal
    quantile of the true label's rank) and ``lam`` (its ``lambda_star``, the best of 0.001, 0.01, 0.1,
    0.2, 0.5 by mean set size) on a stratified share of the calibration rows and calibrates on the rest;
    its API cannot fix them. Here both are explicit: tune them on rows kept apart from calibration.

    Args:
        probs: Probabilities, shape ``(n, C)``.
        labels: True classes in ``0..C-1``, shape ``(n,)``.
        k_reg: The rank (1-based) after which labels are penalised, ``>= 0``.
        lam: The penalty per rank beyond ``k_reg``, ``>= 0``.
        randomized: Subtract ``u * p_y`` (MAPIE always does).
        u: Uniform draws in ``[0, 1]``, shape ``(n,)``.
        generator: Draws ``u`` when ``u`` is not given.

    Returns:
        The scores, float64, shape ``(n,)``.

    Example:
        >>> probs = torch.tensor([[0.5, 0.3, 0.2]])
        >>> raps_scores(probs, torch.tensor([2]), k_reg=1, lam=0.1, randomized=False)  # 1.0 + 0.1 * 2
        tensor([1.2000], dtype=torch.float64)
    """
    candidates = _candidate_scores(probs, "raps", randomized, u, generator, k_reg, lam, "raps_scores")
    return _true_label(candidates, labels, "raps_scores")


def _last_label_sets(probs: Tensor, qhat: Tensor, include_last_label: IncludeLastLabel, u: Tensor | None,
                     k_reg: int | None, lam: float) -> Tensor:
    """MAPIE's APS/RAPS set rule on one finite or infinite threshold.

    As ``NaiveConformityScore._get_last_included_proba``, ``get_last_index_included``
    (``mapie/conformity_scores/sets/utils.py``) and ``APSConformityScore.get_prediction_sets``.
    """
    n, num_classes = probs.shape
    if n == 0 or math.isinf(qhat.item()):
        return torch.ones(n, num_classes, dtype=torch.bool)
    q = qhat.item()
    cum, _ = _ranked_mass(probs, k_reg, lam)
    diff = cum - q
    below = diff < -EPSILON
    if include_last_label is False:
        # The last label whose mass stays within max(qhat, mass of the top label).
        highest = torch.clamp(cum.min(1, keepdim=True).values, min=q)
        over = cum - highest
        last = over.masked_fill(over > EPSILON, -math.inf).argmax(1)
    else:
        # The first label (by rank) whose mass reaches qhat.
        last = diff.masked_fill(below, math.inf).argmin(1)
    p_last = probs.gather(1, last[:, None])
    tiny = p_last <= EPSILON
    if tiny.any():  # MAPIE: a last label of ~zero probability stands for the smallest non-zero one
        smallest = probs.masked_fill(probs < EPSILON, math.inf).min(1, keepdim=True).values
        p_last = torch.where(tiny, smallest, p_last)
    sets = probs - p_last >= -EPSILON
    if include_last_label == "randomized":
        assert u is not None
        excess = cum.gather(1, last[:, None])[:, 0] - q
        denominator = p_last[:, 0]
        if k_reg is not None:  # RAPS: Angelopoulos et al.'s V (RAPSConformityScore._compute_v_parameter)
            size = sets.sum(1).to(torch.float64)
            denominator = denominator - lam * torch.clamp(size - k_reg, min=0) + lam * (size > k_reg)
        keep = excess / denominator - u <= EPSILON
        sets = sets.scatter(1, last[:, None], keep[:, None])
    # Past every label's mass (possible only with qhat above the total): every label.
    return sets | below.all(1, keepdim=True)


def aps_sets(probs: TensorLike, qhat: float | TensorLike, *, include_last_label: IncludeLastLabel = True,
             u: TensorLike | None = None, generator: torch.Generator | None = None) -> Tensor:
    """APS sets by MAPIE's rule: the labels ranked down to the one whose cumulated mass reaches ``qhat``.

    ``include_last_label`` is MAPIE's (``SplitConformalClassifier.predict_set(...,
    conformity_score_params={"include_last_label": ...})``, default ``True``):

    * ``True``: down to and including the first label (by rank) whose mass is ``>= qhat``;
    * ``False``: down to the last label whose mass is ``<= max(qhat, p_max)`` (never empty);
    * ``"randomized"``: as ``True``, then the last label is dropped unless
      ``(mass - qhat) / p_last <= u`` for a uniform ``u`` per row (MAPIE draws
      ``check_random_state(random_state).uniform(size=(n, 1))``: pass those as ``u`` to reproduce it).

    Labels are then kept by probability: every label with ``p >= p_last - EPSILON`` (so ties with the
    last label join it), and a last label of probability ``<= EPSILON`` stands for the row's smallest
    probability above ``EPSILON``, both as in MAPIE. A threshold of ``+inf`` keeps every label.

    Args:
        probs: Probabilities, shape ``(n, C)``.
        qhat: The threshold of ``aps_scores``.
        include_last_label: ``True``, ``False`` or ``"randomized"``.
        u: ``"randomized"``: uniform draws, shape ``(n,)``.
        generator: ``"randomized"``: draws ``u`` when ``u`` is not given.

    Returns:
        The sets, boolean, shape ``(n, C)``.

    Example:
        >>> probs = torch.tensor([[0.5, 0.3, 0.2]])  # cumulated masses 0.5, 0.8, 1.0
        >>> aps_sets(probs, 0.7), aps_sets(probs, 0.7, include_last_label=False)
        (tensor([[ True,  True, False]]), tensor([[ True, False, False]]))
    """
    where = "aps_sets"
    return _sets_by_rank(probs, qhat, include_last_label, u, generator, None, 0.0, where)


def raps_sets(probs: TensorLike, qhat: float | TensorLike, *, k_reg: int, lam: float,
              include_last_label: IncludeLastLabel = True, u: TensorLike | None = None,
              generator: torch.Generator | None = None) -> Tensor:
    """RAPS sets: ``aps_sets``'s rule on the masses plus ``lam * max(0, rank - k_reg)``.

    ``"randomized"`` uses Angelopoulos et al.'s (and MAPIE's) ``V`` for RAPS, whose denominator is
    ``p_last - lam * max(0, L - k_reg) + lam * (L > k_reg)`` with ``L`` the set's size before the draw.

    Args:
        probs: Probabilities, shape ``(n, C)``.
        qhat: The threshold of ``raps_scores`` (same ``k_reg`` and ``lam``).
        k_reg: The rank after which labels are penalised.
        lam: The penalty per rank beyond ``k_reg``.
        include_last_label: ``True``, ``False`` or ``"randomized"`` (see ``aps_sets``).
        u: ``"randomized"``: uniform draws, shape ``(n,)``.
        generator: ``"randomized"``: draws ``u`` when ``u`` is not given.

    Returns:
        The sets, boolean, shape ``(n, C)``.

    Example:
        >>> probs = torch.tensor([[0.4, 0.35, 0.25]])  # masses 0.4, 0.75 + 0.2, 1.0 + 0.4
        >>> raps_sets(probs, 0.8, k_reg=1, lam=0.2), aps_sets(probs, 0.8)
        (tensor([[ True,  True, False]]), tensor([[True, True, True]]))
    """
    where = "raps_sets"
    k, lam_ = _regularisation(k_reg, lam, where)
    return _sets_by_rank(probs, qhat, include_last_label, u, generator, k, lam_, where)


def _sets_by_rank(probs: TensorLike, qhat: float | TensorLike, include_last_label: IncludeLastLabel,
                  u: TensorLike | None, generator: torch.Generator | None, k_reg: int | None, lam: float,
                  where: str) -> Tensor:
    p = _probs(probs, where)
    q = _threshold(qhat, where)
    if q.numel() != 1:
        raise ConformalError(f"{where}: qhat has {q.numel()} values; give one threshold (Mondrian sets,"
                             " one threshold per class, are threshold_sets of candidate_scores).")
    rule = _include_last_label(include_last_label, where)
    draws = _uniforms(u, p.shape[0], generator, where) if rule == "randomized" else None
    return _last_label_sets(p, q.reshape(()), rule, draws, k_reg, lam)


# ---------------------------------------------------------------- regression


def absolute_scores(y: TensorLike, yhat: TensorLike) -> Tensor:
    """Absolute residuals (MAPIE ``"absolute"``): ``|y - yhat|``.

    Args:
        y: Targets, shape ``(n,)``.
        yhat: Point predictions, shape ``(n,)``.

    Returns:
        The scores, float64, shape ``(n,)``.

    Example:
        >>> absolute_scores(torch.tensor([1.0, 2.0]), torch.tensor([1.5, 1.0]))
        tensor([0.5000, 1.0000], dtype=torch.float64)
    """
    where = "absolute_scores"
    target = _vector(y, "y", where)
    return (target - _vector(yhat, "yhat", where, target.shape[0])).abs()


def absolute_intervals(yhat: TensorLike, qhat: float) -> tuple[Tensor, Tensor]:
    """Intervals ``yhat -/+ qhat`` of the absolute score (MAPIE's ``SplitConformalRegressor``).

    Args:
        yhat: Point predictions, shape ``(n,)``.
        qhat: The threshold of ``absolute_scores`` (``+inf`` gives infinite intervals).

    Returns:
        ``(lower, upper)``, float64, shape ``(n,)`` each.

    Example:
        >>> absolute_intervals(torch.tensor([0.0, 10.0]), 1.5)
        (tensor([-1.5000,  8.5000], dtype=torch.float64), tensor([ 1.5000, 11.5000], dtype=torch.float64))
    """
    where = "absolute_intervals"
    center = _vector(yhat, "yhat", where)
    q = _threshold(qhat, where).reshape(())
    return center - q, center + q


def _sigma(sigma: TensorLike, n: int, where: str) -> Tensor:
    spread = _vector(sigma, "sigma", where, n)
    bad = spread <= 0
    if bad.any():
        raise ConformalError(f"{where}: sigma has {int(bad.sum())} value(s) <= 0 (smallest"
                             f" {spread.min().item():.3g}); the normalized score divides by sigma, so give a"
                             " positive spread (add a floor, e.g. sigma.clamp_min(1e-6), where members"
                             " agree).")
    return spread


def normalized_scores(y: TensorLike, yhat: TensorLike, sigma: TensorLike) -> Tensor:
    """Residuals scaled by the members' spread: ``|y - yhat| / sigma`` (ripieno's ensemble-native score).

    Unlike MAPIE's ``"residual_normalized"`` (which fits its own model of the residuals), ``sigma`` is the
    model's own spread, e.g. the standard deviation of the members' predictions. ``sigma`` must be
    positive: where members can agree exactly, adding a small floor is the caller's choice.

    Args:
        y: Targets, shape ``(n,)``.
        yhat: Point predictions, shape ``(n,)``.
        sigma: Spreads, ``> 0``, shape ``(n,)``.

    Returns:
        The scores, float64, shape ``(n,)``.

    Example:
        >>> normalized_scores(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0]), torch.tensor([2.0, 4.0]))
        tensor([0.5000, 0.5000], dtype=torch.float64)
    """
    where = "normalized_scores"
    target = _vector(y, "y", where)
    n = target.shape[0]
    return (target - _vector(yhat, "yhat", where, n)).abs() / _sigma(sigma, n, where)


def normalized_intervals(yhat: TensorLike, sigma: TensorLike, qhat: float) -> tuple[Tensor, Tensor]:
    """Intervals ``yhat -/+ qhat * sigma`` of the normalized score: wider where the members disagree.

    Args:
        yhat: Point predictions, shape ``(n,)``.
        sigma: Spreads, ``> 0``, shape ``(n,)``.
        qhat: The threshold of ``normalized_scores``.

    Returns:
        ``(lower, upper)``, float64, shape ``(n,)`` each.

    Example:
        >>> normalized_intervals(torch.tensor([0.0, 0.0]), torch.tensor([1.0, 3.0]), 2.0)
        (tensor([-2., -6.], dtype=torch.float64), tensor([2., 6.], dtype=torch.float64))
    """
    where = "normalized_intervals"
    center = _vector(yhat, "yhat", where)
    half = _threshold(qhat, where).reshape(()) * _sigma(sigma, center.shape[0], where)
    return center - half, center + half


def cqr_scores(y: TensorLike, lower: TensorLike, upper: TensorLike) -> Tensor:
    """CQR scores (Romano et al. 2019): ``max(lower - y, y - upper)``, negative inside the interval.

    This is MAPIE's ``ConformalizedQuantileRegressor`` score with ``symmetric_correction=True`` (its third
    row of ``conformity_scores``); its default corrects each side on its own (``cqr_quantiles``).

    Args:
        y: Targets, shape ``(n,)``.
        lower: Lower quantile predictions, shape ``(n,)``.
        upper: Upper quantile predictions, shape ``(n,)``.

    Returns:
        The scores, float64, shape ``(n,)``.

    Example:
        >>> cqr_scores(torch.tensor([0.0, 3.0]), torch.tensor([-1.0, 0.0]), torch.tensor([2.0, 1.0]))
        tensor([-1.,  2.], dtype=torch.float64)
    """
    where = "cqr_scores"
    target = _vector(y, "y", where)
    n = target.shape[0]
    low, high = _vector(lower, "lower", where, n), _vector(upper, "upper", where, n)
    return torch.maximum(low - target, target - high)


def cqr_quantiles(y: TensorLike, lower: TensorLike, upper: TensorLike, alpha: float, *,
                  symmetric: bool = False) -> tuple[float, float]:
    """The CQR corrections ``(q_lower, q_upper)`` of the lower and upper predictions.

    ``symmetric=False`` (MAPIE's default, ``ConformalizedQuantileRegressor.predict_interval(...,
    symmetric_correction=False)``, ``_MapieQuantileRegressor.predict`` in
    ``mapie/regression/quantile_regression.py``): each side gets ``conformal_quantile`` at ``alpha / 2`` of
    its own residuals, ``lower - y`` and ``y - upper``. ``symmetric=True`` (Romano et al.'s CQR): both are
    ``conformal_quantile(cqr_scores, alpha)``.

    Args:
        y: Targets, shape ``(n,)``.
        lower: Lower quantile predictions, shape ``(n,)``.
        upper: Upper quantile predictions, shape ``(n,)``.
        alpha: The miscoverage level in ``(0, 1)``.
        symmetric: One correction for both sides.

    Returns:
        ``(q_lower, q_upper)``; the interval is ``[lower - q_lower, upper + q_upper]``.

    Example:
        >>> y = torch.arange(10.0)
        >>> cqr_quantiles(y, y - 1, y + 2, alpha=0.4)  # every lower - y is -1, every y - upper is -2
        (-1.0, -2.0)
    """
    where = "cqr_quantiles"
    alpha = _alpha(alpha, where)
    if symmetric:
        q = conformal_quantile(cqr_scores(y, lower, upper), alpha)
        return q, q
    target = _vector(y, "y", where)
    n = target.shape[0]
    q_lower = conformal_quantile(_vector(lower, "lower", where, n) - target, alpha / 2)
    q_upper = conformal_quantile(target - _vector(upper, "upper", where, n), alpha / 2)
    return q_lower, q_upper


def cqr_intervals(lower: TensorLike, upper: TensorLike, q_lower: float,
                  q_upper: float | None = None) -> tuple[Tensor, Tensor]:
    """CQR intervals ``[lower - q_lower, upper + q_upper]`` (``q_upper`` defaults to ``q_lower``).

    Crossed predictions (``lower > upper``) are used as given (MAPIE only logs them).

    Args:
        lower: Lower quantile predictions, shape ``(n,)``.
        upper: Upper quantile predictions, shape ``(n,)``.
        q_lower: The correction of the lower side (``cqr_quantiles``).
        q_upper: The correction of the upper side.

    Returns:
        ``(lower, upper)``, float64, shape ``(n,)`` each.

    Example:
        >>> cqr_intervals(torch.tensor([0.0]), torch.tensor([1.0]), 0.5, -0.25)
        (tensor([-0.5000], dtype=torch.float64), tensor([0.7500], dtype=torch.float64))
    """
    where = "cqr_intervals"
    low = _vector(lower, "lower", where)
    high = _vector(upper, "upper", where, low.shape[0])
    q_low = _threshold(q_lower, where).reshape(())
    q_high = q_low if q_upper is None else _threshold(q_upper, where).reshape(())
    return low - q_low, high + q_high


# ---------------------------------------------------------------- the shared object


@dataclass(frozen=True, eq=False)
class SplitConformal:
    """A split-conformal method, its ``alpha`` and, once calibrated, its threshold(s).

    ``calibrate(outputs, y)`` returns a fitted copy; ``predict_sets`` / ``predict_intervals`` apply it.
    ``outputs`` is the model's output in the member protocol's shapes:

    * ``lac``, ``aps``, ``raps``: probabilities ``(n, C)``;
    * ``absolute``: point predictions ``(n,)``;
    * ``normalized``: ``(yhat, sigma)``, point predictions and the members' spread (``> 0``);
    * ``cqr``: ``(lower, upper)``, lower and upper quantile predictions.

    Args:
        method: ``"lac"``, ``"aps"``, ``"raps"``, ``"absolute"``, ``"normalized"`` or ``"cqr"``.
        alpha: The miscoverage level in ``(0, 1)``: sets and intervals cover with probability
            ``>= 1 - alpha``.
        mondrian: Classification: one threshold per class (``class_quantiles``): coverage
            ``>= 1 - alpha`` within every class. Sets are then the labels whose own score
            (``candidate_scores``) is within their class's threshold, for APS/RAPS too. A class with too
            few calibration rows gets ``+inf`` (it is in every set).
        randomized: APS/RAPS: subtract ``u * p`` from the scores (MAPIE's behaviour). Mondrian sets then
            draw a ``u`` per row at prediction too.
        include_last_label: APS/RAPS marginal sets: ``True`` (MAPIE's default), ``False`` or
            ``"randomized"`` (see ``aps_sets``).
        k_reg: RAPS: the rank after which labels are penalised (required for ``raps``).
        lam: RAPS: the penalty per rank beyond ``k_reg`` (required for ``raps``).
        symmetric: CQR: one correction for both sides at ``alpha`` instead of MAPIE's default, one per
            side at ``alpha / 2``.
        allow_infinite: When there are too few calibration rows for ``alpha`` (``min_calibration_rows``),
            give ``+inf`` thresholds (every class, infinite intervals) rather than raise.
        thresholds: The fitted thresholds, float64: shape ``(1,)``, ``(C,)`` (Mondrian) or ``(2,)``
            (CQR: lower, upper); ``None`` before ``calibrate``.
        n_calibration: The number of calibration rows.

    Example:
        >>> y = torch.arange(20.0)
        >>> fitted = SplitConformal("absolute", alpha=0.1).calibrate(y + 0.5, y)  # every residual is 0.5
        >>> fitted.qhat, fitted.predict_intervals(torch.tensor([3.0]))
        (0.5, (tensor([2.5000], dtype=torch.float64), tensor([3.5000], dtype=torch.float64)))
        >>> try:
        ...     SplitConformal("absolute", alpha=0.1, allow_infinite=False).calibrate(y[:5], y[:5])
        ... except ConformalError as error:
        ...     print(error)
        SplitConformal.calibrate: 5 calibration rows are too few for alpha=0.1; give at least 9 rows
        or set allow_infinite=True (thresholds are then +inf).
    """

    method: Method
    alpha: float
    mondrian: bool = False
    randomized: bool = True
    include_last_label: IncludeLastLabel = True
    k_reg: int | None = None
    lam: float | None = None
    symmetric: bool = False
    allow_infinite: bool = True
    thresholds: Tensor | None = None
    n_calibration: int = 0

    def __post_init__(self) -> None:
        where = "SplitConformal"
        if self.method not in CLASSIFICATION_METHODS + REGRESSION_METHODS:
            raise ConformalError(f"{where}: method={self.method!r} is unknown; use one of"
                                 f" {', '.join(CLASSIFICATION_METHODS + REGRESSION_METHODS)}.")
        _alpha(self.alpha, where)
        _include_last_label(self.include_last_label, where)
        if self.mondrian and self.method in REGRESSION_METHODS:
            raise ConformalError(f"{where}: mondrian=True is for classes, not method={self.method!r}; drop"
                                 " mondrian or use lac, aps or raps.")
        if self.method == "raps":
            if self.k_reg is None or self.lam is None:
                raise ConformalError(f"{where}: method='raps' needs k_reg and lam; give both, e.g. k_reg=1,"
                                     " lam=0.01.")
            _regularisation(self.k_reg, self.lam, where)

    @property
    def is_classification(self) -> bool:
        """Whether the method gives sets of classes (``lac``, ``aps``, ``raps``)."""
        return self.method in CLASSIFICATION_METHODS

    @property
    def qhat(self) -> float:
        """The one fitted threshold (``thresholds[0]``; the lower side's correction for CQR)."""
        return float(self._fitted("SplitConformal.qhat")[0].item())

    def _fitted(self, where: str) -> Tensor:
        if self.thresholds is None:
            raise ConformalError(f"{where}: this SplitConformal is not calibrated; call calibrate(outputs, y)"
                                 " and use the object it returns.")
        return self.thresholds

    def _check_rows(self, n: int, where: str, label: str = "") -> None:
        """Refuse an empty calibration, and too few rows (of a class) unless ``allow_infinite``."""
        # Asymmetric CQR takes each side's threshold at alpha / 2.
        alpha = self.alpha / 2 if self.method == "cqr" and not self.symmetric else self.alpha
        need = min_calibration_rows(alpha)
        if n == 0 and not label:
            raise ConformalError(f"{where}: there are no calibration rows; calibrate on at least {need} rows"
                                 " (check the calibration mask).")
        if n < need and not self.allow_infinite:
            raise ConformalError(f"{where}: {n} calibration rows{label} are too few for alpha={self.alpha};"
                                 f" give at least {need} rows or set allow_infinite=True (thresholds are"
                                 " then +inf).")

    def _pair(self, outputs: object, names: str, where: str) -> tuple[TensorLike, TensorLike]:
        if not isinstance(outputs, tuple | list) or len(outputs) != 2:
            raise ConformalError(f"{where}: method={self.method!r} takes outputs=({names}), a pair of"
                                 f" vectors; got {type(outputs).__name__}.")
        return outputs[0], outputs[1]

    def calibrate(self, outputs: TensorLike | tuple[TensorLike, TensorLike], y: TensorLike, *,
                  u: TensorLike | None = None, generator: torch.Generator | None = None) -> SplitConformal:
        """Fit the threshold(s) on calibration rows; returns a fitted copy.

        Args:
            outputs: The model's outputs on the calibration rows (see the class).
            y: Their classes ``(n,)`` in ``0..C-1``, or targets ``(n,)``.
            u: APS/RAPS with ``randomized``: the uniform draws, shape ``(n,)`` (drawn when not given).
            generator: Draws ``u`` when ``u`` is not given.

        Returns:
            A ``SplitConformal`` with ``thresholds`` and ``n_calibration`` set.
        """
        where = "SplitConformal.calibrate"
        alpha = self.alpha
        if self.is_classification:
            probs = _probs(cast(TensorLike, outputs), where)
            n, num_classes = probs.shape
            self._check_rows(n, where)
            labels = _labels(y, n, num_classes, where)
            candidates = _candidate_scores(probs, self.method, self.randomized, u, generator, self.k_reg,
                                           self.lam, where)
            scores = candidates.gather(1, labels[:, None])[:, 0]
            if self.mondrian:
                for c in range(num_classes):
                    self._check_rows(int((labels == c).sum()), where, f" of class {c}")
                thresholds = class_quantiles(scores, labels, num_classes, alpha)
            else:
                thresholds = torch.tensor([conformal_quantile(scores, alpha)], dtype=torch.float64)
            return dataclasses.replace(self, thresholds=thresholds, n_calibration=n)
        target = _vector(y, "y", where)
        n = target.shape[0]
        self._check_rows(n, where)
        first, second = self._regression_outputs(outputs, n, where)
        if self.method == "cqr":
            thresholds = torch.tensor(cqr_quantiles(target, first, second, alpha, symmetric=self.symmetric),
                                      dtype=torch.float64)
        else:
            residuals = (target - first).abs()
            scores = residuals if second is None else residuals / second
            thresholds = torch.tensor([conformal_quantile(scores, alpha)], dtype=torch.float64)
        return dataclasses.replace(self, thresholds=thresholds, n_calibration=n)

    def _regression_outputs(self, outputs: object, n: int | None, where: str) -> tuple[Tensor, Tensor | None]:
        """``(yhat, None)``, ``(yhat, sigma)`` or ``(lower, upper)``, checked, as float64 vectors."""
        if self.method == "absolute":
            return _vector(cast(TensorLike, outputs), "yhat", where, n), None
        if self.method == "normalized":
            yhat, sigma = self._pair(outputs, "yhat, sigma", where)
            center = _vector(yhat, "yhat", where, n)
            return center, _sigma(sigma, center.shape[0], where)
        lower, upper = self._pair(outputs, "lower, upper", where)
        low = _vector(lower, "lower", where, n)
        return low, _vector(upper, "upper", where, low.shape[0])

    def predict_sets(self, probs: TensorLike, *, u: TensorLike | None = None,
                     generator: torch.Generator | None = None) -> Tensor:
        """The prediction sets of new rows (classification methods).

        Args:
            probs: Probabilities, shape ``(n, C)``.
            u: Uniform draws, shape ``(n,)``, where the sets are randomised (``include_last_label=
                "randomized"``, or Mondrian APS/RAPS with ``randomized``); drawn when not given.
            generator: Draws ``u`` when ``u`` is not given.

        Returns:
            The sets, boolean, shape ``(n, C)``.
        """
        where = "SplitConformal.predict_sets"
        if not self.is_classification:
            raise ConformalError(f"{where}: method={self.method!r} gives intervals, not sets; use"
                                 " predict_intervals.")
        thresholds = self._fitted(where)
        p = _probs(probs, where)
        if self.mondrian:
            if p.shape[1] != thresholds.shape[0]:
                raise ConformalError(f"{where}: probs has {p.shape[1]} classes but the calibration had"
                                     f" {thresholds.shape[0]}; pass probabilities over the same classes.")
            candidates = _candidate_scores(p, self.method, self.randomized, u, generator, self.k_reg,
                                           self.lam, where)
            return threshold_sets(candidates, thresholds)
        if self.method == "lac":
            return lac_sets(p, thresholds[0])
        if self.method == "aps":
            return aps_sets(p, thresholds[0], include_last_label=self.include_last_label, u=u,
                            generator=generator)
        assert self.k_reg is not None and self.lam is not None
        return raps_sets(p, thresholds[0], k_reg=self.k_reg, lam=self.lam,
                         include_last_label=self.include_last_label, u=u, generator=generator)

    def predict_intervals(self, outputs: TensorLike | tuple[TensorLike, TensorLike]) -> tuple[Tensor, Tensor]:
        """The prediction intervals of new rows (regression methods).

        Args:
            outputs: The model's outputs on the new rows (see the class).

        Returns:
            ``(lower, upper)``, float64, shape ``(n,)`` each.
        """
        where = "SplitConformal.predict_intervals"
        if self.is_classification:
            raise ConformalError(f"{where}: method={self.method!r} gives sets, not intervals; use"
                                 " predict_sets.")
        thresholds = self._fitted(where)
        first, second = self._regression_outputs(outputs, None, where)
        if self.method == "cqr":
            assert second is not None
            return cqr_intervals(first, second, thresholds[0].item(), thresholds[1].item())
        if second is not None:
            return normalized_intervals(first, second, thresholds[0].item())
        return absolute_intervals(first, thresholds[0].item())


# ---------------------------------------------------------------- metrics


def coverage(sets_or_intervals: TensorLike | tuple[TensorLike, TensorLike], y: TensorLike) -> float:
    """The share of rows whose truth is in its set, or in its interval ``[lower, upper]``.

    Args:
        sets_or_intervals: Boolean sets ``(n, C)``, or a pair ``(lower, upper)`` of ``(n,)`` bounds.
        y: The classes ``(n,)`` (sets) or targets ``(n,)`` (intervals).

    Returns:
        The empirical coverage in ``[0, 1]``.

    Example:
        >>> sets = torch.tensor([[True, False], [True, True], [False, True]])
        >>> coverage(sets, torch.tensor([1, 0, 1]))
        0.6666666666666666
        >>> coverage((torch.tensor([0.0, 0.0]), torch.tensor([1.0, 1.0])), torch.tensor([0.5, 2.0]))
        0.5
    """
    where = "coverage"
    if isinstance(sets_or_intervals, tuple | list):
        low = _vector(sets_or_intervals[0], "lower", where)
        high = _vector(sets_or_intervals[1], "upper", where, low.shape[0])
        target = _vector(y, "y", where, low.shape[0])
        return float(((low <= target) & (target <= high)).double().mean().item())
    sets = torch.as_tensor(sets_or_intervals)
    if sets.ndim != 2 or sets.dtype != torch.bool:
        raise ConformalError(f"{where}: sets has shape {tuple(sets.shape)} and dtype {sets.dtype}; give"
                             " boolean sets of shape (n, C), or a pair (lower, upper) of intervals.")
    labels = _labels(y, sets.shape[0], sets.shape[1], where, "sets")
    return float(sets.gather(1, labels[:, None]).double().mean().item())


def mean_width(lower: TensorLike, upper: TensorLike) -> float:
    """The mean width ``upper - lower`` of intervals (``inf`` where any is infinite).

    Args:
        lower: Lower bounds, shape ``(n,)``.
        upper: Upper bounds, shape ``(n,)``.

    Returns:
        The mean width.

    Example:
        >>> mean_width(torch.tensor([0.0, 1.0]), torch.tensor([1.0, 4.0]))
        2.0
    """
    where = "mean_width"
    low = _vector(lower, "lower", where)
    return float((_vector(upper, "upper", where, low.shape[0]) - low).mean().item())


def mean_set_size(sets: TensorLike) -> float:
    """The mean number of classes per set.

    Args:
        sets: Boolean sets, shape ``(n, C)``.

    Returns:
        The mean set size.

    Example:
        >>> mean_set_size(torch.tensor([[True, False, True], [False, True, False]]))
        1.5
    """
    tensor = torch.as_tensor(sets)
    if tensor.ndim != 2 or tensor.dtype != torch.bool:
        raise ConformalError(f"mean_set_size: sets has shape {tuple(tensor.shape)} and dtype {tensor.dtype};"
                             " give boolean sets of shape (n, C).")
    return float(tensor.sum(1).double().mean().item())


def winkler_score(lower: TensorLike, upper: TensorLike, y: TensorLike, alpha: float) -> float:
    """The mean interval (Winkler) score of ``(1 - alpha)`` intervals; lower is better.

    Per row: ``(upper - lower) + (2 / alpha) * (lower - y)`` if ``y < lower``,
    ``+ (2 / alpha) * (y - upper)`` if ``y > upper`` (Gneiting & Raftery 2007, eq. 43): a proper score
    for the ``alpha/2`` and ``1 - alpha/2`` quantiles, rewarding narrow intervals and penalising misses
    by their distance.

    Args:
        lower: Lower bounds, shape ``(n,)``.
        upper: Upper bounds, shape ``(n,)``.
        y: Targets, shape ``(n,)``.
        alpha: The intervals' miscoverage level in ``(0, 1)``.

    Returns:
        The mean score.

    Example:
        >>> low, high = torch.tensor([0.0, 0.0, 0.0]), torch.tensor([1.0, 1.0, 1.0])
        >>> winkler_score(low, high, torch.tensor([0.5, 2.0, -0.5]), alpha=0.1)  # (1 + 21 + 11) / 3
        11.0
    """
    where = "winkler_score"
    alpha = _alpha(alpha, where)
    low = _vector(lower, "lower", where)
    n = low.shape[0]
    high, target = _vector(upper, "upper", where, n), _vector(y, "y", where, n)
    below = torch.clamp(low - target, min=0)
    above = torch.clamp(target - high, min=0)
    return float(((high - low) + (2 / alpha) * (below + above)).mean().item())
