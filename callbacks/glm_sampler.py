"""LastLayerSampler: post-hoc posterior samples of a trained network (LL-GLM or DNN-GLM).

After ``fit`` (or before ``test``/``predict`` when no fit ran in this process) the
callback linearises the module around its trained weights and draws S exact posterior
samples by sample-then-optimise (``framework.uq.GLMPosteriorSampler``), with gradients
enabled: Lightning's evaluation loops run under inference mode, which forbids the
Jacobian products. Evaluation and prediction follow ``PosteriorPredictiveCallback``.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils._pytree import tree_map
from typing_extensions import override

from callbacks.posterior_predictive import PosteriorPredictiveCallback, plain_copy
from framework.uq.glm_sampler import GLMPosteriorSampler
from framework.uq.linearization import FullNetworkLinearization, LastLayerLinearization


class LastLayerSampler(PosteriorPredictiveCallback):
    """Fit a linearised-network posterior after training; evaluate and predict with it.

    Logged on test, under ``uq/test/``: ``ece`` (15 bins), ``nll`` and ``lppd`` of the
    posterior predictive, ``varroc_id`` (classification), or ``nll`` (Gaussian, with
    the noise) and ``lppd`` (regression); ``varroc_ood`` with an OOD test dataloader.

    Args:
        glm: ``last_layer`` (LL-GLM: only the last ``nn.Linear``) or ``full`` (DNN-GLM).
        last_layer_name: module name of the last linear layer (default: the last
            ``nn.Linear`` of the module).
        n_samples: posterior samples S.
        prior_precision: ``lambda``.
        noise_variance: Gaussian noise ``sigma^2`` for regression; ``None`` estimates it
            as the mean squared training residual at the trained weights (logged).
        likelihood: ``auto`` (from ``pl_module.task``: ``regression``, ``binary``,
            otherwise softmax classification), ``regression``, ``classification``, ``binary``.
        solver: ``cg`` or ``sgd`` (see ``GLMPosteriorSampler``).
        max_iters: CG iterations or SGD epochs.
        input_key: key of the model input in dict batches (tuples use element 0).
        target_key: key of the target in dict batches (tuples use element 1).
        ood_dataloader_idx: index of a test dataloader holding OOD inputs: its batches feed
            ``varroc_ood`` (AUROC of OOD vs correctly classified ID points) only.
        seed: the sampler's own seed.
    """

    def __init__(
        self,
        glm: Literal["last_layer", "full"] = "last_layer",
        last_layer_name: str | None = None,
        n_samples: int = 10,
        prior_precision: float = 1.0,
        noise_variance: float | None = None,
        likelihood: Literal["auto", "regression", "classification", "binary"] = "auto",
        solver: Literal["cg", "sgd"] = "cg",
        max_iters: int = 100,
        input_key: str = "x",
        target_key: str = "y",
        ood_dataloader_idx: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(input_key, target_key, ood_dataloader_idx)
        if glm not in ("last_layer", "full"):
            raise ValueError(f"glm must be 'last_layer' or 'full', got {glm!r}.")
        self.glm, self.last_layer_name = glm, last_layer_name
        self.n_samples, self.prior_precision = n_samples, prior_precision
        self.noise_variance_setting, self.likelihood_setting = noise_variance, likelihood
        self.solver, self.max_iters, self.seed = solver, max_iters, seed
        self.sampler: GLMPosteriorSampler | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(glm=self.glm, last_layer_name=self.last_layer_name)

    # ------------------------------------------------------------------ fitting
    def fit_posterior(self, trainer: L.Trainer, pl_module: L.LightningModule) -> GLMPosteriorSampler:
        """Draw the posterior samples from the training data (gradients enabled)."""
        loader = trainer.datamodule.train_dataloader() if trainer.datamodule is not None else None
        if loader is None:
            raise RuntimeError("LastLayerSampler needs a datamodule with a train_dataloader.")
        likelihood = self.resolve_likelihood(pl_module, self.likelihood_setting)
        with torch.inference_mode(False), torch.enable_grad():
            def input_fn(batch: Any) -> Any:  # noqa: ANN401
                return tree_map(lambda t: t.to(pl_module.device) if isinstance(t, torch.Tensor) else t,
                                plain_copy(self.model_input(batch)))

            if self.glm == "last_layer":
                lin = LastLayerLinearization(pl_module, input_fn, self.last_layer_name)
            else:
                lin = FullNetworkLinearization(pl_module, input_fn)
            noise = self.noise_variance_setting
            if likelihood == "regression" and noise is None:
                noise = self.training_noise_variance(pl_module, loader, input_fn)
                rank_zero_info(f"LastLayerSampler: noise_variance estimated as {noise:.4g}")
            self.sampler = GLMPosteriorSampler(
                lin, likelihood, prior_precision=self.prior_precision, noise_variance=noise or 1.0,
                n_samples=self.n_samples, solver=self.solver, max_iters=self.max_iters, seed=self.seed,
            ).fit(loader, lambda b: plain_copy(self.target(b)).to(pl_module.device))
        self.likelihood, self.noise_variance = likelihood, self.sampler.noise_variance
        return self.sampler

    def prepare(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Fit the posterior (called after ``fit``, or before the first test/predict)."""
        self.fit_posterior(trainer, pl_module)

    def sample(self, pl_module: L.LightningModule, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """Linearised predictions of the S posterior samples, ``(B, S, C)``."""
        assert self.sampler is not None
        with torch.inference_mode(False), torch.enable_grad():
            return self.sampler.predict(batch)
