"""Fitted scikit-learn transformers as plain Python, and back.

A checkpoint must load with ``torch.load(..., weights_only=True)``, which refuses numpy
arrays and arbitrary objects. ``fitted_state`` turns a fitted transformer's learned
attributes (``quantiles_``, ``categories_``, ``statistics_``, ...) into lists, numbers and
strings; ``restore_fitted`` builds the same transformer class with the same parameters and
sets those attributes back, so ``transform`` is scikit-learn's own code on the same state.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import sklearn
from sklearn.base import TransformerMixin
from sklearn.impute import SimpleImputer
from sklearn.preprocessing import OrdinalEncoder, QuantileTransformer, StandardScaler

TRANSFORMERS: dict[str, type] = {
    cls.__name__: cls for cls in (QuantileTransformer, StandardScaler, SimpleImputer, OrdinalEncoder)
}
"""The transformer classes a saved state may name (nothing else is ever instantiated)."""

ARRAY_KEY = "__ndarray__"
DTYPE_KEY = "__dtype__"
PAIRS_KEY = "__pairs__"
FLOAT_KEY = "__float__"


def _encode(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, np.ndarray):
        data = [None if _is_missing(v) else v for v in value.ravel().tolist()] if value.dtype == object \
            else value.ravel().tolist()
        return {ARRAY_KEY: value.dtype.str if value.dtype != object else "object",
                "shape": list(value.shape), "data": data}
    if isinstance(value, type) and issubclass(value, np.generic):  # e.g. dtype=np.float64
        return {DTYPE_KEY: np.dtype(value).str, "scalar_type": True}
    if isinstance(value, np.dtype):
        return {DTYPE_KEY: value.str if value.kind != "O" else "object"}
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return {FLOAT_KEY: str(value)}  # nan != nan would make equal states compare unequal
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {PAIRS_KEY: [[_encode(k), _encode(v)] for k, v in value.items()]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"Cannot store a fitted attribute of type {type(value).__name__} as plain Python.")


def _decode(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, dict) and ARRAY_KEY in value:
        dtype = object if value[ARRAY_KEY] == "object" else np.dtype(value[ARRAY_KEY])
        data = [np.nan if v is None else v for v in value["data"]] if dtype is object else value["data"]
        return np.array(data, dtype=dtype).reshape(value["shape"])
    if isinstance(value, dict) and DTYPE_KEY in value:
        dtype = np.dtype(object if value[DTYPE_KEY] == "object" else value[DTYPE_KEY])
        return dtype.type if value.get("scalar_type") else dtype
    if isinstance(value, dict) and FLOAT_KEY in value:
        return float(value[FLOAT_KEY])
    if isinstance(value, dict) and PAIRS_KEY in value:
        return {_decode(k): _decode(v) for k, v in value[PAIRS_KEY]}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _is_missing(value: Any) -> bool:  # noqa: ANN401
    return value is None or (isinstance(value, float) and np.isnan(value))


def fitted_state(transformer: TransformerMixin) -> dict[str, Any]:
    """The class, parameters and learned attributes of a fitted transformer, as plain Python.

    Args:
        transformer: a fitted instance of one of ``TRANSFORMERS``.

    Example:
        >>> scaler = StandardScaler().fit([[0.0], [2.0]])
        >>> state = fitted_state(scaler)
        >>> state["class"], state["fitted"]["mean_"]["data"]
        ('StandardScaler', [1.0])
        >>> restore_fitted(state).transform([[4.0]]).tolist()
        [[3.0]]
    """
    name = type(transformer).__name__
    if TRANSFORMERS.get(name) is not type(transformer):
        raise TypeError(f"Cannot store a {name}; supported: {sorted(TRANSFORMERS)}.")
    params = transformer.get_params(deep=False)
    fitted = {key: _encode(value) for key, value in vars(transformer).items()
              if key not in params and (key.endswith("_") or key.startswith("_"))}
    if not fitted:
        raise ValueError(f"The {name} is not fitted; fit it before storing its state.")
    return {"class": name, "params": _encode(params), "fitted": fitted,
            "sklearn_version": sklearn.__version__}


def restore_fitted(state: dict[str, Any]) -> TransformerMixin:
    """The transformer ``fitted_state`` described, ready to ``transform``."""
    name = state.get("class")
    if name not in TRANSFORMERS:
        raise ValueError(f"Unknown transformer {name!r} in the saved preprocessing; supported:"
                         f" {sorted(TRANSFORMERS)}.")
    if state.get("sklearn_version") != sklearn.__version__:
        warnings.warn(
            f"The preprocessing was fitted with scikit-learn {state.get('sklearn_version')} and is"
            f" restored under {sklearn.__version__}; check predictions if the transformer changed.",
            stacklevel=2,
        )
    transformer = TRANSFORMERS[name](**_decode(state["params"]))
    for key, value in state["fitted"].items():
        setattr(transformer, key, _decode(value))
    return transformer
