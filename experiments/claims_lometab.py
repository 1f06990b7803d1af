r"""LoMETab's diversity claims: the rank axis, the size of the (r, sigma_init) effect, additive.

The seed paper presents the adapter rank ``r`` and the init scale ``sigma_init`` of
``W_k = W * (1 + A_k B_k^T)`` as two diversity controls ("low sigma_init gives low
diversity whatever the rank; higher sigma_init activates the rank axis") and the
multiplicative form as keeping members more diverse than the additive ablation
``W + A_k B_k^T``. This experiment measures the member pairwise KL on the validation split
(``DiversityMonitor``) on three shipped tables, ``mlc_churn`` (binary) and scikit-learn's
``wine`` and ``digits`` (multiclass), for four variants built from one recipe per table
(``tabular/lometab_<table>``, only ``adapter`` and ``adapter_init`` changed):

* reference: LoMETab with ``adapter_init="plain"`` (the paper's draw: entries of ``A_k``,
  ``B_k`` i.i.d. ``N(0, sigma_init^2)``, so ``A_k B_k^T`` has std ``sqrt(r) sigma_init^2``);
* ours: LoMETab with ``adapter_init="rank_normalized"`` (std ``sigma_init`` for every rank);
* baseline: the additive ablation with ``plain`` (the same draw) and with ``relative``
  (``sigma_init`` times ``W``'s std, our like-for-like pairing with ``rank_normalized``).

Two studies, each over several training seeds (the data split is fixed):

* the grid ``r`` x ``sigma_init`` (``experiments.diversity_sweep.run_cell``): KL before
  training and after a short training, per variant, table and seed;
* KL over a longer training at one ``(r, sigma_init)``
  (``experiments.diversity_over_training.train_variant``), per variant, table and seed.

Outputs under ``out``: ``grid.csv`` (one row per run), ``grid_summary.csv``/``.md`` (per
table and variant: KL orders of magnitude spanned by the grid, the rank's effect at each
``sigma_init``), ``over_training.csv`` (every validation), ``over_training_summary.csv``/
``.md``, ``claims.md`` (the claim rows), ``summary.md`` (all of it), heatmaps
``heatmaps/<table>_<variant>_{init,final}_pairwise_kl.png``, curves
``over_training_<table>.png`` and ``settings.json``.

Example::

    OMP_NUM_THREADS=1 python -m experiments.claims_lometab --out docs/results/claims/lometab
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from experiments.claim_rows import ClaimRow, Verdict, mean_std
from experiments.diversity_over_training import plot_curves, train_variant
from experiments.diversity_sweep import plot_heatmap, run_cell
from experiments.runs import prepare_recipe, quiet_lightning, results_dir, write_csv

#: Table name -> the LoMETab recipe every variant of that table is built from.
TABLES: dict[str, str] = {
    "churn": "tabular/lometab_churn",
    "wine": "tabular/lometab_wine",
    "digits": "tabular/lometab_digits",
}
#: Variant name -> (``adapter``, ``adapter_init``) and its role in the claim rows.
VARIANTS: dict[str, tuple[str, str]] = {
    "lometab/plain": ("lometab", "plain"),
    "lometab/rank_normalized": ("lometab", "rank_normalized"),
    "additive/plain": ("additive", "plain"),
    "additive/relative": ("additive", "relative"),
}
REFERENCE, OURS = "lometab/plain", "lometab/rank_normalized"
BASELINE, BASELINE_RELATIVE = "additive/plain", "additive/relative"
#: The rank "moves" KL when the largest rank's KL is at least this factor of the smallest's.
RANK_FACTOR = 2.0
#: "Several orders of magnitude": the grid's largest / smallest seed-mean KL, in log10.
SPAN_ORDERS = 2.0


@dataclasses.dataclass(frozen=True)
class Budget:
    """What one run of the experiment trains.

    Attributes:
        seeds: training seeds (``seed_everything``); the data split is the recipe's.
        ranks: adapter ranks of the grid.
        sigmas: ``sigma_init`` values of the grid.
        grid_epochs: training epochs of a grid cell, per table.
        curve_epochs: training epochs of the over-training study, per table.
        curve_rank: the rank of the over-training study.
        curve_sigma: the ``sigma_init`` of the over-training study.
        max_rows: cap on the rows of each table (a seeded subset), ``None``: all.
    """

    seeds: tuple[int, ...]
    ranks: tuple[int, ...]
    sigmas: tuple[float, ...]
    grid_epochs: dict[str, int]
    curve_epochs: dict[str, int]
    curve_rank: int
    curve_sigma: float
    max_rows: dict[str, int | None]


FULL = Budget(seeds=(0, 1, 2), ranks=(1, 2, 4, 8, 16), sigmas=(0.1, 0.3, 1.0, 3.0),
              grid_epochs={"churn": 3, "wine": 20, "digits": 6},
              curve_epochs={"churn": 15, "wine": 60, "digits": 20},
              curve_rank=4, curve_sigma=0.3,
              max_rows={"churn": None, "wine": None, "digits": None})
REDUCED = Budget(seeds=(0,), ranks=(1, 8), sigmas=(0.1, 3.0),
                 grid_epochs={"churn": 1, "wine": 2, "digits": 1},
                 curve_epochs={"churn": 2, "wine": 2, "digits": 2},
                 curve_rank=4, curve_sigma=0.3,
                 max_rows={"churn": 400, "wine": None, "digits": 300})


# ------------------------------------------------------------------------------ runs
def _overrides(budget: Budget, table: str, adapter: str) -> list[str]:
    args = [f"--model.init_args.adapter={adapter}"]
    if budget.max_rows[table] is not None:
        args.append(f"--data.init_args.max_rows={budget.max_rows[table]}")
    return args


def run_grid(budget: Budget, out: Path) -> list[dict[str, Any]]:
    """Every ``(table, variant, seed, rank, sigma_init)`` cell: KL at init and after training.

    Args:
        budget: what to run.
        out: output folder (``grid.csv`` is rewritten after every cell).

    Returns:
        The rows of ``experiments.diversity_sweep.run_cell`` with ``table`` and ``variant``.
    """
    rows: list[dict[str, Any]] = []
    total = len(TABLES) * len(VARIANTS) * len(budget.seeds) * len(budget.ranks) * len(budget.sigmas)
    for table, recipe in TABLES.items():
        config = prepare_recipe(recipe)
        for variant, (adapter, init) in VARIANTS.items():
            for seed in budget.seeds:
                for rank in budget.ranks:
                    for sigma in budget.sigmas:
                        row = run_cell(config, rank, sigma, max_epochs=budget.grid_epochs[table],
                                       out=out / "runs", seed=seed, adapter_init=init,
                                       overrides=_overrides(budget, table, adapter))
                        rows.append({"table": table, "variant": variant, **row})
                        write_csv(out / "grid.csv", rows)
                        print(f"claims_lometab: grid [{len(rows)}/{total}] {table} {variant} seed={seed}"
                              f" r={rank} sigma={sigma:g}: KL {row['init_pairwise_kl']:.3g} ->"
                              f" {row['pairwise_kl']:.3g} ({row['wall_time_s']:.1f} s)", flush=True)
    return rows


def run_curves(budget: Budget, out: Path) -> list[dict[str, Any]]:
    """KL and task metrics after every epoch, per table, variant and seed.

    Args:
        budget: what to run.
        out: output folder (``over_training.csv``, ``over_training_<table>.png``).

    Returns:
        The rows of ``experiments.diversity_over_training.train_variant`` with ``table``
        and ``variant``.
    """
    rows: list[dict[str, Any]] = []
    for table, recipe in TABLES.items():
        config = prepare_recipe(recipe)
        mine: list[dict[str, Any]] = []
        for variant, (adapter, init) in VARIANTS.items():
            for seed in budget.seeds:
                start = time.perf_counter()
                _, family, runs = train_variant(
                    config, adapter, rank=budget.curve_rank, sigma=budget.curve_sigma,
                    max_epochs=budget.curve_epochs[table], out=out / "runs", seed=seed,
                    adapter_init=init, overrides=_overrides(budget, table, adapter))
                mine += [{"table": table, "variant": variant, **r} for r in runs]
                print(f"claims_lometab: curve {table} {variant} seed={seed}: KL"
                      f" {runs[0]['pairwise_kl']:.3g} -> {runs[-1]['pairwise_kl']:.3g}"
                      f" ({time.perf_counter() - start:.1f} s)", flush=True)
        plot_curves(mine, family, out / f"over_training_{table}.png",
                    title=f"{table}: r={budget.curve_rank}, sigma_init={budget.curve_sigma:g}")
        rows += mine
        write_csv(out / "over_training.csv", rows)
    return rows


# --------------------------------------------------------------------------- analysis
GridMeans = dict[tuple[str, str, str], dict[tuple[int, float], float]]
STAGES = (("init", "init_pairwise_kl"), ("final", "pairwise_kl"))


def _select(rows: Sequence[dict[str, Any]], **keys: Any) -> list[dict[str, Any]]:  # noqa: ANN401
    return [r for r in rows if all(r[k] == v for k, v in keys.items())]


def _orders(high: float, low: float) -> float:
    """``log10(high / low)``, KL floored at 1e-12 (a KL of exactly 0 is possible)."""
    return math.log10(max(high, 1e-12) / max(low, 1e-12))


def grid_means(rows: Sequence[dict[str, Any]]) -> GridMeans:
    """Seed-mean KL of every grid cell, keyed by ``(table, variant, stage)`` then ``(rank, sigma)``.

    Args:
        rows: ``run_grid`` rows.

    Returns:
        The means; ``stage`` is ``init`` (before training) or ``final`` (after it).
    """
    cells: dict[tuple[str, str, str], dict[tuple[int, float], list[float]]] = {}
    for r in rows:
        for stage, column in STAGES:
            key = (str(r["table"]), str(r["variant"]), stage)
            cell = (int(r["rank"]), float(r["sigma_init"]))
            cells.setdefault(key, {}).setdefault(cell, []).append(float(r[column]))
    return {key: {cell: statistics.fmean(v) for cell, v in grid.items()} for key, grid in cells.items()}


def grid_summary(rows: Sequence[dict[str, Any]], budget: Budget) -> list[dict[str, Any]]:
    """Per table, variant and stage: what the grid does to the KL.

    Args:
        rows: ``run_grid`` rows.
        budget: the grid that ran.

    Returns:
        One row per ``(table, variant, stage)``: ``span_orders`` (log10 of the largest over
        the smallest seed-mean KL of the grid), ``kl_min``, ``kl_max``; for every
        ``sigma_init``: ``rank_orders@<sigma>`` (log10 of the seed-mean KL at the largest
        over the smallest rank), ``rank_gain@<sigma>`` (their difference, in KL) and
        ``rank_factor_min_seed@<sigma>`` (the smallest per-seed ratio); the mean validation
        accuracy over the grid.
    """
    lo_r, hi_r = min(budget.ranks), max(budget.ranks)
    means = grid_means(rows)
    summary: list[dict[str, Any]] = []
    for (table, variant, stage), grid in means.items():
        column = dict(STAGES)[stage]
        mine = _select(rows, table=table, variant=variant)
        row: dict[str, Any] = {"table": table, "variant": variant, "stage": stage,
                               "span_orders": round(_orders(max(grid.values()), min(grid.values())), 2),
                               "kl_min": min(grid.values()), "kl_max": max(grid.values())}
        for sigma in budget.sigmas:
            row[f"rank_orders@{sigma:g}"] = round(_orders(grid[hi_r, sigma], grid[lo_r, sigma]), 2)
            row[f"rank_gain@{sigma:g}"] = grid[hi_r, sigma] - grid[lo_r, sigma]
            ratios = []
            for seed in budget.seeds:
                kl = {int(r["rank"]): float(r[column]) for r in mine
                      if r["seed"] == seed and float(r["sigma_init"]) == sigma}
                ratios.append(max(kl[hi_r], 1e-12) / max(kl[lo_r], 1e-12))
            row[f"rank_factor_min_seed@{sigma:g}"] = round(min(ratios), 3)
        accuracy = "init_val_accuracy" if stage == "init" else "val_accuracy"
        row["mean_val_accuracy"] = round(statistics.fmean(float(r[accuracy]) for r in mine), 4)
        summary.append(row)
    return summary


def curve_summary(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per table and variant: KL at init and at the end of training, accuracy, NLL (over seeds).

    Args:
        rows: ``run_curves`` rows.

    Returns:
        One row per ``(table, variant)``: ``epochs``, ``mean ± std`` texts, and the per-seed
        KL values ``kl_init``/``kl_final`` (lists, in seed order) used by the claims.
    """
    summary: list[dict[str, Any]] = []
    for table in TABLES:
        for variant in VARIANTS:
            mine = _select(rows, table=table, variant=variant)
            if not mine:
                continue
            last_epoch = max(int(r["epoch"]) for r in mine)
            first = sorted((r for r in mine if int(r["epoch"]) == 0), key=lambda r: r["seed"])
            last = sorted((r for r in mine if int(r["epoch"]) == last_epoch), key=lambda r: r["seed"])
            summary.append({
                "table": table, "variant": variant, "epochs": last_epoch,
                "KL at init": mean_std([float(r["pairwise_kl"]) for r in first], 4),
                "KL at end": mean_std([float(r["pairwise_kl"]) for r in last], 4),
                "val accuracy at end": mean_std([float(r["val_accuracy"]) for r in last]),
                "val NLL at end": mean_std([float(r["val_nll"]) for r in last]),
                "kl_init": [float(r["pairwise_kl"]) for r in first],
                "kl_final": [float(r["pairwise_kl"]) for r in last],
            })
    return summary


def _one(rows: Sequence[dict[str, Any]], **keys: Any) -> dict[str, Any]:  # noqa: ANN401
    found = _select(rows, **keys)
    if len(found) != 1:
        raise KeyError(f"Expected one summary row for {keys}, found {len(found)}.")
    return found[0]


# ----------------------------------------------------------------------------- claims
def rank_axis_claim(summary: Sequence[dict[str, Any]], means: GridMeans, budget: Budget,
                    stage: str, common: dict[str, str]) -> ClaimRow:
    """Low sigma_init: low KL whatever the rank; higher sigma_init: the rank moves the KL.

    Per table, with the reference variant: (i) every rank's seed-mean KL at the lowest
    ``sigma_init`` is below every rank's at the highest, and (ii) at the highest
    ``sigma_init`` the largest rank's KL is at least ``RANK_FACTOR`` times the smallest
    rank's in every seed, a larger gain (in KL) than at the lowest ``sigma_init``.
    Reproduced: both on every table; partly: at least one on some table.
    """
    lo_s, hi_s = min(budget.sigmas), max(budget.sigmas)
    lo_r, hi_r = min(budget.ranks), max(budget.ranks)

    def describe(variant: str) -> str:
        parts = [f"{t} {_one(summary, table=t, variant=variant, stage=stage)[f'rank_orders@{lo_s:g}']:+.2f}"
                 f" / {_one(summary, table=t, variant=variant, stage=stage)[f'rank_orders@{hi_s:g}']:+.2f}"
                 for t in TABLES]
        return f"{variant}: " + ", ".join(parts)

    checks: dict[str, tuple[bool, bool]] = {}
    for table in TABLES:
        grid = means[table, REFERENCE, stage]
        row = _one(summary, table=table, variant=REFERENCE, stage=stage)
        low = max(grid[r, lo_s] for r in budget.ranks) < min(grid[r, hi_s] for r in budget.ranks)
        active = (row[f"rank_factor_min_seed@{hi_s:g}"] >= RANK_FACTOR
                  and row[f"rank_gain@{hi_s:g}"] > row[f"rank_gain@{lo_s:g}"])
        checks[table] = (low, active)
    verdict: Verdict = ("reproduced" if all(a and b for a, b in checks.values()) else
                        "partly" if any(a or b for a, b in checks.values()) else "not reproduced")
    yes = {True: "yes", False: "no"}
    detail = "; ".join(f"{t} (i) {yes[a]}, (ii) {yes[b]}" for t, (a, b) in checks.items())
    when = "at init" if stage == "init" else "after training"
    unit = f"log10 KL(r={hi_r}) / KL(r={lo_r}) at sigma_init {lo_s:g} / {hi_s:g}"
    return ClaimRow(
        method="LoMETab",
        claim="Low sigma_init gives low diversity whatever the rank; higher sigma_init activates "
              f"the rank axis (member pairwise KL {when}).",
        reference=f"{unit}: {describe(REFERENCE)}", ours=describe(OURS),
        baseline=f"{describe(BASELINE)}; {describe(BASELINE_RELATIVE)}", verdict=verdict,
        note=f"Reference per table: {detail}. (i) every rank's KL at sigma_init {lo_s:g} is below every "
             f"rank's at {hi_s:g}; (ii) at {hi_s:g}, KL(r={hi_r}) >= {RANK_FACTOR:g} x KL(r={lo_r}) in every "
             f"seed and gains more KL than at {lo_s:g}.",
        **common)


def span_claim(summary: Sequence[dict[str, Any]], common: dict[str, str]) -> ClaimRow:
    """The grid moves the KL over at least ``SPAN_ORDERS`` orders of magnitude (reference)."""
    def describe(variant: str) -> str:
        return f"{variant}: " + ", ".join(
            f"{t} {_one(summary, table=t, variant=variant, stage='init')['span_orders']:.1f}"
            f" / {_one(summary, table=t, variant=variant, stage='final')['span_orders']:.1f}"
            for t in TABLES)

    spans = [_one(summary, table=t, variant=REFERENCE, stage=s)["span_orders"]
             for t in TABLES for s in ("init", "final")]
    verdict: Verdict = ("reproduced" if min(spans) >= SPAN_ORDERS else
                        "partly" if max(spans) >= SPAN_ORDERS else "not reproduced")
    return ClaimRow(
        method="LoMETab",
        claim="Rank and sigma_init together control member diversity over orders of magnitude.",
        reference=f"orders of magnitude of KL spanned by the grid, at init / after training: "
                  f"{describe(REFERENCE)}",
        ours=describe(OURS), baseline=f"{describe(BASELINE)}; {describe(BASELINE_RELATIVE)}",
        verdict=verdict,
        note=f"Span = log10(largest / smallest seed-mean KL over the grid). Reproduced: >= {SPAN_ORDERS:g} "
             "orders on every table at init and after training; partly: somewhere.",
        **common)


def additive_gap_claim(curves: Sequence[dict[str, Any]], means: GridMeans, budget: Budget,
                       common: dict[str, str]) -> ClaimRow:
    """LoMETab's members stay more diverse than the additive ablation's over training.

    Per table and seed, the ratio of LoMETab's KL to the additive ablation's (same draw
    family: plain/plain for the reference, rank_normalized/relative for ours) at init and at
    the end of the over-training study. Reproduced: the reference's ratio is above 1 at the
    end in every seed on every table; not reproduced: below 1 everywhere; partly otherwise.
    """
    def ratios(variant: str, baseline: str, key: str, table: str) -> list[float]:
        mine = _one(curves, table=table, variant=variant)[key]
        theirs = _one(curves, table=table, variant=baseline)[key]
        return [m / max(b, 1e-12) for m, b in zip(mine, theirs, strict=True)]

    def describe(variant: str, baseline: str) -> str:
        return ", ".join(
            f"{t} {_ratio_text(ratios(variant, baseline, 'kl_init', t))} -> "
            f"{_ratio_text(ratios(variant, baseline, 'kl_final', t))}" for t in TABLES)

    def grid_share(variant: str, baseline: str) -> str:
        wins = total = 0
        for table in TABLES:
            mine, theirs = means[table, variant, "final"], means[table, baseline, "final"]
            wins += sum(mine[c] > theirs[c] for c in mine)
            total += len(mine)
        return f"{wins}/{total}"

    final = [x for t in TABLES for x in ratios(REFERENCE, BASELINE, "kl_final", t)]
    verdict: Verdict = ("reproduced" if min(final) > 1 else
                        "not reproduced" if max(final) < 1 else "partly")
    setting = f"r={budget.curve_rank}, sigma_init={budget.curve_sigma:g}"
    return ClaimRow(
        method="LoMETab",
        claim="LoMETab's members stay more diverse than the additive ablation's over training "
              "(the gap persists).",
        reference=f"KL {REFERENCE} / {BASELINE}, init -> end ({setting}): "
                  f"{describe(REFERENCE, BASELINE)}",
        ours=f"KL {OURS} / {BASELINE_RELATIVE}: {describe(OURS, BASELINE_RELATIVE)}",
        baseline=f"{BASELINE} KL at end: " + ", ".join(
            f"{t} {_one(curves, table=t, variant=BASELINE)['KL at end']}" for t in TABLES),
        verdict=verdict,
        note=f"Ratios > 1: LoMETab more diverse. Over the whole grid after training, LoMETab's KL is "
             f"above the additive's in {grid_share(REFERENCE, BASELINE)} cells (plain/plain) and "
             f"{grid_share(OURS, BASELINE_RELATIVE)} (rank_normalized/relative).",
        **common)


def _ratio_text(values: Sequence[float]) -> str:
    """Geometric mean of ratios, with the range when there are several seeds."""
    mean = math.exp(statistics.fmean(math.log(max(v, 1e-12)) for v in values))
    if len(values) == 1:
        return f"{mean:.3g}"
    return f"{mean:.3g} [{min(values):.3g}, {max(values):.3g}]"


# ----------------------------------------------------------------------------- output
def _markdown(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub markdown table of dict rows (floats with 4 significant digits)."""
    if not rows:
        return ""
    columns = list(columns or rows[0])

    def cell(value: Any) -> str:  # noqa: ANN401
        text = f"{value:.4g}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _heatmaps(rows: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    paths = []
    for table in TABLES:
        for variant in VARIANTS:
            mine = _select(rows, table=table, variant=variant)
            name = variant.replace("/", "_")
            epochs = mine[0]["epochs"]
            stem = out / "heatmaps" / f"{table}_{name}"
            paths.append(plot_heatmap(mine, "init_pairwise_kl", Path(f"{stem}_init_pairwise_kl.png"),
                                      title=f"{table}, {variant}: pairwise KL at init"))
            paths.append(plot_heatmap(mine, "pairwise_kl", Path(f"{stem}_final_pairwise_kl.png"),
                                      title=f"{table}, {variant}: pairwise KL after {epochs} epochs"))
    return paths


def claim_rows(out: Path, *, reduced: bool) -> list[ClaimRow]:
    """Run both studies, write their tables under ``out``, return the claim rows.

    Args:
        out: output folder (created).
        reduced: the CI setting (``REDUCED``: one seed, a 2 x 2 grid, 1-2 epochs, churn and
            digits subsampled; about a minute; every verdict ``inconclusive``) instead of
            ``FULL`` (3 seeds, the 5 x 4 grid).

    Returns:
        Four rows: the rank axis at init, the rank axis after training, the orders of
        magnitude the grid spans, and the gap to the additive ablation over training.
    """
    budget = REDUCED if reduced else FULL
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with quiet_lightning():
        grid = run_grid(budget, out)
        curves = run_curves(budget, out)
    return write_report(grid, curves, out, reduced=reduced, wall=time.perf_counter() - start)


def write_report(grid: Sequence[dict[str, Any]], curves: Sequence[dict[str, Any]], out: Path, *,
                 reduced: bool, wall: float) -> list[ClaimRow]:
    """Summaries, claim rows, heatmaps and settings from the rows of both studies.

    Args:
        grid: ``run_grid`` rows.
        curves: ``run_curves`` rows.
        out: output folder.
        reduced: whether the rows come from the ``REDUCED`` setting (verdicts are then
            ``inconclusive``, the measured verdict is kept in the note).
        wall: seconds the studies took.

    Returns:
        The claim rows (see ``claim_rows``).
    """
    budget = REDUCED if reduced else FULL
    command = "OMP_NUM_THREADS=1 python -m experiments.claims_lometab" + (" --reduced" if reduced else "")
    command += f" --out {out}"
    seeds = ", ".join(str(s) for s in budget.seeds)
    epochs = ", ".join(f"{t} {budget.grid_epochs[t]}/{budget.curve_epochs[t]}" for t in TABLES)
    common = {"data": f"mlc_churn (binary), wine, digits (multiclass); recipes tabular/lometab_<table> "
                      f"(K=16, 2 x 128); epochs grid/curve: {epochs}"
                      + (" (reduced)" if reduced else ""),
              "seeds": seeds, "command": command}
    summary = grid_summary(grid, budget)
    means = grid_means(grid)
    curve_rows = curve_summary(curves)
    claims = [rank_axis_claim(summary, means, budget, "init", common),
              rank_axis_claim(summary, means, budget, "final", common),
              span_claim(summary, common),
              additive_gap_claim(curve_rows, means, budget, common)]
    if reduced:
        claims = [dataclasses.replace(c, verdict="inconclusive",
                                      note=f"Reduced setting (one seed, 2 x 2 grid, 1-2 epochs): too small "
                                           f"to say; measured here: {c.verdict}. {c.note}")
                  for c in claims]

    write_csv(out / "grid_summary.csv", summary)
    public_curves = [{k: v for k, v in r.items() if k not in ("kl_init", "kl_final")} for r in curve_rows]
    write_csv(out / "over_training_summary.csv", public_curves)
    (out / "grid_summary.md").write_text(_markdown(summary) + "\n")
    (out / "over_training_summary.md").write_text(_markdown(public_curves) + "\n")
    claim_dicts = [dataclasses.asdict(c) for c in claims]
    (out / "claims.md").write_text(_markdown(claim_dicts) + "\n")
    pngs = _heatmaps(grid, out)
    (out / "summary.md").write_text(_summary_markdown(claims, summary, public_curves, budget, command, wall))
    settings = {"budget": dataclasses.asdict(budget), "reduced": reduced, "wall_seconds": round(wall, 1),
                "torch_threads": torch.get_num_threads(), "tables": TABLES,
                "variants": {k: list(v) for k, v in VARIANTS.items()}, "command": command,
                "plots": [str(p.relative_to(out)) for p in pngs]}
    (out / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    return claims


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV this experiment wrote, numbers parsed back (int, then float, else text).

    Args:
        path: ``grid.csv`` or ``over_training.csv``.

    Returns:
        The rows.
    """
    def parse(text: str) -> Any:  # noqa: ANN401
        for kind in (int, float):
            try:
                return kind(text)
            except ValueError:
                pass
        return text

    with path.open(newline="") as handle:
        return [{k: parse(v) for k, v in row.items()} for row in csv.DictReader(handle)]


def _summary_markdown(claims: Sequence[ClaimRow], summary: Sequence[dict[str, Any]],
                      curves: Sequence[dict[str, Any]], budget: Budget, command: str, wall: float) -> str:
    sigmas = [f"{s:g}" for s in budget.sigmas]
    columns = ["table", "variant", "stage", "span_orders", "kl_min", "kl_max",
               *[f"rank_orders@{s}" for s in sigmas], "mean_val_accuracy"]
    verdicts = [{"claim": c.claim, "verdict": c.verdict, "reference": c.reference, "ours": c.ours,
                 "baseline": c.baseline} for c in claims]
    return "\n\n".join([
        "# LoMETab claims: the (r, sigma_init) grid and the additive ablation",
        f"Command: `{command}` ({wall / 60:.1f} min, {torch.get_num_threads()} thread(s)); seeds "
        f"{', '.join(map(str, budget.seeds))}; grid r in {list(budget.ranks)} x sigma_init in "
        f"{list(budget.sigmas)}; over training: r={budget.curve_rank}, sigma_init={budget.curve_sigma:g}.",
        "## Claims", _markdown(verdicts),
        "## The grid (seed-mean pairwise KL on the validation split)",
        "`span_orders`: log10 of the grid's largest over smallest KL; `rank_orders@s`: log10 of "
        f"KL(r={max(budget.ranks)}) / KL(r={min(budget.ranks)}) at sigma_init s.",
        _markdown(summary, columns),
        "## Over training", _markdown(curves), ""])


def main(argv: list[str] | None = None) -> None:
    """Run ``claim_rows`` from the command line and print the rows.

    Args:
        argv: ``[--reduced] [--out DIR] [--from_csv]`` (``None``: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(prog="python -m experiments.claims_lometab",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true", help="the CI setting (about a minute)")
    parser.add_argument("--out", type=Path, default=results_dir("claims/lometab"))
    parser.add_argument("--from_csv", action="store_true",
                        help="train nothing: rebuild the summaries and claims from the grid.csv and "
                        "over_training.csv an earlier run wrote in --out")
    args = parser.parse_args(argv)
    if args.from_csv:
        settings = args.out / "settings.json"
        wall = json.loads(settings.read_text())["wall_seconds"] if settings.is_file() else float("nan")
        rows = write_report(read_rows(args.out / "grid.csv"), read_rows(args.out / "over_training.csv"),
                            args.out, reduced=args.reduced, wall=wall)
    else:
        rows = claim_rows(args.out, reduced=args.reduced)
    for row in rows:
        print(f"claims_lometab: {row.verdict}: {row.claim}\n  reference {row.reference}\n"
              f"  ours {row.ours}\n  baseline {row.baseline}\n  note {row.note}")


if __name__ == "__main__":
    main()
