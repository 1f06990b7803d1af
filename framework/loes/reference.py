r"""The public LOES reference algorithm, term by term, as ``select_layers(..., variant="reference")`` runs it.

This module reproduces the reference implementation (``loes/api.py``,
``select_layers_from_custom_embeddings``) term by term; it is checked against the reference's
recorded outputs (``tests/test_loes_reference.py``) and, in float64, against a plain
re-implementation (``tests/test_loes_selection_speed_equivalence.py``). The products over the
samples run in the reference's dtype, float32 by default, because several of its terms (Red above
all) lose digits in float32 that a float64 rewrite would not reproduce. ``reference_greedy`` takes
every term from those products by exact identities (``_SelectionProducts``), with the small
``D x D`` algebra on them in float64, as the reference's solves: so where a float32 probe nearly
interpolates (``D`` close to ``N``, tiny ``reg``), its score can move by float32 rounding, as the
reference's own float32 and float64 runs differ there.

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
* Iso: ``mean / (std + 1e-6)`` (population std) of the covariance eigenvalues ``cov = Xc^T Xc / N``,
  each clamped at ``1e-6`` from below: ``eigvalsh(cov + 1e-6 I)`` for ``D <= 512``, the squared
  singular values of the centred data over ``N`` otherwise. It is unbounded above, so ``1 - Iso`` can
  be negative; on a (nearly) constant layer every eigenvalue sits at the ``1e-6`` floor and Iso is 1;
* Red: the largest, over the selected layers ``S_j``, of ``||H^T S_j||_F / (||H||_F ||S_j||_F)`` on
  raw, uncentred data;
* Tri: the mean area ``1/2 sqrt(|u|^2 |v|^2 - (u.v)^2)`` of ``min(200, 3C)`` class-centroid triplets,
  each triplet three classes drawn uniformly *with replacement* (a repeated class gives area 0), in
  the candidate's raw units; 0 below 3 classes. The draws come from one generator seeded once per
  selection, so a selection is reproducible but Tri is a random estimate.

Differences from ripieno's own variant are listed in ``ripieno.framework.loes.selection``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ripieno.framework.nn.cholesky import cholesky_solve
from ripieno.framework.nn.gram import gram_matrix
from ripieno.framework.nn.thin_products import thin_matmul

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
    xc = x - x.mean(dim=0, keepdim=True)
    y_mean = y.mean(dim=0, keepdim=True)
    weights = _solve_accurately(xc.T @ xc, reg, thin_matmul(xc.T, y - y_mean))
    return thin_matmul(xc, weights) + y_mean


def _solve_accurately(gram: Tensor, ridge: float, rhs: Tensor, overwrite: bool = False) -> Tensor:
    """``(gram + ridge I)^{-1} rhs`` solved in float64, returned in ``gram``'s dtype.

    The one place the reference's float32 is not kept: when a probe nearly interpolates (``D`` close
    to ``N``, tiny ``reg``) a float32 solve's rounding exceeds the score gaps between layers, so the
    choice would depend on the order of floating-point operations rather than on the data. The
    matrix is symmetric positive definite unless rounding made it otherwise, so Cholesky (half the
    work of LU) solves it, and LU where Cholesky fails. ``overwrite`` lets a float64 ``gram`` that
    the caller no longer needs take the ridge in place, instead of a copy.
    """
    matrix = gram if overwrite and gram.dtype == torch.float64 else gram.to(torch.float64, copy=True)
    matrix.diagonal().add_(ridge)
    factor, info = torch.linalg.cholesky_ex(matrix)
    if int(info) == 0:
        return cholesky_solve(rhs.double(), factor).to(gram.dtype)
    return torch.linalg.solve(matrix, rhs.double()).to(gram.dtype)


def reference_isotropy(x: Tensor) -> Tensor:
    """Iso: ``mean / (std + 1e-6)`` (population std) of the clamped covariance eigenvalues of ``x``.

    The eigenvalues are those of ``Xc^T Xc / N + 1e-6 I`` (``D <= 512``) or ``svdvals(Xc)^2 / N``,
    clamped at ``1e-6`` from below, as in the reference. Their mean and standard deviation come from
    traces (``_spectrum_mean_over_std``) wherever the clamp provably changes nothing (every eigenvalue
    of ``cov + 1e-6 I`` is at least ``1e-6``; a wide layer's smallest eigenvalue clears it when
    ``cov - 1e-6 I`` has a Cholesky factor), and from the eigenvalues themselves otherwise.

    Example:
        >>> x = torch.randn(500, 4, generator=torch.Generator().manual_seed(0))
        >>> bool(reference_isotropy(x) > 5)  # nearly isotropic: eigenvalues close, std small
        True
    """
    n, d = x.shape
    xc = x - x.mean(dim=0, keepdim=True)
    if d <= ISO_EIGH_MAX_DIM:
        return _covariance_isotropy(xc.T @ xc, n)
    wide = xc.double()
    # the min(N, D) squared singular values over N are the eigenvalues of this (D x D or N x N) matrix
    spectrum = (wide.T @ wide if d <= n else wide @ wide.T) / n
    floor_cleared = spectrum - ISO_JITTER * torch.eye(spectrum.shape[0], dtype=spectrum.dtype)
    if d < n and int(torch.linalg.cholesky_ex(floor_cleared).info) == 0:  # no eigenvalue below the floor
        return _spectrum_mean_over_std(spectrum).to(x.dtype)
    eigenvalues = torch.linalg.eigvalsh(spectrum).clamp(min=ISO_JITTER)
    return (eigenvalues.mean() / (eigenvalues.std(correction=0) + ISO_JITTER)).to(x.dtype)


def _covariance_isotropy(gram: Tensor, n: int) -> Tensor:
    """``reference_isotropy`` (``D <= 512``) from ``xc^T xc``, which the step-0 ridge probe shares.

    Every eigenvalue of ``cov + 1e-6 I`` is at least ``1e-6`` (``cov`` is a covariance), so the
    reference's clamp at ``1e-6`` changes nothing and the moments come from traces.
    """
    cov = gram / n
    cov.diagonal().add_(ISO_JITTER)  # + 1e-6 I: the matrix the reference decomposes, in its dtype
    return _spectrum_mean_over_std(cov.double()).to(gram.dtype)


def _spectrum_mean_over_std(matrix: Tensor) -> Tensor:
    """``mean / (std + 1e-6)`` (population std) of a symmetric matrix's eigenvalues, without computing them.

    Identities, not approximations: ``sum(lambda) = tr M`` and ``sum((lambda - m)^2) = ||M - m I||_F^2``,
    the latter as ``2 ||strictly lower||^2 + ||diag - m||^2``. Only the lower triangle is read, as
    ``eigvalsh`` does. Hand-written because the eigenvalues themselves (an ``O(D^3)`` iterative
    decomposition) are not needed, only two of their moments.
    """
    count = matrix.shape[0]
    diagonal = matrix.diagonal()
    mean = diagonal.sum() / count
    lower = matrix.tril(-1).reshape(-1)  # one copy; the symmetric matrix was never formed
    spread = 2 * torch.dot(lower, lower) + (diagonal - mean).square().sum()
    return mean / ((spread / count).sqrt() + ISO_JITTER)  # the reference's ``std + 1e-6``


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
    return _centroid_triangle(_class_means(x, labels, num_classes), generator)


def _class_means(x: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    sums = torch.zeros(num_classes, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, labels, x)
    counts = torch.bincount(labels, minlength=num_classes).to(x.dtype).clamp_min(1)
    return sums / counts.unsqueeze(-1)


def _centroid_triangle(centroids: Tensor, generator: torch.Generator) -> Tensor:
    """``reference_triangle`` from the class centroids ``(C, D)``, ``C >= 3``."""
    num_classes = centroids.shape[0]
    count = min(TRI_MAX_TRIPLETS, 3 * num_classes)
    triplets = torch.randint(num_classes, (count, 3), generator=generator).to(centroids.device)
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

    Every term is the one the functions above define, computed without redoing, for each candidate,
    work over the ``N`` samples that the candidates share (see ``_SelectionProducts``): each layer's
    centred features and Gram (shared by Iso and the step-0 probe) and its products with each
    selected layer are computed once, in the reference's dtype, and a candidate's orthogonalised part
    enters only through its Gram, centroids and products with the targets.

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
    products = _SelectionProducts(views, labels, num_classes if labels is not None else 0)
    isotropies = products.isotropies()
    chosen: list[int] = []
    rows: list[dict[str, Any]] = []
    prediction = None if targets is None else torch.zeros_like(targets)
    nan = float("nan")
    for step in range(k):
        residual = None if targets is None else targets - prediction
        products.begin_step(chosen, residual)
        formed: _Orthogonalizer | None = None  # the reference's own, for rank-deficient parts
        selected_dims = sum(views[i].shape[1] for i in chosen)
        best: tuple[float, int, Callable[[], Tensor] | None] | None = None
        step_rows = []
        for layer in (i for i in range(len(views)) if i not in chosen):
            # A part with more columns than the samples left to it (selected + candidate widths > N) is
            # rank-deficient: its probe fits rounding noise, so only the reference's own float32
            # operations on the formed features reproduce its choice (the wide fixture set).
            deficient = bool(chosen) and selected_dims + views[layer].shape[1] > products.n
            features = part = None
            if deficient:
                if formed is None:
                    formed = _Orthogonalizer(torch.cat([views[i] for i in chosen], dim=1))
                features = formed(views[layer])
            elif chosen:
                part = products.part(layer)
            ridge = red = tri = nan
            predict = None
            total = weights.alpha * (1.0 - isotropies[layer])
            if residual is not None:
                if features is not None:
                    fitted = reference_ridge_prediction(features, residual, weights.reg)
                    ridge = float((residual - fitted).square().mean())
                    predict = functools.partial(_same, fitted)
                else:
                    ridge, predict = products.ridge_probe(layer, part, weights.reg)
                total += ridge
            if chosen:
                red = float(products.redundancy(layer, chosen))
                total += weights.gamma * red
                if labels is not None:
                    tri = float(reference_triangle(features, labels, num_classes, generator)
                                if features is not None else products.triangle(layer, part, generator))
                    total -= weights.eta * tri
            step_rows.append({"layer": layer, "ridge_loss": ridge, "iso": isotropies[layer], "red": red,
                              "tri": tri, "total": total, "selected": False, "step": step})
            if best is None or total < best[0] or (math.isnan(best[0]) and not math.isnan(total)):
                best = (total, layer, predict)
        assert best is not None
        _, layer, predict = best
        for row in step_rows:
            row["selected"] = row["layer"] == layer
        chosen.append(layer)
        rows.extend(step_rows)
        if prediction is not None and predict is not None:
            prediction = prediction + predict()
    return chosen, rows


def _same(value: Tensor) -> Tensor:
    return value


#: The in-sample probe loss comes from the identity ``||Yc||^2 - b.W - reg ||W||^2`` while the fit
#: explains at most this multiple of what it leaves (``||Fc W||^2 <= _IDENTITY_MAX_EXPLAINED * SSE``);
#: better fits are scored from their formed prediction, as the reference does.
_IDENTITY_MAX_EXPLAINED = 1.0


@dataclass(frozen=True)
class _Part:
    """A candidate's orthogonalised part ``F = Xc - Sc coef`` (``reference_orthogonalize``), unformed.

    ``gram`` is ``Fc^T Fc`` of its centred version ``Fc = F - mean(F)``, in float64; the probe
    (``ridge_probe``) adds its ridge to it in place, so it is read before the probe or not at all.
    """

    layer: int
    coef: Tensor  # (sum D_selected, D), in the computation dtype, as the reference applies it
    mean: Tensor  # (1, D) mean of F (zero up to rounding)
    gram: Tensor


def _spd_inverse(matrix: Tensor) -> Tensor | None:
    """The inverse of a symmetric positive definite matrix from its Cholesky factor (``None`` if not SPD)."""
    factor, info = torch.linalg.cholesky_ex(matrix)
    return torch.cholesky_inverse(factor) if int(info) == 0 else None


class _GrownSolver:
    """``(Sc^T Sc + 1e-6 I)^-1 C`` for a selection that adds one layer to the previous step's, by blocks.

    With ``M = [[A, B], [B^T, D]]`` (``A`` the previous selection's matrix, ``B`` its products with the
    new layer, ``D`` the new layer's Gram plus the ridge) and the previous step's solutions
    ``q = A^-1 C_prev`` of every candidate (``X = A^-1 B`` among them: the new layer was a candidate),
    the Schur complement ``S = D - B^T X`` gives ``z = S^-1 (C_new - B^T q)`` and the solution
    ``[q - X z; z]``: three ``D x D`` products per candidate instead of one with the whole inverse
    (``(2D)^2 D`` multiply-adds), and no ``2D x 2D`` inverse at all.
    """

    def __init__(self, side: Tensor, x: Tensor, schur_inverse: Tensor) -> None:
        self.side, self.x, self.schur_inverse = side, x, schur_inverse

    def __call__(self, previous: Tensor, new: Tensor) -> Tensor:
        # Both block rows are written into the result itself (row slices are contiguous): no concatenation.
        size = previous.shape[0]
        out = previous.new_empty(size + new.shape[0], new.shape[1])
        z = torch.mm(self.schur_inverse, torch.addmm(new, self.side.T, previous, alpha=-1), out=out[size:])
        torch.addmm(previous, self.x, z, alpha=-1, out=out[:size])
        return out


def _grown_solver(side: Tensor, x: Tensor, corner: Tensor) -> _GrownSolver | None:
    """The block solver from ``B``, ``X = A^-1 B`` and ``D`` (``None`` if the Schur complement is not SPD)."""
    schur_inverse = _spd_inverse(torch.addmm(corner, side.T, x, alpha=-1))
    return None if schur_inverse is None else _GrownSolver(side, x, schur_inverse)


class _SelectionProducts:
    """The products over the samples that the reference's terms are made of, each computed once.

    Hand-written linear algebra because the reference's per-candidate steps (orthogonalise, centre,
    form the Gram, fit) each pass over all ``N`` samples, while every quantity they produce follows
    from ``D x D`` products that the candidates share:

    * with ``Sc`` the centred selected layers and ``C = Sc^T Xc``, the orthogonalised part
      ``F = Xc - Sc coef``, ``coef = (Sc^T Sc + 1e-6 I)^-1 C``, has ``F^T F = Xc^T Xc - (C +
      1e-6 coef)^T coef`` (substituting ``Sc^T Sc coef = C - 1e-6 coef``), and ``Fc = F - mean(F)``
      has Gram ``F^T F - N mean^T mean``;
    * the probe on ``Fc`` needs ``b = Fc^T Yc = Xc^T Yc - coef^T Sc^T Yc``, and its in-sample loss is
      ``||Yc - Fc W||^2 = ||Yc||^2 - b.W - reg ||W||^2`` since ``(Fc^T Fc + reg I) W = b``; where the
      fit explains much of ``Yc`` that difference would lose digits, so the loss comes from the
      prediction ``Xc W - Sc (coef W) - mean W + mean(Y)``, formed as the reference forms it (and
      formed anyway for the chosen candidate, whose prediction the next steps fit against);
      Tri needs class means, ``M(Xc) - M(Sc) coef``;
    * Red's ``X^T S`` of the raw layers is ``Xc^T Sc + N mean(X)^T mean(S)``.

    The products over the samples (``Xc^T Xc``, ``Sc^T Xc``, the targets and class means) are those
    of the reference, in its dtype; the ``D x D`` algebra on them is float64, as its solves. A
    candidate's product with the newest selected layer and with the residual targets is one GEMM
    (``[Sc_new, Yc]^T Xc``): one pass over its features instead of two.
    """

    def __init__(self, views: list[Tensor], labels: Tensor | None, num_classes: int) -> None:
        self.views = views
        self.n = views[0].shape[0]
        self.means = [v.mean(dim=0, keepdim=True) for v in views]
        self.centred = [v - m for v, m in zip(views, self.means, strict=True)]
        self.grams = [gram_matrix(xc) for xc in self.centred]  # shared by Iso and the step-0 probe
        self.grams64 = [g.double() for g in self.grams]
        self.centred_means = [xc.mean(dim=0, keepdim=True).double() for xc in self.centred]  # ~0
        self.norms = [torch.linalg.matrix_norm(v) for v in views]
        self.cross: dict[tuple[int, int], Tensor] = {}  # (selected, other) -> Sc_selected^T Xc_other
        self.cross64: dict[tuple[int, int], Tensor] = {}  # the same in float64, for the D x D algebra
        self.labels, self.num_classes = labels, num_classes
        self.class_means: dict[int, Tensor] = {}
        # The current step: its selection, solver, residual targets (centred) and their products.
        self.selection: list[int] = []
        self.solve: Callable[[int, Tensor], Tensor] | None = None  # (layer, Sc^T Xc in float64) -> coef
        self.coefs: dict[int, Tensor] = {}  # float64 coef of every candidate formed at this step
        self.targets: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # (Y, Yc, mean(Y), Sc^T Yc)
        self.target_products: dict[int, Tensor] = {}  # layer -> Xc^T Yc of this step
        self.fused_rows: Tensor | None = None  # [Sc_new, Yc] (N, D_new + T)

    def isotropies(self) -> list[float]:
        return [float(_covariance_isotropy(g, self.n) if v.shape[1] <= ISO_EIGH_MAX_DIM
                      else reference_isotropy(v)) for v, g in zip(self.views, self.grams, strict=True)]

    def _cross(self, selected: int, other: int) -> Tensor:
        key = (selected, other)
        if key not in self.cross:
            self.cross[key] = self.centred[selected].T @ self.centred[other]
        return self.cross[key]

    def _cross64(self, selected: int, other: int) -> Tensor:
        key = (selected, other)
        if key not in self.cross64:
            self.cross64[key] = self._cross(selected, other).double()
        return self.cross64[key]

    def _block(self, a: int, b: int) -> Tensor:
        """``Xc_a^T Xc_b`` from the Grams and cached cross products."""
        if a == b:
            return self.grams[a]
        if (a, b) in self.cross:
            return self.cross[(a, b)]
        return self._cross(b, a).T

    # ------------------------------------------------------------------ one step

    def begin_step(self, chosen: list[int], y: Tensor | None) -> None:
        """Set up the step that scores candidates against ``chosen`` with residual targets ``y``."""
        previous, previous_coefs = self.selection, self.coefs
        self.selection, self.coefs, self.target_products = list(chosen), {}, {}
        self.targets = self.fused_rows = None
        if y is not None:
            y_mean = y.mean(dim=0, keepdim=True)
            yc = y - y_mean
            sc_y = yc[:0] if not chosen else torch.cat([thin_matmul(self.centred[c].T, yc) for c in chosen])
            self.targets = (y, yc, y_mean, sc_y)
        self.solve = self._selection_solver(chosen, previous, previous_coefs) if chosen else None
        if chosen and y is not None:
            self.fused_rows = torch.cat([self.centred[chosen[-1]], self.targets[1]], dim=1)

    def _selection_solver(
        self, chosen: list[int], previous: list[int], previous_coefs: dict[int, Tensor]
    ) -> Callable[[int, Tensor], Tensor]:
        """``(layer, C) -> (Sc^T Sc + 1e-6 I)^-1 C`` for the candidates of one step.

        The matrix is symmetric positive definite, so its inverse, formed once per step from its
        Cholesky factor, turns each candidate's solve into one GEMM. A step that adds one layer to
        the previous step's selection solves by blocks from the previous step's solutions instead
        (``_GrownSolver``). The reference's ``torch.linalg.solve`` is the LU solve, which stays where
        Cholesky fails; they agree to float64 rounding.
        """
        new = chosen[-1]
        if previous and previous == chosen[:-1] and new in previous_coefs:
            side = torch.cat([self._block(c, new) for c in previous], dim=0).double()
            corner = self.grams64[new].clone()
            corner.diagonal().add_(ORTHOGONALIZATION_RIDGE)
            grown = _grown_solver(side, previous_coefs[new], corner)
            if grown is not None:
                sizes = [sum(self.views[c].shape[1] for c in previous), self.views[new].shape[1]]

                def solve_grown(layer: int, rhs: Tensor) -> Tensor:
                    prior = previous_coefs.get(layer)
                    if prior is None:  # not formed at the previous step (a rank-deficient part there)
                        prior = self._solve_direct(previous, rhs[:sizes[0]])
                    return grown(prior, rhs[sizes[0]:])

                return solve_grown
        gram = self._selection_matrix(chosen)
        inverse = _spd_inverse(gram)
        if inverse is None:
            lu = torch.linalg.lu_factor(gram)
            return lambda layer, rhs: torch.linalg.lu_solve(*lu, rhs)
        return lambda layer, rhs: inverse @ rhs

    def _solve_direct(self, chosen: list[int], rhs: Tensor) -> Tensor:
        """``(Sc^T Sc + 1e-6 I)^-1 rhs`` for a selection other than the step's, by LU, as the reference."""
        return torch.linalg.solve(self._selection_matrix(chosen), rhs)

    def _selection_matrix(self, chosen: list[int]) -> Tensor:
        """``Sc^T Sc + 1e-6 I`` in float64, assembled from the Grams and cross blocks."""
        rows = [torch.cat([self._block(a, b) for b in chosen], dim=1) for a in chosen]
        gram = torch.cat(rows, dim=0).double()
        gram.diagonal().add_(ORTHOGONALIZATION_RIDGE)
        return gram

    def _step_products(self, layer: int) -> None:
        """``Sc_new^T Xc`` and ``Xc^T Yc`` of a candidate, in one pass over its features."""
        new = self.selection[-1]
        if self.fused_rows is None or (new, layer) in self.cross:
            return
        product = self.fused_rows.mT @ self.centred[layer]
        width = self.views[new].shape[1]
        self.cross[(new, layer)] = product[:width]
        self.target_products[layer] = product[width:].mT

    def part(self, layer: int) -> _Part:
        """``reference_orthogonalize`` of a candidate against the step's selection, unformed."""
        assert self.solve is not None
        self._step_products(layer)
        chosen = self.selection
        blocks = [self._cross64(c, layer) for c in chosen]
        rhs = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=0)  # read only: no copy of one block
        coef = self.solve(layer, rhs)
        self.coefs[layer] = coef
        xc = self.centred[layer]
        sc_mean = torch.cat([self.centred_means[c] for c in chosen], dim=1)
        mean = self.centred_means[layer] - sc_mean @ coef
        # F^T F = Xc^T Xc - (C + 1e-6 coef)^T coef, then centred: minus N mean^T mean.
        shifted = torch.add(rhs, coef, alpha=ORTHOGONALIZATION_RIDGE)
        f_gram = torch.addmm(self.grams64[layer], shifted.T, coef, alpha=-1)
        f_gram.addr_(mean[0], mean[0], alpha=-self.n)  # in place: the rank-one term (BLAS ger)
        return _Part(layer, coef.to(xc.dtype), mean.to(xc.dtype), f_gram)

    def ridge_probe(self, layer: int, part: _Part | None, reg: float) -> tuple[float, Callable[[], Tensor]]:
        """The probe's in-sample MSE on the step's targets, and its prediction (formed when called).

        The probe is ``reference_ridge_prediction``'s, on the raw layer (``part=None``) or on its
        orthogonalised part.
        """
        assert self.targets is not None
        y, yc, y_mean, sc_y = self.targets
        xc = self.centred[layer]
        xty = self.target_products.get(layer)
        if xty is None:
            xty = thin_matmul(xc.T, yc)
        if part is None:
            rhs, gram = xty, self.grams64[layer]
        else:
            rhs = xty - thin_matmul(part.coef.T, sc_y) - part.mean.T @ yc.sum(dim=0, keepdim=True)
            gram = part.gram
        weights = _solve_accurately(gram, reg, rhs, overwrite=part is not None)  # float64; part.gram is spent
        predict = functools.partial(self._prediction, layer, part, weights.to(xc.dtype), y_mean)
        bw, ww = (rhs.double() * weights).sum(), weights.square().sum()
        sse = yc.double().square().sum() - bw - reg * ww
        if float(bw - reg * ww) <= _IDENTITY_MAX_EXPLAINED * float(sse):
            return float(sse) / yc.numel(), predict
        return float((y - predict()).square().mean()), predict

    def _prediction(self, layer: int, part: _Part | None, weights: Tensor, y_mean: Tensor) -> Tensor:
        """``Xc W - Sc (coef W) - mean W + mean(Y)``, in the computation dtype."""
        fitted = thin_matmul(self.centred[layer], weights)
        if part is not None:
            sc = [self.centred[c] for c in self.selection]
            coef_w = thin_matmul(part.coef, weights).split([s.shape[1] for s in sc])
            selected = sum(thin_matmul(s, w) for s, w in zip(sc, coef_w, strict=True))
            fitted = fitted - selected - part.mean @ weights
        return fitted + y_mean

    def redundancy(self, layer: int, chosen: list[int]) -> Tensor:
        """``reference_redundancy`` of the raw layer against each chosen one."""
        values = []
        for c in chosen:
            # S^T X = Sc^T Xc + N mean(S)^T mean(X), the rank-one term added in place (BLAS ger).
            raw = torch.addr(self._cross64(c, layer), self.means[c][0].double(),
                             self.means[layer][0].double(), alpha=self.n)
            norms = self.norms[layer].double() * self.norms[c].double()
            values.append(torch.linalg.matrix_norm(raw) / norms)
        return torch.stack(values).max()

    def triangle(self, layer: int, part: _Part | None, generator: torch.Generator) -> Tensor:
        """``reference_triangle`` of the orthogonalised part (its centroids from class means)."""
        xc = self.centred[layer]
        if self.num_classes < 3 or self.labels is None:
            return torch.zeros((), dtype=xc.dtype, device=xc.device)
        means = self._class_mean(layer)
        if part is not None:
            means = means - torch.cat([self._class_mean(c) for c in self.selection], dim=1) @ part.coef
        return _centroid_triangle(means, generator)

    def _class_mean(self, layer: int) -> Tensor:
        if layer not in self.class_means:
            assert self.labels is not None
            self.class_means[layer] = _class_means(self.centred[layer], self.labels, self.num_classes)
        return self.class_means[layer]
