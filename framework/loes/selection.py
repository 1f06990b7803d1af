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
``select_best_single``, ``select_greedy_ridge``, ``select_exhaustive``, in ``baselines``) take the same
arguments and return the same ``LayerSelection``; ``SELECTORS`` maps method names to all six.

This module is the API: ``select_layers`` and ``SELECTORS``. The rooms behind it:
``selection_inputs`` (checks and conversion), ``selection_policy`` (autocast, threads),
``layer_selection`` (the result), ``greedy`` (the loop), ``candidate_scores`` (a step from the
features, the oracle), ``gram_scorer`` and ``gram_blocks`` (the same step from cached Gram blocks) and
``baselines``.

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

import sys
import types
from typing import Literal

import pandas as pd
import torch

from ripieno.framework.loes import selection_policy
from ripieno.framework.loes.baselines import (
    Selector,
    select_best_single,
    select_exhaustive,
    select_greedy_ridge,
    select_last_k,
    select_last_layer,
)
from ripieno.framework.loes.candidate_scores import ScoreWeights
from ripieno.framework.loes.geometry import IsoKind, RidgeLossKind
from ripieno.framework.loes.greedy import greedy_steps
from ripieno.framework.loes.layer_selection import SCORE_COLUMNS, LayerSelection, build_result
from ripieno.framework.loes.reference import ReferenceWeights, reference_greedy
from ripieno.framework.loes.selection_inputs import (
    ArrayLike,
    LayerInput,
    Task,
    check_k,
    check_lam,
    check_weights,
    prepare,
)
from ripieno.framework.loes.selection_policy import on_selection_threads, without_autocast

__all__ = ["SCORE_COLUMNS", "SELECTORS", "VARIANTS", "LayerSelection", "Selector", "select_best_single",
           "select_exhaustive", "select_greedy_ridge", "select_last_k", "select_last_layer", "select_layers"]

Variant = Literal["ripieno", "reference"]
VARIANTS: tuple[str, ...] = ("ripieno", "reference")


@without_autocast
@on_selection_threads
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
        views, targets = prepare(layers, y, task, dtype or torch.float32)
        check_k(k, len(views))
        check_weights(lam=lam, alpha=alpha, gamma=gamma, eta=eta)
        check_lam(lam)
        chosen, rows = reference_greedy(
            views, targets.matrix, targets.labels, targets.num_classes, k,
            ReferenceWeights(alpha=alpha, gamma=gamma, eta=eta, reg=lam), seed,
        )
        scores = pd.DataFrame(rows, columns=SCORE_COLUMNS)
        return build_result(views, chosen, scores, "loes", targets.task, orthogonal, variant="reference")
    dtype = dtype or torch.float64
    views, targets = prepare(layers, y, task, dtype, keep_narrower=True)
    check_k(k, len(views))
    check_weights(lam=lam, alpha=alpha, gamma=gamma, eta=eta)
    weights = ScoreWeights(lam, alpha, gamma, eta, iso or "participation", loss or "train",
                       2000 if max_triples is None else max_triples, seed)
    chosen, scores = greedy_steps(views, targets, k, weights, dtype)
    return build_result(views, chosen, scores, "loes", targets.task, orthogonal, dtype=dtype)


SELECTORS: dict[str, Selector] = {
    "loes": select_layers,
    "greedy_ridge": select_greedy_ridge,
    "best_single": select_best_single,
    "last_layer": select_last_layer,
    "last_k": select_last_k,
    "exhaustive": select_exhaustive,
}


class _SelectionModule(types.ModuleType):
    """This module, whose ``SELECTION_THREADS`` reads and sets ``selection_policy.SELECTION_THREADS``.

    The knob was documented here (``selection.SELECTION_THREADS = 1``) before the policy had a module
    of its own; setting it here must keep working, not set an attribute nothing reads.
    """

    @property
    def SELECTION_THREADS(self) -> int | None:  # noqa: N802 - the knob's documented name
        """``selection_policy.SELECTION_THREADS``."""
        return selection_policy.SELECTION_THREADS

    @SELECTION_THREADS.setter
    def SELECTION_THREADS(self, value: int | None) -> None:  # noqa: N802 - the knob's documented name
        selection_policy.SELECTION_THREADS = value


sys.modules[__name__].__class__ = _SelectionModule
