"""LastLayerSampler: post-hoc posterior samples of a trained network (LL-GLM or DNN-GLM).

After ``fit`` (or before ``test``/``predict`` when no fit ran in this process) the
callback linearises the module around its trained weights and draws S exact posterior
samples by sample-then-optimise (``framework.uq.GLMPosteriorSampler``), with gradients
enabled: Lightning's evaluation loops run under inference mode, which forbids the
Jacobian products. On ``test`` it logs calibration and uncertainty metrics of the
posterior predictive; on ``predict`` it adds ``posterior_samples (B, S, C)`` to each
step's output dict (members on axis 1, DESIGN.md).
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from torch.utils._pytree import tree_map
from typing_extensions import override

from framework.metrics.uq import (
    ExpectedCalibrationError,
    GaussianNLL,
    LogPointwisePredictiveDensity,
    PredictiveNLL,
    VarROC,
)
from framework.uq.glm_sampler import GLMPosteriorSampler
from framework.uq.linearization import FullNetworkLinearization, LastLayerLinearization, call_model


def _plain(batch: Any) -> Any:  # noqa: ANN401
    """Copies of inference-mode tensors, usable by autograd and ``torch.func``."""
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, batch)


class LastLayerSampler(Callback):
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
        super().__init__()
        if glm not in ("last_layer", "full"):
            raise ValueError(f"glm must be 'last_layer' or 'full', got {glm!r}.")
        self.glm, self.last_layer_name = glm, last_layer_name
        self.n_samples, self.prior_precision, self.noise_variance = n_samples, prior_precision, noise_variance
        self.likelihood, self.solver, self.max_iters = likelihood, solver, max_iters
        self.input_key, self.target_key, self.seed = input_key, target_key, seed
        self.ood_dataloader_idx = ood_dataloader_idx
        self.sampler: GLMPosteriorSampler | None = None
        self._metrics: dict[str, Any] = {}

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(glm=self.glm, last_layer_name=self.last_layer_name)

    # ---------------------------------------------------------------- batches
    def model_input(self, batch: Any) -> Any:  # noqa: ANN401
        """The module's input in a batch."""
        return batch[self.input_key] if isinstance(batch, dict) else batch[0]

    def target(self, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """The target in a batch."""
        return batch[self.target_key] if isinstance(batch, dict) else batch[1]

    def _resolve_likelihood(self, pl_module: L.LightningModule) -> str:
        if self.likelihood != "auto":
            return self.likelihood
        task = getattr(pl_module, "task", "classification")
        return task if task in ("regression", "binary") else "classification"

    # ------------------------------------------------------------------ fitting
    def fit_posterior(self, trainer: L.Trainer, pl_module: L.LightningModule) -> GLMPosteriorSampler:
        """Draw the posterior samples from the training data (gradients enabled)."""
        loader = trainer.datamodule.train_dataloader() if trainer.datamodule is not None else None
        if loader is None:
            raise RuntimeError("LastLayerSampler needs a datamodule with a train_dataloader.")
        likelihood = self._resolve_likelihood(pl_module)
        with torch.inference_mode(False), torch.enable_grad():
            def input_fn(batch: Any) -> Any:  # noqa: ANN401
                return tree_map(lambda t: t.to(pl_module.device) if isinstance(t, torch.Tensor) else t,
                                _plain(self.model_input(batch)))

            if self.glm == "last_layer":
                lin = LastLayerLinearization(pl_module, input_fn, self.last_layer_name)
            else:
                lin = FullNetworkLinearization(pl_module, input_fn)
            noise = self.noise_variance
            if likelihood == "regression" and noise is None:
                noise = self._training_noise(pl_module, loader, input_fn)
                rank_zero_info(f"LastLayerSampler: noise_variance estimated as {noise:.4g}")
            self.sampler = GLMPosteriorSampler(
                lin, likelihood, prior_precision=self.prior_precision, noise_variance=noise or 1.0,
                n_samples=self.n_samples, solver=self.solver, max_iters=self.max_iters, seed=self.seed,
            ).fit(loader, lambda b: _plain(self.target(b)).to(pl_module.device))
        return self.sampler

    @torch.no_grad()
    def _training_noise(self, pl_module: L.LightningModule, loader: Any, input_fn: Any) -> float:  # noqa: ANN401
        was_training = pl_module.training
        pl_module.eval()
        total, count = 0.0, 0
        for batch in loader:
            out = call_model(pl_module, input_fn(batch)).float()
            y = _plain(self.target(batch)).to(out.device).float().reshape(out.shape)
            total += float(((out - y) ** 2).sum())
            count += out.numel()
        pl_module.train(was_training)
        return total / max(count, 1)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.fit_posterior(trainer, pl_module)

    # --------------------------------------------------------------- evaluation
    def _samples(self, pl_module: L.LightningModule, batch: Any) -> torch.Tensor:  # noqa: ANN401
        assert self.sampler is not None
        with torch.inference_mode(False), torch.enable_grad():
            return self.sampler.predict(batch)

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.sampler is None:
            self.fit_posterior(trainer, pl_module)
        assert self.sampler is not None
        likelihood = self.sampler.likelihood
        if likelihood == "regression":
            metrics = {"nll": GaussianNLL(), "lppd": LogPointwisePredictiveDensity(task="regression")}
        else:
            n_classes = max(self.sampler.lin.n_outputs or 2, 2)
            metrics = {"ece": ExpectedCalibrationError(num_classes=n_classes, input_kind="probs"),
                       "nll": PredictiveNLL(input_kind="probs"),
                       "lppd": LogPointwisePredictiveDensity(task="classification", input_kind="probs"),
                       "varroc_id": VarROC(mode="id", input_kind="probs")}
            if self.ood_dataloader_idx is not None:
                metrics["varroc_ood"] = VarROC(mode="ood", input_kind="probs")
        self._metrics = {k: m.to(pl_module.device) for k, m in metrics.items()}

    def _probs(self, samples: torch.Tensor) -> torch.Tensor:
        assert self.sampler is not None
        if self.sampler.likelihood == "binary":
            p1 = torch.sigmoid(samples[..., 0])
            return torch.stack([1 - p1, p1], dim=-1)
        return torch.softmax(samples, dim=-1)

    @override
    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        assert self.sampler is not None
        samples = self._samples(pl_module, batch)
        target = self.target(batch)
        if self.sampler.likelihood == "regression":
            mean = samples.mean(1)
            var = samples.var(1, unbiased=False) + self.sampler.noise_variance
            y = target.float().reshape(mean.shape)
            self._metrics["nll"].update(mean.flatten(), y.flatten(), var.flatten())
            self._metrics["lppd"].update(samples, y, self.sampler.noise_variance)
            return
        probs = self._probs(samples)
        if dataloader_idx == self.ood_dataloader_idx:  # OOD rows feed the OOD detector only
            self._metrics["varroc_ood"].update(probs, None, is_ood=True)
            return
        for metric in self._metrics.values():
            metric.update(probs, target)

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for name, metric in self._metrics.items():
            pl_module.log(f"uq/test/{name}", metric.compute(), sync_dist=False)
            metric.reset()

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.sampler is None:
            self.fit_posterior(trainer, pl_module)

    @override
    def on_predict_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                             batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        if not isinstance(outputs, dict):
            raise TypeError("LastLayerSampler needs predict_step to return a dict to add posterior_samples.")
        outputs["posterior_samples"] = self._samples(pl_module, batch)
