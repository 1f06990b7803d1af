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
or none does.

On an accelerator, reading the loss's finiteness on the host every step would stall the device
every step (and, under DDP, add an all-reduce). There the loss check is kept on the device and
read every ``check_every_n_steps`` steps (``auto``: 50 on an accelerator, every step on CPU,
where reading costs nothing), and always before validation, at the end of each training epoch
and before any checkpoint is written. Between two reads, a step whose loss is not finite makes
no change to the weights through its gradients: the guard zeroes them on the device before the
optimizer step (an optimizer with momentum or weight decay still moves the weights by those,
which stay finite). The error then names the first step whose loss was not finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.accelerators import CPUAccelerator
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
        check_every_n_steps: How often the host reads the training loss's check: ``auto`` is
            every step on CPU and every 50 steps on an accelerator (see the module notes);
            an int sets it (1: every step, before that step's backward pass).
    """

    def __init__(self, metrics: MetricScope = "all", check_loss: bool = True,
                 check_checkpoints: bool = True, check_every_n_steps: int | Literal["auto"] = "auto") -> None:
        super().__init__()
        if metrics not in ("all", "monitored"):
            raise ValueError(f"metrics must be 'all' or 'monitored', got {metrics!r}.")
        every = check_every_n_steps
        if every != "auto" and not (isinstance(every, int) and every >= 1):
            raise ValueError(f"check_every_n_steps must be 'auto' or an int >= 1, got {every!r}.")
        self.metrics = metrics
        self.check_loss = check_loss
        self.check_checkpoints = check_checkpoints
        self.check_every_n_steps = check_every_n_steps
        self._checked_batch: tuple[int, int] | None = None
        self._pending: _PendingLossCheck | None = None

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
            self._note_training_loss(trainer, loss)

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                           batch: Any, batch_idx: int) -> None:  # noqa: ANN401
        """Modules without a backward pass (gradient-free, or manual steps without one)."""
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if self.check_loss and isinstance(loss, torch.Tensor) and self._checked_batch != _position(trainer):
            self._note_training_loss(trainer, loss)

    @override
    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        """A step whose loss is not finite and not yet read on the host updates with zero gradients."""
        pending = self._pending
        if pending is None or pending.step_finite is None:
            return
        keep = pending.step_finite
        for group in optimizer.param_groups:
            for param in group["params"]:
                if param.grad is not None:
                    param.grad.copy_(torch.where(keep, param.grad, torch.zeros((), dtype=param.grad.dtype,
                                                                                device=param.grad.device)))

    def _every(self, trainer: L.Trainer) -> int:
        if self.check_every_n_steps != "auto":
            return int(self.check_every_n_steps)
        return 1 if isinstance(trainer.accelerator, CPUAccelerator) else 50

    def _note_training_loss(self, trainer: L.Trainer, loss: torch.Tensor) -> None:
        """Record the loss's check on the device; read it on the host when one is due."""
        self._checked_batch = _position(trainer)
        if self._pending is None:
            self._pending = _PendingLossCheck.new(loss.device)
        self._pending.note(loss, trainer.global_step, _position(trainer))
        if self._every(trainer) == 1 or (trainer.global_step + 1) % self._every(trainer) == 0:
            self._read_loss_check(trainer)

    def _read_loss_check(self, trainer: L.Trainer) -> None:
        """Read the loss checks noted since the last read (one host read; one all-reduce under DDP)."""
        pending, self._pending = self._pending, None
        bad_step = -1 if pending is None else int(pending.first_bad_step.item())
        if trainer.strategy.reduce_boolean_decision(bad_step >= 0, all=False):
            if bad_step >= 0 and pending is not None:
                value = float(pending.first_bad_value.item())
                epoch, batch = pending.positions.get(bad_step, (trainer.current_epoch,
                                                                trainer.fit_loop.epoch_loop.batch_idx))
                found = (f"the training loss is {value:.4g}" if pending.scalar
                         else "the training loss has NaN/inf")
                where = f"at global step {bad_step} (epoch {epoch}, batch {batch})"
            else:
                found = "the training loss is not finite on another process"
                where = f"by global step {trainer.global_step} (epoch {trainer.current_epoch})"
            same_step = bad_step == trainer.global_step and self._every(trainer) == 1
            after = ("training stopped before this step's update, so no checkpoint holds its weights."
                     if same_step else "that step and the ones after it updated with zero gradients, and"
                     " training stopped before any checkpoint of those weights was written.")
            raise NonFiniteTrainingError(f"{found} {where}; {after} {_likely_causes(trainer)}")

    def _read_if_noted(self, trainer: L.Trainer) -> None:
        if self._pending is not None:
            self._read_loss_check(trainer)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._read_if_noted(trainer)

    # ------------------------------------------------------------------ logged metrics
    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        when = "the sanity-check validation" if trainer.sanity_checking else "validation"
        self._check_metrics(trainer, when)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._read_if_noted(trainer)
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
        self._read_if_noted(trainer)
        if not self.check_checkpoints:
            return
        state = checkpoint.get("state_dict", {})
        floats = [(name, value) for name, value in state.items()
                  if isinstance(value, torch.Tensor) and value.is_floating_point() and value.numel()]
        device = floats[0][1].device if floats else None
        checks = [torch.isfinite(value).all().to(device) for _, value in floats]
        finite = torch.stack(checks).tolist() if checks else []  # one host read for the whole checkpoint
        bad = [name for (name, _), ok in zip(floats, finite, strict=True) if not ok]
        if trainer.strategy.reduce_boolean_decision(bool(bad), all=False):
            names = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            raise NonFiniteTrainingError(
                f"the weights {names or '(on another process)'} are not finite at global step"
                f" {trainer.global_step} (epoch {trainer.current_epoch}); the checkpoint was not written."
                f" {_likely_causes(trainer)}")


class _PendingLossCheck:
    """The training losses' checks since the last host read, kept on the loss's device."""

    def __init__(self, first_bad_step: torch.Tensor, first_bad_value: torch.Tensor) -> None:
        self.first_bad_step = first_bad_step
        self.first_bad_value = first_bad_value
        self.step_finite: torch.Tensor | None = None  # this step's check, for the gradient guard
        self.positions: dict[int, tuple[int, int]] = {}
        self.scalar = True

    @classmethod
    def new(cls, device: torch.device) -> _PendingLossCheck:
        return cls(torch.full((), -1, dtype=torch.long, device=device),
                   torch.full((), float("nan"), device=device))

    def note(self, loss: torch.Tensor, step: int, position: tuple[int, int]) -> None:
        loss = loss.detach()
        finite = torch.isfinite(loss).all()
        first = (~finite) & (self.first_bad_step < 0)
        self.first_bad_step = torch.where(first, step, self.first_bad_step)
        if loss.numel() == 1:
            self.first_bad_value = torch.where(first, loss.float().reshape(()), self.first_bad_value)
        else:
            self.scalar = False
        self.step_finite = finite
        self.positions[step] = position


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
