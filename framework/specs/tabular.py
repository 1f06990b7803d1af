"""What a tabular model must know about its data, passed from datamodule to module.

The datamodule fits its preprocessing on the training split and describes the result
in a ``TabularSpec``; the ripieno CLI links ``data.spec`` into ``model.data_spec``.
The module stores it as a plain dict in its hyperparameters, so checkpoints load with
``load_from_checkpoint`` and without the data.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

Task = Literal["regression", "binary", "multiclass"]
TASKS: tuple[str, ...] = ("regression", "binary", "multiclass")
LabelType = Literal["text", "integer", "boolean"]
LABEL_TYPES: tuple[str, ...] = ("text", "integer", "boolean")


@dataclass
class TabularSpec:
    """Feature layout, task and target scaling of a prepared tabular data set.

    Attributes:
        task: ``regression``, ``binary`` or ``multiclass``.
        n_num_features: number of numeric columns (after preprocessing).
        cat_cardinalities: categories per categorical column, including the
            trailing "unknown" slot used for categories unseen in training.
        n_classes: number of classes (classification), else ``None``.
        bins: piecewise-linear bin edges per numeric feature, or ``None``.
        target_mean: training mean of the modelled regression target.
        target_std: training standard deviation of the modelled regression target.
        target_transform: ``none`` or ``log`` (the model sees ``log(y)``; predictions are
            mapped back with ``exp``).
        num_feature_names: numeric column names.
        cat_feature_names: categorical column names.
        class_names: class labels in code order (classification), always strings.
        label_type: what the training target's labels were: ``text``, ``integer`` (class
            names are whole numbers, ordered by value) or ``boolean``; ``class_labels`` gives
            the labels back in that type, so predictions compare equal to the user's labels.
        target_name: the target column of the training table.
        id_column: the column that identifies rows in prediction outputs (``None``: row number).
        preprocessing: the fitted feature preprocessing
            (``ripieno.framework.specs.tabular_preprocessing.TabularPreprocessor.state_dict``), so the
            model alone turns new rows into inputs; ``None`` for a spec built by hand.
    """

    task: Task
    n_num_features: int
    cat_cardinalities: list[int] = field(default_factory=list)
    n_classes: int | None = None
    bins: list[list[float]] | None = None
    target_mean: float = 0.0
    target_std: float = 1.0
    target_transform: Literal["none", "log"] = "none"
    num_feature_names: list[str] = field(default_factory=list)
    cat_feature_names: list[str] = field(default_factory=list)
    class_names: list[str] = field(default_factory=list)
    label_type: LabelType = "text"
    target_name: str | None = None
    id_column: str | None = None
    preprocessing: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        """Check the invariants a model relies on."""
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}.")
        if self.task != "regression" and (self.n_classes is None or self.n_classes < 2):
            raise ValueError(f"A {self.task} task needs n_classes >= 2, got {self.n_classes}.")
        if self.task == "binary" and self.n_classes != 2:
            raise ValueError(f"A binary task has exactly 2 classes, got {self.n_classes}.")
        if not (math.isfinite(self.target_std) and self.target_std > 0):
            raise ValueError(f"target_std must be positive and finite, got {self.target_std}.")
        if self.label_type not in LABEL_TYPES:
            raise ValueError(f"label_type must be one of {LABEL_TYPES}, got {self.label_type!r}.")
        if self.bins is not None and len(self.bins) != self.n_num_features:
            raise ValueError(f"{len(self.bins)} bin lists for {self.n_num_features} numeric features.")

    @property
    def d_out(self) -> int:
        """Outputs per member: 1 for regression and binary, ``n_classes`` otherwise."""
        return self.n_classes if self.task == "multiclass" else 1  # type: ignore[return-value]

    def class_labels(self) -> list[str] | list[int] | list[bool]:
        """Class labels in code order, in the training target's type (``label_type``).

        Example:
            >>> spec = TabularSpec("binary", 1, n_classes=2, class_names=["2", "10"], label_type="integer")
            >>> spec.class_labels()
            [2, 10]
        """
        if self.label_type == "integer":
            return [int(name) for name in self.class_names]
        if self.label_type == "boolean":
            return [name == "True" for name in self.class_names]
        return list(self.class_names)

    def bin_tensors(self) -> list[Tensor] | None:
        """Bin edges as float32 tensors (or ``None``)."""
        if self.bins is None:
            return None
        return [torch.tensor(edges, dtype=torch.float32) for edges in self.bins]

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (safe for YAML hyperparameters and ``weights_only`` loading)."""
        return asdict(self)

    @classmethod
    def coerce(cls, value: TabularSpec | dict[str, Any]) -> TabularSpec:
        """Accept a spec or its dict form."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls(**value)
        raise TypeError(
            f"data_spec must be a TabularSpec or dict, got {type(value).__name__}; pass"
            " datamodule.spec (the ripieno CLI links it for you)."
        )
