"""After a spawned ``fit``, the main process knows what the workers knew.

Under ``ddp_spawn`` (and ``ddp_fork``) the fit runs in worker processes; Lightning hands back
to the main process only the best checkpoint's path, the final weights and the callback
metrics. The main process's Trainer still reads epoch 0, step 0 and no ``last.ckpt``: the
test after fit logged its row at step 0 instead of after the fit's last step, and the run
summary had no ``last`` line. ``ResultsKeepingLauncher`` also hands back the fit loop's
progress and every ``ModelCheckpoint``'s state (best and last paths, scores, folder), so the
main process continues exactly where the workers stopped, as a one-process run does.

Each worker also closes its process group when its work is done (``process_group_exit``), so
a finished run is not reported as failed because gloo aborted a worker at exit.
"""

from __future__ import annotations

import io
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from ripieno.framework.runner.lightning_private import MultiProcessingLauncher, replace_spawn_launcher
from ripieno.framework.runner.process_group_exit import close_process_group

_KEY = "ripieno_fit_state"


class ResultsKeepingLauncher(MultiProcessingLauncher):
    """Lightning's multiprocessing launcher that also returns the fit's progress and checkpoint state.

    Its workers close their process group after the work, before the process exits.
    """

    @override
    def _wrapping_function(self, process_idx: int, *args: Any, **kwargs: Any) -> None:
        super()._wrapping_function(process_idx, *args, **kwargs)
        close_process_group()  # reached only when the work succeeded on this rank

    @override
    def get_extra_results(self, trainer: L.Trainer) -> dict[str, Any]:
        extra = super().get_extra_results(trainer)
        if trainer.state.fn == TrainerFn.FITTING:
            state = {"fit_loop": trainer.fit_loop.state_dict(),
                     "checkpoints": {c.state_key: c.state_dict() for c in trainer.checkpoint_callbacks
                                     if isinstance(c, ModelCheckpoint)}}
            buffer = io.BytesIO()
            torch.save(state, buffer)  # as bytes, like Lightning's callback metrics: no shared memory
            extra[_KEY] = buffer.getvalue()
        return extra

    @override
    def update_main_process_results(self, trainer: L.Trainer, extra: dict[str, Any]) -> None:
        super().update_main_process_results(trainer, extra)
        if _KEY not in extra:
            return
        state = torch.load(io.BytesIO(extra[_KEY]), weights_only=True)
        trainer.fit_loop.load_state_dict(state["fit_loop"])
        saved_states = state["checkpoints"]
        for callback in trainer.checkpoint_callbacks:
            saved = saved_states.get(callback.state_key) if isinstance(callback, ModelCheckpoint) else None
            if saved is not None:
                callback.dirpath = saved.get("dirpath", callback.dirpath)
                callback.load_state_dict(saved)


def keep_spawned_results(trainer: L.Trainer) -> None:
    """Give ``trainer``'s strategy a ``ResultsKeepingLauncher`` if it launches with multiprocessing."""
    # exactly Lightning's launcher only: a user's own launcher is kept
    replace_spawn_launcher(trainer.strategy, ResultsKeepingLauncher)
