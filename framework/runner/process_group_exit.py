"""Close the ``torch.distributed`` process group before a worker process exits.

Lightning destroys the process group at exit only for nccl. A gloo group (DDP on CPU) left
to interpreter shutdown sometimes aborts its worker with "terminate called without an active
exception" after the run has finished: gloo's C++ threads are still joinable when the static
destructors run, and the spawn launcher then reports the whole command as failed. The
``ripieno`` command closes the group itself, in every worker, once the work is done.
"""

from __future__ import annotations

import atexit

import torch

_registered = False


def close_process_group(wait_for_peers: bool = True) -> None:
    """Destroy this process's default process group, if one is initialised.

    Args:
        wait_for_peers: First wait at a barrier, so no peer is still talking to this
            process (rank 0 also hosts the group's store) when it goes away.
    """
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if wait_for_peers:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def close_process_group_at_exit() -> None:
    """Register :func:`close_process_group` (without the barrier) for this process's exit, once."""
    global _registered
    if not _registered:
        atexit.register(close_process_group, wait_for_peers=False)
        _registered = True
