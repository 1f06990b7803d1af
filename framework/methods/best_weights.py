"""The best epoch's weights, kept in memory: ``ModelCheckpoint``'s choice without the file.

A scikit-learn estimator's fit (``EnsembleClassifier`` / ``EnsembleRegressor``, every ``ripieno
benchmark`` cell of an ensemble) needs the weights of its best validation epoch and nothing on
disk: its checkpoint went to a temporary folder deleted when the fit ends. Writing it there cost
9% of a 700-row, 50-epoch fit (``bench/fit_cost.py``); a copy of the state dict in memory costs
microseconds for these networks. The choice is ``ModelCheckpoint(monitor, mode, save_top_k=1)``'s:
the first validation is kept, then an epoch replaces it only if strictly better, and a NaN counts
as the worst value. Lightning has no in-memory checkpoint callback, hence this one; a run that
must survive its process (``ripieno fit``) keeps ``ModelCheckpoint`` and its atomic files.

Example:
    >>> best = BestWeights(monitor="val/loss", mode="min")
    >>> best.best_score is None and best.best_epoch is None
    True
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override


class BestWeights(Callback):
    """Keep a copy of the module's weights at its best validation epoch; load them with ``restore``.

    Args:
        monitor: the logged metric that ranks epochs (``trainer.callback_metrics``).
        mode: ``min`` or ``max``.
    """

    def __init__(self, monitor: str = "val/loss", mode: Literal["min", "max"] = "min") -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}.")
        self.monitor, self.mode = monitor, mode
        self.best_score: float | None = None
        self.best_epoch: int | None = None
        self._state: dict[str, torch.Tensor] | None = None

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Copy the weights if this validation is the first, or strictly better than the best."""
        if trainer.sanity_checking or self.monitor not in trainer.callback_metrics:
            return
        score = float(trainer.callback_metrics[self.monitor])
        if math.isnan(score):
            score = math.inf if self.mode == "min" else -math.inf  # ModelCheckpoint's rule for NaN
        better = (self.best_score is None or (score < self.best_score if self.mode == "min"
                                              else score > self.best_score))
        if better:
            self.best_score, self.best_epoch = score, trainer.current_epoch
            self._state = {name: value.detach().clone() for name, value in pl_module.state_dict().items()}

    def restore(self, module: torch.nn.Module) -> bool:
        """Load the best epoch's weights into ``module``; ``False`` if no validation ran."""
        if self._state is None:
            return False
        module.load_state_dict(self._state)
        return True

    @override
    def state_dict(self) -> dict[str, Any]:
        """The best score and epoch (not the weights: they are the module's own state)."""
        return {"best_score": self.best_score, "best_epoch": self.best_epoch}
