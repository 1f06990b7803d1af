"""TabularDataModule: shipped or user tables, validated, split and preprocessed.

Everything that can be wrong with the input is checked when the data is prepared,
which the ripieno CLI triggers at instantiation (it links ``data.spec`` into the
model), so errors come before any training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
import torch
from lightning.pytorch.utilities import rank_zero_warn
from sklearn.preprocessing import QuantileTransformer, StandardScaler
from torch import Tensor

# EpochSeededRandomSampler and collate_batch landed here first: re-exported for existing imports.
from ripieno.datamodules.base import (  # noqa: F401
    BatchDataset,
    DataModuleError,
    EpochSeededRandomSampler,
    SplitDataModule,
    collate_batch,
)
from ripieno.datamodules.splits import check_split_args, split_rows
from ripieno.datamodules.tabular_sources import SOURCES
from ripieno.framework.nn.embeddings import compute_bins
from ripieno.framework.tabular_spec import TabularSpec


class TabularDataError(DataModuleError):
    """Raised for input data that a tabular model cannot train on."""


class TabularTensorDataset(BatchDataset):
    """Rows as dicts ``{"x_num", "x_cat", "y"}``, fetched a whole batch at a time."""

    def __init__(self, x_num: Tensor, x_cat: Tensor, y: Tensor) -> None:
        self.x_num, self.x_cat, self.y = x_num, x_cat, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        idx = torch.as_tensor(indices)
        return {"x_num": self.x_num[idx], "x_cat": self.x_cat[idx], "y": self.y[idx]}


class TabularDataModule(SplitDataModule):
    """Train/val/test splits of one table for tabular ensembles.

    Sources: a shipped data set by name (``ripieno.datamodules.tabular_sources.SOURCES``:
    diamonds, mlc_churn, boston, concrete, caravan, default, breast_cancer, wine, iris,
    digits, diabetes) or a user CSV/Parquet file with ``target`` and ``categorical``.

    Preprocessing, fit on the training split only: numeric columns by a quantile
    transform to a normal (TabM's choice; fit with 1e-5-std noise to break ties),
    standard scaling or nothing; bins for piecewise-linear embeddings on the transformed
    training features; categorical columns coded by their training categories, with one
    extra "unknown" code per column for categories first seen in val/test (counted in a
    warning, never dropped); regression targets optionally log-transformed (the module
    standardises them with the spec's mean and std).

    Args:
        dataset: name of a shipped data set (ignored when ``path`` is given).
        path: a ``.csv`` or ``.parquet`` file of the user's own table.
        target: target column (defaults to the shipped data set's).
        categorical: categorical columns (defaults to the shipped data set's).
        drop: columns to ignore (e.g. row ids).
        task: ``auto`` (text/bool target -> classification, numeric -> regression),
            ``regression``, ``binary`` or ``multiclass``.
        target_transform: ``none`` or ``log`` for regression; ``None`` takes the
            shipped data set's default.
        numeric_transform: ``quantile_normal``, ``standard`` or ``none``.
        numeric_embedding: ``ple`` (compute bins for piecewise-linear embeddings) or ``none``.
        bins: ``quantile`` or ``tree`` bins.
        n_bins: maximum bins per feature.
        val_size: fraction of rows for validation.
        test_size: fraction of rows for test.
        split_seed: seed of the split and of the preprocessing noise.
        max_rows: optional cap on rows (a seeded random subset) for quick runs.
        batch_size: training batch size.
        eval_batch_size: batch size for val/test/predict.
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        dataset: str | None = "diamonds",
        path: str | None = None,
        target: str | None = None,
        categorical: list[str] | None = None,
        drop: list[str] | None = None,
        task: Literal["auto", "regression", "binary", "multiclass"] = "auto",
        target_transform: Literal["none", "log"] | None = None,
        numeric_transform: Literal["quantile_normal", "standard", "none"] = "quantile_normal",
        numeric_embedding: Literal["ple", "none"] = "ple",
        bins: Literal["quantile", "tree"] = "quantile",
        n_bins: int = 48,
        val_size: float = 0.2,
        test_size: float = 0.2,
        split_seed: int = 0,
        max_rows: int | None = None,
        batch_size: int = 256,
        eval_batch_size: int = 2048,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()

    @property
    def spec(self) -> TabularSpec:
        """The data's spec; prepares (loads, validates, splits, preprocesses) on first use."""
        return super().spec

    def _load_frame(self) -> tuple[pd.DataFrame, str, list[str], list[str], str, str]:
        hp = self.hparams
        if hp.path is not None:
            path = Path(hp.path).expanduser()
            if not path.is_file():
                raise TabularDataError(f"Data file {str(path)!r} does not exist; check data.path.")
            if path.suffix.lower() == ".csv":
                frame = pd.read_csv(path)
            elif path.suffix.lower() in (".parquet", ".pq"):
                frame = pd.read_parquet(path)
            else:
                raise TabularDataError(
                    f"Unsupported file type {path.suffix!r} for {str(path)!r}; use .csv or .parquet."
                )
            if hp.target is None:
                raise TabularDataError("data.target is required with data.path: name the target column.")
            return (frame, hp.target, list(hp.categorical or []), list(hp.drop or []),
                    hp.task, hp.target_transform or "none")
        if hp.dataset not in SOURCES:
            raise TabularDataError(
                f"Unknown shipped data set {hp.dataset!r}; choose one of {sorted(SOURCES)} or"
                " give data.path to a CSV/Parquet file."
            )
        source = SOURCES[hp.dataset]
        task = source.task if hp.task == "auto" else hp.task
        categorical = source.categorical if hp.categorical is None else list(hp.categorical)
        drop = source.drop if hp.drop is None else list(hp.drop)
        return (source.load(), hp.target or source.target, categorical, drop, task,
                hp.target_transform or source.target_transform)

    def _check_args(self) -> None:
        hp = self.hparams
        check_split_args(hp, TabularDataError, cap="max_rows", min_rows=3)
        if hp.val_size + hp.test_size >= 1.0:
            raise TabularDataError(f"val_size + test_size = {hp.val_size + hp.test_size} leaves no training"
                                   " rows.")

    def _prepare(self) -> None:
        hp = self.hparams
        self._check_args()
        frame, target, categorical, drop, task, target_transform = self._load_frame()
        _check_columns(frame, target, categorical, drop)
        if hp.max_rows is not None and hp.max_rows < len(frame):
            frame = frame.sample(n=hp.max_rows, random_state=hp.split_seed)
        frame = frame.reset_index(drop=True)
        numeric = [c for c in frame.columns if c not in {target, *categorical, *drop}]
        x_num = _numeric_matrix(frame, numeric)
        x_cat_raw = _categorical_frame(frame, categorical)
        y_raw = frame[target]
        task = _resolve_task(task, y_raw)
        y, class_names = _encode_target(y_raw, target, task, target_transform)

        stratify = y if task != "regression" else None
        train_idx, val_idx, test_idx = _split_indices(len(frame), stratify, hp.val_size, hp.test_size,
                                                      hp.split_seed)
        if task != "regression":
            _check_labels_seen(y, train_idx, {"val": val_idx, "test": test_idx}, class_names)

        x_num = _fit_numeric_transform(x_num, train_idx, hp.numeric_transform, hp.split_seed)
        bins = None
        if hp.numeric_embedding == "ple" and numeric:
            n_bins = min(hp.n_bins, len(train_idx) - 1)
            try:
                edges = compute_bins(x_num[train_idx], n_bins, hp.bins, y=y[train_idx],
                                     regression=task == "regression", feature_names=numeric)
            except ValueError as err:
                raise TabularDataError(str(err)) from err
            bins = [e.tolist() for e in edges]
        elif hp.numeric_embedding not in ("ple", "none"):
            raise TabularDataError(
                f"numeric_embedding must be 'ple' or 'none', got {hp.numeric_embedding!r}."
            )
        codes, cardinalities = _encode_categories(x_cat_raw, train_idx)

        mean = float(y[train_idx].mean()) if task == "regression" else 0.0
        std = float(y[train_idx].std()) if task == "regression" else 1.0
        if task == "regression" and not std > 0:
            raise TabularDataError(f"Target {target!r} is constant on the training split.")
        self._spec = TabularSpec(
            task=task, n_num_features=len(numeric), cat_cardinalities=cardinalities,
            n_classes=len(class_names) if task != "regression" else None, bins=bins,
            target_mean=mean, target_std=std, target_transform=target_transform,
            num_feature_names=numeric, cat_feature_names=list(categorical),
            class_names=class_names,
        )
        y_tensor = torch.tensor(y, dtype=torch.float32 if task == "regression" else torch.long)
        x_num_t = torch.as_tensor(x_num, dtype=torch.float32)
        x_cat_t = torch.as_tensor(codes, dtype=torch.long)
        for name, rows in (("train", train_idx), ("val", val_idx), ("test", test_idx)):
            rows_t = torch.as_tensor(rows)
            self._splits[name] = TabularTensorDataset(x_num_t[rows_t], x_cat_t[rows_t], y_tensor[rows_t])


# ------------------------------------------------------------------------- validation
def _check_columns(frame: pd.DataFrame, target: str, categorical: list[str], drop: list[str]) -> None:
    columns = list(frame.columns)
    if target not in columns:
        raise TabularDataError(f"Target column {target!r} not found; the columns are {columns}.")
    for kind, names in (("categorical", categorical), ("drop", drop)):
        missing = [c for c in names if c not in columns]
        if missing:
            raise TabularDataError(f"{kind} column(s) {missing} not found; the columns are {columns}.")
    if target in categorical or target in drop:
        raise TabularDataError(f"Target {target!r} is also listed in categorical/drop; remove it there.")
    if len(frame) == 0:
        raise TabularDataError("The table has no rows.")


def _numeric_matrix(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    out = np.empty((len(frame), len(columns)), dtype=np.float64)
    for j, name in enumerate(columns):
        col = frame[name]
        if col.dtype == bool:
            col = col.astype(np.float64)
        values = pd.to_numeric(col, errors="coerce")
        bad = values.isna() & col.notna()
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise TabularDataError(
                f"Numeric column {name!r} has non-numeric values such as {col.iloc[row]!r} (row"
                f" {row}); list it in data.categorical or clean it."
            )
        arr = values.to_numpy(dtype=np.float64)
        n_bad = int((~np.isfinite(arr)).sum())
        if n_bad:
            raise TabularDataError(
                f"Numeric column {name!r} has {n_bad} NaN/inf value(s); impute or drop those rows"
                " before training."
            )
        out[:, j] = arr
    return out


def _categorical_frame(frame: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    for name in columns:
        n_missing = int(frame[name].isna().sum())
        if n_missing:
            raise TabularDataError(
                f"Categorical column {name!r} has {n_missing} missing value(s); fill them with an"
                " explicit category (e.g. 'missing') before training."
            )
    return frame[columns].astype(str)


def _resolve_task(task: str, y: pd.Series) -> str:
    if task == "auto":
        numeric = pd.api.types.is_numeric_dtype(y) and not pd.api.types.is_bool_dtype(y)
        if numeric:
            return "regression"
        return "binary" if y.nunique() == 2 else "multiclass"
    if task not in ("regression", "binary", "multiclass"):
        raise TabularDataError(f"task must be auto, regression, binary or multiclass, got {task!r}.")
    return task


def _encode_target(y: pd.Series, name: str, task: str, transform: str) -> tuple[np.ndarray, list[str]]:
    n_missing = int(y.isna().sum())
    if n_missing:
        raise TabularDataError(f"Target {name!r} has {n_missing} missing value(s); drop those rows.")
    if task == "regression":
        values = pd.to_numeric(y, errors="coerce")
        if values.isna().any():
            example = y[values.isna()].iloc[0]
            raise TabularDataError(
                f"Regression target {name!r} has non-numeric values such as {example!r}; set"
                " data.task to binary/multiclass for labels."
            )
        arr = values.to_numpy(dtype=np.float64)
        if not np.isfinite(arr).all():
            raise TabularDataError(f"Regression target {name!r} has inf values; drop those rows.")
        if transform == "log":
            if (arr <= 0).any():
                raise TabularDataError(
                    f"target_transform=log needs a positive target, but {name!r} has values <= 0;"
                    " use target_transform: none."
                )
            arr = np.log(arr)
        elif transform != "none":
            raise TabularDataError(f"target_transform must be none or log, got {transform!r}.")
        return arr, []
    if transform not in ("none", None):
        raise TabularDataError(f"target_transform={transform!r} applies to regression only.")
    labels = y.astype(str)
    class_names = sorted(labels.unique())
    if task == "binary" and len(class_names) != 2:
        raise TabularDataError(
            f"task=binary needs exactly 2 labels in {name!r}, found {len(class_names)}:"
            f" {class_names[:10]}; use task: multiclass."
        )
    if len(class_names) < 2:
        raise TabularDataError(f"Target {name!r} has a single label {class_names}; nothing to learn.")
    codes = pd.Categorical(labels, categories=class_names).codes.astype(np.int64)
    return codes, class_names


def _split_indices(
    n: int, stratify: np.ndarray | None, val_size: float, test_size: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted train/val/test rows: ``test_size`` and ``val_size`` of all ``n`` rows, stratified by label."""
    sizes = {"test": round(n * test_size), "val": round(n * val_size)}
    sizes["train"] = n - sizes["test"] - sizes["val"]
    empty = [k for k, v in sizes.items() if v < 1]
    if empty:
        raise TabularDataError(
            f"Split(s) {empty} would be empty with {n} rows (val_size={val_size},"
            f" test_size={test_size}); use more rows or larger fractions."
        )
    if stratify is not None:
        counts = np.bincount(stratify)
        rare = [int(c) for c in np.flatnonzero((counts > 0) & (counts < 3))]
        if rare:
            raise TabularDataError(
                f"Class code(s) {rare} have fewer than 3 rows, too few to appear in train, val and"
                " test; merge or drop those classes."
            )
    # Validation rows are drawn from ``rest`` in its shuffled order, as always, so seeds keep their rows.
    rest, test = split_rows(np.arange(n), stratify, sizes["test"], seed, arg="test_size", cap="max_rows",
                            error=TabularDataError, sort=False)
    train, val = split_rows(rest, stratify, sizes["val"], seed, arg="val_size", cap="max_rows",
                            error=TabularDataError)
    return train, val, np.sort(test)


def _check_labels_seen(y: np.ndarray, train: np.ndarray, others: dict[str, np.ndarray],
                       class_names: list[str]) -> None:
    seen = set(np.unique(y[train]).tolist())
    for split, rows in others.items():
        unseen = sorted(set(np.unique(y[rows]).tolist()) - seen)
        if unseen:
            names = [class_names[i] for i in unseen]
            raise TabularDataError(
                f"Label(s) {names} occur in the {split} split but not in training, so the model"
                " cannot predict them; drop those rows or change split_seed."
            )


def _fit_numeric_transform(x: np.ndarray, train: np.ndarray, kind: str, seed: int) -> np.ndarray:
    if x.shape[1] == 0 or kind == "none":
        return x
    if kind == "standard":
        return StandardScaler().fit(x[train]).transform(x)
    if kind != "quantile_normal":
        raise TabularDataError(f"numeric_transform must be quantile_normal, standard or none, got {kind!r}.")
    rng = np.random.default_rng(seed)
    fit_x = x[train] + rng.normal(0.0, 1e-5, x[train].shape) * x[train].std(0, keepdims=True)
    n_quantiles = max(min(len(train) // 30, 1000), 10)
    qt = QuantileTransformer(n_quantiles=n_quantiles, output_distribution="normal",
                             subsample=10**9, random_state=seed).fit(fit_x)
    return qt.transform(x)


def _encode_categories(frame: pd.DataFrame, train: np.ndarray) -> tuple[np.ndarray, list[int]]:
    codes = np.zeros((len(frame), frame.shape[1]), dtype=np.int64)
    cardinalities = []
    for j, name in enumerate(frame.columns):
        categories = sorted(frame[name].iloc[train].unique())
        lookup = {category: code for code, category in enumerate(categories)}
        mapped = frame[name].map(lookup)
        unknown = mapped.isna().to_numpy()
        col = mapped.fillna(-1).to_numpy(dtype=np.int64, copy=True)
        if unknown.any():
            rank_zero_warn(
                f"Categorical column {name!r}: {int(unknown.sum())} val/test row(s) have categories"
                " unseen in training; they use the column's 'unknown' code."
            )
        col[unknown] = len(categories)
        codes[:, j] = col
        cardinalities.append(len(categories) + 1)
    return codes, cardinalities
