"""The pieces ``GramScorer`` builds the selected span's basis from: its blocks, a step's fit, tolerances."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

#: ``orthogonalize``'s ``null_tol``: a residual this small relative to the candidate scores as zeros.
NULL_TOL = 1e-6
#: How far (a lower bound of) the smallest kept singular value of the selection must clear the rank
#: cutoff, and how far below it the dropped ones must lie, for the block basis to keep what the
#: joint SVD of ``span_basis`` keeps; otherwise the step is scored from the features.
KEEP_MARGIN, DROP_MARGIN = 10.0, 4.0
#: Most null directions of a residual Gram that ``_deflated_block`` removes (a few exact linear
#: constraints, such as LayerNorm's one per row); with more, ``eigh`` decides.
DEFLATE_MAX = 4
#: Inverse subspace iterations ``_deflated_block`` runs: a null direction converges by the ratio of
#: the cutoff to the smallest kept eigenvalue per iteration, at most 1e-2 where the split is clear.
DEFLATE_ITERATIONS = 3


@dataclass
class Block:
    """One block ``U_j = sum_i Xc_{c_i} T[i]`` of the orthonormal basis of the selected span.

    ``U_j`` spans the part of the ``j``-th chosen layer orthogonal to the blocks before it.
    """

    layer: int
    t: list[Tensor]  # T[i]: (D_{c_i}, r_j), i <= j
    s_low: float  # lower bound of the largest singular value of the layer's residual (kept or not)
    s_high: float  # upper bound of it (both exact when the block comes from an eigendecomposition)
    dropped_max: float  # largest singular value below the cutoff (0 if none)


def shifted_diagonal(matrix: Tensor, shift: float) -> Tensor:
    """``matrix + shift I`` (a copy)."""
    out = matrix.clone()
    out.diagonal().add_(shift)
    return out


@dataclass
class StepFit:
    """The residual targets of one step and what every candidate's probe needs of them."""

    residual: Tensor  # Rc (N, T), centred
    coef: list[Tensor]  # ridge coefficients of the fit on each chosen layer (D_{c_i}, T)
    units: list[Tensor]  # U_j^T Rc for every block
    sq: Tensor  # ||Rc||_F^2


def centred_copy(x: Tensor, dtype: torch.dtype) -> Tensor:
    """``x - mean(x)`` in ``dtype``, centred in place in one new tensor (one allocation, not two)."""
    out = x.to(dtype, copy=True)
    return out.sub_(out.mean(dim=0, keepdim=True))
