"""What a ``ripieno tune`` trial costs over a plain ``ripieno fit`` of the same configuration.

What is measured
    ``tabular/lometab_churn`` (5,000 rows; ``--epochs`` epochs, default 3) with one fixed
    configuration, in this process, side by side and interleaved over ``--rounds`` rounds:

    * ``plain fit``: ``ripieno fit`` of the recipe (the command's ``main``, in process; it
      prepares the table every run);
    * ``trial``: one trial of a study whose search space has that configuration as its only
      value (a categorical of one choice per key), run by the worker loop: Optuna's storage
      (SQLite), the pruning callback, the progress line. The worker keeps its prepared table
      across trials (``DataCache``), so its first trial prepares it and later ones reuse it.

    The trial's seconds are its Optuna duration (from the moment the worker asks for it to
    the moment its value is stored: drawing values, the run, the attributes written to the
    storage). The bench also shows the wall clock of the ``run_worker`` call that ran it,
    which a real worker pays once, not per trial (opening the study, checking its space).
    Medians over the rounds; the first round of each is a warm-up and is left out.

Run
    ``.venv/bin/python bench/tune_overhead.py`` (about 2 minutes on 2 CPU cores).

The last line states whether a trial stays within 5% of a plain fit (issue 22's target).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
from pathlib import Path

import optuna

from ripieno.framework.cli.main import main as ripieno
from ripieno.framework.tuning.space import SearchSpace
from ripieno.framework.tuning.study import quiet_optuna
from ripieno.framework.tuning.study_storage import open_storage
from ripieno.framework.tuning.trial_run import DataCache
from ripieno.framework.tuning.worker import TuneSetup, run_worker

RECIPE = "tabular/lometab_churn"
FIXED = {"model.init_args.rank": 4, "model.init_args.sigma_init": 3.0, "model.init_args.lr": 0.002}


def main() -> None:
    """Print the timing table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ripieno-tune-bench-"))
    common = [f"--trainer.max_epochs={args.epochs}", "--trainer.enable_progress_bar=false"]
    from ripieno.framework.runner.recipes import find_recipe

    fit_args = ["-c", str(find_recipe(RECIPE)), *common]
    space = SearchSpace.from_dict(
        {"params": {k: {"type": "categorical", "choices": [v]} for k, v in FIXED.items()}}
    )
    overrides = [f"--{k}={v}" for k, v in FIXED.items()]
    cache = DataCache()
    plain, trial, worker = [], [], []
    storage = open_storage(f"sqlite:///{root / 'study.db'}", heartbeat=30)
    for index in range(args.rounds):
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            ripieno(
                [
                    "fit",
                    *fit_args,
                    *overrides,
                    "--test_after_fit=false",
                    f"--trainer.default_root_dir={root / 'plain' / str(index)}",
                ]
            )
        plain.append(time.perf_counter() - started)
        setup = TuneSetup(
            fit_args=fit_args,
            space=space,
            study_name="bench",
            storage=f"sqlite:///{root / 'study.db'}",
            study_dir=root / "study",
            n_trials=index + 1,
            monitor="val/nll",
            direction="minimize",
            seed=0,
            pruner="median",
        )
        started = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()), quiet_optuna():
            run_worker(setup, storage=storage, cache=cache)
        worker.append(time.perf_counter() - started)
        last = optuna.load_study(study_name="bench", storage=storage).trials[-1]
        trial.append(last.duration.total_seconds())
        print(
            f"round {index}: plain fit {plain[-1]:.2f} s, trial {trial[-1]:.2f} s"
            f" (run_worker call {worker[-1]:.2f} s)",
            flush=True,
        )
    plain_s, trial_s = statistics.median(plain[1:]), statistics.median(trial[1:])
    ratio = trial_s / plain_s
    print()
    print(f"| {RECIPE}, {args.epochs} epochs, median of {args.rounds - 1} rounds | seconds | ratio |")
    print("|---|---:|---:|")
    print(f"| plain `ripieno fit` (in process) | {plain_s:.2f} | 1.00 |")
    print(f"| `ripieno tune` trial (worker keeps its prepared table) | {trial_s:.2f} | {ratio:.2f} |")
    call = statistics.median(worker[1:])
    print(
        f"| the worker's whole call for that trial (opens and checks the study) | {call:.2f} |"
        f" {call / plain_s:.2f} |"
    )
    print(
        f"| first trial of a worker (prepares the table) | {trial[0]:.2f} |"
        f" {trial[0] / plain[0]:.2f} (vs first fit) |"
    )
    print()
    print(f"trial / plain fit = {ratio:.3f}: {'within' if ratio <= 1.05 else 'OVER'} the 5% target")


if __name__ == "__main__":
    main()
