"""Where the time of one small benchmark fit goes: compute, validation, checkpoints, logging, set-up.

What is measured
    ``EnsembleClassifier`` (the benchmark's ``kind: ensemble`` model) with the CPU protocol's
    ensemble settings (``recipes/benchmarks/tabular_cpu.yaml``: K=16, 2 blocks of 128, PLE with
    32 bins, batch 256) fitted for exactly ``--epochs`` epochs (early stopping's patience above
    the epochs) on synthetic 8-feature binary tables of 700 and 3,600 rows, each fit ``--repeats``
    times (the median fit is shown). Lightning's ``SimpleProfiler`` records every action of the
    fit; the module's ``log`` calls are timed apart. The fit's time is split into

    * compute: the training batches (forward, loss, backward, optimiser step; Lightning's
      ``run_training_batch``), less the logging done inside them;
    * validation: the validation steps and the module's validation hooks (metrics), less their logging;
    * checkpoints: ``save_checkpoint`` and the checkpoint callback's hooks;
    * logging: the module's ``self.log`` calls;
    * data: fetching batches and moving them (train and validation);
    * set-up and the rest: everything outside the epochs (preprocessing the table, building the
      Trainer, loading the best weights back) and what the epochs spend between those actions.

    The non-compute share is ``1 - compute / fit``; the target is under 20% on the 700-row table.

Run: ``python bench/fit_cost.py`` (``make bench`` runs it with the others).
"""


from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from lightning.pytorch.profilers import SimpleProfiler

from ripieno.framework.methods.estimators import EnsembleClassifier
from ripieno.framework.methods.tabular_ensemble import TabularEnsembleModule

#: The CPU protocol's ensemble (recipes/benchmarks/tabular_cpu.yaml), TabM's adapter.
SETTINGS = {"adapter": "rank1", "k": 16, "n_blocks": 2, "d_block": 128, "dropout": 0.1, "lr": 0.002,
            "weight_decay": 0.0003, "n_bins": 32, "d_embedding": 8, "batch_size": 256}
CATEGORIES = ("compute", "validation", "checkpoints", "logging", "data", "set-up and the rest")


def table(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` rows of 8 numeric features and a binary target that depends on three of them."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 8))
    y = (x[:, 0] + 0.5 * x[:, 1] * x[:, 2] + 0.5 * rng.normal(size=rows) > 0).astype(int)
    return x, y


@contextmanager
def timed_logging(spent: dict[str, float]) -> Iterator[None]:
    """The module's ``log`` calls timed into ``spent["training"]`` or ``spent["validation"]``."""
    original = TabularEnsembleModule.log

    def log(self: TabularEnsembleModule, *args: object, **kwargs: object) -> None:
        start = time.perf_counter()
        try:
            original(self, *args, **kwargs)
        finally:
            spent["training" if self.trainer.training else "validation"] += time.perf_counter() - start

    TabularEnsembleModule.log = log  # type: ignore[method-assign]
    try:
        yield
    finally:
        TabularEnsembleModule.log = original  # type: ignore[method-assign]


def split(rows: int, epochs: int) -> dict[str, float]:
    """One fit's seconds by category (module docstring), with ``fit`` the whole."""
    x, y = table(rows)
    profiler = SimpleProfiler()
    logged = {"training": 0.0, "validation": 0.0}
    model = EnsembleClassifier(**SETTINGS, max_epochs=epochs, patience=epochs + 1,
                               trainer_kwargs={"profiler": profiler})
    with timed_logging(logged):
        start = time.perf_counter()
        model.fit(x, y)
        total = time.perf_counter() - start
    if model.n_epochs_ != epochs:
        raise SystemExit(f"the fit ran {model.n_epochs_} epochs, not {epochs}")
    spans = {name: sum(values) for name, values in profiler.recorded_durations.items()}

    def sum_of(*parts: str) -> float:
        return sum(v for name, v in spans.items() if any(part in name for part in parts))

    found = {
        "compute": sum_of("run_training_batch") - logged["training"],
        "validation": sum_of("validation_step", "on_validation_epoch_end", "on_validation_epoch_start")
        - logged["validation"],
        "checkpoints": sum_of("save_checkpoint", "ModelCheckpoint", "BestWeights"),
        "logging": logged["training"] + logged["validation"],
        "data": sum_of("train_dataloader_next", "val_next", "batch_to_device"),
    }
    found["set-up and the rest"] = total - sum(found.values())
    found["fit"] = total
    return found


def main() -> None:
    """Print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[700, 3600])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    split(200, 2)  # warm-up: imports, first allocations
    print(f"EnsembleClassifier (TabM, the CPU protocol's sizes: K=16, 2 x 128, batch 256), {args.epochs}"
          f" epochs exactly, 8 features; median of {args.repeats} fits; seconds and share of the fit")
    header = " ".join(f"{name:>20}" for name in CATEGORIES)
    print(f"{'rows':>6} {'fit s':>7} {header} {'non-compute':>12}")
    for rows in args.rows:
        fits = [split(rows, args.epochs) for _ in range(args.repeats)]
        middle = sorted(fits, key=lambda f: f["fit"])[len(fits) // 2]
        cells = [f"{middle[name]:6.2f} ({middle[name] / middle['fit']:4.0%})" for name in CATEGORIES]
        share = 1 - middle["compute"] / middle["fit"]
        print(f"{rows:>6} {middle['fit']:>7.2f} " + " ".join(f"{c:>20}" for c in cells) + f" {share:>12.0%}")


if __name__ == "__main__":
    main()
