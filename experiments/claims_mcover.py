r"""M-cover routing ("Improving Generalization by Permutation Routing Across Model Copies").

The seed paper's claims, measured for every collapse rule (``mean_weights``, ``best_copy``
chosen on validation, ``copy_average``; ``ripieno.framework.mcover.collapse``), so that each
row says for which predictor a claim holds, if any:

* MLP on MNIST-5k and soft committee machine on Fashion-MNIST: M-cover routing with a
  Gaussian ring kernel has lower test error than replicated SGD, and than plain SGD (one
  network). Every variant is trained once per seed by ``mcover_seeds.run_variant`` and each
  rule is tested at its own best checkpoint on validation.
* Binary teacher-student perceptron: M-cover simulated annealing generalises better than
  replicated and plain SA (``perceptron_alpha``; the best copy is chosen on fresh
  validation patterns).

Variants. *Reference*: the paper's algorithm as closely as our code allows: every local
loss is evaluated on a sampled routed model (``routing: exact``), Gaussian ring kernel,
``sigma`` chosen per rule on validation from a grid; the sizes are the shipped recipes'
(``mcover/mlp_ring_mnist5k``, ``mcover/committee_ring_fashion_mnist``), not the paper's
own experiments, which we could not consult offline. *Ours*: our defaults with the
block-message approximation (``routing: block_message``, one pass with the bank's
empirical mixing matrix) at the recipe's ``sigma``. For the perceptron, reference and ours
coincide (``BinaryPerceptronSA``'s defaults: ring ``sigma = 0.5``, 5 input blocks, a new
permutation every 20 sweeps, no coupling). *Baselines*: replicated SGD / SA (Baldassi et
al.), plain SGD (``M = 1``) / plain SA; independent copies (diagonal ``Q``) are run as a
control, since a copy average of any ``M`` copies is an ensemble.

Verdicts, per comparison and rule: M-cover "better" when its mean test error is lower than
the baseline's by more than two standard errors of the difference (Welch,
``sqrt(s1^2/n1 + s2^2/n2)``), "worse" when higher by as much, otherwise "within the seed
spread". A row is *reproduced* when every rule (and, for the perceptron, every ``alpha``)
is better, *partly* when some are, *not reproduced* when none is and some are worse,
*inconclusive* when all are within the spread or when run ``reduced`` (one seed).

Outputs under ``out``: ``mlp_mnist5k/`` and ``committee_fashion_mnist/`` (``runs.csv``,
``summary.md``, ``test_error.png`` from ``mcover_seeds``), ``perceptron/`` (``results.csv``,
``summary.md``, ``gen_error_vs_alpha.png`` from ``perceptron_alpha``), ``claims.md`` and
``settings.json``.

Example (about 25 minutes on one core)::

    OMP_NUM_THREADS=1 python -m experiments.claims_mcover --out docs/results/claims/mcover
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from experiments import mcover_seeds, perceptron_alpha
from experiments.claim_rows import ClaimRow, by_outcome, claims_table, compare, mean_std, verdict
from experiments.runs import results_dir

RULES = mcover_seeds.RULES
LABELS = mcover_seeds.RULE_LABELS
OURS, REPLICATED, PLAIN, INDEPENDENT = ("M-cover block-message", "replicated SGD", "M=1 (plain SGD)",
                                        "independent (diagonal Q)")


@dataclasses.dataclass(frozen=True)
class Budget:
    """What one run trains.

    Attributes:
        seeds: seeds of every MLP and committee variant.
        sigmas: ring widths of the reference variant (one is chosen per rule on validation).
        mlp_overrides: extra CLI overrides of the MLP runs (empty: the recipes' 20 epochs).
        committee_overrides: extra CLI overrides of the committee runs (empty: 10 epochs,
            12,000 training images).
        perceptron: ``perceptron_alpha`` arguments.
    """

    seeds: tuple[int, ...]
    sigmas: tuple[float, ...]
    mlp_overrides: tuple[str, ...]
    committee_overrides: tuple[str, ...]
    perceptron: tuple[str, ...]


FULL = Budget(seeds=(0, 1, 2, 3, 4), sigmas=(0.5, 1.0, 2.0), mlp_overrides=(), committee_overrides=(),
              perceptron=("--n", "500", "--alphas", "1.0", "2.0", "--seeds", "5", "--sweeps", "1500"))
REDUCED = Budget(seeds=(0,), sigmas=(1.0,),
                 mlp_overrides=("--trainer.max_epochs=2", "--data.init_args.max_train_rows=1000"),
                 committee_overrides=("--trainer.max_epochs=1", "--data.init_args.max_train_rows=1000"),
                 perceptron=("--n", "100", "--alphas", "1.5", "--seeds", "1", "--sweeps", "200",
                             "--n_val", "200"))

#: ``mcover_seeds`` family -> (output folder under ``out``, description of data and model).
FAMILIES = {
    "mlp": ("mlp_mnist5k", "MLP 784-256-10 on MNIST-5k, M=5 copies, SGD with momentum"),
    "committee": ("committee_fashion_mnist",
                  "soft committee machine (7 tanh units per class) on Fashion-MNIST, 12,000 training"
                  " images, M=5"),
}


# -------------------------------------------------------------------- comparisons


def _errors(frame: pd.DataFrame, variant: str, rule: str) -> list[float]:
    return (1 - frame.loc[frame["variant"] == variant, f"test/{rule}_accuracy"]).tolist()


def _rules_text(errors: dict[str, list[float]], sigmas: dict[str, str] | None = None) -> str:
    def sigma(rule: str) -> str:
        return f" ({sigmas[rule].split()[-1]})" if sigmas else ""

    return "; ".join(f"{LABELS[rule]} {mean_std(errors[rule])}{sigma(rule)}" for rule in RULES)


def network_rows(frame: pd.DataFrame, best: dict[str, str], family: str, budget: Budget, reduced: bool,
                 command: str) -> list[ClaimRow]:
    """The two rows of an MLP or committee family: vs replicated SGD, vs plain SGD."""
    reference = {rule: _errors(frame, best[rule], rule) for rule in RULES}
    ours = {rule: _errors(frame, OURS, rule) for rule in RULES}
    control = {rule: _errors(frame, INDEPENDENT, rule) for rule in RULES}
    control_outcomes = {LABELS[r]: compare(reference[r], control[r]) for r in RULES}
    seeds = ", ".join(str(s) for s in budget.seeds)
    data = FAMILIES[family][1] + (f", reduced ({' '.join(_overrides(family, budget))})" if reduced else "")
    rows = []
    for baseline, claim in ((REPLICATED, "has lower test error than replicated SGD"),
                            (PLAIN, "has lower test error than plain SGD (one network)")):
        base = {rule: _errors(frame, baseline, rule) for rule in RULES}
        outcomes = {LABELS[r]: compare(reference[r], base[r]) for r in RULES}
        ours_outcomes = {LABELS[r]: compare(ours[r], base[r]) for r in RULES}
        base_text = (f"{baseline}: {_rules_text(base)}" if baseline == REPLICATED
                     else f"{baseline} (every rule is the one network): {mean_std(base['mean_weights'])}")
        note = (f"Reference (exact routing, sigma per rule on validation) {by_outcome(outcomes)}. Ours"
                f" (block-message) {by_outcome(ours_outcomes)}. Routing itself, reference vs the same M"
                f" copies without it (independent, diagonal Q: {_rules_text(control)}):"
                f" {by_outcome(control_outcomes)}. 'Better' = lower by > 2 SE (Welch); test error at each"
                " rule's best checkpoint by its validation accuracy.")
        rows.append(ClaimRow(
            method="M-cover", claim=f"M-cover routing with a Gaussian ring kernel {claim}.",
            data=data, reference=f"test error {_rules_text(reference, best)}",
            ours=f"test error {_rules_text(ours)}", baseline=base_text, seeds=seeds, command=command,
            verdict=verdict(list(outcomes.values()), reduced), note=note))
    return rows


def perceptron_rows(rows: Sequence[dict[str, Any]], budget: Budget, reduced: bool,
                    command: str) -> list[ClaimRow]:
    """The two perceptron rows: M-cover SA vs replicated SA, vs plain SA."""
    frame = pd.DataFrame(rows)
    alphas = sorted(frame["alpha"].unique())

    def errors(method: str, alpha: float, rule: str) -> list[float]:
        picked = frame[(frame["method"] == method) & (frame["alpha"] == alpha)]
        return picked[f"gen_error_{rule}"].tolist()

    def text(method: str) -> str:
        return " | ".join(f"alpha={a:g}: " + "; ".join(f"{LABELS[r]} {mean_std(errors(method, a, r))}"
                                                       for r in RULES) for a in alphas)

    seeds = ", ".join(str(s) for s in sorted(frame["seed"].unique()))
    n, sweeps = int(frame["n"].iloc[0]), int(frame["sweeps"].iloc[0])
    data = (f"binary teacher-student perceptron, N={n}, Gaussian inputs, alpha in"
            f" {{{', '.join(f'{a:g}' for a in alphas)}}}, M=5, {sweeps} sweeps per copy,"
            f" the same beta ramp for every method{' (reduced)' if reduced else ''}")
    claims = []
    baselines = {"replicated": "replicated SA (growing replica coupling)", "plain": "plain SA (M=1)"}
    for method, name in baselines.items():
        outcomes = {f"{LABELS[r]} at alpha={a:g}": compare(errors("mcover", a, r), errors(method, a, r))
                    for r in RULES for a in alphas}
        claims.append(ClaimRow(
            method="M-cover",
            claim=f"M-cover simulated annealing (ring kernel) generalises better than {name}.",
            data=data, reference=f"gen. error {text('mcover')}",
            ours="the reference (BinaryPerceptronSA's defaults are the same annealer)",
            baseline=f"{method} SA: gen. error {text(method)}", seeds=seeds, command=command,
            verdict=verdict(list(outcomes.values()), reduced),
            note=f"M-cover {by_outcome(outcomes)}. Errors arccos(R)/pi from the teacher; best copy chosen on"
                 " fresh validation patterns; copy average = majority vote."))
    return claims


# ------------------------------------------------------------------------- runs
def _overrides(family: str, budget: Budget) -> list[str]:
    return list(budget.mlp_overrides if family == "mlp" else budget.committee_overrides)


def _run_family(family: str, budget: Budget, out: Path) -> tuple[pd.DataFrame, dict[str, str]]:
    table = mcover_seeds.variants(family, budget.sigmas)
    keep = [label for label in table if label.startswith(mcover_seeds.RING)] + [OURS, REPLICATED, PLAIN,
                                                                                  INDEPENDENT]
    extra = _overrides(family, budget)
    frame = mcover_seeds.run_variants({label: table[label] for label in keep}, budget.seeds, extra)
    folder = out / FAMILIES[family][0]
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_csv(folder / "runs.csv", index=False)
    mcover_seeds.write_outputs(frame, folder, family, budget.seeds, extra)
    return frame, mcover_seeds.best_sigmas(frame)


def claim_rows(out: Path, *, reduced: bool) -> list[ClaimRow]:
    """Run the experiment, write its tables under ``out``, return the claim rows.

    Args:
        out: output folder (created).
        reduced: the CI setting (``REDUCED``: one seed, one sigma, 1,000 training images and
            one or two epochs, a perceptron with N=100; about a minute) instead of ``FULL``.

    Returns:
        Six rows: M-cover vs replicated SGD and vs plain SGD for the MLP and for the committee
        machine, M-cover SA vs replicated SA and vs plain SA for the perceptron.
    """
    budget = REDUCED if reduced else FULL
    out.mkdir(parents=True, exist_ok=True)
    command = "OMP_NUM_THREADS=1 python -m experiments.claims_mcover" + (" --reduced" if reduced else "")
    command += f" --out {out}"
    start, claims, seconds = time.perf_counter(), [], {}
    for family in FAMILIES:
        begin = time.perf_counter()
        frame, best = _run_family(family, budget, out)
        claims += network_rows(frame, best, family, budget, reduced, command)
        seconds[family] = round(time.perf_counter() - begin, 1)
    begin = time.perf_counter()
    rows = perceptron_alpha.main([*budget.perceptron, "--workers", "1", "--out", str(out / "perceptron")])
    claims += perceptron_rows(rows, budget, reduced, command)
    seconds["perceptron"] = round(time.perf_counter() - begin, 1)
    (out / "claims.md").write_text(claims_table(claims))
    settings = {"budget": dataclasses.asdict(budget), "reduced": reduced, "seconds": seconds,
                "wall_seconds": round(time.perf_counter() - start, 1), "command": command}
    (out / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    return claims


def main(argv: list[str] | None = None) -> None:
    """Run ``claim_rows`` from the command line and print the rows.

    Args:
        argv: ``[--reduced] [--out DIR]`` (``None``: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(prog="python -m experiments.claims_mcover",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true", help="the CI setting (about a minute)")
    parser.add_argument("--out", type=Path, default=results_dir("claims/mcover"))
    args = parser.parse_args(argv)
    for row in claim_rows(args.out, reduced=args.reduced):
        print(f"claims_mcover: {row.verdict}: {row.claim} | {row.reference} | {row.ours} | {row.baseline}")


if __name__ == "__main__":
    main()
