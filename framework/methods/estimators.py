"""scikit-learn estimators around ripieno's tabular ensembles: ``EnsembleClassifier``, ``EnsembleRegressor``.

``fit(X, y, X_val=None, y_val=None)`` takes DataFrames (categorical columns found from
their pandas dtype: anything not numeric, such as strings, ``category`` or ``bool``, or named in
``categorical``) or arrays (numeric unless ``categorical`` gives column indices); it fits
the same preprocessing as ``TabularDataModule`` (``TabularPreprocessor``, piecewise-linear
bins), builds a ``TabularEnsembleModule`` and trains it with a Lightning ``Trainer``:
early stopping on the validation loss (``X_val``/``y_val``, else a ``val_size`` part of
the training rows) and the best epoch's weights restored. ``random_state`` makes fits
repeatable without touching the caller's random state (torch's generator is forked).

As scikit-learn's own estimators do, ``fit`` first checks every constructor parameter
against ``PARAMETERS`` (its type, range or choices) and refuses a bad one with one line
naming it, the value and what is allowed (``InvalidParameterError``), before any data is
read or anything is trained; NumPy integers and floats count as ints and floats, ``bool``
does not count as an int.

Written here because the ``tabm`` package has no scikit-learn interface (its maintainers
declined one), and wrappers elsewhere (pytabkit, AutoGluon) wrap other models.
"""

from __future__ import annotations

import logging
import math
import numbers
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import lightning as L
import numpy as np
import pandas as pd
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.model_selection import train_test_split
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, column_or_1d, validate_data
from torch.utils.data import DataLoader

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.messages import quiet_lightning
from ripieno.framework.methods.best_weights import BestWeights
from ripieno.framework.methods.tabular_ensemble import TabularEnsembleModule
from ripieno.framework.nn.embeddings import compute_bins
from ripieno.framework.specs.tabular import TabularSpec
from ripieno.framework.specs.tabular_preprocessing import TabularPreprocessor, infer_categorical
from ripieno.framework.uq.calibrators import make_calibrator
from ripieno.framework.uq.conformal import SplitConformal

ADAPTERS: dict[str, dict[str, str]] = {
    "lometab": {"adapter": "lometab"},
    "rank1": {"adapter": "rank1"},
    "mini": {"adapter": "rank1", "adapter_layers": "mini"},
    "additive": {"adapter": "additive"},
    "shared": {"adapter": "shared"},
    "packed": {"adapter": "packed", "share_embeddings": False},
}
"""``adapter`` names of the estimators and the ``TabularEnsembleModule`` arguments they set."""

_POST_HOC = ("conformal_", "spread_floor_", "calibrator_")
"""Attributes fitted after ``fit`` on held-out rows; a new ``fit`` drops them."""


class InvalidParameterError(RipienoInputError, TypeError):
    """A constructor parameter of the wrong type or out of range; a ``ValueError`` and a ``TypeError``.

    Both, as scikit-learn's own ``InvalidParameterError``: callers catching either see it.
    """


def _is_int(value: object) -> bool:
    """Python and NumPy integers, not ``bool``."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    """Finite Python and NumPy ints and floats, not ``bool``."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _is_column(value: object) -> bool:
    """A column name or index."""
    return isinstance(value, str) or _is_int(value)


@dataclass(frozen=True)
class Constraint:
    """What one constructor parameter accepts: a kind, and for numbers a range, for strings the choices.

    Attributes:
        kind: ``int``, ``float`` (ints accepted too), ``str`` (one of ``choices``), ``bool``,
            ``columns`` (a list of column names or indices), ``seed`` (an int or a NumPy
            ``RandomState``) or ``dict``.
        low: the lowest number allowed (``None``: no bound).
        high: the highest number allowed (``None``: no bound).
        bounds: whether ``low`` and ``high`` are included: ``[]``, ``[)``, ``(]`` or ``()``.
        choices: the strings allowed (``str``).
        none: whether ``None`` is allowed too.
    """

    kind: Literal["int", "float", "str", "bool", "columns", "seed", "dict"]
    low: float | None = None
    high: float | None = None
    bounds: Literal["[]", "[)", "(]", "()"] = "[]"
    choices: tuple[str, ...] = ()
    none: bool = False

    def accepts(self, value: object) -> bool:
        """Whether ``value`` is of the kind and within the range or choices."""
        if value is None:
            return self.none
        if self.kind == "str":
            return isinstance(value, str) and value in self.choices
        if self.kind == "bool":
            return isinstance(value, bool | np.bool_)
        if self.kind == "columns":  # a list, tuple, array or Index; not one name, a dict or an iterator
            return (isinstance(value, Iterable) and not isinstance(value, str | bytes | Mapping | Iterator)
                    and all(_is_column(c) for c in value))
        if self.kind == "seed":
            return isinstance(value, np.random.RandomState) or (_is_int(value) and 0 <= value < 2**32)
        if self.kind == "dict":
            return isinstance(value, Mapping)
        if not (_is_int(value) if self.kind == "int" else _is_real(value)):
            return False
        number = float(value)  # type: ignore[arg-type]
        low_ok = self.low is None or (number > self.low if self.bounds[0] == "(" else number >= self.low)
        high_ok = self.high is None or (number < self.high if self.bounds[1] == ")" else number <= self.high)
        return low_ok and high_ok

    def describe(self) -> str:
        """What is allowed, in words: ``an int >= 1``, ``a float in [0, 1)``, ``one of [...]``."""
        if self.kind == "str":
            text = f"one of {sorted(self.choices)}"
        elif self.kind == "bool":
            text = "a bool"
        elif self.kind == "columns":
            text = "a list of column names or indices"
        elif self.kind == "seed":
            text = "an int in [0, 2**32 - 1] (or a numpy RandomState)"
        elif self.kind == "dict":
            text = "a dict"
        else:
            bounded = self.low is not None and self.high is not None
            text = "an int" if self.kind == "int" else "a float" if bounded else "a finite float"
            if bounded:
                text += f" in {self.bounds[0]}{self.low:g}, {self.high:g}{self.bounds[1]}"
            elif self.low is not None:
                text += f" {'>' if self.bounds[0] == '(' else '>='} {self.low:g}"
            elif self.high is not None:
                text += f" {'<' if self.bounds[1] == ')' else '<='} {self.high:g}"
        return f"None or {text}" if self.none else text


PARAMETERS: dict[str, Constraint] = {
    "adapter": Constraint("str", choices=tuple(ADAPTERS)),
    "k": Constraint("int", low=1),
    "n_blocks": Constraint("int", low=1),
    "d_block": Constraint("int", low=1),
    "rank": Constraint("int", low=1),
    "sigma_init": Constraint("float", low=0, none=True),
    "dropout": Constraint("float", low=0, high=1, bounds="[)"),
    "numeric_embedding": Constraint("str", choices=("ple", "none")),
    "n_bins": Constraint("int", low=2),
    "d_embedding": Constraint("int", low=1),
    "categorical": Constraint("columns", none=True),
    "missing": Constraint("str", choices=("impute", "error")),
    "lr": Constraint("float", low=0, bounds="()"),
    "weight_decay": Constraint("float", low=0),
    "batch_size": Constraint("int", low=1),
    "max_epochs": Constraint("int", low=1),
    "patience": Constraint("int", low=0),
    "val_size": Constraint("float", low=0, high=1, bounds="()"),
    "random_state": Constraint("seed", none=True),
    "verbose": Constraint("bool"),
    "trainer_kwargs": Constraint("dict", none=True),
    "regression_head": Constraint("str", choices=("point", "gaussian", "quantile")),
}
"""What each constructor parameter of the estimators accepts, checked by ``fit`` before anything else."""


def check_parameters(estimator: BaseEstimator) -> None:
    """Check every parameter of ``estimator`` against ``PARAMETERS``; the first bad one is an error.

    Raises:
        InvalidParameterError: one line: ``<class>: <name> must be <allowed>, got <value> (<type>).``

    Example:
        >>> check_parameters(EnsembleClassifier(max_epochs=np.int64(3)))  # NumPy ints are ints
        >>> try:
        ...     check_parameters(EnsembleClassifier(max_epochs="3"))
        ... except ValueError as error:
        ...     print(error)
        EnsembleClassifier: max_epochs must be an int >= 1, got '3' (str).
    """
    for name, value in estimator.get_params(deep=False).items():
        constraint = PARAMETERS[name]
        if not constraint.accepts(value):
            shown = " ".join(repr(_plain(value)).split())  # -2, as numpy 1 and 2 both say it
            shown = shown if len(shown) <= 80 else shown[:77] + "..."
            raise InvalidParameterError(f"{type(estimator).__name__}: {name} must be {constraint.describe()},"
                                        f" got {shown} ({type(value).__name__}).")


def _plain(value: Any) -> Any:  # noqa: ANN401
    """A NumPy scalar as its Python number (for Lightning's ``isinstance(..., int)`` and checkpoints)."""
    return value.item() if isinstance(value, np.generic) else value


@contextmanager
def _quiet_fit(verbose: bool) -> Iterator[None]:
    """Lightning's info messages and per-fit warnings off while fitting (unless ``verbose``)."""
    if verbose:
        yield
        return
    with quiet_lightning(logging.ERROR, modules=r"lightning\..*"):
        yield


def _collate(rows: list[tuple[Any, ...]]) -> dict[str, torch.Tensor]:
    x_num, x_cat, *y = (torch.stack(col) for col in zip(*rows, strict=True))
    return {"x_num": x_num, "x_cat": x_cat, **({"y": y[0]} if y else {})}


class _TabularEnsembleEstimator(BaseEstimator):
    """Shared ``fit`` / prediction code of ``EnsembleClassifier`` and ``EnsembleRegressor``."""

    _task_family: ClassVar[str] = ""

    def __init__(
        self,
        adapter: str = "lometab",
        k: int = 16,
        n_blocks: int = 2,
        d_block: int = 128,
        rank: int = 4,
        sigma_init: float | None = None,
        dropout: float = 0.1,
        numeric_embedding: str = "ple",
        n_bins: int = 32,
        d_embedding: int = 8,
        categorical: Sequence[str | int] | None = None,
        missing: str = "impute",
        lr: float = 2e-3,
        weight_decay: float = 3e-4,
        batch_size: int = 256,
        max_epochs: int = 100,
        patience: int = 8,
        val_size: float = 0.2,
        random_state: int | np.random.RandomState | None = None,
        verbose: bool = False,
        trainer_kwargs: dict[str, Any] | None = None,
        regression_head: str = "point",
    ) -> None:
        self.adapter = adapter
        self.k = k
        self.n_blocks = n_blocks
        self.d_block = d_block
        self.rank = rank
        self.sigma_init = sigma_init
        self.dropout = dropout
        self.numeric_embedding = numeric_embedding
        self.n_bins = n_bins
        self.d_embedding = d_embedding
        self.categorical = categorical
        self.missing = missing
        self.lr = lr
        self.weight_decay = weight_decay
        self.batch_size = batch_size
        self.max_epochs = max_epochs
        self.patience = patience
        self.val_size = val_size
        self.random_state = random_state
        self.verbose = verbose
        self.trainer_kwargs = trainer_kwargs
        self.regression_head = regression_head

    def __sklearn_tags__(self) -> Any:  # noqa: ANN401
        tags = super().__sklearn_tags__()
        tags.input_tags.allow_nan = self.missing == "impute"
        tags.input_tags.string = True
        tags.input_tags.categorical = True
        tags.non_deterministic = self.random_state is None
        return tags

    # ---------------------------------------------------------------------- inputs
    def _frame(self, X: Any, *, reset: bool) -> pd.DataFrame:  # noqa: ANN401, N803
        """``X`` as a DataFrame with string column names (arrays checked by scikit-learn)."""
        finite = "allow-nan" if self.missing == "impute" else True
        if isinstance(X, pd.DataFrame):
            validate_data(self, X, reset=reset, skip_check_array=True)
            if X.shape[1] == 0 or X.shape[0] == 0:
                raise ValueError(f"Found array with {X.shape[0]} sample(s) and {X.shape[1]} feature(s);"
                                 " a minimum of 1 is required.")
            frame = X.copy()
            frame.columns = [str(c) for c in frame.columns]
            return frame
        if self.categorical:
            x = validate_data(self, X, reset=reset, dtype=None, ensure_all_finite=False)
        else:
            x = validate_data(self, X, reset=reset, ensure_all_finite=finite)
        return pd.DataFrame(x, columns=[f"x{j}" for j in range(x.shape[1])])

    def _categorical_columns(self, frame: pd.DataFrame) -> list[str]:
        if self.categorical is None:
            return infer_categorical(frame)
        names = []
        for c in self.categorical:
            name = f"x{c}" if isinstance(c, (int, np.integer)) and f"x{c}" in frame.columns else str(c)
            if name not in frame.columns:
                raise ValueError(f"categorical column {c!r} is not in X; its columns are"
                                 f" {list(frame.columns)}.")
            names.append(name)
        return names

    def _encode_y(self, y: Any, *, fit: bool) -> np.ndarray:  # noqa: ANN401
        raise NotImplementedError

    # ------------------------------------------------------------------------- fit
    def fit(self, X: Any, y: Any, X_val: Any = None, y_val: Any = None) -> Any:  # noqa: ANN401, N803
        """Fit the preprocessing on ``X`` and train the ensemble, early-stopped on validation rows.

        Args:
            X: training features (DataFrame or array-like ``(n, d)``).
            y: training targets ``(n,)``.
            X_val: validation features for early stopping (default: ``val_size`` of ``X``).
            y_val: validation targets, with ``X_val``.

        Returns:
            self.

        Raises:
            InvalidParameterError: a constructor parameter of the wrong type or out of range
                (``PARAMETERS``), before the data is read.
        """
        check_parameters(self)
        if (X_val is None) != (y_val is None):
            raise ValueError("Give both X_val and y_val, or neither.")
        for stale in _POST_HOC:  # belong to the weights being replaced: conformalize / calibrate again
            self.__dict__.pop(stale, None)
        frame = self._frame(X, reset=True)
        y_all = self._encode_y(y, fit=True)
        if len(y_all) != len(frame):
            raise ValueError(f"X has {len(frame)} rows but y has {len(y_all)}.")
        if len(frame) < 2:
            raise ValueError(f"n_samples = {len(frame)}: training needs at least 2 rows.")
        rng = check_random_state(self.random_state)
        seed = int(rng.randint(np.iinfo(np.int32).max))
        if X_val is None:
            train_rows, val_rows = self._validation_split(y_all, seed)
            x_train, y_train = frame.iloc[train_rows], y_all[train_rows]
            x_val, y_val_enc = frame.iloc[val_rows], y_all[val_rows]
        else:
            x_train, y_train = frame, y_all
            x_val, y_val_enc = self._frame(X_val, reset=False), self._encode_y(y_val, fit=False)
        categorical = self._categorical_columns(frame)
        numeric = [c for c in frame.columns if c not in categorical]
        self.preprocessor_ = TabularPreprocessor(numeric, categorical, "quantile_normal", self.missing,
                                                 seed=0)
        self.preprocessor_.fit(x_train)  # its errors are ValueErrors naming the column and the fix
        train = self.preprocessor_.transform(x_train, what="training rows")
        val = self.preprocessor_.transform(x_val, what="validation rows")
        if train[0].shape[1] + train[1].shape[1] == 0:
            raise ValueError("Every feature of X is constant on the training rows; nothing to learn from.")
        self.model_ = self._train(self._spec(train[0], y_train), train, y_train, val, y_val_enc, seed)
        return self

    def _validation_split(self, y: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows for training and for early stopping: stratified when every class has 2 rows."""
        rows = np.arange(len(y))
        n_val = int(round(self.val_size * len(y)))
        if not 0 < self.val_size < 1 or n_val < 1 or len(y) - n_val < 2:
            raise ValueError(f"val_size={self.val_size} leaves no validation or training rows out of"
                             f" {len(y)}; give X_val and y_val, or more rows.")
        stratify = None
        if self._task_family == "classification":
            counts = np.bincount(y)
            if counts.min() >= 2 and n_val >= len(counts):
                stratify = y
        train_rows, val_rows = train_test_split(rows, test_size=n_val, random_state=seed, stratify=stratify)
        return np.sort(train_rows), np.sort(val_rows)

    def _spec(self, x_num: np.ndarray, y: np.ndarray) -> TabularSpec:
        pre = self.preprocessor_
        bins = None
        if self.numeric_embedding == "ple" and x_num.shape[1] and len(x_num) > 2:
            edges = compute_bins(x_num, min(int(self.n_bins), len(x_num) - 1),
                                 feature_names=pre.num_feature_names)
            bins = [e.tolist() for e in edges]
        common = {"n_num_features": x_num.shape[1], "cat_cardinalities": pre.cat_cardinalities, "bins": bins,
                  "num_feature_names": pre.num_feature_names, "cat_feature_names": pre.cat_feature_names,
                  "preprocessing": pre.state_dict()}
        if self._task_family == "regression":
            std = float(y.std())
            return TabularSpec(task="regression", target_mean=float(y.mean()),
                               target_std=std if std > 0 else 1.0, **common)
        n_classes = len(self.classes_)
        return TabularSpec(task="binary" if n_classes == 2 else "multiclass", n_classes=n_classes,
                           class_names=[str(c) for c in self.classes_], **common)

    def _module_kwargs(self) -> dict[str, Any]:
        names = ("k", "n_blocks", "d_block", "rank", "dropout", "d_embedding", "lr", "weight_decay")
        kwargs: dict[str, Any] = {name: _plain(getattr(self, name)) for name in names}
        kwargs.update(ADAPTERS[self.adapter])
        if self.sigma_init is not None:
            kwargs["sigma_init"] = _plain(self.sigma_init)
        if self.regression_head != "point":  # the module refuses a distributional head on classes
            kwargs["regression_head"] = self.regression_head
        return kwargs

    def _loader(self, x: tuple[np.ndarray, np.ndarray], y: np.ndarray, *, shuffle: bool,
                generator: torch.Generator | None = None) -> DataLoader:
        target = torch.as_tensor(y, dtype=torch.float32 if self._task_family == "regression" else torch.long)
        data = list(zip(torch.as_tensor(x[0]), torch.as_tensor(x[1]), target, strict=True))
        return DataLoader(data, batch_size=min(int(self.batch_size), len(data)), shuffle=shuffle,
                          collate_fn=_collate, generator=generator)

    def _train(self, spec: TabularSpec, train: tuple[np.ndarray, np.ndarray], y_train: np.ndarray,
               val: tuple[np.ndarray, np.ndarray], y_val: np.ndarray, seed: int) -> TabularEnsembleModule:
        with torch.random.fork_rng(devices=[]), _quiet_fit(self.verbose), \
                tempfile.TemporaryDirectory(prefix="ripieno-estimator-") as folder:
            torch.manual_seed(seed)
            model = TabularEnsembleModule(spec, **self._module_kwargs())
            best = BestWeights(monitor="val/loss", mode="min")  # in memory: nothing of a fit outlives it
            verbose = bool(self.verbose)
            kwargs = {"max_epochs": int(self.max_epochs), "logger": False, "enable_progress_bar": verbose,
                      "enable_model_summary": verbose, "num_sanity_val_steps": 0,
                      "accelerator": "cpu", "deterministic": True, "default_root_dir": folder,
                      **(self.trainer_kwargs or {})}
            own = list(kwargs.pop("callbacks", []))
            if not any(isinstance(callback, ModelCheckpoint) for callback in own):
                kwargs.setdefault("enable_checkpointing", False)  # no default ModelCheckpoint writing files
            stopping = EarlyStopping(monitor="val/loss", mode="min", patience=int(self.patience))
            callbacks = [stopping, best, *own]
            trainer = L.Trainer(callbacks=callbacks, **kwargs)
            # what nothing in an estimator's fit reads (a user's logger or the progress bar keep them)
            model.log_loss_columns = bool(trainer.loggers) or trainer.progress_bar_callback is not None
            model.validation_metrics = model.log_loss_columns
            generator = torch.Generator().manual_seed(seed)
            trainer.fit(model, self._loader(train, y_train, shuffle=True, generator=generator),
                        self._loader(val, y_val, shuffle=False))
            best.restore(model)
            self.n_epochs_ = trainer.current_epoch
            self.best_score_ = best.best_score if best.best_score is not None else float("nan")
        model.trainer = None  # type: ignore[assignment]  # detach: the estimator pickles without it
        return model.cpu().eval()

    # ------------------------------------------------------------------- predict
    def _member_predictions(self, X: Any) -> torch.Tensor:  # noqa: ANN401, N803
        check_is_fitted(self, "model_")
        return self.model_.predict_members(self._frame(X, reset=False), batch_size=8192)


class EnsembleClassifier(ClassifierMixin, _TabularEnsembleEstimator):
    """A tabular ensemble classifier (LoMETab by default) with the scikit-learn API.

    Args:
        adapter: ``lometab``, ``rank1`` (TabM), ``mini`` (TabM-mini), ``additive``,
            ``shared`` (one MLP, K heads) or ``packed`` (deep ensemble).
        k: members.
        n_blocks: hidden layers.
        d_block: hidden width.
        rank: adapter rank (``lometab``, ``additive``).
        sigma_init: adapter init scale (``None``: ``TabularEnsembleModule``'s default).
        dropout: dropout rate.
        numeric_embedding: ``ple`` (piecewise-linear embeddings) or ``none``.
        n_bins: PLE bins per numeric feature.
        d_embedding: PLE embedding size.
        categorical: categorical columns (names, or indices for arrays); ``None``: the
            DataFrame's non-numeric columns (strings, ``category``) and ``bool`` ones.
        missing: ``impute`` (median / most frequent plus indicators) or ``error``.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay of weight matrices.
        batch_size: training batch size.
        max_epochs: training epochs at most.
        patience: early-stopping patience (epochs without a better validation loss).
        val_size: fraction of the training rows held out when no ``X_val`` is given.
        random_state: seed (or ``RandomState``) of the model init, split and shuffling.
        verbose: show Lightning's progress bar and messages.
        trainer_kwargs: extra ``lightning.Trainer`` arguments (e.g. ``accelerator``).
        regression_head: ``EnsembleRegressor`` only: ``point`` (one value per member, squared
            error), ``gaussian`` (mean and variance, Gaussian NLL) or ``quantile`` (5%, 50% and
            95% quantiles, pinball loss); ``TabularEnsembleModule``'s ``regression_head``.

    Attributes:
        classes_: the class labels.
        model_: the trained ``TabularEnsembleModule`` (its checkpoint predicts on its own).
        preprocessor_: the fitted ``TabularPreprocessor``.
        n_epochs_: epochs trained before early stopping.

    Example:
        >>> from sklearn.datasets import load_iris
        >>> X, y = load_iris(return_X_y=True)
        >>> clf = EnsembleClassifier(k=4, d_block=16, max_epochs=30, random_state=0).fit(X, y)
        >>> clf.predict_proba(X[:2]).shape, clf.score(X, y) > 0.85
        ((2, 3), True)
    """

    _task_family = "classification"

    def _encode_y(self, y: Any, *, fit: bool) -> np.ndarray:  # noqa: ANN401
        y = column_or_1d(y, warn=True)
        check_classification_targets(y)
        if fit:
            self.classes_ = np.unique(y)
            if len(self.classes_) < 2:
                raise ValueError("The classifier needs at least 2 classes; y has 1 class"
                                 f" ({self.classes_[0]!r}).")
        codes = np.searchsorted(self.classes_, y)
        codes = np.clip(codes, 0, len(self.classes_) - 1)
        unknown = self.classes_[codes] != y
        if unknown.any():
            raise ValueError(f"y_val has labels not in y: {sorted(set(np.asarray(y)[unknown].tolist()))}.")
        return codes.astype(np.int64)

    def predict_proba(self, X: Any) -> np.ndarray:  # noqa: ANN401, N803
        """Mean member probability ``(n, n_classes)``, columns in ``classes_`` order."""
        return self._member_predictions(X).mean(1).double().numpy()

    def predict(self, X: Any) -> np.ndarray:  # noqa: ANN401, N803
        """The class of highest mean member probability."""
        proba = self.predict_proba(X)  # checks the fit before classes_ is read
        return self.classes_[proba.argmax(1)]

    def conformalize(
        self,
        X: Any,  # noqa: ANN401, N803
        y: Any,  # noqa: ANN401
        *,
        alpha: float = 0.1,
        method: Literal["lac", "aps", "raps"] = "aps",
        mondrian: bool = False,
        k_reg: int | None = None,
        lam: float | None = None,
    ) -> EnsembleClassifier:
        """Calibrate prediction sets (split conformal) on held-out rows ``X``, ``y``.

        The rows must be new to the model: neither fitted nor used for early stopping (carve them
        from the training rows before ``fit``). Then each set of ``predict_set`` holds the true class
        with probability at least ``1 - alpha`` (per class with ``mondrian``). APS and RAPS randomise
        the calibration scores with ``np.random.RandomState(random_state).uniform``, as MAPIE does with
        the same ``random_state``, so the sets equal ``mapie.classification.SplitConformalClassifier``'s.

        Args:
            X: calibration rows.
            y: their labels (labels of ``classes_``).
            alpha: the miscoverage allowed.
            method: ``lac``, ``aps`` or ``raps`` (``ripieno.framework.uq.conformal``).
            mondrian: one threshold per class (class-conditional coverage).
            k_reg: RAPS's rank from which a penalty applies.
            lam: RAPS's penalty per rank.

        Returns:
            self, with ``conformal_`` (a calibrated ``SplitConformal``).
        """
        probs = self.predict_proba(X)
        codes = self._encode_y(y, fit=False)
        u = None
        if method in ("aps", "raps"):
            u = check_random_state(self.random_state).uniform(size=len(codes))
        self.conformal_ = SplitConformal(method, alpha, mondrian=mondrian, k_reg=k_reg, lam=lam).calibrate(
            probs, codes, u=u)
        return self

    def predict_set(self, X: Any) -> np.ndarray:  # noqa: ANN401, N803
        """Boolean sets ``(n, n_classes)``, columns in ``classes_`` order (call ``conformalize`` first)."""
        check_is_fitted(self, "conformal_")
        return self.conformal_.predict_sets(self.predict_proba(X)).numpy()

    def calibrate(
        self,
        X: Any,  # noqa: ANN401, N803
        y: Any,  # noqa: ANN401
        *,
        method: Literal["temperature", "vector", "isotonic"] = "temperature",
        **kwargs: Any,  # noqa: ANN401
    ) -> EnsembleClassifier:
        """Fit a post-hoc probability calibrator on held-out rows; ``predict_calibrated_proba`` applies it.

        ``temperature`` (one ``T`` for every member), ``vector`` (a scale and bias per class on the
        members' log-probabilities) or ``isotonic`` (scikit-learn's, one-vs-rest on the ensemble's
        probabilities, as ``CalibratedClassifierCV``); see ``ripieno.framework.uq.calibrators``. The rows
        must be new to the model. ``predict_proba`` stays the ensemble's own.

        Args:
            X: calibration rows.
            y: their labels (labels of ``classes_``).
            method: the calibrator.
            **kwargs: its settings (e.g. ``l2`` for ``vector``).

        Returns:
            self, with ``calibrator_``.
        """
        check_is_fitted(self, "classes_")
        members = self._member_predictions(X).double()
        codes = self._encode_y(y, fit=False)
        self.calibrator_ = make_calibrator(method, input_kind="probs", **kwargs).fit(members, codes)
        return self

    def predict_calibrated_proba(self, X: Any) -> np.ndarray:  # noqa: ANN401, N803
        """Calibrated class probabilities ``(n, n_classes)`` (call ``calibrate`` first)."""
        check_is_fitted(self, "calibrator_")
        return self.calibrator_.predict_proba(self._member_predictions(X).double()).numpy()


class EnsembleRegressor(RegressorMixin, _TabularEnsembleEstimator):
    """A tabular ensemble regressor (LoMETab by default) with the scikit-learn API.

    Arguments and attributes as ``EnsembleClassifier`` (without ``classes_``); the target is
    standardised with its training mean and std, and ``predict`` returns the mean member
    prediction in ``y``'s units.

    Example:
        >>> from sklearn.datasets import load_diabetes
        >>> X, y = load_diabetes(return_X_y=True)
        >>> reg = EnsembleRegressor(k=4, d_block=16, max_epochs=30, random_state=0).fit(X, y)
        >>> reg.predict(X[:3]).shape, reg.score(X, y) > 0.3
        ((3,), True)
    """

    _task_family = "regression"

    def _encode_y(self, y: Any, *, fit: bool) -> np.ndarray:  # noqa: ANN401
        y = column_or_1d(y, warn=True).astype(np.float64)
        if not np.isfinite(y).all():
            raise ValueError("Input y contains NaN or infinity; drop or fill those rows.")
        return y

    def predict(self, X: Any) -> np.ndarray:  # noqa: ANN401, N803
        """Mean member prediction in ``y``'s units."""
        return self._member_predictions(X).mean(1).double().numpy()

    def predict_members(self, X: Any) -> np.ndarray:  # noqa: ANN401, N803
        """Every member's prediction ``(n, k)`` (their spread is the ensemble's uncertainty)."""
        return self._member_predictions(X).double().numpy()

    def predict_distribution(self, X: Any) -> dict[str, np.ndarray]:  # noqa: ANN401, N803
        """The predictive distribution of a distributional head, in ``y``'s units.

        ``gaussian``: ``mean`` and ``variance`` of the members' mixture (mean of the members'
        variances plus the variance of their means), with ``member_mean`` and ``member_variance``
        ``(n, k)``. ``quantile``: ``quantiles`` ``(n, L)`` (the members' mean, at
        ``quantile_levels``), ``lower`` and ``upper`` (the outer levels), ``member_quantiles``.

        Raises:
            ValueError: ``regression_head="point"`` (no distribution beyond the members' spread).
        """
        check_is_fitted(self, "model_")
        if self.regression_head == "point":
            raise ValueError("predict_distribution needs a distributional head: EnsembleRegressor("
                             "regression_head='gaussian' or 'quantile'); with 'point', predict_members gives"
                             " the members' spread.")
        model = self.model_
        frame = self._frame(X, reset=False)
        x_num, x_cat = model.preprocessor.transform(frame)
        model.eval()
        parts: list[dict[str, torch.Tensor]] = []
        with torch.no_grad():
            for start in range(0, len(frame), 8192):
                batch = {"x_num": torch.as_tensor(x_num[start:start + 8192]),
                         "x_cat": torch.as_tensor(x_cat[start:start + 8192])}
                parts.append(model.predictive_distribution(batch))
        return {key: torch.cat([part[key] for part in parts]).double().numpy() for key in parts[0]}

    def conformalize(
        self,
        X: Any,  # noqa: ANN401, N803
        y: Any,  # noqa: ANN401
        *,
        alpha: float = 0.1,
        method: Literal["normalized", "absolute", "cqr"] | None = None,
    ) -> EnsembleRegressor:
        """Calibrate prediction intervals (split conformal) on held-out rows ``X``, ``y``.

        The rows must be new to the model (neither fitted nor used for early stopping); then each
        interval of ``predict_interval`` holds the true value with probability at least ``1 - alpha``.

        Args:
            X: calibration rows.
            y: their targets.
            alpha: the miscoverage allowed.
            method: ``normalized`` (the default with ``k > 1``): residuals over the members' spread, so
                intervals are wide where the members disagree, from the ensemble itself with no second
                model; ``absolute`` (the default with one member): one width for every row, as MAPIE's
                ``SplitConformalRegressor(conformity_score="absolute")``; ``cqr`` (the default with
                ``regression_head="quantile"``): conformalised quantile regression of the outer
                quantiles. The spread is floored at a
                millionth of its median on the calibration rows, so that a row where the members agree
                exactly still gets an interval.

        Returns:
            self, with ``conformal_`` (a calibrated ``SplitConformal``) and ``spread_floor_``.
        """
        if method is None:
            spread_based = "normalized" if self.k > 1 else "absolute"
            method = "cqr" if self.regression_head == "quantile" else spread_based
        if method == "cqr" and self.regression_head != "quantile":
            raise ValueError("conformalize(method='cqr') corrects quantile predictions: fit with"
                             " regression_head='quantile', or use method='normalized' or 'absolute'.")
        y = self._encode_y(y, fit=False)
        if method == "cqr":
            quantiles = self.predict_distribution(X)
            self.spread_floor_ = 0.0
            bounds = (quantiles["lower"], quantiles["upper"])
            self.conformal_ = SplitConformal("cqr", alpha).calibrate(bounds, y)
            return self
        point, spread = self._point_and_spread(X)
        self.spread_floor_ = 0.0
        outputs: Any = point
        if method == "normalized":
            self.spread_floor_ = 1e-6 * float(np.median(spread)) if np.median(spread) > 0 else 1e-12
            outputs = (point, np.maximum(spread, self.spread_floor_))
        self.conformal_ = SplitConformal(method, alpha).calibrate(outputs, y)
        return self

    def _point_and_spread(self, X: Any) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN401, N803
        """``predict``'s values (computed as it computes them) and the members' spread (std)."""
        members = self._member_predictions(X)
        return members.mean(1).double().numpy(), members.double().std(1, unbiased=False).numpy()

    def predict_interval(self, X: Any) -> np.ndarray:  # noqa: ANN401, N803
        """Intervals ``(n, 2)``: lower and upper bounds in ``y``'s units (call ``conformalize`` first)."""
        check_is_fitted(self, "conformal_")
        if self.conformal_.method == "cqr":
            quantiles = self.predict_distribution(X)
            lower, upper = self.conformal_.predict_intervals((quantiles["lower"], quantiles["upper"]))
            return np.stack([lower.numpy(), upper.numpy()], axis=1)
        point, spread = self._point_and_spread(X)
        outputs: Any = point
        if self.conformal_.method == "normalized":
            outputs = (point, np.maximum(spread, self.spread_floor_))
        lower, upper = self.conformal_.predict_intervals(outputs)
        return np.stack([lower.numpy(), upper.numpy()], axis=1)
