"""Shared pieces of the ddp_spawn tests (importable from the workers: tests/ is on sys.path)."""

import atexit

import lightning as L
import torch


class DestroyGlooAtExit(L.Callback):
    """Destroy the gloo process group in each worker before interpreter shutdown.

    Lightning destroys the process group at exit only for nccl; left to garbage collection
    at interpreter shutdown, gloo's threads sometimes abort a worker ("terminate called
    without an active exception"): 2 of 12 reruns of the GeoReg ddp test before this, 0 of
    10 after. Add it to every ``ddp_spawn`` Trainer in the tests.
    """

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Register the process group's destruction for this worker's exit."""
        if torch.distributed.is_initialized():
            atexit.register(torch.distributed.destroy_process_group)
