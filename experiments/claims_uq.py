r"""LL-GLM vs DNN-GLM ("Is the last layer sufficient for uncertainty quantification?").

The seed paper's claims, measured on its own setting: a LeNet-5 trained on Fashion-MNIST,
OOD inputs from MNIST (here MNIST-5k, the MNIST that ships offline), S = 10. One network
is trained (seed 0, SWAG moments collected on the way); every method then tests the same
weights on the same data:

* the paper's sampler (``LastLayerSampler(posterior="least_squares_logits")``, the
  LinearSampling package's algorithm) for LL-GLM (20 epochs, batch 56, lr 1e-2) and
  DNN-GLM (10 epochs, batch 152, lr 1e-2), with gamma and the predictive scale chosen by
  validation LPPD, and again with the paper's fixed gamma (1 and 0.01) and scale 1;
* our exact linearised-Laplace (GGN) posterior (``posterior="laplace_ggn"``): LL-GLM with
  lambda from a validation-LPPD grid, DNN-GLM with that lambda and a few CG steps;
* MC-dropout (p = 0.1), SWAG, last-layer Laplace (laplace-torch, kron, marglik) and a deep
  ensemble of M networks (seeds 0..M-1).

VARROC follows the reference's protocol: the GLM rows score the MAP network's predicted
class (``varroc_prediction="map"``; the predictive mean's class is reported beside it),
the other methods their own predictive mean's. ``seconds`` is preparation + test of a
method (the deep ensemble's and MAP's training time is ``train_seconds``); ``peak_mib``
is the growth of the process's resident memory during that time (``PeakRSS``: sampled
from ``/proc/self/statm`` every 5 ms, after ``malloc_trim``; not ``tracemalloc``, which
does not see torch's tensors, nor ``ru_maxrss``, which cannot be reset between methods).

Outputs under ``out``: ``uq_methods.csv`` / ``.md`` (one row per method), ``claims.md``
(the claim rows), ``linear_sampling_grid.csv`` (validation LPPD of every gamma and scale
tried) and ``settings.json`` (the budget actually run, with what was reduced).

Example::

    OMP_NUM_THREADS=1 python -m experiments.claims_uq --out docs/results/claims/uq
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import importlib.util
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import pandas as pd
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, Subset

from experiments.claim_rows import ClaimRow, Verdict, mean_std
from experiments.runs import quiet_lightning, results_dir
from experiments.uq_comparison import COLUMNS, GRID, evaluate, train
from ripieno.callbacks import (
    DeepEnsembleSampler,
    LaplaceGGN,
    LaplaceSampler,
    LastLayerSampler,
    LeastSquaresLogits,
    MCDropoutSampler,
    SamplerEvaluation,
    SWAGSampler,
)
from ripieno.framework.runner.recipes import find_recipe

RECIPE = "uq/dnn_glm_lenet_fashion_mnist_reference"
#: The reference's amended results on LeNet / Fashion-MNIST: (VARROC-ID, VARROC-OOD).
PAPER = {"DNN-GLM": (0.8824, 0.9360), "LL-GLM": (0.8758, 0.8489), "deep ensemble": (0.8773, 0.9364)}
#: The reference's gamma per GLM; the grids around them (one solve serves a whole gamma grid).
PAPER_GAMMA = {"LL-GLM": 1.0, "DNN-GLM": 0.01}
GAMMA_GRID = {"LL-GLM": [0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0],
              "DNN-GLM": [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0]}
SCALE_GRID = [0.5, 0.75, 1.0, 1.25, 1.5, 2.0]
#: "Competitive": a VARROC at most this far below the deep ensemble's; "beats": more than it.
MARGIN = 0.02
EXTRA_COLUMNS = {"uq/gamma": "gamma", "uq/predictive_scale": "predictive_scale"}
MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Budget:
    """What one run trains and solves.

    Attributes:
        train_epochs: epochs of every network (MAP, ensemble members).
        members: deep-ensemble size M.
        max_train_rows: cap on the training pool (train + validation); ``None``: all 60,000.
        test_rows: test images kept (a seeded subset); ``None``: all 10,000.
        ood_rows: OOD images kept; ``None``: all 5,000.
        ll_epochs: LL-GLM solve epochs (the paper: 20).
        dnn_epochs: DNN-GLM solve epochs (the paper: 10).
        dnn_cg_iters: CG iterations of the exact DNN-GLM.
        samples: S of every sampling method.
    """

    train_epochs: int
    members: int
    max_train_rows: int | None
    test_rows: int | None
    ood_rows: int | None
    ll_epochs: int
    dnn_epochs: int
    dnn_cg_iters: int
    samples: int = 10


FULL = Budget(train_epochs=15, members=5, max_train_rows=None, test_rows=None, ood_rows=None,
              ll_epochs=20, dnn_epochs=10, dnn_cg_iters=10)
REDUCED = Budget(train_epochs=4, members=2, max_train_rows=3000, test_rows=1000, ood_rows=500,
                 ll_epochs=20, dnn_epochs=1, dnn_cg_iters=2)


class PeakRSS:
    """Peak growth of this process's resident memory while the block runs (MiB).

    A thread reads ``/proc/self/statm`` every ``interval`` seconds; freed heap is handed
    back to the system (``malloc_trim``) before the start value is read, so that an earlier
    method's freed pages do not hide this one's. ``nan`` where ``/proc`` is missing.
    """

    def __init__(self, interval: float = 0.005) -> None:
        self.interval, self.peak_mib = interval, float("nan")
        self._stop = threading.Event()
        self._page = 4096
        self._peak = self._start = 0

    def _rss(self) -> int:
        with open("/proc/self/statm") as handle:
            return int(handle.read().split()[1]) * self._page

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, self._rss())

    def __enter__(self) -> PeakRSS:
        gc.collect()
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass
        if not Path("/proc/self/statm").is_file():
            return self
        import resource

        self._page = resource.getpagesize()
        self._start = self._peak = self._rss()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._start:
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, self._rss())
            self.peak_mib = (self._peak - self._start) / MIB


class TestSubset(L.LightningDataModule):
    """A trained run's datamodule with its test loaders cut to seeded subsets.

    Args:
        data: the (set-up) datamodule; training and validation data are its own.
        rows: rows kept per test loader (ID test, OOD), ``None`` keeps a loader whole.
        seed: seed of the subsets.
    """

    def __init__(self, data: L.LightningDataModule, rows: list[int | None], seed: int = 0) -> None:
        super().__init__()
        self.data, self.rows, self.seed = data, rows, seed

    def train_dataloader(self) -> Any:  # noqa: ANN401
        """The run's training loader."""
        return self.data.train_dataloader()

    def val_dataloader(self) -> Any:  # noqa: ANN401
        """The run's validation loader."""
        return self.data.val_dataloader()

    def test_dataloader(self) -> list[DataLoader]:
        """Each test loader on a seeded subset of its rows, in their original order."""
        loaders = self.data.test_dataloader()
        loaders = loaders if isinstance(loaders, list) else [loaders]
        out = []
        for loader, keep in zip(loaders, self.rows, strict=False):
            n = len(loader.dataset)
            if keep is not None and keep < n:
                generator = torch.Generator().manual_seed(self.seed)
                index = torch.randperm(n, generator=generator)[:keep].sort().values.tolist()
                loader = DataLoader(Subset(loader.dataset, index), batch_size=loader.batch_size,
                                    collate_fn=loader.collate_fn)
            out.append(loader)
        return out


def _measured(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    with PeakRSS() as peak:
        row = run()
    return {**row, "peak_mib": round(peak.peak_mib, 1)}

#: Every baseline sampler's evaluation: the second test loader holds the OOD rows.
OOD = SamplerEvaluation(ood_dataloader_idx=1)


def _glm(glm: str, budget: Budget, **kwargs: Any) -> LastLayerSampler:  # noqa: ANN401
    return LastLayerSampler(glm=glm, n_samples=budget.samples, progress_bar=False,
                            evaluation=dataclasses.replace(OOD, varroc_prediction="map"), **kwargs)


def _run_methods(budget: Budget, out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Train the networks and test every method; the table's rows and the LinearSampling grids.

    The grids' rows are ``glm``, ``gamma``, ``predictive_scale`` and their validation LPPD.
    """
    recipe, root = find_recipe(RECIPE), out / "runs"
    overrides = [f"--trainer.max_epochs={budget.train_epochs}"]
    if budget.max_train_rows is not None:
        overrides.append(f"--data.init_args.max_train_rows={budget.max_train_rows}")
    s, rows, grids, train_seconds = budget.samples, [], [], {}
    with quiet_lightning():
        swag = SWAGSampler(n_samples=s, swa_start=0.5, evaluation=OOD)
        start = time.perf_counter()
        cli = train(recipe, 0, root / "seed0", overrides, [swag])
        train_seconds["MAP"] = time.perf_counter() - start
        checkpoints = [root / "seed0.ckpt"]
        cli.trainer.save_checkpoint(checkpoints[0])
        data = cli.datamodule
        if budget.test_rows is not None or budget.ood_rows is not None:
            data = TestSubset(cli.datamodule, [budget.test_rows, budget.ood_rows])

        def test(name: str, callback: Callback | None, **extra: Any) -> dict[str, Any]:  # noqa: ANN401
            row = _measured(lambda: evaluate(cli, name, callback, root, data, {**COLUMNS, **EXTRA_COLUMNS}))
            row.update(extra)
            print(f"claims_uq: {row}", flush=True)
            return row

        def with_mean_varroc(row: dict[str, Any], callback: LastLayerSampler) -> dict[str, Any]:
            """The same posterior, VARROC on the predictive mean's class (no refit)."""
            callback.varroc_prediction = "predictive_mean"
            again = evaluate(cli, row["method"], callback, root, data)
            callback.varroc_prediction = "map"
            return {**row, "varroc_id_mean": again["varroc_id"], "varroc_ood_mean": again["varroc_ood"]}

        rows.append(test("MAP (LeNet-5)", None, varroc="-", train_seconds=round(train_seconds["MAP"], 1)))
        solves = (("LL-GLM", "last_layer", budget.ll_epochs), ("DNN-GLM", "full", budget.dnn_epochs))
        for label, glm, epochs in solves:
            posterior = LeastSquaresLogits(epochs=epochs, gamma_grid=GAMMA_GRID[label],
                                           predictive_scale_grid=SCALE_GRID)
            callback = _glm(glm, budget, posterior=posterior)
            row = test(f"{label} (LinearSampling)", callback, posterior="least_squares_logits", varroc="map")
            rows.append(with_mean_varroc(row, callback))
            grids += [{"glm": label, "gamma": g, "predictive_scale": c, "val_lppd": round(v, 5)}
                      for (g, c), v in callback.grid_lppd.items()]
            sampler = callback.sampler
            sampler.gamma, sampler.scale = PAPER_GAMMA[label], 1.0  # the paper's fixed values, same solve
            callback.chosen_gamma, callback.chosen_predictive_scale = sampler.gamma, sampler.scale
            row = evaluate(cli, f"{label} (LinearSampling, paper's gamma, scale 1)", callback, root, data,
                           {**COLUMNS, **EXTRA_COLUMNS})
            rows.append({**row, "seconds": None, "posterior": "least_squares_logits", "varroc": "map"})
        ll_ggn = _glm("last_layer", budget, posterior=LaplaceGGN(prior_precision_grid=GRID))
        row = test("LL-GLM (exact GGN)", ll_ggn, posterior="laplace_ggn", varroc="map")
        rows.append(with_mean_varroc(row, ll_ggn))
        dnn_ggn = _glm("full", budget, posterior=LaplaceGGN(max_iters=budget.dnn_cg_iters,
                                                             prior_precision=ll_ggn.chosen_prior_precision))
        rows.append(with_mean_varroc(test(f"DNN-GLM (GGN, {budget.dnn_cg_iters} CG steps)", dnn_ggn,
                                          posterior="laplace_ggn", varroc="map"), dnn_ggn))
        rows.append(test("MC-dropout (p=0.1)", MCDropoutSampler(n_samples=s, evaluation=OOD),
                         varroc="predictive mean"))
        rows.append(test("SWAG (second half of training)", swag, varroc="predictive mean"))
        if importlib.util.find_spec("laplace") is not None:  # optional dependency
            laplace = LaplaceSampler(n_samples=s, evaluation=OOD)
            rows.append(test("Laplace (laplace-torch, LL, kron, marglik)", laplace, varroc="predictive mean"))
        start = time.perf_counter()
        for seed in range(1, budget.members):
            member = train(recipe, seed, root / f"seed{seed}", overrides, [])
            checkpoints.append(root / f"seed{seed}.ckpt")
            member.trainer.save_checkpoint(checkpoints[-1])
        train_seconds["deep ensemble"] = train_seconds["MAP"] + time.perf_counter() - start
        ensemble = DeepEnsembleSampler([str(c) for c in checkpoints], evaluation=OOD)
        rows.append(test(f"deep ensemble (M={budget.members})", ensemble, varroc="predictive mean",
                         train_seconds=round(train_seconds["deep ensemble"], 1)))
    return rows, grids


def _row(rows: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    return next(r for r in rows if r["method"].startswith(prefix))


def _value(row: dict[str, Any], key: str) -> float:
    value = row.get(key)
    return float("nan") if value is None else float(value)


def _verdict(parts: list[bool]) -> Verdict:
    return "reproduced" if all(parts) else "partly" if any(parts) else "not reproduced"


def _claims(rows: list[dict[str, Any]], budget: Budget, reduced: bool, command: str) -> list[ClaimRow]:
    """The paper's claims as rows, from the measured table."""
    ls = {g: _row(rows, f"{g} (LinearSampling)") for g in ("LL-GLM", "DNN-GLM")}
    ggn = {"LL-GLM": _row(rows, "LL-GLM (exact GGN)"), "DNN-GLM": _row(rows, "DNN-GLM (GGN")}
    de = _row(rows, "deep ensemble")
    data = (f"LeNet-5 on Fashion-MNIST ({'reduced: ' if reduced else ''}{budget.train_epochs} epochs"
            f"{f', {budget.max_train_rows} training images' if budget.max_train_rows else ''}), OOD MNIST-5k,"
            f" S={budget.samples}")
    seeds = "0 (deep ensemble: 0-" + str(budget.members - 1) + ")"

    def varroc(row: dict[str, Any]) -> str:
        return f"{mean_std([_value(row, 'varroc_id')])} / {mean_std([_value(row, 'varroc_ood')])}"

    def finish(verdict: Verdict, note: str) -> tuple[Verdict, str]:
        if reduced:
            return "inconclusive", f"Reduced CI setting; the full setting's rule gives {verdict!r}. {note}"
        return verdict, note

    paper_de = PAPER["deep ensemble"]
    out = []
    gap = _value(ls["DNN-GLM"], "varroc_ood") - _value(ls["LL-GLM"], "varroc_ood")
    ours_gap = _value(ggn["DNN-GLM"], "varroc_ood") - _value(ggn["LL-GLM"], "varroc_ood")
    rule: Verdict = "reproduced" if gap > MARGIN else "not reproduced" if gap < -MARGIN else "inconclusive"
    verdict, note = finish(rule, f"DNN-GLM minus LL-GLM VARROC-OOD: {gap:+.3f} with the paper's sampler,"
                                 f" {ours_gap:+.3f} with the exact GGN posterior (paper: +0.087);"
                                 f" 'beats' needs more than {MARGIN} on one seed.")
    out.append(ClaimRow(
        method="LL-GLM / DNN-GLM", data=data,
        claim="DNN-GLM separates OOD inputs better than LL-GLM (VARROC-OOD).",
        reference=f"VARROC-OOD DNN-GLM {_value(ls['DNN-GLM'], 'varroc_ood'):.3f} vs LL-GLM"
                  f" {_value(ls['LL-GLM'], 'varroc_ood'):.3f} (LinearSampling; paper .936 vs .849)",
        ours=f"VARROC-OOD DNN-GLM {_value(ggn['DNN-GLM'], 'varroc_ood'):.3f} vs LL-GLM"
             f" {_value(ggn['LL-GLM'], 'varroc_ood'):.3f} (exact GGN)",
        baseline=f"deep ensemble VARROC-OOD {_value(de, 'varroc_ood'):.3f} (paper {paper_de[1]:.3f})",
        seeds=seeds, command=command, verdict=verdict, note=note))
    for label, claim, paper_note in (
        ("DNN-GLM", "DNN-GLM is competitive with a deep ensemble on VARROC-ID and VARROC-OOD.",
         "paper .882 / .936 vs .877 / .936"),
        ("LL-GLM", "LL-GLM is competitive with a deep ensemble on VARROC-ID and VARROC-OOD.",
         "paper .876 / .849 vs .877 / .936: competitive on ID only"),
    ):
        row = ls[label]
        parts = [_value(row, k) >= _value(de, k) - MARGIN for k in ("varroc_id", "varroc_ood")]
        answers = ["yes" if part else "no" for part in parts]
        verdict, note = finish(_verdict(parts), f"Competitive = at most {MARGIN} below the deep"
                                                f" ensemble; ID {answers[0]}, OOD {answers[1]}"
                                                f" ({paper_note}). One seed.")
        out.append(ClaimRow(
            method="LL-GLM / DNN-GLM", claim=claim, data=data,
            reference=f"VARROC-ID / -OOD {varroc(row)} (LinearSampling)",
            ours=f"VARROC-ID / -OOD {varroc(ggn[label])} (exact GGN)",
            baseline=f"deep ensemble (M={budget.members}) {varroc(de)}", seeds=seeds, command=command,
            verdict=verdict, note=note))
    time_ratio = _value(ls["DNN-GLM"], "seconds") / _value(ls["LL-GLM"], "seconds")
    memory_ratio = _value(ls["DNN-GLM"], "peak_mib") / max(_value(ls["LL-GLM"], "peak_mib"), 1.0)
    ours_time = _value(ggn["DNN-GLM"], "seconds") / _value(ggn["LL-GLM"], "seconds")
    parts = [time_ratio >= 10.0, memory_ratio >= 3.5]
    verdict, note = finish(_verdict(parts), "Targets of the issue: at least 10x less time and 3.5x less"
                                            " peak memory (peak RSS growth, LL-GLM's floored at 1 MiB)."
                                            " One seed, one CPU core.")
    out.append(ClaimRow(
        method="LL-GLM / DNN-GLM", claim="LL-GLM costs far less time and memory than DNN-GLM.", data=data,
        reference=f"DNN/LL: {time_ratio:.1f}x seconds, {memory_ratio:.1f}x peak MiB (LinearSampling,"
                  f" {_value(ls['DNN-GLM'], 'seconds'):.0f} s vs {_value(ls['LL-GLM'], 'seconds'):.0f} s)",
        ours=f"DNN/LL: {ours_time:.1f}x seconds (exact GGN, DNN-GLM at {budget.dnn_cg_iters} CG steps)",
        baseline=f"deep ensemble: {_value(de, 'train_seconds'):.0f} s of training,"
                 f" {_value(de, 'seconds'):.0f} s to test",
        seeds=seeds, command=command, verdict=verdict, note=note))
    return out


def _markdown(frame: pd.DataFrame) -> str:
    """A GitHub markdown table (no ``tabulate`` needed); empty cells for missing values."""
    def cell(value: Any) -> str:  # noqa: ANN401
        return "" if value is None or (isinstance(value, float) and value != value) else str(value)

    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def claim_rows(out: Path, *, reduced: bool) -> list[ClaimRow]:
    """Run the comparison, write its tables under ``out``, return the claim rows.

    Args:
        out: output folder (created).
        reduced: the CI setting (``REDUCED``: 3,000 training images, 4 epochs, subsets of the
            test sets, about a minute) instead of ``FULL``.

    Returns:
        One row per claim: DNN-GLM beats LL-GLM on VARROC-OOD; DNN-GLM and LL-GLM are
        each competitive with a deep ensemble; LL-GLM is much cheaper.
    """
    budget = REDUCED if reduced else FULL
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    rows, grids = _run_methods(budget, out)
    wall = time.perf_counter() - start
    command = "OMP_NUM_THREADS=1 python -m experiments.claims_uq" + (" --reduced" if reduced else "")
    command += f" --out {out}"
    claims = _claims(rows, budget, reduced, command)
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "uq_methods.csv", index=False)
    pd.DataFrame(grids).to_csv(out / "linear_sampling_grid.csv", index=False)
    (out / "uq_methods.md").write_text(_markdown(frame) + "\n")
    claim_frame = pd.DataFrame([dataclasses.asdict(c) for c in claims])
    (out / "claims.md").write_text(_markdown(claim_frame) + "\n")
    settings = {"budget": dataclasses.asdict(budget), "reduced": reduced, "wall_seconds": round(wall, 1),
                "torch_threads": torch.get_num_threads(), "recipe": RECIPE, "paper": PAPER,
                "gamma_grid": GAMMA_GRID, "predictive_scale_grid": SCALE_GRID, "prior_precision_grid": GRID,
                "command": command}
    (out / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    return claims


def main(argv: list[str] | None = None) -> None:
    """Run ``claim_rows`` from the command line and print the rows.

    Args:
        argv: ``[--reduced] [--out DIR]`` (``None``: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(prog="python -m experiments.claims_uq",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true", help="the CI setting (about a minute)")
    parser.add_argument("--out", type=Path, default=results_dir("claims/uq"))
    args = parser.parse_args(argv)
    for row in claim_rows(args.out, reduced=args.reduced):
        print(f"claims_uq: {row.verdict}: {row.claim} | {row.reference} | {row.ours} | {row.baseline}")


if __name__ == "__main__":
    main()
