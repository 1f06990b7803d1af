r"""Member diversity over training: the recipe's adapter against another adapter.

Does the multiplicative LoMETab adapter (``W * (1 + A_k B_k^T)``) keep its members as
different as the additive ablation (``W + A_k B_k^T``) while they train? This experiment
trains the recipe's model and the same config with ``model.init_args.adapter`` replaced
(same rank, sigma_init, data and seed), validating before training and after every
epoch, and records the member diversity (``DiversityMonitor``) and the validation task
metric each time. Each variant may also fix its adapter's draw (``adapter_init``):
``--adapter_inits`` lists draws of the recipe's adapter, and a ``--compare`` entry may be
written ``ADAPTER:INIT`` (``additive:relative``); ``--seeds`` repeats every variant.

Outputs under ``--out``: ``diversity_over_training.csv`` (columns ``adapter``, then
``adapter_init`` when a draw was given, ``seed`` with ``--seeds``, ``epoch`` — training
epochs completed, 0 = at init —, ``step``, each diversity metric, each task metric) and
``diversity_over_training.png`` (diversity and task metric vs epoch, one line per variant,
mean over seeds).

Example::

    python -m experiments.diversity_over_training \\
        --recipe tabular/lometab_churn --adapter_inits plain rank_normalized \\
        --compare additive:plain additive:relative --rank 4 --sigma 0.3 \\
        --seeds 0 1 2 --max_epochs 20

``--recipe`` takes a shipped recipe's name or a path (default ``tabular/lometab_churn``);
``--out`` defaults to the repository's ``docs/results/diversity_over_training``, from any folder.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments.diversity_sweep import recipe_seed
from experiments.runs import (
    TaskFamily,
    add_run_arguments,
    build_run,
    check_run_arguments,
    format_table,
    metric_columns,
    normalize_overrides,
    pick_metrics,
    prepare_recipe,
    quiet_lightning,
    results_dir,
    run_overrides,
    write_csv,
)

DEFAULT_RECIPE = "tabular/lometab_churn"
CSV_NAME = "diversity_over_training.csv"
PNG_NAME = "diversity_over_training.png"


def train_variant(
    config_text: str,
    adapter: str | None,
    *,
    rank: int | None,
    sigma: float | None,
    max_epochs: int | None,
    out: Path,
    seed: int | None = None,
    overrides: Sequence[str] = (),
    adapter_init: str | None = None,
) -> tuple[str, TaskFamily, list[dict[str, Any]]]:
    """Train one adapter variant, validating at init and after every epoch.

    Args:
        config_text: the recipe prepared by ``runs.prepare_recipe``.
        adapter: ``model.init_args.adapter`` (``None``: the recipe's).
        rank: ``model.init_args.rank`` (``None``: the recipe's).
        sigma: ``model.init_args.sigma_init`` (``None``: the recipe's).
        max_epochs: training epochs (``None``: the recipe's).
        out: output folder (the run's ``default_root_dir``).
        seed: ``seed_everything`` (``None``: the recipe's).
        overrides: extra ``--key=value`` overrides, applied last.
        adapter_init: ``model.init_args.adapter_init`` (``None``: the recipe's, or the
            module's default when the recipe sets none).

    Returns:
        ``(adapter name, task family, rows)``, one row per validation with ``adapter``,
        ``adapter_init`` (as the model was built), ``seed``, ``epoch``, ``step`` and the
        metrics of ``runs.metric_columns``.
    """
    args = run_overrides(max_epochs=max_epochs, root_dir=out, seed=seed)
    if adapter is not None:
        args.append(f"--model.init_args.adapter={adapter}")
    if adapter_init is not None:
        args.append(f"--model.init_args.adapter_init={adapter_init}")
    if rank is not None:
        args.append(f"--model.init_args.rank={rank}")
    if sigma is not None:
        args.append(f"--model.init_args.sigma_init={sigma}")
    run = build_run(config_text, [*args, *overrides])
    name = str(run.model.hparams.get("adapter", adapter or "recipe"))
    init = str(run.model.hparams.get("adapter_init", adapter_init or ""))
    used_seed = seed if seed is not None else recipe_seed(config_text)
    family = run.task_family
    run.validate()
    run.fit()
    rows = [
        {"adapter": name, "adapter_init": init, "seed": used_seed, "epoch": int(r["epoch"]),
         "step": int(r["step"]), **pick_metrics(r, family)}
        for r in run.recorder.rows
    ]
    return name, family, rows


def variant_label(row: dict[str, Any]) -> str:
    """``adapter`` or ``adapter/adapter_init`` (when the row has an ``adapter_init``)."""
    init = row.get("adapter_init")
    return f"{row['adapter']}/{init}" if init else str(row["adapter"])


def parse_variant(spec: str) -> tuple[str, str | None]:
    """Split a ``--compare`` entry ``ADAPTER`` or ``ADAPTER:INIT``.

    Args:
        spec: e.g. ``additive`` or ``additive:relative``.

    Returns:
        ``(adapter, adapter_init or None)``.
    """
    adapter, _, init = spec.partition(":")
    return adapter, init or None


def plot_curves(rows: Sequence[dict[str, Any]], family: TaskFamily, path: Path, *,
                title: str) -> Path:
    """Diversity metrics and task metrics vs epoch, one line per variant (mean over seeds).

    Args:
        rows: CSV rows of all variants (see ``variant_label``).
        family: ``classification`` or ``regression``.
        path: output PNG.
        title: figure title.

    Returns:
        The PNG path.
    """
    diversity, task = metric_columns(family)
    columns = [*diversity, *task]
    n_cols = 2
    n_rows = math.ceil(len(columns) / n_cols)
    fig = Figure(figsize=(5.5 * n_cols, 3.6 * n_rows))
    FigureCanvasAgg(fig)
    axes = fig.subplots(n_rows, n_cols, squeeze=False).ravel()
    labels = list(dict.fromkeys(variant_label(r) for r in rows))
    for ax, column in zip(axes, columns, strict=False):
        values = []
        for label in labels:
            by_epoch: dict[int, list[float]] = {}
            for r in rows:
                if variant_label(r) == label:
                    by_epoch.setdefault(int(r["epoch"]), []).append(float(r[column]))
            epochs = sorted(by_epoch)
            means = [statistics.fmean(by_epoch[e]) for e in epochs]
            ax.plot(epochs, means, marker="o", markersize=3, label=label)
            values += means
        positive = [v for v in values if v > 0]
        if column in diversity and len(positive) == len(values) and max(values) > 20 * min(values):
            ax.set_yscale("log")
        ax.set_xlabel("epochs trained (0 = init)")
        ax.set_ylabel(column)
        ax.set_title(column if column in task else f"diversity: {column}")
        ax.grid(alpha=0.3)
        ax.legend()
    for ax in axes[len(columns):]:
        ax.set_visible(False)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def _check_new(label: str, names: Sequence[str]) -> None:
    if label in names:
        raise ValueError(f"Variant {label!r} is already in the comparison {list(names)}; --compare"
                         " needs adapters (or ADAPTER:INIT draws) other than the recipe's.")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see ``--help``).

    Args:
        argv: arguments without the program name (``None``: ``sys.argv[1:]``).

    Returns:
        The parsed arguments.
    """
    parser = argparse.ArgumentParser(
        prog="python -m experiments.diversity_over_training",
        description="Train a recipe and the same config with another adapter (same rank, "
        "sigma_init, data, seed); write per-epoch member diversity and validation task "
        "metric to a CSV and plot them.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_run_arguments(parser, default_recipe=DEFAULT_RECIPE,
                      default_out=results_dir("diversity_over_training"))
    parser.add_argument("--compare", nargs="+", default=["additive"],
                        help="adapter(s) to compare with the recipe's "
                        "(model.init_args.adapter: additive, lometab, rank1, shared, packed), "
                        "each optionally ADAPTER:INIT to fix its adapter_init (additive:relative)")
    parser.add_argument("--adapter_inits", nargs="+", default=None,
                        help="draws of the recipe's adapter to train, one variant each "
                        "(model.init_args.adapter_init: plain or rank_normalized for lometab, "
                        "plain or relative for additive); None = the recipe's")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="seed_everything values, every variant once per seed; None = --seed")
    parser.add_argument("--rank", type=int, default=None,
                        help="adapter rank for all variants; None = the recipe's")
    parser.add_argument("--sigma", type=float, default=None,
                        help="sigma_init for all variants; None = the recipe's")
    args = parser.parse_args(argv)
    if args.rank is not None and args.rank < 1:
        parser.error("--rank must be >= 1")
    if args.sigma is not None and args.sigma < 0:
        parser.error("--sigma must be >= 0")
    if args.seeds is not None and args.seed is not None:
        parser.error("give --seed or --seeds, not both")
    check_run_arguments(parser, args)
    return args


def main(argv: list[str] | None = None) -> None:
    """Train every variant, write the CSV and the plot, print a table and the paths.

    Args:
        argv: command-line arguments (``None``: ``sys.argv[1:]``).

    Raises:
        ValueError: if a compared variant repeats one already in the comparison.
        RuntimeError: if a variant fails to train.
    """
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    config_text = prepare_recipe(args.recipe)
    overrides = normalize_overrides(args.override)
    common: dict[str, Any] = {"rank": args.rank, "sigma": args.sigma,
                              "max_epochs": args.max_epochs, "out": out, "overrides": overrides}
    variants: list[tuple[str | None, str | None]] = [
        (None, init) for init in (args.adapter_inits or [None])]
    variants += [parse_variant(spec) for spec in args.compare]
    with_init = any(init is not None for _, init in variants)
    seeds: list[int | None] = list(args.seeds or [args.seed])
    rows: list[dict[str, Any]] = []
    names: list[str] = []
    family: TaskFamily = "classification"
    with quiet_lightning():
        for adapter, init in variants:
            start = time.perf_counter()
            label = ""
            if adapter is not None and (init is not None or not with_init):
                _check_new(f"{adapter}/{init}" if init is not None else adapter, names)
            for j, seed in enumerate(seeds):
                try:
                    name, family, variant_rows = train_variant(
                        config_text, adapter, adapter_init=init, seed=seed, **common)
                except Exception as err:
                    raise RuntimeError(
                        f"diversity_over_training: variant adapter={adapter or '(recipe)'}"
                        f"{f', adapter_init={init}' if init else ''} failed."
                    ) from err
                label = variant_label(variant_rows[0]) if with_init else name
                if j == 0:
                    _check_new(label, names)
                for row in variant_rows:
                    if not with_init:
                        del row["adapter_init"]
                    if args.seeds is None:
                        del row["seed"]
                rows += variant_rows
            names.append(label)
            print(f"diversity_over_training: {label}: {len(variant_rows) - 1} epochs x"
                  f" {len(seeds)} seed(s) in {time.perf_counter() - start:.1f} s", flush=True)
    csv_path = write_csv(out / CSV_NAME, rows)
    diversity, task = metric_columns(family)
    png = plot_curves(rows, family, out / PNG_NAME,
                      title=f"{Path(args.recipe).stem}: {' vs '.join(names)}")
    keys = [k for k in ("adapter", "adapter_init", "seed") if k in rows[0]]
    print(format_table(rows, [*keys, "epoch", "step", *diversity, *task]))
    print(f"diversity_over_training: plot {png}")
    print(f"diversity_over_training: csv  {csv_path}")


if __name__ == "__main__":
    main()
