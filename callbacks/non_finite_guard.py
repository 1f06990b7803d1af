"""NonFiniteGuard: stop at the first NaN or inf, before it can be checkpointed.

A diverging run (learning rate too high, bad inputs, float16 overflow) otherwise goes on
quietly: the loss turns NaN, ``ModelCheckpoint`` saves the first epoch's NaN weights as the
best ones (its top-k list is still empty), and the failure shows up later, far from its
cause. This callback raises ``NonFiniteTrainingError`` instead, naming the step, the epoch,
the value and the likely causes:

* the training loss, before its backward pass (so the update it would make never happens);
* every logged metric (or only the monitored ones) after each validation and training epoch,
  before ``ModelCheckpoint`` runs (Lightning calls checkpoint callbacks last);
* the weights of every checkpoint about to be written.

Under DDP the ranks agree on the decision (``reduce_boolean_decision``), so either all stop
or none does; that is one small all-reduce per training step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from typing_extensions import override

from ripieno.framework.errors import NonFiniteTrainingError

MetricScope = Literal["all", "monitored"]


class NonFiniteGuard(Callback):
    """Raise ``NonFiniteTrainingError`` at the first non-finite loss, metric or checkpointed weight.

    The ``ripieno`` command adds one to every run whose config has none. With your own
    Trainer::

        trainer = L.Trainer(callbacks=[NonFiniteGuard(), ModelCheckpoint(monitor="val/nll")])

    Example:
        >>> import torch
        >>> guard = NonFiniteGuard()
        >>> guard.non_finite({"val/nll": torch.tensor(float("nan")), "val/accuracy": 0.5})
        ['val/nll = nan']

    Args:
        metrics: ``all`` checks every logged metric; ``monitored`` only those that a
            ``ModelCheckpoint`` or ``EarlyStopping`` of the Trainer monitors (for runs that
            log diagnostics which may legitimately be infinite).
        check_loss: Check the training loss at every step (before its backward pass).
        check_checkpoints: Refuse to write a checkpoint whose weights are not all finite.
    """

    def __init__(self, metrics: MetricScope = "all", check_loss: bool = True,
                 check_checkpoints: bool = True) -> None:
        super().__init__()
        if metrics not in ("all", "monitored"):
            raise ValueError(f"metrics must be 'all' or 'monitored', got {metrics!r}.")
        self.metrics = metrics
        self.check_loss = check_loss
        self.check_checkpoints = check_checkpoints
        self._checked_batch: tuple[int, int] | None = None

    @staticmethod
    def non_finite(values: Mapping[str, Any]) -> list[str]:
        """``name = value`` for every number or tensor in ``values`` that is not all finite."""
        bad = []
        for name, value in values.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                if not bool(torch.isfinite(value.detach()).all()):
                    shown = f"{value.item():.4g}" if value.numel() == 1 else "a tensor with NaN/inf"
                    bad.append(f"{name} = {shown}")
            elif isinstance(value, float) and not math.isfinite(value):
                bad.append(f"{name} = {value}")
        return bad

    # ------------------------------------------------------------------ the loss
    @override
    def on_before_backward(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           loss: torch.Tensor) -> None:
        if self.check_loss:
            self._check_training_loss(trainer, loss)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                           batch: Any, batch_idx: int) -> None:  # noqa: ANN401
        """Modules without a backward pass (gradient-free, or manual steps without one)."""
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if self.check_loss and isinstance(loss, torch.Tensor) and self._checked_batch != _position(trainer):
            self._check_training_loss(trainer, loss)

    def _check_training_loss(self, trainer: L.Trainer, loss: torch.Tensor) -> None:
        self._checked_batch = _position(trainer)
        bad = self.non_finite({"loss": loss})
        if trainer.strategy.reduce_boolean_decision(bool(bad), all=False):
            found = ("the training loss is " + bad[0].split(" = ", 1)[1] if bad
                     else "the training loss is not finite on another process")
            raise NonFiniteTrainingError(
                f"{found} at global step {trainer.global_step} (epoch {trainer.current_epoch},"
                f" batch {trainer.fit_loop.epoch_loop.batch_idx}); training stopped before this step's"
                f" update, so no checkpoint holds its weights. {_likely_causes(trainer)}")

    # ------------------------------------------------------------------ logged metrics
    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        when = "the sanity-check validation" if trainer.sanity_checking else "validation"
        self._check_metrics(trainer, when)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._check_metrics(trainer, "the training epoch")

    def _check_metrics(self, trainer: L.Trainer, when: str) -> None:
        metrics = trainer.callback_metrics
        if self.metrics == "monitored":
            watched = set(_monitored(trainer.callbacks))
            metrics = {k: v for k, v in metrics.items() if k in watched}
        bad = self.non_finite(metrics)
        if trainer.strategy.reduce_boolean_decision(bool(bad), all=False):
            found = ", ".join(bad) if bad else "a logged metric is not finite on another process"
            raise NonFiniteTrainingError(
                f"{found} after {when} at global step {trainer.global_step} (epoch {trainer.current_epoch});"
                " training stopped before any checkpoint of this state was written."
                f" {_likely_causes(trainer)}")

    # ------------------------------------------------------------------ checkpoints
    @override
    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if not self.check_checkpoints:
            return
        state = checkpoint.get("state_dict", {})
        bad = [name for name, value in state.items() if isinstance(value, torch.Tensor)
               and value.is_floating_point() and not bool(torch.isfinite(value).all())]
        if trainer.strategy.reduce_boolean_decision(bool(bad), all=False):
            names = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise NonFiniteTrainingError(
                f"the weights {names or '(on another process)'} are not finite at global step"
                f" {trainer.global_step} (epoch {trainer.current_epoch}); the checkpoint was not written."
                f" {_likely_causes(trainer)}")


def _position(trainer: L.Trainer) -> tuple[int, int]:
    return trainer.current_epoch, trainer.fit_loop.epoch_loop.batch_idx


def _monitored(callbacks: Iterable[Callback]) -> list[str]:
    return [c.monitor for c in callbacks
            if isinstance(c, ModelCheckpoint | EarlyStopping) and getattr(c, "monitor", None)]


def _likely_causes(trainer: L.Trainer) -> str:
    rates = sorted({float(g["lr"]) for opt in trainer.optimizers for g in opt.param_groups if "lr" in g})
    rate = f" (the optimizer's is {', '.join(f'{r:g}' for r in rates)})" if rates else ""
    precision = str(trainer.precision)
    half = (" or float16 overflow (precision is " + precision + "; try bf16-mixed or 32)"
            if "16" in precision and "bf16" not in precision else "")
    return (f"Likely causes: a learning rate too high{rate}; NaN, inf or extreme values in the inputs or"
            f" targets{half}. Lower the learning rate or check the data, then train again.")
