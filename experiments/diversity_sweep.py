r"""Sweep adapter rank and init scale: how much do they control ensemble diversity?

LoMETab's members differ only through their low-rank adapters ``A_k B_k^T`` (rank ``r``,
entries of ``A_k B_k^T`` with std ``sigma_init`` at init). This experiment trains one
run of a recipe per ``(rank, sigma_init)`` cell of a grid, all with the same seed and
data, and records for each cell the member diversity on the validation split before
training (``trainer.validate`` at init: ``sigma_init`` should set it) and after
training, the validation task metric, the parameter count and the wall time.

Outputs under ``--out``: ``diversity_sweep.csv`` (one row per cell) and heatmaps
(rank x sigma_init, annotated) of the main diversity metric at init and after training
(pairwise KL for classification, ambiguity for regression) and of each task metric.

Example::

    python -m experiments.diversity_sweep \\
        --recipe tabular/lometab_churn --ranks 1 2 4 8 16 \\
        --sigmas 0.1 0.3 1.0 3.0 --max_epochs 5

``--recipe`` takes a shipped recipe's name or a path (default ``tabular/lometab_churn``);
``--out`` defaults to the repository's ``docs/results/diversity_sweep``, from any folder.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments.runs import (
    TaskFamily,
    add_run_arguments,
    best_epoch_row,
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
CSV_NAME = "diversity_sweep.csv"


def run_cell(
    config_text: str,
    rank: int,
    sigma_init: float,
    *,
    max_epochs: int | None,
    out: Path,
    seed: int | None = None,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Validate at init, train, and validate again one ``(rank, sigma_init)`` cell.

    Args:
        config_text: the recipe prepared by ``runs.prepare_recipe``.
        rank: ``model.init_args.rank``.
        sigma_init: ``model.init_args.sigma_init``.
        max_epochs: training epochs (``None``: the recipe's).
        out: output folder (the runs' ``default_root_dir``).
        seed: ``seed_everything`` (``None``: the recipe's), the same for every cell.
        overrides: extra ``--key=value`` overrides, applied last.

    Returns:
        The cell's CSV row: ``rank``, ``sigma_init``, ``init_<diversity>``, ``<diversity>``
        (after training), ``init_val_<metric>``, ``val_<metric>``, ``n_params``,
        ``epochs``, ``wall_time_s``.
    """
    start = time.perf_counter()
    args = [
        *run_overrides(max_epochs=max_epochs, root_dir=out, seed=seed),
        f"--model.init_args.rank={rank}",
        f"--model.init_args.sigma_init={sigma_init}",
        *overrides,
    ]
    run = build_run(config_text, args)
    family = run.task_family
    at_init = pick_metrics(run.validate(), family)
    run.fit()
    best = best_epoch_row(run.recorder.rows, family)
    final = pick_metrics(run.validate(), family)
    diversity, task = metric_columns(family)
    row: dict[str, Any] = {"rank": rank, "sigma_init": sigma_init}
    row.update({f"init_{name}": at_init[name] for name in diversity})
    row.update({name: final[name] for name in diversity})
    row.update({f"init_{name}": at_init[name] for name in task})
    row.update({name: final[name] for name in task})
    row["best_epoch"] = int(best["epoch"])
    row.update({f"best_{name}": value for name, value in pick_metrics(best, family).items()})
    row["n_params"] = run.n_parameters
    row["epochs"] = run.trainer.current_epoch
    row["wall_time_s"] = round(time.perf_counter() - start, 2)
    row["task_family"] = family
    return row


def plot_heatmap(
    rows: Sequence[dict[str, Any]], column: str, path: Path, *, title: str
) -> Path:
    """Heatmap of one column over the grid: rank on the y axis, sigma_init on the x axis.

    Args:
        rows: sweep rows (with ``rank``, ``sigma_init`` and ``column``).
        column: the value to show.
        path: output PNG.
        title: figure title.

    Returns:
        The PNG path.
    """
    ranks = sorted({int(r["rank"]) for r in rows})
    sigmas = sorted({float(r["sigma_init"]) for r in rows})
    grid = np.full((len(ranks), len(sigmas)), np.nan)
    for r in rows:
        grid[ranks.index(int(r["rank"])), sigmas.index(float(r["sigma_init"]))] = r[column]
    fig = Figure(figsize=(1.4 * len(sigmas) + 2.2, 0.7 * len(ranks) + 1.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    fig.colorbar(image, ax=ax, label=column)
    ax.set_xticks(range(len(sigmas)), [f"{s:g}" for s in sigmas])
    ax.set_yticks(range(len(ranks)), [str(r) for r in ranks])
    ax.set_xlabel("sigma_init")
    ax.set_ylabel("rank")
    ax.set_title(title)
    finite = grid[np.isfinite(grid)]
    middle = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for i in range(len(ranks)):
        for j in range(len(sigmas)):
            value = grid[i, j]
            if np.isfinite(value):
                ax.text(j, i, f"{value:.3g}", ha="center", va="center", fontsize=8,
                        color="black" if value > middle else "white")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


def plot_all(rows: Sequence[dict[str, Any]], family: TaskFamily, out: Path, recipe: str) -> list[Path]:
    """Heatmaps of the main diversity metric (init, trained) and of each task metric.

    Args:
        rows: sweep rows.
        family: ``classification`` or ``regression``.
        out: output folder.
        recipe: recipe name for titles.

    Returns:
        The PNG paths.
    """
    diversity, task = metric_columns(family)
    main = diversity[0]
    epochs = rows[0]["epochs"]
    paths = [
        plot_heatmap(rows, f"init_{main}", out / f"heatmap_init_{main}.png",
                     title=f"{main} at init ({recipe})"),
        plot_heatmap(rows, main, out / f"heatmap_final_{main}.png",
                     title=f"{main} after {epochs} epochs ({recipe})"),
    ]
    paths.append(plot_heatmap(rows, f"best_{main}", out / f"heatmap_best_{main}.png",
                              title=f"{main} at the best epoch ({recipe})"))
    for name in task:
        paths.append(plot_heatmap(rows, name, out / f"heatmap_{name}.png",
                                  title=f"{name} after {epochs} epochs ({recipe})"))
        paths.append(plot_heatmap(rows, f"best_{name}", out / f"heatmap_best_{name}.png",
                                  title=f"{name} at the best epoch ({recipe})"))
    return paths


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see ``--help``).

    Args:
        argv: arguments without the program name (``None``: ``sys.argv[1:]``).

    Returns:
        The parsed arguments.
    """
    parser = argparse.ArgumentParser(
        prog="python -m experiments.diversity_sweep",
        description="Train a recipe over a grid of adapter ranks x sigma_init (same seed and "
        "data per cell); write a CSV of diversity at init and after training, task metric, "
        "parameter count and wall time, plus heatmaps.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_run_arguments(parser, default_recipe=DEFAULT_RECIPE, default_out=results_dir("diversity_sweep"))
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                        help="adapter ranks (model.init_args.rank)")
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0],
                        help="adapter init scales (model.init_args.sigma_init)")
    args = parser.parse_args(argv)
    if any(r < 1 for r in args.ranks):
        parser.error(f"--ranks must be positive, got {args.ranks}")
    if any(s < 0 for s in args.sigmas):
        parser.error(f"--sigmas must be >= 0, got {args.sigmas}")
    check_run_arguments(parser, args)
    return args


def main(argv: list[str] | None = None) -> None:
    """Run the sweep, write the CSV and heatmaps, print the CSV path and a table.

    Args:
        argv: command-line arguments (``None``: ``sys.argv[1:]``).

    Raises:
        RuntimeError: if a cell fails (the rows finished so far are in the CSV).
    """
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    config_text = prepare_recipe(args.recipe)
    overrides = normalize_overrides(args.override)
    csv_path = out / CSV_NAME
    rows: list[dict[str, Any]] = []
    grid = [(r, s) for r in args.ranks for s in args.sigmas]
    sweep_start = time.perf_counter()
    with quiet_lightning():
        for i, (rank, sigma) in enumerate(grid, 1):
            try:
                row = run_cell(config_text, rank, sigma, max_epochs=args.max_epochs, out=out,
                               seed=args.seed, overrides=overrides)
            except Exception as err:
                raise RuntimeError(
                    f"diversity_sweep: cell rank={rank}, sigma_init={sigma} failed"
                    f" ({len(rows)} finished cells are in {csv_path})."
                ) from err
            rows.append(row)
            write_csv(csv_path, rows)
            main_metric = metric_columns(row["task_family"])[0][0]
            print(f"[{i}/{len(grid)}] rank={rank} sigma_init={sigma:g}: "
                  f"{main_metric} {row[f'init_{main_metric}']:.4g} -> {row[main_metric]:.4g}"
                  f" ({row['wall_time_s']:.1f} s)", flush=True)
    family: TaskFamily = rows[0]["task_family"]
    pngs = plot_all(rows, family, out, Path(args.recipe).stem)
    diversity, task = metric_columns(family)
    columns = ["rank", "sigma_init", *[f"init_{d}" for d in diversity], *diversity, *task,
               "best_epoch", *[f"best_{d}" for d in diversity], *[f"best_{t}" for t in task],
               "n_params", "wall_time_s"]
    print(format_table(rows, columns))
    print(f"diversity_sweep: {len(rows)} cells in {time.perf_counter() - sweep_start:.0f} s")
    for png in pngs:
        print(f"diversity_sweep: plot {png}")
    print(f"diversity_sweep: csv  {csv_path}")


if __name__ == "__main__":
    main()
