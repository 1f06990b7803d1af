"""LOES steps scored from cached Gram blocks: the same values as ``candidate_scores``, reusing every product.

See ``GramScorer``. ``greedy.greedy_steps`` uses it for every step it can reproduce exactly and
falls back to ``candidate_scores.direct_step`` (the oracle) for the rest.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from ripieno.framework.loes.candidate_scores import ScoreWeights, loes_total
from ripieno.framework.loes.geometry import centroid_triangle_area, class_centroids
from ripieno.framework.loes.gram_blocks import (
    DEFLATE_ITERATIONS,
    DEFLATE_MAX,
    DROP_MARGIN,
    KEEP_MARGIN,
    NULL_TOL,
    Block,
    StepFit,
    centred_copy,
    shifted_diagonal,
)
from ripieno.framework.loes.selection_inputs import SelectionTargets
from ripieno.framework.nn.cholesky import cholesky_solve
from ripieno.framework.nn.gram import gram_matrix
from ripieno.framework.nn.thin_products import thin_matmul


class GramScorer:
    """Scores LOES steps exactly as ``score_candidate`` does, from Gram blocks instead of features.

    Hand-written linear algebra because no library routine scores many orthogonalised ridge probes
    that share one basis: this reuses every per-layer product across candidates and steps.

    With ``Xc_l`` the centred layers and ``c_1..c_t`` the chosen ones:

    * the basis of the selected span (``span_basis``) is built one block per chosen layer from the
      chosen layer's residual Gram ``G~`` (its Gram after projecting out the earlier blocks):
      ``U_j = H~ L^-T`` from its Cholesky factor where it is clearly full rank, the same after
      removing a few null directions (``_deflated_block``: LayerNorm outputs), else from its
      eigenvectors, ``U_j = H~ V / s`` keeping ``s`` above ``span_basis``'s cutoff. While the
      spectrum is clearly split at the cutoff (``KEEP_MARGIN``, ``DROP_MARGIN``) this spans what the
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

    def __init__(self, views: list[Tensor], targets: SelectionTargets, weights: ScoreWeights,
                 dtype: torch.dtype) -> None:
        self.views, self.targets, self.weights = views, targets, weights
        self.n = views[0].shape[0]
        self.loo = targets.matrix is not None and weights.loss == "loo"
        self.xc = [centred_copy(v, dtype) for v in views]
        self.gram = [gram_matrix(x) for x in self.xc]
        self.sq = [g.diagonal().sum() for g in self.gram]  # ||Xc||_F^2
        self.gram_norm = [torch.linalg.matrix_norm(g) for g in self.gram]
        self.resid_gram = list(self.gram)  # G~ of every layer against the blocks so far
        self.coords: list[list[Tensor]] = [[] for _ in views]  # A_j of every layer, one per block
        self.resid = list(self.xc) if self.loo else None  # H~ of every layer (leave-one-out only)
        self.cross: dict[tuple[int, int], Tensor] = {}  # (chosen, other) -> Xc_chosen^T Xc_other
        self.cross_square: dict[tuple[int, int], Tensor] = {}  # the same -> its squared Frobenius norm
        self.blocks: list[Block] = []
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
        cls, views: list[Tensor], targets: SelectionTargets, weights: ScoreWeights, dtype: torch.dtype
    ) -> GramScorer | None:
        """The scorer, or ``None`` when a layer is wider than the sample count (the dual forms)."""
        n = views[0].shape[0]
        if any(v.shape[1] > n for v in views):
            return None
        return cls(views, targets, weights, dtype)

    @property
    def chosen(self) -> list[int]:
        """The chosen layers, in the order chosen."""
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

    def _new_block(self, layer: int, base: Tensor, s_low: float, s_high: float, dropped_max: float) -> Block:
        """The block ``U_new = (Xc - sum_j U_j A_j) base`` of a chosen layer, as coefficients."""
        t_new: list[Tensor] = []
        for i in range(len(self.blocks)):
            t_new.append(-sum(self.blocks[j].t[i] @ (self.coords[layer][j] @ base)
                              for j in range(i, len(self.blocks))))
        t_new.append(base)
        return Block(layer, t_new, s_low, s_high, dropped_max)

    def _cholesky_block(self, layer: int, factor: float, members: list[int]) -> Block | None:
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
        if int(info) != 0 or float(chol.diagonal().min()) < KEEP_MARGIN * factor * s_low:
            return None
        eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
        base = torch.linalg.solve_triangular(chol, eye, upper=False).T  # L^-T, upper triangular
        if not bool(torch.isfinite(base).all()):
            return None
        s_high = math.sqrt(float(torch.linalg.matrix_norm(gram)))
        block = self._new_block(layer, base, s_low, s_high, 0.0)
        low = self._selection_low(s_low, members)
        return block if self._split_is_clear([*self.blocks, block], factor, low) else None

    def _deflated_block(self, layer: int, factor: float, members: list[int]) -> Block | None:
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
        fails, no or more than ``DEFLATE_MAX`` directions lie below the cutoff, or the split is not
        clear.
        """
        gram = self.resid_gram[layer]
        d = gram.shape[0]
        s_low = math.sqrt(max(float(gram.diagonal().max()), 0.0))
        count = DEFLATE_MAX + 2  # two guard vectors beyond the most directions removed
        if s_low == 0 or d <= count:
            return None
        low = self._selection_low(s_low, members)
        shifted, info = torch.linalg.cholesky_ex(shifted_diagonal(gram, (factor * low) ** 2))
        if int(info) != 0:
            return None
        # A fixed start from a local generator: no random numbers drawn from the caller's streams.
        start = torch.Generator(device=gram.device).manual_seed(0)
        basis = torch.randn(d, count, generator=start, dtype=gram.dtype, device=gram.device)
        for _ in range(DEFLATE_ITERATIONS):
            basis = torch.linalg.qr(cholesky_solve(basis, shifted)).Q
        ritz, vectors = torch.linalg.eigh(basis.T @ gram @ basis)
        drop = int((ritz <= (factor * low / DROP_MARGIN) ** 2).sum())
        if not 0 < drop <= DEFLATE_MAX:
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

    def _eigh_block(self, layer: int, factor: float, members: list[int]) -> Block | None:
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

    def _split_is_clear(self, blocks: list[Block], factor: float, low: float) -> bool:
        """Whether the joint SVD keeps exactly the blocks' kept directions.

        The selection is ``U R + E`` with ``E`` the dropped parts (``||E|| <= e``) and ``T`` a right
        inverse of ``R``, so its kept singular values are at least ``1/||T||_F - 2e`` and the others
        at most ``e``; ``s_max`` lies between ``low`` and the root of the summed squared norms.
        """
        high = math.sqrt(blocks[0].s_high ** 2 + sum(float(self.gram_norm[b.layer]) for b in blocks[1:]))
        e = math.sqrt(sum(b.dropped_max**2 for b in blocks))
        t_norm = math.sqrt(sum(float(t.square().sum()) for b in blocks for t in b.t))
        kept_low = math.inf if t_norm == 0 else 1.0 / t_norm - 2 * e
        return kept_low >= KEEP_MARGIN * factor * high and e <= factor * low / DROP_MARGIN

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
            self.fit_rows = [[torch.linalg.cholesky(shifted_diagonal(self.gram[layer], self.weights.lam))
                              if first is None else first]]
            self.first_factors.clear()
            return
        w = self._forward_solve([self.cross[(c, layer)] for c in self.chosen[:-1]])
        schur = shifted_diagonal(self.gram[layer], self.weights.lam)
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

    def _fit_residual(self) -> StepFit | None:
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
        return StepFit(residual, coef, units, residual.square().sum())

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
        self, layer: int, fit: StepFit | None, tri_means: list[Tensor] | None, gs_norm: Tensor | None
    ) -> dict[str, Any]:
        w = self.weights
        nan = float("nan")
        ridge = red = tri = nan
        gram = self.resid_gram[layer]
        trace, norm = gram.diagonal().sum(), torch.linalg.matrix_norm(gram)
        null = bool(self.blocks) and bool(trace.clamp_min(0).sqrt() <= NULL_TOL * self.sq[layer].sqrt())
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
        total = loes_total(w, ridge, iso, red, tri)
        return {"layer": layer, "ridge_loss": ridge, "iso": iso, "red": red, "tri": tri, "total": total}

    def _ridge(self, layer: int, fit: StepFit, null: bool, norm: Tensor) -> Tensor:
        """``ridge_loss`` of the candidate's orthogonalised part against the residual targets."""
        numel = fit.residual.numel()
        if null:  # zero features: the probe predicts the mean, every leverage is 1/N
            if not self.loo:
                return fit.sq / numel
            return (fit.residual / (1.0 - 1.0 / self.n)).square().mean()
        gram = self.resid_gram[layer]
        factor = torch.linalg.cholesky(shifted_diagonal(gram, self.weights.lam))
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
