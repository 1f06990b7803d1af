"""MCDropoutSampler: Monte-Carlo dropout (Gal & Ghahramani, 2016) as a post-hoc baseline.

At test/predict time every ``nn.Dropout*`` module of the trained network is switched to
train mode (everything else, batch-norm included, stays in eval mode) and S stochastic
forward passes give ``(B, S, C)``; evaluation follows ``PosteriorPredictiveCallback``.
The passes draw from a generator seeded by ``seed`` and the batch index, so results are
reproducible and the global RNG is left untouched.
"""

from __future__ import annotations

from typing import Any, ClassVar

import lightning as L
import torch
from torch import nn
from typing_extensions import override

from ripieno.callbacks.posterior_predictive import PosteriorPredictiveCallback
from ripieno.callbacks.sampler_evaluation import (
    DEFAULT_EVALUATION,
    MOVED_ARGUMENTS,
    SamplerEvaluation,
    evaluation_with_moved,
)
from ripieno.callbacks.sampler_settings import check_n_samples
from ripieno.framework.uq.linearization import call_model


class MCDropoutSampler(PosteriorPredictiveCallback):
    """S dropout-perturbed forward passes of the trained network.

    Args:
        n_samples: forward passes S (at least 2: the uncertainty is their spread).
        evaluation: how samples are read and scored, the same for every sampler
            (``SamplerEvaluation``: likelihood, noise variance, batch keys, OOD loader,
            temperature). The flat arguments of earlier releases still work, with a warning.
        seed: seed of the dropout masks.
    """

    #: The flat arguments of earlier releases and their place in ``evaluation`` (a recipe file's load
    #: regroups them, with a warning).
    MOVED_ARGUMENTS: ClassVar[dict[str, str]] = MOVED_ARGUMENTS

    def __init__(
        self,
        n_samples: int = 10,
        *,
        seed: int = 0,
        evaluation: SamplerEvaluation = DEFAULT_EVALUATION,
        **moved: Any,
    ) -> None:
        self.evaluation = evaluation_with_moved(type(self).__name__, evaluation, moved)
        super().__init__(**self.evaluation.callback_kwargs())
        check_n_samples(type(self).__name__, n_samples)
        self.n_samples, self.seed = n_samples, seed
        self._calls = 0

    def _dropouts(self, pl_module: L.LightningModule) -> list[nn.Module]:
        return [m for m in pl_module.modules() if isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0]

    def prepare(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Check there is dropout to sample; estimate the regression noise if needed."""
        if not self._dropouts(pl_module):
            raise ValueError(
                f"{type(pl_module).__name__} has no dropout with p > 0, so MC-dropout would return"
                " S identical predictions; train with dropout (e.g. model.init_args.dropout=0.1)."
            )
        self.likelihood = self.resolve_likelihood(pl_module)
        if self.likelihood == "regression":
            self.noise_variance = float(self.regression_noise_variance(trainer, pl_module) or 1.0)

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Restart the mask sequence so that every test run draws the same masks."""
        super().on_test_start(trainer, pl_module)
        self._calls = 0

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Restart the mask sequence so that every predict run draws the same masks."""
        super().on_predict_start(trainer, pl_module)
        self._calls = 0

    @torch.no_grad()
    def sample(self, pl_module: L.LightningModule, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """S forward passes with dropout on, ``(B, S, C)``."""
        dropouts = self._dropouts(pl_module)
        was_training = [m.training for m in dropouts]
        inputs = self.input_fn(pl_module)(batch)
        self._calls += 1
        devices = [pl_module.device] if pl_module.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(self.seed * 1_000_003 + self._calls)
                for m in dropouts:
                    m.train()
                outs = [call_model(pl_module, inputs).float() for _ in range(self.n_samples)]
        finally:
            for m, flag in zip(dropouts, was_training, strict=True):
                m.train(flag)
        out = torch.stack(outs, dim=1)
        return out.reshape(out.shape[0], self.n_samples, -1)
