"""Fitted scikit-learn transformers survive a weights_only checkpoint round trip unchanged."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from sklearn.impute import SimpleImputer
from sklearn.preprocessing import OrdinalEncoder, QuantileTransformer, StandardScaler

from ripieno.framework.specs.sklearn_state import fitted_state, restore_fitted


def _numbers(seed: int = 0, n: int = 200) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.normal(size=n), rng.exponential(size=n), rng.integers(0, 5, n)])


def _categories(seed: int = 0, n: int = 200) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.choice(["a", "b", "c"], n), rng.choice(["x", "y"], n)]).astype(object)


def _with_gaps(x: np.ndarray) -> np.ndarray:
    x = x.copy()
    x[::7, 0] = np.nan
    return x


CASES = {
    "quantile": (lambda: QuantileTransformer(n_quantiles=20, output_distribution="normal", random_state=0),
                 _numbers, _numbers(1)),
    "standard": (StandardScaler, _numbers, _numbers(1)),
    "median": (lambda: SimpleImputer(strategy="median"), lambda: _with_gaps(_numbers()),
               _with_gaps(_numbers(1))),
    "most_frequent": (lambda: SimpleImputer(strategy="most_frequent"),
                      lambda: _with_gaps(_categories()), _with_gaps(_categories(1))),
    "ordinal_unknown": (lambda: OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1),
                        _categories, np.array([["a", "y"], ["zz", "x"], ["c", "new"]], dtype=object)),
}


def _round_trip(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save({"state": state}, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)["state"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_restored_transformer_transforms_exactly_as_the_fitted_one(name):
    make, train, new = CASES[name]
    fitted = make().fit(train())
    restored = restore_fitted(_round_trip(fitted_state(fitted)))
    assert type(restored) is type(fitted)
    assert repr(restored.get_params()) == repr(fitted.get_params())  # repr: nan != nan
    expected, got = fitted.transform(new), restored.transform(new)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_only_known_fitted_transformers_are_stored_or_restored():
    with pytest.raises(ValueError, match="not fitted"):
        fitted_state(StandardScaler())
    from sklearn.preprocessing import MinMaxScaler
    with pytest.raises(TypeError, match="Cannot store a MinMaxScaler"):
        fitted_state(MinMaxScaler().fit([[0.0], [1.0]]))
    state = fitted_state(StandardScaler().fit([[0.0], [1.0]]))
    with pytest.raises(ValueError, match="Unknown transformer 'os.system'"):
        restore_fitted({**state, "class": "os.system"})


def test_a_state_from_another_sklearn_version_warns():
    state = fitted_state(StandardScaler().fit([[0.0], [1.0]]))
    with pytest.warns(UserWarning, match="fitted with scikit-learn 0.1"):
        restore_fitted({**state, "sklearn_version": "0.1"})
