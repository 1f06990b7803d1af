"""TabularDataModule: shipped or user tables, validated, split and preprocessed.

Everything that can be wrong with the input is checked when the data is prepared,
which the ripieno CLI triggers at instantiation (it links ``data.spec`` into the
model), so errors come before any training.
"""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from torch.utils.data import DataLoader
from typing_extensions import override

from ripieno.datamodules.base import (  # noqa: F401
    BatchDataset,
    DataModuleError,
    EpochSeededRandomSampler,
    SplitDataModule,
    collate_batch,
)
from ripieno.datamodules.data_settings import MOVED_ARGUMENTS, LoaderSettings, SplitSettings
from ripieno.datamodules.hf_datasets import is_saved_dataset, load_hf_splits, resolve_splits
from ripieno.datamodules.splits import check_split_args, split_rows
from ripieno.datamodules.table_header import check_unique_columns, header_names
from ripieno.datamodules.tabular_sources import SOURCES
from ripieno.framework.checkpoint_file import read_checkpoint
from ripieno.framework.errors import file_problem, first_line

# EpochSeededRandomSampler and collate_batch landed here first: re-exported for existing imports.
from ripieno.framework.messages import get_logger
from ripieno.framework.nn.embeddings import compute_bins
from ripieno.framework.specs.base import FITTED_STATE_KEY
from ripieno.framework.specs.table_splits import TableSplits
from ripieno.framework.specs.tabular import LabelType, TabularSpec
from ripieno.framework.specs.tabular_preprocessing import (
    TabularPreprocessingError,
    TabularPreprocessor,
    category_strings,
    infer_categorical,
)

log = get_logger(__name__)

MAX_INFERRED_CLASSES = 20
"""Most distinct values an integer or boolean target may have for ``task: auto`` to call it
classification. Class labels coded as integers rarely number more than a few dozen, while
counts, years or whole-unit amounts (regression targets) usually take more than 20 values;
``data.init_args.task`` overrides the guess either way."""
TABLE_FORMATS = {".csv": "csv", ".tsv": "tsv", ".parquet": "parquet", ".pq": "parquet"}
"""File suffixes ``read_table`` reads, and their formats."""
COMPRESSIONS = (".gz", ".bz2", ".zip", ".xz", ".zst")
"""Compression suffixes a CSV/TSV file may carry after its own (pandas decompresses them)."""
ENCODING_ARG = "data.init_args.encoding"


class TabularDataError(DataModuleError):
    """Raised for input data that a tabular model cannot train on or predict."""


class TabularTensorDataset(BatchDataset):
    """Rows as dicts ``{"x_num", "x_cat", "y"}`` (no ``y`` for unlabelled prediction rows)."""

    def __init__(self, x_num: Tensor, x_cat: Tensor, y: Tensor | None = None) -> None:
        self.x_num, self.x_cat, self.y = x_num, x_cat, y

    def __len__(self) -> int:
        return len(self.x_num)

    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        idx = torch.as_tensor(indices)
        batch = {"x_num": self.x_num[idx], "x_cat": self.x_cat[idx]}
        if self.y is not None:
            batch["y"] = self.y[idx]
        return batch


DEFAULT_SPLIT = SplitSettings(val_size=0.2, test_size=0.2)
DEFAULT_LOADER = LoaderSettings(batch_size=256, eval_batch_size=2048)


class TabularDataModule(SplitDataModule):
    """Train/val/test splits of one table for tabular ensembles, and new rows to predict.

    Sources: a shipped data set by name (``ripieno.datamodules.tabular_sources.SOURCES``:
    diamonds, mlc_churn, boston, concrete, caravan, default, breast_cancer, wine, iris,
    digits, diabetes, hpc_data, penguins, and the 28 tables of the benchmark suite,
    ``BENCHMARK_SUITE``, with the ones kept back, ``HELD_OUT``: docs/benchmark_suite.md) or a
    user CSV/Parquet file with ``target`` and ``categorical``.

    Feature preprocessing (``TabularPreprocessor``: scikit-learn's ``SimpleImputer``,
    ``QuantileTransformer``/``StandardScaler`` and ``OrdinalEncoder``, fitted on the training
    split only) is stored in the spec, and with it in every checkpoint (the module saves it as
    fitted state, outside its hyperparameters), so a checkpoint alone predicts new rows: numeric
    columns by a quantile transform to a normal (TabM's choice), standard scaling or nothing;
    missing values an error or imputed with indicators (``missing``); constant columns dropped
    with a warning; categories coded by their training categories with one "unknown" code per
    column for categories first seen later (counted in a warning, never dropped); bins for
    piecewise-linear embeddings on the transformed training features; regression targets
    optionally log-transformed (the module standardises them with the spec's mean and std).

    Prediction: ``predict_path`` names a CSV/TSV/Parquet file of new rows (the target column
    optional, extra columns ignored with a note, missing ones an error naming them); its rows
    are predicted in file order and written with ``id_column`` (or the row number) by
    ``MemberPredictionWriter``. Without ``predict_path``, ``predict`` serves the test split
    (ids: the rows' numbers in the source table). ``preprocessing_from`` takes the spec and
    preprocessing from a checkpoint instead of fitting them, so nothing reads the training
    table; ``ripieno predict --ckpt_path ... --data.init_args.predict_path ...`` sets it.

    Task inference (``task: auto``, for a user's table; a shipped data set knows its task): a
    text target is classification; an integer or boolean target with at most
    ``MAX_INFERRED_CLASSES`` (20) distinct values is classification, one with more is
    regression; a float target is regression. Classification is binary for two distinct
    labels, multiclass otherwise. One info line says what was inferred and why; set
    ``data.init_args.task`` to override it (e.g. ``regression`` for a count with few values,
    ``multiclass`` for 0.0/1.0/2.0 stored as floats). Class names are strings in code order:
    numeric labels ordered by value (``2`` before ``10``), text labels sorted; predictions
    give labels in the target's own type (``0``/``1`` for an integer target).

    Args:
        dataset: name of a shipped data set (ignored when ``path`` is given).
        path: a ``.csv``, ``.tsv`` or ``.parquet`` file of the user's own table (a file that
            cannot be read is a one-line error naming it and the fix), or a folder written by
            ``datasets``' ``save_to_disk`` (its official splits are kept, see ``split.policy``).
        data_files: local files read with ``datasets.load_dataset(builder, data_files=...)``: a
            path, a list, or ``{split: paths}``.
        builder: ``csv``, ``json`` or ``parquet`` for ``data_files``.
        encoding: text encoding of CSV/TSV files (``path`` and ``predict_path``), e.g.
            ``latin-1`` or ``cp1252`` for files that are not UTF-8; Parquet ignores it.
        split: how the rows are split (``SplitSettings``: ``policy``, ``official`` or ``resplit``
            for a ``datasets`` source; ``val_size``; ``test_size``; ``seed``, which also seeds the
            training order); default ``SplitSettings(val_size=0.2, test_size=0.2)``.
        loader: how the splits are served (``LoaderSettings``: ``batch_size``, ``eval_batch_size``
            of validation, test and predict, ``num_workers``); default ``LoaderSettings(batch_size=256,
            eval_batch_size=2048)``.
        target: target column (defaults to the shipped data set's).
        categorical: categorical columns (defaults to the shipped data set's). For your own file,
            ``None`` takes its text, boolean and ``category`` columns (one line says which; a
            column of numbers written as text, ``"12,777.48"``, is an error, not a guess) and
            ``[]`` none.
        drop: columns to ignore (e.g. row ids).
        task: ``auto``, ``regression``, ``binary`` or ``multiclass``.
        target_transform: ``none`` or ``log`` for regression; ``None`` takes the
            shipped data set's default.
        numeric_transform: ``quantile_normal``, ``standard`` or ``none``.
        numeric_embedding: ``ple`` (compute bins for piecewise-linear embeddings) or ``none``.
        bins: ``quantile`` or ``tree`` bins.
        n_bins: maximum bins per feature.
        missing: ``error`` (a missing feature value stops with the column's name) or
            ``impute`` (training median / most frequent category plus a ``<col>__missing``
            indicator for every column with missing training values).
        id_column: a column that identifies rows: not a feature, kept in prediction outputs.
        predict_path: a ``.csv``, ``.tsv`` or ``.parquet`` file of rows to predict.
        preprocessing_from: a checkpoint whose spec and fitted preprocessing to use (predict
            only; the training table is not read).
        max_rows: optional cap on rows (a seeded random subset) for quick runs.
        calibration_size: fraction of all rows held out of training for post-hoc calibration
            (``ConformalPrediction``'s default rows), carved from the training rows after the
            validation and test splits, stratified by label, with ``split.seed``; ``0`` (the
            default) holds none. The validation rows, which early stopping has seen, are never
            taken for it. ``calibration_dataloader()`` serves them.
        **moved: the flat arguments of earlier releases (``batch_size=``, ``split_seed=``, ...): each
            still works, with a ``RipienoDeprecationWarning`` naming its place in ``split`` or
            ``loader``.
    """

    #: This DataModule's defaults of the shared groups (``data_settings``).
    DEFAULT_SPLIT: ClassVar[SplitSettings] = DEFAULT_SPLIT
    DEFAULT_LOADER: ClassVar[LoaderSettings] = DEFAULT_LOADER
    #: The flat arguments of earlier releases and their place in ``split`` or ``loader``.
    MOVED_ARGUMENTS: ClassVar[dict[str, str]] = MOVED_ARGUMENTS

    def __init__(
        self,
        dataset: str | None = "diamonds",
        path: str | None = None,
        data_files: str | list[str] | dict[str, Any] | None = None,
        builder: Literal["csv", "json", "parquet"] | None = None,
        encoding: str = "utf-8",
        target: str | None = None,
        categorical: list[str] | None = None,
        drop: list[str] | None = None,
        task: Literal["auto", "regression", "binary", "multiclass"] = "auto",
        target_transform: Literal["none", "log"] | None = None,
        numeric_transform: Literal["quantile_normal", "standard", "none"] = "quantile_normal",
        numeric_embedding: Literal["ple", "none"] = "ple",
        bins: Literal["quantile", "tree"] = "quantile",
        n_bins: int = 48,
        missing: Literal["error", "impute"] = "error",
        id_column: str | None = None,
        predict_path: str | None = None,
        preprocessing_from: str | None = None,
        max_rows: int | None = None,
        calibration_size: float = 0.0,
        split: SplitSettings = DEFAULT_SPLIT,
        loader: LoaderSettings = DEFAULT_LOADER,
        **moved: Any,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self._take_settings(split, loader, moved)
        self._prediction_ids: tuple[str, list[Any]] | None = None
        self._official: np.ndarray | None = None
        self._table_splits: TableSplits | None = None
        self._keep_table = False  # set by table_splits(): keep the raw rows while preparing

    @property
    def spec(self) -> TabularSpec:
        """The data's spec; prepares (loads, validates, splits, preprocesses) on first use."""
        return super().spec

    def _load_hf_frame(self) -> pd.DataFrame:
        """A ``datasets`` source as one frame; ``self._official`` gets each row's split (or ``None``)."""
        hp = self.hparams
        parts = load_hf_splits(hp.path or "", hp.data_files, hp.builder, error=TabularDataError)
        policy = self.split_settings.policy
        mapped, carve = resolve_splits(parts, policy, "TabularDataModule", TabularDataError)
        order = [name for name in ("train", "val", "test") if name in mapped]
        frames = []
        for name in order:
            frame = mapped[name].to_pandas()
            for column, feature in mapped[name].features.items():  # ClassLabel codes -> their names
                names = getattr(feature, "names", None)
                if names and column in frame:
                    frame[column] = pd.Categorical.from_codes(frame[column].to_numpy(), categories=names)
                    frame[column] = frame[column].astype(str)
            frames.append(frame)
        frame = pd.concat(frames, ignore_index=True)
        official = None if carve == ["val", "test"] and len(mapped) == 1 else np.concatenate(
            [np.full(len(f), name) for name, f in zip(order, frames, strict=True)])
        self._official = official
        return frame

    def _is_hf_source(self) -> bool:
        hp = self.hparams
        return hp.data_files is not None or (hp.path is not None and is_saved_dataset(hp.path))

    def _official_indices(self, stratify: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Official splits' rows; the missing ones carved (seeded, stratified) from train."""
        split = self.split_settings
        hp, split_of = self.hparams, self._official
        assert split_of is not None
        pool = np.flatnonzero(split_of == "train")
        if hp.max_rows is not None and hp.max_rows < len(pool):
            pool = np.sort(np.random.default_rng(split.seed).choice(pool, hp.max_rows, replace=False))
        test = np.flatnonzero(split_of == "test")
        if not len(test):
            pool, test = split_rows(pool, stratify, split.test_size, split.seed, arg="test_size",
                                    cap="max_rows", error=TabularDataError)
        val = np.flatnonzero(split_of == "val")
        if not len(val):
            pool, val = split_rows(pool, stratify, split.val_size, split.seed, arg="val_size", cap="max_rows",
                                   error=TabularDataError)
        return np.sort(pool), np.sort(val), np.sort(test)

    def _load_frame(self) -> tuple[pd.DataFrame, str, list[str], list[str], str, str]:
        hp = self.hparams
        self._official = None
        if self._is_hf_source():
            if hp.target is None:
                raise TabularDataError("data.target is required with a datasets source: name the target"
                                       " column.")
            return (self._load_hf_frame(), hp.target, list(hp.categorical or []), list(hp.drop or []),
                    hp.task, hp.target_transform or "none")
        if hp.path is not None:
            frame = read_table(hp.path, "data.init_args.path", hp.encoding)
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

    def _inferred_categorical(self, frame: pd.DataFrame, exclude: list[str]) -> list[str]:
        """The categorical columns of a user's table (``infer_categorical``), said in one line."""
        try:
            found = infer_categorical(frame, exclude=[c for c in exclude if c in frame.columns])
        except TabularPreprocessingError as error:
            raise TabularDataError(f"{error} (data.init_args.categorical)") from None
        if found:
            names = ", ".join(map(str, found))
            log.info(
                f"ripieno: data: {len(found)} text or boolean columns taken as categorical: {names}"
                " (set data.init_args.categorical to choose them yourself, [] for none)"
            )
        return found

    def _check_args(self) -> None:
        split = self.split_settings
        hp = self.hparams
        check_split_args(split, self.loader_settings, hp, TabularDataError, cap="max_rows", min_rows=3)
        calibration = hp.get("calibration_size", 0.0)
        if not 0.0 <= calibration < 1.0:
            raise TabularDataError(f"calibration_size must be a fraction in [0, 1) (0: no calibration rows),"
                                   f" got {calibration}.")
        if split.val_size + split.test_size + calibration >= 1.0:
            held = " + calibration_size" if calibration else ""
            total = split.val_size + split.test_size + calibration
            raise TabularDataError(f"split.val_size + split.test_size{held} = {total} leaves no training"
                                   " rows.")
        if hp.missing not in ("error", "impute"):
            raise TabularDataError(f"missing must be 'error' or 'impute', got {hp.missing!r}.")
        if hp.numeric_embedding not in ("ple", "none"):
            raise TabularDataError(
                f"numeric_embedding must be 'ple' or 'none', got {hp.numeric_embedding!r}."
            )
        if hp.preprocessing_from is not None and hp.predict_path is None:
            raise TabularDataError(
                "data.preprocessing_from serves predict_path only: give data.predict_path, or drop"
                " preprocessing_from to fit the preprocessing on the training table."
            )

    def _prepare(self) -> None:
        self._check_args()
        if self.hparams.preprocessing_from is not None:
            self._spec = spec_from_checkpoint(self.hparams.preprocessing_from)
        else:
            self._prepare_splits()
        if self.hparams.predict_path is not None:
            self._prepare_predict_rows()

    def _prepare_splits(self) -> None:
        hp = self.hparams
        frame, target, categorical, drop, task, target_transform = self._load_frame()
        ids = [hp.id_column] if hp.id_column else []
        if hp.categorical is None and (hp.path is not None or self._is_hf_source()):
            categorical = self._inferred_categorical(frame, [target, *drop, *ids])
        _check_columns(frame, target, categorical, [*drop, *ids])
        if hp.id_column is not None and hp.id_column == target:
            raise TabularDataError(f"id_column {hp.id_column!r} is the target; name another column.")
        if hp.max_rows is not None and hp.max_rows < len(frame) and self._official is None:
            frame = frame.sample(n=hp.max_rows, random_state=self.split_settings.seed)
        row_ids = (frame[hp.id_column] if hp.id_column else pd.Series(frame.index)).tolist()
        frame = frame.reset_index(drop=True)
        excluded = {target, *categorical, *drop, *([hp.id_column] if hp.id_column else [])}
        numeric = [c for c in frame.columns if c not in excluded]
        y_raw = frame[target]
        task = _resolve_task(task, y_raw, target)
        y, class_names, label_type = _encode_target(y_raw, target, task, target_transform)

        stratify = y if task != "regression" else None
        if self._official is not None:
            train_idx, val_idx, test_idx = self._official_indices(stratify)
        else:
            cut = self.split_settings
            train_idx, val_idx, test_idx = _split_indices(len(frame), stratify, cut.val_size, cut.test_size,
                                                          cut.seed)
        train_idx, cal_idx = self._calibration_rows(train_idx, stratify, len(frame))
        if task != "regression":
            _check_labels_seen(y, train_idx, {"val": val_idx, "test": test_idx, "calibration": cal_idx},
                               class_names)

        preprocessor = TabularPreprocessor(numeric, categorical, hp.numeric_transform, hp.missing,
                                           seed=self.split_settings.seed)
        try:
            preprocessor.fit(frame.iloc[train_idx])
            x_num, codes = preprocessor.transform(frame, what="table")
        except TabularPreprocessingError as err:
            raise TabularDataError(str(err)) from err
        kept = preprocessor.num_feature_names
        bins = None
        if hp.numeric_embedding == "ple" and kept:
            n_bins = min(hp.n_bins, len(train_idx) - 1)
            try:
                edges = compute_bins(x_num[train_idx], n_bins, hp.bins, y=y[train_idx],
                                     regression=task == "regression", feature_names=kept)
            except ValueError as err:
                raise TabularDataError(str(err)) from err
            bins = [e.tolist() for e in edges]

        mean = float(y[train_idx].mean()) if task == "regression" else 0.0
        std = float(y[train_idx].std()) if task == "regression" else 1.0
        if task == "regression" and not std > 0:
            raise TabularDataError(f"Target {target!r} is constant on the training split.")
        self._spec = TabularSpec(
            task=task, n_num_features=len(kept), cat_cardinalities=preprocessor.cat_cardinalities,
            n_classes=len(class_names) if task != "regression" else None, bins=bins,
            target_mean=mean, target_std=std, target_transform=target_transform,
            num_feature_names=kept, cat_feature_names=preprocessor.cat_feature_names,
            class_names=class_names, label_type=label_type, target_name=target, id_column=hp.id_column,
            preprocessing=preprocessor.state_dict(),
        )
        y_tensor = torch.tensor(y, dtype=torch.float32 if task == "regression" else torch.long)
        x_num_t = torch.as_tensor(x_num, dtype=torch.float32)
        x_cat_t = torch.as_tensor(codes, dtype=torch.long)
        named_rows = [("train", train_idx), ("val", val_idx), ("test", test_idx)]
        if len(cal_idx):
            named_rows.append(("calibration", cal_idx))
        for name, rows in named_rows:
            rows_t = torch.as_tensor(rows)
            self._splits[name] = TabularTensorDataset(x_num_t[rows_t], x_cat_t[rows_t], y_tensor[rows_t])
        self._prediction_ids = (hp.id_column or "row", [row_ids[i] for i in test_idx])
        if not self._keep_table:  # only table_splits() asks for the raw rows: a fit keeps no copy
            return
        features = frame[[*numeric, *categorical]]
        self._table_splits = TableSplits(
            task=task,
            features={n: features.iloc[r].reset_index(drop=True) for n, r in
                      (("train", train_idx), ("val", val_idx), ("test", test_idx))},
            targets={"train": y[train_idx], "val": y[val_idx], "test": y[test_idx]},
            categorical=list(categorical), class_names=list(class_names) if task != "regression" else [],
            target_transform=target_transform, name=hp.dataset if hp.path is None else str(hp.path),
        )

    def _calibration_rows(self, train: np.ndarray, stratify: np.ndarray | None,
                          n_rows: int) -> tuple[np.ndarray, np.ndarray]:
        """``(train, calibration)``: ``calibration_size`` of all rows carved from the training rows."""
        size = self.hparams.get("calibration_size", 0.0)
        if not size:
            return train, np.zeros(0, dtype=np.int64)
        count = round(n_rows * size)
        if count < 1 or count >= len(train):
            raise TabularDataError(f"calibration_size={size} gives {count} of the {len(train)} training rows;"
                                   " use a fraction that leaves both sides rows (or more rows).")
        return split_rows(train, stratify, count, self.split_settings.seed, arg="calibration_size",
                          cap="max_rows", error=TabularDataError)

    @property
    def has_calibration_rows(self) -> bool:
        """Whether ``calibration_dataloader`` has rows (``calibration_size > 0`` and a training table)."""
        return bool(self.hparams.get("calibration_size", 0.0)) and self.hparams.preprocessing_from is None

    def calibration_dataloader(self) -> DataLoader:
        """The calibration rows (``calibration_size``), in order, at the evaluation batch size.

        Raises:
            TabularDataError: ``calibration_size`` is 0, or the datamodule serves a checkpoint's
                preprocessing (no training table).
        """
        if not self.hparams.get("calibration_size", 0.0):
            raise TabularDataError("This datamodule holds no calibration rows: set"
                                   " data.init_args.calibration_size (e.g. 0.1), or calibrate on the"
                                   " validation"
                                   " rows on purpose"
                                   " (ConformalPrediction(calibrate_on='val')).")
        return self._loader(self._split("calibration"), self.loader_settings.eval_batch_size)

    def table_splits(self) -> TableSplits:
        """The prepared train/val/test rows before preprocessing, with encoded targets.

        What a scikit-learn model takes (``ripieno benchmark`` fits gradient-boosted trees and
        ripieno's estimators on them): the same rows as the tensors this datamodule serves, the
        target after its transform (class codes for classification), missing values kept.

        Raises:
            TabularDataError: the datamodule serves a checkpoint's preprocessing (no training table).
        """
        if self._table_splits is None and not self._keep_table:
            self._keep_table = True
            self._spec, self._splits = None, {}  # prepared without the raw rows: prepare again with them
        self.spec  # noqa: B018 - prepares on first use
        if self._table_splits is None:
            raise TabularDataError("table_splits needs the training table; this datamodule serves"
                                   " data.preprocessing_from's checkpoint instead.")
        return self._table_splits

    def _prepare_predict_rows(self) -> None:
        path = self.hparams.predict_path
        spec = self._spec
        if spec.preprocessing is None:
            raise TabularDataError("The spec has no fitted preprocessing, so new rows cannot be read;"
                                   " prepare the data with TabularDataModule (or retrain).")
        frame = read_table(path, "data.init_args.predict_path", self.hparams.encoding)
        preprocessor = TabularPreprocessor.from_state(spec.preprocessing)
        what = f"rows of {path}"
        expected = [c for c in (spec.target_name, spec.id_column, *(self.hparams.drop or [])) if c]
        preprocessor.note_extra_columns(frame, expected=expected, what=what)
        try:
            x_num, codes = preprocessor.transform(frame, what=what)
        except TabularPreprocessingError as err:
            raise TabularDataError(str(err)) from err
        self._splits["predict"] = TabularTensorDataset(torch.as_tensor(x_num), torch.as_tensor(codes))
        id_name = spec.id_column if spec.id_column in frame.columns else "row"
        ids = frame[id_name].tolist() if id_name != "row" else list(range(len(frame)))
        self._prediction_ids = (id_name, ids)

    @override
    def predict_dataloader(self) -> DataLoader:
        """The rows of ``predict_path`` in file order, else the test split."""
        name = "predict" if self.hparams.predict_path is not None else "test"
        return self._loader(self._split(name), self.loader_settings.eval_batch_size)

    def prediction_ids(self, indices: list[int]) -> tuple[str, list[Any]]:
        """The id column's name and the ids of predicted rows ``indices`` (dataset order)."""
        self.setup("predict")
        name, ids = self._prediction_ids  # type: ignore[misc]
        return name, [ids[i] for i in indices]

    def _split(self, name: str) -> Any:  # noqa: ANN401
        self.setup()
        if name not in self._splits:
            raise TabularDataError(
                f"No {name} split: data.preprocessing_from builds only the rows of predict_path;"
                " drop preprocessing_from to train, validate or test."
            )
        return self._splits[name]


def read_table(path: str | Path, arg: str, encoding: str = "utf-8",
               error: type[DataModuleError] = TabularDataError) -> pd.DataFrame:
    """A CSV, TSV or Parquet file as a DataFrame; a file that cannot be used is a one-line error.

    CSV and TSV files may be compressed (``COMPRESSIONS``). Every problem is raised as ``error``
    with a message (``file_problem``) naming the file, what is wrong and the fix: a missing
    file, a folder, an unsupported suffix, an empty file, a header without rows, text that is
    not ``encoding``, a malformed CSV row, a corrupt Parquet file, or a header that repeats a
    column name (read from the raw header, ``datamodules.table_header``: pandas would rename
    the repeat to ``name.1`` and the first copy would be used silently).

    Args:
        path: the file.
        arg: the setting that named it (e.g. ``data.init_args.path``), quoted in fixes.
        encoding: text encoding of CSV/TSV files.
        error: the exception class raised.
    """
    file = Path(path).expanduser()
    elsewhere = f"point {arg} at another file"
    if file.is_dir():
        raise error(file_problem(file, "is a folder, not a table file",
                                 f"point {arg} at a .csv, .tsv or .parquet file"))
    if not file.exists():
        raise error(file_problem(file, "does not exist", f"check {arg}"))
    kind = _table_format(file)
    if kind is None:
        raise error(file_problem(file, f"has the unsupported suffix {file.suffix!r}",
                                 "use a .csv, .tsv or .parquet file (CSV/TSV may be compressed)"))
    if file.stat().st_size == 0:
        raise error(file_problem(file, "is empty (0 bytes)",
                                 f"write the table into it again, or {elsewhere}"))
    if kind == "parquet":
        frame = _read_parquet(file, arg, error)
    else:
        frame = _read_text_table(file, arg, encoding, "\t" if kind == "tsv" else ",", error)
        check_unique_columns(file, header_names(file, kind, encoding), error)
    if len(frame) == 0:
        raise error(file_problem(file, "has a header but no rows" if len(frame.columns) else "has no rows",
                                 f"add rows to it, or {elsewhere}"))
    return frame


def _table_format(file: Path) -> str | None:
    """``csv``, ``tsv`` or ``parquet`` by the file's suffix (``None``: unsupported)."""
    suffixes = [s.lower() for s in file.suffixes]
    if len(suffixes) > 1 and suffixes[-1] in COMPRESSIONS and TABLE_FORMATS.get(suffixes[-2]) != "parquet":
        suffixes.pop()
    return TABLE_FORMATS.get(suffixes[-1]) if suffixes else None


def _read_parquet(file: Path, arg: str, error: type[DataModuleError]) -> pd.DataFrame:
    """The Parquet file's table; its schema is checked first (a repeated column name is refused)."""
    try:
        names = header_names(file, "parquet")
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise _unreadable_parquet(file, arg, err, error) from err
    check_unique_columns(file, names, error)
    try:
        return pd.read_parquet(file)
    except (OSError, ValueError) as err:
        raise _unreadable_parquet(file, arg, err, error) from err


def _unreadable_parquet(file: Path, arg: str, err: Exception,
                        error: type[DataModuleError]) -> DataModuleError:
    reason = first_line(err).split("': ", 1)[-1]  # pyarrow repeats the path before the reason
    return error(file_problem(file, f"is not a readable Parquet file ({reason})",
                              f"write it again (e.g. DataFrame.to_parquet), or point {arg} at another file"))


def _read_text_table(file: Path, arg: str, encoding: str, sep: str, error: type[DataModuleError]
                     ) -> pd.DataFrame:
    try:
        codecs.lookup(encoding)
    except LookupError as err:
        raise error(f"{ENCODING_ARG}: {encoding!r} is not a known text encoding; use e.g. utf-8, latin-1"
                    " or cp1252.") from err
    try:
        return pd.read_csv(file, sep=sep, encoding=encoding)
    except UnicodeDecodeError as err:
        raise error(file_problem(
            file, f"is not valid {encoding} text ({_undecodable_place(file, encoding, err)})",
            f"name its encoding with {ENCODING_ARG} (e.g. latin-1 or cp1252), or save it as {encoding}"
        )) from err
    except pd.errors.EmptyDataError as err:
        raise error(file_problem(file, "has no header and no rows (only blank lines)",
                                 f"write the table into it again, or point {arg} at another file")) from err
    except pd.errors.ParserError as err:
        raise error(file_problem(file, f"cannot be parsed ({first_line(err)})",
                                 "give every row as many fields as the header")) from err
    except (OSError, EOFError) as err:  # unreadable, or a broken compressed file
        raise error(file_problem(file, f"cannot be read ({first_line(err)})",
                                 f"check its permissions and compression, or point {arg} at another file")
                    ) from err


def _undecodable_place(file: Path, encoding: str, err: UnicodeDecodeError) -> str:
    """``byte 0xe9 on line 3``: the bad byte (from ``err``) and the first line that fails to decode.

    pandas decodes in chunks, so ``err``'s position is not the file's; an uncompressed file is
    scanned line by line to find the line.
    """
    place = f"byte 0x{err.object[err.start:err.start + 1].hex()}"
    if file.suffixes and file.suffixes[-1].lower() in COMPRESSIONS:
        return place
    with file.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode(encoding)
            except UnicodeDecodeError:
                return f"{place} on line {number}"
    return place


def spec_from_checkpoint(path: str) -> TabularSpec:
    """The ``TabularSpec`` a checkpoint's model was trained with (``weights_only=True``).

    The compact spec of the hyperparameters, with the fitted state the module saved beside them.
    """
    file = Path(path).expanduser()
    arg = "data.init_args.preprocessing_from"
    checkpoint = read_checkpoint(file, option=f"{arg} (or --ckpt_path)")
    spec = (checkpoint.get("hyper_parameters") or {}).get("data_spec")
    if spec is None:
        raise TabularDataError(file_problem(
            file, "has no data_spec hyperparameter (it was not saved by a tabular ripieno model)",
            f"point {arg} at a tabular checkpoint"))
    spec = TabularSpec.coerce(spec)
    return spec.with_fitted_state(checkpoint.get(FITTED_STATE_KEY) or {})


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


def _resolve_task(task: str, y: pd.Series, name: str) -> str:
    """``task``, or for ``auto`` the inferred task (``infer_task``), announced in one info line."""
    if task == "auto":
        inferred, reason = infer_task(y)
        log.info(f"ripieno: task: auto inferred {inferred} for target {name!r} because {reason};"
                 " set data.init_args.task (regression, binary or multiclass) to override.")
        return inferred
    if task not in ("regression", "binary", "multiclass"):
        raise TabularDataError(f"task must be auto, regression, binary or multiclass, got {task!r}.")
    return task


def infer_task(y: pd.Series) -> tuple[str, str]:
    """The task ``auto`` infers from target values ``y``, and why (class docstring's rule).

    Example:
        >>> infer_task(pd.Series([0, 1, 1, 0]))
        ('binary', 'it holds integers with 2 distinct values (at most 20)')
        >>> infer_task(pd.Series([0.5, 1.5, 2.0]))
        ('regression', 'it holds floats')
    """
    n_values = int(y.nunique(dropna=True))
    classification = "binary" if n_values == 2 else "multiclass"
    if pd.api.types.is_bool_dtype(y):
        return classification, "it holds booleans"
    if pd.api.types.is_integer_dtype(y):
        few = n_values <= MAX_INFERRED_CLASSES
        return (classification if few else "regression",
                f"it holds integers with {n_values} distinct values"
                f" ({'at most' if few else 'more than'} {MAX_INFERRED_CLASSES})")
    if pd.api.types.is_numeric_dtype(y):
        return "regression", "it holds floats"
    return classification, "it holds text labels"


def _encode_target(y: pd.Series, name: str, task: str, transform: str
                   ) -> tuple[np.ndarray, list[str], LabelType]:
    """The target as model labels: ``(values or class codes, class names, label type)``."""
    n_missing = int(y.isna().sum())
    if n_missing:
        raise TabularDataError(f"Target {name!r} has {n_missing} missing value(s); drop those rows.")
    if task == "regression":
        return _regression_target(y, name, transform), [], "text"
    if transform not in ("none", None):
        raise TabularDataError(f"target_transform={transform!r} applies to regression only.")
    class_names, label_type = class_order(y)
    if task == "binary" and len(class_names) != 2:
        raise TabularDataError(
            f"task=binary needs exactly 2 labels in {name!r}, found {len(class_names)}:"
            f" {class_names[:10]}; use task: multiclass."
        )
    if len(class_names) < 2:
        raise TabularDataError(f"Target {name!r} has a single label {class_names}; nothing to learn.")
    codes = pd.Categorical(category_strings(y), categories=class_names).codes.astype(np.int64)
    return codes, class_names, label_type


def class_order(y: pd.Series) -> tuple[list[str], LabelType]:
    """Class names of labels ``y`` in code order, and the labels' type.

    Names are the labels as strings (``category_strings``: ``1`` and ``1.0`` are both ``"1"``).
    Numeric labels are ordered by value, so ``2`` comes before ``10``; other labels are sorted
    as strings. The type is ``integer`` for whole numbers, ``boolean`` for booleans, else
    ``text`` (``TabularSpec.class_labels`` turns names back into labels of that type).

    Example:
        >>> class_order(pd.Series([10, 2, 2, 1]))
        (['1', '2', '10'], 'integer')
        >>> class_order(pd.Series(["b", "a"]))
        (['a', 'b'], 'text')
    """
    values = pd.Series(pd.unique(y.dropna()), dtype=y.dtype)
    if pd.api.types.is_bool_dtype(y):
        return list(category_strings(values.sort_values())), "boolean"
    if not pd.api.types.is_numeric_dtype(y):
        return sorted(set(category_strings(values))), "text"
    ordered = values.sort_values()
    whole = bool(np.all(np.mod(ordered.to_numpy(dtype=np.float64), 1) == 0))
    return list(dict.fromkeys(category_strings(ordered))), "integer" if whole else "text"


def _regression_target(y: pd.Series, name: str, transform: str) -> np.ndarray:
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
        return np.log(arr)
    if transform != "none":
        raise TabularDataError(f"target_transform must be none or log, got {transform!r}.")
    return arr


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
