r"""LOES against its baselines, and GeoReg on and off, on one layer-feature recipe.

Every variant is the recipe (default ``recipes/loes/text_minilm_loes.yaml``: real MiniLM
on Rotten Tomatoes, frozen cached features) with overrides, run as ``ripieno fit`` would
(checkpoint on validation NLL, best checkpoint tested) for each seed. Selection sees only
the calibration rows of the training split; the test split is used once, by the test.

``--mode selection`` (default): for each budget K: LOES, last-K concatenation, greedy ridge
(no geometry terms), exhaustive search (ridge LOO over every subset of size K); plus the
best single layer and the ELMo-style learned scalar mix of all layers.
``--mode georeg``: the GeoReg recipe with ``weight`` 0 (measurement only) and the given
weights; reports test accuracy and the test isotropy of the fused embedding.
``--mode loes_weights``: LOES at each K with its geometry weights ``(alpha, gamma, eta)``
scaled by each of ``--scales`` (``scale=0`` is greedy ridge); the summary marks, per K,
the scale with the best mean validation NLL (never the test split).

Outputs: ``runs.csv`` (one row per variant and seed) and ``summary.md`` (mean ± std).

Example::

    python -m experiments.loes_comparison --ks 1 2 3 4 --seeds 0 1 2 \\
        --out docs/results/loes_minilm_rotten_tomatoes
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from experiments.recipe_table import markdown_table, run_recipe
from experiments.runs import normalize_overrides, quiet_lightning


def selection_variants(ks: Sequence[int]) -> dict[str, list[str]]:
    """``label -> overrides`` of the selection comparison."""
    out: dict[str, list[str]] = {
        "last layer": ["--data.init_args.selection=last_layer", "--data.init_args.k=1"],
        "best single layer": ["--data.init_args.selection=best_single", "--data.init_args.k=1"],
        "scalar mix (all layers)": ["--data.init_args.selection=all", "--model.init_args.head=scalar_mix"],
    }
    for k in ks:
        for name, selection in (("LOES", "loes"), ("last-k concat", "last_k"),
                                ("greedy ridge", "greedy_ridge"), ("exhaustive", "exhaustive")):
            out[f"{name} K={k}"] = [f"--data.init_args.selection={selection}", f"--data.init_args.k={k}"]
    return out


def georeg_variants(weights: Sequence[float]) -> dict[str, list[str]]:
    """``label -> overrides`` of the GeoReg comparison (weight 0 only measures).

    Each weight runs twice: the full GeoReg term and its spectral part alone
    (``volume_weight=0``).
    """
    out = {"no GeoReg (weight 0, measured)": ["--trainer.callbacks.init_args.weight=0.0"]}
    for w in weights:
        out[f"GeoReg weight={w:g}"] = [f"--trainer.callbacks.init_args.weight={w}"]
        out[f"GeoReg spectral only weight={w:g}"] = [f"--trainer.callbacks.init_args.weight={w}",
                                                     "--trainer.callbacks.init_args.volume_weight=0.0"]
    return out


def loes_weight_variants(ks: Sequence[int], scales: Sequence[float]) -> dict[str, list[str]]:
    """``label -> overrides``: LOES with ``(alpha, gamma, eta) = scale * (1, 0.5, 0.1)``."""
    out = {}
    for k in ks:
        for scale in scales:
            out[f"LOES K={k} scale={scale:g}"] = [
                "--data.init_args.selection=loes", f"--data.init_args.k={k}",
                f"--data.init_args.alpha={scale}", f"--data.init_args.gamma={0.5 * scale}",
                f"--data.init_args.eta={0.1 * scale}"]
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


def main(argv: list[str] | None = None) -> None:
    """Run the variants for every seed; write ``runs.csv`` and ``summary.md``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=["selection", "georeg", "loes_weights"], default="selection")
    parser.add_argument("--recipe", default=None, help="default: text_minilm_loes.yaml (selection) or"
                        " text_minilm_georeg.yaml (georeg)")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--weights", type=float, nargs="+", default=[0.1, 1.0])
    parser.add_argument("--scales", type=float, nargs="+", default=[0.0, 0.01, 0.03, 0.1, 1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="docs/results/loes_minilm_rotten_tomatoes")
    parser.add_argument("--override", action="append", default=[],
                        help="extra --key=value override for every run (repeatable)")
    args = parser.parse_args(argv)
    recipe = args.recipe or ("recipes/loes/text_minilm_georeg.yaml" if args.mode == "georeg"
                             else "recipes/loes/text_minilm_loes.yaml")
    if args.mode == "selection":
        variants = selection_variants(args.ks)
    elif args.mode == "georeg":
        variants = georeg_variants(args.weights)
    else:
        variants = loes_weight_variants(args.ks, args.scales)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    extra = [*normalize_overrides(args.override), "--data.init_args.progress=false",
             "--data.init_args.scores_path=null"]
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


if __name__ == "__main__":
    main()
