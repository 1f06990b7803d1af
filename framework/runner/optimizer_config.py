"""The config's optimizer and learning-rate schedule, over the module's own parameter groups.

Plain LightningCLI ignores ``--lr_scheduler`` unless ``--optimizer`` is given, and with
``--optimizer`` replaces the module's ``configure_optimizers`` by one over
``model.parameters()``: parameter groups (no weight decay on biases and adapters, a
``backbone_lr``) are lost. The ``ripieno`` command gives the module an ``OptimizerConfig``
instead (``attach_optimizer_config``):

* ``lr_scheduler`` alone schedules the module's own optimizer (the single optimizer its
  ``configure_optimizers`` returns, ``build_optimizer(optimizer_parameters())`` for a
  ``MemberModule``);
* ``optimizer`` builds that class over ``optimizer_parameters()`` when the module has it (a
  group's own ``lr`` or ``weight_decay`` wins over the optimizer's), else over
  ``parameters()`` for a module that never configured an optimizer itself;
* a ``total_steps`` the schedule leaves unset (``WarmupCosineLR``, ``OneCycleLR``, any class
  with that argument) is the run's length: ``trainer.estimated_stepping_batches`` when the
  schedule steps per optimizer step, ``trainer.max_epochs`` when per epoch;
* the interval is ``auto`` by default: per optimizer step for schedules whose class says so
  (``default_interval = "step"``) and for ``OneCycleLR`` and ``CyclicLR``, else per epoch.
  ``lightning.pytorch.cli.ReduceLROnPlateau`` watches its ``monitor``.

What cannot work stops before training with one line (``OptimizerConfigError``).

Example:
    >>> import lightning as L
    >>> import torch
    >>> from ripieno.framework.runner.optimizer_config import attach_optimizer_config
    >>> class Tiny(L.LightningModule):
    ...     def __init__(self) -> None:
    ...         super().__init__()
    ...         self.layer = torch.nn.Linear(2, 1)
    ...     def configure_optimizers(self) -> torch.optim.Optimizer:
    ...         return torch.optim.SGD(self.parameters(), lr=0.1)
    >>> model = Tiny()
    >>> attach_optimizer_config(model, None, {"class_path": "torch.optim.lr_scheduler.StepLR",
    ...                                       "init_args": {"step_size": 2}})
    >>> out = model.configure_optimizers()
    >>> type(out["optimizer"]).__name__, type(out["lr_scheduler"]["scheduler"]).__name__
    ('SGD', 'StepLR')
    >>> out["lr_scheduler"]["interval"]
    'epoch'
"""

from __future__ import annotations

import importlib
import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import lightning as L
from lightning.pytorch.cli import ReduceLROnPlateau, instantiate_class
from torch.optim import Optimizer
from torch.optim.lr_scheduler import CyclicLR, OneCycleLR
from torch.optim.lr_scheduler import ReduceLROnPlateau as TorchReduceLROnPlateau

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.methods.schedules import WarmupCosineLR, WarmupLinearLR

Interval = Literal["auto", "step", "epoch"]
STEP_SCHEDULERS: tuple[type, ...] = (WarmupCosineLR, WarmupLinearLR, OneCycleLR, CyclicLR)
"""Schedules that step per optimizer step under ``auto``, as do classes with ``default_interval = "step"``.

Importing ripieno's own here (with the CLI) also lets ``--lr_scheduler WarmupCosineLR`` find them by name.
"""
LENGTH_ARGS = ("epochs", "steps_per_epoch")
"""``OneCycleLR``'s other way to give its length: when set, ``total_steps`` is not filled in."""


class OptimizerConfigError(RipienoInputError):
    """The config's optimizer or schedule cannot be used with this module; the message says what can."""


def scheduler_interval(scheduler_class: type, interval: Interval = "auto") -> Literal["step", "epoch"]:
    """How often Lightning steps a schedule of ``scheduler_class``.

    Args:
        scheduler_class: The schedule's class.
        interval: ``step`` or ``epoch`` as given; ``auto``: the class's ``default_interval``,
            else ``step`` for ``OneCycleLR`` and ``CyclicLR``, else ``epoch``.
    """
    if interval != "auto":
        return interval
    declared = getattr(scheduler_class, "default_interval", None)
    if declared in ("step", "epoch"):
        return declared
    return "step" if issubclass(scheduler_class, STEP_SCHEDULERS) else "epoch"


def attach_optimizer_config(module: L.LightningModule, optimizer: Mapping[str, Any] | None,
                            lr_scheduler: Mapping[str, Any] | None, interval: Interval = "auto",
                            check: bool = True) -> None:
    """Make ``module.configure_optimizers`` build the config's optimizer and schedule (module docstring).

    Nothing changes when neither is given.

    Args:
        module: The LightningModule.
        optimizer: ``{"class_path", "init_args"}`` of ``--optimizer``, or ``None``.
        lr_scheduler: ``{"class_path", "init_args"}`` of ``--lr_scheduler``, or ``None``.
        interval: ``auto``, ``step`` or ``epoch`` (``scheduler_interval``).
        check: Check now, before training, that the module can take them.

    Raises:
        OptimizerConfigError: with ``check``, for a combination that cannot work.
    """
    if optimizer is None and lr_scheduler is None:
        return
    config = OptimizerConfig(_plain(optimizer), _plain(lr_scheduler), interval)
    if check:
        config.check(module)
    module.configure_optimizers = partial(config.configure_optimizers, module)  # type: ignore[method-assign]


@dataclass(frozen=True)
class OptimizerConfig:
    """The optimizer and schedule a config asks for; its ``configure_optimizers`` builds them.

    Attributes:
        optimizer: ``{"class_path", "init_args"}`` of the optimizer, or ``None`` (the module's own).
        lr_scheduler: ``{"class_path", "init_args"}`` of the schedule, or ``None``.
        interval: ``auto``, ``step`` or ``epoch``.
    """

    optimizer: dict[str, Any] | None
    lr_scheduler: dict[str, Any] | None
    interval: Interval = "auto"

    def check(self, module: L.LightningModule) -> None:
        """Raise ``OptimizerConfigError`` now for what would fail when Lightning configures ``module``."""
        name = type(module).__name__
        if self.lr_scheduler is not None:
            path = self.lr_scheduler["class_path"]
            scheduler_class = _import(path)
            if issubclass(scheduler_class, TorchReduceLROnPlateau) and \
                    not issubclass(scheduler_class, ReduceLROnPlateau):
                raise OptimizerConfigError(
                    f"lr_scheduler {path} needs a metric to watch: use"
                    " lightning.pytorch.cli.ReduceLROnPlateau with init_args.monitor (e.g. val/loss).")
            _check_plateau_monitor(module, (self.lr_scheduler.get("init_args") or {}).get("monitor"))
            if not module.automatic_optimization:
                raise OptimizerConfigError(
                    f"{name} optimizes manually (automatic_optimization = False), so Lightning would never"
                    " step the config's lr_scheduler; leave out lr_scheduler.")
        if self.optimizer is not None:
            _optimizer_parameters(module)
        elif self.lr_scheduler is not None:
            try:
                returned = type(module).configure_optimizers(module)
            except Exception:  # noqa: BLE001 - it needs the Trainer: checked when Lightning calls it
                return
            _single_optimizer(returned, name)

    def configure_optimizers(self, module: L.LightningModule) -> Any:  # noqa: ANN401
        """The optimizer, and the schedule's Lightning config when there is one."""
        if self.optimizer is None:
            optimizer = _single_optimizer(type(module).configure_optimizers(module), type(module).__name__)
        else:
            optimizer = instantiate_class(_optimizer_parameters(module), self.optimizer)
        if self.lr_scheduler is None:
            return optimizer
        scheduler_class = _import(self.lr_scheduler["class_path"])
        interval = scheduler_interval(scheduler_class, self.interval)
        init_args = _with_total_steps(scheduler_class, dict(self.lr_scheduler.get("init_args") or {}),
                                      module, interval)
        scheduler = scheduler_class(optimizer, **init_args)
        config: dict[str, Any] = {"scheduler": scheduler, "interval": interval}
        if isinstance(scheduler, ReduceLROnPlateau):
            config["monitor"] = scheduler.monitor
        return {"optimizer": optimizer, "lr_scheduler": config}


def _optimizer_parameters(module: L.LightningModule) -> Any:  # noqa: ANN401
    """What ``--optimizer`` trains: ``optimizer_parameters()``, else ``parameters()`` (no groups to keep)."""
    groups = getattr(module, "optimizer_parameters", None)
    if callable(groups):
        return groups()
    if type(module).configure_optimizers is not L.LightningModule.configure_optimizers:
        name = type(module).__name__
        raise OptimizerConfigError(
            f"--optimizer would replace {name}.configure_optimizers, and {name} has no optimizer_parameters()"
            " saying its parameter groups; define optimizer_parameters() returning them (as MemberModule"
            " does), or leave out --optimizer and choose the optimizer in configure_optimizers.")
    return module.parameters()


def _check_plateau_monitor(module: L.LightningModule, monitor: object) -> None:
    """Refuse a ``val/...`` plateau monitor that the module never logs (its ``logged_metric_names``)."""
    names_of = getattr(module, "logged_metric_names", None)
    if not (isinstance(monitor, str) and monitor.startswith("val/") and callable(names_of)):
        return
    logged = sorted(names_of("val"))
    if monitor not in logged:
        raise OptimizerConfigError(
            f"lr_scheduler ReduceLROnPlateau monitors {monitor!r}, which {type(module).__name__} does not log"
            f" on this data; it logs {', '.join(logged)}. Set lr_scheduler.init_args.monitor to one of them.")


def _single_optimizer(returned: object, name: str) -> Optimizer:
    """The one optimizer a ``configure_optimizers`` output holds, refusing outputs a schedule cannot join."""
    optimizers, schedulers = _parts(returned)
    if schedulers:
        raise OptimizerConfigError(
            f"{name}.configure_optimizers already returns a learning-rate scheduler; leave out the config's"
            " lr_scheduler, or drop the module's own schedule (a MemberModule's build_lr_scheduler).")
    if not optimizers:
        raise OptimizerConfigError(
            f"{name}.configure_optimizers returns no optimizer for the config's lr_scheduler to schedule;"
            " add --optimizer (e.g. torch.optim.AdamW) or return one optimizer from configure_optimizers.")
    if len(optimizers) > 1:
        raise OptimizerConfigError(
            f"{name}.configure_optimizers returns {len(optimizers)} optimizers, and the config's lr_scheduler"
            " schedules one; set the schedules in configure_optimizers instead and leave out lr_scheduler.")
    return optimizers[0]


def _parts(returned: object) -> tuple[list[Any], list[Any]]:
    """The optimizers and schedulers in any output form Lightning accepts from ``configure_optimizers``."""
    if returned is None:
        return [], []
    if isinstance(returned, Mapping):
        optimizer, scheduler = returned.get("optimizer"), returned.get("lr_scheduler")
        return [o for o in (optimizer,) if o is not None], [s for s in (scheduler,) if s is not None]
    if isinstance(returned, list | tuple) and len(returned) == 2 and isinstance(returned[0], list):
        second = returned[1]
        return list(returned[0]), list(second) if isinstance(second, list | tuple) else [second]
    if isinstance(returned, list | tuple):
        optimizers: list[Any] = []
        schedulers: list[Any] = []
        for item in returned:
            found = _parts(item)
            optimizers += found[0]
            schedulers += found[1]
        return optimizers, schedulers
    return [returned], []


def _with_total_steps(scheduler_class: type, init_args: dict[str, Any], module: L.LightningModule,
                      interval: str) -> dict[str, Any]:
    """``init_args`` with an unset ``total_steps`` filled with the run's length in scheduler steps."""
    if "total_steps" not in inspect.signature(scheduler_class).parameters \
            or init_args.get("total_steps") is not None \
            or any(init_args.get(k) is not None for k in LENGTH_ARGS):
        return init_args
    trainer = module.trainer
    total = trainer.estimated_stepping_batches if interval == "step" else trainer.max_epochs
    if total is None or not math.isfinite(total) or total < 1:
        raise OptimizerConfigError(
            f"lr_scheduler {scheduler_class.__name__}: total_steps is unset and the run has no fixed length"
            f" in {interval}s; set lr_scheduler.init_args.total_steps, or trainer.max_steps / max_epochs.")
    return {**init_args, "total_steps": int(total)}


def _import(class_path: str) -> type:
    module_name, _, class_name = class_path.rpartition(".")
    return getattr(importlib.import_module(module_name), class_name)


def _plain(init: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A ``{"class_path", "init_args"}`` jsonargparse Namespace or mapping as plain dicts."""
    if init is None:
        return None
    as_dict = getattr(init, "as_dict", None)
    return dict(as_dict() if callable(as_dict) else init)
