r"""Test-error distributions over seeds: M-cover routing against its baselines, per collapse rule.

Every variant is one shipped ``mcover/`` recipe plus overrides, built as ``ripieno fit``
would build it, trained once per seed. The recipe's own checkpoint is replaced by one
``ModelCheckpoint`` per collapse rule (``mean_weights``, ``best_copy``, ``copy_average``;
``ripieno.framework.mcover.collapse``), each monitoring that rule's validation accuracy, and
each rule's test error comes from testing its own best checkpoint: every rule gets its
own early-stopping epoch, chosen on validation. The ring-kernel variants span several
``sigma``; for each rule the "best sigma" is the one with the best mean *validation*
accuracy of that rule over seeds, never the test split. Outputs: ``runs.csv`` (one row
per variant and seed), ``summary.md`` (mean ± std of every rule's test error per variant)
and ``test_error.png`` (per-seed test errors).

``--out`` defaults to the repository's ``docs/results/mcover_<family>``
(``mcover_mlp_mnist5k``, ``mcover_committee_fashion_mnist``), from any folder.

Example::

    python -m experiments.mcover_seeds --family mlp --seeds 0 1 2 3 4
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments.recipe_table import markdown_table
from experiments.runs import (
    make_cli,
    normalize_overrides,
    quiet_lightning,
    resolve_recipe,
    results_dir,
)
from ripieno.framework.mcover.collapse import COLLAPSE_RULES
from ripieno.framework.runner.recipes import find_recipe

#: family -> the routed model's recipe (exact routing; swept over sigma), ``ours`` (label ->
#: (recipe, overrides): the block-message approximation at the recipe's sigma) and the
#: baselines (label -> (recipe, overrides)), recipes as shipped names; ``out`` is the default
#: output folder under ``docs/results``.
FAMILIES: dict[str, dict[str, Any]] = {
    "mlp": {
        "out": "mcover_mlp_mnist5k",
        "routed": "mcover/mlp_ring_mnist5k",
        "ours": {"M-cover block-message": ("mcover/mlp_block_message_mnist5k", [])},
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
        "ours": {"M-cover block-message": ("mcover/committee_ring_fashion_mnist",
                                           ["--model.init_args.routing=block_message"])},
        "baselines": {
            "M=1 (plain SGD)": ("mcover/committee_plain_sgd_fashion_mnist", []),
            "independent (diagonal Q)": ("mcover/committee_ring_fashion_mnist",
                                         ["--model.init_args.kernel=diagonal"]),
            "replicated SGD": ("mcover/committee_replicated_sgd_fashion_mnist", []),
        },
    },
}


#: The collapse rules every variant is tested under, and their labels in tables.
RULES: tuple[str, ...] = COLLAPSE_RULES
RULE_LABELS = {"mean_weights": "mean weights", "best_copy": "best copy (val.)",
               "copy_average": "copy average"}
RING = "M-cover ring"


def variants(family: str, sigmas: Sequence[float]) -> dict[str, tuple[str, list[str]]]:
    """``label -> (recipe, overrides)``: the ring kernel at each sigma, ours, then the baselines."""
    spec = FAMILIES[family]
    out = {f"{RING} sigma={s:g}": (spec["routed"], [f"--model.init_args.sigma={s}"]) for s in sigmas}
    out.update(spec["ours"])
    out.update(spec["baselines"])
    return out


def run_variant(recipe: str | Path, seed: int, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Train one recipe with one seed; test every collapse rule's best checkpoint.

    The recipe's checkpoint is dropped; one ``ModelCheckpoint`` per rule monitors
    ``val/<rule>_accuracy``. Checkpoints live in a
    temporary folder, removed afterwards; nothing else is written (no logger).

    Args:
        recipe: a shipped recipe's name or a recipe YAML path.
        seed: ``seed_everything`` value.
        overrides: extra ``--key=value`` CLI overrides (after the recipe's).

    Returns:
        ``recipe``, ``seed``; per rule ``val/<rule>_accuracy`` (best validation value),
        ``test/<rule>_accuracy``, ``test/<rule>_nll`` and ``<rule>_epoch`` (from that rule's
        checkpoint); ``test/copy_accuracy`` (the mean single copy's, at the ``mean_weights``
        checkpoint), ``test/best_copy_index``, ``epochs`` and ``wall_time_s``.
    """
    start = time.perf_counter()
    path = find_recipe(recipe)
    config = yaml.safe_load(path.read_text())
    trainer = config.setdefault("trainer", {})
    callbacks = trainer.get("callbacks") or []
    trainer["callbacks"] = [c for c in callbacks if not str(c.get("class_path") if isinstance(c, dict) else c)
                            .endswith("ModelCheckpoint")]
    row: dict[str, Any] = {"recipe": path.stem, "seed": seed}
    with tempfile.TemporaryDirectory(prefix="mcover_seeds_") as tmp:
        trainer["callbacks"] += [
            {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
             "init_args": {"dirpath": f"{tmp}/{rule}", "monitor": f"val/{rule}_accuracy", "mode": "max",
                           "filename": "best-{epoch:02d}"}} for rule in RULES]
        cli = make_cli(["--config", yaml.safe_dump(config, sort_keys=False), f"--seed_everything={seed}",
                        f"--trainer.default_root_dir={tmp}", "--trainer.logger=false",
                        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
                        *overrides])
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        # read every best path first: testing a checkpoint restores the callbacks' states from it
        best = [(c.best_model_path, float(c.best_model_score)) for c in cli.trainer.callbacks
                if isinstance(c, ModelCheckpoint)]
        for rule, (best_path, best_score) in zip(RULES, best, strict=True):
            results = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path=best_path,
                                       verbose=False, weights_only=True)[0]
            row[f"val/{rule}_accuracy"] = round(best_score, 6)
            row[f"test/{rule}_accuracy"] = round(float(results[f"test/{rule}_accuracy"]), 6)
            row[f"test/{rule}_nll"] = round(float(results[f"test/{rule}_nll"]), 6)
            row[f"{rule}_epoch"] = int(Path(best_path).stem.split("=")[-1])
            if rule == "mean_weights":
                row["test/copy_accuracy"] = round(float(results["test/copy_accuracy"]), 6)
            if rule == "best_copy":
                row["test/best_copy_index"] = int(results["test/best_copy_index"])
    row["epochs"] = cli.trainer.current_epoch
    row["wall_time_s"] = round(time.perf_counter() - start, 1)
    return row


def best_sigmas(frame: pd.DataFrame) -> dict[str, str]:
    """Per rule, the ring variant with the best mean validation accuracy of that rule."""
    ring = frame[frame["variant"].str.startswith(RING)]
    if not len(ring):
        return {}
    return {rule: str(ring.groupby("variant")[f"val/{rule}_accuracy"].mean().idxmax()) for rule in RULES}


def spread(values: pd.Series, digits: int = 4) -> str:
    """``"mean ± std"`` of a column (sample std; ``"mean"`` alone for one value)."""
    if len(values) < 2:
        return f"{values.mean():.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std():.{digits}f}"


def summarise(frame: pd.DataFrame) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """Mean ± std of every rule's test error per variant, and the best ring sigma per rule.

    Args:
        frame: the per-run rows (``run_variant``'s, with a ``variant`` column).

    Returns:
        The table rows (a variant that is some rule's best sigma is marked ``*`` in that
        rule's column) and ``{rule: best ring variant}``, chosen on validation.
    """
    best = best_sigmas(frame)
    rows = []
    for variant, group in frame.groupby("variant", sort=False):
        row: dict[str, Any] = {"variant": variant, "seeds": len(group)}
        for rule in RULES:
            mark = " *" if best.get(rule) == variant else ""
            row[f"{rule}_error"] = spread(1 - group[f"test/{rule}_accuracy"]) + mark
        row["single_copy_error"] = spread(1 - group["test/copy_accuracy"])
        row["seconds_per_run"] = group["wall_time_s"].mean()
        rows.append(row)
    return rows, best


def plot(frame: pd.DataFrame, path: Path, title: str) -> None:
    """Per-seed test errors of every collapse rule per variant (strip plot)."""
    labels = list(dict.fromkeys(frame["variant"]))
    figure = Figure(figsize=(9, 0.6 * len(labels) + 1.5))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    for i, label in enumerate(labels):
        group = frame[frame["variant"] == label]
        for k, (rule, marker) in enumerate(zip(RULES, "oxs", strict=True)):
            ax.scatter(1 - group[f"test/{rule}_accuracy"], [i + 0.15 * (k - 1)] * len(group), color=f"C{k}",
                       marker=marker, label=RULE_LABELS[rule] if i == 0 else None)
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
    frame = run_variants(variants(args.family, args.sigmas), args.seeds, extra)
    frame.to_csv(out / "runs.csv", index=False)
    write_outputs(frame, out, args.family, args.seeds, extra)


def run_variants(table: dict[str, tuple[str, list[str]]], seeds: Sequence[int],
                 extra: Sequence[str] = ()) -> pd.DataFrame:
    """``run_variant`` for every variant and seed; one row each, with a ``variant`` column.

    Args:
        table: ``label -> (recipe, overrides)`` (e.g. ``variants(family, sigmas)``).
        seeds: the seeds.
        extra: overrides for every run (after the variant's).

    Returns:
        The rows, in variant then seed order.
    """
    rows = []
    with quiet_lightning():
        for label, (recipe, overrides) in table.items():
            for seed in seeds:
                row = {"variant": label, **run_variant(recipe, seed, [*overrides, *extra])}
                rows.append(row)
                errors = "  ".join(f"{rule} {1 - row[f'test/{rule}_accuracy']:.4f}" for rule in RULES)
                print(f"{label:28s} seed {seed}: test error {errors} ({row['wall_time_s']} s)", flush=True)
    return pd.DataFrame(rows)


def write_outputs(frame: pd.DataFrame, out: Path, family: str, seeds: Sequence[int],
                  extra: list[str]) -> None:
    """``summary.md`` and ``test_error.png`` from the per-run rows."""
    table, best = summarise(frame)
    chosen = ", ".join(f"{rule}: {variant}" for rule, variant in best.items()) or "no ring variant"
    (out / "summary.md").write_text(
        f"Family `{family}`, seeds {list(seeds)}, overrides {extra or 'none'}. Test errors of every\n"
        "collapse rule, each at its own best checkpoint by that rule's validation accuracy: mean\n"
        "weights (EASGD: its centre), the best copy (chosen on validation) and the copy average\n"
        "(mean of the copies' probabilities); single copy: the mean over copies of each copy's own\n"
        "error (mean-weights checkpoint). Best ring sigma per rule by mean validation accuracy\n"
        f"(* in the table): {chosen}.\n\n"
        + markdown_table(table) + "\n")
    plot(frame, out / "test_error.png", f"{family}: test error over seeds {list(seeds)}")
    print(markdown_table(table))


if __name__ == "__main__":
    main()
