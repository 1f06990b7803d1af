"""The greedy loop LOES and its greedy-ridge baseline share: score every candidate, keep the best, repeat."""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch
from torch import Tensor

from ripieno.framework.loes.candidate_scores import ScoreWeights, direct_step
from ripieno.framework.loes.gram_scorer import GramScorer
from ripieno.framework.loes.layer_selection import SCORE_COLUMNS
from ripieno.framework.loes.selection_inputs import SelectionTargets, check_lam


def greedy_steps(
    views: list[Tensor], targets: SelectionTargets, k: int, weights: ScoreWeights,
    dtype: torch.dtype | None = None,
) -> tuple[list[int], pd.DataFrame]:
    """The greedy loop: score every remaining candidate, keep the argmin, refit the residual targets.

    Steps are scored by ``GramScorer`` (the same values from cached Gram blocks); a step it cannot
    reproduce exactly (see ``GramScorer.score_step``), and every step after it, is scored candidate by
    candidate by ``score_candidate`` from the features themselves. ``views`` narrower than ``dtype``
    (the computation dtype, default: theirs) are converted where they are read.
    """
    dtype = dtype or views[0].dtype
    if targets.matrix is not None:
        check_lam(weights.lam)  # as ridge_loss would
    chosen: list[int] = []
    rows: list[dict[str, Any]] = []
    scorer = GramScorer.create(views, targets, weights, dtype)
    for step in range(k):
        step_rows = scorer.score_step(chosen) if scorer is not None else None
        if step_rows is None:
            scorer = None
            views = [v.to(dtype) for v in views]
            step_rows = direct_step(views, chosen, targets, weights)
        best = min(step_rows, key=lambda row: row["total"])
        for row in step_rows:
            row["step"], row["selected"] = step, row is best
        chosen.append(best["layer"])
        rows.extend(step_rows)
    return chosen, pd.DataFrame(rows, columns=SCORE_COLUMNS)
