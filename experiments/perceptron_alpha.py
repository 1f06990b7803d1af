r"""Generalisation of the binary teacher-student perceptron versus alpha: plain, replicated and M-cover SA.

For every ``alpha`` and seed, one data set (teacher, ``P = round(alpha N)`` Gaussian
patterns) is annealed by three methods with the same number of proposals per copy
(``--sweeps`` sweeps of ``N`` proposals each) and the same ``beta`` ramp
(``--beta0`` to ``--beta1``, geometric):

* ``plain``: one copy (``M = 1``), textbook simulated annealing;
* ``replicated``: ``M`` copies, identity routing, replica coupling
  ``gamma_t = gamma0 (1 + gamma_growth)^t`` growing from ``--gamma0`` to ``--gamma1`` over
  the sweeps (Baldassi et al. 2016, "robust ensembles");
* ``mcover``: ``M`` copies routed by permutations from a Gaussian ring kernel
  (``--sigma``, ``--n_blocks`` blocks of inputs, a fresh permutation every
  ``--resample_every`` sweeps), no coupling.

Reported per run: the generalisation error of every collapse rule
(``ripieno.framework.mcover.collapse``): ``mean_weights`` (the collapsed student
``sign(sum_a w_a)``, also reported as ``gen_error_collapsed``), ``best_copy`` (the copy with
the fewest errors on ``--n_val`` fresh validation patterns from the same teacher, never
the teacher itself) and ``copy_average`` (the copies' majority vote, estimated by
``vote_generalization_error``); the mean of the copies' own errors, the final training
errors and the wall time.
References: the replica-symmetric Gibbs error on the poor-generalisation branch (the
fixed point reached from ``q = 0``; thermodynamically correct below ``alpha_c ~ 1.245``,
where perfect generalisation becomes the equilibrium state (Gyorgyi 1990), and existing
up to its spinodal ``~ 1.49``), and the Bayes-optimal error on the same branch.

Outputs under ``--out``: ``results.csv`` (one row per run), ``summary.md`` (mean +- std
per method and alpha, with the references) and ``gen_error_vs_alpha.png``.

Example (about 5 minutes on 2 CPU cores; ``--out`` defaults to the repository's
``docs/results/mcover_perceptron``, from any folder)::

    python -m experiments.perceptron_alpha --n 500 --alphas 0.5 1.0 1.5 2.0 --seeds 3
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ripieno.framework.mcover.collapse import COLLAPSE_RULES, best_copy_index
from ripieno.framework.mcover.kernels import make_kernel
from ripieno.framework.mcover.perceptron import (
    AnnealingSchedule,
    RoutedPerceptronAnnealer,
    generalization_error,
    teacher_student_data,
    vote_generalization_error,
)
from ripieno.framework.mcover.permutations import PermutationBank

METHODS: tuple[str, ...] = ("plain", "replicated", "mcover")
#: The generalisation error of each collapse rule, per run.
RULE_COLUMNS: tuple[str, ...] = tuple(f"gen_error_{rule}" for rule in COLLAPSE_RULES)
ALPHA_C = 1.245  # first-order transition to perfect generalisation (Gyorgyi 1990)


# ---------------------------------------------------------------- replica theory
def _gauss_hermite(n: int = 201) -> tuple[np.ndarray, np.ndarray]:
    nodes, weights = np.polynomial.hermite_e.hermegauss(n)
    return nodes, weights / weights.sum()


def replica_overlap(alpha: float, q0: float = 1e-3, tol: float = 1e-12, max_iters: int = 20_000) -> float:
    """Replica-symmetric overlap ``q = R`` of Gibbs learning, iterated from ``q0``.

    Bayes-optimal (Nishimori) fixed point of the binary teacher-student perceptron:
    ``q_hat = 2 alpha E_xi[N(u)^2 / ((1 - q) H(u))]`` with ``u = xi sqrt(q / (1 - q))``
    and ``q = E_z tanh(q_hat + sqrt(q_hat) z)``, ``N`` the normal density and ``H`` its
    upper tail. From small ``q0`` it follows the poor-generalisation branch, which ends
    at the spinodal (about ``alpha = 1.49``); beyond it the iteration reaches ``q = 1``.
    """
    from scipy.special import log_ndtr

    nodes, weights = _gauss_hermite()
    q = q0
    for _ in range(max_iters):
        v = 1.0 - q
        u = nodes * math.sqrt(q / v)
        log_ratio = -u**2 - math.log(2 * math.pi) - log_ndtr(-u)  # log(N(u)^2 / H(u))
        q_hat = 2 * alpha * float(np.sum(weights * np.exp(log_ratio))) / v
        q_new = min(float(np.sum(weights * np.tanh(q_hat + math.sqrt(q_hat) * nodes))), 1.0 - 1e-12)
        if abs(q_new - q) < tol:
            return q_new
        q = 0.5 * q + 0.5 * q_new
    return q


def replica_errors(alpha: float) -> dict[str, float]:
    """Gibbs (``arccos(q) / pi``) and Bayes-optimal (``arccos(sqrt q) / pi``) errors, RS, from ``q = 0``."""
    q = replica_overlap(alpha)
    return {"gibbs": math.acos(q) / math.pi, "bayes": math.acos(math.sqrt(q)) / math.pi}


def spinodal(lo: float = 1.0, hi: float = 2.0, tol: float = 1e-3) -> float:
    """Largest ``alpha`` at which the poor-generalisation RS branch exists (bisection)."""
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if replica_overlap(mid) < 0.99 else (lo, mid)
    return 0.5 * (lo + hi)


# ------------------------------------------------------------------------- runs
def run_one(task: dict[str, Any]) -> dict[str, Any]:
    """Anneal one (method, alpha, seed) and return its result row."""
    method, alpha, seed, n, m = task["method"], task["alpha"], task["seed"], task["n"], task["m"]
    data_seed = 1_000 * seed + round(1_000 * alpha)
    data_generator = torch.Generator().manual_seed(data_seed)
    x, y, teacher = teacher_student_data(n, round(alpha * n), generator=data_generator)
    copies = 1 if method == "plain" else m
    schedule = AnnealingSchedule(
        n_sweeps=task["sweeps"], beta0=task["beta0"], beta1=task["beta1"],
        gamma0=task["gamma0"] if method == "replicated" else 0.0,
        gamma_growth=task["gamma_growth"] if method == "replicated" else 0.0,
        resample_every=task["resample_every"],
    )
    n_blocks, bank = 1, None
    if method == "mcover":
        n_blocks = task["n_blocks"]
        periods = math.ceil(task["sweeps"] / task["resample_every"])
        bank = PermutationBank.draw(make_kernel("gaussian_ring", m, sigma=task["sigma"]), n_blocks, periods,
                                    torch.Generator().manual_seed(10_000 + seed))
    start = time.perf_counter()
    annealer = RoutedPerceptronAnnealer(x, y, copies, n_blocks, schedule,
                                        generator=torch.Generator().manual_seed(seed), bank=bank)
    annealer.anneal()
    seconds = time.perf_counter() - start
    summary = annealer.summary(teacher)
    w = annealer.weights()
    x_val, y_val, _ = teacher_student_data(n, task["n_val"], generator=data_generator, teacher=teacher)
    best = best_copy_index(((x_val @ w.T > 0).double() * 2 - 1 == y_val[:, None]).double().mean(0))
    return {
        "method": method, "alpha": alpha, "seed": seed, "n": n, "m": copies, "sweeps": task["sweeps"],
        "gen_error_collapsed": summary["gen_error_collapsed"],
        "gen_error_mean_weights": summary["gen_error_collapsed"],
        "gen_error_best_copy": float(generalization_error(w[best], teacher)),
        "gen_error_copy_average": float(vote_generalization_error(w, teacher)),
        "best_copy": best,
        "gen_error_copies": summary["gen_error_copies"],
        "train_energy": float(annealer.energies().double().mean()),
        "train_error_routed": summary["train_error_routed"],
        "train_error_collapsed": summary["train_error_collapsed"],
        "acceptance": annealer.accepted / (task["sweeps"] * copies * n),
        "seconds": seconds,
    }


def _one_torch_thread() -> None:
    """Pool initializer: each worker process computes on one core."""
    torch.set_num_threads(1)


def run_all(tasks: Sequence[dict[str, Any]], workers: int) -> list[dict[str, Any]]:
    """Run tasks (most expensive first) in ``workers`` processes; rows in task order.

    Every task computes with one torch thread; with ``workers <= 1`` they run in this
    process, whose thread count is restored afterwards.
    """
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i]["m"] * tasks[i]["alpha"])
    if workers <= 1:
        threads = torch.get_num_threads()
        _one_torch_thread()
        try:
            done = [run_one(tasks[i]) for i in order]
        finally:
            torch.set_num_threads(threads)
    else:
        with multiprocessing.get_context("fork").Pool(workers, initializer=_one_torch_thread) as pool:
            done = pool.map(run_one, [tasks[i] for i in order], chunksize=1)
    rows: list[dict[str, Any]] = [{}] * len(tasks)
    for i, row in zip(order, done, strict=True):
        rows[i] = row
    return rows


# ---------------------------------------------------------------------- outputs
def aggregate(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation per (method, alpha)."""
    groups: dict[tuple[str, float], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault((row["method"], row["alpha"]), []).append(row)
    out = []
    for (method, alpha), members in groups.items():
        entry: dict[str, Any] = {"method": method, "alpha": alpha, "runs": len(members)}
        for key in (*RULE_COLUMNS, "gen_error_collapsed", "gen_error_copies", "train_error_routed",
                    "seconds"):
            values = np.array([r[key] for r in members], dtype=float)
            entry[key] = float(values.mean())
            entry[key + "_std"] = float(values.std(ddof=1)) if len(values) > 1 else 0.0
        out.append(entry)
    return out


def write_summary(path: Path, rows: Sequence[dict[str, Any]], args: argparse.Namespace, total: float) -> None:
    """``summary.md``: settings, mean +- std per method and alpha, replica references."""
    stats = aggregate(rows)
    alphas = sorted({r["alpha"] for r in rows})
    refs = {a: replica_errors(a) for a in alphas}
    lines = [
        "# Binary teacher-student perceptron: plain vs replicated vs M-cover SA",
        "",
        f"N = {args.n}, Gaussian inputs, {args.seeds} seeds per alpha, {args.sweeps} sweeps per copy"
        f" (the same number of proposals per copy for every method), beta {args.beta0} -> {args.beta1}"
        " (geometric), Metropolis single-spin flips on the number of training errors.",
        f"replicated: M = {args.m}, gamma = {args.gamma0} (1 + {args.gamma_growth:.5f})^sweep"
        f" ({args.gamma0} -> {args.gamma1})."
        f" mcover: M = {args.m}, Gaussian ring kernel sigma = {args.sigma}, {args.n_blocks} input blocks,"
        f" a new permutation every {args.resample_every} sweeps, gamma = 0."
        " Errors are generalisation errors from the teacher: mean weights = sign(sum_a w_a), arccos(R)/pi;"
        f" best copy = the copy with the fewest errors on {args.n_val} fresh validation patterns;"
        " copy average = the copies' majority vote (Gaussian-field estimate, standard error <= 0.002).",
        f"Total wall time {total:.0f} s with {args.workers} worker processes.",
        "",
        "| method | alpha | mean weights | best copy (val.) | copy average (vote) | mean copy |"
        " routed train error | seconds/run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        for alpha in alphas:
            s = next((e for e in stats if e["method"] == method and e["alpha"] == alpha), None)
            if s is None:
                continue
            cells = [f"{s[key]:.3f} ± {s[key + '_std']:.3f}"
                     for key in (*RULE_COLUMNS, "gen_error_copies", "train_error_routed")]
            lines.append(f"| {method} | {alpha:g} | {' | '.join(cells)} | {s['seconds']:.1f} |")
    lines += [
        "",
        "Replica-theory references (replica-symmetric, computed by `replica_errors`; poor-generalisation"
        " branch from q = 0):",
        "",
        "| alpha | Gibbs error | Bayes-optimal error |",
        "|---|---|---|",
        *[f"| {a:g} | {refs[a]['gibbs']:.3f} | {refs[a]['bayes']:.3f} |" for a in alphas],
        "",
        f"Perfect generalisation is the equilibrium state above alpha_c ≈ {ALPHA_C} (Gyorgyi 1990); the"
        f" poor-generalisation branch ends at its spinodal alpha ≈ {spinodal():.2f} (computed), where the RS"
        " errors above drop to 0.",
        "",
    ]
    path.write_text("\n".join(lines))


def write_plot(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """Collapsed (solid) and mean-copy (dashed) errors per method, with the RS Gibbs curve."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    stats = aggregate(rows)
    fig = Figure(figsize=(6.4, 4.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    colors = {"plain": "tab:blue", "replicated": "tab:orange", "mcover": "tab:green"}
    for method in METHODS:
        entries = sorted((e for e in stats if e["method"] == method), key=lambda e: e["alpha"])
        if not entries:
            continue
        a = [e["alpha"] for e in entries]

        def column(key: str, entries: list[dict[str, Any]] = entries) -> list[float]:
            return [e[key] for e in entries]

        ax.errorbar(a, column("gen_error_collapsed"), column("gen_error_collapsed_std"), color=colors[method],
                    marker="o", capsize=3, label=f"{method} (collapsed)")
        if method != "plain":
            ax.errorbar(a, column("gen_error_copies"), column("gen_error_copies_std"), color=colors[method],
                        marker="s", ls="--", capsize=3, alpha=0.6, label=f"{method} (mean copy)")
    grid = np.linspace(0.05, max(max(r["alpha"] for r in rows), 1.5) + 0.1, 60)
    gibbs = np.array([replica_errors(float(g))["gibbs"] for g in grid])
    stable, poor = grid <= ALPHA_C, gibbs > 1e-3
    equilibrium = np.where(stable, gibbs, 0.0)  # perfect generalisation is the equilibrium above alpha_c
    ax.plot(grid, equilibrium, color="k", lw=1, label="Gibbs, RS theory (equilibrium)")
    ax.plot(grid[~stable & poor], gibbs[~stable & poor], color="k", lw=1, ls="--",
            label="Gibbs, RS, metastable branch")
    ax.axvline(ALPHA_C, color="grey", ls=":", label=f"alpha_c = {ALPHA_C}")
    ax.set_xlabel("alpha = P / N")
    ax.set_ylabel("generalisation error")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    ax.set_title("Binary teacher-student perceptron, simulated annealing")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# -------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line options (defaults: the documented experiment)."""
    from experiments.runs import results_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=500, help="inputs N")
    p.add_argument("--alphas", type=float, nargs="+", default=[0.5, 1.0, 1.5, 2.0])
    p.add_argument("--seeds", type=int, default=3, help="seeds 0 .. seeds-1 per alpha")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--m", type=int, default=5, help="copies of replicated and M-cover SA")
    p.add_argument("--sweeps", type=int, default=1500, help="sweeps (N proposals per copy each)")
    p.add_argument("--beta0", type=float, default=0.5)
    p.add_argument("--beta1", type=float, default=5.0)
    p.add_argument("--gamma0", type=float, default=0.1, help="replicated: coupling at the first sweep")
    p.add_argument("--gamma1", type=float, default=5.0,
                   help="replicated: coupling at the last sweep (geometric growth in between)")
    p.add_argument("--sigma", type=float, default=0.5, help="mcover: Gaussian ring width")
    p.add_argument("--n_blocks", type=int, default=5, help="mcover: input blocks (routing slots)")
    p.add_argument("--resample_every", type=int, default=20, help="mcover: sweeps per permutation")
    p.add_argument("--n_val", type=int, default=1000, help="validation patterns that choose the best copy")
    p.add_argument("--workers", type=int, default=2, help="processes (one core each)")
    p.add_argument("--out", type=Path, default=results_dir("mcover_perceptron"))
    args = p.parse_args(argv)
    if min(args.n, args.m, args.sweeps) < 2 or min(args.seeds, args.n_val) < 1 or min(args.alphas) <= 0:
        p.error("need n >= 2, seeds >= 1, m >= 2, sweeps >= 2, n_val >= 1 and alphas > 0")
    if not 0 < args.gamma0 <= args.gamma1:
        p.error("need 0 < gamma0 <= gamma1")
    args.gamma_growth = (args.gamma1 / args.gamma0) ** (1 / (args.sweeps - 1)) - 1
    return args


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Run the experiment and write ``results.csv``, ``summary.md`` and ``gen_error_vs_alpha.png``."""
    from experiments.runs import format_table, write_csv

    args = parse_args(argv)
    common = {k: getattr(args, k) for k in ("n", "m", "sweeps", "beta0", "beta1", "gamma0", "gamma_growth",
                                            "sigma", "n_blocks", "resample_every", "n_val")}
    tasks = [{"method": method, "alpha": alpha, "seed": seed, **common}
             for alpha in args.alphas for seed in range(args.seeds) for method in args.methods]
    start = time.perf_counter()
    rows = run_all(tasks, args.workers)
    total = time.perf_counter() - start
    args.out.mkdir(parents=True, exist_ok=True)
    write_csv(args.out / "results.csv", rows)
    write_summary(args.out / "summary.md", rows, args, total)
    write_plot(args.out / "gen_error_vs_alpha.png", rows)
    print(format_table(aggregate(rows), ["method", "alpha", *RULE_COLUMNS, "gen_error_copies", "seconds"]))
    print(f"perceptron_alpha: {len(rows)} runs in {total:.0f} s; outputs in {args.out}")
    return rows


if __name__ == "__main__":
    main()
