"""Gradient-boosted trees fitted as ripieno's benchmark fits them: XGBoost, LightGBM and CatBoost.

Each ``fit_*`` fits the library's scikit-learn estimator on a ``TableSplits``' training rows,
early-stopped on its validation rows, with the library's native categorical and missing-value
handling, and returns ``(model, n_parameters, iterations, prepare)``: the fitted model, its tree nodes,
the trees early stopping kept, and the frame transform its inputs need. Every other setting is the
library's default unless ``params`` says otherwise (``n_estimators`` is raised to a cap,
``GBDT_ESTIMATORS_CAP``, so that early stopping, not the default count, ends training, and the
thread count is the process's torch thread count, which ``ripieno benchmark --workers N`` sets to
each worker's share of the cores, instead of every core). Two distributional forms:

* CatBoost regression with ``loss_function: RMSEWithUncertainty`` predicts a Gaussian per row
  (``GaussianCatBoost``);
* XGBoost and LightGBM regression with ``quantile_levels: [...]`` fit their quantile objectives at
  those levels (``QuantileBoosting``: XGBoost one multi-quantile booster, LightGBM one model per
  level), with the median as the point prediction.

These are models, so they live with the other methods; ``ripieno benchmark``
(``framework/benchmark/models.py``) fits them beside ripieno's ensembles.

Example:
    >>> QuantileBoosting((0.1, 0.5, 0.9), []).levels
    (0.1, 0.5, 0.9)
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
import torch

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.extras import require
from ripieno.framework.specs.table_splits import TableSplits

EARLY_STOPPING_ROUNDS = 50
GBDT_ESTIMATORS_CAP = 4000
"""Trees at most, for xgboost and lightgbm (their default of 100 is a count, not a cap; early stopping
on the validation rows ends training). CatBoost keeps its default of 1,000 iterations."""
CATBOOST_ITERATIONS = 1000
"""CatBoost's default ``iterations``: its cap when ``params`` set none."""
GAUSSIAN_CATBOOST_LOSS = "RMSEWithUncertainty"
"""CatBoost's regression loss that predicts a mean and a variance per row (``GaussianCatBoost``)."""
QUANTILE_LEVELS = "quantile_levels"
"""A ``params`` key of ``xgboost`` and ``lightgbm`` fits (ripieno's, not the library's): fit the library's
quantile objective at these levels on a regression table (``QuantileBoosting``)."""
QUANTILE_KINDS: tuple[str, ...] = ("xgboost", "lightgbm")
MISSING_CATEGORY = "<missing>"
"""CatBoost's category for a missing value (it takes no NaN in a categorical column)."""


def check_levels(value: Any, where: str) -> tuple[float, ...]:  # noqa: ANN401 - a YAML value
    """Quantile levels, sorted: distinct numbers strictly between 0 and 1, 0.5 among them (the median).

    Example:
        >>> check_levels([0.9, 0.5, 0.1], "x")
        (0.1, 0.5, 0.9)

    Raises:
        RipienoInputError: not a list of numbers, a number outside ``(0, 1)`` or repeated, no 0.5.
    """
    fix = "e.g. quantile_levels: [0.05, 0.1, ..., 0.95]"
    if not isinstance(value, list | tuple) or not value or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in value
    ):
        raise RipienoInputError(
            f"{where}: quantile_levels must be a list of numbers in (0, 1), got {value!r}; {fix}."
        )
    levels = tuple(sorted(round(float(v), 6) for v in value))
    if levels[0] <= 0.0 or levels[-1] >= 1.0 or len(set(levels)) != len(levels):
        raise RipienoInputError(
            f"{where}: quantile_levels must be distinct numbers strictly between 0 and 1, got {value!r};"
            f" {fix}."
        )
    if 0.5 not in levels:
        raise RipienoInputError(
            f"{where}: quantile_levels lacks 0.5, the median that is the point prediction; {fix}."
        )
    return levels


def _categories(data: TableSplits) -> dict[str, pd.CategoricalDtype]:
    """Each categorical column's categories, from the training rows (others become missing)."""
    train = data.features["train"]
    return {c: pd.CategoricalDtype(sorted(train[c].dropna().astype(str).unique())) for c in data.categorical}


def _as_category(data: TableSplits) -> Any:  # noqa: ANN401 - a frame transform
    dtypes = _categories(data)

    def prepare(frame: pd.DataFrame) -> pd.DataFrame:
        frame = frame.copy()
        for column, dtype in dtypes.items():
            frame[column] = frame[column].where(frame[column].isna(), frame[column].astype(str)).astype(dtype)
        return frame

    return prepare


def _quantile_levels(data: TableSplits, params: dict[str, Any], kind: str) -> tuple[float, ...] | None:
    """``params``' ``quantile_levels`` (popped), checked against the table's task; ``None`` if absent."""
    if QUANTILE_LEVELS not in params:
        return None
    levels = check_levels(params.pop(QUANTILE_LEVELS), f"{kind} {QUANTILE_LEVELS}")
    if data.task != "regression":
        raise RipienoInputError(
            f"{kind} quantile_levels fits quantile objectives, for regression tables; {data.name or 'this'}"
            f" table is {data.task}: list the quantile model in a benchmark file of regression tables only."
        )
    return levels


def fit_xgboost(data: TableSplits, params: dict[str, Any], seed: int) -> tuple[Any, int, int, Any]:
    """An ``XGBClassifier`` / ``XGBRegressor`` (``QuantileBoosting`` with ``quantile_levels``).

    Args:
        data: the table's splits: fitted on ``train``, early-stopped on ``val``.
        params: the estimator's arguments over the defaults (and ``quantile_levels``).
        seed: its random seed.

    Returns:
        ``(model, tree nodes, trees kept by early stopping, the frame transform its inputs need)``.
    """
    xgboost = require("benchmark", "xgboost", "XGBoost")
    prepare = _as_category(data)
    params = dict(params)
    levels = _quantile_levels(data, params, "xgboost")
    if levels is not None:  # one booster, one output per level (XGBoost >= 2.0's multi-quantile objective)
        params = {**params, "objective": "reg:quantileerror", "quantile_alpha": np.asarray(levels)}
    cls = xgboost.XGBRegressor if data.task == "regression" else xgboost.XGBClassifier
    model = cls(
        **{
            "n_estimators": GBDT_ESTIMATORS_CAP,
            "enable_categorical": True,
            "n_jobs": torch.get_num_threads(),  # a worker's share of the cores (runner.worker_threads)
            "early_stopping_rounds": EARLY_STOPPING_ROUNDS,
            **params,
            "random_state": seed,
        }
    )
    model.fit(
        prepare(data.features["train"]),
        data.targets["train"],
        eval_set=[(prepare(data.features["val"]), data.targets["val"])],
        verbose=False,
    )
    nodes, iterations = xgboost_node_count(model.get_booster()), int(model.best_iteration) + 1
    if levels is not None:
        return QuantileBoosting(levels, [model]), nodes, iterations, prepare
    return model, nodes, iterations, prepare


def xgboost_node_count(booster: Any) -> int:
    """Split and leaf nodes over all trees of an XGBoost ``Booster``, from its JSON model.

    ``Booster.trees_to_dataframe`` counts the same nodes but parses the text dump, which it cannot
    do for a split on a boolean (indicator) feature, dumped as ``[name]`` (``Failed to parse model
    text dump``, xgboost 3.x); the JSON model is the library's own structured form.
    """
    trees = json.loads(booster.save_raw("json"))["learner"]["gradient_booster"]["model"]["trees"]
    return sum(int(tree["tree_param"]["num_nodes"]) - int(tree["tree_param"].get("num_deleted", 0))
               for tree in trees)


def fit_lightgbm(data: TableSplits, params: dict[str, Any], seed: int) -> tuple[Any, int, int, Any]:
    """An ``LGBMClassifier`` / ``LGBMRegressor`` (``QuantileBoosting`` with ``quantile_levels``).

    Args:
        data: the table's splits: fitted on ``train``, early-stopped on ``val``.
        params: the estimator's arguments over the defaults (and ``quantile_levels``).
        seed: its random seed.

    Returns:
        ``(model, tree nodes, trees kept by early stopping, the frame transform its inputs need)``.
    """
    lightgbm = require("benchmark", "lightgbm", "LightGBM")
    prepare = _as_category(data)
    params = dict(params)
    levels = _quantile_levels(data, params, "lightgbm")
    cls = lightgbm.LGBMRegressor if data.task == "regression" else lightgbm.LGBMClassifier

    def fit(extra: dict[str, Any]) -> Any:  # noqa: ANN401 - a fitted LightGBM model
        model = cls(**{"n_estimators": GBDT_ESTIMATORS_CAP, "verbosity": -1,
                       "n_jobs": torch.get_num_threads(), **params, **extra,
                       "random_state": seed})
        model.fit(
            prepare(data.features["train"]),
            data.targets["train"],
            eval_X=prepare(data.features["val"]),
            eval_y=data.targets["val"],
            callbacks=[lightgbm.early_stopping(EARLY_STOPPING_ROUNDS, verbose=False)],
        )
        return model

    # LightGBM's quantile objective takes one level: one model per level, each early-stopped on its own loss
    models = [fit({"objective": "quantile", "alpha": level}) for level in levels] if levels else [fit({})]
    nodes = sum(2 * tree["num_leaves"] - 1 for m in models for tree in m.booster_.dump_model()["tree_info"])
    iterations = max(int(m.best_iteration_ or m.n_estimators) for m in models)
    return (QuantileBoosting(levels, models) if levels else models[0]), nodes, iterations, prepare


def fit_catboost(data: TableSplits, params: dict[str, Any], seed: int) -> tuple[Any, int, int, Any]:
    """A ``CatBoostClassifier`` / ``CatBoostRegressor`` (``GaussianCatBoost`` with ``RMSEWithUncertainty``).

    Args:
        data: the table's splits: fitted on ``train``, early-stopped on ``val``.
        params: the estimator's arguments over the defaults.
        seed: its random seed.

    Returns:
        ``(model, tree nodes, trees kept by early stopping, the frame transform its inputs need)``.
    """
    catboost = require("benchmark", "catboost", "CatBoost")
    columns = list(data.categorical)

    def prepare(frame: pd.DataFrame) -> pd.DataFrame:  # CatBoost takes categories as strings, no NaN
        frame = frame.copy()
        for column in columns:
            values = frame[column].astype(object)
            frame[column] = values.where(values.notna(), MISSING_CATEGORY).astype(str)
        return frame

    cls = catboost.CatBoostRegressor if data.task == "regression" else catboost.CatBoostClassifier
    model = cls(
        **{
            "early_stopping_rounds": EARLY_STOPPING_ROUNDS,
            "verbose": False,
            "allow_writing_files": False,
            "thread_count": torch.get_num_threads(),  # not -1 (every core): a worker's share
            **params,
            "random_seed": seed,
        }
    )
    model.fit(
        prepare(data.features["train"]),
        data.targets["train"],
        cat_features=columns,
        eval_set=(prepare(data.features["val"]), data.targets["val"]),
        use_best_model=True,
    )
    trees = model.tree_count_
    settings = model.get_all_params()
    depth = int(settings.get("depth", 6))
    loss = str(settings.get("loss_function", ""))
    if data.task == "regression" and loss.startswith(GAUSSIAN_CATBOOST_LOSS):
        model = GaussianCatBoost(model)
    return model, trees * (2 ** (depth + 1) - 1), int(trees), prepare


class GaussianCatBoost:
    """A CatBoost regressor fitted with ``loss_function="RMSEWithUncertainty"``: a Gaussian per row.

    CatBoost's ``predict(X, prediction_type="RMSEWithUncertainty")`` gives each row's mean and variance
    (the variance is ``exp(2 * raw)`` of its second raw output); ``predict`` is the mean, the point
    prediction every other score uses, and ``predictive_distribution`` the pair (the benchmark's
    ``uncertainty.PREDICTIVE_DISTRIBUTION`` hook: regression NLL, CRPS and ``norm`` intervals).

    Args:
        model: the fitted ``catboost.CatBoostRegressor``.
    """

    def __init__(self, model: Any) -> None:  # noqa: ANN401 - a fitted CatBoostRegressor
        self.model = model

    def predictive_distribution(self, x: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Each row's predictive mean and variance ``(n,)``."""
        out = np.asarray(self.model.predict(x, prediction_type=GAUSSIAN_CATBOOST_LOSS), dtype=np.float64)
        return out[:, 0], out[:, 1]

    def predict(self, x: pd.DataFrame) -> np.ndarray:
        """Each row's predictive mean."""
        return self.predictive_distribution(x)[0]


class QuantileBoosting:
    """Gradient-boosted quantile regression: the predictive quantiles of each row at fixed levels.

    Either one model with an output per level (XGBoost's multi-quantile ``reg:quantileerror``) or one
    model per level (LightGBM's ``quantile`` objective). Each row's quantiles are sorted, so that they
    never cross (the non-crossing rearrangement of Chernozhukov et al., 2010: it never raises the
    pinball loss). ``predict`` is the median, the point prediction every other score uses;
    ``predictive_quantiles`` the levels and quantiles (the benchmark's
    ``uncertainty.PREDICTIVE_QUANTILES`` hook: quantile score and CQR intervals).

    Args:
        levels: the quantile levels, sorted, with 0.5 among them.
        models: the fitted models: one predicting ``(n, len(levels))``, or one ``(n,)`` per level.
    """

    def __init__(self, levels: tuple[float, ...], models: list[Any]) -> None:
        self.levels = tuple(levels)
        self.models = list(models)

    def predictive_quantiles(self, x: pd.DataFrame) -> tuple[tuple[float, ...], np.ndarray]:
        """The levels and each row's quantiles at them ``(n, len(levels))``, sorted along the levels."""
        if len(self.models) == 1:
            out = np.asarray(self.models[0].predict(x), dtype=np.float64).reshape(len(x), -1)
        else:
            out = np.stack([np.asarray(m.predict(x), dtype=np.float64) for m in self.models], axis=1)
        return self.levels, np.sort(out, axis=1)

    def predict(self, x: pd.DataFrame) -> np.ndarray:
        """Each row's predicted median."""
        return self.predictive_quantiles(x)[1][:, self.levels.index(0.5)]
