"""Monitored metrics that the run will never log, caught before training.

A ``ModelCheckpoint`` or ``EarlyStopping`` that monitors a metric the model does not log
(``val/nll`` on a regression) lets a run train an epoch and then fail ("conditioned on
metric val/nll which is not available"). ``check_monitors`` compares every ``val/...``
monitor with the names the model declares (``MemberModule.logged_metric_names``) and stops
at once, naming the closest logged metric. Models that declare nothing are not checked.

A step budget that ends before the first validation (``--trainer.max_steps=5`` when an
epoch is 24 steps) fails the same way, after training, keeping no checkpoint.
``FirstValidationCheck`` works out, once the data is loaded and before the first step, the
optimizer step at which the first validation runs, and stops a run that cannot reach it.
"""

from __future__ import annotations

import difflib
import math
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback, EarlyStopping, ModelCheckpoint
from typing_extensions import override

from ripieno.framework.errors import RipienoInputError


def check_monitors(model: object, callbacks: list[Any]) -> None:
    """Raise unless every ``val/...`` monitor of ``callbacks`` is a metric ``model`` logs.

    Args:
        model: The LightningModule; checked if it has ``logged_metric_names(stage)``.
        callbacks: The Trainer's callbacks; their ``ModelCheckpoint`` and ``EarlyStopping``
            monitors are checked.

    Raises:
        RipienoInputError: naming each unknown monitor, its callbacks, the closest logged
            metric and every metric the model logs.
    """
    names_of = getattr(model, "logged_metric_names", None)
    if not callable(names_of):
        return
    logged = sorted(names_of("val"))
    watchers: dict[str, list[str]] = {}
    for callback in callbacks:
        monitor = getattr(callback, "monitor", None)
        if isinstance(callback, ModelCheckpoint | EarlyStopping) and isinstance(monitor, str) \
                and monitor.startswith("val/") and monitor not in logged:
            watchers.setdefault(monitor, []).append(type(callback).__name__)
    if not watchers:
        return
    kind = "regression" if getattr(model, "member_output_kind", "") == "regression" else "classification"
    problems = []
    for monitor, names in watchers.items():
        close = difflib.get_close_matches(monitor, logged, n=1, cutoff=0.0)
        verb = "monitors" if len(names) == 1 else "monitor"
        problems.append(f"{' and '.join(sorted(set(names)))} {verb} {monitor!r}"
                        + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise RipienoInputError(
        f"{'; '.join(problems)}, which {type(model).__name__} does not log on this data ({kind}); it logs"
        f" {', '.join(logged)}. Set those callbacks' init_args.monitor in the recipe to one of them, or check"
        " the data's task (data.init_args.task).")


class FirstValidationCheck(Callback):
    """Stop, before the first training step, a fit whose step budget ends before its first validation.

    Checked when a ``ModelCheckpoint`` or ``EarlyStopping`` monitors a metric that only
    validation logs (any name not starting with ``train/``): with ``limit_val_batches=0``,
    with ``max_epochs`` below ``check_val_every_n_epoch``, or with a ``max_steps`` smaller
    than the optimizer steps before the first validation, the run would train and then fail
    (or keep no checkpoint). The ``ripieno`` command adds it to every fit.

    Raises:
        RipienoInputError: in ``on_train_start``, naming the budget, when the first validation
            would run, the monitors and the fix.
    """

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        watchers = sorted({f"{type(c).__name__} ({c.monitor})" for c in trainer.callbacks
                           if isinstance(c, ModelCheckpoint | EarlyStopping) and isinstance(c.monitor, str)
                           and not c.monitor.startswith("train/")})
        if not watchers or trainer.sanity_checking:
            return
        watched = " and ".join(watchers)
        if trainer.limit_val_batches == 0:
            raise RipienoInputError(f"trainer.limit_val_batches=0 turns validation off, so {watched} never"
                                    " get their metric; allow validation batches or drop those callbacks.")
        every = trainer.check_val_every_n_epoch
        max_epochs = trainer.max_epochs
        if every is not None and max_epochs is not None and 0 <= max_epochs < every:
            raise RipienoInputError(
                f"trainer.max_epochs={max_epochs} ends training before the first validation (epoch {every},"
                f" check_val_every_n_epoch={every}), so {watched} never get their metric; raise"
                f" --trainer.max_epochs to at least {every} or lower --trainer.check_val_every_n_epoch.")
        needed = _steps_to_first_validation(trainer)
        if trainer.max_steps >= 0 and needed is not None and trainer.max_steps < needed:
            per = trainer.accumulate_grad_batches
            raise RipienoInputError(
                f"trainer.max_steps={trainer.max_steps} ends training before the first validation, which runs"
                f" after {needed} optimizer steps (an epoch is {trainer.num_training_batches} batches"
                + (f", {per} per step" if per > 1 else "") + f"), so {watched} never get their metric and no"
                f" checkpoint would be kept; raise --trainer.max_steps to at least {needed}, or validate"
                f" sooner with --trainer.val_check_interval=N (N <= {trainer.max_steps * per} batches).")


def _steps_to_first_validation(trainer: L.Trainer) -> int | None:
    """Optimizer steps before the first validation, or ``None`` when it cannot be known (endless data)."""
    batches = trainer.num_training_batches
    if not isinstance(batches, int) or batches <= 0:
        return None
    per = max(1, trainer.accumulate_grad_batches)
    check = trainer.val_check_batch
    within = min(int(check), batches) if isinstance(check, int | float) and math.isfinite(check) else batches
    every = trainer.check_val_every_n_epoch
    if every is None:  # val_check_interval counts batches across epochs
        epochs, within = divmod(int(check), batches) if math.isfinite(check) else (0, batches)
        if within == 0:
            epochs, within = epochs - 1, batches
        return epochs * math.ceil(batches / per) + math.ceil(within / per)
    return (every - 1) * math.ceil(batches / per) + math.ceil(within / per)
