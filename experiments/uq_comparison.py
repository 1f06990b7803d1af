r"""Compare post-hoc and ensemble uncertainty methods on one trained image classifier.

One network is trained from a recipe (seed 0, fixed epochs, SWAG moments collected on the
way); every method then tests the same weights with the same data: MAP (the network
alone), LL-GLM (``LastLayerSampler``, prior precision chosen on validation LPPD from a
grid), DNN-GLM (the same lambda, ``--dnn_iters`` CG steps), MC-dropout, SWAG, linearised
Laplace (laplace-torch, last layer, kron, when installed) and a deep ensemble of
``--members`` networks trained with seeds 0..M-1. Rows: accuracy, ECE, NLL, LPPD,
VARROC-ID, VARROC-OOD and the method's seconds (preparation + test). Output: CSV and
markdown.

``--recipe`` takes a shipped recipe's name or a path (default ``uq/ll_glm_fashion_mnist``);
``--out`` defaults to the repository's ``docs/results/uq_fashion_mnist``, from any folder.

Example::

    python -m experiments.uq_comparison --recipe uq/ll_glm_fashion_mnist --max_epochs 5 \\
        --override data.init_args.max_train_rows=3000
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from typing import Any

import lightning as L
import pandas as pd
from lightning.pytorch.callbacks import Callback

from experiments.runs import make_cli, normalize_overrides, quiet_lightning, resolve_recipe, results_dir
from ripieno.callbacks import (
    DeepEnsembleSampler,
    LaplaceGGN,
    LaplaceSampler,
    LastLayerSampler,
    MCDropoutSampler,
    SamplerEvaluation,
    SWAGSampler,
)
from ripieno.framework.runner.command import RipienoCLI

DEFAULT_RECIPE = "uq/ll_glm_fashion_mnist"
GRID = [0.01, 0.1, 1.0, 10.0, 100.0, 1000.0]
COLUMNS = {"uq/test/accuracy": "accuracy", "uq/test/ece": "ece", "uq/test/nll": "nll", "uq/test/lppd": "lppd",
           "uq/test/varroc_id": "varroc_id", "uq/test/varroc_ood": "varroc_ood",
           "uq/prior_precision": "prior_precision"}


def train(recipe: Path, seed: int, root: Path, overrides: list[str], callbacks: list[Callback]) -> RipienoCLI:
    """Fit the recipe's model with ``seed`` (no checkpoint callbacks: the last weights count)."""
    cli = make_cli(["--config", str(recipe), f"--seed_everything={seed}",
                    f"--trainer.default_root_dir={root}", "--trainer.logger=false",
                    "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
                    "--trainer.callbacks=[]",
                    "--trainer.enable_checkpointing=false", "--test_after_fit=false", *overrides])
    cli.trainer.callbacks.extend(callbacks)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return cli


def evaluate(cli: RipienoCLI, name: str, callback: Callback | None, root: Path,
             datamodule: L.LightningDataModule | None = None,
             columns: dict[str, str] | None = None) -> dict[str, Any]:
    """Test the trained module with one method's callback; the row of the table.

    Args:
        cli: the trained run (its module; its datamodule unless ``datamodule`` is given).
        name: the method's row label.
        callback: the method's ``PosteriorPredictiveCallback`` (``None``: the network alone).
        root: the trainer's root folder.
        datamodule: data to test on instead of ``cli.datamodule``.
        columns: logged name -> column of the row (default ``COLUMNS``).

    Returns:
        ``method``, ``seconds`` (preparation + test) and the metrics of ``columns``.
    """
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=root, callbacks=[callback] if callback is not None else [])
    start = time.perf_counter()
    results = trainer.test(cli.model, datamodule=datamodule or cli.datamodule, verbose=False)
    merged: dict[str, float] = {}
    for result in results:
        merged.update(result)
    row: dict[str, Any] = {"method": name, "seconds": round(time.perf_counter() - start, 1)}
    if callback is None:  # the network alone: its own calibration metrics
        merged = {**merged, "uq/test/ece": merged.get("test/ece"), "uq/test/nll": merged.get("test/nll"),
                  "uq/test/accuracy": merged.get("test/accuracy")}
        if merged.get("uq/test/nll") is not None:
            merged["uq/test/lppd"] = -merged["uq/test/nll"]
    for key, column in (columns or COLUMNS).items():
        value = merged.get(key)
        row[column] = round(float(value), 4) if value is not None else None
    return row


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see ``--help``); ``args.recipe`` becomes the recipe file.

    Args:
        argv: arguments without the program name (``None``: ``sys.argv[1:]``).

    Returns:
        The parsed arguments.
    """
    parser = argparse.ArgumentParser(prog="python -m experiments.uq_comparison",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default=DEFAULT_RECIPE,
                        help="shipped recipe name (as listed by `ripieno recipes`) or recipe YAML path")
    parser.add_argument("--max_epochs", type=int, default=5)
    parser.add_argument("--samples", type=int, default=10, help="S for every sampling method")
    parser.add_argument("--members", type=int, default=5, help="deep-ensemble size M")
    parser.add_argument("--dnn_iters", type=int, default=10, help="CG iterations of DNN-GLM")
    parser.add_argument("--out", type=Path, default=results_dir("uq_fashion_mnist"))
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    args.recipe = resolve_recipe(parser, args.recipe)
    return args


def main(argv: list[str] | None = None) -> None:
    """Train, evaluate every method, write ``uq_comparison.csv`` and ``.md``.

    Args:
        argv: command-line arguments (``None``: ``sys.argv[1:]``).
    """
    args = parse_args(argv)
    overrides = [f"--trainer.max_epochs={args.max_epochs}", *normalize_overrides(args.override)]
    root = args.out / "runs"
    s, evaluation = args.samples, SamplerEvaluation(ood_dataloader_idx=1)
    rows: list[dict[str, Any]] = []
    with quiet_lightning():
        swag = SWAGSampler(n_samples=s, swa_start=0.5, evaluation=evaluation)
        cli = train(args.recipe, 0, root / "seed0", overrides, [swag])
        checkpoints = [root / "seed0.ckpt"]
        cli.trainer.save_checkpoint(checkpoints[0])
        ll_glm = LastLayerSampler(glm="last_layer", n_samples=s, evaluation=evaluation,
                                  posterior=LaplaceGGN(prior_precision_grid=GRID))
        methods: list[tuple[str, Callback | None]] = [("MAP", None), ("LL-GLM", ll_glm)]
        rows += [evaluate(cli, name, callback, root) for name, callback in methods]
        # DNN-GLM passes over the training set per CG step: it reuses LL-GLM's lambda
        # instead of its own grid search (a grid would multiply its cost by len(GRID)).
        methods = [
            ("DNN-GLM", LastLayerSampler(glm="full", n_samples=s, evaluation=evaluation,
                                         posterior=LaplaceGGN(max_iters=args.dnn_iters,
                                                              prior_precision=ll_glm.chosen_prior_precision))),
            ("MC-dropout", MCDropoutSampler(n_samples=s, evaluation=evaluation)),
        ]
        methods.append(("SWAG", swag))
        if importlib.util.find_spec("laplace") is not None:  # optional dependency
            methods.append(("Laplace (LL, kron)", LaplaceSampler(n_samples=s, evaluation=evaluation)))
        for name, callback in methods:
            rows.append(evaluate(cli, name, callback, root))
        for row in rows:
            print(f"uq_comparison: {row}", flush=True)
        for seed in range(1, args.members):
            member = train(args.recipe, seed, root / f"seed{seed}", overrides, [])
            checkpoints.append(root / f"seed{seed}.ckpt")
            member.trainer.save_checkpoint(checkpoints[-1])
        ensemble = DeepEnsembleSampler([str(c) for c in checkpoints], evaluation=evaluation)
        rows.append(evaluate(cli, f"deep ensemble (M={args.members})", ensemble, root))
        print(f"uq_comparison: {rows[-1]}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    frame.to_csv(args.out / "uq_comparison.csv", index=False)
    table = frame.to_markdown(index=False) if importlib.util.find_spec("tabulate") else frame.to_string()
    (args.out / "uq_comparison.md").write_text(table + "\n")
    print(table)
    print(f"uq_comparison: csv {args.out / 'uq_comparison.csv'}")


if __name__ == "__main__":
    main()
