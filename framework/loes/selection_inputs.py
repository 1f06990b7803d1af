"""LOES selection's inputs: layers and targets checked and converted, with one-line errors naming the fix.

Every selector (``select_layers`` and the baselines) starts here: layers become ``(N, D_l)`` tensors
on one device (a single ``(N, L, D)`` array is split), targets become ridge targets (one-hot for
classes) and the task is inferred from their dtype when ``task="auto"``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

Task = Literal["auto", "classification", "regression", "label_free"]
ArrayLike = Tensor | np.ndarray
LayerInput = Sequence[ArrayLike] | ArrayLike


@dataclass(frozen=True)
class SelectionTargets:
    """The targets as the ridge probe and Tri read them."""

    task: str
    matrix: Tensor | None  # (N, T) regression targets or one-hot labels
    labels: Tensor | None  # (N,) class indices, classification only
    num_classes: int


def to_tensor(value: Any, name: str) -> Tensor:
    """``value`` as a tensor (detached), or a one-line error naming ``name``."""
    if isinstance(value, Tensor):
        return value.detach()
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as error:
        kind = type(value).__name__
        raise ValueError(f"{name} must be a numpy array or torch tensor; got {kind}.") from error


def prepare_layers(
    layers: LayerInput, dtype: torch.dtype, device: torch.device | None = None, keep_narrower: bool = False
) -> list[Tensor]:
    """Validate the layers and return them as ``(N, D_l)`` tensors of ``dtype`` on one device.

    With ``keep_narrower``, floating layers whose values ``dtype`` holds exactly (float32 for
    float64) keep their dtype: the caller converts them where it reads them, without a copy of every
    layer in ``dtype`` first.
    """
    if isinstance(layers, Tensor | np.ndarray):
        if layers.ndim != 3:
            raise ValueError(
                f"A single array of layers must be (N, L, D); got shape {tuple(layers.shape)}. "
                "Pass a list of (N, D_l) arrays instead."
            )
        layers = [layers[:, i] for i in range(layers.shape[1])]
    if len(layers) == 0:
        raise ValueError("No layers given; pass a list of (N, D_l) feature arrays, one per layer.")
    views = []
    for i, layer in enumerate(layers):
        view = to_tensor(layer, f"layer {i}")
        if view.ndim != 2:
            raise ValueError(
                f"Layer {i} has shape {tuple(view.shape)}; each layer must be (N, D_l). Pool tokens first, "
                "and reshape a 1-D layer with x[:, None]."
            )
        if view.shape[1] == 0:
            raise ValueError(f"Layer {i} has no features (shape {tuple(view.shape)}).")
        if views and view.shape[0] != views[0].shape[0]:
            raise ValueError(
                f"Layer {i} has {view.shape[0]} samples but layer 0 has {views[0].shape[0]}; every layer "
                "must hold the same calibration samples in the same order."
            )
        keep = keep_narrower and view.is_floating_point() and torch.promote_types(view.dtype, dtype) == dtype
        view = view.to(dtype=view.dtype if keep else dtype,
                       device=device if device is not None or not views else views[0].device)
        # One reduction: a NaN or inf entry makes the sum non-finite (count them only then).
        bad = 0 if bool(torch.isfinite(view.sum())) else int((~torch.isfinite(view)).sum())
        if bad:
            raise ValueError(f"Layer {i} contains {bad} NaN or inf entries; drop or impute those samples.")
        views.append(view)
    if views[0].shape[0] < 3:
        raise ValueError(f"Need at least 3 calibration samples, got {views[0].shape[0]}.")
    return views


def prepare_targets(
    y: ArrayLike | None, n: int, task: Task, dtype: torch.dtype, device: torch.device
) -> SelectionTargets:
    """Validate ``y`` against ``task`` and build the ridge targets (one-hot for classification)."""
    if task not in ("auto", "classification", "regression", "label_free"):
        raise ValueError(f"Unknown task {task!r}; use auto, classification, regression or label_free.")
    if y is None:
        if task in ("classification", "regression"):
            raise ValueError(f"task={task!r} needs targets y; pass y, or y=None with task='label_free'.")
        return SelectionTargets("label_free", None, None, 0)
    if task == "label_free":
        raise ValueError("task='label_free' uses no targets; pass y=None, or choose another task.")
    target = to_tensor(y, "y").to(device)
    if target.shape[0] != n:
        raise ValueError(f"y has {target.shape[0]} rows but the layers have {n} samples; they must match.")
    if target.is_floating_point() and not bool(torch.isfinite(target).all()):
        raise ValueError("y contains NaN or inf; drop or impute those samples.")
    if task == "auto":
        task = "regression" if target.is_floating_point() or target.is_complex() else "classification"
    if task == "regression":
        matrix = target.to(dtype)
        if matrix.ndim not in (1, 2):
            raise ValueError(f"Regression targets must be (N,) or (N, T); got shape {tuple(target.shape)}.")
        return SelectionTargets("regression", matrix.reshape(n, -1), None, 0)
    return _classification_targets(target, dtype)


def _classification_targets(target: Tensor, dtype: torch.dtype) -> SelectionTargets:
    if target.ndim != 1:
        raise ValueError(
            f"Classification targets must be class indices (N,); got shape {tuple(target.shape)}. "
            "For one-hot rows pass y.argmax(1)."
        )
    if target.is_floating_point():
        if not bool((target == target.round()).all()):
            raise ValueError("Classification labels must be integers 0..C-1; got fractional values. "
                             "Use task='regression' for continuous targets.")
    labels = target.long()
    classes = torch.unique(labels)
    if classes.numel() < 2:
        raise ValueError(f"Classification needs at least 2 classes; every label is {int(classes[0])}.")
    if not torch.equal(classes, torch.arange(classes.numel(), device=labels.device)):
        shown = classes[:10].tolist()
        raise ValueError(
            f"Labels must be the integers 0..C-1 with every class present; got values {shown}"
            f"{'...' if classes.numel() > 10 else ''}. Remap with numpy.unique(y, return_inverse=True)[1]."
        )
    num_classes = classes.numel()
    onehot = torch.nn.functional.one_hot(labels, num_classes).to(dtype)
    return SelectionTargets("classification", onehot, labels, num_classes)


def check_k(k: int, num_layers: int) -> None:
    """Refuse a ``k`` that is not a positive integer at most ``num_layers``."""
    if not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}.")
    if k > num_layers:
        raise ValueError(f"k={k} exceeds the {num_layers} layers given; use k <= {num_layers}.")


def check_weights(**weights: float) -> None:
    """Refuse a weight that is negative or not finite, naming it."""
    for name, value in weights.items():
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}.")


def require_targets(targets: SelectionTargets, method: str) -> None:
    """Refuse label-free input for a selector that ranks layers by a ridge probe."""
    if targets.matrix is None:
        raise ValueError(
            f"{method} ranks layers by a ridge probe and needs targets y; for label-free selection "
            "use select_layers(layers, y=None, k=...)."
        )



def prepare(
    layers: LayerInput, y: ArrayLike | None, task: Task, dtype: torch.dtype, keep_narrower: bool = False
) -> tuple[list[Tensor], SelectionTargets]:
    """The checked layers (``prepare_layers``) and targets (``prepare_targets``) of one selection."""
    views = prepare_layers(layers, dtype, keep_narrower=keep_narrower)
    return views, prepare_targets(y, views[0].shape[0], task, dtype, views[0].device)



def check_lam(lam: float) -> None:
    """Refuse a ridge penalty that is not positive."""
    if not lam > 0:
        raise ValueError(f"Ridge needs lam > 0, got {lam}; use a small positive value such as 1e-3.")

