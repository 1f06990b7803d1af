"""TabularPreprocessor: the fitted feature preprocessing of a table, stored with the model.

Fitted once on the training split with scikit-learn's transformers (``SimpleImputer``,
``QuantileTransformer`` or ``StandardScaler``, ``OrdinalEncoder`` with an unknown bucket)
and saved as plain Python inside the model's ``TabularSpec`` (``spec.preprocessing``), so a
checkpoint alone turns new rows into model inputs: ``weights_only=True`` loading works and
nothing is pickled (``ripieno.framework.specs.sklearn_state``).

Rules, all decided on the training split:

* numeric columns are parsed as numbers (a non-numeric value is an error naming the column);
  categorical values become strings (``3`` and ``3.0`` are the same category);
* a column with no value at all is an error; a column with one distinct value is dropped
  with a warning (it carries no information and breaks quantile bins);
* ``missing="error"``: a missing value is an error naming the column and the fix;
  ``missing="impute"``: numeric columns take the training median, categorical ones the most
  frequent training category, and every column with missing training values gets a
  categorical ``<column>__missing`` indicator (``True``/``False``);
* categories unseen in training map to each column's trailing "unknown" code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import numpy as np
import pandas as pd
from lightning.pytorch.utilities import rank_zero_warn
from sklearn.impute import SimpleImputer
from sklearn.preprocessing import OrdinalEncoder, QuantileTransformer, StandardScaler

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.messages import get_logger
from ripieno.framework.specs.sklearn_state import fitted_state, restore_fitted

log = get_logger(__name__)


MissingPolicy = Literal["error", "impute"]
NumericTransform = Literal["quantile_normal", "standard", "none"]
MISSING_POLICIES: tuple[str, ...] = ("error", "impute")
NUMERIC_TRANSFORMS: tuple[str, ...] = ("quantile_normal", "standard", "none")
INDICATOR_SUFFIX = "__missing"
STATE_VERSION = 1


class TabularPreprocessingError(RipienoInputError):
    """Raised for a table the fitted preprocessing cannot read (the message names the fix)."""


def category_strings(column: pd.Series) -> np.ndarray:
    """Values of a categorical column as strings (object array, ``NaN`` where missing).

    Integral numbers print without a decimal point, so a CSV read with ``NaN`` somewhere
    (floats) and one without (ints) give the same categories.

    Example:
        >>> category_strings(pd.Series([3, 3.0, None, "a"])).tolist()
        ['3', '3', nan, 'a']
    """
    def text(value: Any) -> str:  # noqa: ANN401
        if isinstance(value, (float, np.floating)) and float(value).is_integer():
            return str(int(value))
        return str(value)

    out = np.full(len(column), np.nan, dtype=object)
    present = column.notna().to_numpy()
    out[present] = [text(v) for v in column.to_numpy()[present]]
    return out


NUMBER_AS_TEXT = re.compile(r"[\s$€£¥(+-]*\d[\d.,'’ ]*(e[+-]?\d+)?\s*%?\)?\s*", re.IGNORECASE)
"""A number written as text: thousands separators, a currency sign, a percent sign, spaces."""
NUMERIC_SHARE = 0.95
"""A text column whose values are this often numbers written as text is reported, not guessed."""


def infer_categorical(frame: pd.DataFrame, exclude: Iterable[str] = ()) -> list[str]:
    """The columns of ``frame`` to treat as categories: text, booleans and pandas ``category`` columns.

    Numbers are numeric. A text column whose values are nearly all numbers written as text
    (``"12,777.48"``, ``"$5"``, ``"12 %"``), or numbers with a few odd entries (``"?"``), is neither
    guessed numeric nor taken as categories: it is an error naming the column, a value and the fix.
    A column with no value at all is numeric (all missing).

    Args:
        frame: the table.
        exclude: columns left out (the target, dropped and id columns).

    Raises:
        TabularPreprocessingError: a column of numbers written as text.

    Example:
        >>> frame = pd.DataFrame({"x": [1.0, 2.0], "city": ["a", "b"], "flag": [True, False],
        ...                       "y": ["p", "q"]})
        >>> infer_categorical(frame, exclude=["y"])
        ['city', 'flag']
        >>> try:
        ...     infer_categorical(pd.DataFrame({"price": ["12,777.48", "9.5"]}))
        ... except TabularPreprocessingError as error:
        ...     print(str(error)[:70])
        Column 'price' holds numbers written as text, such as '12,777.48'; wri
    """
    excluded = set(exclude)
    found = []
    for name in frame.columns:
        column = frame[name]
        if name in excluded:
            continue
        if pd.api.types.is_bool_dtype(column) or isinstance(column.dtype, pd.CategoricalDtype):
            found.append(name)
            continue
        if pd.api.types.is_numeric_dtype(column):
            continue
        text = column.dropna().astype(str).str.strip()
        if text.empty:
            continue
        written = text.map(lambda value: NUMBER_AS_TEXT.fullmatch(value) is not None)
        if written.mean() >= NUMERIC_SHARE:
            plain = pd.to_numeric(text, errors="coerce")
            example = text[plain.isna()].iloc[0] if plain.isna().any() else text.iloc[0]
            raise TabularPreprocessingError(
                f"Column {name!r} holds numbers written as text, such as {example!r}; write them as plain"
                " numbers (or read the file with thousands=','), mark missing values as empty, or list the"
                " column in categorical to treat its values as categories."
            )
        found.append(name)
    return found


def numeric_values(column: pd.Series) -> np.ndarray:
    """A numeric column as float64 (``NaN`` where missing); booleans become 0/1.

    Raises:
        TabularPreprocessingError: for values that are not numbers, or infinities.
    """
    name = column.name
    if pd.api.types.is_bool_dtype(column):
        column = column.astype(np.float64)
    values = pd.to_numeric(column, errors="coerce")
    bad = values.isna() & column.notna()
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise TabularPreprocessingError(
            f"Numeric column {name!r} has non-numeric values such as {column.iloc[row]!r} (row"
            f" {row}); list it in data.categorical or clean it."
        )
    arr = values.to_numpy(dtype=np.float64, na_value=np.nan)
    n_inf = int(np.isinf(arr).sum())
    if n_inf:
        raise TabularPreprocessingError(
            f"Numeric column {name!r} has {n_inf} infinite value(s); replace them (e.g. by NaN with"
            " missing: impute) or drop those rows."
        )
    return arr


class TabularPreprocessor:
    """Feature preprocessing of one table: fit on training rows, then transform any rows.

    Args:
        numeric: numeric feature columns, in model order.
        categorical: categorical feature columns, in model order.
        numeric_transform: ``quantile_normal`` (TabM's choice: ``QuantileTransformer`` to a
            normal, fitted with 1e-5-std noise to break ties), ``standard`` or ``none``.
        missing: ``error`` (a missing value stops with the column's name) or ``impute``
            (module docstring).
        seed: seed of the tie-breaking noise and of the quantile transformer.

    Example:
        >>> frame = pd.DataFrame({"x": [1.0, 2.0, None, 4.0], "c": ["a", "b", "a", None],
        ...                       "k": [5, 5, 5, 5]})
        >>> pre = TabularPreprocessor(["x", "k"], ["c"], numeric_transform="none", missing="impute")
        >>> x_num, x_cat = pre.fit(frame).transform(frame)
        >>> pre.num_feature_names, pre.cat_feature_names
        (['x'], ['c', 'x__missing', 'c__missing'])
        >>> x_num[:, 0].tolist(), x_cat[:, 0].tolist(), pre.cat_cardinalities
        ([1.0, 2.0, 2.0, 4.0], [0, 1, 0, 0], [3, 3, 3])
    """

    def __init__(
        self,
        numeric: Sequence[str],
        categorical: Sequence[str] = (),
        numeric_transform: NumericTransform = "quantile_normal",
        missing: MissingPolicy = "error",
        seed: int = 0,
    ) -> None:
        if numeric_transform not in NUMERIC_TRANSFORMS:
            raise TabularPreprocessingError(
                f"numeric_transform must be one of {NUMERIC_TRANSFORMS}, got {numeric_transform!r}.")
        if missing not in MISSING_POLICIES:
            raise TabularPreprocessingError(
                f"missing must be one of {MISSING_POLICIES}, got {missing!r}.")
        overlap = sorted(set(numeric) & set(categorical))
        if overlap:
            raise TabularPreprocessingError(f"Column(s) {overlap} are both numeric and categorical.")
        self.numeric, self.categorical = list(numeric), list(categorical)
        self.numeric_transform, self.missing, self.seed = numeric_transform, missing, int(seed)
        self.kept_numeric: list[str] = []
        self.kept_categorical: list[str] = []
        self.dropped_constant: list[str] = []
        self.indicators: list[str] = []
        self.input_dtypes: dict[str, str] = {}
        self.numeric_imputer: SimpleImputer | None = None
        self.numeric_scaler: QuantileTransformer | StandardScaler | None = None
        self.categorical_imputer: SimpleImputer | None = None
        self.encoder: OrdinalEncoder | None = None
        self.fitted = False

    # ------------------------------------------------------------------ what it yields
    @property
    def num_feature_names(self) -> list[str]:
        """Numeric model inputs, in order."""
        return list(self.kept_numeric)

    @property
    def cat_feature_names(self) -> list[str]:
        """Categorical model inputs: the kept categorical columns, then the missing indicators."""
        return self.kept_categorical + [c + INDICATOR_SUFFIX for c in self.indicators]

    @property
    def cat_cardinalities(self) -> list[int]:
        """Codes per categorical input, including the trailing "unknown" code."""
        if self.encoder is None:
            return []
        return [len(c) + 1 for c in self.encoder.categories_]

    @property
    def category_names(self) -> dict[str, list[str]]:
        """Training categories of each categorical input, in code order."""
        if self.encoder is None:
            return {}
        return {name: [str(v) for v in cats]
                for name, cats in zip(self.cat_feature_names, self.encoder.categories_, strict=True)}

    @property
    def required_columns(self) -> list[str]:
        """Columns a table must have to be transformed."""
        keep = set(self.kept_numeric) | set(self.kept_categorical) | set(self.indicators)
        return [c for c in self.numeric + self.categorical if c in keep]

    # ------------------------------------------------------------------------- fit
    def fit(self, frame: pd.DataFrame) -> TabularPreprocessor:
        """Fit every step on ``frame`` (the training rows)."""
        columns = self.numeric + self.categorical
        absent = [c for c in columns if c not in frame.columns]
        if absent:
            raise TabularPreprocessingError(
                f"Column(s) {absent} not found; the columns are {list(frame.columns)}.")
        if len(frame) == 0:
            raise TabularPreprocessingError("Cannot fit the preprocessing on zero rows.")
        self.input_dtypes = {c: str(frame[c].dtype) for c in columns}
        numeric = {c: numeric_values(frame[c]) for c in self.numeric}
        categorical = {c: category_strings(frame[c]) for c in self.categorical}
        n_missing = {c: int(pd.isna(v).sum()) for c, v in {**numeric, **categorical}.items()}
        empty = [c for c in columns if n_missing[c] == len(frame)]
        if empty:
            raise TabularPreprocessingError(
                f"Column(s) {empty} have no values in the training rows; drop them (data.drop).")
        with_missing = {c: n for c, n in n_missing.items() if n}
        if with_missing and self.missing == "error":
            raise TabularPreprocessingError(
                f"Missing values in the training rows: {with_missing} (column: count); set"
                " data.missing: impute (median / most frequent plus a missing indicator), or fill"
                " or drop them first."
            )
        self.indicators = [c for c in columns if c in with_missing]
        n_distinct = {c: len(pd.unique(v[~pd.isna(v)])) for c, v in {**numeric, **categorical}.items()}
        self.dropped_constant = [c for c in columns if n_distinct[c] <= 1]
        if self.dropped_constant:
            rank_zero_warn(
                f"Dropping constant column(s) {self.dropped_constant}: one value in every training"
                " row carries no information."
            )
        self.kept_numeric = [c for c in self.numeric if c not in self.dropped_constant]
        self.kept_categorical = [c for c in self.categorical if c not in self.dropped_constant]

        x_num = self._numeric_block(numeric, frame)
        if self.kept_numeric:
            if self.missing == "impute":
                self.numeric_imputer = SimpleImputer(strategy="median").fit(x_num)
                x_num = self.numeric_imputer.transform(x_num)
            self.numeric_scaler = self._fit_scaler(x_num)
        x_cat = self._categorical_block(categorical, frame)
        if x_cat.shape[1] and self.missing == "impute" and self.kept_categorical:
            n_kept = len(self.kept_categorical)
            self.categorical_imputer = SimpleImputer(strategy="most_frequent").fit(x_cat[:, :n_kept])
        x_cat = self._impute_categorical(x_cat)
        if x_cat.shape[1]:
            self.encoder = OrdinalEncoder(handle_unknown="use_encoded_value", unknown_value=-1,
                                          dtype=np.int64).fit(x_cat)
        self.fitted = True
        return self

    def _fit_scaler(self, x: np.ndarray) -> QuantileTransformer | StandardScaler | None:
        if self.numeric_transform == "none":
            return None
        if self.numeric_transform == "standard":
            return StandardScaler().fit(x)
        rng = np.random.default_rng(self.seed)
        noisy = x + rng.normal(0.0, 1e-5, x.shape) * x.std(0, keepdims=True)
        n_quantiles = max(min(len(x) // 30, 1000), 10)
        return QuantileTransformer(n_quantiles=n_quantiles, output_distribution="normal",
                                   subsample=10**9, random_state=self.seed).fit(noisy)

    # ------------------------------------------------------------------- transform
    def transform(self, frame: pd.DataFrame, *, what: str = "rows") -> tuple[np.ndarray, np.ndarray]:
        """Model inputs ``(x_num float32 (N, n_num), x_cat int64 (N, n_cat))`` of any rows.

        Columns are found by name (order and extra columns do not matter).

        Args:
            frame: the rows, with at least ``required_columns``.
            what: how messages name these rows (e.g. ``"prediction rows"``).

        Raises:
            TabularPreprocessingError: for missing columns, non-numeric values in a numeric
                column, or missing values under ``missing="error"``.
        """
        if not self.fitted:
            raise TabularPreprocessingError("The preprocessing is not fitted; call fit first.")
        absent = [c for c in self.required_columns if c not in frame.columns]
        if absent:
            raise TabularPreprocessingError(
                f"The {what} lack column(s) {absent} that the model was trained on; the columns"
                f" are {list(frame.columns)}.")
        numeric = {c: numeric_values(frame[c]) for c in self.kept_numeric}
        categorical = {c: category_strings(frame[c]) for c in self.kept_categorical}
        if self.missing == "error":
            counts = {c: int(pd.isna(v).sum()) for c, v in {**numeric, **categorical}.items()}
            counts = {c: n for c, n in counts.items() if n}
            if counts:
                raise TabularPreprocessingError(
                    f"Missing values in the {what}: {counts} (column: count); missing: error allows"
                    " none: fill or drop them, or train with missing: impute.")
        x_num = self._numeric_block(numeric, frame)
        if self.numeric_imputer is not None:
            x_num = self.numeric_imputer.transform(x_num)
        if self.numeric_scaler is not None:
            x_num = self.numeric_scaler.transform(x_num)
        x_cat = self._impute_categorical(self._categorical_block(categorical, frame))
        codes = np.zeros((len(frame), 0), dtype=np.int64)
        if self.encoder is not None:
            codes = self.encoder.transform(x_cat).astype(np.int64)
            unknown = codes < 0
            if unknown.any():
                per_column = {name: int(n) for name, n in
                              zip(self.cat_feature_names, unknown.sum(0), strict=True) if n}
                rank_zero_warn(
                    f"Categories unseen in training in the {what}: {per_column} (column: rows);"
                    " they use each column's 'unknown' code.")
                sizes = np.array(self.cat_cardinalities) - 1
                codes = np.where(unknown, sizes[None, :], codes)
        return x_num.astype(np.float32), codes

    def _numeric_block(self, numeric: dict[str, np.ndarray], frame: pd.DataFrame) -> np.ndarray:
        if not self.kept_numeric:
            return np.zeros((len(frame), 0), dtype=np.float64)
        return np.stack([numeric[c] for c in self.kept_numeric], axis=1)

    def _categorical_block(self, categorical: dict[str, np.ndarray], frame: pd.DataFrame) -> np.ndarray:
        blocks = [categorical[c] for c in self.kept_categorical]
        blocks += [np.where(frame[c].isna().to_numpy(), "True", "False").astype(object)
                   for c in self.indicators]
        if not blocks:
            return np.zeros((len(frame), 0), dtype=object)
        return np.stack(blocks, axis=1)

    def _impute_categorical(self, x_cat: np.ndarray) -> np.ndarray:
        if self.categorical_imputer is None or not self.kept_categorical:
            return x_cat
        n_kept = len(self.kept_categorical)
        x_cat = x_cat.copy()
        x_cat[:, :n_kept] = self.categorical_imputer.transform(x_cat[:, :n_kept])
        return x_cat

    # ------------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Everything ``from_state`` needs, as plain Python (lists, numbers, strings)."""
        if not self.fitted:
            raise TabularPreprocessingError("The preprocessing is not fitted; call fit first.")

        def state(transformer: Any) -> dict[str, Any] | None:  # noqa: ANN401
            return None if transformer is None else fitted_state(transformer)

        return {
            "version": STATE_VERSION, "numeric": self.numeric, "categorical": self.categorical,
            "numeric_transform": self.numeric_transform, "missing": self.missing, "seed": self.seed,
            "kept_numeric": self.kept_numeric, "kept_categorical": self.kept_categorical,
            "dropped_constant": self.dropped_constant, "indicators": self.indicators,
            "input_dtypes": self.input_dtypes,
            "numeric_imputer": state(self.numeric_imputer), "numeric_scaler": state(self.numeric_scaler),
            "categorical_imputer": state(self.categorical_imputer), "encoder": state(self.encoder),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> TabularPreprocessor:
        """The fitted preprocessor ``state_dict`` described."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            found = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise TabularPreprocessingError(
                f"Saved preprocessing of version {found!r} cannot be read (expected {STATE_VERSION});"
                " retrain with this ripieno version.")
        pre = cls(state["numeric"], state["categorical"], state["numeric_transform"], state["missing"],
                  state["seed"])
        pre.kept_numeric, pre.kept_categorical = list(state["kept_numeric"]), list(state["kept_categorical"])
        pre.dropped_constant, pre.indicators = list(state["dropped_constant"]), list(state["indicators"])
        pre.input_dtypes = dict(state["input_dtypes"])
        for name in ("numeric_imputer", "numeric_scaler", "categorical_imputer", "encoder"):
            if state[name] is not None:
                setattr(pre, name, restore_fitted(state[name]))
        pre.fitted = True
        return pre

    def note_extra_columns(self, frame: pd.DataFrame, expected: Sequence[str] = (), what: str = "rows"
                           ) -> list[str]:
        """Log (once, rank 0) the columns of ``frame`` the model does not read; returns them."""
        known = set(self.numeric) | set(self.categorical) | set(expected)
        extra = [c for c in frame.columns if c not in known]
        if extra:
            log.info(f"ripieno: the {what} have column(s) the model does not use, ignored: {extra}")
        return extra
