"""What a tabular model must know about its data, passed from datamodule to module.

The datamodule fits its preprocessing on the training split and describes the result
in a ``TabularSpec``; the ripieno CLI links ``data.spec`` into ``model.data_spec``.
The module keeps the compact part in its hyperparameters (``hparams_dict``: what sizes the
network) and the fitted state (preprocessing, bin edges, many class names) in its checkpoint
(``fitted_state``), so checkpoints load with ``load_from_checkpoint`` and without the data,
and ``hparams.yaml`` and loggers stay small.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from ripieno.framework.specs.base import DataSpec

Task = Literal["regression", "binary", "multiclass"]
TASKS: tuple[str, ...] = ("regression", "binary", "multiclass")
LabelType = Literal["text", "integer", "boolean"]
LABEL_TYPES: tuple[str, ...] = ("text", "integer", "boolean")
LONG_CLASS_NAMES = 512
"""Class names longer than this as JSON (characters) are fitted state, not hyperparameters."""


@dataclass
class TabularSpec(DataSpec):
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
        bin_counts: bins per numeric feature (``len(edges) - 1`` of ``bins``); set from ``bins``,
            and all that remains of them in ``hparams_dict`` (it sizes the embeddings).

    Fitted state (``fitted_fields``): ``preprocessing`` and ``bins``, and ``class_names`` when
    they are long (more than ``LONG_CLASS_NAMES`` characters as JSON).

    Example:
        >>> spec = TabularSpec("regression", 2, bins=[[0.0, 0.5, 1.0], [0.0, 1.0]])
        >>> spec.bin_counts
        [2, 1]
        >>> compact = spec.hparams_dict()
        >>> "bins" in compact, compact["bin_counts"]
        (False, [2, 1])
        >>> TabularSpec.coerce(compact).with_fitted_state(spec.fitted_state()) == spec
        True
    """

    fitted_fields = ("preprocessing", "bins", "class_names")

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
    bin_counts: list[int] | None = None

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
        if self.bins is not None:
            counts = [len(edges) - 1 for edges in self.bins]
            if self.bin_counts is not None and list(self.bin_counts) != counts:
                raise ValueError(f"bin_counts {self.bin_counts} do not match the bins' {counts}.")
            self.bin_counts = counts
        if self.bin_counts is not None:
            self.bin_counts = [int(n) for n in self.bin_counts]
            if len(self.bin_counts) != self.n_num_features or min(self.bin_counts, default=1) < 1:
                raise ValueError(f"bin_counts {self.bin_counts} must give >= 1 bin for each of the"
                                 f" {self.n_num_features} numeric features.")

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
        """Bin edges as float32 tensors (or ``None`` without bins).

        A compact spec (``hparams_dict``: ``bin_counts`` without ``bins``) gives placeholder
        edges ``0, 1, ..., n``: they size the embeddings, whose buffers the checkpoint's
        ``state_dict`` then replaces with the fitted ones.
        """
        if self.bins is not None:
            return [torch.tensor(edges, dtype=torch.float32) for edges in self.bins]
        if self.bin_counts is not None:
            return [torch.arange(n + 1, dtype=torch.float32) for n in self.bin_counts]
        return None

    def fitted_state(self) -> dict[str, Any]:
        """``preprocessing`` and ``bins`` when set, and ``class_names`` when long."""
        state = super().fitted_state()
        if len(json.dumps(state.get("class_names", []))) <= LONG_CLASS_NAMES:
            state.pop("class_names", None)
        return state
