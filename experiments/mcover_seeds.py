r"""Test-error distributions over seeds: M-cover routing against its baselines.

Every variant is one shipped ``mcover/`` recipe plus overrides, run as ``ripieno fit``
would (checkpoint on the recipe's validation monitor, best checkpoint tested) for each
seed. The ring-kernel variants span several ``sigma``; the reported "M-cover (best
sigma)" picks the ``sigma`` with the best mean *validation* monitor over seeds, never
the test split. Outputs: ``runs.csv`` (one row per variant and seed), ``summary.md``
(mean ± std of the test errors per variant) and ``test_error.png`` (per-seed test errors).

``--out`` defaults to the repository's ``docs/results/mcover_<family>``
(``mcover_mlp_mnist5k``, ``mcover_committee_fashion_mnist``), from any folder.

Example::

    python -m experiments.mcover_seeds --family mlp --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments.recipe_table import markdown_table, run_recipe
from experiments.runs import normalize_overrides, quiet_lightning, resolve_recipe, results_dir

#: family -> (base recipe of the routed model, baselines: label -> (recipe, overrides)),
#: recipes as shipped names; ``out`` is the default output folder under ``docs/results``.
FAMILIES: dict[str, dict[str, Any]] = {
    "mlp": {
        "out": "mcover_mlp_mnist5k",
        "routed": "mcover/mlp_ring_mnist5k",
        "baselines": {
            "M=1 (plain SGD)": ("mcover/mlp_plain_sgd_mnist5k", []),
            "independent (diagonal Q)": ("mcover/mlp_independent_mnist5k", []),
            "replicated SGD": ("mcover/mlp_replicated_sgd_mnist5k", []),
            "EASGD": ("mcover/mlp_easgd_mnist5k", []),
        },
    },
    "committee": {
        "out": "mcover_committee_fashion_mnist",
        "routed": "mcover/committee_ring_fashion_mnist",
        "baselines": {
            "M=1 (plain SGD)": ("mcover/committee_plain_sgd_fashion_mnist", []),
            "independent (diagonal Q)": ("mcover/committee_ring_fashion_mnist",
                                         ["--model.init_args.kernel=diagonal"]),
            "replicated SGD": ("mcover/committee_replicated_sgd_fashion_mnist", []),
        },
    },
}


def variants(family: str, sigmas: Sequence[float]) -> dict[str, tuple[str, list[str]]]:
    """``label -> (recipe, overrides)`` for the ring kernel at each sigma, then the baselines."""
    spec = FAMILIES[family]
    out = {f"M-cover ring sigma={s:g}": (spec["routed"], [f"--model.init_args.sigma={s}"]) for s in sigmas}
    out.update(spec["baselines"])
    return out


def summarise(frame: pd.DataFrame) -> tuple[list[dict[str, Any]], str]:
    """Mean ± std of test errors per variant; the best ring sigma chosen on validation."""
    frame = frame.assign(collapsed_error=1 - frame["test/collapsed_accuracy"],
                         average_error=1 - frame["test/accuracy"],
                         copy_error=1 - frame["test/copy_accuracy"])
    ring = frame[frame["variant"].str.startswith("M-cover ring")]
    best = ring.groupby("variant")["val_monitor"].mean().idxmax() if len(ring) else None
    def spread(values: pd.Series) -> str:
        return f"{values.mean():.4f} ± {values.std():.4f}"

    rows = []
    for variant, group in frame.groupby("variant", sort=False):
        rows.append({
            "variant": variant + (" (best on validation)" if variant == best else ""),
            "seeds": len(group),
            "val_monitor": group["val_monitor"].mean(),
            "collapsed_error": spread(group["collapsed_error"]),
            "copy_average_error": spread(group["average_error"]),
            "single_copy_error": spread(group["copy_error"]),
            "seconds_per_run": group["wall_time_s"].mean(),
        })
    return rows, str(best)


def plot(frame: pd.DataFrame, path: Path, title: str) -> None:
    """Per-seed collapsed and copy-average test errors per variant (strip plot)."""
    labels = list(dict.fromkeys(frame["variant"]))
    figure = Figure(figsize=(9, 0.5 * len(labels) + 1.5))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    for i, label in enumerate(labels):
        group = frame[frame["variant"] == label]
        ax.scatter(1 - group["test/collapsed_accuracy"], [i + 0.1] * len(group), color="C0", marker="o",
                   label="collapsed" if i == 0 else None)
        ax.scatter(1 - group["test/accuracy"], [i - 0.1] * len(group), color="C1", marker="x",
                   label="copy average" if i == 0 else None)
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("test error")
    ax.set_title(title)
    ax.legend(loc="best")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see ``--help``); ``--out`` defaults per ``--family``.

    Args:
        argv: arguments without the program name (``None``: ``sys.argv[1:]``).

    Returns:
        The parsed arguments; every recipe of the family is known to exist.
    """
    parser = argparse.ArgumentParser(prog="python -m experiments.mcover_seeds",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(FAMILIES), default="mlp")
    parser.add_argument("--sigmas", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder; default: docs/results/mcover_<family> in the repository")
    parser.add_argument("--override", action="append", default=[],
                        help="extra --key=value override for every run (repeatable)")
    parser.add_argument("--from-csv", action="store_true",
                        help="only rebuild summary.md and test_error.png from OUT/runs.csv")
    args = parser.parse_args(argv)
    if len(args.seeds) < 1:
        parser.error("--seeds needs at least one seed")
    if args.out is None:
        args.out = results_dir(FAMILIES[args.family]["out"])
    for recipe, _ in variants(args.family, args.sigmas).values():
        resolve_recipe(parser, recipe)  # fail before any run when one does not exist
    return args


def main(argv: list[str] | None = None) -> None:
    """Run every variant for every seed; write ``runs.csv``, ``summary.md``, ``test_error.png``.

    Args:
        argv: command-line arguments (``None``: ``sys.argv[1:]``).
    """
    args = parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    extra = normalize_overrides(args.override)
    if args.from_csv:
        write_outputs(pd.read_csv(out / "runs.csv"), out, args.family, args.seeds, extra)
        return
    rows = []
    with quiet_lightning():
        for label, (recipe, overrides) in variants(args.family, args.sigmas).items():
            for seed in args.seeds:
                row = run_recipe(recipe, seed, out / "runs" / label.replace(" ", "_").replace("=", ""),
                                 [*overrides, *extra])
                rows.append({"variant": label, **row})
                print(f"{label:32s} seed {seed}: collapsed {row['test/collapsed_accuracy']:.4f}"
                      f" average {row['test/accuracy']:.4f} ({row['wall_time_s']} s)", flush=True)
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "runs.csv", index=False)
    write_outputs(frame, out, args.family, args.seeds, extra)


def write_outputs(frame: pd.DataFrame, out: Path, family: str, seeds: Sequence[int],
                  extra: list[str]) -> None:
    """``summary.md`` and ``test_error.png`` from the per-run rows."""
    table, best = summarise(frame)
    (out / "summary.md").write_text(
        f"Family `{family}`, seeds {list(seeds)}, overrides {extra or 'none'}. Errors are test errors of\n"
        "the collapsed predictor (mean weights; EASGD: its centre), the copy average (mean of the\n"
        "copies' probabilities) and a single copy (mean over copies of each copy's own error).\n"
        f"Best ring sigma by mean validation monitor: {best}.\n\n" + markdown_table(table) + "\n")
    plot(frame, out / "test_error.png", f"{family}: test error over seeds {list(seeds)}")
    print(markdown_table(table))


if __name__ == "__main__":
    main()
