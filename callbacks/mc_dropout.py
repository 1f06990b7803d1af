"""MCDropoutSampler: Monte-Carlo dropout (Gal & Ghahramani, 2016) as a post-hoc baseline.

At test/predict time every ``nn.Dropout*`` module of the trained network is switched to
train mode (everything else, batch-norm included, stays in eval mode) and S stochastic
forward passes give ``(B, S, C)``; evaluation follows ``PosteriorPredictiveCallback``.
The passes draw from a generator seeded by ``seed`` and the batch index, so results are
reproducible and the global RNG is left untouched.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from torch import nn
from typing_extensions import override

from ripieno.callbacks.posterior_predictive import PosteriorPredictiveCallback
from ripieno.callbacks.sampler_settings import check_n_samples
from ripieno.callbacks.temperature_scaling import TemperatureScaling
from ripieno.framework.uq.linearization import call_model


class MCDropoutSampler(PosteriorPredictiveCallback):
    """S dropout-perturbed forward passes of the trained network.

    Args:
        n_samples: forward passes S (at least 2: the uncertainty is their spread).
        likelihood: ``auto`` (from ``pl_module.task``), ``regression``,
            ``classification`` or ``binary``.
        noise_variance: regression noise ``sigma^2``; ``None`` estimates the training MSE.
        input_key: key of the model input in dict batches (tuples use element 0).
        target_key: key of the target in dict batches (tuples use element 1).
        ood_dataloader_idx: index of a test dataloader holding OOD inputs.
        seed: seed of the dropout masks.
        temperature: divide sampled logits by this before the softmax (classification): a
            float, a ``TemperatureScaling`` callback or ``"callback"`` (see
            ``PosteriorPredictiveCallback``); ``None`` (default) leaves them unchanged.
    """

    def __init__(
        self,
        n_samples: int = 10,
        likelihood: Literal["auto", "regression", "classification", "binary"] = "auto",
        noise_variance: float | None = None,
        input_key: str | list[str] = "x",
        target_key: str = "y",
        ood_dataloader_idx: int | None = None,
        seed: int = 0,
        temperature: float | TemperatureScaling | Literal["callback"] | None = None,
    ) -> None:
        super().__init__(input_key, target_key, ood_dataloader_idx, temperature=temperature,
                         likelihood=likelihood, noise_variance=noise_variance)
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
