"""Shared pieces of the ddp_spawn tests (importable from the workers: tests/ is on sys.path)."""

import lightning as L
import torch

from ripieno.framework.runner.process_group_exit import close_process_group_at_exit


class DestroyGlooAtExit(L.Callback):
    """Destroy the gloo process group in each worker before interpreter shutdown.

    Lightning destroys the process group at exit only for nccl; left to garbage collection
    at interpreter shutdown, gloo's threads sometimes abort a worker ("terminate called
    without an active exception"): 2 of 12 reruns of the GeoReg ddp test before this, 0 of
    10 after. Add it to every ``ddp_spawn`` Trainer in the tests; the ``ripieno`` command's
    own launcher closes the group itself (``framework/runner/process_group_exit.py``).
    """

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Register the process group's destruction for this worker's exit."""
        if torch.distributed.is_initialized():
            close_process_group_at_exit()


class CountingCNN(torch.nn.Module):
    """A tiny CNN that appends a line to ``log`` on every forward (counts runs across processes)."""

    def __init__(self, log: str) -> None:
        super().__init__()
        self.log = log
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3),
                                        torch.nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run the body and record the call."""
        with open(self.log, "a") as handle:
            handle.write(f"{x.shape[0]}\n")
        return self.body(x)
