"""SWAGSampler: SWA-Gaussian (Maddox et al., 2019) as a post-hoc sampler callback.

During training the callback collects the flattened trainable parameters at the end of
every ``collect_every``-th epoch from ``swa_start`` on, and keeps the SWAG moments:

* the running mean ``theta_bar`` (``torch.optim.swa_utils.AveragedModel`` over a flat
  float64 vector),
* the running mean of squares (float64) for the diagonal variance
  ``Sigma_diag = clamp(mean(theta^2) - theta_bar^2, min=var_clamp)``,
* the last ``max_rank`` deviations ``D_i = theta_i - theta_bar_i`` (float32), where
  ``theta_bar_i`` is the running mean *including* ``theta_i`` (as in the reference code).

With ``K`` deviation columns the posterior is ``N(theta_bar, scale * Sigma)``, with
``Sigma = Sigma_diag / 2 + D D^T / (2 (K - 1))`` (the paper's SWAG covariance). The
reference implementation writes ``theta_bar + sqrt(s) (Sigma_diag^{1/2} z_1 +
D z_2 / sqrt(K - 1))`` and samples with ``s = 0.5``: its ``0.5`` is our ``1/2`` factors,
so ``scale=1.0`` here equals ``scale=0.5`` there. ``max_rank=0`` gives SWAG-diagonal,
``N(theta_bar, scale * Sigma_diag)``.

At test/predict time each of the S sampled parameter vectors is plugged into the
module with ``torch.func.functional_call`` (the module's own weights are never
touched) and run in eval mode, giving ``(B, S, C)``. Batch-norm statistics are not
recomputed for sampled weights (the paper's ``bn_update``), so modules with batch norm
are rejected. Evaluation follows ``PosteriorPredictiveCallback``.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any, ClassVar

import lightning as L
import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.optim.swa_utils import AveragedModel
from typing_extensions import override

from ripieno.callbacks.posterior_predictive import PosteriorPredictiveCallback
from ripieno.callbacks.sampler_evaluation import (
    DEFAULT_EVALUATION,
    MOVED_ARGUMENTS,
    SamplerEvaluation,
    evaluation_with_moved,
)
from ripieno.callbacks.sampler_settings import (
    check_count,
    check_fraction,
    check_n_samples,
    check_positive,
    setting_error,
)
from ripieno.framework.messages import get_logger

log = get_logger(__name__)



class _FlatVector(nn.Module):
    """One flat parameter vector, the unit ``AveragedModel`` averages."""

    def __init__(self, theta: Tensor) -> None:
        super().__init__()
        self.theta = nn.Parameter(theta, requires_grad=False)


class _FunctionalModule(nn.Module):
    """``module`` evaluated at ``params`` through ``functional_call`` (weights untouched)."""

    def __init__(self, module: nn.Module, params: dict[str, Tensor]) -> None:
        super().__init__()
        self.module, self.params = module, params

    def forward(self, *args: Any) -> Tensor:  # noqa: ANN401
        """The module's output at ``params``."""
        return functional_call(self.module, self.params, args)


class SWAGSampler(PosteriorPredictiveCallback):
    """Collect SWAG moments while training; evaluate and predict with SWAG samples.

    Logged on test, under ``uq/test/``: as ``PosteriorPredictiveCallback``.

    Args:
        n_samples: parameter samples S (at least 2: the uncertainty is their spread).
        swa_start: first collection epoch: an ``int`` epoch index (0-based), or a
            ``float`` in ``[0, 1)``, the fraction ``floor(swa_start * max_epochs)``.
        collect_every: collect every this many epochs from ``swa_start`` on.
        max_rank: deviation columns kept for the low-rank part (the last ``max_rank``
            collected models); ``0`` gives SWAG-diagonal. ``1`` is rejected (the
            ``1 / (K - 1)`` normaliser is undefined).
        var_clamp: lower bound of the diagonal variance.
        scale: covariance scale ``s`` of ``N(theta_bar, s * Sigma)``; ``1.0`` is the
            paper's covariance (the reference code's ``scale=0.5``).
        evaluation: how samples are read and scored, the same for every sampler
            (``SamplerEvaluation``: likelihood, noise variance, batch keys, OOD loader,
            temperature). The flat arguments of earlier releases still work, with a warning.
        seed: seed of the sampler's own generator; the S parameter vectors are drawn
            once per ``prepare`` and reused for every batch and every test/predict run.
    """

    #: The flat arguments of earlier releases and their place in ``evaluation`` (a recipe file's load
    #: regroups them, with a warning).
    MOVED_ARGUMENTS: ClassVar[dict[str, str]] = MOVED_ARGUMENTS

    def __init__(
        self,
        n_samples: int = 10,
        *,
        swa_start: int | float = 0.5,
        collect_every: int = 1,
        max_rank: int = 20,
        var_clamp: float = 1e-30,
        scale: float = 1.0,
        seed: int = 0,
        evaluation: SamplerEvaluation = DEFAULT_EVALUATION,
        **moved: Any,
    ) -> None:
        self.evaluation = evaluation_with_moved(type(self).__name__, evaluation, moved)
        super().__init__(**self.evaluation.callback_kwargs())
        owner = type(self).__name__
        check_n_samples(owner, n_samples)
        if isinstance(swa_start, bool) or not isinstance(swa_start, int | float):
            raise TypeError(f"swa_start must be an int epoch or a float fraction, got {swa_start!r}.")
        if isinstance(swa_start, int):
            check_count(owner, "swa_start", swa_start, 0, "an int swa_start is the first collection epoch")
        else:
            check_fraction(owner, "swa_start", swa_start, "a float swa_start is a fraction of max_epochs")
        check_count(owner, "collect_every", collect_every, 1, "collection repeats every this many epochs")
        if isinstance(max_rank, bool) or not isinstance(max_rank, int) or max_rank < 0 or max_rank == 1:
            raise setting_error(owner, "max_rank", max_rank, "max_rank must be 0 (SWAG-diagonal) or >= 2, as"
                                " the low-rank part divides by K - 1 deviation columns",
                                "set max_rank=0 or 2 or more (20 is the default)")
        check_positive(owner, "var_clamp", var_clamp, "it is the smallest diagonal variance", allow_zero=True)
        check_positive(owner, "scale", scale, "it scales the covariance")
        self.n_samples, self.swa_start, self.collect_every = n_samples, swa_start, collect_every
        self.max_rank, self.var_clamp, self.scale, self.seed = max_rank, var_clamp, scale, seed
        self._names: list[str] | None = None
        self._shapes: list[torch.Size] = []
        self._averaged: AveragedModel | None = None
        self._sq_mean: Tensor | None = None
        self._deviations: deque[Tensor] = deque(maxlen=max_rank)
        self._start_epoch: int | None = None
        self.variance: Tensor | None = None
        self._draws: Tensor | None = None
        # the draws as parameter dicts on the module's device, made once (not copied every batch)
        self._on_device: tuple[Tensor, tuple[tuple[torch.device, torch.dtype], ...],
                               list[dict[str, Tensor]]] | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(swa_start=self.swa_start, collect_every=self.collect_every,
                                        max_rank=self.max_rank)

    # ------------------------------------------------------------------ moments
    @property
    def n_models(self) -> int:
        """Number of collected models."""
        return 0 if self._averaged is None else int(self._averaged.n_averaged)

    @property
    def mean(self) -> Tensor:
        """SWA mean ``theta_bar``, flat float64 on CPU."""
        if self._averaged is None:
            raise RuntimeError("SWAG has collected no model yet.")
        return self._averaged.module.theta.detach()

    @property
    def sq_mean(self) -> Tensor:
        """Running mean of the squared parameters, flat float64 on CPU."""
        if self._sq_mean is None:
            raise RuntimeError("SWAG has collected no model yet.")
        return self._sq_mean

    @property
    def deviations(self) -> Tensor:
        """The ``K`` kept deviations ``theta_i - theta_bar_i``, ``(K, n_params)`` float32."""
        if not self._deviations:
            return torch.zeros(0, self.mean.numel())
        return torch.stack(list(self._deviations))

    @property
    def parameter_names(self) -> list[str]:
        """Names of the trainable parameters, in flattening order."""
        return list(self._names or [])

    @staticmethod
    def _trainable(pl_module: nn.Module) -> list[tuple[str, Tensor]]:
        return [(n, p) for n, p in pl_module.named_parameters() if p.requires_grad]

    @staticmethod
    def _check_no_batch_norm(pl_module: nn.Module) -> None:
        norms = [n for n, m in pl_module.named_modules()
                 if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
        if norms:
            raise ValueError(
                f"SWAGSampler does not recompute batch-norm statistics for sampled weights"
                f" (bn_update is not supported), but {type(pl_module).__name__} has batch norm"
                f" with running statistics: {norms[:4]}."
            )

    def start_epoch(self, trainer: L.Trainer) -> int:
        """The first collection epoch: ``swa_start``, or its fraction of ``max_epochs``."""
        if isinstance(self.swa_start, int):
            return self.swa_start
        max_epochs = trainer.max_epochs
        if max_epochs is None or max_epochs < 0:
            raise ValueError(f"A fractional swa_start={self.swa_start} needs a finite max_epochs;"
                             " pass an int epoch instead.")
        return math.floor(self.swa_start * max_epochs)

    def collect(self, pl_module: nn.Module) -> None:
        """Add the module's current trainable parameters to the SWAG moments."""
        named = self._trainable(pl_module)
        names = [n for n, _ in named]
        if self._names is None:
            self._names, self._shapes = names, [p.shape for _, p in named]
        elif names != self._names:
            raise RuntimeError("The module's trainable parameters changed between SWAG collections.")
        theta = torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for _, p in named])
        if self._averaged is None:
            self._averaged = AveragedModel(_FlatVector(torch.zeros_like(theta)), device="cpu")
            self._sq_mean = torch.zeros_like(theta)
        assert self._sq_mean is not None
        self._averaged.update_parameters(_FlatVector(theta))  # running mean, torch.optim.swa_utils
        self._sq_mean += (theta.square() - self._sq_mean) / self.n_models
        if self.max_rank > 0:
            self._deviations.append((theta - self.mean).float())
        self.variance, self._draws, self._on_device, self.prepared = None, None, None, False

    # -------------------------------------------------------------------- hooks
    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_no_batch_norm(pl_module)
        self._start_epoch = self.start_epoch(trainer)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        start = self.start_epoch(trainer) if self._start_epoch is None else self._start_epoch
        epoch = trainer.current_epoch
        if epoch >= start and (epoch - start) % self.collect_every == 0:
            self.collect(pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        if self._averaged is None:
            return {"n_models": 0}
        return {"n_models": self.n_models, "names": list(self._names or []),
                "shapes": [list(s) for s in self._shapes], "mean": self.mean.clone(),
                "sq_mean": self.sq_mean.clone(), "deviations": [d.clone() for d in self._deviations]}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.variance, self._draws, self._on_device, self.prepared = None, None, None, False
        self._deviations = deque(maxlen=self.max_rank)
        if state_dict.get("n_models", 0) == 0:
            self._names, self._shapes, self._averaged, self._sq_mean = None, [], None, None
            return
        self._names = list(state_dict["names"])
        self._shapes = [torch.Size(s) for s in state_dict["shapes"]]
        mean = state_dict["mean"].detach().to("cpu", torch.float64)
        self._averaged = AveragedModel(_FlatVector(mean.clone()), device="cpu")
        self._averaged.n_averaged.fill_(int(state_dict["n_models"]))
        self._sq_mean = state_dict["sq_mean"].detach().to("cpu", torch.float64).clone()
        if self.max_rank > 0:
            self._deviations.extend(d.detach().to("cpu", torch.float32).clone()
                                    for d in state_dict["deviations"])

    # ---------------------------------------------------------------- posterior
    def _unflatten(self, flat: Tensor, pl_module: nn.Module) -> dict[str, Tensor]:
        current = dict(self._trainable(pl_module))
        out, start = {}, 0
        for name, shape in zip(self._names or [], self._shapes, strict=True):
            size = shape.numel()
            ref = current[name]
            out[name] = flat[start:start + size].view(shape).to(device=ref.device, dtype=ref.dtype)
            start += size
        return out

    def prepare(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Compute the diagonal variance; estimate the regression noise if needed.

        Raises:
            RuntimeError: with fewer than 2 collected models, or when the module's
                trainable parameters are not those collected.
        """
        self._check_no_batch_norm(pl_module)
        if self.n_models < 2:
            start = self._start_epoch if self._start_epoch is not None else self.swa_start
            raise RuntimeError(
                f"SWAG needs at least 2 collected models, got {self.n_models}: collection starts"
                f" at epoch {start} (swa_start={self.swa_start}) and repeats every"
                f" {self.collect_every} epoch(s); train for more epochs (max_epochs) or lower swa_start."
            )
        named = self._trainable(pl_module)
        if [n for n, _ in named] != self._names or [p.shape for _, p in named] != self._shapes:
            raise RuntimeError("The module's trainable parameters differ from those SWAG collected.")
        self.variance = torch.clamp(self.sq_mean - self.mean.square(), min=self.var_clamp)
        self._draws, self._on_device = None, None
        self.likelihood = self.resolve_likelihood(pl_module)
        if self.likelihood == "regression":  # the residuals of the network at the SWA mean
            at_mean = _FunctionalModule(pl_module, self._unflatten(self.mean, pl_module))
            noise = self.regression_noise_variance(trainer, pl_module, network=at_mean)
            self.noise_variance = float(noise or 1.0)

    def sample_parameters(self) -> Tensor:
        """The S flat parameter samples ``(S, n_params)`` (float32 on CPU), drawn once.

        ``theta_s = theta_bar + sqrt(scale) (sqrt(Sigma_diag) z_1 / sqrt(2)
        + D^T z_2 / sqrt(2 (K - 1)))`` (or ``theta_bar + sqrt(scale) sqrt(Sigma_diag) z_1``
        without deviations), with ``z_1, z_2`` from a generator seeded by ``seed``.
        """
        if self.variance is None:
            raise RuntimeError("SWAGSampler is not prepared; run fit, test or predict first.")
        if self._draws is None:
            generator = torch.Generator().manual_seed(self.seed)
            mean, std = self.mean, self.variance.sqrt()
            dev = self.deviations.double()
            k = dev.shape[0]
            draws = []
            for _ in range(self.n_samples):
                z1 = torch.randn(mean.shape, generator=generator, dtype=torch.float64)
                if k >= 2:
                    z2 = torch.randn(k, generator=generator, dtype=torch.float64)
                    delta = std * z1 / math.sqrt(2.0) + (z2 @ dev) / math.sqrt(2.0 * (k - 1))
                else:
                    delta = std * z1
                draws.append((mean + math.sqrt(self.scale) * delta).float())
            self._draws = torch.stack(draws)
        return self._draws

    def _parameter_sets(self, pl_module: nn.Module) -> list[dict[str, Tensor]]:
        """The S draws as parameter dicts on the module's devices and dtypes, made once per draw."""
        draws = self.sample_parameters()
        placement = tuple((p.device, p.dtype) for _, p in self._trainable(pl_module))
        if self._on_device is None or self._on_device[0] is not draws or self._on_device[1] != placement:
            self._on_device = (draws, placement, [self._unflatten(theta, pl_module) for theta in draws])
        return self._on_device[2]

    @torch.no_grad()
    def sample(self, pl_module: L.LightningModule, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """Forward passes at the S sampled parameter vectors, in eval mode, ``(B, S, C)``."""
        parameter_sets = self._parameter_sets(pl_module)
        inputs = self.input_fn(pl_module)(batch)
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        modes = [(m, m.training) for m in pl_module.modules()]
        pl_module.eval()
        try:
            outs = [functional_call(pl_module, parameters, args).float() for parameters in parameter_sets]
        finally:
            for m, flag in modes:
                m.train(flag)
        out = torch.stack(outs, dim=1)
        return out.reshape(out.shape[0], self.n_samples, -1)
