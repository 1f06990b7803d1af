r"""Sweep adapter rank and init scale: how much do they control ensemble diversity?

LoMETab's members differ only through their low-rank adapters ``A_k B_k^T`` (rank ``r``,
init scale ``sigma_init``; with ``adapter_init="plain"`` an entry of ``A_k B_k^T`` has std
``sqrt(r) * sigma_init**2`` at init, with ``rank_normalized`` std ``sigma_init`` for every
rank). This experiment trains one run of a recipe per ``(rank, sigma_init)`` cell of a
grid, for each ``--adapter_inits`` value and each ``--seeds`` value (same data in every
run), and records for each run the member diversity on the validation split before
training (``trainer.validate`` at init: the init draw sets it) and after training, the
validation task metric, the parameter count and the wall time.

Outputs under ``--out``: ``diversity_sweep.csv`` (one row per run: ``rank``,
``sigma_init``, ``adapter``, ``adapter_init``, ``seed``, metrics) and heatmaps (rank x
sigma_init, annotated, mean over seeds) of the main diversity metric at init and after
training (pairwise KL for classification, ambiguity for regression) and of each task
metric; with several ``--adapter_inits`` every heatmap name ends in ``_<adapter_init>``.

Example::

    python -m experiments.diversity_sweep \\
        --recipe tabular/lometab_churn --ranks 1 2 4 8 16 \\
        --sigmas 0.1 0.3 1.0 3.0 --adapter_inits plain rank_normalized \\
        --seeds 0 1 2 --max_epochs 5

``--recipe`` takes a shipped recipe's name or a path (default ``tabular/lometab_churn``);
``--out`` defaults to the repository's ``docs/results/diversity_sweep``, from any folder.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
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
    adapter_init: str | None = None,
) -> dict[str, Any]:
    """Validate at init, train, and validate again one ``(rank, sigma_init)`` cell.

    Args:
        config_text: the recipe prepared by ``runs.prepare_recipe``.
        rank: ``model.init_args.rank``.
        sigma_init: ``model.init_args.sigma_init``.
        max_epochs: training epochs (``None``: the recipe's).
        out: output folder (the runs' ``default_root_dir``).
        seed: ``seed_everything`` (``None``: the recipe's).
        overrides: extra ``--key=value`` overrides, applied last.
        adapter_init: ``model.init_args.adapter_init`` (``None``: the recipe's).

    Returns:
        The cell's CSV row: ``rank``, ``sigma_init``, ``adapter``, ``adapter_init``,
        ``seed``, ``init_<diversity>``, ``<diversity>`` (after training),
        ``init_val_<metric>``, ``val_<metric>``, ``best_*``, ``n_params``, ``epochs``,
        ``wall_time_s``.
    """
    start = time.perf_counter()
    args = [
        *run_overrides(max_epochs=max_epochs, root_dir=out, seed=seed),
        f"--model.init_args.rank={rank}",
        f"--model.init_args.sigma_init={sigma_init}",
    ]
    if adapter_init is not None:
        args.append(f"--model.init_args.adapter_init={adapter_init}")
    run = build_run(config_text, [*args, *overrides])
    family = run.task_family
    at_init = pick_metrics(run.validate(), family)
    run.fit()
    best = best_epoch_row(run.recorder.rows, family)
    final = pick_metrics(run.validate(), family)
    diversity, task = metric_columns(family)
    hparams = run.model.hparams
    row: dict[str, Any] = {
        "rank": rank, "sigma_init": sigma_init, "adapter": hparams.get("adapter", ""),
        "adapter_init": hparams.get("adapter_init", adapter_init or ""),
        "seed": seed if seed is not None else recipe_seed(config_text),
    }
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


def recipe_seed(config_text: str) -> int | None:
    """The ``seed_everything`` of a prepared recipe (``None`` if it sets none).

    Args:
        config_text: YAML from ``runs.prepare_recipe``.

    Returns:
        The seed.
    """
    seed = yaml.safe_load(config_text).get("seed_everything")
    return None if seed is None or isinstance(seed, bool) else int(seed)


def plot_heatmap(
    rows: Sequence[dict[str, Any]], column: str, path: Path, *, title: str
) -> Path:
    """Heatmap of one column over the grid: rank on the y axis, sigma_init on the x axis.

    Args:
        rows: sweep rows (with ``rank``, ``sigma_init`` and ``column``); several rows of
            one cell (seeds) are averaged.
        column: the value to show.
        path: output PNG.
        title: figure title.

    Returns:
        The PNG path.
    """
    ranks = sorted({int(r["rank"]) for r in rows})
    sigmas = sorted({float(r["sigma_init"]) for r in rows})
    grid = np.full((len(ranks), len(sigmas)), np.nan)
    cells: dict[tuple[int, float], list[float]] = {}
    for r in rows:
        cells.setdefault((int(r["rank"]), float(r["sigma_init"])), []).append(float(r[column]))
    for (rank, sigma), values in cells.items():
        grid[ranks.index(rank), sigmas.index(sigma)] = statistics.fmean(values)
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


def plot_all(rows: Sequence[dict[str, Any]], family: TaskFamily, out: Path, recipe: str,
             *, suffix: str = "") -> list[Path]:
    """Heatmaps of the main diversity metric (init, trained) and of each task metric.

    Args:
        rows: sweep rows (seeds are averaged per cell).
        family: ``classification`` or ``regression``.
        out: output folder.
        recipe: recipe name for titles.
        suffix: appended to every file name (e.g. ``_plain``) and title.

    Returns:
        The PNG paths.
    """
    diversity, task = metric_columns(family)
    main = diversity[0]
    epochs = rows[0]["epochs"]
    label = f"{recipe}{', ' + suffix.lstrip('_') if suffix else ''}"
    paths = [
        plot_heatmap(rows, f"init_{main}", out / f"heatmap_init_{main}{suffix}.png",
                     title=f"{main} at init ({label})"),
        plot_heatmap(rows, main, out / f"heatmap_final_{main}{suffix}.png",
                     title=f"{main} after {epochs} epochs ({label})"),
    ]
    paths.append(plot_heatmap(rows, f"best_{main}", out / f"heatmap_best_{main}{suffix}.png",
                              title=f"{main} at the best epoch ({label})"))
    for name in task:
        paths.append(plot_heatmap(rows, name, out / f"heatmap_{name}{suffix}.png",
                                  title=f"{name} after {epochs} epochs ({label})"))
        paths.append(plot_heatmap(rows, f"best_{name}", out / f"heatmap_best_{name}{suffix}.png",
                                  title=f"{name} at the best epoch ({label})"))
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
        description="Train a recipe over a grid of adapter ranks x sigma_init (for each "
        "adapter init and seed, same data per cell); write a CSV of diversity at init and "
        "after training, task metric, parameter count and wall time, plus heatmaps.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_run_arguments(parser, default_recipe=DEFAULT_RECIPE, default_out=results_dir("diversity_sweep"))
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4, 8, 16],
                        help="adapter ranks (model.init_args.rank)")
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.1, 0.3, 1.0, 3.0],
                        help="adapter init scales (model.init_args.sigma_init)")
    parser.add_argument("--adapter_inits", nargs="+", default=None,
                        help="adapter draws to sweep (model.init_args.adapter_init: plain or "
                        "rank_normalized for lometab, plain or relative for additive); "
                        "None = the recipe's")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="seed_everything values, one run per cell each; None = --seed")
    args = parser.parse_args(argv)
    if any(r < 1 for r in args.ranks):
        parser.error(f"--ranks must be positive, got {args.ranks}")
    if any(s < 0 for s in args.sigmas):
        parser.error(f"--sigmas must be >= 0, got {args.sigmas}")
    if args.seeds is not None and args.seed is not None:
        parser.error("give --seed or --seeds, not both")
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
    inits: list[str | None] = list(args.adapter_inits or [None])
    seeds: list[int | None] = list(args.seeds or [args.seed])
    grid = [(init, seed, r, s) for init in inits for seed in seeds
            for r in args.ranks for s in args.sigmas]
    sweep_start = time.perf_counter()
    with quiet_lightning():
        for i, (init, seed, rank, sigma) in enumerate(grid, 1):
            where = f"rank={rank}, sigma_init={sigma}"
            where += f", adapter_init={init}" if init is not None else ""
            where += f", seed={seed}" if args.seeds else ""
            try:
                row = run_cell(config_text, rank, sigma, max_epochs=args.max_epochs, out=out,
                               seed=seed, overrides=overrides, adapter_init=init)
            except Exception as err:
                raise RuntimeError(
                    f"diversity_sweep: cell {where} failed"
                    f" ({len(rows)} finished cells are in {csv_path})."
                ) from err
            rows.append(row)
            write_csv(csv_path, rows)
            main_metric = metric_columns(row["task_family"])[0][0]
            print(f"[{i}/{len(grid)}] {where}: "
                  f"{main_metric} {row[f'init_{main_metric}']:.4g} -> {row[main_metric]:.4g}"
                  f" ({row['wall_time_s']:.1f} s)", flush=True)
    family: TaskFamily = rows[0]["task_family"]
    pngs: list[Path] = []
    for init in inits:
        mine = [r for r in rows if init is None or r["adapter_init"] == init]
        suffix = f"_{init}" if len(inits) > 1 else ""
        pngs += plot_all(mine, family, out, Path(args.recipe).stem, suffix=suffix)
    diversity, task = metric_columns(family)
    columns = ["rank", "sigma_init", "adapter_init", "seed", *[f"init_{d}" for d in diversity],
               *diversity, *task,
               "best_epoch", *[f"best_{d}" for d in diversity], *[f"best_{t}" for t in task],
               "n_params", "wall_time_s"]
    print(format_table(rows, columns))
    print(f"diversity_sweep: {len(rows)} runs in {time.perf_counter() - sweep_start:.0f} s")
    for png in pngs:
        print(f"diversity_sweep: plot {png}")
    print(f"diversity_sweep: csv  {csv_path}")


if __name__ == "__main__":
    main()
