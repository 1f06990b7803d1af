"""The one extension point through which callbacks add terms to a module's loss.

Lightning callbacks cannot change the loss after ``training_step`` returns, so every
ripieno LightningModule mixes in ``LossTermsMixin`` and adds
``self.registered_loss_terms(...)`` to its training loss. A callback (GeoReg, a user's
regulariser) calls ``pl_module.register_loss_term(name, fn)`` in its ``setup`` hook;
``fn(module, batch, step_output) -> scalar tensor`` sees the batch and the step's
output dict (``member_outputs``, ``target`` and, where a module provides them,
``features``). Each term is logged as ``train/loss_term/<name>``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

LossTerm = Callable[[Any, Any, dict[str, Any]], Tensor]


class LossTermsMixin:
    """Registry of extra loss terms for a LightningModule."""

    def register_loss_term(self, name: str, fn: LossTerm) -> None:
        """Add ``fn``'s value to every training loss from now on.

        Args:
            name: unique name, used for logging and removal.
            fn: ``fn(module, batch, step_output) -> scalar tensor``.
        """
        terms = self._loss_term_registry()
        if name in terms:
            raise ValueError(f"A loss term named {name!r} is already registered.")
        terms[name] = fn

    def remove_loss_term(self, name: str) -> None:
        """Stop adding the term ``name`` (no error if absent)."""
        self._loss_term_registry().pop(name, None)

    def registered_loss_terms(self, batch: Any, step_output: dict[str, Any]) -> Tensor:  # noqa: ANN401
        """Sum of all registered terms for this step (zero when none), each logged."""
        total: Tensor | None = None
        for name, fn in self._loss_term_registry().items():
            value = fn(self, batch, step_output)
            if value.ndim != 0:
                raise ValueError(f"Loss term {name!r} must return a scalar, got {tuple(value.shape)}.")
            self.log(f"train/loss_term/{name}", value.detach(), on_step=False, on_epoch=True,  # type: ignore[attr-defined]
                     sync_dist=True)  # epoch-only: reduced across ranks once, at the epoch's end
            total = value if total is None else total + value
        return torch.zeros((), device=getattr(self, "device", None)) if total is None else total

    def _loss_term_registry(self) -> dict[str, LossTerm]:
        if "_loss_terms" not in self.__dict__:
            self.__dict__["_loss_terms"] = {}
        return self.__dict__["_loss_terms"]
