"""RoutingResampler: redraw an M-cover module's permutation bank on a schedule.

The callback owns a seeded CPU generator. Every rank seeds it alike and draws the same
number of times, so all DDP ranks route identically without communication; its state
goes into checkpoints (``state_dict``) and the bank itself is a module buffer, so a
resumed run continues the same sequence of banks as an uninterrupted one.

Steps are optimiser steps (``trainer.global_step``): with ``accumulate_grad_batches=k`` a
redraw comes before the first of the ``k`` batches of a due step, and every batch of that
step routes through the same bank.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from ripieno.framework.members import PermutationBankModel, require_capability


def find_routed_module(pl_module: L.LightningModule,
                       callback: object | str = "RoutingResampler") -> PermutationBankModel:
    """``pl_module`` or its first submodule with the ``PermutationBankModel`` capability.

    Args:
        pl_module: the module being trained.
        callback: the callback asking (named in the error).

    Raises:
        MissingCapabilityError: if there is none (the module is not M-cover routed); a ``TypeError``.
    """
    fix = ("route the module's copies through a permutation bank (mix in"
           " ripieno.framework.mcover.copies.PermutationCopiesMixin, as"
           " ripieno.framework.mcover.MCoverClassifier does), or drop RoutingResampler")
    return require_capability(callback, pl_module, PermutationBankModel, fix, within=pl_module.modules())


class RoutingResampler(Callback):
    """Redraw the permutation bank every ``every_n_steps`` steps or ``every_n_epochs`` epochs.

    The module (or a submodule) needs the ``PermutationBankModel`` capability
    (``ripieno.framework.members``); ``setup`` stops the run without it.

    Logged at each redraw: ``routing/self_fraction`` (mean of the empirical mixing
    matrix's diagonal; 1 = no mixing), ``routing/mixing_entropy`` (nats; ``log M`` =
    uniform) and ``routing/draws``: the epoch's mean over redraws under these names and,
    with ``every_n_steps``, each redraw's value under ``routing/<name>_step``.

    Args:
        every_n_steps: redraw before optimiser steps ``0, n, 2n, ...``.
        every_n_epochs: redraw before epochs ``0, n, 2n, ...`` (instead of steps).
        seed: seed of the callback's own generator.
    """

    def __init__(self, every_n_steps: int | None = None, every_n_epochs: int | None = None,
                 seed: int = 0) -> None:
        super().__init__()
        if (every_n_steps is None) == (every_n_epochs is None):
            raise ValueError("Set exactly one of every_n_steps and every_n_epochs.")
        for name, value in (("every_n_steps", every_n_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}.")
        self.every_n_steps, self.every_n_epochs, self.seed = every_n_steps, every_n_epochs, seed
        self.generator: torch.Generator | None = None  # made per process: generators do not pickle
        self.draws = 0
        self.history: list[dict[str, float]] = []
        # global_step of the last training batch seen: later batches of the same optimiser step
        # (gradient accumulation) keep the bank. Reset at every train start, so it needs no state_dict.
        self._seen_step: int | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(every_n_steps=self.every_n_steps, every_n_epochs=self.every_n_epochs,
                                        seed=self.seed)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable state for ``ddp_spawn``: the generator travels as its state tensor."""
        state = self.__dict__.copy()
        generator = state.pop("generator")
        state["_generator_state"] = generator.get_state() if generator is not None else None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Rebuild the generator from its state tensor."""
        generator_state = state.pop("_generator_state", None)
        self.__dict__.update(state)
        self.generator = None
        if generator_state is not None:
            self._make_generator().set_state(generator_state)

    def _make_generator(self) -> torch.Generator:
        if self.generator is None:
            self.generator = torch.Generator().manual_seed(self.seed)
        return self.generator

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        find_routed_module(pl_module, self)  # fail before training if there is nothing to route
        self._make_generator()

    def _redraw(self, pl_module: L.LightningModule) -> None:
        routed = find_routed_module(pl_module, self)
        routed.draw_permutation_bank(self._make_generator())
        self.draws += 1
        stats = routed.permutation_bank.statistics()
        self.history.append(stats)
        for name, value in {**stats, "draws": float(self.draws)}.items():
            # The same on every rank (same generator), but logged with sync_dist so that the epoch value is a
            # cross-rank reduction; a separate step-only entry keeps that all-reduce off every step.
            if self.every_n_steps is not None:
                pl_module.log(f"routing/{name}_step", value, on_step=True, on_epoch=False)
            pl_module.log(f"routing/{name}", value, on_step=False, on_epoch=True, sync_dist=True)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._seen_step = None

    @override
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,  # noqa: ANN401
                             batch_idx: int) -> None:
        step = trainer.global_step
        if self.every_n_steps is None or step == self._seen_step:  # a later batch of the same optimiser step
            return
        self._seen_step = step
        if step % self.every_n_steps == 0:
            self._redraw(pl_module)

    @override
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.every_n_epochs is not None and trainer.current_epoch % self.every_n_epochs == 0:
            self._redraw(pl_module)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"generator": self._make_generator().get_state(), "draws": self.draws}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._make_generator().set_state(state_dict["generator"])
        self.draws = int(state_dict["draws"])
