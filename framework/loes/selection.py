"""LOES: greedy selection of a budget of layers from per-layer embeddings, and its baselines.

Given layer features ``H_0..H_{L-1}`` (each ``(N, D_l)``, e.g. pooled hidden states of every layer
of a frozen transformer on a calibration split) and optional targets ``y``, ``select_layers``
picks ``k`` layers in order:

* step 0: ``argmin_l  loss(H_l, Y) + alpha (1 - Iso(H_l))``;
* step t >= 1, with ``S`` the concatenated selected layers, ``R = Y - ridge(S, Y)`` the residual
  targets and ``H~_l = orthogonalize(H_l, S)`` (centred ``H_l`` minus its least-squares projection
  on the span of centred ``S``)::

      argmin_l  loss(H~_l, R) + alpha (1 - Iso(H~_l)) + gamma Red(H_l, S) - eta Tri(H~_l, y)

  where the Tri term is used for classification only. ``loss`` is the MSE of the closed-form ridge
  probe (``train``: in-sample, as the public LOES code; ``loo``: exact leave-one-out), ``Y`` the
  regression targets or the one-hot labels, and Iso, Red, Tri are defined in ``geometry``.
* label-free (``y=None``): the same rule without the ridge and Tri terms, i.e.
  ``alpha (1 - Iso(H_l))`` at step 0 and ``alpha (1 - Iso(H~_l)) + gamma Red(H_l, S)`` later: prefer
  layers whose new directions are evenly spread and which repeat little of what is already chosen.

Ties go to the lowest layer index. Every candidate at every step is scored and kept in
``LayerSelection.scores``. The baselines (``select_last_layer``, ``select_last_k``,
``select_best_single``, ``select_greedy_ridge``, ``select_exhaustive``) take the same arguments and
return the same ``LayerSelection``; ``SELECTORS`` maps method names to all six.

Regression losses are in units of ``y^2``: standardise ``y`` so that ``alpha``, ``gamma`` and ``eta``
weigh the geometry terms comparably across tasks. Selection runs in float64 with autocast off.

Two variants. ``variant="reference"`` is the public LOES code (``loes/api.py``) exactly, with its
defaults and its float32 (``ripieno.framework.loes.reference``, tested against its recorded
outputs); use it to reproduce the paper. ``variant="ripieno"`` (the default, described above) is
ours. Its differences from the reference, each deliberate, and why:
the residual targets come from one ridge fit on all selected layers, not a running sum of
per-step fits; the candidate is orthogonalised exactly (SVD) rather than by a ``1e-6`` ridge; Iso
is bounded in ``[0, 1]`` (its ``mean / std`` is available as ``iso="mean_std"``) and is taken of
the orthogonalised part at later steps, as Tri is; Red is centred linear CKA against the whole
selection instead of the max uncentred ``||X^T S||_F / (||X||_F ||S||_F)`` over selected layers; Tri
averages every class triple (or a seeded sample of distinct ones) in units of the candidate's total
standard deviation instead of 200 random, possibly repeated, triples in raw units. Why: one joint
refit makes the residual targets what the selected layers together cannot explain (a running sum
of per-step fits double-counts shared directions); the exact orthogonalisation does not leak the
selected span through a ridge; a bounded Iso keeps ``alpha`` on the scale of the other terms (the
reference's ``mean / std`` is unbounded, so ``1 - Iso`` can dominate or go very negative); CKA is
invariant to rotations and scale, so Red compares information rather than raw dot products; and
Tri over every triple in standard-deviation units is deterministic and comparable across layers of
different scales. ``LayerSelection.variant`` records which variant chose the layers.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Literal, ParamSpec, TypeVar

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ripieno.framework.loes.geometry import (
    IsoKind,
    Residualizer,
    RidgeLossKind,
    centroid_triangle_area,
    class_centroids,
    fit_residualizer,
    isotropy,
    orthogonalize,
    redundancy,
    ridge_fit,
    ridge_loss,
    span_basis,
    triangle_score,
)
from ripieno.framework.loes.reference import ReferenceWeights, reference_greedy
from ripieno.framework.nn.cholesky import cholesky_solve
from ripieno.framework.nn.gram import gram_matrix
from ripieno.framework.nn.thin_products import thin_matmul

Task = Literal["auto", "classification", "regression", "label_free"]
ArrayLike = Tensor | np.ndarray
LayerInput = Sequence[ArrayLike] | ArrayLike
Variant = Literal["ripieno", "reference"]
VARIANTS: tuple[str, ...] = ("ripieno", "reference")
SCORE_COLUMNS = ["step", "layer", "ridge_loss", "iso", "red", "tri", "total", "selected"]
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _without_autocast(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` with autocast off, so ridge solves and spectra stay in the selection dtype."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with torch.autocast("cpu", enabled=False), torch.autocast("cuda", enabled=False):
            return fn(*args, **kwargs)

    return wrapper


#: CPU threads LOES selection runs on, or ``None`` (the default): leave torch's setting alone, as a
#: library must. Opt in (``selection.SELECTION_THREADS = 1``) on a machine whose cores other work
#: shares: a selection whose largest layer Gram costs at most ``SELECTION_THREADS_MAX_WORK``
#: multiply-adds (``N * D^2``) is a chain of small dense operations where MKL's threaded ``eigh`` and
#: OpenMP's fork/join cost more than a second thread saves when the cores are busy, while on idle
#: cores one thread is slower (``bench/loes_selection.py --selection-threads`` compares). Larger
#: selections keep torch's threads. The previous setting is restored when the selection returns.
SELECTION_THREADS: int | None = None
SELECTION_THREADS_MAX_WORK = 2**31


def _layer_work(layers: Any) -> int:
    """``N * max D^2`` of the layers as given (list of ``(N, D)`` arrays or one ``(N, L, D)`` array)."""
    try:
        if isinstance(layers, Tensor | np.ndarray):
            return int(layers.shape[0]) * int(layers.shape[-1]) ** 2
        return max(int(layer.shape[0]) * int(layer.shape[-1]) ** 2 for layer in layers)
    except (AttributeError, IndexError, TypeError, ValueError):
        return 0  # invalid input: _prepare_layers says why


@contextlib.contextmanager
def _selection_threads(layers: Any = None) -> Iterator[None]:
    """Run the enclosed CPU work on ``SELECTION_THREADS`` threads, restoring torch's setting after."""
    previous = torch.get_num_threads()
    if (SELECTION_THREADS is None or SELECTION_THREADS == previous
            or _layer_work(layers) > SELECTION_THREADS_MAX_WORK):
        yield
        return
    torch.set_num_threads(SELECTION_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _on_selection_threads(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """Run ``fn`` (whose first argument is the layers) inside ``_selection_threads``."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with _selection_threads(args[0] if args else kwargs.get("layers")):
            return fn(*args, **kwargs)

    return wrapper


@dataclass
class LayerSelection:
    """The layers a selector chose, how every candidate scored, and the fused features.

    Attributes:
        layers: Chosen layer indices (0-based positions in the input list), in the order chosen.
        scores: One row per scored candidate. LOES, greedy ridge and best-single tables have columns
            ``step, layer, ridge_loss, iso, red, tri, total, selected``; a term that does not enter
            ``total`` at that step (Red and Tri at step 0, Tri for regression, the ridge loss and
            Tri without labels) is NaN. Exhaustive and last-layer tables have one row per evaluated
            subset, with columns ``layers`` (a tuple), ``size``, ``ridge_loss``, ``total``,
            ``selected``.
        method: Name of the selector (a key of ``SELECTORS``).
        variant: ``ripieno`` or ``reference`` (LOES; the baselines are ``ripieno``).
        task: ``classification``, ``regression`` or ``label_free``.
        fused: ``(N, sum D)`` fused calibration features: the chosen layers concatenated in chosen
            order, or, if ``orthogonal``, the centred first layer followed by each later layer's part
            orthogonal to the layers chosen before it. Built from the calibration layers when first
            read (a property): the layer pipeline needs only ``layers``, and the copy is as large as
            the chosen layers (float64 for ours).
        orthogonal: Which of the two ``fused`` holds (the default of ``transform``).
        layer_dims: Feature width of every input layer, checked by ``transform``.
    """

    layers: list[int]
    scores: pd.DataFrame = field(repr=False)
    method: str
    task: str
    orthogonal: bool
    layer_dims: list[int] = field(repr=False)
    _first_mean: Tensor = field(repr=False)
    _residualizers: list[Residualizer] | None = field(repr=False)
    _dtype: torch.dtype = field(repr=False)  # of the fused and transformed features
    variant: str = "ripieno"
    # The chosen calibration layers, kept until both the fused features and the residualizers are built.
    _calibration: list[Tensor] | None = field(default=None, repr=False)
    _fused: Tensor | None = field(default=None, repr=False)

    @property
    def fused(self) -> Tensor:
        """``(N, sum D)`` fused calibration features (see the class docstring); built on first read."""
        if self._fused is None:
            assert self._calibration is not None
            self._fused = self._fuse(self._calibration)
            if self._residualizers is not None:
                self._calibration = None
        return self._fused

    def _fitted_residualizers(self) -> list[Residualizer]:
        """The orthogonalisation maps, fitted on the calibration layers the first time they are needed."""
        if self._residualizers is None:
            assert self._calibration is not None
            chosen = [layer.to(self._dtype) for layer in self._calibration]
            self._residualizers = [fit_residualizer(chosen[j], torch.cat(chosen[:j], dim=1))
                                   for j in range(1, len(chosen))]
            if self._fused is not None:
                self._calibration = None
        return self._residualizers

    @_without_autocast
    def transform(self, layers: LayerInput, orthogonal: bool | None = None) -> Tensor:
        """Fuse new data (e.g. the test split) the way ``fused`` was built from calibration data.

        Orthogonal parts reuse the calibration means and least-squares maps, so the transform is a
        fixed linear map of the new features.

        Args:
            layers: The same layers as at selection (every layer, same widths), for any ``N``.
            orthogonal: Override ``self.orthogonal``.

        Returns:
            ``(N, sum D)`` fused features, in the dtype used for selection.
        """
        views = _prepare_layers(layers, self._dtype, device=self._first_mean.device, keep_narrower=True)
        dims = [v.shape[1] for v in views]
        if dims != self.layer_dims:
            raise ValueError(
                f"transform got layers of widths {dims} but the selection was made on widths "
                f"{self.layer_dims}; pass all layers of the same model, in the same order."
            )
        return self._fuse([views[i] for i in self.layers], orthogonal)

    @_without_autocast
    def _fuse(self, chosen: list[Tensor], orthogonal: bool | None = None) -> Tensor:
        """The fused features from the chosen layers (validated; narrower dtypes converted), in order."""
        dtype = self._dtype
        if not (self.orthogonal if orthogonal is None else orthogonal):
            if all(layer.dtype == dtype for layer in chosen):
                return torch.cat(chosen, dim=1)
            # Converted straight into the result: no converted copy of each layer first.
            width = sum(layer.shape[1] for layer in chosen)
            return torch.cat(chosen, dim=1, out=chosen[0].new_empty(chosen[0].shape[0], width, dtype=dtype))
        chosen = [layer.to(dtype) for layer in chosen]
        parts = [chosen[0] - self._first_mean]
        for i, residualizer in enumerate(self._fitted_residualizers(), start=1):
            parts.append(residualizer(chosen[i], torch.cat(chosen[:i], dim=1)))
        return torch.cat(parts, dim=1)


@dataclass(frozen=True)
class _Targets:
    task: str
    matrix: Tensor | None  # (N, T) regression targets or one-hot labels
    labels: Tensor | None  # (N,) class indices, classification only
    num_classes: int


def _to_tensor(value: Any, name: str) -> Tensor:
    if isinstance(value, Tensor):
        return value.detach()
    try:
        return torch.as_tensor(np.asarray(value))
    except (TypeError, ValueError) as error:
        kind = type(value).__name__
        raise ValueError(f"{name} must be a numpy array or torch tensor; got {kind}.") from error


def _prepare_layers(
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
        view = _to_tensor(layer, f"layer {i}")
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


def _prepare_targets(
    y: ArrayLike | None, n: int, task: Task, dtype: torch.dtype, device: torch.device
) -> _Targets:
    """Validate ``y`` against ``task`` and build the ridge targets (one-hot for classification)."""
    if task not in ("auto", "classification", "regression", "label_free"):
        raise ValueError(f"Unknown task {task!r}; use auto, classification, regression or label_free.")
    if y is None:
        if task in ("classification", "regression"):
            raise ValueError(f"task={task!r} needs targets y; pass y, or y=None with task='label_free'.")
        return _Targets("label_free", None, None, 0)
    if task == "label_free":
        raise ValueError("task='label_free' uses no targets; pass y=None, or choose another task.")
    target = _to_tensor(y, "y").to(device)
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
        return _Targets("regression", matrix.reshape(n, -1), None, 0)
    return _classification_targets(target, dtype)


def _classification_targets(target: Tensor, dtype: torch.dtype) -> _Targets:
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
    return _Targets("classification", onehot, labels, num_classes)


def _check_k(k: int, num_layers: int) -> None:
    if not isinstance(k, int | np.integer) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}.")
    if k > num_layers:
        raise ValueError(f"k={k} exceeds the {num_layers} layers given; use k <= {num_layers}.")


def _check_weights(**weights: float) -> None:
    for name, value in weights.items():
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value}.")


def _require_targets(targets: _Targets, method: str) -> None:
    if targets.matrix is None:
        raise ValueError(
            f"{method} ranks layers by a ridge probe and needs targets y; for label-free selection "
            "use select_layers(layers, y=None, k=...)."
        )


def _total_variance(x: Tensor) -> Tensor:
    return (x - x.mean(dim=0)).square().sum(dim=1).mean()


def _build_result(
    views: list[Tensor],
    chosen: list[int],
    scores: pd.DataFrame,
    method: str,
    task: str,
    orthogonal: bool,
    variant: str = "ripieno",
    dtype: torch.dtype | None = None,
) -> LayerSelection:
    """The selection's result; ``views`` narrower than ``dtype`` (default: theirs) are converted."""
    first = views[chosen[0]]
    dtype = dtype or first.dtype
    return LayerSelection(
        layers=list(chosen),
        scores=scores,
        method=method,
        task=task,
        variant=variant,
        orthogonal=orthogonal,
        layer_dims=[v.shape[1] for v in views],
        _first_mean=first.mean(dim=0, dtype=dtype),
        _residualizers=None,
        _dtype=dtype,
        _calibration=[views[i] for i in chosen],
    )


def _prepare(
    layers: LayerInput, y: ArrayLike | None, task: Task, dtype: torch.dtype, keep_narrower: bool = False
) -> tuple[list[Tensor], _Targets]:
    views = _prepare_layers(layers, dtype, keep_narrower=keep_narrower)
    return views, _prepare_targets(y, views[0].shape[0], task, dtype, views[0].device)


@_without_autocast
@_on_selection_threads
def select_layers(
    layers: LayerInput,
    y: ArrayLike | None = None,
    k: int = 2,
    *,
    variant: Variant = "ripieno",
    task: Task = "auto",
    lam: float = 1e-3,
    alpha: float = 1.0,
    gamma: float = 0.5,
    eta: float = 0.1,
    iso: IsoKind | None = None,
    loss: RidgeLossKind | None = None,
    orthogonal: bool = False,
    max_triples: int | None = None,
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> LayerSelection:
    """Select ``k`` layers with LOES, as the reference code does or as ripieno does.

    ``variant="reference"`` runs the public reference algorithm exactly
    (``ripieno.framework.loes.reference``, checked against its recorded outputs), with its defaults
    (``alpha=1, gamma=0.5, eta=0.1, lam=1e-3``) and in its dtype, float32. ``variant="ripieno"``
    runs our rule (module docstring), whose differences from the reference are each deliberate.

    Args:
        layers: ``L`` arrays ``(N, D_l)`` (numpy or torch), or one ``(N, L, D)`` array.
        y: Class indices ``(N,)`` in ``0..C-1``, regression targets ``(N,)``/``(N, T)``, or ``None``
            for label-free selection.
        k: Number of layers to select, ``1 <= k <= L``.
        variant: ``ripieno`` (default) or ``reference``.
        task: ``auto`` infers ``label_free`` from ``y=None``, ``classification`` from integer or bool
            ``y`` and ``regression`` from floating ``y``.
        lam: Ridge penalty of the probe (sklearn's ``alpha``), ``> 0``.
        alpha: Weight of ``1 - Iso``.
        gamma: Weight of Red.
        eta: Weight of Tri (classification only).
        iso: ``ripieno`` only: ``participation`` (default, Iso in ``[0, 1]``) or ``mean_std`` (the
            reference's definition, unbounded).
        loss: ``ripieno`` only: ridge loss, ``train`` (default, in-sample MSE) or ``loo``
            (leave-one-out MSE).
        orthogonal: Build ``fused`` from orthogonalised parts instead of the raw layers.
        max_triples: ``ripieno`` only: most class triples Tri averages over (default 2000). The
            reference draws ``min(200, 3C)`` random triplets.
        seed: Seed for Tri's triple sample (``ripieno``: only with more than ``max_triples``
            triples; ``reference``: every Tri draw).
        dtype: Computation dtype: float64 for ``ripieno``, float32 (as the reference) for
            ``reference`` unless given.

    Returns:
        The ``LayerSelection``.

    Raises:
        ValueError: On bad inputs, or an option that the chosen variant does not have.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> y = torch.randint(0, 3, (200,), generator=g)
        >>> signal = torch.nn.functional.one_hot(y, 3).float() @ torch.randn(3, 8, generator=g)
        >>> layers = [torch.randn(200, 8, generator=g) + w * signal for w in (0.0, 0.5, 3.0)]
        >>> select_layers(layers, y, k=1, variant="reference", alpha=0.0).layers  # the best probe
        [2]
        >>> select_layers(layers, y, k=1, variant="reference").layers  # unbounded Iso: pure noise wins
        [0]
    """
    if variant not in VARIANTS:
        raise ValueError(f"Unknown LOES variant {variant!r}; use one of {VARIANTS}.")
    if variant == "reference":
        given = {name: value for name, value in
                 (("iso", iso), ("loss", loss), ("max_triples", max_triples)) if value is not None}
        if given:
            raise ValueError(
                f"{sorted(given)} are options of variant='ripieno'; the reference has one ridge loss "
                "(in-sample), one Iso (mean/std) and draws min(200, 3C) Tri triplets. Drop them, or use "
                "variant='ripieno'."
            )
        views, targets = _prepare(layers, y, task, dtype or torch.float32)
        _check_k(k, len(views))
        _check_weights(lam=lam, alpha=alpha, gamma=gamma, eta=eta)
        _check_lam(lam)
        chosen, rows = reference_greedy(
            views, targets.matrix, targets.labels, targets.num_classes, k,
            ReferenceWeights(alpha=alpha, gamma=gamma, eta=eta, reg=lam), seed,
        )
        scores = pd.DataFrame(rows, columns=SCORE_COLUMNS)
        return _build_result(views, chosen, scores, "loes", targets.task, orthogonal, variant="reference")
    dtype = dtype or torch.float64
    views, targets = _prepare(layers, y, task, dtype, keep_narrower=True)
    _check_k(k, len(views))
    _check_weights(lam=lam, alpha=alpha, gamma=gamma, eta=eta)
    weights = _Weights(lam, alpha, gamma, eta, iso or "participation", loss or "train",
                       2000 if max_triples is None else max_triples, seed)
    chosen, scores = _greedy(views, targets, k, weights, dtype)
    return _build_result(views, chosen, scores, "loes", targets.task, orthogonal, dtype=dtype)


def _check_lam(lam: float) -> None:
    if not lam > 0:
        raise ValueError(f"Ridge needs lam > 0, got {lam}; use a small positive value such as 1e-3.")


@dataclass(frozen=True)
class _Weights:
    lam: float
    alpha: float
    gamma: float
    eta: float
    iso: IsoKind
    loss: RidgeLossKind
    max_triples: int
    seed: int


def _greedy(
    views: list[Tensor], targets: _Targets, k: int, weights: _Weights, dtype: torch.dtype | None = None
) -> tuple[list[int], pd.DataFrame]:
    """The greedy loop: score every remaining candidate, keep the argmin, refit the residual targets.

    Steps are scored by ``_GramScorer`` (the same values from cached Gram blocks); a step it cannot
    reproduce exactly (see ``_GramScorer.score_step``), and every step after it, is scored candidate by
    candidate by ``_score_candidate`` from the features themselves. ``views`` narrower than ``dtype``
    (the computation dtype, default: theirs) are converted where they are read.
    """
    dtype = dtype or views[0].dtype
    if targets.matrix is not None:
        _check_lam(weights.lam)  # as ridge_loss would
    chosen: list[int] = []
    rows: list[dict[str, Any]] = []
    scorer = _GramScorer.create(views, targets, weights, dtype)
    for step in range(k):
        step_rows = scorer.score_step(chosen) if scorer is not None else None
        if step_rows is None:
            scorer = None
            views = [v.to(dtype) for v in views]
            step_rows = _direct_step(views, chosen, targets, weights)
        best = min(step_rows, key=lambda row: row["total"])
        for row in step_rows:
            row["step"], row["selected"] = step, row is best
        chosen.append(best["layer"])
        rows.extend(step_rows)
    return chosen, pd.DataFrame(rows, columns=SCORE_COLUMNS)


def _direct_step(
    views: list[Tensor], chosen: list[int], targets: _Targets, weights: _Weights
) -> list[dict[str, Any]]:
    """One greedy step scored from the (orthogonalised) features of every candidate."""
    fit_target = targets.matrix
    if chosen and targets.matrix is not None:
        selected = torch.cat([views[i] for i in chosen], dim=1)
        fit_target = targets.matrix - ridge_fit(selected, targets.matrix, weights.lam).predict(selected)
    basis = span_basis(torch.cat([views[i] for i in chosen], dim=1)) if chosen else None
    return [
        _score_candidate(views, chosen, layer, fit_target, targets, weights, basis)
        for layer in range(len(views))
        if layer not in chosen
    ]


def _total(weights: _Weights, ridge: float, iso: float, red: float, tri: float) -> float:
    """The LOES score: ``alpha (1 - Iso) + ridge + gamma Red - eta Tri``, leaving out NaN terms."""
    total = weights.alpha * (1.0 - iso)
    if not math.isnan(ridge):
        total += ridge
    if not math.isnan(red):
        total += weights.gamma * red
    if not math.isnan(tri):
        total -= weights.eta * tri
    return total


#: ``orthogonalize``'s ``null_tol``: a residual this small relative to the candidate scores as zeros.
_NULL_TOL = 1e-6
#: How far (a lower bound of) the smallest kept singular value of the selection must clear the rank
#: cutoff, and how far below it the dropped ones must lie, for the block basis to keep what the
#: joint SVD of ``span_basis`` keeps; otherwise the step is scored from the features.
_KEEP_MARGIN, _DROP_MARGIN = 10.0, 4.0
#: Most null directions of a residual Gram that ``_deflated_block`` removes (a few exact linear
#: constraints, such as LayerNorm's one per row); with more, ``eigh`` decides.
_DEFLATE_MAX = 4
#: Inverse subspace iterations ``_deflated_block`` runs: a null direction converges by the ratio of
#: the cutoff to the smallest kept eigenvalue per iteration, at most 1e-2 where the split is clear.
_DEFLATE_ITERATIONS = 3


@dataclass
class _Block:
    """One block ``U_j = sum_i Xc_{c_i} T[i]`` of the orthonormal basis of the selected span.

    ``U_j`` spans the part of the ``j``-th chosen layer orthogonal to the blocks before it.
    """

    layer: int
    t: list[Tensor]  # T[i]: (D_{c_i}, r_j), i <= j
    s_low: float  # lower bound of the largest singular value of the layer's residual (kept or not)
    s_high: float  # upper bound of it (both exact when the block comes from an eigendecomposition)
    dropped_max: float  # largest singular value below the cutoff (0 if none)


def _shifted(matrix: Tensor, shift: float) -> Tensor:
    """``matrix + shift I`` (a copy)."""
    out = matrix.clone()
    out.diagonal().add_(shift)
    return out


@dataclass
class _StepFit:
    """The residual targets of one step and what every candidate's probe needs of them."""

    residual: Tensor  # Rc (N, T), centred
    coef: list[Tensor]  # ridge coefficients of the fit on each chosen layer (D_{c_i}, T)
    units: list[Tensor]  # U_j^T Rc for every block
    sq: Tensor  # ||Rc||_F^2


def _centred_copy(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x - mean(x)`` in ``dtype``, centred in place in one new tensor (one allocation, not two)."""
    out = x.to(dtype, copy=True)
    return out.sub_(out.mean(dim=0, keepdim=True))


class _GramScorer:
    """Scores LOES steps exactly as ``_score_candidate`` does, from Gram blocks instead of features.

    Hand-written linear algebra because no library routine scores many orthogonalised ridge probes
    that share one basis: this reuses every per-layer product across candidates and steps.

    With ``Xc_l`` the centred layers and ``c_1..c_t`` the chosen ones:

    * the basis of the selected span (``span_basis``) is built one block per chosen layer from the
      chosen layer's residual Gram ``G~`` (its Gram after projecting out the earlier blocks):
      ``U_j = H~ L^-T`` from its Cholesky factor where it is clearly full rank, the same after
      removing a few null directions (``_deflated_block``: LayerNorm outputs), else from its
      eigenvectors, ``U_j = H~ V / s`` keeping ``s`` above ``span_basis``'s cutoff. While the
      spectrum is clearly split at the cutoff (``_KEEP_MARGIN``, ``_DROP_MARGIN``) this spans what the
      joint SVD keeps; otherwise ``score_step`` declines and the step is scored from the features;
    * each block is held as coefficients on the chosen layers, so a candidate's coordinates
      ``A_j = U_j^T Xc = sum_i T_ij^T (Xc_{c_i}^T Xc)`` need one new cross-Gram block per step;
      its orthogonalised part ``H~ = Xc - U A`` has Gram ``G~ = Xc^T Xc - sum_j A_j^T A_j``;
    * ridge: ``W = (G~ + lam I)^-1 b``, ``b = H~^T Rc = Xc^T Rc - A^T U^T Rc`` (``Xc^T Rc`` itself from
      ``Xc^T Y`` and the cross blocks); the in-sample loss is ``||Rc||^2 - b.W - lam ||W||^2`` (or the
      residual ``Rc - Xc W + U (A W)`` where that sum would lose digits to cancellation); the
      leave-one-out loss needs each row's leverage ``1/N + ||L^-1 h~_i||^2`` (``L`` the Cholesky
      factor), so for it ``H~`` is kept per candidate, updated by one block per step;
    * Iso from ``tr G~`` and ``||G~||_F`` (or the eigenvalues of ``G~ / N``), Red from the cross
      blocks, Tri from class means (linear in the features);
    * the residual targets come from the ridge fit on the chosen layers, whose Cholesky factor grows
      by one block row per step.
    """

    def __init__(self, views: list[Tensor], targets: _Targets, weights: _Weights, dtype: torch.dtype) -> None:
        self.views, self.targets, self.weights = views, targets, weights
        self.n = views[0].shape[0]
        self.loo = targets.matrix is not None and weights.loss == "loo"
        self.xc = [_centred_copy(v, dtype) for v in views]
        self.gram = [gram_matrix(x) for x in self.xc]
        self.sq = [g.diagonal().sum() for g in self.gram]  # ||Xc||_F^2
        self.gram_norm = [torch.linalg.matrix_norm(g) for g in self.gram]
        self.resid_gram = list(self.gram)  # G~ of every layer against the blocks so far
        self.coords: list[list[Tensor]] = [[] for _ in views]  # A_j of every layer, one per block
        self.resid = list(self.xc) if self.loo else None  # H~ of every layer (leave-one-out only)
        self.cross: dict[tuple[int, int], Tensor] = {}  # (chosen, other) -> Xc_chosen^T Xc_other
        self.cross_square: dict[tuple[int, int], Tensor] = {}  # the same -> its squared Frobenius norm
        self.blocks: list[_Block] = []
        # Block rows of the lower Cholesky factor of Sc^T Sc + lam I: row i holds L_i0 .. L_ii.
        self.fit_rows: list[list[Tensor]] = []
        self.first_factors: dict[int, Tensor] = {}  # step 0's chol(Xc^T Xc + lam I) of every layer
        self.yc = None if targets.matrix is None else targets.matrix - targets.matrix.mean(dim=0)
        self.xty = None if self.yc is None else [thin_matmul(x.T, self.yc) for x in self.xc]  # Xc^T Yc
        self.tri = targets.labels is not None and targets.num_classes >= 3
        self.class_means = None
        if self.tri:
            assert targets.labels is not None
            self.class_means = [class_centroids(x, targets.labels, targets.num_classes) for x in self.xc]

    @classmethod
    def create(
        cls, views: list[Tensor], targets: _Targets, weights: _Weights, dtype: torch.dtype
    ) -> _GramScorer | None:
        """The scorer, or ``None`` when a layer is wider than the sample count (the dual forms)."""
        n = views[0].shape[0]
        if any(v.shape[1] > n for v in views):
            return None
        return cls(views, targets, weights, dtype)

    @property
    def chosen(self) -> list[int]:
        return [block.layer for block in self.blocks]

    def score_step(self, chosen: list[int]) -> list[dict[str, Any]] | None:
        """Score every candidate not in ``chosen`` (this scorer's choices plus at most one new layer).

        Returns:
            One row per candidate, or ``None`` if this step cannot be reproduced from the blocks (a
            selection wider than the sample count, or a spectrum too close to the rank cutoff).
        """
        if len(chosen) > len(self.blocks):
            if len(chosen) != len(self.blocks) + 1 or not self._add_block(chosen[-1]):
                return None
        candidates = [layer for layer in range(len(self.views)) if layer not in chosen]
        fit = self._fit_residual()
        tri_means = self._basis_class_means() if self.tri and self.blocks else None
        gs_norm = self._selection_gram_norm() if self.blocks else None
        return [self._score(layer, fit, tri_means, gs_norm) for layer in candidates]

    # ------------------------------------------------------------------ basis of the selected span

    def _add_block(self, layer: int) -> bool:
        """Append the block of a newly chosen layer and project every other layer on it."""
        dims = sum(self.views[i].shape[1] for i in self.chosen) + self.views[layer].shape[1]
        if dims > self.n:  # span_basis takes its SVD branch there
            return False
        eps = torch.finfo(self.resid_gram[layer].dtype).eps
        maxdim = max(self.n, dims)
        factor = max(maxdim * eps, math.sqrt(maxdim * eps))  # span_basis's cutoff over s_max
        members = [*self.chosen, layer]
        block = self._cholesky_block(layer, factor, members)
        if block is None:
            block = self._deflated_block(layer, factor, members)
        if block is None:
            block = self._eigh_block(layer, factor, members)
            if block is None:
                return False
        u = None
        if self.resid is not None:  # U_new itself, to update the leave-one-out residual features
            u = self.resid[layer] @ block.t[-1]
        # Every other layer: one cross-Gram block, its coordinates on the new block, its residual.
        self.blocks.append(block)
        for other in range(len(self.views)):
            if other in members:
                continue
            self.cross[(layer, other)] = self.xc[layer].T @ self.xc[other]
            coords = sum(t.T @ self.cross[(c, other)] for t, c in zip(block.t, members, strict=True))
            assert isinstance(coords, Tensor)
            self.coords[other].append(coords)
            self.resid_gram[other] = torch.addmm(self.resid_gram[other], coords.T, coords, alpha=-1)
            if self.resid is not None and u is not None:
                if self.resid[other] is self.xc[other]:  # the first block: H~ stops sharing Xc's memory
                    self.resid[other] = torch.addmm(self.resid[other], u, coords, alpha=-1)
                else:
                    self.resid[other].addmm_(u, coords, alpha=-1)
        self._extend_fit_factor(layer)
        return True

    def _selection_low(self, s_low: float, members: list[int]) -> float:
        """A lower bound of the whole selection's largest singular value, given the new block's ``s_low``.

        Exact for one layer from its spectrum, else the largest block singular value or Gram
        diagonal below it.
        """
        if not self.blocks:
            return s_low
        return math.sqrt(max(s_low**2, *(b.s_low**2 for b in self.blocks),
                             *(float(self.gram[i].diagonal().max()) for i in members)))

    def _new_block(self, layer: int, base: Tensor, s_low: float, s_high: float, dropped_max: float) -> _Block:
        """The block ``U_new = (Xc - sum_j U_j A_j) base`` of a chosen layer, as coefficients."""
        t_new: list[Tensor] = []
        for i in range(len(self.blocks)):
            t_new.append(-sum(self.blocks[j].t[i] @ (self.coords[layer][j] @ base)
                              for j in range(i, len(self.blocks))))
        t_new.append(base)
        return _Block(layer, t_new, s_low, s_high, dropped_max)

    def _cholesky_block(self, layer: int, factor: float, members: list[int]) -> _Block | None:
        """The new block from the Cholesky factor ``L`` of the residual Gram, ``base = L^-T``.

        ``U = H~ L^-T`` is orthonormal and spans all of ``H~``: the joint SVD keeps every direction
        when the smallest singular value, at least ``1 / ||L^-1||_F``, clears the cutoff by
        ``_split_is_clear``'s margins (with ``s_max`` bracketed by the Gram's largest diagonal
        entry and its Frobenius norm). A Cholesky factor and a triangular inverse cost about a
        fifth of ``eigh``'s eigenvectors; ``None`` (declined: ``_eigh_block`` decides) when the
        factorisation fails or the margins do not hold.
        """
        gram = self.resid_gram[layer]
        chol, info = torch.linalg.cholesky_ex(gram)
        s_low = math.sqrt(max(float(gram.diagonal().max()), 0.0))
        # 1 / ||L^-1||_F <= min L_ii and s_max of the selection >= s_low: a pivot this small is sure
        # to fail the margin, so decline before the inverse. Hidden states right after a LayerNorm
        # get here: one exact linear constraint per row makes their Gram singular.
        if int(info) != 0 or float(chol.diagonal().min()) < _KEEP_MARGIN * factor * s_low:
            return None
        eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
        base = torch.linalg.solve_triangular(chol, eye, upper=False).T  # L^-T, upper triangular
        if not bool(torch.isfinite(base).all()):
            return None
        s_high = math.sqrt(float(torch.linalg.matrix_norm(gram)))
        block = self._new_block(layer, base, s_low, s_high, 0.0)
        low = self._selection_low(s_low, members)
        return block if self._split_is_clear([*self.blocks, block], factor, low) else None

    def _deflated_block(self, layer: int, factor: float, members: list[int]) -> _Block | None:
        """The new block from a Cholesky factor once a few null directions of the residual Gram are removed.

        Hidden states right after a LayerNorm obey one exact linear constraint per row, so their
        residual Gram ``G`` has a null direction and ``_cholesky_block`` declines it. Here inverse
        subspace iteration with the factor of ``G + delta I`` (``delta`` the squared cutoff) finds
        the eigenvectors ``W`` of ``G`` below the cutoff; ``L L^T = G + c W W^T`` is then positive
        definite, and with ``Q`` an orthonormal basis of the complement of ``L^-1 W``,
        ``base = L^-T Q`` gives ``U = H~ base`` with ``U^T U = Q^T (I - c L^-1 W W^T L^-T) Q = I``,
        spanning ``H~`` on the complement of ``W``: what ``eigh`` keeps when the spectrum is split.
        The dropped part is at most ``||H~ W||``, and ``_split_is_clear`` checks the margins as for
        the other bases. Two Cholesky factors and a triangular inverse cost about a third of
        ``eigh`` at ``D = 384`` (2-core EPYC). ``None`` (``eigh`` decides) when a factorisation
        fails, no or more than ``_DEFLATE_MAX`` directions lie below the cutoff, or the split is not
        clear.
        """
        gram = self.resid_gram[layer]
        d = gram.shape[0]
        s_low = math.sqrt(max(float(gram.diagonal().max()), 0.0))
        count = _DEFLATE_MAX + 2  # two guard vectors beyond the most directions removed
        if s_low == 0 or d <= count:
            return None
        low = self._selection_low(s_low, members)
        shifted, info = torch.linalg.cholesky_ex(_shifted(gram, (factor * low) ** 2))
        if int(info) != 0:
            return None
        # A fixed start from a local generator: no random numbers drawn from the caller's streams.
        start = torch.Generator(device=gram.device).manual_seed(0)
        basis = torch.randn(d, count, generator=start, dtype=gram.dtype, device=gram.device)
        for _ in range(_DEFLATE_ITERATIONS):
            basis = torch.linalg.qr(cholesky_solve(basis, shifted)).Q
        ritz, vectors = torch.linalg.eigh(basis.T @ gram @ basis)
        drop = int((ritz <= (factor * low / _DROP_MARGIN) ** 2).sum())
        if not 0 < drop <= _DEFLATE_MAX:
            return None
        null = basis @ vectors[:, :drop]
        scale = s_low**2
        chol, info = torch.linalg.cholesky_ex(torch.addmm(gram, null, null.T, alpha=scale))
        if int(info) != 0:
            return None
        eye = torch.eye(d, dtype=gram.dtype, device=gram.device)
        inverse = torch.linalg.solve_triangular(chol, eye, upper=False)  # L^-1
        reflectors, tau = torch.geqrf(math.sqrt(scale) * (inverse @ null))
        base = torch.ormqr(reflectors, tau, inverse.T, left=False)[:, drop:]  # L^-T Q, Q's complement part
        if not bool(torch.isfinite(base).all()):
            return None
        dropped = math.sqrt(max(float(torch.linalg.eigvalsh(null.T @ gram @ null).max()), 0.0))
        s_high = math.sqrt(float(torch.linalg.matrix_norm(gram)))
        block = self._new_block(layer, base, s_low, s_high, dropped)
        return block if self._split_is_clear([*self.blocks, block], factor, low) else None

    def _eigh_block(self, layer: int, factor: float, members: list[int]) -> _Block | None:
        """The new block from the eigenvectors ``V`` of the residual Gram: ``base = V / s``, kept ``s``.

        ``None`` when the spectrum is not clearly split at the cutoff (the step is then scored from
        the features).
        """
        evals, vecs = torch.linalg.eigh(self.resid_gram[layer])
        s = evals.clamp_min(0).sqrt()
        s_max = float(s.max())
        low = self._selection_low(s_max, members)
        keep = s > factor * low
        dropped = s[~keep]
        block = self._new_block(layer, vecs[:, keep] / s[keep], s_max, s_max,
                                float(dropped.max()) if dropped.numel() else 0.0)
        if self.blocks and not self._split_is_clear([*self.blocks, block], factor, low):
            return None
        return block

    def _split_is_clear(self, blocks: list[_Block], factor: float, low: float) -> bool:
        """Whether the joint SVD keeps exactly the blocks' kept directions.

        The selection is ``U R + E`` with ``E`` the dropped parts (``||E|| <= e``) and ``T`` a right
        inverse of ``R``, so its kept singular values are at least ``1/||T||_F - 2e`` and the others
        at most ``e``; ``s_max`` lies between ``low`` and the root of the summed squared norms.
        """
        high = math.sqrt(blocks[0].s_high ** 2 + sum(float(self.gram_norm[b.layer]) for b in blocks[1:]))
        e = math.sqrt(sum(b.dropped_max**2 for b in blocks))
        t_norm = math.sqrt(sum(float(t.square().sum()) for b in blocks for t in b.t))
        kept_low = math.inf if t_norm == 0 else 1.0 / t_norm - 2 * e
        return kept_low >= _KEEP_MARGIN * factor * high and e <= factor * low / _DROP_MARGIN

    # ------------------------------------------------------------------ residual targets

    def _extend_fit_factor(self, layer: int) -> None:
        """Grow the Cholesky factor of ``Sc^T Sc + lam I`` by the newly chosen layer's block row.

        Kept as blocks (``fit_rows``): the solves run block by block, without assembling the whole
        triangular factor (a ``(sum D)^2`` copy per step).
        """
        if self.yc is None:
            return
        if not self.fit_rows:  # the first chosen layer's own probe factor, from step 0
            first = self.first_factors.get(layer)
            self.fit_rows = [[torch.linalg.cholesky(_shifted(self.gram[layer], self.weights.lam))
                              if first is None else first]]
            self.first_factors.clear()
            return
        w = self._forward_solve([self.cross[(c, layer)] for c in self.chosen[:-1]])
        schur = _shifted(self.gram[layer], self.weights.lam)
        for part in w:
            schur.addmm_(part.T, part, alpha=-1)
        self.fit_rows.append([part.T for part in w] + [torch.linalg.cholesky(schur)])

    def _forward_solve(self, rhs: list[Tensor]) -> list[Tensor]:
        """``L^-1 b`` by block rows, for ``b`` split as the chosen layers (as many blocks as rows)."""
        out: list[Tensor] = []
        for row, b in zip(self.fit_rows, rhs, strict=False):
            for m, solved in enumerate(out):
                b = torch.addmm(b, row[m], solved, alpha=-1)
            out.append(torch.linalg.solve_triangular(row[-1], b, upper=False))
        return out

    def _fit_solve(self, rhs: list[Tensor]) -> list[Tensor]:
        """``(Sc^T Sc + lam I)^-1 b`` by block forward and back substitution."""
        z = self._forward_solve(rhs)
        out: list[Tensor] = [z[0]] * len(z)
        for i in reversed(range(len(z))):
            b = z[i]
            for m in range(i + 1, len(z)):
                b = torch.addmm(b, self.fit_rows[m][i].T, out[m], alpha=-1)
            out[i] = torch.linalg.solve_triangular(self.fit_rows[i][i].T, b, upper=True)
        return out

    def _fit_residual(self) -> _StepFit | None:
        """The step's residual targets: ``Y`` minus the ridge fit on the chosen layers (``Y`` at step 0)."""
        if self.yc is None:
            return None
        coef: list[Tensor] = []
        residual = self.yc
        if self.blocks:
            assert self.fit_rows and self.xty is not None
            chosen = self.chosen
            coef = self._fit_solve([self.xty[c] for c in chosen])
            residual = self.yc - sum(thin_matmul(self.xc[c], part)
                                     for c, part in zip(chosen, coef, strict=True))
            residual = residual - residual.mean(dim=0)
        # U_j^T Rc from Xc_{c_i}^T Rc = Xc_{c_i}^T Yc - sum_m (Xc_{c_i}^T Xc_{c_m}) coef_m.
        chosen = self.chosen
        products = [self._chosen_targets(i, coef) for i in range(len(chosen))]
        units = [sum(t.T @ p for t, p in zip(b.t, products, strict=False)) for b in self.blocks]
        return _StepFit(residual, coef, units, residual.square().sum())

    def _chosen_targets(self, i: int, coef: list[Tensor]) -> Tensor:
        """``Xc_{c_i}^T Rc`` for the ``i``-th chosen layer, from its Gram and cross blocks."""
        assert self.xty is not None
        chosen = self.chosen
        out = self.xty[chosen[i]]
        for m, part in enumerate(coef):
            a, b = chosen[i], chosen[m]
            block = self.gram[a] if m == i else self.cross[(a, b)] if m > i else self.cross[(b, a)].T
            out = out - thin_matmul(block, part)
        return out

    def _apply_basis(self, coords: list[Tensor]) -> Tensor:
        """``sum_j U_j y_j`` for coordinates ``y_j`` ``(r_j, T)``."""
        chosen = self.chosen
        per_layer = [sum(self.blocks[j].t[i] @ coords[j] for j in range(i, len(self.blocks)))
                     for i in range(len(chosen))]
        return sum(thin_matmul(self.xc[c], w) for c, w in zip(chosen, per_layer, strict=True))

    def _basis_class_means(self) -> list[Tensor]:
        assert self.class_means is not None
        chosen = self.chosen
        return [sum(self.class_means[c] @ t for c, t in zip(chosen, b.t, strict=False)) for b in self.blocks]

    def _selection_gram_norm(self) -> Tensor:
        """``||Sc^T Sc||_F`` from the chosen layers' Grams and cross blocks."""
        chosen = self.chosen
        total = sum(self.gram_norm[c].square() for c in chosen)
        for i, a in enumerate(chosen):
            for b in chosen[i + 1:]:
                total = total + 2 * self._cross_square(a, b)
        return total.sqrt()

    def _cross_square(self, chosen: int, other: int) -> Tensor:
        """``||Xc_chosen^T Xc_other||_F^2``, once per block (every later step reads it again)."""
        key = (chosen, other)
        if key not in self.cross_square:
            flat = self.cross[key].reshape(-1)  # a view: the block is one GEMM's contiguous output
            self.cross_square[key] = torch.dot(flat, flat)
        return self.cross_square[key]

    # ------------------------------------------------------------------ one candidate

    def _score(
        self, layer: int, fit: _StepFit | None, tri_means: list[Tensor] | None, gs_norm: Tensor | None
    ) -> dict[str, Any]:
        w = self.weights
        nan = float("nan")
        ridge = red = tri = nan
        gram = self.resid_gram[layer]
        trace, norm = gram.diagonal().sum(), torch.linalg.matrix_norm(gram)
        null = bool(self.blocks) and bool(trace.clamp_min(0).sqrt() <= _NULL_TOL * self.sq[layer].sqrt())
        if fit is not None:
            ridge = float(self._ridge(layer, fit, null, norm))
        if self.blocks:
            assert gs_norm is not None
            cross = sum(self._cross_square(c, layer) for c in self.chosen)
            norms = self.gram_norm[layer] * gs_norm
            red = 0.0 if float(norms) == 0 else float(cross / norms)
            if self.targets.labels is not None:  # 0 below three classes, as triangle_score
                tri = float(self._triangle(layer, tri_means)) if self.tri and not null else 0.0
        iso = float(self._isotropy(gram, trace, norm, null))
        total = _total(w, ridge, iso, red, tri)
        return {"layer": layer, "ridge_loss": ridge, "iso": iso, "red": red, "tri": tri, "total": total}

    def _ridge(self, layer: int, fit: _StepFit, null: bool, norm: Tensor) -> Tensor:
        """``ridge_loss`` of the candidate's orthogonalised part against the residual targets."""
        numel = fit.residual.numel()
        if null:  # zero features: the probe predicts the mean, every leverage is 1/N
            if not self.loo:
                return fit.sq / numel
            return (fit.residual / (1.0 - 1.0 / self.n)).square().mean()
        gram = self.resid_gram[layer]
        factor = torch.linalg.cholesky(_shifted(gram, self.weights.lam))
        if not self.blocks:
            self.first_factors[layer] = factor
        assert self.xty is not None
        # b = H~^T Rc = Xc^T Rc - A^T U^T Rc, with Xc^T Rc = Xc^T Yc - sum_i (Xc_{c_i}^T Xc)^T coef_i.
        rhs = self.xty[layer] - sum(thin_matmul(self.cross[(c, layer)].T, part)
                                    for c, part in zip(self.chosen, fit.coef, strict=True))
        rhs = rhs - sum(a.T @ p for a, p in zip(self.coords[layer], fit.units, strict=True))
        weights = cholesky_solve(rhs, factor)
        if not self.loo:
            # ||Rc - H~ W||^2 = ||Rc||^2 - b.W - lam ||W||^2 since (G~ + lam I) W = b; taken where its
            # rounding (relative to the size of its terms) is far below the result.
            bw, ww = (rhs * weights).sum(), weights.square().sum()
            sse = fit.sq - bw - self.weights.lam * ww
            scale = fit.sq + bw.abs() + (self.weights.lam + norm) * ww
            if float(sse) > 1e6 * gram.shape[0] * torch.finfo(sse.dtype).eps * float(scale):
                return sse / numel
            residual = fit.residual - thin_matmul(self.xc[layer], weights)
            if self.coords[layer]:
                residual = residual + self._apply_basis([a @ weights for a in self.coords[layer]])
            return residual.square().mean()
        assert self.resid is not None
        residual = fit.residual - thin_matmul(self.resid[layer], weights)
        # Leverages h_i^T (G~ + lam I)^-1 h_i from the inverse: one GEMM over the rows, about twice as
        # fast on CPU as the triangular solve against every row, and as accurate for this SPD matrix.
        features = self.resid[layer]
        leverage = (features @ torch.cholesky_inverse(factor)).mul_(features).sum(dim=1) + 1.0 / self.n
        return (residual / (1.0 - leverage).unsqueeze(-1)).square().mean()

    def _isotropy(self, gram: Tensor, trace: Tensor, norm: Tensor, null: bool) -> Tensor:
        """``isotropy`` of the features from their Gram (zero features if ``null``)."""
        d = gram.shape[0]
        if self.weights.iso == "participation":
            denominator = d * norm.square()
            if null or denominator == 0:
                return torch.zeros((), dtype=gram.dtype, device=gram.device)
            return trace.square() / denominator
        eps = 1e-6
        eye = torch.eye(d, dtype=gram.dtype, device=gram.device)
        cov = (torch.zeros_like(gram) if null else gram / self.n) + eps * eye
        eigenvalues = torch.linalg.eigvalsh(cov).clamp_min(eps)
        return eigenvalues.mean() / (eigenvalues.std(correction=0) + eps)

    def _triangle(self, layer: int, tri_means: list[Tensor] | None) -> Tensor:
        """Tri of the orthogonalised part, in units of the raw candidate's total standard deviation."""
        assert self.class_means is not None and tri_means is not None
        scale = (self.sq[layer] / self.n).sqrt()
        if float(scale) == 0:
            return torch.zeros((), dtype=scale.dtype, device=scale.device)
        means = self.class_means[layer] - sum(
            m @ a for m, a in zip(tri_means, self.coords[layer], strict=True))
        return centroid_triangle_area(means / scale, self.weights.max_triples, self.weights.seed)


def _score_candidate(
    views: list[Tensor],
    chosen: list[int],
    layer: int,
    fit_target: Tensor | None,
    targets: _Targets,
    weights: _Weights,
    basis: Tensor | None = None,
) -> dict[str, Any]:
    """Every term of one candidate at one step, and the total LOES minimises.

    ``basis`` is the step's ``span_basis`` of the selected layers (computed once per step).
    """
    x = views[layer]
    nan = float("nan")
    ridge = red = tri = nan
    if not chosen:
        features = x
    else:
        selected = torch.cat([views[i] for i in chosen], dim=1)
        features = orthogonalize(x, selected, basis=basis)
        red = float(redundancy(x, selected))
        if targets.labels is not None:
            tri = float(triangle_score(
                features, targets.labels, targets.num_classes, scale=_total_variance(x).sqrt(),
                max_triples=weights.max_triples, seed=weights.seed,
            ))
    if fit_target is not None:
        ridge = float(ridge_loss(features, fit_target, weights.lam, weights.loss))
    iso = float(isotropy(features, weights.iso))
    total = _total(weights, ridge, iso, red, tri)
    return {"layer": layer, "ridge_loss": ridge, "iso": iso, "red": red, "tri": tri, "total": total}


@_without_autocast
@_on_selection_threads
def select_greedy_ridge(
    layers: LayerInput,
    y: ArrayLike | None = None,
    k: int = 2,
    *,
    task: Task = "auto",
    lam: float = 1e-3,
    loss: RidgeLossKind = "train",
    orthogonal: bool = False,
    dtype: torch.dtype = torch.float64,
) -> LayerSelection:
    """Baseline: LOES without geometry terms (``alpha = gamma = eta = 0``).

    Step 0 takes the layer with the lowest ridge loss; each later step the layer whose orthogonalised
    part best fits the residual targets of the ridge fit on the layers chosen so far. The table still
    reports Iso, Red and Tri (with weight 0). Arguments as in ``select_layers``; ``y`` is required.

    Returns:
        The ``LayerSelection``.
    """
    views, targets = _prepare(layers, y, task, dtype)
    _check_k(k, len(views))
    _check_weights(lam=lam)
    _require_targets(targets, "greedy_ridge")
    chosen, scores = _greedy(views, targets, k, _Weights(lam, 0.0, 0.0, 0.0, "participation", loss, 2000, 0))
    return _build_result(views, chosen, scores, "greedy_ridge", targets.task, orthogonal)


@_without_autocast
def select_best_single(
    layers: LayerInput,
    y: ArrayLike | None = None,
    k: int = 1,
    *,
    task: Task = "auto",
    lam: float = 1e-3,
    loss: RidgeLossKind = "train",
    orthogonal: bool = False,
    dtype: torch.dtype = torch.float64,
) -> LayerSelection:
    """Baseline: the one layer with the lowest ridge-probe loss.

    ``k`` is accepted for a uniform signature and ignored (one layer is returned). The table has one
    step-0 row per layer, ``total`` = ridge loss. Arguments as in ``select_layers``; ``y`` is required.

    Returns:
        The ``LayerSelection``.
    """
    del k
    views, targets = _prepare(layers, y, task, dtype)
    _check_weights(lam=lam)
    _require_targets(targets, "best_single")
    nan = float("nan")
    rows = []
    for layer, x in enumerate(views):
        value = float(ridge_loss(x, targets.matrix, lam, loss))
        rows.append({"step": 0, "layer": layer, "ridge_loss": value, "iso": nan, "red": nan, "tri": nan,
                     "total": value, "selected": False})
    best = min(range(len(rows)), key=lambda i: rows[i]["total"])
    rows[best]["selected"] = True
    return _build_result(views, [best], pd.DataFrame(rows, columns=SCORE_COLUMNS), "best_single",
                         targets.task, orthogonal)


def _subset_table(
    views: list[Tensor], subsets: list[tuple[int, ...]], targets: _Targets, lam: float, loss: RidgeLossKind
) -> pd.DataFrame:
    rows = []
    for subset in subsets:
        value = float("nan")
        if targets.matrix is not None:
            value = float(ridge_loss(torch.cat([views[i] for i in subset], dim=1), targets.matrix, lam, loss))
        rows.append({"layers": subset, "size": len(subset), "ridge_loss": value, "total": value,
                     "selected": False})
    return pd.DataFrame(rows, columns=["layers", "size", "ridge_loss", "total", "selected"])


def _fixed_choice(
    views: list[Tensor],
    targets: _Targets,
    chosen: list[int],
    method: str,
    lam: float,
    loss: RidgeLossKind,
    orthogonal: bool,
) -> LayerSelection:
    scores = _subset_table(views, [tuple(chosen)], targets, lam, loss)
    scores["selected"] = True
    return _build_result(views, chosen, scores, method, targets.task, orthogonal)


@_without_autocast
def select_last_layer(
    layers: LayerInput,
    y: ArrayLike | None = None,
    k: int = 1,
    *,
    task: Task = "auto",
    lam: float = 1e-3,
    loss: RidgeLossKind = "train",
    orthogonal: bool = False,
    dtype: torch.dtype = torch.float64,
) -> LayerSelection:
    """Baseline: the last layer.

    ``k`` is accepted for a uniform signature and ignored. With ``y`` the table reports the layer's
    ridge loss, otherwise NaN.

    Returns:
        The ``LayerSelection``.
    """
    del k
    views, targets = _prepare(layers, y, task, dtype)
    return _fixed_choice(views, targets, [len(views) - 1], "last_layer", lam, loss, orthogonal)


@_without_autocast
def select_last_k(
    layers: LayerInput,
    y: ArrayLike | None = None,
    k: int = 2,
    *,
    task: Task = "auto",
    lam: float = 1e-3,
    loss: RidgeLossKind = "train",
    orthogonal: bool = False,
    dtype: torch.dtype = torch.float64,
) -> LayerSelection:
    """Baseline: the last ``k`` layers, in increasing order, fused by concatenation.

    With ``y`` the table reports the concatenation's ridge loss, otherwise NaN.

    Returns:
        The ``LayerSelection``.
    """
    views, targets = _prepare(layers, y, task, dtype)
    _check_k(k, len(views))
    chosen = list(range(len(views) - k, len(views)))
    return _fixed_choice(views, targets, chosen, "last_k", lam, loss, orthogonal)


@_without_autocast
def select_exhaustive(
    layers: LayerInput,
    y: ArrayLike | None = None,
    k: int = 2,
    *,
    task: Task = "auto",
    lam: float = 1e-3,
    loss: RidgeLossKind = "train",
    orthogonal: bool = False,
    dtype: torch.dtype = torch.float64,
    max_subsets: int = 20_000,
) -> LayerSelection:
    """Baseline: the subset of at most ``k`` layers whose concatenation has the lowest ridge loss.

    Scores all ``sum_{s=1..k} C(L, s)`` subsets (smaller and lexicographically earlier subsets win
    ties) and refuses when there are more than ``max_subsets``. With the in-sample ``train`` loss
    larger subsets nearly always fit better, so the search in effect covers size ``k``; ``loo`` can
    prefer a smaller one. The chosen layers are returned in increasing order.

    Args:
        layers: As in ``select_layers``.
        y: Targets (required).
        k: Largest subset size.
        task: As in ``select_layers``.
        lam: Ridge penalty.
        loss: ``train`` or ``loo``.
        orthogonal: As in ``select_layers``.
        dtype: Computation dtype.
        max_subsets: Most subsets to evaluate.

    Returns:
        The ``LayerSelection``; its table has one row per subset.
    """
    views, targets = _prepare(layers, y, task, dtype)
    _check_k(k, len(views))
    _check_weights(lam=lam)
    _require_targets(targets, "exhaustive")
    count = sum(math.comb(len(views), size) for size in range(1, k + 1))
    if count > max_subsets:
        raise ValueError(
            f"Exhaustive search over subsets of up to {k} of {len(views)} layers needs {count} ridge fits, "
            f"more than max_subsets={max_subsets}; lower k, or raise max_subsets if you can wait."
        )
    subsets = [s for size in range(1, k + 1) for s in combinations(range(len(views)), size)]
    scores = _subset_table(views, subsets, targets, lam, loss)
    best = int(np.argmin(scores["total"].to_numpy()))
    scores.loc[best, "selected"] = True
    return _build_result(views, list(subsets[best]), scores, "exhaustive", targets.task, orthogonal)


Selector = Callable[..., LayerSelection]

SELECTORS: dict[str, Selector] = {
    "loes": select_layers,
    "greedy_ridge": select_greedy_ridge,
    "best_single": select_best_single,
    "last_layer": select_last_layer,
    "last_k": select_last_k,
    "exhaustive": select_exhaustive,
}
