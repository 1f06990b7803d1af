"""scikit-learn estimators: the estimator contract (check_estimator), composition, pickling, inputs."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.base import clone
from sklearn.datasets import load_iris
from sklearn.model_selection import GridSearchCV, StratifiedKFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import check_estimator

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.methods import estimators
from ripieno.framework.methods.estimators import (
    ADAPTERS,
    PARAMETERS,
    EnsembleClassifier,
    EnsembleRegressor,
    InvalidParameterError,
)

SUBSET_INVARIANCE = ("float32 matrix products differ in the last bits with the batch's size, so a row's"
                     " prediction can move by ~1e-6 relative when predicted in a smaller batch")


@pytest.mark.slow
@pytest.mark.parametrize("estimator", [
    EnsembleClassifier(k=2, d_block=16, lr=1e-2, max_epochs=50, random_state=0),
    EnsembleRegressor(k=2, d_block=16, lr=1e-2, batch_size=64, max_epochs=60, random_state=0),
], ids=["classifier", "regressor"])
def test_check_estimator(estimator):
    results = check_estimator(estimator, on_fail=None,
                              expected_failed_checks={"check_methods_subset_invariance": SUBSET_INVARIANCE})
    failed = {r["check_name"]: repr(r["exception"]) for r in results if r["status"] == "failed"}
    assert not failed
    assert len(results) > 40


def _iris():
    x, y = load_iris(return_X_y=True)
    return x, np.array(["setosa", "versicolor", "virginica"])[y]


QUICK = {"k": 2, "d_block": 16, "max_epochs": 8, "lr": 1e-2, "random_state": 0}


def test_pipeline_cross_val_score_and_grid_search():
    x, y = _iris()
    pipe = make_pipeline(StandardScaler(), EnsembleClassifier(**QUICK))
    scores = cross_val_score(pipe, x, y, cv=3)
    # oracle: the same folds fitted and scored by hand on fresh clones
    folds = StratifiedKFold(3).split(x, y)
    expected = [clone(pipe).fit(x[tr], y[tr]).score(x[te], y[te]) for tr, te in folds]
    np.testing.assert_array_equal(scores, expected)
    search = GridSearchCV(EnsembleClassifier(**QUICK), {"adapter": ["lometab", "rank1"]}, cv=2).fit(x, y)
    refit = EnsembleClassifier(**{**QUICK, **search.best_params_}).fit(x, y)
    np.testing.assert_array_equal(search.predict_proba(x), refit.predict_proba(x))


def _mixed_frame(n: int = 160, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    colour = rng.choice(["red", "green", "blue"], n)
    size = rng.normal(size=n)
    frame = pd.DataFrame({"size": size, "colour": colour, "flag": rng.random(n) > 0.5,
                          "shop": pd.Categorical(rng.choice(["a", "b"], n))})
    frame.loc[::10, "size"] = np.nan
    frame.loc[5::17, "colour"] = None
    y = (np.nan_to_num(size) + (colour == "red") > 0.5).astype(int)
    return frame, y


def test_dataframes_with_categories_and_gaps_are_predicted_as_their_checkpointable_module():
    frame, y = _mixed_frame()
    clf = EnsembleClassifier(**QUICK).fit(frame, y)
    assert clf.preprocessor_.kept_categorical == ["colour", "flag", "shop"]
    assert clf.preprocessor_.indicators == ["size", "colour"]
    proba = clf.predict_proba(frame)
    np.testing.assert_allclose(proba.sum(1), 1.0, atol=1e-6)
    table = clf.model_.predict_frame(frame)  # the inner module reads raw rows the same way
    np.testing.assert_allclose(table[["proba_0", "proba_1"]].to_numpy(), proba, atol=1e-6)
    assert list(clf.feature_names_in_) == ["size", "colour", "flag", "shop"]


def test_random_state_repeats_fits_and_leaves_the_callers_random_state_alone():
    x, y = _iris()
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()
    first = EnsembleClassifier(**QUICK).fit(x, y).predict_proba(x)
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], numpy_state[1])
    np.testing.assert_array_equal(EnsembleClassifier(**QUICK).fit(x, y).predict_proba(x), first)
    other = EnsembleClassifier(**{**QUICK, "random_state": 1}).fit(x, y).predict_proba(x)
    assert not np.array_equal(other, first)


def test_pickle_round_trip_predicts_the_same():
    x, y = _iris()
    clf = EnsembleClassifier(**QUICK).fit(x, y)
    clone = pickle.loads(pickle.dumps(clf))
    np.testing.assert_array_equal(clone.predict_proba(x), clf.predict_proba(x))
    assert list(clone.classes_) == ["setosa", "versicolor", "virginica"]


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_every_adapter_fits_a_regressor_with_a_given_validation_set(adapter):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(120, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 100.0
    reg = EnsembleRegressor(adapter=adapter, k=3, d_block=16, max_epochs=3, random_state=0)
    reg.fit(x[:90], y[:90], X_val=x[90:], y_val=y[90:])
    assert reg.model_.hparams.adapter == ADAPTERS[adapter]["adapter"]
    members = reg.predict_members(x[90:])
    assert members.shape == (30, 3)
    np.testing.assert_allclose(reg.predict(x[90:]), members.mean(1), rtol=1e-6)
    assert abs(reg.predict(x).mean() - 100.0) < 10.0  # in y's units, not standardised ones


def test_trainer_kwargs_reach_the_trainer_and_bad_arguments_are_errors():
    x, y = _iris()
    clf = EnsembleClassifier(**{**QUICK, "trainer_kwargs": {"max_epochs": 1}}).fit(x, y)
    assert clf.n_epochs_ == 1
    with pytest.raises(ValueError, match="adapter must be one of"):
        EnsembleClassifier(adapter="lora").fit(x, y)
    with pytest.raises(ValueError, match="Give both X_val and y_val"):
        EnsembleClassifier(**QUICK).fit(x, y, X_val=x)
    with pytest.raises(ValueError, match=r"y_val has labels not in y: \['cactus'\]"):
        EnsembleClassifier(**QUICK).fit(x[:100], y[:100], X_val=x[100:102], y_val=["setosa", "cactus"])
    with pytest.raises(ValueError, match="categorical column 'colour' is not in X"):
        EnsembleClassifier(**{**QUICK, "categorical": ["colour"]}).fit(pd.DataFrame(x).add_prefix("f"), y)


def test_every_constructor_parameter_has_a_constraint():
    for cls in (EnsembleClassifier, EnsembleRegressor):
        assert set(cls().get_params(deep=False)) == set(PARAMETERS)


BAD_PARAMETERS = [  # (name, value, what the message says after "<class>: ")
    ("max_epochs", "3", "max_epochs must be an int >= 1, got '3' (str)."),
    ("max_epochs", 0, "max_epochs must be an int >= 1, got 0 (int)."),
    ("max_epochs", 3.0, "max_epochs must be an int >= 1, got 3.0 (float)."),
    ("k", 0, "k must be an int >= 1, got 0 (int)."),
    ("k", True, "k must be an int >= 1, got True (bool)."),
    ("k", np.int64(-2), "k must be an int >= 1, got -2 (int64)."),
    ("lr", -1, "lr must be a finite float > 0, got -1 (int)."),
    ("lr", float("inf"), "lr must be a finite float > 0, got inf (float)."),
    ("lr", "1e-3", "lr must be a finite float > 0, got '1e-3' (str)."),
    ("adapter", "lora",
     "adapter must be one of ['additive', 'lometab', 'mini', 'packed', 'rank1', 'shared'],"
     " got 'lora' (str)."),
    ("patience", 1.5, "patience must be an int >= 0, got 1.5 (float)."),
    ("patience", -1, "patience must be an int >= 0, got -1 (int)."),
    ("dropout", 1.0, "dropout must be a float in [0, 1), got 1.0 (float)."),
    ("val_size", 0, "val_size must be a float in (0, 1), got 0 (int)."),
    ("weight_decay", -1e-4, "weight_decay must be a finite float >= 0, got -0.0001 (float)."),
    ("sigma_init", -0.5, "sigma_init must be None or a finite float >= 0, got -0.5 (float)."),
    ("n_bins", 1, "n_bins must be an int >= 2, got 1 (int)."),
    ("batch_size", None, "batch_size must be an int >= 1, got None (NoneType)."),
    ("numeric_embedding", "linear", "numeric_embedding must be one of ['none', 'ple'], got 'linear' (str)."),
    ("missing", "drop", "missing must be one of ['error', 'impute'], got 'drop' (str)."),
    ("verbose", "yes", "verbose must be a bool, got 'yes' (str)."),
    ("categorical", "colour",
     "categorical must be None or a list of column names or indices, got 'colour' (str)."),
    ("random_state", -1,
     "random_state must be None or an int in [0, 2**32 - 1] (or a numpy RandomState), got -1 (int)."),
    ("trainer_kwargs", ["max_epochs", 1],
     "trainer_kwargs must be None or a dict, got ['max_epochs', 1] (list)."),
]


@pytest.mark.parametrize("cls", [EnsembleClassifier, EnsembleRegressor])
@pytest.mark.parametrize(("name", "value", "message"), BAD_PARAMETERS,
                         ids=[f"{name}={value!r}" for name, value, _ in BAD_PARAMETERS])
def test_bad_parameters_are_one_line_errors_before_the_data_is_read(cls, name, value, message, monkeypatch):
    def not_reached(*args, **kwargs):
        pytest.fail("fit read the data or trained before checking its parameters")

    monkeypatch.setattr(estimators._TabularEnsembleEstimator, "_frame", not_reached)
    monkeypatch.setattr(estimators._TabularEnsembleEstimator, "_train", not_reached)
    estimator = cls().set_params(**{name: value})
    x, y = _iris()
    with pytest.raises(InvalidParameterError) as caught:
        estimator.fit(x, y if cls is EnsembleClassifier else np.arange(len(x), dtype=float))
    assert str(caught.value) == f"{cls.__name__}: {message}"
    assert isinstance(caught.value, RipienoInputError) and isinstance(caught.value, TypeError)
    assert estimator.get_params()[name] is value  # left as given


def test_numpy_numbers_are_accepted_and_fit_as_the_python_ones():
    x, y = _iris()
    numpy_params = {"k": np.int64(2), "d_block": np.int32(16), "max_epochs": np.int64(8),
                    "lr": np.float64(1e-2), "random_state": np.int64(0), "patience": np.int64(8),
                    "batch_size": np.int64(256), "n_bins": np.int16(32), "dropout": np.float32(0.1),
                    "verbose": np.bool_(False)}
    got = EnsembleClassifier(**numpy_params).fit(x, y)
    expected = EnsembleClassifier(**{name: value.item() for name, value in numpy_params.items()}).fit(x, y)
    np.testing.assert_array_equal(got.predict_proba(x), expected.predict_proba(x))
    assert got.n_epochs_ == expected.n_epochs_
    assert type(got.model_.hparams.k) is int and type(got.model_.hparams.lr) is float  # checkpoint-safe
