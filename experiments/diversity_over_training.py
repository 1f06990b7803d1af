r"""Member diversity over training: the recipe's adapter against another adapter.

Does the multiplicative LoMETab adapter (``W * (1 + A_k B_k^T)``) keep its members as
different as the additive ablation (``W + A_k B_k^T``) while they train? This experiment
trains the recipe's model and the same config with ``model.init_args.adapter`` replaced
(same rank, sigma_init, data and seed), validating before training and after every
epoch, and records the member diversity (``DiversityMonitor``) and the validation task
metric each time.

Outputs under ``--out``: ``diversity_over_training.csv`` (columns ``adapter``, ``epoch``
— training epochs completed, 0 = at init —, ``step``, each diversity metric, each task
metric) and ``diversity_over_training.png`` (diversity and task metric vs epoch, one
line per adapter).

Example::

    python -m experiments.diversity_over_training \\
        --recipe tabular/lometab_churn --compare additive --rank 4 \\
        --sigma 0.3 --max_epochs 20

``--recipe`` takes a shipped recipe's name or a path (default ``tabular/lometab_churn``);
``--out`` defaults to the repository's ``docs/results/diversity_over_training``, from any folder.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

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

    Returns:
        ``(adapter name, task family, rows)``, one row per validation with ``adapter``,
        ``epoch``, ``step`` and the metrics of ``runs.metric_columns``.
    """
    args = run_overrides(max_epochs=max_epochs, root_dir=out, seed=seed)
    if adapter is not None:
        args.append(f"--model.init_args.adapter={adapter}")
    if rank is not None:
        args.append(f"--model.init_args.rank={rank}")
    if sigma is not None:
        args.append(f"--model.init_args.sigma_init={sigma}")
    run = build_run(config_text, [*args, *overrides])
    name = str(run.model.hparams.get("adapter", adapter or "recipe"))
    family = run.task_family
    run.validate()
    run.fit()
    rows = [
        {"adapter": name, "epoch": int(r["epoch"]), "step": int(r["step"]),
         **pick_metrics(r, family)}
        for r in run.recorder.rows
    ]
    return name, family, rows


def plot_curves(rows: Sequence[dict[str, Any]], family: TaskFamily, path: Path, *,
                title: str) -> Path:
    """Diversity metrics and task metrics vs epoch, one line per adapter.

    Args:
        rows: CSV rows of all adapters.
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
    adapters = list(dict.fromkeys(r["adapter"] for r in rows))
    for ax, column in zip(axes, columns, strict=False):
        values = []
        for adapter in adapters:
            mine = [r for r in rows if r["adapter"] == adapter]
            ax.plot([r["epoch"] for r in mine], [r[column] for r in mine], marker="o",
                    markersize=3, label=adapter)
            values += [r[column] for r in mine]
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
                        "(model.init_args.adapter: additive, lometab, rank1, shared, packed)")
    parser.add_argument("--rank", type=int, default=None,
                        help="adapter rank for all variants; None = the recipe's")
    parser.add_argument("--sigma", type=float, default=None,
                        help="sigma_init for all variants; None = the recipe's")
    args = parser.parse_args(argv)
    if args.rank is not None and args.rank < 1:
        parser.error("--rank must be >= 1")
    if args.sigma is not None and args.sigma < 0:
        parser.error("--sigma must be >= 0")
    check_run_arguments(parser, args)
    return args


def main(argv: list[str] | None = None) -> None:
    """Train every variant, write the CSV and the plot, print a table and the paths.

    Args:
        argv: command-line arguments (``None``: ``sys.argv[1:]``).

    Raises:
        ValueError: if a compared adapter equals the recipe's (nothing to compare).
        RuntimeError: if a variant fails to train.
    """
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    config_text = prepare_recipe(args.recipe)
    overrides = normalize_overrides(args.override)
    common: dict[str, Any] = {"rank": args.rank, "sigma": args.sigma,
                              "max_epochs": args.max_epochs, "out": out, "seed": args.seed,
                              "overrides": overrides}
    rows: list[dict[str, Any]] = []
    names: list[str] = []
    family: TaskFamily = "classification"
    with quiet_lightning():
        for adapter in [None, *args.compare]:
            if adapter is not None and adapter in names:
                raise ValueError(f"Adapter {adapter!r} is already in the comparison {names};"
                                 " --compare needs adapters other than the recipe's.")
            start = time.perf_counter()
            try:
                name, family, variant_rows = train_variant(config_text, adapter, **common)
            except Exception as err:
                raise RuntimeError(
                    f"diversity_over_training: variant adapter={adapter or '(recipe)'} failed."
                ) from err
            names.append(name)
            rows += variant_rows
            print(f"diversity_over_training: {name}: {len(variant_rows) - 1} epochs in"
                  f" {time.perf_counter() - start:.1f} s", flush=True)
    csv_path = write_csv(out / CSV_NAME, rows)
    diversity, task = metric_columns(family)
    png = plot_curves(rows, family, out / PNG_NAME,
                      title=f"{Path(args.recipe).stem}: {' vs '.join(names)}")
    print(format_table(rows, ["adapter", "epoch", "step", *diversity, *task]))
    print(f"diversity_over_training: plot {png}")
    print(f"diversity_over_training: csv  {csv_path}")


if __name__ == "__main__":
    main()
