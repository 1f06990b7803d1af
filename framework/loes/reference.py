r"""The public LOES reference algorithm, term by term, as ``select_layers(..., variant="reference")`` runs it.

This module reproduces the reference implementation (``loes/api.py``,
``select_layers_from_custom_embeddings``) exactly, including its numerical choices; it is checked
against the reference's recorded outputs (``tests/test_loes_reference.py``). Everything runs in the
reference's dtype, float32, with the same torch operations, because several of its terms (Red above
all) lose digits in float32 that a float64 rewrite would not reproduce.

Greedy rule, with ``Y`` the one-hot labels or the regression targets (``(N, T)``):

* step 0: ``argmin_l  MSE(ridge(H_l, Y)) + alpha (1 - Iso(H_l))``, the chosen layer's ridge
  prediction starting the running prediction ``Y_hat``;
* step t >= 1, with ``Sc`` the centred concatenation of the raw (not orthogonalised) selected
  layers::

      H~_l = Hc_l - Sc (Sc^T Sc + 1e-6 I)^{-1} Sc^T Hc_l                  (Hc_l: centred H_l)
      score = MSE(ridge(H~_l, Y - Y_hat)) + alpha (1 - Iso(H_l)) + gamma Red(H_l) - eta Tri(H~_l)

  and the chosen layer's ridge prediction of the residual is added to ``Y_hat``;
* label-free (no ``Y``): ``alpha (1 - Iso(H_l))`` at step 0, ``alpha (1 - Iso(H_l)) + gamma Red(H_l)``
  later.

The terms (``reference_*`` below):

* ridge: closed form with centring and an unpenalised intercept (``reg`` on the weights), in-sample
  MSE averaged over samples and target columns;
* Iso: ``mean / std`` (population std) of the covariance eigenvalues: ``eigvalsh(cov + 1e-6 I)`` for
  ``D <= 512``, the squared singular values of the centred data over ``N - 1`` otherwise. It is
  unbounded above, so ``1 - Iso`` can be negative;
* Red: the largest, over the selected layers ``S_j``, of ``||H^T S_j||_F / (||H||_F ||S_j||_F)`` on
  raw, uncentred data;
* Tri: the mean area ``1/2 sqrt(|u|^2 |v|^2 - (u.v)^2)`` of ``min(200, 3C)`` class-centroid triplets,
  each triplet three classes drawn uniformly *with replacement* (a repeated class gives area 0), in
  the candidate's raw units; 0 below 3 classes. The draws come from one generator seeded once per
  selection, so a selection is reproducible but Tri is a random estimate.

Differences from ripieno's own variant are listed in ``ripieno.framework.loes.selection``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: The reference's defaults (``alpha, gamma, eta, reg``).
REFERENCE_DEFAULTS: dict[str, float] = {"alpha": 1.0, "gamma": 0.5, "eta": 0.1, "reg": 1e-3}
#: Ridge of the orthogonalisation against the selected layers.
ORTHOGONALIZATION_RIDGE = 1e-6
#: Jitter added to the covariance before its eigenvalues (Iso).
ISO_JITTER = 1e-6
#: Widest layer whose Iso uses ``eigvalsh`` of the covariance; wider ones use ``svdvals``.
ISO_EIGH_MAX_DIM = 512
#: Most class triplets Tri draws (``min(TRI_MAX_TRIPLETS, 3 C)``).
TRI_MAX_TRIPLETS = 200


def reference_ridge_prediction(x: Tensor, y: Tensor, reg: float) -> Tensor:
    """In-sample prediction of ridge regression with centring and an unpenalised intercept.

    Args:
        x: Features ``(N, D)``.
        y: Targets ``(N, T)``.
        reg: Ridge penalty on the weights.

    Returns:
        ``(N, T)`` predictions ``Xc (Xc^T Xc + reg I)^{-1} Xc^T Yc + mean(Y)``.
    """
    x_mean, y_mean = x.mean(dim=0, keepdim=True), y.mean(dim=0, keepdim=True)
    xc, yc = x - x_mean, y - y_mean
    weights = _solve_accurately(xc.T @ xc, reg, xc.T @ yc)
    return xc @ weights + y_mean


def _solve_accurately(gram: Tensor, ridge: float, rhs: Tensor) -> Tensor:
    """``(gram + ridge I)^{-1} rhs`` solved in float64, returned in ``gram``'s dtype.

    The one place the reference's float32 is not kept: when a probe nearly interpolates (``D`` close
    to ``N``, tiny ``reg``) a float32 solve's rounding exceeds the score gaps between layers, so the
    choice would depend on the order of floating-point operations rather than on the data.
    """
    eye = torch.eye(gram.shape[0], dtype=torch.float64, device=gram.device)
    return torch.linalg.solve(gram.double() + ridge * eye, rhs.double()).to(gram.dtype)


def reference_isotropy(x: Tensor) -> Tensor:
    """Iso: ``mean / std`` (population) of the covariance eigenvalues of ``x`` ``(N, D)``.

    Example:
        >>> x = torch.randn(500, 4, generator=torch.Generator().manual_seed(0))
        >>> bool(reference_isotropy(x) > 5)  # nearly isotropic: eigenvalues close, std small
        True
    """
    n, d = x.shape
    xc = x - x.mean(dim=0, keepdim=True)
    if d <= ISO_EIGH_MAX_DIM:
        cov = xc.T @ xc / (n - 1) + ISO_JITTER * torch.eye(d, dtype=x.dtype, device=x.device)
        eigenvalues = torch.linalg.eigvalsh(cov)
    else:
        eigenvalues = torch.linalg.svdvals(xc).square() / (n - 1)
    return eigenvalues.mean() / eigenvalues.std(correction=0)


def reference_redundancy(x: Tensor, selected: list[Tensor]) -> Tensor:
    """Red: ``max_j ||x^T S_j||_F / (||x||_F ||S_j||_F)`` over the raw selected layers ``S_j``."""
    norm_x = torch.linalg.matrix_norm(x)
    values = [torch.linalg.matrix_norm(x.T @ s) / (norm_x * torch.linalg.matrix_norm(s)) for s in selected]
    return torch.stack(values).max()


def reference_triangle(x: Tensor, labels: Tensor, num_classes: int, generator: torch.Generator) -> Tensor:
    """Tri: mean area of ``min(200, 3C)`` centroid triplets drawn with replacement (0 below 3 classes).

    Args:
        x: Features ``(N, D)``.
        labels: Class indices ``(N,)`` in ``0..C-1``.
        num_classes: ``C``.
        generator: CPU generator the triplets are drawn from (advanced by the draw).

    Returns:
        A 0-dim tensor.
    """
    if num_classes < 3:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    sums = torch.zeros(num_classes, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, labels, x)
    counts = torch.bincount(labels, minlength=num_classes).to(x.dtype).clamp_min(1)
    centroids = sums / counts.unsqueeze(-1)
    count = min(TRI_MAX_TRIPLETS, 3 * num_classes)
    triplets = torch.randint(num_classes, (count, 3), generator=generator).to(x.device)
    u = centroids[triplets[:, 1]] - centroids[triplets[:, 0]]
    v = centroids[triplets[:, 2]] - centroids[triplets[:, 0]]
    gram_det = u.square().sum(1) * v.square().sum(1) - (u * v).sum(1).square()
    return 0.5 * gram_det.clamp_min(0).sqrt().mean()


def reference_orthogonalize(x: Tensor, selected: Tensor) -> Tensor:
    """Centred ``x`` minus its ``1e-6``-ridge projection on the centred concatenated ``selected``.

    The selected layers are the raw ones (not their orthogonalised parts), centred together with
    the candidate: this is what reproduces the reference's recorded scores.
    """
    return _Orthogonalizer(selected)(x)


class _Orthogonalizer:
    """``reference_orthogonalize`` against one selection, factorised once for every candidate."""

    def __init__(self, selected: Tensor) -> None:
        self.sc = selected - selected.mean(dim=0, keepdim=True)
        gram = (self.sc.T @ self.sc).double()
        eye = torch.eye(gram.shape[0], dtype=torch.float64, device=gram.device)
        self.factor = torch.linalg.lu_factor(gram + ORTHOGONALIZATION_RIDGE * eye)

    def __call__(self, x: Tensor) -> Tensor:
        xc = x - x.mean(dim=0, keepdim=True)
        coef = torch.linalg.lu_solve(*self.factor, (self.sc.T @ xc).double()).to(x.dtype)
        return xc - self.sc @ coef


@dataclass(frozen=True)
class ReferenceWeights:
    """The weights of the reference score and its ridge penalty."""

    alpha: float
    gamma: float
    eta: float
    reg: float


def reference_greedy(
    views: list[Tensor],
    targets: Tensor | None,
    labels: Tensor | None,
    num_classes: int,
    k: int,
    weights: ReferenceWeights,
    seed: int,
) -> tuple[list[int], list[dict[str, Any]]]:
    """The reference's greedy loop over every remaining candidate (ties to the lowest index).

    Args:
        views: The ``L`` layers ``(N, D_l)``, in the computation dtype.
        targets: ``(N, T)`` one-hot labels or regression targets, or ``None`` (label-free).
        labels: ``(N,)`` class indices for Tri (classification only), else ``None``.
        num_classes: ``C`` (0 unless classification).
        k: Layers to choose.
        weights: ``alpha``, ``gamma``, ``eta`` and ``reg``.
        seed: Seed of Tri's triplet draws.

    Returns:
        The chosen layers and one score row per scored candidate (``step`` and ``selected`` unset).
    """
    generator = torch.Generator().manual_seed(seed)
    isotropies = [float(reference_isotropy(v)) for v in views]
    chosen: list[int] = []
    rows: list[dict[str, Any]] = []
    prediction = None if targets is None else torch.zeros_like(targets)
    nan = float("nan")
    for step in range(k):
        selected = torch.cat([views[i] for i in chosen], dim=1) if chosen else None
        orthogonalizer = None if selected is None else _Orthogonalizer(selected)
        residual = None if targets is None else targets - prediction
        best: tuple[float, int, Tensor | None] | None = None
        step_rows = []
        for layer in (i for i in range(len(views)) if i not in chosen):
            x = views[layer]
            features = x if orthogonalizer is None else orthogonalizer(x)
            ridge = red = tri = nan
            fitted = None
            total = weights.alpha * (1.0 - isotropies[layer])
            if residual is not None:
                fitted = reference_ridge_prediction(features, residual, weights.reg)
                ridge = float((residual - fitted).square().mean())
                total += ridge
            if chosen:
                red = float(reference_redundancy(x, [views[i] for i in chosen]))
                total += weights.gamma * red
                if labels is not None:
                    tri = float(reference_triangle(features, labels, num_classes, generator))
                    total -= weights.eta * tri
            step_rows.append({"layer": layer, "ridge_loss": ridge, "iso": isotropies[layer], "red": red,
                              "tri": tri, "total": total, "selected": False, "step": step})
            if best is None or total < best[0] or (math.isnan(best[0]) and not math.isnan(total)):
                best = (total, layer, fitted)
        assert best is not None
        _, layer, fitted = best
        for row in step_rows:
            row["selected"] = row["layer"] == layer
        chosen.append(layer)
        rows.extend(step_rows)
        if prediction is not None and fitted is not None:
            prediction = prediction + fitted
    return chosen, rows
