"""Conformal sets and intervals from the scikit-learn estimators (``conformalize``, ``predict_set``,
``predict_interval``).

Oracles: MAPIE 1.6 wrapping the same fitted estimator (``prefit=True``) gives the same sets and
intervals, bit for bit (APS draws its randomisation from the same ``random_state``); the
member-spread-normalised intervals equal their closed form (the k-th smallest calibration ratio,
k = ceil((n + 1)(1 - alpha)), times each row's spread).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from mapie.classification import SplitConformalClassifier
from mapie.regression import SplitConformalRegressor
from sklearn.datasets import load_diabetes, load_wine
from sklearn.model_selection import train_test_split

from ripieno.framework.methods.estimators import EnsembleClassifier, EnsembleRegressor

SMALL = {"k": 4, "d_block": 16, "n_blocks": 1, "max_epochs": 15, "random_state": 0}


def _three_ways(X: np.ndarray, y: np.ndarray, stratify: bool) -> list[np.ndarray]:
    """Training, calibration and test rows (60/20/20), stratified for classes."""
    x_fit, x_test, y_fit, y_test = train_test_split(X, y, test_size=0.2, random_state=0,
                                                    stratify=y if stratify else None)
    x_train, x_cal, y_train, y_cal = train_test_split(x_fit, y_fit, test_size=0.25, random_state=0,
                                                      stratify=y_fit if stratify else None)
    return [x_train, x_cal, x_test, y_train, y_cal, y_test]


@pytest.fixture(scope="module")
def classifier():
    X, y = load_wine(return_X_y=True)
    x_train, x_cal, x_test, y_train, y_cal, y_test = _three_ways(X, y, stratify=True)
    return EnsembleClassifier(**SMALL).fit(x_train, y_train), x_cal, y_cal, x_test


@pytest.fixture(scope="module")
def regressor():
    X, y = load_diabetes(return_X_y=True)
    x_train, x_cal, x_test, y_train, y_cal, y_test = _three_ways(X, y, stratify=False)
    return EnsembleRegressor(**SMALL).fit(x_train, y_train), x_cal, y_cal, x_test


@pytest.mark.parametrize("method", ["lac", "aps"])
@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_classifier_sets_equal_mapies_on_the_same_estimator(classifier, method, alpha):
    clf, x_cal, y_cal, x_test = classifier
    ours = clf.conformalize(x_cal, y_cal, alpha=alpha, method=method).predict_set(x_test)
    mapie = SplitConformalClassifier(estimator=clf, confidence_level=1 - alpha, conformity_score=method,
                                     prefit=True, random_state=0)
    mapie.conformalize(x_cal, y_cal)
    _, sets = mapie.predict_set(x_test)
    assert ours.shape == (len(x_test), 3) and ours.dtype == bool
    np.testing.assert_array_equal(ours, sets[:, :, 0])


@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_regressor_absolute_intervals_equal_mapies_on_the_same_estimator(regressor, alpha):
    reg, x_cal, y_cal, x_test = regressor
    ours = reg.conformalize(x_cal, y_cal, alpha=alpha, method="absolute").predict_interval(x_test)
    mapie = SplitConformalRegressor(estimator=reg, confidence_level=1 - alpha, conformity_score="absolute",
                                    prefit=True)
    mapie.conformalize(x_cal, y_cal)
    _, intervals = mapie.predict_interval(x_test)
    np.testing.assert_allclose(ours, intervals[:, :, 0], rtol=0, atol=1e-9)


def test_regressor_normalised_intervals_are_the_closed_form_and_wider_where_members_disagree(regressor):
    reg, x_cal, y_cal, x_test = regressor
    reg.conformalize(x_cal, y_cal, alpha=0.1)  # k = 4 members: normalised by default
    assert reg.conformal_.method == "normalized"
    members = reg.predict_members(x_cal)
    ratios = np.sort(np.abs(y_cal - reg.predict(x_cal)) / np.maximum(members.std(1), reg.spread_floor_))
    qhat = ratios[math.ceil((len(y_cal) + 1) * 0.9) - 1]
    spread = np.maximum(reg.predict_members(x_test).std(1), reg.spread_floor_)
    point = reg.predict(x_test)
    expected = np.stack([point - qhat * spread, point + qhat * spread], axis=1)
    np.testing.assert_allclose(reg.predict_interval(x_test), expected, rtol=1e-12, atol=1e-9)
    width = expected[:, 1] - expected[:, 0]
    np.testing.assert_allclose(width / spread, 2 * qhat)  # the width follows the members' spread


def test_predicting_before_conformalize_says_so(classifier):
    from sklearn.exceptions import NotFittedError

    clf = EnsembleClassifier(**SMALL)
    with pytest.raises(NotFittedError):
        clf.predict_set(classifier[3])


@pytest.mark.parametrize("method", ["temperature", "vector", "isotonic"])
def test_calibrate_applies_the_calibrator_to_the_members(classifier, method):
    from ripieno.framework.uq.calibrators import make_calibrator

    clf, x_cal, y_cal, x_test = classifier
    clf.calibrate(x_cal, y_cal, method=method)
    members = clf._member_predictions(x_test).double()
    direct = make_calibrator(method, input_kind="probs").fit(clf._member_predictions(x_cal).double(),
                                                             np.searchsorted(clf.classes_, y_cal))
    np.testing.assert_allclose(clf.predict_calibrated_proba(x_test), direct.predict_proba(members).numpy())
    np.testing.assert_allclose(clf.predict_calibrated_proba(x_test).sum(1), 1.0, atol=1e-9)


def test_a_new_fit_drops_what_was_calibrated_on_the_old_weights():
    X, y = load_wine(return_X_y=True)
    x_train, x_cal, _, y_train, y_cal, _ = _three_ways(X, y, stratify=True)
    clf = EnsembleClassifier(**{**SMALL, "max_epochs": 2}).fit(x_train, y_train)
    clf.conformalize(x_cal, y_cal).calibrate(x_cal, y_cal)
    clf.fit(x_train, y_train)
    for attribute in ("conformal_", "calibrator_"):
        assert not hasattr(clf, attribute)
    with pytest.raises(Exception, match="conformalize|not fitted"):
        clf.predict_set(x_cal)


def test_a_gaussian_head_gives_the_members_mixture():
    X, y = load_diabetes(return_X_y=True)
    reg = EnsembleRegressor(**{**SMALL, "regression_head": "gaussian"}).fit(X[:300], y[:300])
    out = reg.predict_distribution(X[300:])
    np.testing.assert_allclose(out["mean"], reg.predict(X[300:]), rtol=1e-5)  # the members' mean
    means, variances = out["member_mean"], out["member_variance"]
    np.testing.assert_allclose(out["variance"], variances.mean(1) + means.var(1), rtol=1e-5)
    assert (variances > 0).all()


def test_a_quantile_head_is_conformalised_by_cqr():
    from ripieno.framework.uq.conformal import SplitConformal

    X, y = load_diabetes(return_X_y=True)
    x_train, x_cal, x_test, y_train, y_cal, y_test = _three_ways(X, y, stratify=False)
    reg = EnsembleRegressor(**{**SMALL, "regression_head": "quantile"}).fit(x_train, y_train)
    intervals = reg.conformalize(x_cal, y_cal, alpha=0.1).predict_interval(x_test)
    assert reg.conformal_.method == "cqr"
    cal, test = reg.predict_distribution(x_cal), reg.predict_distribution(x_test)
    direct = SplitConformal("cqr", 0.1).calibrate((cal["lower"], cal["upper"]), y_cal)
    lower, upper = direct.predict_intervals((test["lower"], test["upper"]))
    np.testing.assert_allclose(intervals, np.stack([lower.numpy(), upper.numpy()], 1))
    with pytest.raises(ValueError, match="regression_head='quantile'"):
        EnsembleRegressor(**SMALL).fit(x_train, y_train).conformalize(x_cal, y_cal, method="cqr")
    with pytest.raises(ValueError, match="distributional head"):
        EnsembleRegressor(**{**SMALL, "max_epochs": 1}).fit(x_train, y_train).predict_distribution(x_cal)


def test_a_classifier_refuses_a_regression_head():
    X, y = load_wine(return_X_y=True)
    with pytest.raises(ValueError, match="regression_head|classification"):
        EnsembleClassifier(**{**SMALL, "regression_head": "gaussian"}).fit(X, y)
