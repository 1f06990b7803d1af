r"""The LinearSampling package's GLM sampler: early-stopped least squares on the logits.

The reference sampler of "Is the last layer sufficient for uncertainty quantification?"
(its ``LeastSquaresLogitsPosterior``: ``NUQLS`` for the full network, ``CUQLS`` for the
last layer). With ``f_lin(x; theta) = f(x; theta*) + J(x) z``, ``z = theta - theta*``,
each of the S samples starts at ``z_0 = gamma eps``, ``eps ~ N(0, I)``, and minimises the
squared change of the training logits

    L(z) = 1 / (2 B C) sum_{i in batch} || J(x_i) z ||^2

(``B`` rows in the batch, ``C`` outputs) over the training set in loader order for a fixed
number of epochs, with heavy-ball momentum exactly as the reference writes it:
``g = J^T J z / (B C)``, ``buf = g`` at every step of the first epoch and
``buf = mu buf + g`` afterwards, ``z <- z - lr buf``. There is no prior term and no data
noise: the sample stays in ``gamma eps`` where the data do not constrain it, and run to
convergence it is ``(I - P) gamma eps`` with ``P`` the projector onto the row space of the
stacked training Jacobian (the oracle of the tests). The fixed epoch count is the only
regulariser; the reference tunes ``gamma`` (and a predictive scale) on held-out data.

The iteration is linear in ``z`` with no constant term, so its result is exactly
proportional to its start: the solve runs once with ``gamma = 1`` and a sample for any
``gamma`` is ``gamma z_1`` (same ``eps``); a grid over ``gamma`` costs one solve.

Predictive scale (the reference's ``scale_cal``): a sample's logits are
``scale * (f(x; theta*) + gamma J(x) z_1)``, i.e. the scale multiplies the *whole*
linearised logits, not only the deviation (a deviation-only scale would merely rescale
``gamma``); with ``scale = 1`` they are the plain linearised logits.

Which parameters are sampled (``perturb``): ``all`` of the linearisation's parameters
(the reference's full-network sampler), or only the last layer's ``weights`` (the
reference's last-layer sampler draws and fits ``W`` alone; the bias stays at its trained
value).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

import torch
from torch import Tensor

from ripieno.framework.uq.linearization import FullNetworkLinearization, LastLayerLinearization

Perturb = Literal["all", "weights"]


class LeastSquaresLogitSampler:
    """Samples ``theta* + gamma z_s`` of the reference's least-squares-logits GLM sampler.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from ripieno.framework.uq import LastLayerLinearization, LeastSquaresLogitSampler
        >>> net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
        >>> loader = [torch.randn(5, 3) for _ in range(2)]
        >>> lin = LastLayerLinearization(net, lambda batch: batch)
        >>> sampler = LeastSquaresLogitSampler(lin, n_samples=3, epochs=2).fit(loader)
        >>> sampler.predict(loader[0], gamma=0.5, scale=2.0).shape
        torch.Size([5, 3, 2])

    Args:
        linearization: a ``LastLayerLinearization`` (LL-GLM) or
            ``FullNetworkLinearization`` (DNN-GLM).
        n_samples: ``S``.
        epochs: passes over the training loader.
        lr: step size.
        momentum: heavy-ball factor ``mu`` (from the second epoch on, as in the reference).
        perturb: ``all`` parameters, or only the last layer's ``weights`` (bias kept at
            ``theta*``; last layer only).
        gamma: default ``gamma`` of ``samples`` and ``predict``.
        scale: default predictive scale of ``predict``.
        seed: seed of the sampler's own generator (global RNGs are not touched).
        progress: show a tqdm bar over the solve's steps.
    """

    def __init__(
        self,
        linearization: LastLayerLinearization | FullNetworkLinearization,
        n_samples: int = 10,
        epochs: int = 10,
        lr: float = 1e-2,
        momentum: float = 0.9,
        perturb: Perturb = "all",
        gamma: float = 1.0,
        scale: float = 1.0,
        seed: int = 0,
        progress: bool = False,
    ) -> None:
        if n_samples < 1 or epochs < 1:
            raise ValueError(f"n_samples and epochs must be >= 1, got {n_samples} and {epochs}.")
        if not (lr > 0 and 0 <= momentum < 1):
            raise ValueError(f"lr must be > 0 and momentum in [0, 1), got lr={lr}, momentum={momentum}.")
        if not (gamma > 0 and scale > 0):
            raise ValueError(f"gamma and scale must be > 0, got gamma={gamma}, scale={scale}.")
        if perturb not in ("all", "weights"):
            raise ValueError(f"perturb must be 'all' or 'weights', got {perturb!r}.")
        if perturb == "weights" and not isinstance(linearization, LastLayerLinearization):
            raise ValueError("perturb='weights' samples a last layer's weights: use LastLayerLinearization.")
        self.lin = linearization
        self.n_samples, self.epochs, self.lr, self.momentum = n_samples, epochs, lr, momentum
        self.perturb, self.gamma, self.scale = perturb, float(gamma), float(scale)
        self.seed, self.progress = seed, progress
        self.theta_star = linearization.theta_star()
        #: ``eps (S, n_params)``: the standard-normal start draws (zero where not perturbed).
        self.eps: Tensor | None = None
        #: ``z_1 (S, n_params)``: the solve's result for ``gamma = 1``.
        self.z: Tensor | None = None
        #: per epoch, ``mean ||J z_1||^2 / (C S)`` over its rows (the reference's "sq loss").
        self.history: list[float] = []
        self.n_train = 0

    def mask(self) -> Tensor | None:
        """``(n_params,)`` 1 on sampled parameters, 0 elsewhere; ``None`` when all are."""
        if self.perturb == "all":
            return None
        mask = torch.zeros_like(self.theta_star)
        mask[: self.lin.n_weights] = 1.0
        return mask

    def _batches(self, loader: Iterable[Any]) -> list[Any] | Iterable[Any]:
        """Cached penultimate features (last layer) or the loader itself (full network)."""
        if isinstance(self.lin, LastLayerLinearization):
            return [self.lin.features_and_outputs(batch)[0] for batch in loader]
        return loader

    def fit(self, loader: Iterable[Any]) -> LeastSquaresLogitSampler:
        """Run the solve over ``loader`` (kept in its order; targets are not used).

        Args:
            loader: training batches; their size is the reference's batch size.

        Returns:
            self, with ``eps`` and ``z`` set to ``(S, n_params)``.
        """
        model = self.lin.model
        was_training = model.training
        model.eval()  # dropout off, batch-norm statistics fixed: the network at theta*
        try:
            generator = torch.Generator().manual_seed(self.seed)
            eps = torch.randn(self.n_samples, self.lin.n_params, generator=generator)
            mask = self.mask()
            eps = (eps if mask is None else eps * mask).to(self.theta_star.device)
            self.eps = eps
            self.z = self._solve(self._batches(loader), eps.clone(), mask)
        finally:
            model.train(was_training)
        return self

    @torch.no_grad()
    def _solve(self, batches: Iterable[Any], z: Tensor, mask: Tensor | None) -> Tensor:
        from tqdm.auto import tqdm

        try:
            total: int | None = self.epochs * len(batches)  # type: ignore[arg-type]
        except TypeError:
            total = None
        if mask is not None:
            mask = mask.to(z)
        buf = torch.zeros_like(z)
        self.history = []
        with tqdm(total=total, disable=not self.progress, desc=f"{type(self).__name__} solve",
                  unit="step", leave=False, dynamic_ncols=True) as bar:
            for epoch in range(self.epochs):
                squared, count = 0.0, 0
                for batch in batches:
                    jz = self.lin.jvp(batch, z)  # (S, rows, C)
                    rows, c = jz.shape[1], jz.shape[2]
                    g = self.lin.vjp(batch, jz) / (rows * c)
                    if mask is not None:
                        g = g * mask
                    buf = g if epoch == 0 else buf.mul_(self.momentum).add_(g)
                    z = z - self.lr * buf
                    squared += float(jz.square().sum()) / (c * z.shape[0])
                    count += rows
                    bar.update(1)
                self.n_train = count
                self.history.append(squared / max(count, 1))
                bar.set_postfix(epoch=epoch + 1, sq_loss=f"{self.history[-1]:.3g}")
        return z

    # ----------------------------------------------------------------- prediction
    def _check_fitted(self) -> Tensor:
        if self.z is None:
            raise RuntimeError("Call fit(...) before asking for samples or predictions.")
        return self.z

    def samples(self, gamma: float | None = None) -> Tensor:
        """Parameter samples ``theta* + gamma z_1``, shape ``(S, n_params)``."""
        z = self._check_fitted()
        return self.theta_star + (self.gamma if gamma is None else gamma) * z

    @torch.no_grad()
    def deviations(self, batch: Any) -> tuple[Tensor, Tensor]:  # noqa: ANN401
        """``(f(x; theta*) (rows, C), J(x) z_1 (S, rows, C))`` for one batch.

        ``predict`` combines them as ``scale * (f + gamma J z_1)``; a grid search over
        ``gamma`` and ``scale`` computes them once per batch.
        """
        z = self._check_fitted()
        model = self.lin.model
        was_training = model.training
        model.eval()
        try:
            features, outputs = self.lin.features_and_outputs(batch)
            return outputs, self.lin.jvp(features, z)
        finally:
            model.train(was_training)

    def combine(self, outputs: Tensor, deviations: Tensor, gamma: float | None = None,
                scale: float | None = None) -> Tensor:
        """Sample logits ``scale * (f + gamma J z_1)`` arranged as ``(B, S', C)``."""
        gamma = self.gamma if gamma is None else gamma
        scale = self.scale if scale is None else scale
        return self.lin.arrange(scale * (outputs + gamma * deviations))

    def predict(self, batch: Any, gamma: float | None = None, scale: float | None = None) -> Tensor:  # noqa: ANN401
        """Sample logits per batch row, members on axis 1: ``(B, S, C)``.

        A network with K member heads gives ``(B, S * K, C)``: every (sample, member) pair.

        Args:
            batch: a batch the linearisation's ``input_fn`` understands.
            gamma: the start scale (default: the sampler's ``gamma``).
            scale: the predictive scale (default: the sampler's ``scale``).
        """
        outputs, deviations = self.deviations(batch)
        return self.combine(outputs, deviations, gamma, scale)
