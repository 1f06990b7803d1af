"""LOES's baselines: last layer, last ``k``, best single probe, greedy ridge and exhaustive search.

Every selector takes ``select_layers``' arguments (``Selector`` is that signature) and returns
a ``LayerSelection``; ``selection.SELECTORS`` maps method names to all six. Those that rank by a
ridge probe need targets ``y``; ``last_layer`` and ``last_k`` report the chosen layers' ridge loss
when ``y`` is given.
"""

from __future__ import annotations

import math
from itertools import combinations
from typing import Protocol

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ripieno.framework.loes.candidate_scores import ScoreWeights
from ripieno.framework.loes.geometry import RidgeLossKind, ridge_loss
from ripieno.framework.loes.greedy import greedy_steps
from ripieno.framework.loes.layer_selection import SCORE_COLUMNS, LayerSelection, build_result
from ripieno.framework.loes.selection_inputs import (
    ArrayLike,
    LayerInput,
    SelectionTargets,
    Task,
    check_k,
    check_weights,
    prepare,
    require_targets,
)
from ripieno.framework.loes.selection_policy import on_selection_threads, without_autocast


class Selector(Protocol):
    """The signature every selector shares (``select_layers`` adds the LOES weights and its variant)."""

    def __call__(self, layers: LayerInput, y: ArrayLike | None = ..., k: int = ..., *, task: Task = ...,
                 lam: float = ..., orthogonal: bool = ..., dtype: torch.dtype = ...) -> LayerSelection:
        """Select layers from ``layers`` (and ``y``) and return the ``LayerSelection``."""
        ...


@without_autocast
@on_selection_threads
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
    views, targets = prepare(layers, y, task, dtype)
    check_k(k, len(views))
    check_weights(lam=lam)
    require_targets(targets, "greedy_ridge")
    no_geometry = ScoreWeights(lam, 0.0, 0.0, 0.0, "participation", loss, 2000, 0)
    chosen, scores = greedy_steps(views, targets, k, no_geometry)
    return build_result(views, chosen, scores, "greedy_ridge", targets.task, orthogonal)


@without_autocast
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
    views, targets = prepare(layers, y, task, dtype)
    check_weights(lam=lam)
    require_targets(targets, "best_single")
    nan = float("nan")
    rows = []
    for layer, x in enumerate(views):
        value = float(ridge_loss(x, targets.matrix, lam, loss))
        rows.append({"step": 0, "layer": layer, "ridge_loss": value, "iso": nan, "red": nan, "tri": nan,
                     "total": value, "selected": False})
    best = min(range(len(rows)), key=lambda i: rows[i]["total"])
    rows[best]["selected"] = True
    return build_result(views, [best], pd.DataFrame(rows, columns=SCORE_COLUMNS), "best_single",
                         targets.task, orthogonal)


def _subset_table(
    views: list[Tensor], subsets: list[tuple[int, ...]], targets: SelectionTargets, lam: float,
    loss: RidgeLossKind,
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
    targets: SelectionTargets,
    chosen: list[int],
    method: str,
    lam: float,
    loss: RidgeLossKind,
    orthogonal: bool,
) -> LayerSelection:
    scores = _subset_table(views, [tuple(chosen)], targets, lam, loss)
    scores["selected"] = True
    return build_result(views, chosen, scores, method, targets.task, orthogonal)


@without_autocast
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
    views, targets = prepare(layers, y, task, dtype)
    return _fixed_choice(views, targets, [len(views) - 1], "last_layer", lam, loss, orthogonal)


@without_autocast
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
    views, targets = prepare(layers, y, task, dtype)
    check_k(k, len(views))
    chosen = list(range(len(views) - k, len(views)))
    return _fixed_choice(views, targets, chosen, "last_k", lam, loss, orthogonal)


@without_autocast
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
    views, targets = prepare(layers, y, task, dtype)
    check_k(k, len(views))
    check_weights(lam=lam)
    require_targets(targets, "exhaustive")
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
    return build_result(views, list(subsets[best]), scores, "exhaustive", targets.task, orthogonal)
