"""Threads per worker, so that N processes sharing this machine do not fight over its cores.

``ripieno tune --workers N`` and ``ripieno benchmark --workers N`` run N processes, each of
which would start as many torch, BLAS and OpenMP threads as the machine has cores: N x cores
threads on the cores, and the many small GEMMs of a tabular fit wait on each other's threads
(measured on the 2-core machine: a LoMETab step 2-3.6x slower beside a 2-thread load). Each
spawned worker runs with ``threads_per_worker(N)`` threads instead (torch's intra-op pool, and
every BLAS / OpenMP pool through ``threadpoolctl``), so N x threads <= cores; the GBDT fits
follow the same count (``framework/methods/gbdt.py``). One worker runs in the command's own
process with its threads as they are.

Example:
    >>> threads_per_worker(2, cores=2), threads_per_worker(3, cores=8), threads_per_worker(4, cores=2)
    (1, 2, 1)
    >>> resolve_threads(2, None) == threads_per_worker(2), resolve_threads(2, 3)
    (True, 3)
    >>> thread_plan(2, 1, cores=2)
    '2 workers x 1 thread on 2 cores'
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and ``taskset`` narrow)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """The threads each of ``workers`` processes gets: ``cores // workers``, at least one.

    Args:
        workers: processes sharing the machine.
        cores: the cores they share (default: ``available_cores()``).
    """
    return max(1, (cores or available_cores()) // max(1, workers))


def resolve_threads(workers: int, threads: int | None) -> int:
    """The threads each worker runs with: ``threads`` if given, else the cores divided among the workers.

    One worker runs in the calling process with torch's thread count as it is.
    """
    if threads is not None:
        return threads
    return torch.get_num_threads() if workers == 1 else threads_per_worker(workers)


def thread_plan(workers: int, threads: int, cores: int | None = None) -> str:
    """``'2 workers x 1 thread on 2 cores'``: what a run's first line says about its threads."""
    cores = cores or available_cores()
    text = (f"{workers} worker{'s' if workers != 1 else ''} x {threads} thread{'s' if threads != 1 else ''}"
            f" on {cores} core{'s' if cores != 1 else ''}")
    if workers * threads > cores:
        text += f" (more threads than cores: {workers * threads})"
    return text


@contextmanager
def worker_threads(threads: int | None) -> Iterator[None]:
    """Torch's intra-op threads and every BLAS / OpenMP pool limited to ``threads`` in the block.

    Restored afterwards (a worker in the user's own process leaves it as it found it); ``None``
    leaves them as they are (one worker in the caller's process, no ``threads`` given).
    """
    if threads is None:
        yield
        return
    from threadpoolctl import threadpool_limits  # scikit-learn's dependency: on every install

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        torch.set_num_threads(before)
