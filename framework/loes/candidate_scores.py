"""One LOES step scored from the features: every term of every candidate, and the total LOES minimises.

The direct form of the rule in ``selection``'s docstring, and its oracle: ``gram_scorer`` computes the
same values from cached Gram blocks, and a step it cannot reproduce exactly is scored here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ripieno.framework.loes.geometry import (
    IsoKind,
    RidgeLossKind,
    isotropy,
    orthogonalize,
    redundancy,
    ridge_fit,
    ridge_loss,
    span_basis,
    triangle_score,
)
from ripieno.framework.loes.selection_inputs import SelectionTargets


@dataclass(frozen=True)
class ScoreWeights:
    """The weights and options of one LOES run (``select_layers``' arguments)."""

    lam: float
    alpha: float
    gamma: float
    eta: float
    iso: IsoKind
    loss: RidgeLossKind
    max_triples: int
    seed: int



def total_variance(x: Tensor) -> Tensor:
    """Mean squared distance of the rows from their mean (the trace of the covariance)."""
    return (x - x.mean(dim=0)).square().sum(dim=1).mean()



def direct_step(
    views: list[Tensor], chosen: list[int], targets: SelectionTargets, weights: ScoreWeights
) -> list[dict[str, Any]]:
    """One greedy step scored from the (orthogonalised) features of every candidate."""
    fit_target = targets.matrix
    if chosen and targets.matrix is not None:
        selected = torch.cat([views[i] for i in chosen], dim=1)
        fit_target = targets.matrix - ridge_fit(selected, targets.matrix, weights.lam).predict(selected)
    basis = span_basis(torch.cat([views[i] for i in chosen], dim=1)) if chosen else None
    return [
        score_candidate(views, chosen, layer, fit_target, targets, weights, basis)
        for layer in range(len(views))
        if layer not in chosen
    ]


def loes_total(weights: ScoreWeights, ridge: float, iso: float, red: float, tri: float) -> float:
    """The LOES score: ``alpha (1 - Iso) + ridge + gamma Red - eta Tri``, leaving out NaN terms."""
    total = weights.alpha * (1.0 - iso)
    if not math.isnan(ridge):
        total += ridge
    if not math.isnan(red):
        total += weights.gamma * red
    if not math.isnan(tri):
        total -= weights.eta * tri
    return total



def score_candidate(
    views: list[Tensor],
    chosen: list[int],
    layer: int,
    fit_target: Tensor | None,
    targets: SelectionTargets,
    weights: ScoreWeights,
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
                features, targets.labels, targets.num_classes, scale=total_variance(x).sqrt(),
                max_triples=weights.max_triples, seed=weights.seed,
            ))
    if fit_target is not None:
        ridge = float(ridge_loss(features, fit_target, weights.lam, weights.loss))
    iso = float(isotropy(features, weights.iso))
    total = loes_total(weights, ridge, iso, red, tri)
    return {"layer": layer, "ridge_loss": ridge, "iso": iso, "red": red, "tri": tri, "total": total}

