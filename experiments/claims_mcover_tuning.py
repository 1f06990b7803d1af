r"""M-cover's kernel-width claim, tested with ``ripieno tune``: is the best ring kernel interior?

The M-cover paper finds the best generalisation at a finite width ``sigma`` (and shift ``mu``) of
the Gaussian ring kernel, not at either limit: ``sigma -> 0`` is the diagonal kernel (no routing,
independent copies), ``sigma -> inf`` the uniform one (every copy reads any copy). For each target
recipe, this experiment

1. runs a ``ripieno tune`` study of ``sigma`` and ``mu`` (the shipped space
   ``mcover/ring_kernel``: ``sigma`` log-uniform on [0.05, 10], ``mu`` uniform on [0, 2]) on the
   recipe's validation metric, TPE seeded, no pruning;
2. trains and tests, with the same seeds, the best ``(sigma, mu)`` and the two limits
   (``kernel: diagonal`` and ``kernel: uniform``), each tested at its best checkpoint on
   validation.

A row is *reproduced* when the best ``sigma`` lies inside the range (more than a tenth of the
log-range from either end, where the ring is numerically the diagonal or the uniform kernel) and
its test error is lower than both limits' by more than two standard errors (Welch); *partly*
when it is interior and better than one limit; *not reproduced* when the best sits at an end or
is worse than a limit; *inconclusive* when within the seed spread or ``reduced``.

Targets: ``mcover/perceptron_mcover`` (binary teacher-student perceptron, M-cover simulated
annealing; test error of the collapsed student) and ``mcover/mlp_ring_mnist5k`` (MLP on MNIST-5k,
exact routing; test error of the mean-weights predictor).

Outputs under ``out``: ``<target>/study/`` (the study: ``trials.csv``, ``best.yaml``, figures),
``<target>/final.csv`` (every variant and seed), ``claims.md`` and ``settings.json``.

Example (about 35 minutes on 2 CPU cores)::

    python -m experiments.claims_mcover_tuning --out docs/results/claims/mcover_tuning
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from experiments.claim_rows import ClaimRow, claims_table, compare, mean_std, verdict
from experiments.runs import make_cli, quiet_lightning, results_dir, shown_path, write_text
from ripieno.framework.cli.main import main as ripieno_main

SIGMA_KEY, MU_KEY, KERNEL_KEY = "model.init_args.sigma", "model.init_args.mu", "model.init_args.kernel"
SIGMA_RANGE = (0.05, 10.0)  # recipes/spaces/mcover/ring_kernel.yaml
EDGE = 0.1  # share of the log-range at either end counted as a limit


@dataclass(frozen=True)
class Target:
    """One recipe whose ring kernel is tuned.

    Attributes:
        recipe: shipped recipe name.
        description: data and model, for the row.
        test_error: test metric name and whether it is an accuracy (error = 1 - value).
        n_trials: trials of the study.
        startup_trials: TPE's random start-up trials.
        seeds: seeds of the final comparison.
        overrides: ``--key=value`` given to every trial and final run.
        seed_overrides: ``--key=value`` templates with ``{seed}`` for each final run, beside
            ``seed_everything`` (a recipe that fixes its own seeds: the perceptron's annealer and
            teacher, so that each seed is a new problem instance, not the one the study tuned on).
    """

    recipe: str
    description: str
    test_error: tuple[str, bool]
    n_trials: int
    startup_trials: int
    seeds: tuple[int, ...]
    overrides: tuple[str, ...] = ()
    seed_overrides: tuple[str, ...] = ()


PERCEPTRON_SEEDS = ("--model.init_args.seed={seed}", "--data.init_args.seed={seed}")
PERCEPTRON = "perceptron"
MLP = "mlp_mnist5k"
FULL = {
    PERCEPTRON: Target("mcover/perceptron_mcover",
                       "binary teacher-student perceptron, N=500, alpha=1.5, M=5, M-cover SA",
                       ("test/error_collapsed", False), n_trials=20, startup_trials=8, seeds=(0, 1, 2, 3, 4),
                       seed_overrides=PERCEPTRON_SEEDS),
    MLP: Target("mcover/mlp_ring_mnist5k", "MLP 784-256-10 on MNIST-5k, M=5, exact routing, 10 epochs",
                ("test/collapsed_accuracy", True), n_trials=10, startup_trials=5, seeds=(0, 1, 2),
                overrides=("--trainer.max_epochs=10",)),
}
REDUCED = {
    PERCEPTRON: Target("mcover/perceptron_mcover", "binary perceptron, N=100, alpha=1.5 (reduced)",
                       ("test/error_collapsed", False), n_trials=2, startup_trials=2, seeds=(0,),
                       seed_overrides=PERCEPTRON_SEEDS,
                       overrides=("--trainer.max_epochs=5", "--data.init_args.n_inputs=100",
                                  "--data.init_args.n_val=200", "--data.init_args.n_test=200")),
}


def interior(sigma: float, low: float = SIGMA_RANGE[0], high: float = SIGMA_RANGE[1]) -> bool:
    """Whether ``sigma`` is more than :data:`EDGE` of the log-range away from both ends.

    >>> interior(1.0), interior(0.06), interior(9.0)
    (True, False, False)
    """
    span = math.log(high) - math.log(low)
    position = (math.log(sigma) - math.log(low)) / span
    return EDGE < position < 1 - EDGE


def run_study(target: Target, folder: Path) -> dict[str, float]:
    """``ripieno tune`` of the target's ring kernel; returns the best trial's sigma and mu."""
    study_dir = folder / "study"
    ripieno_main([
        "tune", "-c", target.recipe, "--space", "mcover/ring_kernel", "--n_trials", str(target.n_trials),
        "--startup_trials", str(target.startup_trials), "--seed", "0", "--pruner", "none",
        "--keep_checkpoints", "best", "--study_dir", str(study_dir), *target.overrides,
    ])
    best = yaml.safe_load((study_dir / "best.yaml").read_text())["model"]["init_args"]
    return {"sigma": float(best["sigma"]), "mu": float(best["mu"])}


def fit_and_test(target: Target, overrides: list[str], seed: int, folder: Path) -> float:
    """Train the recipe with ``overrides`` and ``seed``; the test error at the best validation checkpoint."""
    args = ["--config", str(_recipe_path(target.recipe)), *target.overrides, *overrides,
            *(template.format(seed=seed) for template in target.seed_overrides), f"--seed_everything={seed}",
            f"--trainer.default_root_dir={folder}", "--trainer.logger=false",
            "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]
    with quiet_lightning():
        cli = make_cli(args)
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        results = cli.trainer.test(cli.model, datamodule=cli.datamodule, ckpt_path="best", verbose=False,
                                   weights_only=True)
    for checkpoint in folder.rglob("*.ckpt"):  # tested; the comparison keeps only its numbers
        checkpoint.unlink()
    name, is_accuracy = target.test_error
    value = float(results[0][name])
    return 1.0 - value if is_accuracy else value


def _recipe_path(recipe: str) -> Path:
    from ripieno.framework.runner.recipes import find_recipe

    return find_recipe(recipe)


def target_row(name: str, target: Target, out: Path, reduced: bool, command: str) -> ClaimRow:
    """Tune, run the final comparison and return the target's claim row."""
    folder = out / name
    best = run_study(target, folder)
    variants = {
        "tuned ring": [f"--{SIGMA_KEY}={best['sigma']}", f"--{MU_KEY}={best['mu']}"],
        "diagonal (sigma -> 0)": [f"--{KERNEL_KEY}=diagonal"],
        "uniform (sigma -> inf)": [f"--{KERNEL_KEY}=uniform"],
    }
    rows = []
    for label, overrides in variants.items():
        for seed in target.seeds:
            run_dir = folder / "final" / label.split()[0] / f"seed_{seed}"
            rows.append({"variant": label, "seed": seed,
                         "test_error": fit_and_test(target, overrides, seed, run_dir)})
    frame = pd.DataFrame(rows)
    frame.to_csv(folder / "final.csv", index=False)
    errors = {label: frame.loc[frame["variant"] == label, "test_error"].tolist() for label in variants}
    tuned, diagonal, uniform = (errors[label] for label in variants)
    outcomes = [compare(tuned, diagonal), compare(tuned, uniform)]
    inside = interior(best["sigma"])
    if reduced:
        result = "inconclusive"
    elif not inside or "worse" in outcomes:
        result = "not reproduced"
    else:
        result = verdict(outcomes, reduced)
    where = "interior" if inside else "at an end of the range (a limit)"
    return ClaimRow(
        method="M-cover",
        claim="The best ring-kernel width is interior: a tuned (sigma, mu) generalises better than both"
              " the diagonal (sigma -> 0) and the uniform (sigma -> inf) kernel.",
        data=target.description,
        reference=f"tuned ring sigma={best['sigma']:.3g}, mu={best['mu']:.3g} ({where}):"
                  f" test error {mean_std(tuned)}",
        ours="the reference (the same routed model; only sigma and mu are searched)",
        baseline=f"diagonal: {mean_std(diagonal)}; uniform: {mean_std(uniform)}",
        seeds=", ".join(str(s) for s in target.seeds), command=command, verdict=result,
        note=f"ripieno tune, {target.n_trials} TPE trials ({target.startup_trials} random) on the recipe's"
             f" validation metric, sigma log-uniform on {SIGMA_RANGE}, mu on [0, 2]; tuned vs diagonal:"
             f" {outcomes[0]}, vs uniform: {outcomes[1]} (> 2 SE, Welch); interior = more than {EDGE:.0%} of"
             " the log-range from either end.")


def claim_rows(out: Path, *, reduced: bool, only: tuple[str, ...] = ()) -> list[ClaimRow]:
    """Run the studies and comparisons, write their tables under ``out``, return one row per target.

    A study that is already complete in ``out`` is not rerun (``ripieno tune`` continues it); the
    final comparison is. ``only`` runs some targets and keeps the others' rows from ``out/claims.md``.

    Args:
        out: output folder (created).
        reduced: the CI setting (:data:`REDUCED`: the perceptron only, N=100, 2 trials, one seed).
        only: target names to run (empty: all).

    Returns:
        One row per target.
    """
    targets = REDUCED if reduced else FULL
    kept = _kept_rows(out, [n for n in targets if only and n not in only])
    targets = {n: t for n, t in targets.items() if not only or n in only}
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m experiments.claims_mcover_tuning" + (" --reduced" if reduced else "")
    command += f" --out {shown_path(out)}"
    start, claims, seconds = time.perf_counter(), [], {}
    for name, target in targets.items():
        begin = time.perf_counter()
        claims.append(target_row(name, target, out, reduced, command))
        seconds[name] = round(time.perf_counter() - begin, 1)
    claims += kept
    write_text(out / "claims.md", claims_table(claims))
    settings = {"targets": {k: dataclasses.asdict(v) for k, v in targets.items()}, "reduced": reduced,
                "seconds": seconds, "wall_seconds": round(time.perf_counter() - start, 1), "command": command}
    write_text(out / "settings.json", json.dumps(settings, indent=2) + "\n")
    return claims


def _kept_rows(out: Path, names: list[str]) -> list[ClaimRow]:
    """The rows of targets ``names`` from an earlier run's ``claims.md`` (by their data description)."""
    path = out / "claims.md"
    if not names or not path.is_file():
        return []
    fields = [f.name for f in dataclasses.fields(ClaimRow)]
    wanted = {FULL[n].description for n in names if n in FULL}
    rows = []
    for line in path.read_text().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) == len(fields) and cells[fields.index("data")] in wanted:
            rows.append(ClaimRow(**dict(zip(fields, cells, strict=True))))
    return rows


def main(argv: list[str] | None = None) -> None:
    """Run :func:`claim_rows` from the command line and print the rows.

    Args:
        argv: ``[--reduced] [--out DIR]`` (``None``: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(prog="python -m experiments.claims_mcover_tuning",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true", help="the CI setting (under a minute)")
    parser.add_argument("--out", type=Path, default=results_dir("claims/mcover_tuning"))
    parser.add_argument("--only", nargs="+", choices=sorted(FULL), default=(), help="run these targets only")
    args = parser.parse_args(argv)
    for row in claim_rows(args.out, reduced=args.reduced, only=tuple(args.only)):
        print(f"claims_mcover_tuning: {row.verdict}: {row.data} | {row.reference} | {row.baseline}")


if __name__ == "__main__":
    main()
