"""A tune trial on several devices: one trial per process group, under Lightning's ``ddp`` launcher.

With ``--trainer.strategy=ddp --trainer.devices=N``, Lightning starts ranks 1..N-1 of each fit by
running the process's command line again (``sys.argv``) in subprocesses. Run inside ``ripieno
tune`` as it is, that would start N-1 more studies. ``trial_command`` makes that command line the
trial's own ``ripieno fit`` (its recipe, overrides and run folder) for the duration of the trial, so
the other ranks join exactly this fit and end with it; afterwards the process group is closed, so the
next trial starts a new one (Optuna's advice for DDP: optuna#1417, #4384).

Pruning stays consistent across ranks: Optuna's Lightning callback on rank 0 decides, and
broadcasts its decision after every validation; the other ranks take part in that broadcast through
``PruningFollower``, which the ``ripieno`` command adds when ``FOLLOWER_VARIABLE`` names the metric.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

FOLLOWER_VARIABLE = "RIPIENO_TUNE_PRUNING_MONITOR"
"""Set for a trial's launched ranks: the metric whose pruning decision rank 0 broadcasts."""
LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "NODE_RANK", "LOCAL_RANK", "RANK")
"""What Lightning's launcher leaves in the environment; a trial's are cleared for the next trial."""


class PruningFollower(Callback):
    """On ranks other than 0: join Optuna's pruning broadcast after each validation, and stop with it.

    Args:
        monitor: the metric the pruning callback reads (it broadcasts only when the metric is logged).
    """

    def __init__(self, monitor: str) -> None:
        self.monitor = monitor

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.callback_metrics.get(self.monitor) is None:
            return
        should_stop = trainer.strategy.broadcast(False)  # rank 0's decision
        trainer.should_stop = trainer.should_stop or bool(should_stop)


@contextmanager
def trial_command(fit_args: list[str], monitor: str) -> Iterator[None]:
    """In the block, the process's command line is the trial's ``ripieno fit`` (module docstring).

    Args:
        fit_args: the trial's ``ripieno`` arguments (``["fit", "-c", ...]``).
        monitor: the metric the pruning callback reads.
    """
    argv = list(sys.argv)
    environment = {name: os.environ.get(name) for name in (*LAUNCHER_VARIABLES, FOLLOWER_VARIABLE)}
    sys.argv = [argv[0] if argv else "ripieno", *fit_args]
    os.environ[FOLLOWER_VARIABLE] = monitor
    try:
        yield
    finally:
        sys.argv = argv
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # the next trial's ranks form a group of their own
        for name, value in environment.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
