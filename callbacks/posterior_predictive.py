"""PosteriorPredictiveCallback: the shared half of every post-hoc sampler callback.

A subclass says how to prepare (``prepare``) and how to draw S predictions for a batch
(``sample -> (B, S, C)``, members on axis 1, ``ripieno.framework.members``); this base evaluates them. On
``test`` it logs, under ``uq/test/``: ``accuracy``, ``ece`` (15 bins), ``nll``, ``brier``
and ``lppd`` of the posterior predictive and ``varroc_id`` (classification; ``varroc_ood``
when a test dataloader holds OOD inputs), or Gaussian ``nll`` (with the noise), ``lppd``
and ``crps`` (of the Gaussian mixture around the samples, with the noise) (regression),
and sends the reliability diagram to the active logger, tagged
``uq/test/reliability/<Callback>`` (``ripieno.callbacks.figure_logging``: TensorBoard's
``add_figure``, a logger's image API, else ``reliability_<Callback>.png`` in the logger's
``log_dir`` or, without a logger, in ``trainer.default_root_dir``) (classification). On
``predict`` it adds ``posterior_samples`` to each step's output dict.

``temperature`` (classification) divides every sampled logit by a temperature before the
softmax, in test metrics, ``posterior_samples`` and the samplers' own validation scores: a
number, a fitted ``TemperatureScaling`` callback, or ``"callback"`` for the
``TemperatureScaling`` among the trainer's callbacks (what a recipe YAML can say). The
posterior itself is fitted on the untempered likelihood. The default (``None``) leaves
the samples as they are.

VARROC's predicted class (``varroc_prediction``) is the predictive mean's by default; with
``map`` it is the trained network's own argmax (one extra forward pass per test batch), as
in the LinearSampling paper's evaluation of GLM samples.
"""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils._pytree import tree_map
from torch.utils.data import DataLoader
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from ripieno.callbacks.figure_logging import log_reliability_diagram
from ripieno.callbacks.sampler_settings import (
    LIKELIHOODS,
    check_choice,
    check_count,
    check_likelihood,
    check_positive,
    setting_error,
)
from ripieno.callbacks.temperature_scaling import TemperatureScaling
from ripieno.framework.members import OutputAffineModel, TaskModel
from ripieno.framework.messages import get_logger
from ripieno.framework.metrics.uq import (
    VARROC_PREDICTIONS,
    BrierScore,
    EnsembleCRPS,
    ExpectedCalibrationError,
    GaussianNLL,
    LogPointwisePredictiveDensity,
    PredictiveNLL,
    VarROC,
)
from ripieno.framework.uq.linearization import call_model

log = get_logger(__name__)



def plain_copy(batch: Any) -> Any:  # noqa: ANN401
    """Copies of inference-mode tensors, usable by autograd and ``torch.func``."""
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, batch)


class PosteriorPredictiveCallback(Callback, ABC):
    """Evaluate S sampled predictions per batch on test; attach them on predict.

    Args:
        input_key: key of the model input in dict batches (tuples use element 0); a list
            of keys passes a dict of them (e.g. ``[input_ids, attention_mask]``).
        target_key: key of the target in dict batches (tuples use element 1).
        ood_dataloader_idx: index of a test dataloader holding OOD inputs: its batches
            feed ``varroc_ood`` (AUROC of OOD vs correctly classified ID points) only.
        varroc_prediction: whose argmax is VARROC's predicted class (which points count
            as correct, which class's variance is scored): ``predictive_mean`` or ``map``
            (the trained network alone).
        temperature: divide sampled logits by this before the softmax (classification):
            a float ``> 0``, a ``TemperatureScaling`` callback (its fitted temperature), or
            ``"callback"`` (the ``TemperatureScaling`` in the trainer's callbacks); ``None``
            leaves the samples unchanged.
        likelihood: ``auto`` (from the module's ``task``, the ``TaskModel`` capability of
            ``ripieno.framework.members``; a module without it is read as a classifier, and the
            log says so), ``regression``, ``classification`` or ``binary``; kept as
            ``likelihood_setting``.
        noise_variance: regression noise ``sigma^2``; ``None`` estimates it as the mean squared
            training residual (``regression_noise_variance``); kept as ``noise_variance_setting``.
        likelihoods: the ``likelihood`` values the sampler supports.
    """

    #: ``regression``, ``classification`` or ``binary``; set by ``prepare``.
    likelihood: str = "classification"
    #: observation-noise variance for regression; set by ``prepare``.
    noise_variance: float = 1.0

    def __init__(self, input_key: str | list[str] = "x", target_key: str = "y",
                 ood_dataloader_idx: int | None = None,
                 varroc_prediction: Literal["predictive_mean", "map"] = "predictive_mean",
                 temperature: float | TemperatureScaling | Literal["callback"] | None = None, *,
                 likelihood: str = "auto", noise_variance: float | None = None,
                 likelihoods: Sequence[str] = LIKELIHOODS) -> None:
        super().__init__()
        owner = type(self).__name__
        check_likelihood(owner, likelihood, noise_variance, likelihoods)
        #: the ``likelihood`` argument (``auto``: resolved from the module by ``resolve_likelihood``).
        self.likelihood_setting = likelihood
        #: the ``noise_variance`` argument (``None``: estimated by ``regression_noise_variance``).
        self.noise_variance_setting = noise_variance
        check_choice(owner, "varroc_prediction", varroc_prediction, VARROC_PREDICTIONS)
        if isinstance(temperature, bool) or (isinstance(temperature, str) and temperature != "callback"):
            raise setting_error(owner, "temperature", temperature,
                                "temperature must be a float, a TemperatureScaling or 'callback'",
                                "pass a number > 0, the callback, 'callback' or None")
        if isinstance(temperature, int | float):
            check_positive(owner, "temperature", temperature, "sampled logits are divided by it")
        if ood_dataloader_idx is not None:
            check_count(owner, "ood_dataloader_idx", ood_dataloader_idx, 0, "it indexes the test dataloaders")
        self.temperature = temperature
        self._temperature_source: TemperatureScaling | None = (
            temperature if isinstance(temperature, TemperatureScaling) else None)
        self.input_key, self.target_key = input_key, target_key
        self.ood_dataloader_idx = ood_dataloader_idx
        self.varroc_prediction = varroc_prediction
        self._metrics: dict[str, Any] = {}
        self.prepared = False
        self.reliability_path: Path | None = None

    # ------------------------------------------------------------- subclass API
    @abstractmethod
    def prepare(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Fit whatever the sampler needs (posterior, statistics); set ``likelihood``."""

    @abstractmethod
    def sample(self, pl_module: L.LightningModule, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """S predictions (logits or regression means) for a batch, ``(B, S, C)``."""

    # ------------------------------------------------------------------ helpers
    def model_input(self, batch: Any) -> Any:  # noqa: ANN401
        """The module's input in a batch (a dict of several keys when ``input_key`` is a list)."""
        if isinstance(self.input_key, list | tuple):
            return {key: batch[key] for key in self.input_key}
        return batch[self.input_key] if isinstance(batch, dict) else batch[0]

    @staticmethod
    def ordered_train_loader(trainer: L.Trainer, batch_size: int | None = None) -> Any:  # noqa: ANN401
        """The datamodule's training data in a fixed order.

        The posterior draws one noise vector per training point in loader order, so a
        shuffled loader would give each DDP rank (and each run) a different posterior.

        Args:
            trainer: the trainer whose datamodule holds the training data.
            batch_size: batches of this size instead of the training loader's.

        Raises:
            RuntimeError: without a datamodule that has a train_dataloader.
            ValueError: for ``batch_size`` when the training loader is not a ``DataLoader``.
        """
        loader = trainer.datamodule.train_dataloader() if trainer.datamodule is not None else None
        if loader is None:
            raise RuntimeError("A posterior callback needs a datamodule with a train_dataloader.")
        if isinstance(loader, DataLoader):
            loader = DataLoader(loader.dataset, batch_size=batch_size or loader.batch_size, shuffle=False,
                                collate_fn=loader.collate_fn, num_workers=loader.num_workers)
        elif batch_size is not None:
            raise ValueError(f"A batch size of its own needs the training data as a torch DataLoader, got"
                             f" {type(loader).__name__}.")
        return loader

    def device_input(self, batch: Any, device: torch.device) -> Any:  # noqa: ANN401
        """The model input of ``batch`` as fresh tensors on ``device`` (autograd-safe copies)."""
        return tree_map(lambda t: t.to(device) if isinstance(t, torch.Tensor) else t,
                        plain_copy(self.model_input(batch)))

    def input_fn(self, pl_module: L.LightningModule) -> Any:  # noqa: ANN401
        """``batch -> model input`` on the module's device (picklable, for DDP spawn)."""
        return functools.partial(self.device_input, device=pl_module.device)

    def device_target(self, batch: Any, device: torch.device,  # noqa: ANN401
                      affine: tuple[float, float] = (1.0, 0.0)) -> torch.Tensor:
        """The target of ``batch`` as a fresh tensor on ``device``.

        With ``affine = (scale, shift)`` (regression), mapped into the module's raw output
        units: ``(y - shift) / scale``.
        """
        target = plain_copy(self.target(batch)).to(device)
        if affine == (1.0, 0.0):
            return target
        return (target.float() - affine[1]) / affine[0]

    def target(self, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """The target in a batch."""
        return batch[self.target_key] if isinstance(batch, dict) else batch[1]

    def resolve_likelihood(self, pl_module: L.LightningModule, likelihood: str | None = None) -> str:
        """``likelihood`` (default ``likelihood_setting``), or from ``pl_module.task`` when ``auto``.

        A module without ``task`` (the ``TaskModel`` capability) is read as a classifier; the log
        says so, and a regression module sets ``task`` or the sampler's ``likelihood``.
        """
        likelihood = self.likelihood_setting if likelihood is None else likelihood
        if likelihood != "auto":
            return likelihood
        if not isinstance(pl_module, TaskModel):
            log.info(f"{type(self).__name__}: {type(pl_module).__name__} has no task attribute, so"
                     " likelihood='auto' reads it as a classifier; set likelihood='regression' (or the"
                     " module's task) for a regression module.")
            return "classification"
        task = pl_module.task
        return task if task in ("regression", "binary") else "classification"

    @staticmethod
    def output_affine(pl_module: L.LightningModule) -> tuple[float, float]:
        """``(scale, shift)`` from the module's raw regression outputs to target units.

        A module whose forward returns standardised values (the tabular ensembles) says
        so with an ``output_affine`` attribute (the optional ``OutputAffineModel``
        capability); every other module is in target units.
        """
        scale, shift = pl_module.output_affine if isinstance(pl_module, OutputAffineModel) else (1.0, 0.0)
        return float(scale), float(shift)

    def regression_noise_variance(self, trainer: L.Trainer | None, pl_module: L.LightningModule,
                                  loader: Any = None, input_fn: Any = None,  # noqa: ANN401
                                  network: torch.nn.Module | None = None) -> float | None:
        """The regression noise variance: ``noise_variance`` when given, else its estimate (logged).

        The estimate is ``training_noise_variance``: the mean squared training residual of
        ``network`` in eval mode, in target units.

        Args:
            trainer: the trainer whose datamodule holds the training data.
            pl_module: the trained module.
            loader: the training batches (default: the datamodule's ``train_dataloader()``).
            input_fn: ``batch -> model input`` (default: ``input_fn(pl_module)``).
            network: whose residuals count (default ``pl_module``; SWAG: the network at the SWA mean).

        Returns:
            The variance, or ``None`` when none was given and there is no training data.
        """
        if self.noise_variance_setting is not None:
            return float(self.noise_variance_setting)
        if loader is None:
            datamodule = trainer.datamodule if trainer is not None else None
            if datamodule is None:
                return None
            loader = datamodule.train_dataloader()
        noise = self.training_noise_variance(pl_module if network is None else network, loader,
                                             self.input_fn(pl_module) if input_fn is None else input_fn)
        log.info(f"{type(self).__name__}: noise_variance estimated as {noise:.4g}")
        return noise

    def current_temperature(self) -> float | None:
        """The temperature that divides sampled logits now (``None``: no scaling).

        Raises:
            RuntimeError: ``temperature`` names a ``TemperatureScaling`` that has not fitted
                one yet, or ``"callback"`` was not resolved (no such callback in the trainer).
        """
        if self.temperature is None:
            return None
        if isinstance(self.temperature, int | float):
            return float(self.temperature)
        source = self._temperature_source
        if source is None:
            raise RuntimeError(f"{type(self).__name__}(temperature='callback') needs a TemperatureScaling"
                               " callback in the same Trainer's callbacks.")
        if source.temperature is None:
            raise RuntimeError(f"{type(self).__name__}: its TemperatureScaling has not fitted a temperature"
                               " yet; run trainer.fit (with validation data) or trainer.validate first, or"
                               " load a checkpoint that holds one.")
        return float(source.temperature)

    def tempered(self, samples: torch.Tensor) -> torch.Tensor:
        """Sampled logits divided by ``current_temperature()`` (unchanged without one).

        Raises:
            ValueError: a temperature on a regression likelihood.
        """
        temperature = self.current_temperature()
        if temperature is None:
            return samples
        if self.likelihood == "regression":
            raise ValueError(f"{type(self).__name__}: a temperature scales classification logits; this"
                             " is a regression likelihood, so pass temperature=None.")
        return samples / temperature

    def posterior_samples(self, pl_module: L.LightningModule, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """``sample`` with the temperature applied: what test metrics and predict outputs use."""
        return self.tempered(self.sample(pl_module, batch))

    def probabilities(self, samples: torch.Tensor) -> torch.Tensor:
        """Per-sample class probabilities ``(B, S, C)`` (two columns for a binary logit)."""
        if self.likelihood == "binary":
            p1 = torch.sigmoid(samples[..., 0].float())
            return torch.stack([1 - p1, p1], dim=-1)
        return torch.softmax(samples.float(), dim=-1)

    @torch.no_grad()
    def training_noise_variance(self, pl_module: L.LightningModule, loader: Any,  # noqa: ANN401
                                input_fn: Any) -> float:  # noqa: ANN401
        """Mean squared training residual of the network in eval mode (the noise MLE).

        In target units (see ``output_affine``); member heads each count as a prediction.
        """
        was_training = pl_module.training
        pl_module.eval()
        total, count = 0.0, 0
        scale, shift = self.output_affine(pl_module)
        for batch in loader:
            out = call_model(pl_module, input_fn(batch)).float() * scale + shift
            y = plain_copy(self.target(batch)).to(out.device).float()
            y = y.reshape(out.shape[0], *([1] * (out.dim() - 1)))  # broadcast over member heads
            total += float(((out - y) ** 2).sum())
            count += out.numel()
        pl_module.train(was_training)
        return total / max(count, 1)

    @torch.no_grad()
    def map_probabilities(self, pl_module: L.LightningModule, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """Class probabilities ``(B, C)`` of the trained network alone, in eval mode.

        Member outputs ``(B, K, C)`` are averaged in probability space.
        """
        was_training = pl_module.training
        pl_module.eval()
        try:
            out = call_model(pl_module, self.device_input(batch, pl_module.device)).float()
        finally:
            pl_module.train(was_training)
        out = out[:, None] if out.dim() == 2 else out.reshape(out.shape[0], -1, out.shape[-1])
        return self.probabilities(out).mean(1)

    def is_stale(self, pl_module: L.LightningModule) -> bool:
        """Whether ``prepare`` must run again (e.g. other weights were loaded); default no."""
        return False

    @staticmethod
    def show_progress(trainer: L.Trainer, setting: bool | None) -> bool:
        """Whether a fit shows a progress bar: ``setting``, else when the Trainer shows its own.

        Only global rank 0 ever shows one.
        """
        show = trainer.progress_bar_callback is not None if setting is None else bool(setting)
        return show and trainer.is_global_zero

    def _ensure_prepared(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.prepared and self.is_stale(pl_module):
            log.info(f"{type(self).__name__}: the weights changed since it was prepared (a"
                     " checkpoint was loaded); preparing again for these weights.")
            self.prepared = False
        if not self.prepared:
            self.prepare(trainer, pl_module)
            self.prepared = True

    # -------------------------------------------------------------------- hooks
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.temperature == "callback":
            found = [c for c in trainer.callbacks if isinstance(c, TemperatureScaling)]
            if len(found) != 1:
                raise ValueError(f"{type(self).__name__}(temperature='callback') needs exactly one"
                                 f" TemperatureScaling in the Trainer's callbacks, found {len(found)}.")
            self._temperature_source = found[0]

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.prepare(trainer, pl_module)
        self.prepared = True

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._ensure_prepared(trainer, pl_module)
        self._metrics = {}  # built on the first batch, when the class count is known

    def _build_metrics(self, n_classes: int, device: torch.device) -> None:
        if self.likelihood == "regression":
            metrics = {"nll": GaussianNLL(), "lppd": LogPointwisePredictiveDensity(task="regression"),
                       "crps": EnsembleCRPS()}
        else:
            prediction = self.varroc_prediction
            metrics = {"accuracy": MulticlassAccuracy(num_classes=n_classes, average="micro"),
                       "ece": ExpectedCalibrationError(num_classes=n_classes, input_kind="probs"),
                       "nll": PredictiveNLL(input_kind="probs"),
                       "brier": BrierScore(input_kind="probs"),
                       "lppd": LogPointwisePredictiveDensity(task="classification", input_kind="probs"),
                       "varroc_id": VarROC(mode="id", input_kind="probs", prediction=prediction)}
            if self.ood_dataloader_idx is not None:
                metrics["varroc_ood"] = VarROC(mode="ood", input_kind="probs", prediction=prediction)
        self._metrics = {k: m.to(device) for k, m in metrics.items()}

    @override
    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        samples = self.posterior_samples(pl_module, batch)
        target = self.target(batch)
        if not self._metrics:
            self._build_metrics(max(samples.shape[-1], 2), samples.device)
        if self.likelihood == "regression":
            mean = samples.mean(1)
            var = samples.var(1, unbiased=False) + self.noise_variance
            y = target.float().reshape(mean.shape)
            self._metrics["nll"].update(mean.flatten(), y.flatten(), var.flatten())
            self._metrics["lppd"].update(samples, y, self.noise_variance)
            self._metrics["crps"].update(samples, y, self.noise_variance)
            return
        probs = self.probabilities(samples)
        varroc_kwargs = {}
        if self.varroc_prediction == "map":
            varroc_kwargs["map_outputs"] = self.map_probabilities(pl_module, batch).to(probs.device)
        if dataloader_idx == self.ood_dataloader_idx:  # OOD rows feed the OOD detector only
            self._metrics["varroc_ood"].update(probs, None, is_ood=True, **varroc_kwargs)
            return
        for name, metric in self._metrics.items():
            if name.startswith("varroc"):
                metric.update(probs, target, **varroc_kwargs)
            else:
                metric.update(probs.mean(1) if name == "accuracy" else probs, target)

    def _write_reliability_diagram(self, trainer: L.Trainer) -> list[str | Path]:
        """Send the reliability diagram of the ECE metric's synced states to the loggers (every rank calls).

        ``reliability_path`` is set to the PNG written, if any (no logger, or one without
        an image API).
        """
        ece = self._metrics.get("ece")
        if ece is None:
            return []
        name = type(self).__name__
        where = log_reliability_diagram(trainer, ece, f"uq/test/reliability/{name}", f"reliability_{name}",
                                        title=name)
        if where:
            self.reliability_path = next((p for p in where if isinstance(p, Path)), None)
            log.info(f"{name}: reliability diagram sent to {', '.join(map(str, where))}")
        return where

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._write_reliability_diagram(trainer)
        for name, metric in self._metrics.items():  # compute() has reduced across ranks; the mean keeps it
            pl_module.log(f"uq/test/{name}", metric.compute(), sync_dist=True, add_dataloader_idx=False)
            metric.reset()

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._ensure_prepared(trainer, pl_module)

    @override
    def on_predict_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                             batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        if not isinstance(outputs, dict):
            raise TypeError(f"{type(self).__name__} needs predict_step to return a dict to add"
                            " posterior_samples.")
        outputs["posterior_samples"] = self.posterior_samples(pl_module, batch)
