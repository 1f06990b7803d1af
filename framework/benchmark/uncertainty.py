"""The benchmark's uncertainty scores: calibration, conformal sets and intervals, predictive distributions.

Every model of a cell is scored by the same functions from its outputs on the same rows:

* classification (every split scored): ``ece`` (top-label, ``ECE_BINS`` equal-width confidence bins,
  ``ExpectedCalibrationError``) and ``brier`` (squared error summed over classes, averaged over rows,
  ``BrierScore``: in ``[0, 2]``, twice scikit-learn's binary ``brier_score_loss``);
* split conformal at ``1 - alpha`` (test rows, calibrated on the calibration rows): ``lac`` and ``aps``
  sets (``*_coverage``, ``*_set_size``) and, for regression, ``abs`` intervals from absolute residuals
  and ``norm`` intervals normalised by a spread (the members' spread of a ripieno ensemble with more
  than one member, through ``EnsembleRegressor.conformalize``; the predicted standard deviation of a
  model with a predictive distribution), each with ``*_coverage``, ``*_width`` and ``*_winkler``
  (``ripieno.framework.uq.conformal``, tested equal to MAPIE);
* regression ``nll`` and ``crps`` only for a model with a predictive distribution: an estimator with
  a ``predictive_distribution(X) -> (mean, variance)`` method (``PREDICTIVE_DISTRIBUTION``, in the
  target's units: arrays ``(n,)``, a Gaussian per row, such as CatBoost with ``loss_function:
  RMSEWithUncertainty``; or ``(n, M)``, the members' Gaussians of an ensemble, scored as their
  equal-weight mixture; ``None`` for a model fitted without one), and ripieno's ensembles with
  ``regression_head: gaussian`` (``EnsembleRegressor.predict_distribution``, the members' means and
  variances); never a distribution made up from point predictions;
* regression ``qs``, the quantile score ``2 / L * sum_l pinball_l`` at the ``L = 19`` levels
  ``SCORE_LEVELS`` (0.05, 0.10, ..., 0.95): CRPS's quantile decomposition ``CRPS = 2 * integral_0^1
  pinball_tau d tau`` with equal weights on 19 levels (the forecasting literature's mean quantile loss;
  not CRPS itself: 4.8% above it for a standard Gaussian scored on its own draws), for every
  model with a predictive distribution (its quantiles) or with predictive quantiles at those levels
  (``PREDICTIVE_QUANTILES``, such as XGBoost and LightGBM with ``quantile_levels``): the one score that
  Gaussian and quantile models share; and ``cqr`` intervals (conformalised quantile regression on the
  ``alpha / 2`` and ``1 - alpha / 2`` quantiles) for a model with predictive quantiles.

Calibration rows (``ConformalSettings``): by default a stratified share of the table carved from the
training rows with a fixed seed before any model is fitted, the same rows for every model and seed,
so that the validation rows that early stopping has seen are never calibrated on; ``calibrate_on:
val`` reuses the validation rows on purpose; ``calibrate_on: none`` scores no conformal sets or
intervals and trains on every training row (the benchmark as it was before calibration existed).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.specs.table_splits import TableSplits

CALIBRATE_ON: tuple[str, ...] = ("train", "val", "none")
CALIBRATION_SPLIT = "cal"
"""The split that ``calibration_splits`` adds to a ``TableSplits``: the rows carved for calibration."""
ECE_BINS = 15
SCORE_LEVELS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 20))
"""The levels of the quantile score ``qs``: 0.05, 0.10, ..., 0.95 (module docstring)."""
PREDICTIVE_QUANTILES = "predictive_quantiles"
"""The method by which a regressor offers quantiles: ``predictive_quantiles(X) -> (levels, quantiles)``
with ``quantiles`` ``(n, len(levels))`` in the target's units, sorted along the levels."""
PREDICTIVE_DISTRIBUTION = "predictive_distribution"
"""The method by which a regressor offers ``nll`` and ``crps``: ``predictive_distribution(X) -> (mean,
variance)`` in the target's units, ``(n,)`` (a Gaussian per row) or ``(n, M)`` (a mixture's members)."""


@dataclass(frozen=True)
class ConformalSettings:
    """Where conformal prediction calibrates, and at which level (a benchmark file's ``conformal``).

    Attributes:
        alpha: miscoverage: sets and intervals at ``1 - alpha`` (0.1: 90%).
        calibration_size: ``calibrate_on: train``: the calibration rows, a fraction of all the table's
            rows (as ``val_size`` and ``test_size``), carved from the training rows.
        calibrate_on: ``train`` (carved rows, the default), ``val`` (the early-stopping rows, reused
            on purpose) or ``none`` (no conformal scores; every training row fits).
        seed: the carve's seed (the same rows for every model and seed; the APS draws too).
    """

    alpha: float = 0.1
    calibration_size: float = 0.1
    calibrate_on: str = "train"
    seed: int = 0

    def fingerprint(self) -> dict[str, Any] | None:
        """What of these settings decides a cell's result (``None``: ``none``, nothing does)."""
        if self.calibrate_on == "none":
            return None
        if self.calibrate_on == "val":
            return {"calibrate_on": "val", "alpha": self.alpha}
        return dataclasses.asdict(self)

    @property
    def split(self) -> str | None:
        """The split that calibrates: ``cal``, ``val`` or ``None``."""
        return {"train": CALIBRATION_SPLIT, "val": "val"}.get(self.calibrate_on)


def calibration_splits(data: TableSplits, settings: ConformalSettings) -> TableSplits:
    """``data`` with calibration rows carved from its training rows (``calibrate_on: train``).

    ``round(calibration_size * all rows)`` training rows, stratified by class for classification, drawn
    with ``settings.seed``, move to a ``cal`` split; both sides keep the table's row order. Other
    settings return ``data`` unchanged.

    Raises:
        RipienoInputError: the carve would leave a side empty, or too few rows for a stratified split.
    """
    if settings.calibrate_on != "train":
        return data
    from sklearn.model_selection import train_test_split

    y = np.asarray(data.targets["train"])
    n_train, n_all = len(y), sum(data.rows().values())
    count = round(settings.calibration_size * n_all)
    fix = "lower conformal.calibration_size, or set conformal.calibrate_on: val"
    if count < 1 or count >= n_train:
        raise RipienoInputError(
            f"conformal.calibration_size={settings.calibration_size} gives {count} of the {n_train} training"
            f" rows of {data.name or 'the table'}; a fraction that leaves both sides rows is needed ({fix})."
        )
    stratify = None
    if data.task != "regression":
        classes, counts = np.unique(y, return_counts=True)
        if min(count, n_train - count) < len(classes) or counts.min() < 2:
            raise RipienoInputError(
                f"conformal.calibration_size={settings.calibration_size} cannot carve {count} calibration"
                f" rows stratified by class from {n_train} training rows of {data.name or 'the table'} (its"
                f" {len(classes)} classes, the smallest with {counts.min()} rows); {fix}."
            )
        stratify = y
    train, cal = train_test_split(
        np.arange(n_train), test_size=count, random_state=settings.seed, stratify=stratify
    )
    train, cal = np.sort(train), np.sort(cal)
    frame = data.features["train"]
    features = {
        **data.features,
        "train": frame.iloc[train].reset_index(drop=True),
        CALIBRATION_SPLIT: frame.iloc[cal].reset_index(drop=True),
    }
    targets = {**data.targets, "train": y[train], CALIBRATION_SPLIT: y[cal]}
    return dataclasses.replace(data, features=features, targets=targets)


def probabilities(prediction: np.ndarray) -> np.ndarray:
    """Probabilities ``(n, C)`` in float64, floored at 1e-12 and renormalised (every score uses these)."""
    proba = np.clip(np.asarray(prediction, dtype=np.float64), 1e-12, 1.0)
    return proba / proba.sum(1, keepdims=True)


def calibration_scores(y: np.ndarray, proba: np.ndarray) -> dict[str, float]:
    """Top-label ECE (``ECE_BINS`` equal-width bins) and the multiclass Brier score of probabilities.

    Args:
        y: class codes ``(n,)``.
        proba: probabilities ``(n, C)``.

    Example:
        >>> s = calibration_scores(np.array([0, 0]), np.array([[0.8, 0.2], [0.4, 0.6]]))
        >>> round(s["ece"], 4), round(s["brier"], 4)  # (|0.8 - 1| + |0.6 - 0|) / 2; (0.08 + 0.72) / 2
        (0.4, 0.4)
    """
    import torch

    from ripieno.framework.metrics.uq import BrierScore, ExpectedCalibrationError

    probs = torch.as_tensor(np.asarray(proba, dtype=np.float64))
    target = torch.as_tensor(np.asarray(y)).long()
    ece = ExpectedCalibrationError(num_classes=probs.shape[1], n_bins=ECE_BINS, input_kind="probs")
    brier = BrierScore(input_kind="probs")
    ece.update(probs, target)
    brier.update(probs, target)
    return {"ece": float(ece.compute()), "brier": float(brier.compute())}


def set_scores(
    cal: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray], alpha: float, seed: int
) -> dict[str, float]:
    """Coverage and mean size of split-conformal LAC and APS sets on the test rows.

    APS randomises its calibration scores (MAPIE's way) with ``RandomState(seed).uniform``: the same
    draws for every model of a table; its sets keep the last label (MAPIE's default).

    Args:
        cal: the calibration rows' (class codes, probabilities).
        test: the test rows' (class codes, probabilities).
        alpha: miscoverage.
        seed: the APS draws' seed.
    """
    from ripieno.framework.uq.conformal import SplitConformal, coverage, mean_set_size

    (y_cal, p_cal), (y_test, p_test) = cal, test
    draws = np.random.RandomState(seed).uniform(size=len(y_cal))
    out: dict[str, float] = {}
    for method in ("lac", "aps"):
        fitted = SplitConformal(method, alpha).calibrate(p_cal, y_cal, u=draws if method == "aps" else None)
        sets = fitted.predict_sets(p_test)
        out[f"{method}_coverage"] = coverage(sets, y_test)
        out[f"{method}_set_size"] = mean_set_size(sets)
    return out


def interval_scores(
    name: str, lower: np.ndarray, upper: np.ndarray, y: np.ndarray, alpha: float
) -> dict[str, float]:
    """``{name}_coverage``, ``{name}_width`` and ``{name}_winkler`` of intervals on the test rows."""
    from ripieno.framework.uq.conformal import coverage, mean_width, winkler_score

    return {
        f"{name}_coverage": coverage((lower, upper), y),
        f"{name}_width": mean_width(lower, upper),
        f"{name}_winkler": winkler_score(lower, upper, y, alpha),
    }


def absolute_intervals(
    cal: tuple[np.ndarray, np.ndarray], point: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Split-conformal intervals from absolute residuals: ``point ± qhat`` (``cal``: targets, predictions)."""
    from ripieno.framework.uq.conformal import SplitConformal

    y_cal, point_cal = cal
    lower, upper = SplitConformal("absolute", alpha).calibrate(point_cal, y_cal).predict_intervals(point)
    return lower.numpy(), upper.numpy()


def normalized_intervals(
    cal: tuple[np.ndarray, np.ndarray, np.ndarray], point: np.ndarray, sigma: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Split-conformal intervals ``point ± qhat * sigma`` (``cal``: targets, predictions, sigmas)."""
    from ripieno.framework.uq.conformal import SplitConformal

    y_cal, point_cal, sigma_cal = cal
    fitted = SplitConformal("normalized", alpha).calibrate((point_cal, sigma_cal), y_cal)
    lower, upper = fitted.predict_intervals((point, sigma))
    return lower.numpy(), upper.numpy()


def predictive_std(mean: np.ndarray, variance: np.ndarray) -> np.ndarray:
    """Each row's predictive standard deviation ``(n,)``: of its Gaussian, or of its mixture ``(n, M)``.

    Example:
        >>> predictive_std(np.array([[0.0, 2.0]]), np.array([[1.0, 1.0]]))  # sqrt(1 + var(0, 2))
        array([1.41421356])
    """
    mean, variance = np.asarray(mean, dtype=np.float64), np.asarray(variance, dtype=np.float64)
    if mean.ndim == 2:
        return np.sqrt(variance.mean(1) + mean.var(1))
    return np.sqrt(variance)


def distribution_scores(y: np.ndarray, mean: np.ndarray, variance: np.ndarray) -> dict[str, float]:
    """NLL (with ``log 2 pi``), CRPS (closed form) and ``qs`` of each row's Gaussian or equal-weight mixture.

    Args:
        y: targets ``(n,)``.
        mean: the Gaussians' means ``(n,)``, or the mixture components' means ``(n, M)``.
        variance: their variances, shaped as ``mean``.

    Example:
        >>> s = distribution_scores(np.array([0.0]), np.array([0.0]), np.array([1.0]))
        >>> round(s["nll"], 4), round(s["crps"], 4)  # log(2 pi) / 2; 2 phi(0) - 1 / sqrt(pi)
        (0.9189, 0.2337)
    """
    import torch

    target = torch.as_tensor(np.asarray(y, dtype=np.float64))
    mu = torch.as_tensor(np.asarray(mean, dtype=np.float64))
    var = torch.as_tensor(np.asarray(variance, dtype=np.float64))
    if mu.ndim == 2:  # the members' Gaussians of a distributional ensemble: their mixture, not its moments
        from ripieno.framework.metrics.mixture import mixture_crps, mixture_nll

        found = {"nll": float(mixture_nll(mu, var, target).double().mean()),
                 "crps": float(mixture_crps(mu, var, target).double().mean())}
    else:
        from ripieno.framework.metrics.uq import EnsembleCRPS, GaussianNLL

        nll, crps = GaussianNLL(), EnsembleCRPS()
        nll.update(mu, target, var=var)
        crps.update(mu[:, None], target, noise_var=var)  # one member: the Gaussian's own CRPS
        found = {"nll": float(nll.compute()), "crps": float(crps.compute())}
    quantiles = distribution_quantiles(mean, variance, SCORE_LEVELS)
    return {**found, "qs": quantile_score(np.asarray(y, dtype=np.float64), SCORE_LEVELS, quantiles)}


def distribution_quantiles(mean: np.ndarray, variance: np.ndarray, levels: tuple[float, ...]) -> np.ndarray:
    """Quantiles ``(n, L)`` at ``levels`` of each row's Gaussian ``(n,)`` or equal-weight mixture ``(n, M)``.

    A Gaussian's are closed form (``scipy.stats.norm.ppf``); a mixture's are found by bisection of its
    CDF between the smallest and largest of its components' own quantiles (the mixture's quantile lies
    between them), to ``2**-40`` of that bracket's width.

    Example:
        >>> distribution_quantiles(np.array([1.0]), np.array([4.0]), (0.5, 0.8413447460685429)).round(6)
        array([[1., 3.]])
        >>> distribution_quantiles(np.array([[0.0, 2.0]]), np.array([[1.0, 1.0]]), (0.5,)).round(6)
        array([[1.]])
    """
    from scipy.special import ndtr
    from scipy.stats import norm

    mean, sd = np.asarray(mean, dtype=np.float64), np.sqrt(np.asarray(variance, dtype=np.float64))
    z = norm.ppf(np.asarray(levels, dtype=np.float64))
    if mean.ndim == 1:
        return mean[:, None] + sd[:, None] * z[None, :]
    own = mean[:, :, None] + sd[:, :, None] * z[None, None, :]  # (n, M, L): each component's quantiles
    low, high = own.min(1), own.max(1)
    for _ in range(40):  # 2^-40 of the bracket
        middle = (low + high) / 2
        below = ndtr((middle[:, None, :] - mean[:, :, None]) / sd[:, :, None]).mean(1) < np.asarray(levels)
        low, high = np.where(below, middle, low), np.where(below, high, middle)
    return (low + high) / 2


def quantile_score(y: np.ndarray, levels: tuple[float, ...], quantiles: np.ndarray) -> float:
    """The quantile score ``qs`` at ``SCORE_LEVELS``: twice the pinball loss averaged over them and the rows.

    Args:
        y: targets ``(n,)``.
        levels: the levels of ``quantiles``' columns (every ``SCORE_LEVELS`` level among them).
        quantiles: ``(n, len(levels))``.

    Example:
        >>> quantile_score(np.array([1.0]), SCORE_LEVELS, np.zeros((1, 19)))  # 2 * mean(levels) * 1
        1.0
    """
    from sklearn.metrics import mean_pinball_loss

    columns = [list(levels).index(level) for level in SCORE_LEVELS]
    quantiles = np.asarray(quantiles, dtype=np.float64)
    return 2.0 * float(np.mean([mean_pinball_loss(y, quantiles[:, c], alpha=level)
                                for c, level in zip(columns, SCORE_LEVELS, strict=True)]))


def cqr_intervals(
    cal: tuple[np.ndarray, np.ndarray, np.ndarray], lower: np.ndarray, upper: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray]:
    """Conformalised quantile regression: ``[lower - qhat, upper + qhat]`` (``cal``: y, lowers, uppers)."""
    from ripieno.framework.uq.conformal import SplitConformal

    y_cal, lower_cal, upper_cal = cal
    fitted = SplitConformal("cqr", alpha).calibrate((lower_cal, upper_cal), y_cal)
    low, high = fitted.predict_intervals((lower, upper))
    return low.numpy(), high.numpy()
