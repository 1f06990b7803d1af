"""Cells per hour of ``ripieno benchmark`` with 1 and 2 workers on this machine, threads shared or not.

What is measured
    The same benchmark file, run from scratch into a fresh folder each time by the command users
    run (``python -m ripieno benchmark``, a subprocess: start-up, spawning workers and writing the
    report included): ``--tables`` shipped tables cut to ``--rows`` rows, the CPU protocol's
    ensembles (``recipes/benchmarks/tabular_cpu.yaml``: K=16, 2 blocks of 128, batch 256) as
    LoMETab r=4 and TabM, capped at ``--epochs`` epochs, and XGBoost, with ``--seeds`` seeds. Three
    runs: 1 worker; 2 workers with ripieno's thread plan (each worker ``cores // 2`` threads, the
    GBDTs too); 2 workers each with every core's worth of threads (``--threads`` = the cores: how
    workers ran before the plan, N x cores threads on the cores). Each row prints the run's first
    line's thread plan, its wall time, the cells per hour and the ratio to one worker.

Run: ``python bench/benchmark_workers.py`` (``make bench`` runs it with the others); a few minutes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ripieno.framework.runner.worker_threads import available_cores

TABLES = ("mlc_churn", "diamonds", "concrete", "keel_phoneme")
ENSEMBLE = {"k": 16, "n_blocks": 2, "d_block": 128, "dropout": 0.1, "lr": 0.002, "weight_decay": 0.0003,
            "n_bins": 32, "d_embedding": 8, "batch_size": 256, "patience": 16}


def benchmark_file(folder: Path, args: argparse.Namespace) -> Path:
    """The benchmark file every run fits."""
    config = {
        "name": "workers_bench",
        "seeds": list(range(args.seeds)),
        "data": {"max_rows": args.rows, "missing": "impute", "split": {"seed": 0}},
        "datasets": list(TABLES[: args.tables]),
        "common": {"ensemble": {**ENSEMBLE, "max_epochs": args.epochs}},
        "models": {"lometab": {"kind": "ensemble", "params": {"adapter": "lometab", "rank": 4}},
                   "tabm": {"kind": "ensemble", "params": {"adapter": "rank1"}},
                   "xgboost": {"kind": "xgboost"}},
    }
    path = folder / "workers_bench.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def run(file: Path, out: Path, workers: int, threads: int | None) -> tuple[float, str, int]:
    """Wall seconds, the thread plan the run stated, and the cells it finished."""
    command = [sys.executable, "-m", "ripieno", "benchmark", "-c", str(file), "--out", str(out),
               "--workers", str(workers)]
    if threads is not None:
        command += ["--threads", str(threads)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"benchmark failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    first = done.stdout.splitlines()[0]
    cells = sum(line.startswith("ripieno: cell ") for line in done.stdout.splitlines())
    return seconds, first.rsplit("; ", 1)[-1], cells


def main() -> None:
    """Print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=4, choices=range(1, len(TABLES) + 1))
    parser.add_argument("--rows", type=int, default=700)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=2)
    args = parser.parse_args()
    cores = available_cores()
    runs = [("1 worker", 1, None), ("2 workers, threads shared", 2, None),
            (f"2 workers x {cores} threads (no plan)", 2, cores)]
    with tempfile.TemporaryDirectory(prefix="ripieno-bench-workers-") as folder:
        file = benchmark_file(Path(folder), args)
        print(f"ripieno benchmark, {args.tables} tables x 3 models x {args.seeds} seeds, {args.rows} rows,"
              f" ensembles capped at {args.epochs} epochs; {cores} cores")
        print(f"{'run':<36} {'threads':<62} {'seconds':>8} {'cells/hour':>11} {'vs 1 worker':>12}")
        base = None
        for index, (name, workers, threads) in enumerate(runs):
            seconds, plan, cells = run(file, Path(folder) / f"out{index}", workers, threads)
            rate = cells / seconds * 3600
            base = base or rate
            print(f"{name:<36} {plan:<62} {seconds:>8.1f} {rate:>11.0f} {rate / base:>11.2f}x")


if __name__ == "__main__":
    main()
