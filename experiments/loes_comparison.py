r"""LOES against its baselines, and GeoReg on and off, on one layer-feature recipe.

Every variant is the recipe (default ``loes/text_minilm_loes``: real MiniLM
on Rotten Tomatoes, frozen cached features) with overrides, run as ``ripieno fit`` would
(checkpoint on validation NLL, best checkpoint tested) for each seed. Selection sees only
the calibration rows of the training split; the test split is used once, by the test.

``--mode selection`` (default): for each budget K: LOES (the recipe's, ``variant: ripieno``),
LOES ``variant: reference`` with the reference code's defaults (:data:`REFERENCE_LOES`),
last-K concatenation, greedy ridge (no geometry terms), exhaustive search (ridge LOO over
every subset of size K); plus the best single layer and the ELMo-style learned scalar mix
of all layers.
``--mode georeg``: the GeoReg recipe with ``weight`` 0 (measurement only) and, for each
given weight, each of ``--georeg_forms``: ``ripieno`` (our GeoReg), ``spectral_only`` (ours
with ``volume_weight=0``), ``reference`` (``GeoReg(variant="reference")``); reports test
accuracy and the test isotropy of the fused embedding.
``--mode loes_weights``: LOES at each K with its geometry weights ``(alpha, gamma, eta)``
scaled by each of ``--scales`` (``scale=0`` is greedy ridge); the summary marks, per K,
the scale with the best mean validation NLL (never the test split).

Outputs: ``<mode>_runs.csv`` (one row per variant and seed) and ``<mode>_summary.md``
(mean ± std), under ``--out`` (default: the repository's
``docs/results/loes_minilm_rotten_tomatoes``, from any folder).

Example::

    python -m experiments.loes_comparison --recipe loes/text_minilm_loes --ks 1 2 3 4 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.recipe_table import markdown_table, run_recipe
from experiments.runs import normalize_overrides, quiet_lightning, resolve_recipe, results_dir

#: The command-line prefix of ``LayerEmbeddingDataModule``'s selection settings.
SELECTION = "--data.init_args.selection"
#: Overrides that turn a recipe's LOES into the public LOES code with that code's defaults.
REFERENCE_LOES: tuple[str, ...] = (
    "--data.init_args.selection.method=loes", "--data.init_args.selection.variant=reference",
    "--data.init_args.selection.alpha=1.0", "--data.init_args.selection.gamma=0.5",
    "--data.init_args.selection.eta=0.1", "--data.init_args.selection.ridge_lambda=0.001",
    "--data.init_args.selection.ridge_loss=null")
#: GeoReg forms of ``--mode georeg``.
GEOREG_FORMS: tuple[str, ...] = ("ripieno", "spectral_only", "reference")
#: Default recipe (a shipped name) per ``--mode``.
DEFAULT_RECIPES = {"selection": "loes/text_minilm_loes", "georeg": "loes/text_minilm_georeg",
                   "loes_weights": "loes/text_minilm_loes"}


def selection_variants(ks: Sequence[int]) -> dict[str, list[str]]:
    """``label -> overrides`` of the selection comparison."""
    out: dict[str, list[str]] = {
        "last layer": [f"{SELECTION}.method=last_layer", f"{SELECTION}.k=1"],
        "best single layer": [f"{SELECTION}.method=best_single", f"{SELECTION}.k=1"],
        "scalar mix (all layers)": [f"{SELECTION}.method=all", "--model.init_args.head=scalar_mix"],
    }
    for k in ks:
        for name, selection in (("LOES", "loes"), ("last-k concat", "last_k"),
                                ("greedy ridge", "greedy_ridge"), ("exhaustive", "exhaustive")):
            out[f"{name} K={k}"] = [f"{SELECTION}.method={selection}", f"{SELECTION}.k={k}"]
            if selection == "loes":
                out[f"LOES reference K={k}"] = [*REFERENCE_LOES, f"{SELECTION}.k={k}"]
    return out


def georeg_variants(weights: Sequence[float],
                    forms: Sequence[str] = ("ripieno", "spectral_only")) -> dict[str, list[str]]:
    """``label -> overrides`` of the GeoReg comparison (weight 0 only measures).

    Each weight runs once per form: ``ripieno`` (the full GeoReg term), ``spectral_only``
    (its spectral part alone, ``volume_weight=0``), ``reference`` (the public GeoReg loss).
    """
    if unknown := sorted(set(forms) - set(GEOREG_FORMS)):
        raise ValueError(f"Unknown GeoReg forms {unknown}; choose from {GEOREG_FORMS}.")
    out = {"no GeoReg (weight 0, measured)": ["--trainer.callbacks.init_args.weight=0.0"]}
    for w in weights:
        callback = "--trainer.callbacks.init_args."
        weight = f"{callback}weight={w}"
        if "ripieno" in forms:
            out[f"GeoReg weight={w:g}"] = [weight]
        if "spectral_only" in forms:
            out[f"GeoReg spectral only weight={w:g}"] = [weight, f"{callback}volume_weight=0.0"]
        if "reference" in forms:
            out[f"GeoReg reference weight={w:g}"] = [weight, f"{callback}variant=reference"]
    return out


def loes_weight_variants(ks: Sequence[int], scales: Sequence[float]) -> dict[str, list[str]]:
    """``label -> overrides``: LOES with ``(alpha, gamma, eta) = scale * (1, 0.5, 0.1)``."""
    out = {}
    for k in ks:
        for scale in scales:
            out[f"LOES K={k} scale={scale:g}"] = [
                f"{SELECTION}.method=loes", f"{SELECTION}.k={k}", f"{SELECTION}.alpha={scale}",
                f"{SELECTION}.gamma={0.5 * scale}", f"{SELECTION}.eta={0.1 * scale}"]
    return out


def summarise(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Mean ± std of the test metrics per variant (and the mean validation monitor).

    For ``LOES K=k scale=s`` variants, the scale with the lowest mean validation NLL at
    each ``K`` is marked.
    """
    best: set[str] = set()
    if "val_monitor" in frame and frame["variant"].str.contains(" scale=").any():
        weights = frame[frame["variant"].str.contains(" scale=")]
        means = weights.groupby("variant")["val_monitor"].mean()
        for _, group in means.groupby(lambda v: v.split(" scale=")[0]):
            best.add(str(group.idxmin()))  # the recipes monitor val/nll (lower is better)
    rows = []
    for variant, group in frame.groupby("variant", sort=False):
        label = variant + (" (best on validation)" if variant in best else "")
        row: dict[str, Any] = {"variant": label, "seeds": len(group)}
        if "val_monitor" in group:
            row["val_nll"] = f"{group['val_monitor'].mean():.4f}"
        if "layers" in group:
            row["layers"] = group["layers"].iloc[0]
        metrics = ("test/accuracy", "test/nll", "georeg/test/isotropy", "georeg/test/centroid_log_volume")
        for column in metrics:
            if column in group and group[column].notna().any():
                row[column] = f"{group[column].mean():.4f} ± {group[column].std():.4f}"
        rows.append(row)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see ``--help``); ``args.recipe`` defaults per ``--mode``.

    Args:
        argv: arguments without the program name (``None``: ``sys.argv[1:]``).

    Returns:
        The parsed arguments (``args.recipe`` is a name or path that exists).
    """
    parser = argparse.ArgumentParser(prog="python -m experiments.loes_comparison",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=list(DEFAULT_RECIPES), default="selection")
    parser.add_argument("--recipe", default=None,
                        help="shipped recipe name or recipe YAML path; default: "
                        + ", ".join(f"{name} ({mode})" for mode, name in DEFAULT_RECIPES.items()))
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--weights", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--georeg_forms", nargs="+", choices=GEOREG_FORMS,
                        default=["ripieno", "spectral_only"],
                        help="GeoReg forms of --mode georeg, each run at every weight")
    parser.add_argument("--scales", type=float, nargs="+", default=[0.0, 0.01, 0.03, 0.1, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=results_dir("loes_minilm_rotten_tomatoes"))
    parser.add_argument("--override", action="append", default=[],
                        help="extra --key=value override for every run (repeatable)")
    parser.add_argument("--skip", action="append", default=[],
                        help="a variant label not to run (repeatable), e.g. 'scalar mix (all layers)' for"
                             " a backbone whose layers differ in width")
    args = parser.parse_args(argv)
    args.recipe = args.recipe or DEFAULT_RECIPES[args.mode]
    resolve_recipe(parser, args.recipe)  # fail before any run when it does not exist
    return args


def main(argv: list[str] | None = None) -> pd.DataFrame:
    """Run the variants for every seed; write ``<mode>_runs.csv`` and ``<mode>_summary.md``.

    Args:
        argv: command-line arguments (``None``: ``sys.argv[1:]``).

    Returns:
        The runs (one row per variant and seed), as written to ``<mode>_runs.csv``.
    """
    args = parse_args(argv)
    recipe = args.recipe
    if args.mode == "selection":
        variants = selection_variants(args.ks)
    elif args.mode == "georeg":
        variants = georeg_variants(args.weights, args.georeg_forms)
    else:
        variants = loes_weight_variants(args.ks, args.scales)
    unknown = [s for s in args.skip if s not in variants]
    if unknown:
        raise SystemExit(f"--skip {unknown}: no such variant; the variants are {list(variants)}.")
    variants = {label: o for label, o in variants.items() if label not in args.skip}
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    extra = [*normalize_overrides(args.override), "--data.init_args.progress=false",
             "--data.init_args.selection.scores_path=null"]
    rows = []
    with quiet_lightning():
        for label, overrides in variants.items():
            for seed in args.seeds:
                folder = out / "runs" / label.replace(" ", "_").replace("=", "")
                row = run_recipe(recipe, seed, folder, [*overrides, *extra])
                rows.append({"variant": label, **row})
                print(f"{label:28s} seed {seed}: accuracy {row['test/accuracy']:.4f}"
                      f" nll {row['test/nll']:.4f} ({row['wall_time_s']} s)", flush=True)
    frame = pd.DataFrame(rows)
    frame.to_csv(out / f"{args.mode}_runs.csv", index=False)
    table = summarise(frame)
    (out / f"{args.mode}_summary.md").write_text(
        f"Recipe `{recipe}`, mode `{args.mode}`, seeds {args.seeds}, overrides {extra}.\n\n"
        + markdown_table(table) + "\n")
    print(markdown_table(table))
    return frame


if __name__ == "__main__":
    main()
