"""Post-hoc calibrators (ripieno.framework.uq.calibrators) against scikit-learn and known truths."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.calibration import CalibratedClassifierCV
from sklearn.frozen import FrozenEstimator
from sklearn.linear_model import LogisticRegression

from ripieno.callbacks.temperature_scaling import TemperatureScaling, fit_temperature, member_mean_nll
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.uq.calibrators import (
    CalibrationError,
    IsotonicCalibration,
    TemperatureCalibration,
    VectorScaling,
    make_calibrator,
)


def _nll(probs: torch.Tensor, y: torch.Tensor) -> float:
    """Mean negative log-likelihood of calibrated probabilities, computed from them alone."""
    return float(-probs[torch.arange(len(y)), y].log().mean())


def _labels_from(logits: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Labels drawn from softmax(logits) ``(n, C)``."""
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)[:, 0]


# ---------------------------------------------------------------- vector scaling


def test_binary_vector_scaling_is_unpenalised_logistic_regression_on_the_two_logits():
    # softmax(w * z + b)[1] = sigmoid(w1 z1 - w0 z0 + b1 - b0): logistic regression on [z0, z1].
    rng = np.random.default_rng(0)
    z = rng.normal(size=(300, 2)) * [1.5, 0.8]
    y = (rng.random(300) < 1 / (1 + np.exp(-(1.7 * z[:, 1] - 0.6 * z[:, 0] + 0.4)))).astype(int)
    oracle = LogisticRegression(C=np.inf, tol=1e-12, max_iter=10_000).fit(z, y)  # C=inf: no penalty
    fitted = VectorScaling().fit(z, y)
    z_new = rng.normal(size=(50, 2)) * 2
    np.testing.assert_allclose(fitted.predict_proba(z_new).numpy(), oracle.predict_proba(z_new), atol=1e-5)
    np.testing.assert_allclose(fitted.nll_after_, -oracle.predict_log_proba(z)[np.arange(300), y].mean(),
                               atol=1e-9)


def test_vector_scaling_recovers_a_known_scale_and_bias_within_four_standard_errors():
    g = torch.Generator().manual_seed(1)
    n, w, b = 10_000, torch.tensor([0.5, 1.5, 1.0], dtype=torch.float64), torch.tensor(
        [0.3, -0.2, -0.1], dtype=torch.float64)  # b sums to 0, as the fitted bias_ does
    z = 2 * torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = _labels_from(w * z + b, g)
    fitted = VectorScaling().fit(z, y)
    estimate = torch.cat([fitted.scale_, fitted.bias_])

    # Standard errors from the observed information (Hessian of the summed NLL at the estimate); its
    # pseudo-inverse drops the direction b + const, which the softmax ignores.
    def total_nll(theta: torch.Tensor) -> torch.Tensor:
        return -torch.log_softmax(theta[:3] * z + theta[3:], -1)[torch.arange(n), y].sum()

    covariance = torch.linalg.pinv(torch.autograd.functional.hessian(total_nll, estimate))
    se = covariance.diagonal().clamp_min(0).sqrt()
    assert se.max() < 0.05  # the check below is not vacuous
    assert ((estimate - torch.cat([w, b])).abs() <= 4 * se).all(), (estimate, se)


def test_vector_scaling_lowers_held_out_nll_of_a_miscalibrated_model():
    g = torch.Generator().manual_seed(2)
    w = torch.tensor([0.4, 0.7, 1.2, 0.5], dtype=torch.float64)
    z = 3 * torch.randn(6000, 4, generator=g, dtype=torch.float64)
    y = _labels_from(w * z, g)
    fitted = VectorScaling().fit(z[:3000], y[:3000])
    assert fitted.nll_after_ < fitted.nll_before_ - 0.05
    held_out = _nll(fitted.predict_proba(z[3000:]), y[3000:])
    assert held_out < _nll(z[3000:].softmax(-1), y[3000:]) - 0.05


@pytest.mark.parametrize("l2", [0.0, 0.1])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vector_scaling_never_raises_the_nll_of_its_fitting_rows(seed, l2):
    # Labels from the first member's softmax: the members are calibrated or nearly, the start near optimal.
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(200, 4, 3, generator=g, dtype=torch.float64)
    y = _labels_from(z[:, 0], g)
    fitted = VectorScaling(l2=l2).fit(z, y)
    assert fitted.nll_after_ <= fitted.nll_before_
    assert fitted.nll_after_ == pytest.approx(_nll(fitted.predict_proba(z), y), abs=1e-12)
    assert fitted.nll_before_ == pytest.approx(_nll(z.softmax(-1).mean(1), y), abs=1e-12)


def test_vector_scaling_of_members_ends_at_a_stationary_point_of_the_member_mean_nll():
    # The gradient by central differences of an independent numpy NLL of (1/M) sum_m softmax(w z_m + b).
    rng = np.random.default_rng(3)
    z = rng.normal(size=(400, 3, 3)) * 2
    y = rng.integers(0, 3, size=400)
    y[:200] = z[:200].mean(1).argmax(1)

    def nll(theta: np.ndarray) -> float:
        s = theta[:3] * z + theta[3:]
        p = np.exp(s - s.max(-1, keepdims=True))
        p = (p / p.sum(-1, keepdims=True)).mean(1)
        return float(-np.log(p[np.arange(400), y]).mean())

    fitted = VectorScaling().fit(z, y)
    theta = np.concatenate([fitted.scale_.numpy(), fitted.bias_.numpy()])
    h = 1e-5
    gradient = [(nll(theta + h * e) - nll(theta - h * e)) / (2 * h) for e in np.eye(6)]
    np.testing.assert_allclose(gradient, 0, atol=1e-6)
    assert fitted.nll_after_ == pytest.approx(nll(theta), abs=1e-12)


def test_vector_scaling_is_at_least_as_good_as_temperature_and_close_when_the_truth_is_a_temperature():
    # Vector scaling contains temperature scaling (w = 1/T, b = 0), so on its fitting rows its NLL is
    # at most fit_temperature's. When the labels come from softmax(z / T), 2 n (gap) is a likelihood-ratio
    # statistic of nested models with 2 (C - 1) = 4 extra parameters, ~ chi2(4): 20 is beyond its 0.9995
    # quantile (18.5).
    g = torch.Generator().manual_seed(4)
    n, z = 3000, 3 * torch.randn(3000, 1, 3, generator=g, dtype=torch.float64)
    y = _labels_from(z[:, 0] / 2.0, g)
    temperature = fit_temperature(z, y)
    temperature_nll = member_mean_nll(z, y, temperature)
    fitted = VectorScaling().fit(z, y)
    assert fitted.nll_after_ <= temperature_nll + 1e-12
    assert 2 * n * (temperature_nll - fitted.nll_after_) < 20
    calibrated = TemperatureCalibration().fit(z, y)
    assert calibrated.temperature_ == temperature and calibrated.nll_after_ == temperature_nll


def test_vector_scaling_is_deterministic_and_fits_inside_inference_mode():
    g = torch.Generator().manual_seed(5)
    z = torch.randn(300, 2, 4, generator=g)
    y = _labels_from(2 * z[:, 0], g)
    first = VectorScaling().fit(z, y)
    with torch.inference_mode():  # Lightning's validation and test loops
        second = VectorScaling().fit(z, y)
    assert torch.equal(first.scale_, second.scale_) and torch.equal(first.bias_, second.bias_)


def test_vector_scaling_of_probabilities_scales_their_logarithms():
    g = torch.Generator().manual_seed(6)
    z = torch.randn(300, 3, generator=g, dtype=torch.float64)
    y = _labels_from(1.5 * z, g)
    from_probs = VectorScaling(input_kind="probs").fit(z.softmax(-1), y)
    from_logs = VectorScaling().fit(z.log_softmax(-1), y)
    torch.testing.assert_close(from_probs.scale_, from_logs.scale_)
    torch.testing.assert_close(from_probs.predict_proba(z.softmax(-1)),
                               from_logs.predict_proba(z.log_softmax(-1)))


# ---------------------------------------------------------------- temperature


def test_temperature_calibration_predicts_as_the_temperature_scaling_callback():
    g = torch.Generator().manual_seed(7)
    z = 2 * torch.randn(500, 3, 4, generator=g)
    y = _labels_from(z.mean(1) / 1.5, g)
    from_logits = TemperatureCalibration().fit(z, y)
    from_probs = TemperatureCalibration(input_kind="probs").fit(z.softmax(-1), y)  # logs = logits + row const
    assert from_probs.temperature_ == pytest.approx(from_logits.temperature_, rel=1e-5)
    callback = TemperatureScaling(output_kind="logits")
    callback.load_state_dict({"temperature": from_logits.temperature_})
    np.testing.assert_allclose(from_logits.predict_proba(z).numpy(),
                               callback.calibrated_probabilities(z).numpy(), atol=1e-6)


# ---------------------------------------------------------------- isotonic


class _GivenProbabilities(ClassifierMixin, BaseEstimator):
    """A fitted classifier whose ``predict_proba`` of ``X = [[i], ...]`` is row ``i`` of ``probs``."""

    def __init__(self, probs=None):
        self.probs = probs

    def fit(self, X, y):
        self.classes_ = np.arange(self.probs.shape[1])
        return self

    def predict_proba(self, X):
        return self.probs[np.asarray(X)[:, 0].astype(int)]

    def predict(self, X):
        return self.predict_proba(X).argmax(1)


def _sklearn_isotonic(probs: np.ndarray, y: np.ndarray, n_calibration: int) -> np.ndarray:
    """CalibratedClassifierCV(method="isotonic") fitted on the first rows, predicting every row.

    A frozen model gives ``ensemble="auto"`` = False: one calibrator on every calibration row's
    ``predict_proba`` (the folds of ``cv`` only split the rows for the frozen, unchanging model).
    """
    model = _GivenProbabilities(probs).fit(None, None)
    ids = np.arange(len(probs))[:, None]
    oracle = CalibratedClassifierCV(FrozenEstimator(model), method="isotonic", cv=2)
    return oracle.fit(ids[:n_calibration], y[:n_calibration]).predict_proba(ids)


@pytest.mark.parametrize("num_classes", [2, 3])
@pytest.mark.parametrize("input_kind", ["probs", "logits"])
def test_isotonic_equals_scikit_learn_calibrated_classifier(num_classes, input_kind):
    g = torch.Generator().manual_seed(8 + num_classes)
    logits = 2 * torch.randn(400, 3, num_classes, generator=g, dtype=torch.float64)  # 3 members
    logits[-2:] *= 10  # near one-hot rows: beyond the calibration range, clipped to its ends
    mean = logits.softmax(-1).mean(1)
    y = _labels_from(mean.log() * 0.5, g)
    outputs = logits if input_kind == "logits" else logits.softmax(-1)
    fitted = IsotonicCalibration(input_kind=input_kind).fit(outputs[:200], y[:200])
    columns = [1] if num_classes == 2 else range(num_classes)
    assert all(((mean[200:, k] < xs[0]) | (mean[200:, k] > xs[-1])).any()
               for k, xs in zip(columns, fitted.X_thresholds_, strict=True))
    expected = _sklearn_isotonic(mean.numpy(), y.numpy(), 200)
    np.testing.assert_allclose(fitted.predict_proba(outputs).numpy(), expected, rtol=0, atol=1e-12)
    assert len(fitted.X_thresholds_) == (1 if num_classes == 2 else num_classes)


def test_isotonic_rows_whose_every_class_maps_to_zero_become_uniform_as_in_scikit_learn():
    # Each label's class has p = 0.55 and another class 0.45 (label 0): every class maps p <= 0.45 to 0.
    rows, labels = [], []
    for k in range(3):
        for j in range(3):
            if j != k:
                p = np.zeros(3)
                p[k], p[j] = 0.55, 0.45
                rows.append(p)
                labels.append(k)
    probs = np.vstack([*rows, [1 / 3, 1 / 3, 1 / 3], [0.5, 0.3, 0.2]])
    y = np.array(labels)
    fitted = IsotonicCalibration(input_kind="probs").fit(probs[:6], y)
    calibrated = fitted.predict_proba(probs).numpy()
    np.testing.assert_allclose(calibrated, _sklearn_isotonic(probs, np.r_[y, 0, 0], 6), rtol=0, atol=1e-12)
    assert all(np.interp(1 / 3, xs, ys) == 0 for xs, ys in zip(fitted.X_thresholds_, fitted.y_thresholds_,
                                                               strict=True))  # the fallback, not symmetry
    np.testing.assert_array_equal(calibrated[6], np.full(3, 1 / 3))


def test_isotonic_gives_a_class_missing_from_the_calibration_rows_probability_zero():
    # scikit-learn has no answer here (its classes come from y); the isotonic fit of an all-0 target is 0.
    g = torch.Generator().manual_seed(9)
    probs = torch.randn(120, 4, generator=g, dtype=torch.float64).softmax(-1)
    y = torch.randint(0, 3, (120,), generator=g)  # class 3 never occurs
    calibrated = IsotonicCalibration(input_kind="probs").fit(probs[:80], y[:80]).predict_proba(probs)
    assert (calibrated[:, 3] == 0).all()
    torch.testing.assert_close(calibrated.sum(1), torch.ones(120, dtype=torch.float64))


# ---------------------------------------------------------------- state and factory


@pytest.mark.parametrize("method", ["temperature", "vector", "isotonic"])
def test_states_round_trip_through_json(method):
    g = torch.Generator().manual_seed(10)
    z = 2 * torch.randn(200, 2, 3, generator=g)
    y = _labels_from(z.mean(1), g)
    fitted = make_calibrator(method).fit(z, y)
    state = json.loads(json.dumps(fitted.state_dict()))  # plain values only
    restored = make_calibrator(state["method"])
    restored.load_state_dict(state)
    assert torch.equal(restored.predict_proba(z), fitted.predict_proba(z))
    assert restored.state_dict() == fitted.state_dict()
    blank = make_calibrator(method)
    blank.load_state_dict(make_calibrator(method).state_dict())  # an unfitted state stays unfitted
    with pytest.raises(CalibrationError, match="not fitted"):
        blank.predict_proba(z)


def test_a_state_keeps_its_input_kind():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
    state = VectorScaling(input_kind="probs").fit(probs, torch.tensor([0, 1, 1, 1])).state_dict()
    restored = VectorScaling()
    restored.load_state_dict(state)
    assert restored.input_kind == "probs"


# ---------------------------------------------------------------- errors

_Z = torch.randn(6, 3)
_Y = torch.tensor([0, 1, 2, 0, 1, 2])
_P = _Z.softmax(-1)
_FITTED_3 = VectorScaling().fit(_Z, _Y)


@pytest.mark.parametrize(("call", "words"), [
    (lambda: VectorScaling().fit(torch.randn(6), _Y), "shape (6,)"),
    (lambda: VectorScaling().fit(torch.randn(6, 1), _Y), "C >= 2 classes"),
    (lambda: VectorScaling().fit(torch.zeros(0, 3), torch.zeros(0)), "n >= 1 rows"),
    (lambda: IsotonicCalibration().fit(torch.full((6, 3), float("nan")), _Y), "18 NaN value(s)"),
    (lambda: VectorScaling().fit(_Z.index_fill(0, torch.tensor([1]), float("inf")), _Y), "infinite logit"),
    (lambda: VectorScaling().fit(_Z, torch.tensor([0, 1, 2, 0, 1, 3])), "not a class index in 0..2"),
    (lambda: VectorScaling().fit(_Z, torch.tensor([0, 1, 2, 0, 1, 0.5])), "not a class index"),
    (lambda: VectorScaling().fit(_Z, _Y[:5]), "give one label per row, shape (6,)"),
    (lambda: TemperatureCalibration().fit(_Z, torch.zeros(6)), "only class 0"),
    (lambda: IsotonicCalibration(input_kind="probs").fit(_Z, _Y), "outside [0, 1]"),
    (lambda: IsotonicCalibration(input_kind="probs").fit(_P * 0.9, _Y), "not 1"),
    (lambda: IsotonicCalibration().predict_proba(_Z), "not fitted; call fit(outputs, y)"),
    (lambda: TemperatureCalibration().predict_proba(_Z), "not fitted"),
    (lambda: _FITTED_3.predict_proba(torch.randn(2, 4)), "fitted on 3"),
    (lambda: make_calibrator("platt"), "use one of 'temperature', 'vector', 'isotonic'"),
    (lambda: VectorScaling(input_kind="log"), "input_kind='log' is unknown"),
    (lambda: VectorScaling(l2=-1.0), "l2=-1.0"),
    (lambda: TemperatureCalibration(bounds=(1.0, 0.5)), "bounds=(1.0, 0.5)"),
    (lambda: VectorScaling().load_state_dict(IsotonicCalibration().state_dict()),
     "make_calibrator('isotonic')"),
])
def test_bad_input_raises_one_line_errors_that_name_the_fix(call, words):
    with pytest.raises(CalibrationError) as caught:
        call()
    message = str(caught.value)
    assert words in message and "\n" not in message and "; " in message
    assert isinstance(caught.value, RipienoInputError) and isinstance(caught.value, ValueError)
