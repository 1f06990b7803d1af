"""The models of ``ripieno benchmark``, on equal terms: the same rows, the same metric.

Every model is a scikit-learn estimator fitted on a ``TableSplits``'s training rows, early-stopped
on its validation rows and scored on its test rows by :func:`scores`:

* ripieno's tabular ensembles (``kind: ensemble``): ``EnsembleClassifier`` / ``EnsembleRegressor``
  with an ``adapter`` (``lometab``, ``rank1`` = TabM, ``mini`` = TabM-mini, ``additive``, ``shared``
  with ``k: 1`` = an MLP), piecewise-linear embeddings, their own preprocessing
  (``TabularPreprocessor``: quantile transform, ordinal categories, imputed missing values);
* gradient-boosted trees through their scikit-learn interfaces (``kind: xgboost``, ``lightgbm``,
  ``catboost``; fitted by ``ripieno.framework.methods.gbdt``, with the other models), with their
  native categorical and missing-value handling and early stopping on the same validation rows;
  every other setting is the library's default unless ``params`` says otherwise (``n_estimators``
  is raised to a cap so that early stopping, not the default count, ends training: the usual way to
  run them with a validation split). CatBoost regression with
  ``loss_function: RMSEWithUncertainty`` predicts a Gaussian per row (``GaussianCatBoost``); XGBoost and
  LightGBM regression with ``quantile_levels: [...]`` fit their quantile objectives at those levels
  (``QuantileBoosting``: XGBoost one multi-quantile booster, LightGBM one model per level), with the
  median as the point prediction.

With conformal settings (``uncertainty.ConformalSettings``), a fit is also scored by its
uncertainty (``uncertainty``'s module docstring): calibration, conformal sets and intervals on the
test rows, and a regressor's predictive distribution where it has one.
"""

from __future__ import annotations

import difflib
import inspect
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from sklearn.metrics import accuracy_score, log_loss, root_mean_squared_error

from ripieno.framework.benchmark import uncertainty
from ripieno.framework.benchmark.uncertainty import PREDICTIVE_DISTRIBUTION, ConformalSettings
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.extras import require
from ripieno.framework.methods.gbdt import (
    CATBOOST_ITERATIONS,
    GBDT_ESTIMATORS_CAP,
    QUANTILE_KINDS,
    QUANTILE_LEVELS,
    GaussianCatBoost,
    QuantileBoosting,
    check_levels,
    fit_catboost,
    fit_lightgbm,
    fit_xgboost,
    xgboost_node_count,
)
from ripieno.framework.specs.table_splits import TableSplits

KINDS: tuple[str, ...] = ("ensemble", "xgboost", "lightgbm", "catboost")
GBDT_KINDS: tuple[str, ...] = ("xgboost", "lightgbm", "catboost")
PRIMARY: dict[str, tuple[str, str]] = {
    "regression": ("rmse", "min"),
    "binary": ("accuracy", "max"),
    "multiclass": ("accuracy", "max"),
}
"""The metric that ranks models per task, and its direction (the TabM paper's choice)."""


@dataclass(frozen=True)
class ModelSpec:
    """One model of a benchmark.

    Attributes:
        name: its name in the benchmark (``lometab``, ``xgboost``, ...).
        kind: ``ensemble``, ``xgboost``, ``lightgbm`` or ``catboost``.
        params: constructor arguments (for ``ensemble``: ``EnsembleClassifier``'s).
        space: the tuned protocol's search space: {argument: distribution}, as ``ripieno tune``'s
            spaces (``categorical``, ``float``, ``int``, ``log``, ``step``, ``or_zero``).
    """

    name: str
    kind: str
    params: dict[str, Any] = field(default_factory=dict)
    space: dict[str, Any] = field(default_factory=dict)


@dataclass
class FitResult:
    """What one fit of one model on one table gives.

    Attributes:
        test: test-split scores (:func:`scores`).
        val: validation-split scores.
        seconds: wall seconds of ``fit``.
        n_parameters: trainable parameters (ensembles) or tree nodes (GBDTs).
        iterations: epochs (ensembles) or trees kept by early stopping (GBDTs).
        calibration_rows: rows the conformal scores were calibrated on (0: none were scored).
    """

    test: dict[str, float]
    val: dict[str, float]
    seconds: float
    n_parameters: int
    iterations: int
    calibration_rows: int = 0


def iteration_cap(spec: ModelSpec, params: dict[str, Any] | None = None) -> int:
    """The most ``iterations`` a fit of ``spec`` can reach: its epoch or tree cap, before early stopping.

    A cell whose ``iterations`` reach it ended at the budget, not by early stopping (the report counts
    them: a ranking can measure the cap rather than the model).

    Example:
        >>> iteration_cap(ModelSpec("tabm", "ensemble", {"max_epochs": 50}))
        50
        >>> iteration_cap(ModelSpec("xgboost", "xgboost")), iteration_cap(ModelSpec("cb", "catboost"))
        (4000, 1000)
    """
    merged = {**spec.params, **(params or {})}
    if spec.kind == "ensemble":
        from ripieno.framework.methods.estimators import EnsembleClassifier

        return int(merged.get("max_epochs", EnsembleClassifier().max_epochs))
    if spec.kind == "catboost":
        return int(merged.get("iterations", merged.get("n_estimators", CATBOOST_ITERATIONS)))
    return int(merged.get("n_estimators", GBDT_ESTIMATORS_CAP))


def check_params(kind: str, names: list[str], where: str) -> None:
    """Stop with one line if a ``params`` or ``space`` key is not an argument of the model's estimator.

    Raises:
        RipienoInputError: the first unknown name, with the closest valid one.
    """
    if kind == "catboost":  # CatBoost's constructor names every argument; it is the check
        catboost = require("benchmark", "catboost", "CatBoost")
        valid = list(inspect.signature(catboost.CatBoostClassifier.__init__).parameters)[1:]
    elif kind == "ensemble":
        from ripieno.framework.methods.estimators import EnsembleClassifier

        valid = list(EnsembleClassifier().get_params())
    elif kind == "xgboost":
        valid = list(require("benchmark", "xgboost", "XGBoost").XGBClassifier().get_params())
    else:
        valid = list(require("benchmark", "lightgbm", "LightGBM").LGBMClassifier().get_params())
    if kind in QUANTILE_KINDS:
        valid.append(QUANTILE_LEVELS)
    for name in names:
        if name not in valid:
            match = difflib.get_close_matches(name, valid, n=1)
            hint = f" (did you mean {match[0]!r}?)" if match else ""
            raise RipienoInputError(f"{where}: {name!r} is not an argument of its {kind} model{hint}.")


def check_quantile_levels(value: Any, where: str) -> tuple[float, ...]:  # noqa: ANN401 - a YAML value
    """A model's ``quantile_levels``, sorted: distinct numbers in ``(0, 1)`` with every level the scores use.

    Every level of ``uncertainty.SCORE_LEVELS`` (0.05, 0.10, ..., 0.95) must be among them, so that the
    quantile score of every distributional model is taken at the same levels, and so that 0.5 (the
    point prediction) and the 90% interval's ends (conformalised quantile regression) are predicted.

    Example:
        >>> check_quantile_levels([0.05 * i for i in range(19, 0, -1)], "x")[:3]
        (0.05, 0.1, 0.15)

    Raises:
        RipienoInputError: not a list of numbers, a number outside ``(0, 1)`` or repeated, a level missing.
    """
    fix = "e.g. quantile_levels: [0.05, 0.1, ..., 0.95] (the 19 levels 0.05 apart)"
    levels = check_levels(value, where)
    missing = [level for level in uncertainty.SCORE_LEVELS if level not in levels]
    if missing:
        raise RipienoInputError(
            f"{where}: quantile_levels lacks {missing[0]}: every model's quantile score is taken at the"
            f" levels 0.05, 0.10, ..., 0.95, so each must be predicted; {fix}."
        )
    return levels


def scores(
    task: str, y: np.ndarray, prediction: np.ndarray, n_classes: int | None = None
) -> dict[str, float]:
    """Accuracy, NLL, ECE and Brier (classification, from probabilities) or RMSE (regression).

    Args:
        task: ``regression``, ``binary`` or ``multiclass``.
        y: true class codes or targets.
        prediction: probabilities ``(n, C)`` or predicted targets ``(n,)``.
        n_classes: the number of classes (the probabilities' columns).

    Returns:
        {metric: value}; ECE and Brier as ``uncertainty.calibration_scores``.

    Example:
        >>> scores("regression", np.array([0.0, 2.0]), np.array([1.0, 1.0]))
        {'rmse': 1.0}
        >>> s = scores("binary", np.array([0, 1]), np.array([[0.8, 0.2], [0.4, 0.6]]), 2)
        >>> s["accuracy"], round(s["nll"], 4), round(s["brier"], 2)
        (1.0, 0.367, 0.2)
    """
    if task == "regression":
        return {"rmse": float(root_mean_squared_error(y, prediction))}
    labels = list(range(n_classes if n_classes is not None else prediction.shape[1]))
    proba = uncertainty.probabilities(prediction)
    return {
        "accuracy": float(accuracy_score(y, proba.argmax(1))),
        "nll": float(log_loss(y, proba, labels=labels)),
        **uncertainty.calibration_scores(y, proba),
    }


def fit_and_score(
    spec: ModelSpec,
    data: TableSplits,
    seed: int,
    params: dict[str, Any] | None = None,
    conformal: ConformalSettings | None = None,
) -> FitResult:
    """Fit ``spec`` (with ``params`` over its own) on ``data``'s training rows and score it.

    Args:
        spec: the model.
        data: the table's splits (with a ``cal`` split where ``conformal`` carves one:
            ``uncertainty.calibration_splits``).
        seed: the model's random seed (the split is the data's own).
        params: values that replace ``spec.params`` (the tuned protocol's draws).
        conformal: score conformal sets or intervals on the test rows too (``None``: not).

    Returns:
        The fit's scores, time and size.
    """
    merged = {**spec.params, **(params or {})}
    fit = {
        "ensemble": _fit_ensemble,
        "xgboost": _gbdt(fit_xgboost),
        "lightgbm": _gbdt(fit_lightgbm),
        "catboost": fit_catboost,
    }[spec.kind]
    calibrate = conformal.split if conformal is not None else None
    if calibrate is not None and calibrate not in data.features:
        raise RipienoInputError(
            "conformal.calibrate_on: train needs the table's calibration rows; carve them with"
            " uncertainty.calibration_splits before fitting."
        )
    start = time.perf_counter()
    model, n_parameters, iterations, prepare = fit(data, merged, seed)
    seconds = time.perf_counter() - start
    outputs = {
        split: _predict(model, data.task, prepare(data.features[split]))
        for split in dict.fromkeys(("val", "test", *([calibrate] if calibrate else [])))
    }
    results = {}
    for split in ("val", "test"):
        results[split] = scores(data.task, data.targets[split], outputs[split], data.n_classes)
        distribution = _distribution(model, data.task, prepare(data.features[split]))
        if distribution is not None:
            results[split].update(uncertainty.distribution_scores(data.targets[split], *distribution))
        quantiles = _quantiles(model, data.task, prepare(data.features[split]))
        if quantiles is not None:
            results[split]["qs"] = uncertainty.quantile_score(data.targets[split], *quantiles)
    if calibrate is not None:
        assert conformal is not None
        results["test"].update(_conformal_scores(model, data, prepare, outputs, calibrate, conformal))
    return FitResult(
        test=results["test"],
        val=results["val"],
        seconds=seconds,
        n_parameters=n_parameters,
        iterations=iterations,
        calibration_rows=len(data.targets[calibrate]) if calibrate else 0,
    )


def _predict(model: Any, task: str, x: pd.DataFrame) -> np.ndarray:  # noqa: ANN401
    """Predicted targets ``(n,)`` or probabilities ``(n, C)``."""
    return np.asarray(model.predict(x) if task == "regression" else model.predict_proba(x))


def _distribution(model: Any, task: str, x: pd.DataFrame) -> tuple[np.ndarray, np.ndarray] | None:  # noqa: ANN401
    """A regressor's predictive ``(mean, variance)`` (``uncertainty.PREDICTIVE_DISTRIBUTION``), or ``None``.

    ``None`` where the model has no such method, or its method returns ``None`` (a model whose
    estimator class offers the method, fitted without a distribution, e.g. a point head).
    """
    if task != "regression":
        return None
    if getattr(model, "regression_head", None) == "gaussian":  # EnsembleRegressor: the members' Gaussians
        members = model.predict_distribution(x)
        return members["member_mean"], members["member_variance"]
    method = getattr(model, PREDICTIVE_DISTRIBUTION, None)
    return method(x) if callable(method) else None


def _quantiles(model: Any, task: str, x: pd.DataFrame) -> tuple[tuple[float, ...], np.ndarray] | None:  # noqa: ANN401
    """A regressor's ``(levels, quantiles)`` (``uncertainty.PREDICTIVE_QUANTILES``), or ``None``."""
    method = getattr(model, uncertainty.PREDICTIVE_QUANTILES, None)
    return method(x) if task == "regression" and callable(method) else None


def _conformal_scores(
    model: Any,  # noqa: ANN401 - any fitted estimator of this module
    data: TableSplits,
    prepare: Any,  # noqa: ANN401 - the model's frame transform
    outputs: dict[str, np.ndarray],
    calibrate: str,
    conformal: ConformalSettings,
) -> dict[str, float]:
    """Conformal sets or intervals of the test rows, calibrated on the rows of split ``calibrate``.

    Every model: LAC and APS sets, or ``abs`` intervals; ``norm`` intervals for a ripieno ensemble of
    more than one member (its members' spread, ``EnsembleRegressor.conformalize``) or a model with a
    predictive distribution (its standard deviation); ``cqr`` intervals for a model with predictive
    quantiles (its ``alpha / 2`` and ``1 - alpha / 2`` quantiles).
    """
    alpha, y_cal, y_test = conformal.alpha, data.targets[calibrate], data.targets["test"]
    if data.task != "regression":
        cal = (y_cal, uncertainty.probabilities(outputs[calibrate]))
        test = (y_test, uncertainty.probabilities(outputs["test"]))
        return uncertainty.set_scores(cal, test, alpha, conformal.seed)
    point_cal, point = outputs[calibrate], outputs["test"]
    lower, upper = uncertainty.absolute_intervals((y_cal, point_cal), point, alpha)
    found = uncertainty.interval_scores("abs", lower, upper, y_test, alpha)
    if callable(getattr(model, "predict_members", None)) and getattr(model, "k", 1) > 1:
        # a ripieno ensemble: residuals over its members' spread, by its own conformalize
        model.conformalize(data.features[calibrate], y_cal, alpha=alpha, method="normalized")
        bounds = model.predict_interval(data.features["test"])
        found.update(uncertainty.interval_scores("norm", bounds[:, 0], bounds[:, 1], y_test, alpha))
    elif (on_cal := _distribution(model, "regression", prepare(data.features[calibrate]))) is not None and (
        on_test := _distribution(model, "regression", prepare(data.features["test"]))
    ) is not None:
        sigma_cal, sigma = uncertainty.predictive_std(*on_cal), uncertainty.predictive_std(*on_test)
        lower, upper = uncertainty.normalized_intervals((y_cal, point_cal, sigma_cal), point, sigma, alpha)
        found.update(uncertainty.interval_scores("norm", lower, upper, y_test, alpha))
    if (on_cal_q := _quantiles(model, "regression", prepare(data.features[calibrate]))) is not None:
        levels, q_cal = on_cal_q
        _, q_test = _quantiles(model, "regression", prepare(data.features["test"]))  # type: ignore[misc]
        ends = [round(alpha / 2, 6), round(1 - alpha / 2, 6)]
        if not all(end in levels for end in ends):
            raise RipienoInputError(
                f"conformal.alpha={alpha} needs the quantiles at {ends[0]} and {ends[1]} for CQR intervals;"
                " add them to the model's quantile_levels."
            )
        low, high = levels.index(ends[0]), levels.index(ends[1])
        lower, upper = uncertainty.cqr_intervals((y_cal, q_cal[:, low], q_cal[:, high]), q_test[:, low],
                                                 q_test[:, high], alpha)
        found.update(uncertainty.interval_scores("cqr", lower, upper, y_test, alpha))
    return found


# ------------------------------------------------------------------ ensembles
def _fit_ensemble(data: TableSplits, params: dict[str, Any], seed: int) -> tuple[Any, int, int, Any]:
    from ripieno.framework.methods.estimators import EnsembleClassifier, EnsembleRegressor

    cls = EnsembleRegressor if data.task == "regression" else EnsembleClassifier
    model = cls(**{"missing": "impute", **params, "categorical": data.categorical, "random_state": seed})
    model.fit(data.features["train"], data.targets["train"], data.features["val"], data.targets["val"])
    n_parameters = sum(p.numel() for p in model.model_.parameters() if p.requires_grad)
    return model, n_parameters, int(getattr(model, "n_epochs_", 0)), lambda frame: frame


def _gbdt(fit: Any) -> Any:  # noqa: ANN401 - a GBDT fit of ``ripieno.framework.methods.gbdt``
    """``fit`` with ``quantile_levels`` checked as the benchmark requires (every ``SCORE_LEVELS`` level)."""

    def checked(data: TableSplits, params: dict[str, Any], seed: int) -> tuple[Any, int, int, Any]:
        if QUANTILE_LEVELS in params:
            kind = fit.__name__.removeprefix("fit_")
            params = {**params, QUANTILE_LEVELS: check_quantile_levels(params[QUANTILE_LEVELS],
                                                                       f"{kind} {QUANTILE_LEVELS}")}
        return fit(data, params, seed)

    return checked


__all__ = [
    "CATBOOST_ITERATIONS",
    "GBDT_ESTIMATORS_CAP",
    "GBDT_KINDS",
    "KINDS",
    "PRIMARY",
    "QUANTILE_KINDS",
    "QUANTILE_LEVELS",
    "FitResult",
    "GaussianCatBoost",
    "ModelSpec",
    "QuantileBoosting",
    "check_params",
    "check_quantile_levels",
    "fit_and_score",
    "iteration_cap",
    "scores",
    "xgboost_node_count",
]
