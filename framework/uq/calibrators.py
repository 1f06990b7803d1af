r"""Post-hoc probability calibrators fitted on held-out outputs: temperature, vector scaling, isotonic.

A trained classifier's confidence is often wrong even where its ranking of classes is right. These
calibrators read a model's outputs on ``n`` held-out labelled rows and fit a map from outputs to
calibrated probabilities ``(n, C)``. They take the member protocol's shapes: ``(n, C)`` (one member)
or ``(n, M, C)`` member logits, or probabilities with ``input_kind="probs"``; the model's prediction
is the member mean of probabilities, as everywhere in ripieno.

* ``TemperatureCalibration``: one ``T > 0``, ``p = (1/M) sum_m softmax(z_m / T)``, fitted by
  ``ripieno.framework.uq.temperature.fit_temperature`` (the same fit as the ``TemperatureScaling``
  callback).
* ``VectorScaling`` (Guo et al., 2017): a scale ``w`` and a bias ``b`` per class,
  ``p = (1/M) sum_m softmax(w * z_m + b)``, fitted by L-BFGS on the NLL. A superset of temperature
  scaling (``w = 1/T``, ``b = 0``), so its NLL on the fitting rows is never above temperature scaling's.
* ``IsotonicCalibration``: scikit-learn's ``CalibratedClassifierCV(method="isotonic")`` on the member
  mean probabilities: a monotone step-linear map per class (one-vs-rest), rows renormalised.

Each has ``fit(outputs, y) -> self``, ``predict_proba(outputs) -> (n, C)`` float64 tensor and a plain
``state_dict()`` (floats, lists and strings; JSON-safe) that ``load_state_dict`` restores without
pickle, so that a Lightning callback or an estimator can persist it. ``make_calibrator`` builds one by
name. Bad input raises ``CalibrationError`` with a one-line message naming the problem and the fix.

Example:
    >>> g = torch.Generator().manual_seed(0)
    >>> z = 3 * torch.randn(2000, 3, generator=g)
    >>> y = torch.multinomial(z.softmax(-1), 1, generator=g)[:, 0]  # labels ~ softmax(z)
    >>> calibrator = make_calibrator("vector").fit(2.0 * z, y)  # logits twice too sharp
    >>> calibrator.nll_after_ < calibrator.nll_before_
    True
    >>> calibrator.predict_proba(2.0 * z[:2]).shape
    torch.Size([2, 3])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

import numpy as np
import torch
from sklearn.isotonic import IsotonicRegression
from torch import Tensor

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.uq.checked_inputs import class_labels, real_float64
from ripieno.framework.uq.temperature import fit_temperature, member_mean_nll

__all__ = [
    "CalibrationError",
    "Calibrator",
    "IsotonicCalibration",
    "TemperatureCalibration",
    "VectorScaling",
    "make_calibrator",
]

TensorLike: TypeAlias = Tensor | np.ndarray | Sequence[Any]
"""What the calibrators accept for outputs and labels: a tensor, a numpy array or a (nested) list."""

InputKind = Literal["logits", "probs"]
Method = Literal["temperature", "vector", "isotonic"]

PROBABILITY_SUM_TOLERANCE = 1e-4
"""How far a member's row of probabilities may sum from 1 (float32 softmax over many classes rounds)."""


class CalibrationError(RipienoInputError):
    """Input that a calibrator cannot use; the one-line message names the problem and the fix.

    Example:
        >>> try:
        ...     VectorScaling().predict_proba(torch.zeros(2, 3))
        ... except CalibrationError as error:
        ...     print(error)
        VectorScaling.predict_proba: the calibrator is not fitted; call fit(outputs, y) or
        load_state_dict(state) first.
    """


# ---------------------------------------------------------------- input checks


def _input_kind(input_kind: str, owner: str) -> InputKind:
    if input_kind not in ("logits", "probs"):
        raise CalibrationError(f"{owner}: input_kind={input_kind!r} is unknown; use 'logits' (member logits)"
                               " or 'probs' (member probabilities).")
    return input_kind  # type: ignore[return-value]


def _float64(values: TensorLike, name: str, where: str) -> Tensor:
    return real_float64(values, name, where, CalibrationError)


def _members(outputs: TensorLike, input_kind: InputKind, where: str,
             num_classes: int | None = None) -> Tensor:
    """Checked member outputs ``(n, M, C)`` in float64 (``(n, C)`` is one member)."""
    x = _float64(outputs, "outputs", where)
    if x.ndim == 2:
        x = x[:, None]
    if x.ndim != 3 or x.shape[0] == 0 or x.shape[1] == 0 or x.shape[2] < 2:
        raise CalibrationError(f"{where}: outputs has shape {tuple(x.shape)}; give {input_kind} of shape"
                               " (n, C) or (n, members, C) with n >= 1 rows and C >= 2 classes (a binary"
                               " logit s is the two logits [0, s]).")
    if num_classes is not None and x.shape[2] != num_classes:
        raise CalibrationError(f"{where}: outputs has {x.shape[2]} classes but the calibrator was fitted on"
                               f" {num_classes}; give outputs of the model it was fitted for.")
    if input_kind == "logits" and not torch.isfinite(x).all():
        raise CalibrationError(f"{where}: outputs has {int((~torch.isfinite(x)).sum())} infinite logit(s);"
                               " give finite logits, or probabilities with input_kind='probs'.")
    if input_kind == "probs":
        if x.min() < 0 or x.max() > 1:
            raise CalibrationError(f"{where}: outputs has values outside [0, 1] (min {x.min().item():.3g},"
                                   f" max {x.max().item():.3g}); pass probabilities, or logits with"
                                   " input_kind='logits'.")
        sums = x.sum(-1)
        if ((sums - 1).abs() > PROBABILITY_SUM_TOLERANCE).any():
            raise CalibrationError(f"{where}: outputs rows sum to between {sums.min().item():.6g} and"
                                   f" {sums.max().item():.6g}, not 1 (tolerance"
                                   f" {PROBABILITY_SUM_TOLERANCE:g}); pass probabilities that sum to 1 over"
                                   " the classes.")
    return x


def _labels(labels: TensorLike, n: int, num_classes: int, where: str) -> Tensor:
    y = class_labels(labels, n, num_classes, where, CalibrationError, name="y", rows_of="outputs",
                     order="the outputs' last axis")
    if y.unique().numel() < 2:
        raise CalibrationError(f"{where}: y holds only class {y[0].item()}; calibration needs labelled rows"
                               " of at least 2 classes.")
    return y


def _not_fitted(where: str) -> CalibrationError:
    return CalibrationError(f"{where}: the calibrator is not fitted; call fit(outputs, y) or"
                            " load_state_dict(state) first.")


def _state_method(state: dict[str, Any], method: str, where: str) -> None:
    if state.get("method") != method:
        raise CalibrationError(f"{where}: the state is of method {state.get('method')!r}, not {method!r};"
                               f" load it with make_calibrator({state.get('method')!r}).")


def _log_members(x: Tensor, input_kind: InputKind) -> Tensor:
    """Member logits as given, or the logarithms of member probabilities (floored at the tiniest float)."""
    return x if input_kind == "logits" else x.clamp_min(torch.finfo(torch.float64).tiny).log()


def _nll(log_members: Tensor, y: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    """``-mean_i log (1/M) sum_m softmax(scale * z_im + bias)[y_i]`` (differentiable, float64)."""
    n, m, _ = log_members.shape
    log_p = torch.log_softmax(scale * log_members + bias, -1)
    log_py = log_p.gather(-1, y[:, None, None].expand(n, m, 1)).squeeze(-1)  # (n, M)
    return -(torch.logsumexp(log_py, 1) - math.log(m)).mean()


# ---------------------------------------------------------------- temperature


class TemperatureCalibration:
    """One temperature for all members, ``p = (1/M) sum_m softmax(z_m / T)``.

    The fit is ``fit_temperature`` of ``ripieno.framework.uq.temperature`` (grid over ``log T``,
    then golden section), so it agrees with the ``TemperatureScaling`` callback on the same rows. With
    ``input_kind="probs"`` it scales the log-probabilities, which equal the logits up to a per-row
    constant: the same result as from logits.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> z = 3 * torch.randn(4000, 3, generator=g)
        >>> y = torch.multinomial(z.softmax(-1), 1, generator=g)[:, 0]
        >>> round(TemperatureCalibration().fit(2.0 * z, y).temperature_, 1)  # twice too sharp
        2.0

    Args:
        input_kind: ``logits`` or ``probs``: what ``fit`` and ``predict_proba`` receive.
        bounds: the search interval ``(low, high)`` of ``T``.

    Attributes:
        temperature_: the fitted ``T`` (``None`` before ``fit``).
        nll_before_: NLL of the fitting rows at ``T = 1``.
        nll_after_: NLL of the fitting rows at the fitted ``T``.
    """

    method = "temperature"

    def __init__(self, input_kind: InputKind = "logits", bounds: tuple[float, float] = (0.01, 100.0)) -> None:
        self.input_kind = _input_kind(input_kind, type(self).__name__)
        if len(bounds) != 2 or not 0 < bounds[0] < bounds[1] < math.inf:
            raise CalibrationError(f"TemperatureCalibration: bounds={bounds!r} is not (low, high) with"
                                   " 0 < low < high < inf; give the interval searched for T, e.g."
                                   " (0.01, 100).")
        self.bounds = (float(bounds[0]), float(bounds[1]))
        self.temperature_: float | None = None
        self.nll_before_: float | None = None
        self.nll_after_: float | None = None

    def fit(self, outputs: TensorLike, y: TensorLike) -> TemperatureCalibration:
        """Fit ``T`` on held-out outputs ``(n, C)`` or ``(n, M, C)`` and their labels ``(n,)``."""
        where = "TemperatureCalibration.fit"
        x = _members(outputs, self.input_kind, where)
        labels = _labels(y, x.shape[0], x.shape[2], where)
        z = _log_members(x, self.input_kind)
        self.temperature_ = fit_temperature(z, labels, bounds=self.bounds)
        self.nll_before_ = member_mean_nll(z, labels, 1.0)
        self.nll_after_ = member_mean_nll(z, labels, self.temperature_)
        return self

    def predict_proba(self, outputs: TensorLike) -> Tensor:
        """Calibrated probabilities ``(n, C)`` (float64) of outputs ``(n, C)`` or ``(n, M, C)``."""
        where = "TemperatureCalibration.predict_proba"
        if self.temperature_ is None:
            raise _not_fitted(where)
        z = _log_members(_members(outputs, self.input_kind, where), self.input_kind)
        return torch.softmax(z / self.temperature_, -1).mean(1)

    def state_dict(self) -> dict[str, Any]:
        """The settings and the fitted ``T`` as plain values."""
        return {"method": self.method, "input_kind": self.input_kind, "bounds": list(self.bounds),
                "temperature": self.temperature_, "nll_before": self.nll_before_,
                "nll_after": self.nll_after_}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` (its settings included)."""
        _state_method(state, self.method, "TemperatureCalibration.load_state_dict")
        self.input_kind = _input_kind(state["input_kind"], type(self).__name__)
        self.bounds = (float(state["bounds"][0]), float(state["bounds"][1]))
        self.temperature_ = state["temperature"]
        self.nll_before_, self.nll_after_ = state["nll_before"], state["nll_after"]


# ---------------------------------------------------------------- vector scaling


class VectorScaling:
    """A scale and a bias per class on the logits, ``p = (1/M) sum_m softmax(w * z_m + b)`` (Guo 2017).

    ``w`` and ``b`` (``(C,)`` each) minimise the NLL of the member-mean predictive on the fitting rows,
    plus ``l2 * (||w - 1||^2 + ||b||^2)``, from ``w = 1, b = 0``, by ``torch.optim.LBFGS`` with the strong
    Wolfe line search in float64 on CPU: no randomness, and every step lowers the objective (the penalty
    is 0 at the start); a fit that would end above the starting NLL (rounding when the start is the
    optimum) keeps ``w = 1, b = 0``, so ``nll_after_ <= nll_before_`` always. With one member the NLL
    is convex in ``(w, b)``; for binary data it is logistic regression on the two logits. ``b`` is
    determined up to a constant (the softmax ignores it): the fitted ``bias_`` sums to 0. With
    ``input_kind="probs"`` the scale acts on log-probabilities, which differ from the logits by a
    per-row constant that a per-class scale does not cancel: a related, not the same, family (use
    logits where the model has them).

    Example:
        >>> z = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 0.0], [0.0, 1.0], [3.0, 0.0]])
        >>> calibrator = VectorScaling().fit(z, torch.tensor([0, 1, 1, 1, 0]))
        >>> calibrator.scale_.shape, round(float(calibrator.bias_.sum()), 6)
        (torch.Size([2]), 0.0)
        >>> calibrator.nll_after_ <= calibrator.nll_before_
        True

    Args:
        input_kind: ``logits`` or ``probs``: what ``fit`` and ``predict_proba`` receive.
        l2: weight of the penalty on ``w - 1`` and ``b`` (0: none, the plain maximum likelihood fit).
        max_iter: L-BFGS iterations at most.
        tol: L-BFGS stops when the largest gradient entry is below it.

    Attributes:
        scale_: the fitted ``w`` ``(C,)`` float64 (``None`` before ``fit``).
        bias_: the fitted ``b`` ``(C,)`` float64, summing to 0.
        nll_before_: NLL of the fitting rows at ``w = 1, b = 0``.
        nll_after_: NLL of the fitting rows at the fitted ``w, b`` (without the penalty).
    """

    method = "vector"

    def __init__(self, input_kind: InputKind = "logits", l2: float = 0.0, max_iter: int = 500,
                 tol: float = 1e-10) -> None:
        owner = type(self).__name__
        self.input_kind = _input_kind(input_kind, owner)
        if isinstance(l2, bool) or not isinstance(l2, int | float) or not 0 <= l2 < math.inf:
            raise CalibrationError(f"{owner}: l2={l2!r} is not a finite number >= 0; give the penalty weight,"
                                   " 0 for none.")
        if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
            raise CalibrationError(f"{owner}: max_iter={max_iter!r} is not an integer >= 1; give the L-BFGS"
                                   " iteration limit, e.g. 500.")
        if isinstance(tol, bool) or not isinstance(tol, int | float) or not 0 < tol < math.inf:
            raise CalibrationError(f"{owner}: tol={tol!r} is not a number > 0; give the gradient size at"
                                   " which L-BFGS stops, e.g. 1e-10.")
        self.l2, self.max_iter, self.tol = float(l2), max_iter, float(tol)
        self.scale_: Tensor | None = None
        self.bias_: Tensor | None = None
        self.nll_before_: float | None = None
        self.nll_after_: float | None = None

    def fit(self, outputs: TensorLike, y: TensorLike) -> VectorScaling:
        """Fit ``w`` and ``b`` on held-out outputs ``(n, C)`` or ``(n, M, C)`` and their labels ``(n,)``."""
        where = "VectorScaling.fit"
        x = _members(outputs, self.input_kind, where)
        labels = _labels(y, x.shape[0], x.shape[2], where)
        c = x.shape[2]
        # Lightning's evaluation loops run in inference mode: leave it, and copy the inputs out of it
        with torch.inference_mode(False), torch.enable_grad():
            z = _log_members(x, self.input_kind).clone()
            labels = labels.clone()
            scale = torch.ones(c, dtype=torch.float64, requires_grad=True)
            bias = torch.zeros(c, dtype=torch.float64, requires_grad=True)

            def objective() -> Tensor:
                value = _nll(z, labels, scale, bias)
                if self.l2:
                    value = value + self.l2 * ((scale - 1).square().sum() + bias.square().sum())
                return value

            def closure() -> Tensor:
                optimizer.zero_grad()
                value = objective()
                value.backward()
                return value

            optimizer = torch.optim.LBFGS([scale, bias], lr=1.0, max_iter=self.max_iter,
                                          tolerance_grad=self.tol, tolerance_change=1e-15, history_size=20,
                                          line_search_fn="strong_wolfe")
            identity = torch.ones(c, dtype=torch.float64), torch.zeros(c, dtype=torch.float64)
            with torch.no_grad():
                before = float(_nll(z, labels, *identity))
            optimizer.step(closure)
            with torch.no_grad():
                fitted = scale.detach().clone(), (bias - bias.mean()).detach()
                after = float(_nll(z, labels, *fitted))
        if not after <= before:  # rounding at an optimum at the start, or a NaN step
            fitted, after = identity, before
        (self.scale_, self.bias_), self.nll_before_, self.nll_after_ = fitted, before, after
        return self

    def predict_proba(self, outputs: TensorLike) -> Tensor:
        """Calibrated probabilities ``(n, C)`` (float64) of outputs ``(n, C)`` or ``(n, M, C)``."""
        where = "VectorScaling.predict_proba"
        if self.scale_ is None or self.bias_ is None:
            raise _not_fitted(where)
        x = _members(outputs, self.input_kind, where, num_classes=self.scale_.shape[0])
        return torch.softmax(self.scale_ * _log_members(x, self.input_kind) + self.bias_, -1).mean(1)

    def state_dict(self) -> dict[str, Any]:
        """The settings and the fitted ``w``, ``b`` as plain values (lists of floats)."""
        return {"method": self.method, "input_kind": self.input_kind, "l2": self.l2,
                "max_iter": self.max_iter, "tol": self.tol,
                "scale": None if self.scale_ is None else self.scale_.tolist(),
                "bias": None if self.bias_ is None else self.bias_.tolist(),
                "nll_before": self.nll_before_, "nll_after": self.nll_after_}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` (its settings included)."""
        where = "VectorScaling.load_state_dict"
        _state_method(state, self.method, where)
        scale, bias = state["scale"], state["bias"]
        if (scale is None) != (bias is None) or (scale is not None and len(scale) != len(bias)):
            raise CalibrationError(f"{where}: the state's scale and bias differ in length or presence; load a"
                                   " state saved by VectorScaling.state_dict().")
        self.input_kind = _input_kind(state["input_kind"], type(self).__name__)
        self.l2, self.max_iter, self.tol = float(state["l2"]), int(state["max_iter"]), float(state["tol"])
        self.scale_ = None if scale is None else torch.tensor(scale, dtype=torch.float64)
        self.bias_ = None if bias is None else torch.tensor(bias, dtype=torch.float64)
        self.nll_before_, self.nll_after_ = state["nll_before"], state["nll_after"]


# ---------------------------------------------------------------- isotonic


class IsotonicCalibration:
    """Isotonic regression per class on the member-mean probabilities, as scikit-learn calibrates.

    The same map as ``sklearn.calibration.CalibratedClassifierCV(FrozenEstimator(model),
    method="isotonic")`` whose model's ``predict_proba`` returns the member mean ``p = (1/M) sum_m p_m``:

    * fit: with ``C = 2`` one ``IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)`` of
      ``[y == 1]`` on ``p[:, 1]``; with ``C > 2`` one per class ``k`` of ``[y == k]`` on ``p[:, k]``
      (one-vs-rest). The bounds ``y_min``/``y_max`` change nothing here (the targets are 0 and 1);
    * predict (``_CalibratedClassifier.predict_proba``): with ``C = 2``, ``q_1 = f(p_1)`` and
      ``q_0 = 1 - q_1``; with ``C > 2``, ``q_k = f_k(p_k)`` divided by the row's sum, and a row whose
      every ``q_k`` is 0 becomes uniform ``1 / C``; then values in ``(1, 1 + 1e-5]`` become 1.

    Each ``f_k`` is kept as its thresholds (``X_thresholds_``, ``y_thresholds_``: the points scikit-learn
    keeps, first and last included) and evaluated by linear interpolation, constant beyond the ends
    (``out_of_bounds="clip"``), so the state round-trips without pickle. Calibrated probabilities can
    be exactly 0. With ``input_kind="logits"`` each member's softmax is taken first.

    Example:
        >>> p1 = torch.tensor([0.1, 0.3, 0.35, 0.6, 0.8, 0.9])
        >>> probs = torch.stack([1 - p1, p1], 1)
        >>> calibrator = IsotonicCalibration(input_kind="probs").fit(probs, torch.tensor([0, 1, 0, 1, 1, 1]))
        >>> calibrator.predict_proba(probs)[:, 1]  # pool-adjacent-violators: 0, 1/2, 1/2, 1, 1, 1
        tensor([0.0000, 0.5000, 0.5000, 1.0000, 1.0000, 1.0000], dtype=torch.float64)

    Args:
        input_kind: ``logits`` or ``probs``: what ``fit`` and ``predict_proba`` receive.

    Attributes:
        n_classes_: ``C`` (``None`` before ``fit``).
        X_thresholds_: one float64 array per regressor (1 if binary, else ``C``): its increasing inputs.
        y_thresholds_: the regressors' values at those inputs.
    """

    method = "isotonic"

    def __init__(self, input_kind: InputKind = "logits") -> None:
        self.input_kind = _input_kind(input_kind, type(self).__name__)
        self.n_classes_: int | None = None
        self.X_thresholds_: list[np.ndarray] = []
        self.y_thresholds_: list[np.ndarray] = []

    def _mean_probs(self, outputs: TensorLike, where: str, num_classes: int | None = None) -> np.ndarray:
        x = _members(outputs, self.input_kind, where, num_classes)
        return (torch.softmax(x, -1) if self.input_kind == "logits" else x).mean(1).numpy()

    def fit(self, outputs: TensorLike, y: TensorLike) -> IsotonicCalibration:
        """Fit the per-class maps on held-out outputs ``(n, C)`` or ``(n, M, C)`` and labels ``(n,)``."""
        where = "IsotonicCalibration.fit"
        p = self._mean_probs(outputs, where)
        labels = _labels(y, p.shape[0], p.shape[1], where).numpy()
        c = p.shape[1]
        columns = [1] if c == 2 else range(c)
        self.X_thresholds_, self.y_thresholds_ = [], []
        for k in columns:
            regressor = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0)
            regressor.fit(p[:, k], (labels == k).astype(np.float64))
            self.X_thresholds_.append(regressor.X_thresholds_)
            self.y_thresholds_.append(regressor.y_thresholds_)
        self.n_classes_ = c
        return self

    def predict_proba(self, outputs: TensorLike) -> Tensor:
        """Calibrated probabilities ``(n, C)`` (float64) of outputs ``(n, C)`` or ``(n, M, C)``."""
        where = "IsotonicCalibration.predict_proba"
        if self.n_classes_ is None:
            raise _not_fitted(where)
        p = self._mean_probs(outputs, where, self.n_classes_)
        if self.n_classes_ == 2:
            q1 = np.interp(p[:, 1], self.X_thresholds_[0], self.y_thresholds_[0])
            q = np.stack([1.0 - q1, q1], 1)
        else:
            pairs = zip(self.X_thresholds_, self.y_thresholds_, strict=True)
            q = np.stack([np.interp(p[:, k], xs, ys) for k, (xs, ys) in enumerate(pairs)], 1)
            total = q.sum(1, keepdims=True)
            q = np.divide(q, total, out=np.full_like(q, 1.0 / self.n_classes_), where=total != 0)
        q[(q > 1.0) & (q <= 1.0 + 1e-5)] = 1.0
        return torch.from_numpy(q)

    def state_dict(self) -> dict[str, Any]:
        """The settings and the fitted thresholds as plain values (lists of floats)."""
        return {"method": self.method, "input_kind": self.input_kind, "n_classes": self.n_classes_,
                "x_thresholds": [xs.tolist() for xs in self.X_thresholds_],
                "y_thresholds": [ys.tolist() for ys in self.y_thresholds_]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict`` (its settings included)."""
        where = "IsotonicCalibration.load_state_dict"
        _state_method(state, self.method, where)
        c, xs, ys = state["n_classes"], state["x_thresholds"], state["y_thresholds"]
        expected = 0 if c is None else 1 if c == 2 else c
        if len(xs) != expected or len(ys) != expected or any(
                len(a) != len(b) or not a for a, b in zip(xs, ys, strict=True)):
            raise CalibrationError(f"{where}: the state's thresholds do not match n_classes={c} (1 regressor"
                                   " if binary, else one per class, x and y of equal length); load a state"
                                   " saved by IsotonicCalibration.state_dict().")
        self.input_kind = _input_kind(state["input_kind"], type(self).__name__)
        self.n_classes_ = c
        self.X_thresholds_ = [np.asarray(a, dtype=np.float64) for a in xs]
        self.y_thresholds_ = [np.asarray(b, dtype=np.float64) for b in ys]


# ---------------------------------------------------------------- factory

Calibrator: TypeAlias = TemperatureCalibration | VectorScaling | IsotonicCalibration
"""Any of the calibrators: ``fit``, ``predict_proba``, ``state_dict``, ``load_state_dict``."""

_METHODS: dict[str, type[Calibrator]] = {
    "temperature": TemperatureCalibration, "vector": VectorScaling, "isotonic": IsotonicCalibration}


def make_calibrator(method: Method, **kwargs: Any) -> Calibrator:
    """An unfitted calibrator by name, with its keyword arguments.

    Restore a saved one with ``make_calibrator(state["method"])`` and ``load_state_dict(state)``.

    Example:
        >>> make_calibrator("isotonic", input_kind="probs").input_kind
        'probs'

    Args:
        method: ``temperature``, ``vector`` or ``isotonic``.
        **kwargs: the calibrator's arguments (``input_kind`` for all).

    Raises:
        CalibrationError: an unknown method.
    """
    if method not in _METHODS:
        raise CalibrationError(f"make_calibrator: method={method!r} is unknown; use one of"
                               f" {', '.join(map(repr, _METHODS))}.")
    return _METHODS[method](**kwargs)
