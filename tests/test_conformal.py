"""Split conformal prediction (ripieno.framework.uq.conformal) against MAPIE 1.6 and closed forms.

MAPIE gets the SAME model outputs as ripieno: a scikit-learn estimator that returns stored probabilities
or predictions for the row indices it is given (X is the row-index column), with ``prefit=True``. Sets
must be equal as booleans, intervals to 1e-12.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
import pytest
import torch
from mapie.classification import SplitConformalClassifier
from mapie.conformity_scores import RAPSConformityScore
from mapie.regression import ConformalizedQuantileRegressor, SplitConformalRegressor
from mapie.utils import _compute_classification_quantile, _compute_regression_quantile
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.model_selection import StratifiedShuffleSplit

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.uq.conformal import (
    ConformalError,
    SplitConformal,
    absolute_intervals,
    absolute_scores,
    aps_scores,
    aps_sets,
    candidate_scores,
    class_quantiles,
    conformal_quantile,
    conformal_rank,
    coverage,
    cqr_intervals,
    cqr_quantiles,
    cqr_scores,
    lac_scores,
    lac_sets,
    mean_set_size,
    mean_width,
    min_calibration_rows,
    normalized_intervals,
    normalized_scores,
    raps_scores,
    raps_sets,
    winkler_score,
)

N_CAL, N_TEST, C = 500, 300, 5
LEVELS = (0.9, 0.8)
ALPHAS = (0.1, 0.2)  # MAPIE's alpha: float(Decimal("1") - Decimal(str(level))), exactly 0.1 and 0.2
SEED = 7  # MAPIE's random_state: its APS/RAPS draws are np.random.RandomState(SEED).uniform(...)
CAL = np.arange(N_CAL)
TEST = np.arange(N_CAL, N_CAL + N_TEST)


class StoredClassifier(ClassifierMixin, BaseEstimator):
    """A prefit classifier whose predict_proba returns the stored row of each row index in X[:, 0]."""

    def __init__(self, probs: np.ndarray | None = None):
        self.probs = probs

    def fit(self, X, y=None):  # noqa: N803
        return self

    def predict_proba(self, X):  # noqa: N803
        return self.probs[np.asarray(X)[:, 0].astype(int)]

    def predict(self, X):  # noqa: N803
        return self.predict_proba(X).argmax(1)


class StoredRegressor(RegressorMixin, BaseEstimator):
    """A prefit regressor whose predict returns the stored value of each row index in X[:, 0]."""

    def __init__(self, values: np.ndarray | None = None):
        self.values = values

    def fit(self, X, y=None):  # noqa: N803
        return self

    def predict(self, X):  # noqa: N803
        return self.values[np.asarray(X)[:, 0].astype(int)]


def _stored_classifier(probs):
    estimator = StoredClassifier(probs)
    estimator.classes_ = np.arange(probs.shape[1])  # what MAPIE checks to call a classifier fitted
    return estimator


def _stored_regressor(values):
    estimator = StoredRegressor(values)
    estimator.coef_ = np.zeros(1)  # what MAPIE checks to call a regressor fitted
    return estimator


def _rows(index):
    return index[:, None]


@functools.cache
def _classification_data(name: str) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities ``(800, C)`` and labels.

    ``softmax``: the softmax of random logits, labels drawn from those probabilities (calibrated).
    ``peaked``: logits 4 times as spread, so 17% of probabilities are below MAPIE's EPSILON (1e-8), and 35%
    of labels uniform: thresholds near 1 reach those tiny probabilities, where MAPIE's tolerances and
    its zero-probability rule decide the sets.
    """
    rng = np.random.default_rng(20240611 if name == "softmax" else 3)
    logits = rng.normal(scale=2.0 if name == "softmax" else 8.0, size=(N_CAL + N_TEST, C))
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    labels = np.minimum((probs.cumsum(1) < rng.random(len(probs))[:, None]).sum(1), C - 1)
    if name == "peaked":
        labels = np.where(rng.random(len(labels)) < 0.35, rng.integers(0, C, len(labels)), labels)
    return probs, labels


DATASETS = ("softmax", "peaked")


@pytest.fixture(scope="module")
def classification():
    """The calibrated ``softmax`` data: exchangeable rows with distinct scores."""
    return _classification_data("softmax")


@pytest.fixture(scope="module")
def regression():
    """A linear model with heteroscedastic noise; yhat is a least-squares line from separate rows."""
    rng = np.random.default_rng(11)

    def draw(n):
        x = rng.uniform(-2, 2, n)
        sigma = 0.2 + 0.5 * np.abs(x)
        return x, sigma, 1.5 * x + 0.3 + sigma * rng.normal(size=n)

    x_fit, _, y_fit = draw(200)
    slope, intercept = np.polyfit(x_fit, y_fit, 1)
    x, sigma, y = draw(N_CAL + N_TEST)
    yhat = slope * x + intercept
    # Quantile predictions too narrow below and too wide above: the CQR corrections have opposite signs.
    lower, upper = yhat - 0.8 * sigma, yhat + 2.2 * sigma
    return y, yhat, sigma, lower, upper


def _mapie_classifier(probs, labels, score, include_last_label=True):
    mapie = SplitConformalClassifier(_stored_classifier(probs), confidence_level=list(LEVELS),
                                     conformity_score=score, prefit=True, random_state=SEED)
    mapie.conformalize(_rows(CAL), labels[CAL])
    params = {"include_last_label": include_last_label}
    _, sets = mapie.predict_set(_rows(TEST), conformity_score_params=params)
    assert mapie._alphas == list(ALPHAS)
    return mapie, sets


# ---------------------------------------------------------------- the threshold


def test_conformal_quantile_is_mapies_quantile():
    """The k-th smallest score equals mapie.utils' classification and regression quantiles."""
    rng = np.random.default_rng(0)
    checked = 0
    for n in [*range(1, 80), 99, 199, 200, 499, 500, 999, 1000]:
        scores = rng.normal(size=n)
        for alpha in (0.01, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 1 / 3, 0.5, 0.9):
            ours = conformal_quantile(torch.from_numpy(scores), alpha)
            k = conformal_rank(n, alpha)
            # MAPIE's regression path passes alpha_ref = 1 - alpha (SplitConformalRegressor, "absolute").
            regression = _compute_regression_quantile(scores, np.array([1 - alpha]), unbounded=True)[0, 0]
            assert ours == regression
            if k > n:
                assert ours == math.inf and n < min_calibration_rows(alpha)
                continue
            assert n >= min_calibration_rows(alpha)
            classification = _compute_classification_quantile(scores, np.array([alpha]))[0]
            assert ours == np.sort(scores)[k - 1] == classification
            checked += 1
    assert checked > 500


def test_min_calibration_rows_is_the_first_finite_threshold():
    for alpha in (0.5, 0.3, 0.25, 0.2, 0.1, 0.05, 0.01, 1 / 3, 0.07):
        need = min_calibration_rows(alpha)
        assert conformal_rank(need, alpha) <= need
        assert need == 1 or conformal_rank(need - 1, alpha) > need - 1


# ---------------------------------------------------------------- classification against MAPIE


@pytest.mark.parametrize("data", DATASETS)
def test_lac_sets_equal_mapie(data):
    probs, labels = _classification_data(data)
    mapie, sets = _mapie_classifier(probs, labels, "lac")
    np.testing.assert_array_equal(lac_scores(probs[CAL], labels[CAL]).numpy(), mapie.conformity_scores[:, 0])
    for i, alpha in enumerate(ALPHAS):
        fitted = SplitConformal("lac", alpha).calibrate(probs[CAL], labels[CAL])
        assert fitted.qhat == mapie._mapie_classifier.conformity_score_function_.quantiles_[i]
        ours = fitted.predict_sets(probs[TEST]).numpy()
        np.testing.assert_array_equal(ours, sets[:, :, i])
        assert len(np.unique(ours.sum(1))) >= 3  # sets of several sizes: the comparison means something


@pytest.mark.parametrize("data", DATASETS)
@pytest.mark.parametrize("include_last_label", [True, False, "randomized"])
def test_aps_sets_equal_mapie(data, include_last_label):
    probs, labels = _classification_data(data)
    mapie, sets = _mapie_classifier(probs, labels, "aps", include_last_label)
    # MAPIE's draws (check_random_state(SEED) is a fresh RandomState(SEED) at each use).
    u_cal = np.random.RandomState(SEED).uniform(size=N_CAL)
    u_test = np.random.RandomState(SEED).uniform(size=N_TEST)
    scores = aps_scores(probs[CAL], labels[CAL], u=u_cal).numpy()
    np.testing.assert_allclose(scores, mapie.conformity_scores[:, 0], rtol=0, atol=1e-15)
    for i, alpha in enumerate(ALPHAS):
        fitted = SplitConformal("aps", alpha, include_last_label=include_last_label)
        fitted = fitted.calibrate(probs[CAL], labels[CAL], u=u_cal)
        assert fitted.qhat == pytest.approx(mapie._mapie_classifier.quantiles_[i], abs=1e-15)
        ours = fitted.predict_sets(probs[TEST], u=u_test).numpy()
        np.testing.assert_array_equal(ours, sets[:, :, i])
        sizes = ours.sum(1)
        assert len(np.unique(sizes)) >= 3
        assert (sizes == 0).any() <= (include_last_label == "randomized")  # only randomised sets can be empty


@pytest.mark.parametrize("data", DATASETS)
@pytest.mark.parametrize("include_last_label", [True, False, "randomized"])
def test_raps_sets_equal_mapie_with_its_k_reg_and_lambda(data, include_last_label):
    """MAPIE tunes k_reg and lambda on a stratified share of the calibration rows and calibrates on the rest.

    Its API cannot fix them, so ripieno gets MAPIE's chosen values and the same calibration rows (in the
    order MAPIE scores them, which fixes which uniform draw goes with which row).
    """
    probs, labels = _classification_data(data)
    mapie, sets = _mapie_classifier(probs, labels, "raps", include_last_label)
    score = mapie._mapie_classifier.conformity_score_function_
    split = StratifiedShuffleSplit(n_splits=1, test_size=None, random_state=SEED)
    kept, tuning = next(split.split(_rows(CAL), labels[CAL]))
    np.testing.assert_array_equal(score.X_raps, _rows(CAL)[tuning])  # the same split as MAPIE's
    rows = CAL[kept]
    u_cal = np.random.RandomState(SEED).uniform(size=len(rows))
    u_test = np.random.RandomState(SEED).uniform(size=N_TEST)
    k_star, lambda_star = np.atleast_1d(score.k_star), np.atleast_1d(score.lambda_star)
    for i, alpha in enumerate(ALPHAS):
        k_reg, lam = int(k_star[i]), float(lambda_star[i])
        assert k_reg == k_star[i] and 1 <= k_reg <= C and lam > 0
        fitted = SplitConformal("raps", alpha, k_reg=k_reg, lam=lam, include_last_label=include_last_label)
        fitted = fitted.calibrate(probs[rows], labels[rows], u=u_cal)
        assert fitted.qhat == pytest.approx(score.quantiles_[i], abs=1e-15)
        ours = fitted.predict_sets(probs[TEST], u=u_test).numpy()
        np.testing.assert_array_equal(ours, sets[:, :, i])
        assert len(np.unique(ours.sum(1))) >= 2


@pytest.mark.parametrize("data", DATASETS)
@pytest.mark.parametrize("include_last_label", [True, False, "randomized"])
@pytest.mark.parametrize(("k_reg", "lam"), [(0, 0.002), (1, 0.01), (1, 0.05)])
def test_raps_equals_mapies_score_with_k_reg_and_lambda_fixed(data, include_last_label, k_reg, lam):
    """MAPIE's RAPSConformityScore with k_star and lambda_star set, on all calibration rows.

    Small penalties give sets of k_reg + 2 labels and more, where the randomised rule's V (Angelopoulos et
    al.'s denominator p - lam * max(0, L - k) + lam * (L > k)) differs from APS's.
    """
    probs, labels = _classification_data(data)
    alpha = 0.1
    u_cal = np.random.RandomState(SEED).uniform(size=N_CAL)
    score = RAPSConformityScore()
    score.set_external_attributes(classes=np.arange(C), random_state=SEED)
    mass, cutoff = score.get_true_label_cumsum_proba(labels[CAL], probs[CAL], np.arange(C))
    randomized = mass - u_cal[:, None] * probs[CAL, labels[CAL]][:, None]
    theirs = score._regularize_conformity_score(np.array([k_reg]), lam, randomized, cutoff)
    quantiles = _compute_classification_quantile(theirs, np.array([alpha]))
    fitted = SplitConformal("raps", alpha, k_reg=k_reg, lam=lam, include_last_label=include_last_label)
    fitted = fitted.calibrate(probs[CAL], labels[CAL], u=u_cal)
    np.testing.assert_allclose(raps_scores(probs[CAL], labels[CAL], k_reg=k_reg, lam=lam, u=u_cal).numpy(),
                               theirs[:, 0, 0], rtol=0, atol=1e-15)
    assert fitted.qhat == pytest.approx(quantiles[0], abs=1e-15)
    score.quantiles_, score.k_star, score.lambda_star = quantiles, np.array([k_reg]), lam
    sets = score.get_prediction_sets(probs[TEST][:, :, None], theirs, np.array([alpha]), cv="prefit",
                                     include_last_label=include_last_label)
    u_test = np.random.RandomState(SEED).uniform(size=N_TEST)
    ours = fitted.predict_sets(probs[TEST], u=u_test).numpy()
    np.testing.assert_array_equal(ours, sets[:, :, 0])
    assert (ours.sum(1) >= k_reg + 2).any()


def test_raps_score_closed_form_and_zero_penalty_is_aps(classification):
    probs, labels = classification
    u = torch.rand(N_CAL, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    p, y = probs[CAL], labels[CAL]
    # By hand: rank of the true label (1 = most probable), the mass ranked at or above it, u * p_y.
    p_y = p[np.arange(N_CAL), y]
    rank = (p > p_y[:, None]).sum(1) + 1
    mass = np.where(p >= p_y[:, None], p, 0.0).sum(1)
    hand = mass - u.numpy() * p_y + 0.3 * np.maximum(0, rank - 2)
    ours = raps_scores(p, y, k_reg=2, lam=0.3, u=u).numpy()
    np.testing.assert_allclose(ours, hand, rtol=0, atol=1e-12)
    aps = SplitConformal("aps", 0.1).calibrate(p, y, u=u)
    zero = SplitConformal("raps", 0.1, k_reg=1, lam=0.0).calibrate(p, y, u=u)
    assert zero.qhat == aps.qhat
    assert torch.equal(zero.predict_sets(probs[TEST]), aps.predict_sets(probs[TEST]))


def test_aps_generator_draws_are_reproducible(classification):
    probs, labels = classification
    first = aps_scores(probs[CAL], labels[CAL], generator=torch.Generator().manual_seed(3))
    again = aps_scores(probs[CAL], labels[CAL], generator=torch.Generator().manual_seed(3))
    plain = aps_scores(probs[CAL], labels[CAL], randomized=False)
    assert torch.equal(first, again)
    assert (first <= plain).all() and (first < plain).any()
    draw = [aps_sets(probs[TEST], 0.9, include_last_label="randomized",
                     generator=torch.Generator().manual_seed(1)) for _ in range(2)]
    assert torch.equal(*draw)


# ---------------------------------------------------------------- regression against MAPIE


def test_absolute_intervals_equal_mapie(regression):
    y, yhat, *_ = regression
    mapie = SplitConformalRegressor(_stored_regressor(yhat), confidence_level=list(LEVELS),
                                    conformity_score="absolute", prefit=True)
    mapie.conformalize(_rows(CAL), y[CAL])
    _, intervals = mapie.predict_interval(_rows(TEST))
    np.testing.assert_array_equal(absolute_scores(y[CAL], yhat[CAL]).numpy(), mapie.conformity_scores)
    for i, alpha in enumerate(ALPHAS):
        fitted = SplitConformal("absolute", alpha).calibrate(yhat[CAL], y[CAL])
        lower, upper = fitted.predict_intervals(yhat[TEST])
        np.testing.assert_allclose(lower.numpy(), intervals[:, 0, i], rtol=0, atol=1e-12)
        np.testing.assert_allclose(upper.numpy(), intervals[:, 1, i], rtol=0, atol=1e-12)


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("level", LEVELS)
def test_cqr_intervals_equal_mapie(regression, level, symmetric):
    """MAPIE's default (symmetric_correction=False) corrects each side at alpha/2; True is Romano et al.'s."""
    y, yhat, _, lower, upper = regression
    alpha = ALPHAS[LEVELS.index(level)]
    estimators = [_stored_regressor(lower), _stored_regressor(upper), _stored_regressor(yhat)]
    mapie = ConformalizedQuantileRegressor(estimators, confidence_level=level, prefit=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mapie.conformalize(_rows(CAL), y[CAL])
        _, intervals = mapie.predict_interval(_rows(TEST), symmetric_correction=symmetric)
    np.testing.assert_array_equal(cqr_scores(y[CAL], lower[CAL], upper[CAL]).numpy(),
                                  mapie.conformity_scores[2])
    fitted = SplitConformal("cqr", alpha, symmetric=symmetric).calibrate((lower[CAL], upper[CAL]), y[CAL])
    ours_lower, ours_upper = fitted.predict_intervals((lower[TEST], upper[TEST]))
    np.testing.assert_allclose(ours_lower.numpy(), intervals[:, 0, 0], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ours_upper.numpy(), intervals[:, 1, 0], rtol=0, atol=1e-12)
    q_lower, q_upper = fitted.thresholds.tolist()
    assert q_lower == q_upper if symmetric else q_lower > 0 > q_upper  # widen below, narrow above
    assert (q_lower, q_upper) == cqr_quantiles(y[CAL], lower[CAL], upper[CAL], alpha, symmetric=symmetric)


# ---------------------------------------------------------------- the normalized score (closed form)


def test_normalized_score_closed_form():
    y = torch.tensor([1.0, 2.0, 3.0, 4.0, 10.0])
    yhat = torch.zeros(5)
    sigma = torch.tensor([1.0, 2.0, 1.0, 4.0, 5.0])
    ratios = normalized_scores(y, yhat, sigma)
    assert ratios.tolist() == [1.0, 1.0, 3.0, 1.0, 2.0]  # |y - yhat| / sigma by hand
    # alpha = 0.35: k = ceil(6 * 0.65) = 4, the 4th smallest of [1, 1, 1, 2, 3] is 2.
    fitted = SplitConformal("normalized", 0.35).calibrate((yhat, sigma), y)
    assert fitted.qhat == 2.0 == conformal_quantile(ratios, 0.35)
    lower, upper = fitted.predict_intervals((torch.tensor([0.0, 1.0]), torch.tensor([1.0, 0.5])))
    assert lower.tolist() == [-2.0, 0.0] and upper.tolist() == [2.0, 2.0]  # yhat -/+ qhat * sigma
    by_function = normalized_intervals([0.0, 1.0], [1.0, 0.5], 2.0)
    assert [t.tolist() for t in by_function] == [[-2.0, 0.0], [2.0, 2.0]]


def test_normalized_equals_absolute_with_unit_spread(regression):
    y, yhat, *_ = regression
    ones = np.ones_like(yhat)
    normalized = SplitConformal("normalized", 0.1).calibrate((yhat[CAL], ones[CAL]), y[CAL])
    absolute = SplitConformal("absolute", 0.1).calibrate(yhat[CAL], y[CAL])
    assert normalized.qhat == absolute.qhat
    for ours, theirs in zip(normalized.predict_intervals((yhat[TEST], ones[TEST])),
                            absolute.predict_intervals(yhat[TEST]), strict=True):
        assert torch.equal(ours, theirs)


# ---------------------------------------------------------------- the coverage guarantee


def _split_coverages(scores: torch.Tensor, n_cal: int, alpha: float, splits: int, seed: int) -> torch.Tensor:
    """Coverage of the other rows by the threshold of n_cal random rows, for `splits` random splits."""
    generator = torch.Generator().manual_seed(seed)
    out = torch.empty(splits, dtype=torch.float64)
    for s in range(splits):
        order = torch.randperm(scores.shape[0], generator=generator)
        qhat = conformal_quantile(scores[order[:n_cal]], alpha)
        out[s] = (scores[order[n_cal:]] <= qhat).double().mean()
    return out


def _assert_within_bounds(coverages: torch.Tensor, alpha: float, n_cal: int) -> None:
    # For a fixed pool of exchangeable rows and a uniformly random split, a test row's score is at most the
    # k-th smallest of n calibration scores with probability k/(n+1), in [1 - alpha, 1 - alpha + 1/(n+1)]
    # (distinct scores): each split's coverage is an unbiased estimate of it and the splits are i.i.d.
    # given the pool, so their mean is within 4 standard errors (std over splits / sqrt(splits)) of it
    # but for a 6e-5 chance (normal approximation; the seed is fixed, so the test is deterministic).
    tolerance = 4 * coverages.std().item() / math.sqrt(coverages.shape[0])
    mean = coverages.mean().item()
    assert 1 - alpha - tolerance <= mean <= 1 - alpha + 1 / (n_cal + 1) + tolerance
    assert tolerance < 0.015  # a few hundred rows per split: the check is not vacuous


def test_lac_and_absolute_coverage_over_random_splits(classification, regression):
    probs, labels = classification
    y, yhat, *_ = regression
    alpha, n_cal = 0.1, 199
    lac = lac_scores(probs, labels)  # 800 rows: 199 calibrate, 601 test, per split
    absolute = absolute_scores(y, yhat)
    for scores in (lac, absolute):
        _assert_within_bounds(_split_coverages(scores, n_cal, alpha, 200, seed=5), alpha, n_cal)
    # The same through the sets and intervals themselves, on one split.
    fitted = SplitConformal("lac", alpha).calibrate(probs[:n_cal], labels[:n_cal])
    sets = fitted.predict_sets(probs[n_cal:])
    assert coverage(sets, labels[n_cal:]) == (lac[n_cal:] <= fitted.qhat + 1e-8).double().mean().item()


# ---------------------------------------------------------------- Mondrian


def _hard_class_data(n: int, seed: int):
    """Classes 0 and 1 are easy; class 2 (10% of rows) is confused with the others by the model."""
    rng = np.random.default_rng(seed)
    labels = rng.choice(3, size=n, p=[0.45, 0.45, 0.10])
    logits = rng.normal(size=(n, 3))
    easy = labels < 2
    logits[easy, labels[easy]] += 3.0
    logits[~easy, rng.integers(0, 2, size=int((~easy).sum()))] += 2.0
    logits[~easy, 2] -= 0.5
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return probs, labels


def test_mondrian_covers_every_class_where_marginal_lac_fails_the_hard_one():
    probs, labels = _hard_class_data(3000, seed=1)
    p, y = torch.from_numpy(probs), torch.from_numpy(labels)
    alpha, n_cal, splits = 0.1, 1500, 200
    scores = lac_scores(p, y)
    generator = torch.Generator().manual_seed(2)
    marginal_cover = torch.empty(splits, 3, dtype=torch.float64)
    mondrian_cover = torch.empty(splits, 3, dtype=torch.float64)
    fewest = n_cal
    for s in range(splits):
        order = torch.randperm(len(y), generator=generator)
        cal, test = order[:n_cal], order[n_cal:]
        q_marginal = conformal_quantile(scores[cal], alpha)
        q_mondrian = class_quantiles(scores[cal], y[cal], 3, alpha)
        covered_marginal = (scores[test] <= q_marginal + 1e-8).double()
        covered_mondrian = (scores[test] <= q_mondrian[y[test]] + 1e-8).double()
        if s == 0:  # the same through SplitConformal; one threshold per class: conformal_quantile of its rows
            mondrian = SplitConformal("lac", alpha, mondrian=True).calibrate(p[cal], y[cal])
            expected = [conformal_quantile(scores[cal][y[cal] == c], alpha) for c in range(3)]
            assert mondrian.thresholds.tolist() == expected == q_mondrian.tolist()
            in_set = mondrian.predict_sets(p[test]).gather(1, y[test, None])[:, 0]
            assert torch.equal(in_set.double(), covered_mondrian)
            marginal = SplitConformal("lac", alpha).calibrate(p[cal], y[cal])
            in_set = marginal.predict_sets(p[test]).gather(1, y[test, None])[:, 0]
            assert marginal.qhat == q_marginal and torch.equal(in_set.double(), covered_marginal)
        fewest = min(fewest, int(torch.bincount(y[cal], minlength=3).min()))
        for c in range(3):
            mine = y[test] == c
            marginal_cover[s, c] = covered_marginal[mine].mean()
            mondrian_cover[s, c] = covered_mondrian[mine].mean()
    for c in range(3):  # per class: the same bounds as marginal coverage, with n the class's calibration rows
        _assert_within_bounds(mondrian_cover[:, c], alpha, fewest)
    assert marginal_cover[:, 2].mean() < 1 - alpha - 0.3  # marginal LAC leaves the hard class uncovered
    assert marginal_cover[:, :2].mean() > 1 - alpha  # ... and makes up for it on the easy ones


def test_mondrian_class_with_too_few_rows_is_in_every_set(classification):
    probs, labels = classification
    rows = np.concatenate([np.flatnonzero(labels[CAL] != 4), np.flatnonzero(labels[CAL] == 4)[:3]])
    fitted = SplitConformal("lac", 0.1, mondrian=True).calibrate(probs[rows], labels[rows])
    assert math.isinf(fitted.thresholds[4]) and torch.isfinite(fitted.thresholds[:4]).all()
    sets = fitted.predict_sets(probs[TEST])
    assert sets[:, 4].all() and not sets[:, :4].all()
    # APS Mondrian: the labels whose own (randomised) score is within their class's threshold.
    u = np.random.RandomState(0).uniform(size=len(rows))
    aps = SplitConformal("aps", 0.1, mondrian=True).calibrate(probs[rows], labels[rows], u=u)
    expected = class_quantiles(aps_scores(probs[rows], labels[rows], u=u), labels[rows], C, 0.1)
    assert torch.equal(aps.thresholds, expected)
    u_test = np.random.RandomState(1).uniform(size=N_TEST)
    candidates = candidate_scores(probs[TEST], "aps", u=u_test)
    assert torch.equal(aps.predict_sets(probs[TEST], u=u_test), candidates - expected <= 1e-8)


# ---------------------------------------------------------------- too few rows: +inf


def test_too_few_rows_give_infinite_thresholds(classification, regression):
    probs, labels = classification
    y, yhat, sigma, lower, upper = regression
    five = np.arange(5)  # k = ceil(6 * 0.9) = 6 > 5 at alpha = 0.1
    assert conformal_rank(5, 0.1) == 6 and conformal_quantile(torch.arange(5.0), 0.1) == math.inf
    for method, extra in (("lac", {}), ("aps", {}), ("raps", {"k_reg": 1, "lam": 0.1})):
        fitted = SplitConformal(method, 0.1, **extra).calibrate(probs[five], labels[five])
        assert fitted.qhat == math.inf
        for rule in (True, False, "randomized"):
            sets = dataclass_replace(fitted, include_last_label=rule).predict_sets(probs[TEST])
            assert sets.all()
    for method, outputs, new in (("absolute", yhat[five], yhat[TEST]),
                                 ("normalized", (yhat[five], sigma[five]), (yhat[TEST], sigma[TEST])),
                                 ("cqr", (lower[five], upper[five]), (lower[TEST], upper[TEST]))):
        low, high = SplitConformal(method, 0.1).calibrate(outputs, y[five]).predict_intervals(new)
        assert (low == -math.inf).all() and (high == math.inf).all()
        assert coverage((low, high), y[TEST]) == 1.0 and mean_width(low, high) == math.inf
    # CQR's default needs more rows: alpha/2 per side.
    assert min_calibration_rows(0.1) == 9 and min_calibration_rows(0.2) == 4
    assert SplitConformal("cqr", 0.2).calibrate((lower[:8], upper[:8]), y[:8]).thresholds.isinf().all()
    assert SplitConformal("cqr", 0.2, symmetric=True).calibrate((lower[:8], upper[:8]), y[:8]).qhat < math.inf


def dataclass_replace(fitted, **changes):
    import dataclasses

    return dataclasses.replace(fitted, **changes)


# ---------------------------------------------------------------- metrics


def test_metrics_closed_forms():
    sets = torch.tensor([[True, False, True], [False, False, True], [True, True, True]])
    assert coverage(sets, torch.tensor([0, 1, 1])) == pytest.approx(2 / 3)
    assert mean_set_size(sets) == 2.0
    low, high = torch.tensor([0.0, 1.0, -1.0]), torch.tensor([2.0, 2.0, 1.0])
    y = torch.tensor([1.0, 3.0, -2.0])
    assert coverage((low, high), y) == pytest.approx(1 / 3)
    assert mean_width(low, high) == pytest.approx(5 / 3)
    # Winkler at alpha = 0.2: 2; 1 + 10 * 1; 2 + 10 * 1.
    assert winkler_score(low, high, y, 0.2) == pytest.approx((2 + 11 + 12) / 3)


def test_winkler_score_is_mean_pinball_loss_times_two_over_alpha(regression):
    """Gneiting & Raftery (2007): IS_alpha = (2/alpha) * (pinball_{alpha/2}(lo) + pinball_{1-alpha/2}(hi))."""
    y, _, _, lower, upper = regression

    def pinball(q, tau):
        return np.mean(np.maximum(tau * (y - q), (tau - 1) * (y - q)))

    alpha = 0.2
    expected = (2 / alpha) * (pinball(lower, alpha / 2) + pinball(upper, 1 - alpha / 2))
    assert winkler_score(lower, upper, y, alpha) == pytest.approx(expected, rel=1e-12)


def test_functions_match_the_class(classification, regression):
    probs, labels = classification
    y, yhat, sigma, lower, upper = regression
    q = conformal_quantile(lac_scores(probs[CAL], labels[CAL]), 0.2)
    assert torch.equal(lac_sets(probs[TEST], q), SplitConformal("lac", 0.2).calibrate(
        probs[CAL], labels[CAL]).predict_sets(probs[TEST]))
    q = conformal_quantile(absolute_scores(y[CAL], yhat[CAL]), 0.2)
    assert absolute_intervals(yhat[TEST], q)[0].tolist() == (yhat[TEST] - q).tolist()
    q_pair = cqr_quantiles(y[CAL], lower[CAL], upper[CAL], 0.2)
    theirs = SplitConformal("cqr", 0.2).calibrate((lower[CAL], upper[CAL]), y[CAL])
    assert torch.equal(cqr_intervals(lower[TEST], upper[TEST], *q_pair)[1],
                       theirs.predict_intervals((lower[TEST], upper[TEST]))[1])
    assert theirs.n_calibration == N_CAL
    u = np.random.RandomState(0).uniform(size=N_TEST)
    q = conformal_quantile(aps_scores(probs[CAL], labels[CAL], randomized=False), 0.2)
    assert torch.equal(raps_sets(probs[TEST], q, k_reg=2, lam=0.0, include_last_label="randomized", u=u),
                       aps_sets(probs[TEST], q, include_last_label="randomized", u=u))


def test_sets_keep_labels_within_mapies_epsilon():
    """A label whose score exceeds the threshold by less than 1e-8 is kept (MAPIE's EPSILON); by more, not."""
    probs = torch.tensor([[0.3, 0.7], [0.2, 0.8]], dtype=torch.float64)  # LAC scores 0.7, 0.3 and 0.8, 0.2
    assert lac_sets(probs, 0.7 - 5e-9).tolist() == [[True, True], [False, True]]
    assert lac_sets(probs, 0.7 - 2e-8).tolist() == [[False, True], [False, True]]
    masses = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)  # cumulated 0.5, 0.8, 1.0
    assert aps_sets(masses, 0.8 + 5e-9).tolist() == [[True, True, False]]
    assert aps_sets(masses, 0.8 + 2e-8).tolist() == [[True, True, True]]


# ---------------------------------------------------------------- bad input


_P = torch.tensor([[0.7, 0.3], [0.4, 0.6]])


def _cases():
    fitted_lac = SplitConformal("lac", 0.5).calibrate(_P, [0, 1])
    fitted_mondrian = SplitConformal("lac", 0.5, mondrian=True).calibrate(_P, [0, 1])
    y10 = torch.arange(10.0)
    return [
        (lambda: conformal_quantile(torch.tensor([0.1]), 1.5),
         "conformal_quantile: alpha=1.5 is outside (0, 1); give the miscoverage level, e.g. 0.1 for 90%"
         " coverage."),
        (lambda: SplitConformal("lac", 0.0),
         "SplitConformal: alpha=0.0 is outside (0, 1); give the miscoverage level, e.g. 0.1 for 90%"
         " coverage."),
        (lambda: SplitConformal("lac", True),
         "SplitConformal: alpha=True is outside (0, 1); give the miscoverage level, e.g. 0.1 for 90%"
         " coverage."),
        (lambda: conformal_quantile(torch.tensor([]), 0.1),
         "conformal_quantile: scores is empty; calibrate on at least one row (check the calibration mask)."),
        (lambda: conformal_quantile(torch.tensor([0.1, float("nan")]), 0.1),
         "conformal_quantile: scores has 1 NaN value(s); drop or fix those rows."),
        (lambda: conformal_quantile(torch.zeros(2, 2), 0.1),
         "conformal_quantile: scores has shape (2, 2); give a vector of shape (n,), one value per row."),
        (lambda: lac_scores(torch.tensor([0.5, 0.5]), [0]),
         "lac_scores: probs has shape (2,); give probabilities of shape (n, C) with C >= 2 classes."),
        (lambda: SplitConformal("lac", 0.1).calibrate(torch.tensor([[0.5, 0.6], [0.3, 0.7]]), [0, 1]),
         "SplitConformal.calibrate: probs rows sum to between 1 and 1.1, not 1 (tolerance 0.0001); pass"
         " probabilities that sum to 1 over the classes."),
        (lambda: aps_scores(torch.tensor([[-1.0, 2.0]]), [0]),
         "aps_scores: probs has values outside [0, 1] (min -1, max 2); pass probabilities (the softmax of"
         " the logits), not logits."),
        (lambda: lac_sets(torch.tensor([[float("nan"), 0.5]]), 0.5),
         "lac_sets: probs has 1 NaN value(s); drop or fix those rows."),
        (lambda: SplitConformal("lac", 0.1).calibrate(_P, [0, 2]),
         "SplitConformal.calibrate: labels holds 2, not a class index in 0..1; encode the classes as"
         " integers 0..1 in the order of the columns of probs."),
        (lambda: lac_scores(_P, [0.5, 1.0]),
         "lac_scores: labels holds 0.5, not a class index in 0..1; encode the classes as integers 0..1 in"
         " the order of the columns of probs."),
        (lambda: lac_scores(_P, [0, 1, 1]),
         "lac_scores: labels has shape (3,) but probs has 2 rows; give one label per row, shape (2,)."),
        (lambda: absolute_scores([1.0, float("nan")], [0.0, 0.0]),
         "absolute_scores: y has 1 NaN value(s); drop or fix those rows."),
        (lambda: absolute_scores([1.0, 2.0, 3.0], [1.0, 2.0]),
         "absolute_scores: yhat has shape (2,); give a vector of shape (3,), one value per row."),
        (lambda: normalized_scores([1.0, 2.0], [0.0, 0.0], [1.0, 0.0]),
         "normalized_scores: sigma has 1 value(s) <= 0 (smallest 0); the normalized score divides by sigma,"
         " so give a positive spread (add a floor, e.g. sigma.clamp_min(1e-6), where members agree)."),
        (lambda: SplitConformal("normalized", 0.1).calibrate((y10, -torch.ones(10)), y10),
         "SplitConformal.calibrate: sigma has 10 value(s) <= 0 (smallest -1); the normalized score divides"
         " by sigma, so give a positive spread (add a floor, e.g. sigma.clamp_min(1e-6), where members"
         " agree)."),
        (lambda: SplitConformal("absolute", 0.1).calibrate(torch.zeros(0), torch.zeros(0)),
         "SplitConformal.calibrate: there are no calibration rows; calibrate on at least 9 rows (check the"
         " calibration mask)."),
        (lambda: SplitConformal("absolute", 0.1, allow_infinite=False).calibrate(y10[:5], y10[:5]),
         "SplitConformal.calibrate: 5 calibration rows are too few for alpha=0.1; give at least 9 rows or"
         " set allow_infinite=True (thresholds are then +inf)."),
        (lambda: SplitConformal("lac", 0.5, mondrian=True, allow_infinite=False).calibrate(_P, [0, 0]),
         "SplitConformal.calibrate: 0 calibration rows of class 1 are too few for alpha=0.5; give at least"
         " 1 rows or set allow_infinite=True (thresholds are then +inf)."),
        (lambda: SplitConformal("gaussian", 0.1),
         "SplitConformal: method='gaussian' is unknown; use one of lac, aps, raps, absolute, normalized,"
         " cqr."),
        (lambda: SplitConformal("raps", 0.1, k_reg=1),
         "SplitConformal: method='raps' needs k_reg and lam; give both, e.g. k_reg=1, lam=0.01."),
        (lambda: SplitConformal("raps", 0.1, k_reg=-1, lam=0.1),
         "SplitConformal: k_reg=-1 is not a whole number >= 0; give the rank after which labels are"
         " penalised, e.g. 1."),
        (lambda: raps_sets(_P, 0.5, k_reg=1, lam=float("inf")),
         "raps_sets: lam=inf is not a finite number >= 0; give the penalty per rank beyond k_reg, e.g."
         " 0.01."),
        (lambda: SplitConformal("aps", 0.1, include_last_label="yes"),
         "SplitConformal: include_last_label='yes' is not a choice; use True, False or 'randomized'."),
        (lambda: SplitConformal("cqr", 0.1, mondrian=True),
         "SplitConformal: mondrian=True is for classes, not method='cqr'; drop mondrian or use lac, aps or"
         " raps."),
        (lambda: SplitConformal("lac", 0.1).predict_sets(_P),
         "SplitConformal.predict_sets: this SplitConformal is not calibrated; call calibrate(outputs, y)"
         " and use the object it returns."),
        (lambda: SplitConformal("absolute", 0.1).calibrate(y10, y10).predict_sets(_P),
         "SplitConformal.predict_sets: method='absolute' gives intervals, not sets; use predict_intervals."),
        (lambda: fitted_lac.predict_intervals(y10),
         "SplitConformal.predict_intervals: method='lac' gives sets, not intervals; use predict_sets."),
        (lambda: SplitConformal("normalized", 0.1).calibrate(y10, y10),
         "SplitConformal.calibrate: method='normalized' takes outputs=(yhat, sigma), a pair of vectors; got"
         " Tensor."),
        (lambda: fitted_mondrian.predict_sets(torch.full((1, 3), 1 / 3)),
         "SplitConformal.predict_sets: probs has 3 classes but the calibration had 2; pass probabilities"
         " over the same classes."),
        (lambda: aps_scores(_P, [0, 1], u=[0.5, 1.5]),
         "aps_scores: u has values outside [0, 1]; give uniform draws in [0, 1], one per row."),
        (lambda: aps_sets(_P, 0.5, include_last_label="randomized", u=[0.5]),
         "aps_sets: u has shape (1,); give a vector of shape (2,), one value per row."),
        (lambda: aps_sets(_P, torch.tensor([0.5, 0.6])),
         "aps_sets: qhat has 2 values; give one threshold (Mondrian sets, one threshold per class, are"
         " threshold_sets of candidate_scores)."),
        (lambda: coverage(torch.ones(2, 2), [0, 1]),
         "coverage: sets has shape (2, 2) and dtype torch.float32; give boolean sets of shape (n, C), or a"
         " pair (lower, upper) of intervals."),
        (lambda: winkler_score([0.0], [1.0], [0.5], alpha=2),
         "winkler_score: alpha=2 is outside (0, 1); give the miscoverage level, e.g. 0.1 for 90% coverage."),
    ]


def test_bad_inputs_raise_one_line_conformal_errors():
    for call, message in _cases():
        with pytest.raises(ConformalError) as caught:
            call()
        assert str(caught.value) == message
        assert "\n" not in message
        assert isinstance(caught.value, RipienoInputError) and isinstance(caught.value, ValueError)
