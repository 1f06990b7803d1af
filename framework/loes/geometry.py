"""The scores LOES combines: a closed-form ridge probe, orthogonalisation, Iso, Red and Tri.

Every function takes and returns torch tensors, keeps the input's dtype and device and has no
side effects, so GeoReg-style callbacks can reuse the geometry terms (they are differentiable,
except at degenerate points such as a zero residual). LOES itself calls them in float64.
Features are rows: ``x`` is ``(N, D)``, one sample per row.

* ``ridge_fit`` / ``ridge_loss``: ridge regression with an unpenalised intercept, identical to
  ``sklearn.linear_model.Ridge(alpha=lam, fit_intercept=True)``; the loss is the training MSE or
  the exact leave-one-out MSE.
* ``orthogonalize`` / ``fit_residualizer``: the part of a candidate layer orthogonal to the span
  of the (centred) selected features, by least squares through a rank-revealing SVD.
* ``isotropy``: Iso in ``[0, 1]`` (participation ratio of the covariance spectrum over ``D``), or
  the public LOES code's unbounded ``mean / std`` of the eigenvalues.
* ``redundancy``: Red in ``[0, 1]``, linear CKA between a candidate and the selected features.
* ``triangle_score``: Tri, the mean area of triangles spanned by class centroids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

IsoKind = Literal["participation", "mean_std"]
RidgeLossKind = Literal["train", "loo"]


def _centre(x: Tensor) -> Tensor:
    return x - x.mean(dim=0, keepdim=True)


def _as_matrix(y: Tensor) -> Tensor:
    return y.unsqueeze(-1) if y.ndim == 1 else y


@dataclass(frozen=True)
class RidgeFit:
    """A fitted ridge probe ``y ≈ x @ coef + intercept``.

    Attributes:
        coef: ``(D, T)`` weights (sklearn's ``coef_`` is the transpose, ``(T, D)``).
        intercept: ``(T,)`` unpenalised intercept (sklearn's ``intercept_``).
    """

    coef: Tensor
    intercept: Tensor

    def predict(self, x: Tensor) -> Tensor:
        """Predictions ``(N, T)`` for features ``x`` of shape ``(N, D)``."""
        return x @ self.coef + self.intercept


def _check_lam(lam: float) -> None:
    if not lam > 0:
        raise ValueError(f"Ridge needs lam > 0, got {lam}; use a small positive value such as 1e-3.")


def ridge_fit(x: Tensor, y: Tensor, lam: float) -> RidgeFit:
    """Fit ridge regression in closed form, equal to sklearn's ``Ridge(alpha=lam, fit_intercept=True)``.

    With centred ``Xc = x - mean(x)`` and ``Yc = y - mean(y)``, the weights are
    ``W = (Xc^T Xc + lam I)^-1 Xc^T Yc`` and the intercept is ``mean(y) - mean(x) @ W``. When
    ``D > N`` the same ``W`` is computed in dual form, ``Xc^T (Xc Xc^T + lam I)^-1 Yc``.

    Args:
        x: Features ``(N, D)``.
        y: Targets ``(N,)`` or ``(N, T)`` (one-hot rows for classification).
        lam: Ridge penalty, ``> 0``.

    Returns:
        The fit; ``coef`` is ``(D, T)`` even for 1-D ``y``.
    """
    _check_lam(lam)
    y = _as_matrix(y)
    x_mean, y_mean = x.mean(dim=0), y.mean(dim=0)
    xc, yc = x - x_mean, y - y_mean
    n, d = xc.shape
    if d <= n:
        eye = torch.eye(d, dtype=x.dtype, device=x.device)
        coef = torch.linalg.solve(xc.T @ xc + lam * eye, xc.T @ yc)
    else:
        eye = torch.eye(n, dtype=x.dtype, device=x.device)
        coef = xc.T @ torch.linalg.solve(xc @ xc.T + lam * eye, yc)
    return RidgeFit(coef=coef, intercept=y_mean - x_mean @ coef)


def _hat_diagonal(xc: Tensor, lam: float) -> Tensor:
    """Diagonal of the ridge hat matrix ``1/N + Xc (Xc^T Xc + lam I)^-1 Xc^T`` (intercept included)."""
    n, d = xc.shape
    if d <= n:
        eye = torch.eye(d, dtype=xc.dtype, device=xc.device)
        solved = torch.linalg.solve(xc.T @ xc + lam * eye, xc.T)
        leverage = (xc * solved.T).sum(dim=1)
    else:
        gram = xc @ xc.T
        eye = torch.eye(n, dtype=xc.dtype, device=xc.device)
        leverage = torch.linalg.solve(gram + lam * eye, gram).diagonal()
    return leverage + 1.0 / n


def ridge_loss(x: Tensor, y: Tensor, lam: float, kind: RidgeLossKind = "train") -> Tensor:
    """Mean squared error of the ridge probe, averaged over samples and target columns.

    ``train`` is the in-sample MSE of ``ridge_fit(x, y, lam)`` (what the public LOES code uses).
    ``loo`` is the exact leave-one-out MSE, ``mean_i ((y_i - yhat_i) / (1 - h_ii))^2`` with ``h``
    the diagonal of the hat matrix (intercept included); it does not keep falling as ``D``
    approaches ``N``, which the in-sample loss does.

    Args:
        x: Features ``(N, D)``.
        y: Targets ``(N,)`` or ``(N, T)``.
        lam: Ridge penalty, ``> 0``.
        kind: ``train`` or ``loo``.

    Returns:
        A 0-dim tensor.
    """
    if kind not in ("train", "loo"):
        raise ValueError(f"Unknown ridge loss {kind!r}; use 'train' or 'loo'.")
    _check_lam(lam)
    y = _as_matrix(y)
    xc, yc = _centre(x), y - y.mean(dim=0)
    n, d = xc.shape
    if d > n:  # dual form (rare for layer probes): the reference path
        residual = y - ridge_fit(x, y, lam).predict(x)
        h = _hat_diagonal(xc, lam) if kind == "loo" else None
    else:
        # One Cholesky factor of Xc^T Xc + lam I serves the fit and the leverages (half the
        # work of fitting and then solving again for the hat diagonal; same values).
        factor = torch.linalg.cholesky(xc.T @ xc + lam * torch.eye(d, dtype=x.dtype, device=x.device))
        residual = yc - xc @ torch.cholesky_solve(xc.T @ yc, factor)
        h = None
        if kind == "loo":
            z = torch.linalg.solve_triangular(factor, xc.T, upper=False)
            h = z.square().sum(dim=0) + 1.0 / n
    if kind == "train":
        return residual.square().mean()
    return (residual / (1.0 - h).unsqueeze(-1)).square().mean()


def _span_basis(sc: Tensor, rtol: float | None) -> tuple[Tensor, Tensor, Tensor]:
    """Left/right singular vectors and singular values of ``sc`` above the rank tolerance."""
    n, d = sc.shape
    if rtol is None:
        rtol = max(sc.shape) * torch.finfo(sc.dtype).eps
    if d <= n and d > 0:
        # Eigendecomposition of the small D x D Gram instead of an SVD of the tall N x D
        # matrix (several times faster for N >> D). Singular values near sqrt(eps) * s_max
        # are not resolved this way, so the rank cutoff is at least that.
        evals, v = torch.linalg.eigh(sc.T @ sc)
        s = evals.clamp_min(0).sqrt()
        cutoff = max(rtol, math.sqrt(max(sc.shape) * torch.finfo(sc.dtype).eps)) * s.max()
        keep = s > cutoff
        s, v = s[keep], v[:, keep]
        return sc @ v / s, s, v.T
    u, s, vh = torch.linalg.svd(sc, full_matrices=False)
    keep = s > rtol * s.max() if s.numel() else s > 0
    return u[:, keep], s[keep], vh[keep]


def span_basis(selected: Tensor, rtol: float | None = None) -> Tensor:
    """Orthonormal basis ``U (N, r)`` of the column span of centred ``selected`` (see ``orthogonalize``)."""
    return _span_basis(_centre(selected), rtol)[0]


def orthogonalize(x: Tensor, selected: Tensor, rtol: float | None = None, null_tol: float = 1e-6,
                  basis: Tensor | None = None) -> Tensor:
    """The part of centred ``x`` orthogonal to the column span of centred ``selected``.

    ``X~ = Xc - U U^T Xc`` with ``U`` an orthonormal basis of ``span(Sc)`` from the SVD, keeping
    singular values above ``rtol * s_max`` (``rtol`` defaults to ``max(N, D) * eps``, as numpy's
    ``matrix_rank``). This is the least-squares residual of ``Xc`` regressed on ``Sc``. If what is
    left has ``||X~||_F <= null_tol * ||Xc||_F`` it is rounding noise of a candidate that lies in the
    span, and exact zeros are returned (noise would otherwise look perfectly isotropic).

    Args:
        x: Candidate features ``(N, Dx)``.
        selected: Selected features ``(N, Ds)`` (the concatenated selected layers).
        rtol: Relative singular-value cutoff for the rank of ``selected``.
        null_tol: Relative norm below which the residual is set to zero.
        basis: ``span_basis(selected, rtol)`` when already computed (one SVD serves every
            candidate of a selection step).

    Returns:
        The centred residual ``(N, Dx)``.
    """
    xc = _centre(x)
    u = basis if basis is not None else span_basis(selected, rtol)
    residual = xc - u @ (u.T @ xc)
    if torch.linalg.matrix_norm(residual) <= null_tol * torch.linalg.matrix_norm(xc):
        return torch.zeros_like(residual)
    return residual


@dataclass(frozen=True)
class Residualizer:
    """Maps new data to the orthogonalised features learnt on calibration data.

    ``x -> (x - x_mean) - (s - s_mean) @ coef``, with ``coef`` the minimum-norm least-squares
    coefficients of the centred calibration candidate on the centred calibration selection.

    Attributes:
        x_mean: ``(Dx,)`` calibration mean of the candidate.
        s_mean: ``(Ds,)`` calibration mean of the selected features.
        coef: ``(Ds, Dx)`` least-squares coefficients.
    """

    x_mean: Tensor
    s_mean: Tensor
    coef: Tensor

    def __call__(self, x: Tensor, selected: Tensor) -> Tensor:
        """Residualise ``x`` ``(N, Dx)`` on ``selected`` ``(N, Ds)`` with the calibration map."""
        return (x - self.x_mean) - (selected - self.s_mean) @ self.coef


def fit_residualizer(x: Tensor, selected: Tensor, rtol: float | None = None) -> Residualizer:
    """Fit the map of ``orthogonalize`` so that it can be applied to new data.

    ``coef = V_r diag(1/s_r) U_r^T Xc`` (pseudo-inverse of ``Sc`` restricted to its numerical rank),
    so on the calibration data ``Xc - Sc @ coef`` equals ``orthogonalize(x, selected)`` up to
    rounding (without the ``null_tol`` zeroing).

    Args:
        x: Candidate features ``(N, Dx)``.
        selected: Selected features ``(N, Ds)``.
        rtol: Relative singular-value cutoff, as in ``orthogonalize``.

    Returns:
        The fitted ``Residualizer``.
    """
    x_mean, s_mean = x.mean(dim=0), selected.mean(dim=0)
    u, s, vh = _span_basis(selected - s_mean, rtol)
    coef = vh.T @ ((u.T @ (x - x_mean)) / s.unsqueeze(-1))
    return Residualizer(x_mean=x_mean, s_mean=s_mean, coef=coef)


def isotropy(x: Tensor, kind: IsoKind = "participation", eps: float = 1e-6) -> Tensor:
    """Iso: how evenly the variance of ``x`` spreads over its ``D`` feature directions.

    ``participation`` (default, in ``[0, 1]``): with ``lambda_1..lambda_D`` the eigenvalues of the
    covariance of ``x``, ``Iso = (sum lambda)^2 / (D * sum lambda^2)``, the participation ratio
    divided by ``D``. It is 1 for isotropic data, ``1/D`` for rank-1 data and ``r/D`` for data spread
    evenly over ``r`` directions; with ``N <= D`` at most ``(N - 1)/D``. Computed without an
    eigendecomposition as ``||Xc||_F^4 / (D * ||G||_F^2)``, ``G`` the smaller of ``Xc^T Xc`` and
    ``Xc Xc^T``. All-constant ``x`` gives 0.

    ``mean_std`` (the public LOES code's definition, **unbounded**): ``mean(lambda) /
    (std(lambda) + eps)`` over the eigenvalues of ``cov + eps I`` clamped at ``eps`` (population
    std). It grows without bound as the spectrum flattens, so ``1 - Iso`` can be very negative.

    Args:
        x: Features ``(N, D)``.
        kind: ``participation`` or ``mean_std``.
        eps: Jitter and floor for ``mean_std``.

    Returns:
        A 0-dim tensor.
    """
    xc = _centre(x)
    n, d = xc.shape
    if kind == "participation":
        gram = xc.T @ xc if d <= n else xc @ xc.T
        denominator = d * torch.linalg.matrix_norm(gram).square()
        if denominator == 0:
            return torch.zeros((), dtype=x.dtype, device=x.device)
        return torch.linalg.matrix_norm(xc).pow(4) / denominator
    if kind == "mean_std":
        cov = xc.T @ xc / n + eps * torch.eye(d, dtype=x.dtype, device=x.device)
        eigenvalues = torch.linalg.eigvalsh(cov).clamp_min(eps)
        return eigenvalues.mean() / (eigenvalues.std(correction=0) + eps)
    raise ValueError(f"Unknown isotropy kind {kind!r}; use 'participation' or 'mean_std'.")


def redundancy(x: Tensor, selected: Tensor) -> Tensor:
    """Red: linear CKA between ``x`` and ``selected``, in ``[0, 1]``.

    ``Red = ||Sc^T Xc||_F^2 / (||Xc^T Xc||_F * ||Sc^T Sc||_F)`` with centred features (Kornblith et
    al., 2019). 0 when the two are uncorrelated, 1 when one is an orthogonal transform times a
    scalar of the other; invariant to rotations and isotropic scaling of either. Computed in feature
    space or, when ``N`` is smaller, with ``N x N`` Gram matrices. Constant input gives 0.

    Args:
        x: Candidate features ``(N, Dx)``.
        selected: Selected features ``(N, Ds)``.

    Returns:
        A 0-dim tensor.
    """
    xc, sc = _centre(x), _centre(selected)
    n = xc.shape[0]
    if n < xc.shape[1] + sc.shape[1]:
        gx, gs = xc @ xc.T, sc @ sc.T
        cross = (gx * gs).sum()
        norms = torch.linalg.matrix_norm(gx) * torch.linalg.matrix_norm(gs)
    else:
        cross = torch.linalg.matrix_norm(sc.T @ xc).square()
        norms = torch.linalg.matrix_norm(xc.T @ xc) * torch.linalg.matrix_norm(sc.T @ sc)
    if norms == 0:
        return torch.zeros((), dtype=x.dtype, device=x.device)
    return cross / norms


def class_centroids(x: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """Class means ``(C, D)`` of ``x`` for integer ``labels`` in ``0..num_classes-1``."""
    sums = torch.zeros(num_classes, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, labels, x)
    counts = torch.bincount(labels, minlength=num_classes).to(x.dtype).clamp_min(1)
    return sums / counts.unsqueeze(-1)


def _class_triples(num_classes: int, max_triples: int, seed: int, device: torch.device) -> Tensor:
    """All triples ``a < b < c`` if there are at most ``max_triples``, else a seeded uniform sample."""
    total = num_classes * (num_classes - 1) * (num_classes - 2) // 6
    if total <= max_triples:
        return torch.combinations(torch.arange(num_classes, device=device), r=3)
    generator = torch.Generator().manual_seed(seed)
    a = torch.randint(num_classes, (max_triples,), generator=generator)
    b = torch.randint(num_classes - 1, (max_triples,), generator=generator)
    b = b + (b >= a).long()
    c = torch.randint(num_classes - 2, (max_triples,), generator=generator)
    low, high = torch.minimum(a, b), torch.maximum(a, b)
    c = c + (c >= low).long()
    c = c + (c >= high).long()
    return torch.stack([a, b, c], dim=1).to(device)


def triangle_score(
    x: Tensor,
    labels: Tensor,
    num_classes: int | None = None,
    *,
    scale: float | Tensor | None = None,
    max_triples: int = 2000,
    seed: int = 0,
) -> Tensor:
    """Tri: mean area of the triangles spanned by triples of class centroids.

    With ``mu_c`` the mean of ``x`` over class ``c`` and ``s`` the scale,
    ``Tri = mean_{(a,b,c) in T} 1/2 sqrt(|u|^2 |v|^2 - (u.v)^2)``, ``u = (mu_b - mu_a)/s``,
    ``v = (mu_c - mu_a)/s``: the area of each triangle by the Gram-determinant (Lagrange) form of
    ``1/2 |u x v|``, valid in any dimension. ``T`` is every triple ``a < b < c`` of classes when
    there are at most ``max_triples`` of them, otherwise ``max_triples`` triples of distinct classes
    drawn uniformly with a generator seeded by ``seed`` (so the score is deterministic). The default
    scale is ``s = sqrt(trace Cov(x))`` (population covariance), which makes Tri invariant to
    rescaling ``x``; fewer than 3 classes or zero variance give 0. Larger Tri means class centroids
    that are spread out in more than one direction, so LOES subtracts it.

    Args:
        x: Features ``(N, D)``.
        labels: Integer class indices ``(N,)`` in ``0..C-1``.
        num_classes: ``C``; defaults to ``labels.max() + 1``.
        scale: Divide centroid differences by this; ``None`` uses ``sqrt(trace Cov(x))``.
        max_triples: Most triples to average over.
        seed: Seed for the triple sample when there are more than ``max_triples`` triples.

    Returns:
        A 0-dim tensor.
    """
    labels = labels.long()
    num_classes = int(labels.max()) + 1 if num_classes is None else num_classes
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    if num_classes < 3:
        return zero
    if scale is None:
        scale = _centre(x).square().sum(dim=1).mean().sqrt()
    if float(scale) == 0:
        return zero
    return centroid_triangle_area(class_centroids(x, labels, num_classes) / scale, max_triples, seed)


def centroid_triangle_area(centroids: Tensor, max_triples: int = 2000, seed: int = 0) -> Tensor:
    """Mean triangle area over class triples of centroids ``(C, D)``, ``C >= 3``: Tri's core.

    The triples are those of ``triangle_score`` (every ``a < b < c``, or a seeded sample of
    ``max_triples``); the centroids are used as given (already divided by the scale).
    """
    triples = _class_triples(centroids.shape[0], max_triples, seed, centroids.device)
    u = centroids[triples[:, 1]] - centroids[triples[:, 0]]
    v = centroids[triples[:, 2]] - centroids[triples[:, 0]]
    gram_det = u.square().sum(1) * v.square().sum(1) - (u * v).sum(1).square()
    return 0.5 * gram_det.clamp_min(0).sqrt().mean()
