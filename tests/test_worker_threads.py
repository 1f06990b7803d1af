"""Workers that do not fight: N workers x threads <= cores, stated, and followed by every fit.

Oracles: the cores this process may use (``os.sched_getaffinity``), torch's own thread count
inside each fit as the benchmark records it, and the GBDT estimators' own thread parameters.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch

from ripieno.framework.cli import main
from ripieno.framework.runner.worker_threads import (
    available_cores,
    thread_plan,
    threads_per_worker,
    worker_threads,
)
from ripieno.framework.specs.table_splits import TableSplits


def test_workers_share_the_cores_and_the_plan_says_so():
    assert available_cores() == len(os.sched_getaffinity(0))
    for cores in (1, 2, 3, 8, 16):
        for workers in range(1, 2 * cores + 1):
            threads = threads_per_worker(workers, cores=cores)
            assert threads >= 1
            assert workers * threads <= cores or threads == 1  # more workers than cores: one thread each
            assert (workers * (threads + 1) > cores)  # and no core left idle that a thread could use
    assert thread_plan(4, 1, cores=2) == "4 workers x 1 thread on 2 cores (more threads than cores: 4)"
    assert thread_plan(1, 2, cores=2) == "1 worker x 2 threads on 2 cores"


def test_worker_threads_limits_torch_and_blas_and_restores_them():
    from threadpoolctl import threadpool_info

    before = torch.get_num_threads()
    with worker_threads(1):
        assert torch.get_num_threads() == 1
        assert all(pool["num_threads"] == 1 for pool in threadpool_info())
    assert torch.get_num_threads() == before
    with worker_threads(None):  # one worker in the caller's process: its threads as they are
        assert torch.get_num_threads() == before


def _table(n: int = 300) -> TableSplits:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"x": rng.normal(size=n), "z": rng.normal(size=n)})
    y = (frame["x"].to_numpy() + rng.normal(size=n) > 0).astype(int)
    parts = {"train": np.arange(0, 180), "val": np.arange(180, 240), "test": np.arange(240, n)}
    features = {s: frame.iloc[r].reset_index(drop=True) for s, r in parts.items()}
    return TableSplits(task="binary", features=features, targets={s: y[r] for s, r in parts.items()},
                       class_names=["no", "yes"], name="synthetic")


@pytest.mark.parametrize(("kind", "parameter"), [("xgboost", "n_jobs"), ("lightgbm", "n_jobs"),
                                                  ("catboost", "thread_count")])
def test_a_gbdt_fit_runs_with_the_workers_threads_not_every_core(kind, parameter):
    from ripieno.framework.methods import gbdt

    fit = getattr(gbdt, f"fit_{kind}")
    with worker_threads(1):
        model, *_ = fit(_table(), {"n_estimators": 5}, 0)
    assert model.get_params()[parameter] == 1
    model, *_ = fit(_table(), {"n_estimators": 5, parameter: 2}, 0)  # the user's own setting wins
    assert model.get_params()[parameter] == 2


def test_a_benchmark_states_its_threads_first_and_its_fits_run_with_them(tmp_path, capsys, tiny_benchmark):
    config, out = tiny_benchmark(), tmp_path / "out"
    main(["benchmark", "-c", str(config), "--out", str(out), "--datasets", "mlc_churn", "--threads", "1"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("ripieno: benchmark tiny:") and first.endswith(thread_plan(1, 1))
    assert (pd.read_csv(out / "results.csv")["threads"] == 1).all()
    assert torch.get_num_threads() >= 1  # restored (the command's process is the test's)
