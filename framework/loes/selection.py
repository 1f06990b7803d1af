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

import functools
import math
from collections.abc import Callable, Sequence
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
            orthogonal to the layers chosen before it.
        orthogonal: Which of the two ``fused`` holds (the default of ``transform``).
        layer_dims: Feature width of every input layer, checked by ``transform``.
    """

    layers: list[int]
    scores: pd.DataFrame = field(repr=False)
    method: str
    task: str
    fused: Tensor = field(repr=False)
    orthogonal: bool
    layer_dims: list[int] = field(repr=False)
    _first_mean: Tensor = field(repr=False)
    _residualizers: list[Residualizer] | None = field(repr=False)
    variant: str = "ripieno"
    _calibration: list[Tensor] | None = field(default=None, repr=False)

    def _fitted_residualizers(self) -> list[Residualizer]:
        """The orthogonalisation maps, fitted on the calibration layers the first time they are needed."""
        if self._residualizers is None:
            assert self._calibration is not None
            chosen = self._calibration
            self._residualizers = [fit_residualizer(chosen[j], torch.cat(chosen[:j], dim=1))
                                   for j in range(1, len(chosen))]
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
        views = _prepare_layers(layers, self.fused.dtype, device=self.fused.device)
        dims = [v.shape[1] for v in views]
        if dims != self.layer_dims:
            raise ValueError(
                f"transform got layers of widths {dims} but the selection was made on widths "
                f"{self.layer_dims}; pass all layers of the same model, in the same order."
            )
        chosen = [views[i] for i in self.layers]
        if not (self.orthogonal if orthogonal is None else orthogonal):
            return torch.cat(chosen, dim=1)
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
    layers: LayerInput, dtype: torch.dtype, device: torch.device | None = None
) -> list[Tensor]:
    """Validate the layers and return them as ``(N, D_l)`` tensors of ``dtype`` on one device."""
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
        view = view.to(dtype=dtype, device=device if device is not None or not views else views[0].device)
        bad = int((~torch.isfinite(view)).sum())
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
) -> LayerSelection:
    first = views[chosen[0]]
    result = LayerSelection(
        layers=list(chosen),
        scores=scores,
        method=method,
        task=task,
        variant=variant,
        fused=first.new_empty(0),
        orthogonal=orthogonal,
        layer_dims=[v.shape[1] for v in views],
        _first_mean=first.mean(dim=0),
        _residualizers=None,
        _calibration=[views[i] for i in chosen],
    )
    result.fused = result.transform(views)
    return result


def _prepare(
    layers: LayerInput, y: ArrayLike | None, task: Task, dtype: torch.dtype
) -> tuple[list[Tensor], _Targets]:
    views = _prepare_layers(layers, dtype)
    return views, _prepare_targets(y, views[0].shape[0], task, dtype, views[0].device)


@_without_autocast
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
    views, targets = _prepare(layers, y, task, dtype or torch.float64)
    _check_k(k, len(views))
    _check_weights(lam=lam, alpha=alpha, gamma=gamma, eta=eta)
    weights = _Weights(lam, alpha, gamma, eta, iso or "participation", loss or "train",
                       2000 if max_triples is None else max_triples, seed)
    chosen, scores = _greedy(views, targets, k, weights)
    return _build_result(views, chosen, scores, "loes", targets.task, orthogonal)


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
    views: list[Tensor], targets: _Targets, k: int, weights: _Weights
) -> tuple[list[int], pd.DataFrame]:
    """The greedy loop: score every remaining candidate, keep the argmin, refit the residual targets."""
    chosen: list[int] = []
    rows: list[dict[str, Any]] = []
    fit_target = targets.matrix
    for step in range(k):
        if chosen and targets.matrix is not None:
            selected = torch.cat([views[i] for i in chosen], dim=1)
            fit_target = targets.matrix - ridge_fit(selected, targets.matrix, weights.lam).predict(selected)
        basis = span_basis(torch.cat([views[i] for i in chosen], dim=1)) if chosen else None
        step_rows = [
            _score_candidate(views, chosen, layer, fit_target, targets, weights, basis)
            for layer in range(len(views))
            if layer not in chosen
        ]
        best = min(step_rows, key=lambda row: row["total"])
        for row in step_rows:
            row["step"], row["selected"] = step, row is best
        chosen.append(best["layer"])
        rows.extend(step_rows)
    return chosen, pd.DataFrame(rows, columns=SCORE_COLUMNS)


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
    total = weights.alpha * (1.0 - iso)
    if not math.isnan(ridge):
        total += ridge
    if not math.isnan(red):
        total += weights.gamma * red
    if not math.isnan(tri):
        total -= weights.eta * tri
    return {"layer": layer, "ridge_loss": ridge, "iso": iso, "red": red, "tri": tri, "total": total}


@_without_autocast
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
