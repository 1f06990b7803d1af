"""The rows of a prepared table before any model-specific preprocessing: what a scikit-learn model takes.

``TabularDataModule.table_splits()`` returns one, so a gradient-boosted tree and a ripieno
ensemble see exactly the same training, validation and test rows and targets (``ripieno
benchmark``), each with its own preprocessing: the trees their native categorical and missing-value
handling, the ensembles ``TabularPreprocessor``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from ripieno.framework.specs.tabular import Task

SPLITS: tuple[str, ...] = ("train", "val", "test")


@dataclass(frozen=True)
class TableSplits:
    """Raw feature rows and encoded targets of the train, val and test splits of one table.

    Attributes:
        task: ``regression``, ``binary`` or ``multiclass``.
        features: {split: the feature columns of its rows} (target, ids and dropped columns
            removed; numeric columns as loaded, categorical ones as loaded, missing values kept).
        targets: {split: class codes ``0..C-1`` (classification) or the modelled target, after the
            data set's target transform (regression)}.
        categorical: names of the categorical feature columns.
        class_names: class names in code order (classification), else empty.
        target_transform: ``none`` or ``log`` (regression metrics are in the transformed units).
        name: the data set's name, for messages.
    """

    task: Task
    features: dict[str, pd.DataFrame]
    targets: dict[str, np.ndarray]
    categorical: list[str] = field(default_factory=list)
    class_names: list[str] = field(default_factory=list)
    target_transform: str = "none"
    name: str = ""

    @property
    def n_classes(self) -> int | None:
        """Number of classes, or ``None`` for regression."""
        return None if self.task == "regression" else len(self.class_names)

    def rows(self) -> dict[str, int]:
        """Rows per split."""
        return {split: len(frame) for split, frame in self.features.items()}


@runtime_checkable
class TableSplitsSource(Protocol):
    """A datamodule that can hand its prepared splits to scikit-learn models (``ripieno benchmark``)."""

    def table_splits(self) -> TableSplits:
        """The raw train/val/test rows and encoded targets."""
        ...
