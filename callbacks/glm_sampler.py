"""LastLayerSampler: post-hoc posterior samples of a trained network (LL-GLM or DNN-GLM).

After ``fit`` (or before ``test``/``predict`` when no fit ran in this process) the
callback linearises the module around its trained weights and draws S samples with
gradients enabled (Lightning's evaluation loops run under inference mode, which forbids
the Jacobian products), from one of two posteriors:

* ``LaplaceGGN`` (default): exact samples of the linearised-Laplace (GGN) posterior by
  randomise-then-optimise (``ripieno.framework.uq.GLMPosteriorSampler``);
* ``LeastSquaresLogits``: the LinearSampling package's sampler, the paper's reference
  (``ripieno.framework.uq.LeastSquaresLogitSampler``): start at ``theta* + gamma eps``,
  fit the trained logits by SGD with momentum for a fixed number of epochs, and predict
  with ``scale * (f(x; theta*) + J(x) (theta_s - theta*))``.

Evaluation and prediction follow ``PosteriorPredictiveCallback``.
"""

from __future__ import annotations

import functools
import itertools
import warnings
from dataclasses import fields
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from typing_extensions import override

from ripieno.callbacks.glm_posteriors import (
    POSTERIOR_MOVED_ARGUMENTS,
    POSTERIORS,
    GLMPosterior,
    LaplaceGGN,
    LeastSquaresLogits,
)
from ripieno.callbacks.posterior_predictive import PosteriorPredictiveCallback, plain_copy
from ripieno.callbacks.sampler_evaluation import (
    DEFAULT_EVALUATION,
    MOVED_ARGUMENTS,
    SamplerEvaluation,
    evaluation_with_moved,
)
from ripieno.callbacks.sampler_settings import (
    check_choice,
    check_count,
    check_fraction,
    check_grid,
    check_n_samples,
    check_positive,
    setting_error,
)
from ripieno.framework.errors import REMOVED_IN, RipienoDeprecationWarning, fold_flat_arguments
from ripieno.framework.messages import get_logger
from ripieno.framework.metrics.uq import LogPointwisePredictiveDensity
from ripieno.framework.uq.glm_sampler import GLMPosteriorSampler, last_layer_log_evidence
from ripieno.framework.uq.least_squares_sampler import LeastSquaresLogitSampler
from ripieno.framework.uq.linearization import FullNetworkLinearization, LastLayerLinearization

log = get_logger(__name__)


DEFAULT_POSTERIOR = LaplaceGGN()
#: The reference's settings for LeNet on Fashion-MNIST (LinearSampling's amended results), per ``glm``.
LEAST_SQUARES_DEFAULTS: dict[str, dict[str, int | float]] = {
    "full": {"epochs": 10, "batch_size": 152, "lr": 1e-2, "momentum": 0.9, "gamma": 0.01},
    "last_layer": {"epochs": 20, "batch_size": 56, "lr": 1e-2, "momentum": 0.9, "gamma": 1.0},
}


def posterior_with_moved(owner: str, posterior: GLMPosterior | str | dict[str, Any],
                         moved: dict[str, Any]) -> LaplaceGGN | LeastSquaresLogits:
    """``posterior`` as its group, with the flat keyword arguments of earlier releases folded in.

    A string (``"least_squares_logits"``, the earlier form) becomes its group's defaults and a dict
    its group (by ``kind``, else ``laplace_ggn``), each flat setting moves into the group; every
    earlier form warns (``RipienoDeprecationWarning``) naming the new one.

    Raises:
        ValueError: an unknown posterior, a setting given both flat and in the group, or a setting of
            the other posterior.
    """
    if isinstance(posterior, str):
        check_choice(owner, "posterior", posterior, tuple(POSTERIORS))
        group = POSTERIORS[posterior]
        warnings.warn(f"{owner}(posterior={posterior!r}) is now {owner}(posterior={group.__name__}(...)); the"
                      f" string is removed in ripieno {REMOVED_IN}", RipienoDeprecationWarning, stacklevel=3)
        posterior = group()
    elif isinstance(posterior, dict):
        kind = posterior.get("kind", "laplace_ggn")
        check_choice(owner, "posterior.kind", kind, tuple(POSTERIORS))
        posterior = POSTERIORS[kind](**posterior)
    elif not isinstance(posterior, LaplaceGGN | LeastSquaresLogits):
        raise setting_error(owner, "posterior", posterior, "it is the posterior to sample",
                            "give LaplaceGGN(...) or LeastSquaresLogits(...)")
    own = {f.name for f in fields(posterior)} - {"kind"}
    other = [name for name in moved if name not in own]
    if other:
        raise setting_error(owner, "posterior", posterior.kind, f"{other} apply to the other posterior only",
                            "drop them, or sample the posterior they belong to (LaplaceGGN or"
                            " LeastSquaresLogits)")
    return fold_flat_arguments(owner, "posterior", posterior, type(posterior)(),
                               {name: (name, value) for name, value in moved.items()}, stacklevel=3)


class LastLayerSampler(PosteriorPredictiveCallback):
    """Fit a linearised-network posterior after training; evaluate and predict with it.

    A packed ``EnsembleLinear`` head (the tabular ensembles: K member heads) gets K
    independent last-layer posteriors; samples are then ``(B, S * K, C)``, every
    (sample, member) pair one draw of the ensemble's predictive. Regression samples
    are in target units (a module's ``output_affine`` maps standardised outputs).

    Logged on test, under ``uq/test/``: ``ece`` (15 bins), ``nll``, ``brier`` and ``lppd``
    of the posterior predictive, ``varroc_id`` (classification), or ``nll`` (Gaussian, with
    the noise), ``lppd`` and ``crps`` (regression); ``varroc_ood`` with an OOD test dataloader;
    ``uq/prior_precision``, or ``uq/gamma`` and ``uq/predictive_scale``, when chosen.

    ``posterior=LeastSquaresLogits(...)`` (classification only) takes the reference's
    settings for LeNet on Fashion-MNIST unless given (``LEAST_SQUARES_DEFAULTS``: DNN-GLM 10
    epochs, batch 152, lr 1e-2, gamma 0.01; LL-GLM 20 epochs, batch 56, lr 1e-2, gamma 1;
    momentum 0.9) and, as the reference's last-layer sampler, samples the last layer's
    weight only (its bias stays trained). With ``gamma_grid`` and/or
    ``predictive_scale_grid`` it keeps the pair with the highest validation LPPD.

    Example:
        >>> sampler = LastLayerSampler(glm="full", posterior=LeastSquaresLogits(
        ...     gamma_grid=[0.003, 0.01, 0.03], predictive_scale_grid=[0.5, 1.0, 2.0]))
        >>> sampler.settings["epochs"], sampler.settings["batch_size"]
        (10, 152)

    Args:
        glm: ``last_layer`` (LL-GLM: only the last ``nn.Linear``) or ``full`` (DNN-GLM).
        posterior: ``LaplaceGGN(...)`` (exact linearised-Laplace samples; its prior precision,
            grid, selection, solver and iterations) or ``LeastSquaresLogits(...)`` (the
            LinearSampling reference sampler; its gamma, predictive scale, grids and SGD settings).
            ``glm_posteriors``' module docstring has the YAML form.
        last_layer_name: module name of the last linear layer (default: the last
            ``nn.Linear`` of the module).
        n_samples: posterior samples S (at least 2: the uncertainty is their spread).
        seed: the sampler's own seed.
        progress_bar: show a progress bar over the posterior solve (CG or SGD for
            ``laplace_ggn``, the SGD epochs of ``least_squares_logits``; default: when the
            trainer shows its own, on rank 0).
        evaluation: how samples are read and scored, the same for every sampler
            (``SamplerEvaluation``: likelihood, noise variance, batch keys, OOD loader,
            temperature).
        **moved: the flat arguments of earlier releases (``prior_precision=``, ``gamma_grid=``,
            ``ood_dataloader_idx=``, ...): each still works, with a ``RipienoDeprecationWarning``
            naming its place in ``posterior`` or ``evaluation``.
    """

    #: The flat arguments of earlier releases and their place in ``evaluation`` or ``posterior`` (a
    #: recipe file's load regroups them, with a warning).
    MOVED_ARGUMENTS: ClassVar[dict[str, str]] = {**MOVED_ARGUMENTS, **POSTERIOR_MOVED_ARGUMENTS}

    def __init__(
        self,
        glm: Literal["last_layer", "full"] = "last_layer",
        *,
        posterior: GLMPosterior = DEFAULT_POSTERIOR,
        last_layer_name: str | None = None,
        n_samples: int = 10,
        seed: int = 0,
        progress_bar: bool | None = None,
        evaluation: SamplerEvaluation = DEFAULT_EVALUATION,
        **moved: Any,
    ) -> None:
        owner = type(self).__name__
        flat_posterior = {name: moved.pop(name) for name in list(moved) if name in POSTERIOR_MOVED_ARGUMENTS}
        self.evaluation = evaluation_with_moved(owner, evaluation, moved)
        super().__init__(**self.evaluation.callback_kwargs())
        likelihood = self.evaluation.likelihood
        check_choice(owner, "glm", glm, ("last_layer", "full"))
        posterior = posterior_with_moved(owner, posterior, flat_posterior)
        check_n_samples(owner, n_samples)
        #: the posterior group (``LaplaceGGN`` or ``LeastSquaresLogits``).
        self.posterior: LaplaceGGN | LeastSquaresLogits = posterior
        #: the least-squares solve's settings (reference defaults filled in); empty for laplace_ggn.
        self.settings: dict[str, Any] = {}
        laplace = posterior if isinstance(posterior, LaplaceGGN) else DEFAULT_POSTERIOR
        if isinstance(posterior, LeastSquaresLogits):
            given = {f.name: getattr(posterior, f.name) for f in fields(posterior) if f.name != "kind"}
            self.settings = self._least_squares_settings(glm, given, likelihood)
        else:
            check_choice(owner, "selection", laplace.selection, ("validation", "evidence"))
            check_choice(owner, "solver", laplace.solver, ("cg", "sgd"))
            check_positive(owner, "prior_precision", laplace.prior_precision,
                           "it is the Gaussian prior's precision")
            check_grid(owner, "prior_precision_grid", laplace.prior_precision_grid,
                       "they are candidate precisions of the Gaussian prior")
            check_count(owner, "max_iters", laplace.max_iters, 1,
                        "the posterior solve runs this many CG iterations or SGD epochs")
        self.progress_bar = progress_bar
        self.glm, self.last_layer_name = glm, last_layer_name
        self.n_samples, self.prior_precision = n_samples, laplace.prior_precision
        self.solver, self.max_iters, self.seed = laplace.solver, laplace.max_iters, seed
        self.prior_precision_grid = laplace.prior_precision_grid
        selection = laplace.selection
        if selection == "evidence" and glm != "last_layer":
            raise setting_error(owner, "selection", selection, "selection='evidence' has a closed form for"
                                " glm='last_layer' only", "use selection='validation' with glm='full'")
        self.selection = selection
        self.log_evidence: dict[float, float] = {}
        self.chosen_prior_precision: float | None = None
        self.validation_lppd: dict[float, float] = {}
        #: ``least_squares_logits``: validation LPPD per ``(gamma, predictive_scale)``.
        self.grid_lppd: dict[tuple[float, float], float] = {}
        self.chosen_gamma: float | None = None
        self.chosen_predictive_scale: float | None = None
        self.sampler: GLMPosteriorSampler | LeastSquaresLogitSampler | None = None
        self.affine: tuple[float, float] = (1.0, 0.0)

    @staticmethod
    def _least_squares_settings(glm: str, given: dict[str, Any], likelihood: str) -> dict[str, Any]:
        """The reference's defaults for ``glm`` updated with the given values, validated."""
        owner = LastLayerSampler.__name__
        if likelihood == "regression":
            raise setting_error(owner, "likelihood", likelihood, "posterior='least_squares_logits' is the"
                                " reference's classifier sampler (it fits logits)",
                                "use posterior='laplace_ggn' for regression")
        settings: dict[str, Any] = {**LEAST_SQUARES_DEFAULTS[glm], "predictive_scale": 1.0}
        settings["epochs"], settings["batch_size"] = int(settings["epochs"]), int(settings["batch_size"])
        settings.update({k: v for k, v in given.items() if v is not None})
        check_grid(owner, "gamma_grid", settings.get("gamma_grid"), "they scale the start draws")
        check_grid(owner, "predictive_scale_grid", settings.get("predictive_scale_grid"),
                   "they multiply the linearised logits")
        for name, why in (("gamma", "it scales the start draws"), ("predictive_scale", "it multiplies the"
                          " linearised logits"), ("lr", "it is the SGD step size")):
            check_positive(owner, name, settings[name], why)
        check_fraction(owner, "momentum", settings["momentum"], "it is the heavy-ball factor")
        for name in ("epochs", "batch_size"):
            value = settings[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise setting_error(owner, name, value, "epochs and batch_size must be integers >= 1 (SGD"
                                    " passes over the training data, rows per SGD step)",
                                    f"set {name} to 1 or more")
        return settings

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(glm=self.glm, last_layer_name=self.last_layer_name)

    # ------------------------------------------------------------------ fitting
    def fit_posterior(self, trainer: L.Trainer,
                      pl_module: L.LightningModule) -> GLMPosteriorSampler | LeastSquaresLogitSampler:
        """Draw the posterior samples from the training data (gradients enabled)."""
        if isinstance(self.posterior, LeastSquaresLogits):
            return self._fit_least_squares(trainer, pl_module)
        loader = self.ordered_train_loader(trainer)
        likelihood = self.resolve_likelihood(pl_module)
        with torch.inference_mode(False), torch.enable_grad():
            input_fn = self.input_fn(pl_module)
            lin = self._linearization(pl_module, input_fn)
            # The sampler works in the module's raw output units; metrics in target units.
            scale, shift = self.output_affine(pl_module) if likelihood == "regression" else (1.0, 0.0)
            self.affine = (scale, shift)
            noise = self.noise_variance_setting
            if likelihood == "regression":
                noise = self.regression_noise_variance(trainer, pl_module, loader, input_fn)
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
                    progress=self.show_progress(trainer, self.progress_bar),
                ).fit(loader, target_fn)
                score = self._validation_lppd(trainer, sampler) if len(grid) > 1 else 0.0
                self.validation_lppd[lam] = score
                if best is None or score > best[0]:
                    best = (score, lam, sampler)
            assert best is not None
            _, self.chosen_prior_precision, self.sampler = best
            if len(grid) > 1:
                log.info(f"LastLayerSampler: prior_precision={self.chosen_prior_precision:g} has the"
                         f" best validation LPPD ({best[0]:.4f}) of {grid}")
        self.likelihood, self.noise_variance = likelihood, self.sampler.noise_variance * scale**2
        return self.sampler

    def _linearization(self, pl_module: L.LightningModule,
                       input_fn: Any) -> LastLayerLinearization | FullNetworkLinearization:  # noqa: ANN401
        if self.glm == "last_layer":
            return LastLayerLinearization(pl_module, input_fn, self.last_layer_name)
        return FullNetworkLinearization(pl_module, input_fn)

    def _fit_least_squares(self, trainer: L.Trainer,
                           pl_module: L.LightningModule) -> LeastSquaresLogitSampler:
        """The reference sampler's solve, then ``(gamma, scale)`` by validation LPPD."""
        likelihood = self.resolve_likelihood(pl_module)
        if likelihood == "regression":
            raise ValueError(f"posterior='least_squares_logits' fits logits; {type(pl_module).__name__} is a"
                             " regression module: use posterior='laplace_ggn'.")
        self.likelihood, self.noise_variance, self.affine = likelihood, 1.0, (1.0, 0.0)
        cfg = self.settings
        loader = self.ordered_train_loader(trainer, cfg["batch_size"])
        progress = self.show_progress(trainer, self.progress_bar)
        with torch.inference_mode(False), torch.enable_grad():
            lin = self._linearization(pl_module, self.input_fn(pl_module))
            sampler = LeastSquaresLogitSampler(
                lin, n_samples=self.n_samples, epochs=cfg["epochs"], lr=cfg["lr"], momentum=cfg["momentum"],
                perturb="weights" if self.glm == "last_layer" else "all", gamma=cfg["gamma"],
                scale=cfg["predictive_scale"], seed=self.seed, progress=progress,
            ).fit(loader)
            gammas = cfg.get("gamma_grid") or [cfg["gamma"]]
            scales = cfg.get("predictive_scale_grid") or [cfg["predictive_scale"]]
            if len(gammas) * len(scales) > 1:
                self.grid_lppd = self._grid_lppd(trainer, sampler, gammas, scales)
                sampler.gamma, sampler.scale = best = max(self.grid_lppd, key=self.grid_lppd.get)
                log.info(f"LastLayerSampler: gamma={best[0]:g}, predictive_scale={best[1]:g} have the"
                         f" best validation LPPD ({self.grid_lppd[best]:.4f}) of gamma {gammas} x"
                         f" scale {scales}")
        self.chosen_gamma, self.chosen_predictive_scale = sampler.gamma, sampler.scale
        self.sampler = sampler
        return sampler

    def _grid_lppd(self, trainer: L.Trainer, sampler: LeastSquaresLogitSampler, gammas: list[float],
                   scales: list[float]) -> dict[tuple[float, float], float]:
        """Validation LPPD of every ``(gamma, scale)`` from one pass of Jacobian products."""
        loader = trainer.datamodule.val_dataloader() if trainer.datamodule is not None else None
        if loader is None:
            raise RuntimeError("gamma_grid and predictive_scale_grid need a datamodule with a"
                               " val_dataloader.")
        cached = [(*sampler.deviations(batch), plain_copy(self.target(batch))) for batch in loader]
        scores = {}
        for gamma, scale in itertools.product(gammas, scales):
            metric = LogPointwisePredictiveDensity(task="classification", input_kind="probs")
            for outputs, deviations, target in cached:
                logits = sampler.combine(outputs, deviations, gamma, scale)
                metric.update(self.probabilities(self.tempered(logits)).cpu(), target.cpu())
            scores[gamma, scale] = float(metric.compute())
        return scores

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
        log.info(f"LastLayerSampler: prior_precision={chosen:g} has the highest log evidence of {grid}")
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
                metric.update(self.probabilities(self.tempered(samples)).cpu(), target.cpu())
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
        chosen = {"uq/prior_precision": self.chosen_prior_precision, "uq/gamma": self.chosen_gamma,
                  "uq/predictive_scale": self.chosen_predictive_scale}
        for name, value in chosen.items():
            if value is not None:  # the same on every rank
                pl_module.log(name, float(value), sync_dist=True)

    def sample(self, pl_module: L.LightningModule, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """Linearised predictions of the S posterior samples, ``(B, S, C)``."""
        assert self.sampler is not None
        scale, shift = self.affine
        with torch.inference_mode(False), torch.enable_grad():
            samples = self.sampler.predict(batch)
        return samples * scale + shift if (scale, shift) != (1.0, 0.0) else samples
