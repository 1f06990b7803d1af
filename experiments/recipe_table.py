r"""Train several recipes as ``ripieno fit`` would and tabulate their test metrics.

Each recipe runs exactly as on the command line (checkpointing, early stopping, the
recipe's seed or ``--seeds``), then its best checkpoint is tested. Rows hold the test
metrics, the best epoch, the parameter count and the wall time; the output is a CSV
and a markdown table (for the README).

Example::

    python -m experiments.recipe_table --recipes tabular/mlp_churn tabular/tabm_churn \\
        tabular/lometab_churn --seeds 0 1

``--recipes`` takes shipped recipe names or paths; ``--out`` defaults to the repository's
``docs/results/tabular_recipes``, from any folder.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from lightning.pytorch.callbacks import ModelCheckpoint

from experiments.runs import make_cli, normalize_overrides, quiet_lightning, resolve_recipe, results_dir
from ripieno.framework.runner.recipes import find_recipe


def run_recipe(recipe: str | Path, seed: int, out: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Fit one recipe with one seed, test its best checkpoint, return the row.

    The run's ``trainer.default_root_dir`` is ``out/<recipe stem>/seed<seed>``; as with
    ``ripieno fit``, its CSV logs (and checkpoints) go to ``logs/version_N`` inside it.

    Args:
        recipe: a shipped recipe's name or a recipe YAML path.
        seed: ``seed_everything`` value.
        out: folder of the runs (each recipe and seed gets its own folder inside).
        overrides: extra ``--key=value`` CLI overrides.

    Returns:
        ``recipe`` (the file's stem), ``seed``, every ``test/*`` and ``diversity/test/*``
        metric, ``best_epoch``, ``val_monitor`` (the checkpoint's monitored validation value
        at that epoch), ``epochs``, ``n_params`` and ``wall_time_s``.

    Raises:
        RecipeNotFoundError: if the recipe is neither a file nor a shipped recipe.
    """
    start = time.perf_counter()
    path = find_recipe(recipe)
    root = out / path.stem / f"seed{seed}"
    cli = make_cli(["--config", str(path), f"--seed_everything={seed}", f"--trainer.default_root_dir={root}",
                    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
                    *overrides])
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    checkpoint = next(c for c in cli.trainer.callbacks if isinstance(c, ModelCheckpoint))
    results = cli.trainer.test(cli.model, datamodule=cli.datamodule,
                               ckpt_path=checkpoint.best_model_path or None, verbose=False,
                               weights_only=True)[0]
    best = Path(checkpoint.best_model_path).stem  # "best-epoch=NN"
    row: dict[str, Any] = {"recipe": path.stem, "seed": seed}
    row.update({name: round(float(value), 6) for name, value in sorted(results.items())
                if name != "test/loss"})
    row["best_epoch"] = int(best.split("=")[-1]) if "=" in best else -1
    if checkpoint.best_model_score is not None:  # the recipe's monitored validation metric, best epoch
        row["val_monitor"] = round(float(checkpoint.best_model_score), 6)
    selected = getattr(getattr(cli.datamodule, "spec", None), "selected_layers", None)
    if selected is not None:  # layer-feature data: which layers the run used
        row["layers"] = " ".join(str(i) for i in selected)
    row["epochs"] = cli.trainer.current_epoch
    row["n_params"] = sum(p.numel() for p in cli.model.parameters())
    row["wall_time_s"] = round(time.perf_counter() - start, 1)
    return row


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """Rows as a markdown table with the union of their columns (blank where absent)."""
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [f"{row[c]:.4g}" if isinstance(row.get(c), float) else str(row.get(c, ""))
                 for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see ``--help``); ``args.recipes`` become recipe files.

    Args:
        argv: arguments without the program name (``None``: ``sys.argv[1:]``).

    Returns:
        The parsed arguments.
    """
    parser = argparse.ArgumentParser(prog="python -m experiments.recipe_table",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", required=True,
                        help="shipped recipe names (as listed by `ripieno recipes`) or recipe YAML paths")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds per recipe")
    parser.add_argument("--out", type=Path, default=results_dir("tabular_recipes"))
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra CLI override for every run, repeatable")
    args = parser.parse_args(argv)
    args.recipes = [resolve_recipe(parser, recipe) for recipe in args.recipes]
    return args


def main(argv: list[str] | None = None) -> None:
    """Run every recipe for every seed; write ``recipe_table.csv`` and ``recipe_table.md``.

    Args:
        argv: command-line arguments (``None``: ``sys.argv[1:]``).
    """
    args = parse_args(argv)
    rows: list[dict[str, Any]] = []
    with quiet_lightning():
        for recipe in args.recipes:
            for seed in args.seeds:
                rows.append(run_recipe(recipe, seed, args.out / "runs",
                                       normalize_overrides(args.override)))
                args.out.mkdir(parents=True, exist_ok=True)
                pd.DataFrame(rows).to_csv(args.out / "recipe_table.csv", index=False)
                print(f"recipe_table: {rows[-1]}", flush=True)
    table = markdown_table(rows)
    (args.out / "recipe_table.md").write_text(table + "\n")
    print(table)
    print(f"recipe_table: csv {args.out / 'recipe_table.csv'}")


if __name__ == "__main__":
    main()
