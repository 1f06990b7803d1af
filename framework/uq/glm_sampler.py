r"""Exact posterior samples of a linearised network by sample-then-optimise.

Model: ``f_lin(x; theta) = f(x; theta*) + J(x) z`` with ``z = theta - theta*``, prior
``z ~ N(0, 1/lambda I)`` (prior centred at the trained weights), and a likelihood whose
Hessian in the outputs is ``Lambda(x)``: ``I / sigma^2`` for Gaussian regression, the
softmax Hessian ``diag(p) - p p^T`` at ``theta*`` for classification, ``p (1 - p)`` for a
single sigmoid logit (generalised Gauss-Newton). The Laplace / GGN posterior is ``z ~ N(0, H^{-1})`` with
``H = sum_i J_i^T Lambda_i J_i + lambda I``.

Randomise-then-optimise (Antoran et al., 2023, eq. 7): draw ``z0 ~ N(0, 1/lambda I)`` and
``e_i ~ N(0, I)``, set ``b = lambda z0 + sum_i J_i^T R_i e_i`` with ``R_i R_i^T = Lambda_i``
(for the softmax Hessian ``R = diag(sqrt p) - p sqrt(p)^T``, O(C)), and minimise

    L(z) = 1/2 sum_i || R_i^T J_i z ||^2 + lambda/2 || z - b / lambda ||^2,

whose minimiser ``H^{-1} b`` is an exact draw from ``N(0, H^{-1})`` because
``Cov(b) = H``. Each of the S samples solves its own problem; all S are solved together
(``solver="cg"``: batched conjugate gradients on ``H``, exact to ``tol``;
``solver="sgd"``: minibatch gradient descent with Nesterov momentum on ``L``).

``center="bayes"`` (regression only) instead gives the exact Bayesian posterior of the
linearised model under the prior ``theta ~ N(0, 1/lambda I)`` and the data: the
right-hand side gains ``sum_i J_i^T (y_i - f(x_i; theta*)) / sigma^2 - lambda theta*``.
For a last layer this is Bayesian linear regression on the features, whose closed form
(``last_layer_closed_form``) is the oracle of the tests.

Relation to the public LinearSampling package (``LeastSquaresLogitSampler``, the seed
paper's reference, sits beside this class): it starts each sample at
``theta* + gamma eps`` and fits the MAP outputs (``min ||J (theta - theta*)||^2``) by
SGD, which converges to ``theta* + (I - P_J) gamma eps``: the ``lambda = 1/gamma^2``,
noise-free limit of the form above (no likelihood noise, no data perturbation),
regularised by early stopping instead of a prior term.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ripieno.framework.uq.linearization import FullNetworkLinearization, LastLayerLinearization

Likelihood = Literal["regression", "classification", "binary"]
TargetFn = Callable[[Any], Tensor]


class GLMPosteriorSampler:
    """Posterior samples ``theta_s = theta* + z_s`` of a linearised network.

    Args:
        linearization: a ``LastLayerLinearization`` (LL-GLM) or
            ``FullNetworkLinearization`` (DNN-GLM).
        likelihood: ``regression`` (Gaussian, ``noise_variance``), ``classification``
            (softmax over logits) or ``binary`` (one logit, sigmoid).
        prior_precision: ``lambda``.
        noise_variance: ``sigma^2`` (regression).
        n_samples: ``S``.
        center: ``map`` (Laplace/GGN posterior around ``theta*``) or ``bayes`` (regression:
            exact posterior of the linear model with prior ``N(0, 1/lambda I)``).
        solver: ``cg`` (exact batched conjugate gradients) or ``sgd``.
        max_iters: CG iterations (``cg``) or epochs (``sgd``).
        tol: relative residual at which CG stops.
        lr: SGD step size (``sgd``).
        momentum: SGD Nesterov momentum (``sgd``).
        seed: seed of the sampler's own generator (samples do not touch global RNGs).
        progress: show a tqdm bar over the solve (CG iterations or SGD epochs).
    """

    def __init__(
        self,
        linearization: LastLayerLinearization | FullNetworkLinearization,
        likelihood: Likelihood,
        prior_precision: float = 1.0,
        noise_variance: float = 1.0,
        n_samples: int = 10,
        center: Literal["map", "bayes"] = "map",
        solver: Literal["cg", "sgd"] = "cg",
        max_iters: int = 200,
        tol: float = 1e-6,
        lr: float = 1e-3,
        momentum: float = 0.9,
        seed: int = 0,
        progress: bool = False,
    ) -> None:
        if likelihood not in ("regression", "classification", "binary"):
            raise ValueError(
                f"likelihood must be regression, classification or binary, got {likelihood!r}."
            )
        if center not in ("map", "bayes") or (center == "bayes" and likelihood != "regression"):
            raise ValueError("center must be 'map', or 'bayes' for regression only.")
        if solver not in ("cg", "sgd"):
            raise ValueError(f"solver must be 'cg' or 'sgd', got {solver!r}.")
        if not (prior_precision > 0 and noise_variance > 0 and n_samples >= 1):
            raise ValueError("prior_precision and noise_variance must be > 0 and n_samples >= 1.")
        self.lin = linearization
        self.likelihood, self.center, self.solver = likelihood, center, solver
        self.prior_precision, self.noise_variance = float(prior_precision), float(noise_variance)
        self.n_samples, self.max_iters, self.tol = n_samples, max_iters, tol
        self.lr, self.momentum, self.seed, self.progress = lr, momentum, seed, progress
        self.theta_star = linearization.theta_star()
        self.z: Tensor | None = None
        self._cache: list[tuple[Any, Tensor, Tensor]] | None = None
        self._loader: Iterable[Any] | None = None
        self._target_fn: TargetFn | None = None
        self.n_train = 0
        self.cg_iterations = 0

    # ------------------------------------------------------------------ the data
    def _passes(self) -> Iterator[tuple[Any, Tensor, Tensor]]:
        """Yield ``(features, f(x; theta*), target)`` for every training batch."""
        if self._cache is not None:
            yield from self._cache
            return
        assert self._loader is not None and self._target_fn is not None
        for batch in self._loader:
            features, outputs = self.lin.features_and_outputs(batch)
            yield features, outputs, self.lin.expand_target(self._target_fn(batch))

    def _curvature_apply(self, outputs: Tensor, u: Tensor) -> Tensor:
        """``Lambda u`` for cotangents ``u (S, B, C)`` at outputs ``(B, C)``."""
        if self.likelihood == "regression":
            return u / self.noise_variance
        if self.likelihood == "binary":
            p = torch.sigmoid(outputs)
            return p * (1 - p) * u
        p = torch.softmax(outputs, dim=-1)
        return p * u - p * (p * u).sum(-1, keepdim=True)

    def _curvature_sqrt_noise(self, outputs: Tensor, e: Tensor) -> Tensor:
        """``R e`` with ``R R^T = Lambda``: a draw with covariance ``Lambda``."""
        if self.likelihood == "regression":
            return e / math.sqrt(self.noise_variance)
        if self.likelihood == "binary":
            p = torch.sigmoid(outputs)
            return (p * (1 - p)).sqrt() * e
        p = torch.softmax(outputs, dim=-1)
        sqrt_p = p.sqrt()
        return sqrt_p * e - p * (sqrt_p * e).sum(-1, keepdim=True)

    def _hvp(self, v: Tensor) -> Tensor:
        """``H v = sum_i J_i^T Lambda_i J_i v + lambda v`` for ``v (S, P)``."""
        out = self.prior_precision * v
        for features, outputs, _ in self._passes():
            out = out + self.lin.vjp(features, self._curvature_apply(outputs, self.lin.jvp(features, v)))
        return out

    # -------------------------------------------------------------------- fitting
    @torch.no_grad()
    def _right_hand_side(self, generator: torch.Generator) -> Tensor:
        s, p, lam = self.n_samples, self.lin.n_params, self.prior_precision
        # Draws come from the sampler's CPU generator (reproducible on any device), then move.
        rhs = (torch.randn(s, p, generator=generator) * math.sqrt(lam)).to(self.theta_star.device)
        self.n_train = 0
        for features, outputs, target in self._passes():
            self.n_train += outputs.shape[0]
            e = torch.randn(s, *outputs.shape, generator=generator).to(outputs)
            rhs = rhs + self.lin.vjp(features, self._curvature_sqrt_noise(outputs, e))
            if self.center == "bayes":
                residual = (target.float().reshape(outputs.shape) - outputs) / self.noise_variance
                rhs = rhs + self.lin.vjp(features, residual.expand(s, -1, -1))
        if self.center == "bayes":
            rhs = rhs - lam * self.theta_star
        return rhs

    def fit(
        self, loader: Iterable[Any], target_fn: TargetFn, cache: bool | None = None
    ) -> GLMPosteriorSampler:
        """Draw the S posterior samples from the training data.

        Args:
            loader: training batches.
            target_fn: maps a batch to its targets (class indices, or regression values
                shaped like the outputs).
            cache: keep per-batch features in memory (default: for the last layer only,
                where features are small; the full network re-reads ``loader`` per pass).

        Returns:
            self, with ``z`` set to ``(S, n_params)``.
        """
        self._loader, self._target_fn = loader, target_fn
        self._cache = None
        model = self.lin.model
        was_training = model.training
        model.eval()  # dropout off, batch-norm statistics fixed: the network at theta*
        try:
            if cache if cache is not None else isinstance(self.lin, LastLayerLinearization):
                self._cache = list(self._passes())
            generator = torch.Generator().manual_seed(self.seed)
            rhs = self._right_hand_side(generator)
            self.z = self._solve_cg(rhs) if self.solver == "cg" else self._solve_sgd(rhs)
        finally:
            model.train(was_training)
        return self

    @torch.no_grad()
    def _solve_cg(self, rhs: Tensor) -> Tensor:
        x = torch.zeros_like(rhs)
        r = rhs.clone()
        p = r.clone()
        rs = (r * r).sum(1)
        target = (self.tol**2) * (rhs * rhs).sum(1)
        self.cg_iterations = 0
        bar = tqdm(total=self.max_iters, disable=not self.progress, desc="GLM posterior solve (CG)",
                   leave=False)
        for _ in range(self.max_iters):
            if bool((rs <= target).all()):
                break
            bar.update(1)
            hp = self._hvp(p)
            alpha = rs / (p * hp).sum(1).clamp_min(1e-30)
            x = x + alpha[:, None] * p
            r = r - alpha[:, None] * hp
            rs_new = (r * r).sum(1)
            p = r + (rs_new / rs.clamp_min(1e-30))[:, None] * p
            rs = rs_new
            self.cg_iterations += 1
        bar.close()
        return x

    def _solve_sgd(self, rhs: Tensor) -> Tensor:
        z = torch.zeros_like(rhs, requires_grad=True)
        optimizer = torch.optim.SGD([z], lr=self.lr, momentum=self.momentum, nesterov=True)
        anchor = rhs / self.prior_precision
        epochs = tqdm(range(self.max_iters), disable=not self.progress, desc="GLM posterior solve (SGD)",
                      leave=False)
        for _ in epochs:
            batches = list(self._passes()) if self._cache is None else self._cache
            for features, outputs, _ in batches:
                optimizer.zero_grad(set_to_none=True)
                with torch.no_grad():
                    jz = self.lin.jvp(features, z.detach())
                    data_grad = self.lin.vjp(features, self._curvature_apply(outputs, jz))
                scale = self.n_train / outputs.shape[0]
                z.grad = scale * data_grad + self.prior_precision * (z.detach() - anchor)
                optimizer.step()
        return z.detach()

    # ----------------------------------------------------------------- prediction
    def samples(self) -> Tensor:
        """Posterior parameter samples ``theta* + z_s``, shape ``(S, n_params)``."""
        if self.z is None:
            raise RuntimeError("Call fit(...) before asking for samples.")
        return self.theta_star + self.z

    @torch.no_grad()
    def predict(self, batch: Any) -> Tensor:  # noqa: ANN401
        """Linearised outputs per sample, members on axis 1: ``(B, S, C)``.

        A network with K member heads gives ``(B, S * K, C)``: every (sample, member) pair.

        Logits for classification, means for regression (add ``noise_variance`` for the
        predictive variance of an observation).
        """
        if self.z is None:
            raise RuntimeError("Call fit(...) before predict(...).")
        model = self.lin.model
        was_training = model.training
        model.eval()
        try:
            features, outputs = self.lin.features_and_outputs(batch)
            return self.lin.arrange(outputs + self.lin.jvp(features, self.z))
        finally:
            model.train(was_training)


def last_layer_closed_form(
    features: Tensor, targets: Tensor, prior_precision: float, noise_variance: float
) -> tuple[Tensor, Tensor]:
    """Bayesian linear regression posterior of a last layer (prior ``N(0, 1/lambda I)``).

    Args:
        features: ``(N, D+1)`` features; append a column of ones to model a bias.
        targets: ``(N, C)`` regression targets.
        prior_precision: ``lambda``.
        noise_variance: ``sigma^2``.

    Returns:
        ``(mean (C, D+1), covariance (D+1, D+1))``: outputs are independent a posteriori
        and share one covariance ``(Phi^T Phi / sigma^2 + lambda I)^{-1}``.
    """
    phi = features.double()
    precision = phi.T @ phi / noise_variance + prior_precision * torch.eye(phi.shape[1], dtype=phi.dtype)
    covariance = torch.linalg.inv(precision)
    mean = (covariance @ phi.T @ targets.double() / noise_variance).T
    return mean, covariance


def last_layer_log_evidence(
    features: Tensor, targets: Tensor, prior_precision: float, noise_variance: float
) -> float:
    """Log marginal likelihood ``log p(Y)`` of Bayesian linear regression on the features.

    ``sum_c log N(y_c; 0, sigma^2 I + Phi Phi^T / lambda)`` computed in the
    ``(D+1)``-dimensional form (Bishop, PRML eq. 3.86), for choosing ``lambda`` and
    ``sigma^2`` by evidence.
    """
    phi, y = features.double(), targets.double().reshape(features.shape[0], -1)
    n, d = phi.shape
    mean, covariance = last_layer_closed_form(phi, y, prior_precision, noise_variance)
    residual = ((y - phi @ mean.T) ** 2).sum(0)
    _, logdet_precision = torch.linalg.slogdet(torch.linalg.inv(covariance))
    per_output = (
        0.5 * d * math.log(prior_precision) - 0.5 * n * math.log(2 * math.pi * noise_variance)
        - residual / (2 * noise_variance) - 0.5 * prior_precision * (mean**2).sum(1)
        - 0.5 * logdet_precision
    )
    return float(per_output.sum())
