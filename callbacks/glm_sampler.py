"""LastLayerSampler: post-hoc posterior samples of a trained network (LL-GLM or DNN-GLM).

After ``fit`` (or before ``test``/``predict`` when no fit ran in this process) the
callback linearises the module around its trained weights and draws S exact posterior
samples by sample-then-optimise (``ripieno.framework.uq.GLMPosteriorSampler``), with gradients
enabled: Lightning's evaluation loops run under inference mode, which forbids the
Jacobian products. Evaluation and prediction follow ``PosteriorPredictiveCallback``.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

from ripieno.callbacks.posterior_predictive import PosteriorPredictiveCallback, plain_copy
from ripieno.framework.metrics.uq import LogPointwisePredictiveDensity
from ripieno.framework.uq.glm_sampler import GLMPosteriorSampler, last_layer_log_evidence
from ripieno.framework.uq.linearization import FullNetworkLinearization, LastLayerLinearization


class LastLayerSampler(PosteriorPredictiveCallback):
    """Fit a linearised-network posterior after training; evaluate and predict with it.

    A packed ``EnsembleLinear`` head (the tabular ensembles: K member heads) gets K
    independent last-layer posteriors; samples are then ``(B, S * K, C)``, every
    (sample, member) pair one draw of the ensemble's predictive. Regression samples
    are in target units (a module's ``output_affine`` maps standardised outputs).

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
        prior_precision_grid: candidate ``lambda`` values; the one with the highest
            validation LPPD (``trainer.datamodule.val_dataloader()``) is kept and logged
            as ``uq/prior_precision`` (the same random draws serve every candidate).
        selection: how a grid is scored: ``validation`` (LPPD on the validation split) or
            ``evidence`` (last-layer regression only: the closed-form log marginal likelihood
            of the training data under the linearised model, prior centred at ``theta*``).
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
        prior_precision_grid: list[float] | None = None,
        selection: Literal["validation", "evidence"] = "validation",
        input_key: str | list[str] = "x",
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
        if prior_precision_grid is not None and (not prior_precision_grid or min(prior_precision_grid) <= 0):
            raise ValueError(f"prior_precision_grid needs positive values, got {prior_precision_grid}.")
        self.prior_precision_grid = prior_precision_grid
        if selection not in ("validation", "evidence"):
            raise ValueError(f"selection must be 'validation' or 'evidence', got {selection!r}.")
        if selection == "evidence" and glm != "last_layer":
            raise ValueError("selection='evidence' has a closed form for glm='last_layer' only.")
        self.selection = selection
        self.log_evidence: dict[float, float] = {}
        self.chosen_prior_precision: float | None = None
        self.validation_lppd: dict[float, float] = {}
        self.sampler: GLMPosteriorSampler | None = None
        self.affine: tuple[float, float] = (1.0, 0.0)

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(glm=self.glm, last_layer_name=self.last_layer_name)

    # ------------------------------------------------------------------ fitting
    def fit_posterior(self, trainer: L.Trainer, pl_module: L.LightningModule) -> GLMPosteriorSampler:
        """Draw the posterior samples from the training data (gradients enabled)."""
        loader = self.ordered_train_loader(trainer)
        likelihood = self.resolve_likelihood(pl_module, self.likelihood_setting)
        with torch.inference_mode(False), torch.enable_grad():
            input_fn = self.input_fn(pl_module)
            if self.glm == "last_layer":
                lin = LastLayerLinearization(pl_module, input_fn, self.last_layer_name)
            else:
                lin = FullNetworkLinearization(pl_module, input_fn)
            # The sampler works in the module's raw output units; metrics in target units.
            scale, shift = self.output_affine(pl_module) if likelihood == "regression" else (1.0, 0.0)
            self.affine = (scale, shift)
            noise = self.noise_variance_setting
            if likelihood == "regression" and noise is None:
                noise = self.training_noise_variance(pl_module, loader, input_fn)
                rank_zero_info(f"LastLayerSampler: noise_variance estimated as {noise:.4g}")
            noise = None if noise is None else noise / scale**2
            self.likelihood = likelihood
            target_fn = functools.partial(self.device_target, device=pl_module.device, affine=self.affine)
            grid = self.prior_precision_grid or [self.prior_precision]
            if self.selection == "evidence" and len(grid) > 1:
                grid = [self._best_by_evidence(lin, loader, grid, noise or 1.0)]
            best: tuple[float, float, GLMPosteriorSampler] | None = None
            for lam in grid:
                sampler = GLMPosteriorSampler(
                    lin, likelihood, prior_precision=lam, noise_variance=noise or 1.0,
                    n_samples=self.n_samples, solver=self.solver, max_iters=self.max_iters, seed=self.seed,
                ).fit(loader, target_fn)
                score = self._validation_lppd(trainer, sampler) if len(grid) > 1 else 0.0
                self.validation_lppd[lam] = score
                if best is None or score > best[0]:
                    best = (score, lam, sampler)
            assert best is not None
            _, self.chosen_prior_precision, self.sampler = best
            if len(grid) > 1:
                rank_zero_info(f"LastLayerSampler: prior_precision={self.chosen_prior_precision:g} has the"
                               f" best validation LPPD ({best[0]:.4f}) of {grid}")
        self.likelihood, self.noise_variance = likelihood, self.sampler.noise_variance * scale**2
        return self.sampler

    @torch.no_grad()
    def _best_by_evidence(self, lin: LastLayerLinearization, loader: Any, grid: list[float],  # noqa: ANN401
                          noise: float) -> float:
        """The ``lambda`` of ``grid`` with the highest last-layer log evidence."""
        if self.likelihood != "regression":
            raise ValueError("selection='evidence' needs a regression likelihood (Gaussian, closed form).")
        if lin.members is not None:
            raise ValueError("selection='evidence' is implemented for one nn.Linear head; member heads"
                             f" ({lin.layer_name}, K={lin.members}) need selection='validation'.")
        scale, shift = self.affine
        features, residuals = [], []
        was_training = lin.model.training
        lin.model.eval()
        for batch in loader:
            phi, outputs = lin.features_and_outputs(batch)
            ones = [phi.new_ones(phi.shape[0], 1)] if lin.has_bias else []
            features.append(torch.cat([phi, *ones], 1).cpu())
            target = (plain_copy(self.target(batch)).to(outputs.device).float() - shift) / scale
            target = target.reshape(outputs.shape)
            residuals.append((target - outputs).cpu())  # y - f(x; theta*): the prior sits at theta*
        lin.model.train(was_training)
        phi_all, res_all = torch.cat(features), torch.cat(residuals)
        self.log_evidence = {lam: last_layer_log_evidence(phi_all, res_all, lam, noise) for lam in grid}
        chosen = max(self.log_evidence, key=self.log_evidence.get)
        rank_zero_info(f"LastLayerSampler: prior_precision={chosen:g} has the highest log evidence of {grid}")
        return chosen

    def _validation_lppd(self, trainer: L.Trainer, sampler: GLMPosteriorSampler) -> float:
        """Mean log predictive density of the validation split under ``sampler``."""
        loader = trainer.datamodule.val_dataloader() if trainer.datamodule is not None else None
        if loader is None:
            raise RuntimeError("prior_precision_grid needs a datamodule with a val_dataloader.")
        kind = "regression" if self.likelihood == "regression" else "classification"
        metric = LogPointwisePredictiveDensity(task=kind, input_kind="probs")
        scale, shift = self.affine
        for batch in loader:
            samples = sampler.predict(batch) * scale + shift
            target = plain_copy(self.target(batch)).to(samples.device)
            if kind == "regression":
                metric.update(samples.cpu(), target.float().reshape(samples[:, 0].shape).cpu(),
                              sampler.noise_variance * scale**2)
            else:
                metric.update(self.probabilities(samples).cpu(), target.cpu())
        return float(metric.compute())

    def prepare(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Fit the posterior (called after ``fit``, or before the first test/predict)."""
        self.fit_posterior(trainer, pl_module)

    def is_stale(self, pl_module: L.LightningModule) -> bool:
        """Whether the weights changed since the fit (e.g. the best checkpoint was loaded)."""
        if self.sampler is None:
            return True
        return not torch.equal(self.sampler.lin.theta_star(), self.sampler.theta_star)

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_test_epoch_end(trainer, pl_module)
        if self.chosen_prior_precision is not None:
            pl_module.log("uq/prior_precision", float(self.chosen_prior_precision))

    def sample(self, pl_module: L.LightningModule, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """Linearised predictions of the S posterior samples, ``(B, S, C)``."""
        assert self.sampler is not None
        scale, shift = self.affine
        with torch.inference_mode(False), torch.enable_grad():
            samples = self.sampler.predict(batch)
        return samples * scale + shift if (scale, shift) != (1.0, 0.0) else samples
