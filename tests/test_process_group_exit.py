"""The ``ripieno`` command's workers close their process group before they exit."""

import queue

import lightning as L
import pytest
import torch
from lightning.pytorch.strategies.launchers import multiprocessing as lightning_launchers

from ripieno.framework.runner.process_group_exit import close_process_group
from ripieno.framework.runner.spawn_results import ResultsKeepingLauncher, keep_spawned_results


@pytest.fixture
def gloo_group(tmp_path):
    """A one-process gloo group in this process, destroyed afterwards whatever the test did."""
    store = torch.distributed.FileStore(str(tmp_path / "store"), 1)
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_a_spawned_worker_closes_its_gloo_group_after_the_work(gloo_group, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")  # the launcher sets it; restored afterwards
    monkeypatch.setattr(lightning_launchers, "_set_num_threads_if_needed", lambda num_processes: None)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    keep_spawned_results(trainer)
    launcher = trainer.strategy._launcher
    assert isinstance(launcher, ResultsKeepingLauncher)
    seen = []

    def work() -> str:
        seen.append(torch.distributed.is_initialized())
        return "done"

    results: queue.Queue = queue.Queue()
    launcher._wrapping_function(0, None, work, (), {}, results)
    assert seen == [True]  # the group was there for the work
    assert results.get_nowait() == "done"
    assert not torch.distributed.is_initialized()  # and is closed before the worker exits


def test_a_failed_worker_keeps_its_group_so_no_barrier_waits_on_it(gloo_group, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setattr(lightning_launchers, "_set_num_threads_if_needed", lambda num_processes: None)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False)
    keep_spawned_results(trainer)

    def work() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        trainer.strategy._launcher._wrapping_function(0, None, work, (), {}, queue.Queue())
    assert torch.distributed.is_initialized()  # the launcher's join terminates the other ranks


def test_closing_without_a_group_does_nothing():
    assert not torch.distributed.is_initialized()
    close_process_group()
    assert not torch.distributed.is_initialized()
