r"""Is picking the best members of a trained ensemble better than training a smaller one?

The ``tabm`` README notes that selecting members of a trained ensemble can beat training
fewer. For each recipe and seed this trains the recipe at ``--k_large`` members and at
``--k_small`` members (the recipe's own checkpointing and early stopping, best checkpoint
by its monitor), then from the large one selects ``--k_small`` members on the validation
split with both rules of ``TabularEnsembleModule.select_members`` (``greedy``: Caruana
forward selection with replacement, ``topk``: best own validation loss) and tests all four
ensembles on the same test split. Selection only ever sees validation rows.

Outputs under ``--out``: ``member_selection.csv`` (one row per recipe, seed and
ensemble) and ``member_selection.md`` (mean and std over seeds).

Example::

    python -m experiments.member_selection --recipes tabular/lometab_churn \
        tabular/lometab_diamonds tabular/lometab_hpc --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

from experiments.runs import format_table, make_cli, quiet_lightning, results_dir, write_csv
from ripieno.framework.runner.recipes import find_recipe

DEFAULT_RECIPES = ("tabular/lometab_churn", "tabular/lometab_diamonds", "tabular/lometab_hpc")
METRICS = {"classification": ("test/nll", "test/accuracy"), "regression": ("test/rmse",)}


def _fit_best(recipe: Path, seed: int, k: int, root: Path,
              overrides: Sequence[str]) -> tuple[Any, Any, float]:
    """Train ``recipe`` with ``k`` members; return (best-checkpoint model, datamodule, seconds)."""
    cli = make_cli(["--config", str(recipe), f"--seed_everything={seed}", f"--model.init_args.k={k}",
                    f"--trainer.default_root_dir={root}", "--trainer.logger=false",
                    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
                    *overrides])
    start = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    seconds = time.perf_counter() - start
    checkpoint = next(c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint))
    if not checkpoint.best_model_path:
        raise RuntimeError(f"{recipe}: no best checkpoint was saved; the recipe needs a ModelCheckpoint.")
    model = type(cli.model).load_from_checkpoint(checkpoint.best_model_path, weights_only=True)
    return model, cli.datamodule, seconds


def _test(model: Any, datamodule: Any, root: Path) -> dict[str, float]:  # noqa: ANN401
    import lightning as L

    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=root)
    return {k: float(v) for k, v in trainer.test(model, datamodule=datamodule, verbose=False)[0].items()}


def run(recipes: Sequence[str], seeds: Sequence[int], k_large: int, k_small: int,
        overrides: Sequence[str]) -> list[dict[str, Any]]:
    """Every (recipe, seed): the four ensembles' test metrics (module docstring)."""
    rows: list[dict[str, Any]] = []
    for name in recipes:
        recipe = find_recipe(name)
        for seed in seeds:
            with tempfile.TemporaryDirectory() as tmp, quiet_lightning():
                root = Path(tmp)
                large, dm, t_large = _fit_best(recipe, seed, k_large, root / "large", overrides)
                small, _, t_small = _fit_best(recipe, seed, k_small, root / "small", overrides)
                family = "regression" if large.task == "regression" else "classification"
                ensembles = {f"trained K={k_large}": (large, t_large, ""),
                             f"trained K={k_small}": (small, t_small, "")}
                for method in ("greedy", "topk"):
                    start = time.perf_counter()
                    chosen = large.select_members(k_small, method=method, datamodule=dm)
                    picked = chosen.member_selection.indices
                    ensembles[f"{method} {k_small} of {k_large}"] = (
                        chosen, time.perf_counter() - start, f"{len(set(picked))} distinct")
                for label, (model, seconds, note) in ensembles.items():
                    metrics = _test(model, dm, root)
                    row = {"recipe": name, "seed": seed, "ensemble": label, "members": note,
                           "seconds": round(seconds, 1)}
                    row.update({m: metrics[m] for m in METRICS[family]})
                    rows.append(row)
                    print(format_table([row], list(row)), flush=True)
    return rows


def summary(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: mean +- std over seeds per recipe and ensemble."""
    lines = []
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        group = [r for r in rows if r["recipe"] == recipe]
        metrics = [m for m in ("test/nll", "test/accuracy", "test/rmse") if m in group[0]]
        seeds = sorted({r["seed"] for r in group})
        lines += [f"### {recipe} ({len(seeds)} seeds: {seeds})", "",
                  "| ensemble | " + " | ".join(metrics) + " | distinct members |",
                  "|---|" + "---|" * (len(metrics) + 1)]
        for label in dict.fromkeys(r["ensemble"] for r in group):
            chosen = [r for r in group if r["ensemble"] == label]
            cells = []
            for metric in metrics:
                values = [r[metric] for r in chosen]
                std = statistics.stdev(values) if len(values) > 1 else 0.0
                cells.append(f"{statistics.mean(values):.4f} +- {std:.4f}")
            distinct = ", ".join(r["members"].split()[0] for r in chosen if r["members"]) or "-"
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {distinct} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipes", nargs="+", default=list(DEFAULT_RECIPES))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--k_large", type=int, default=32)
    parser.add_argument("--k_small", type=int, default=8)
    parser.add_argument("--out", type=Path, default=results_dir("member_selection"))
    parser.add_argument("--override", action="append", default=[], metavar="--KEY=VALUE",
                        help="extra override for every run, repeatable")
    args = parser.parse_args(argv)
    if not 1 <= args.k_small < args.k_large:
        parser.error("need 1 <= --k_small < --k_large")
    rows = run(args.recipes, args.seeds, args.k_large, args.k_small, args.override)
    columns = list(dict.fromkeys(key for row in rows for key in row))  # recipes differ in metrics
    write_csv(args.out / "member_selection.csv", [{c: row.get(c, "") for c in columns} for row in rows])
    (args.out / "member_selection.md").write_text(summary(rows))
    print(summary(rows))


if __name__ == "__main__":
    main()
