"""``ripieno benchmark``: every model on every table of a benchmark file, resumable and shared.

``ripieno benchmark -c benchmarks/tabular_cpu`` fits each (data set, model, seed) cell of the file
(``config``) once, records it in a store in the output folder (``runs/benchmark/<name>``), and writes
``results.csv`` (one row per finished cell), ``report.md``, ``ranks.png`` and ``coverage.png``. Run
the same command again to continue a stopped benchmark (finished cells are never rerun);
``--workers N`` runs N processes here, and commands on several machines given one ``--storage``
(``ripieno tune``'s storages: a database URL or a journal file on a shared disk) split the cells
between them.

The output folder holds one benchmark and nothing of the user's (``store_folders``). Each cell
records what decided its result (``cells.cell_fingerprint``): a rerun whose file changed a
finished cell's model, data arguments, table or conformal settings is refused, naming the first change, unless
``--refit_changed`` fits those cells again (the report says which). Ctrl-C stops the running cell
(it runs again when the command is repeated), writes the report from the store and says so; a
benchmark none of whose cells finished ends with a non-zero status.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from ripieno.framework.cli.benchmark import cells
from ripieno.framework.cli.benchmark.config import (
    BenchmarkConfig,
    datamodule_class,
    list_benchmarks,
    load_benchmark,
    table_identity,
)
from ripieno.framework.cli.benchmark.models import GBDT_KINDS, PRIMARY, iteration_cap
from ripieno.framework.cli.benchmark.report import coverage_figure, rank_figure, render, summary
from ripieno.framework.cli.fingerprints import first_difference
from ripieno.framework.cli.help_text import plain
from ripieno.framework.cli.interrupts import fits_interrupted, join_workers, stop_with_parent
from ripieno.framework.cli.store_folders import check_folder, claim_folder, folder_name
from ripieno.framework.cli.tune.study_storage import ERROR_ATTR, check_storage, open_storage
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.extras import require
from ripieno.framework.messages import command_output, get_logger, quiet_lightning
from ripieno.framework.outputs.output_files import atomic_output

log = get_logger(__name__)

OUT_ROOT = Path("runs") / "benchmark"
STORE_FILE = "benchmark.db"
"""The default store's file in the output folder."""
FIT_WARNINGS = (
    ".*does not have many workers.*",
    ".*isinstance.treespec, LeafSpec.*",
    ".*GPU available but not used.*",
    ".*_validate_eval_set_Xy.*",
    ".*is experimental.*",
    ".*'force_all_finite' was renamed.*",
)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``ripieno benchmark``."""
    parser = argparse.ArgumentParser(prog="ripieno benchmark", description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument(
        "-c",
        "--config",
        required=True,
        help=f"a benchmark file or a shipped one ({', '.join(list_benchmarks()) or 'none'})",
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="output folder (default runs/benchmark/<name>)"
    )
    parser.add_argument(
        "--storage", default=None, help="a shared store: an Optuna storage URL or journal file"
    )
    parser.add_argument("--workers", type=int, default=1, help="processes on this machine sharing the cells")
    parser.add_argument("--datasets", nargs="+", default=None, help="only these data sets' cells")
    parser.add_argument("--models", nargs="+", default=None, help="only these models' cells")
    parser.add_argument(
        "--retry_failed", action="store_true", help="run again the cells that failed by an error"
    )
    parser.add_argument(
        "--refit_changed",
        action="store_true",
        help="fit again the finished cells whose model, data arguments, table or conformal settings"
        " changed since (without it, such a rerun is refused)",
    )
    parser.add_argument(
        "--report_only", action="store_true", help="write results.csv and report.md, fit nothing"
    )
    parser.add_argument(
        "--heartbeat", type=int, default=30, help="seconds between a running cell's signs of life"
    )
    return parser


def benchmark_main(argv: list[str]) -> None:
    """``ripieno benchmark`` (module docstring); Optuna's own log lines are off while it runs."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        _benchmark(argv)
    finally:
        optuna.logging.set_verbosity(verbosity)


def _benchmark(argv: list[str]) -> None:
    options = build_parser().parse_args(argv)
    try:
        plan = _plan(options)
    except RipienoInputError as error:
        raise SystemExit(f"ripieno: error: {str(error).splitlines()[0]}") from None
    config, out, url = plan.config, plan.out, plan.url
    datasets = list(dict.fromkeys(c.dataset for c in plan.wanted))
    models = list(dict.fromkeys(c.model for c in plan.wanted))
    if not options.report_only:
        log.info(
            f"ripieno: benchmark {config.name}: {len(datasets)} data sets x {len(models)} models"
            f" x {len(config.seeds)} seeds = {len(plan.wanted)} cells, protocol {config.protocol};"
            f" store {url}"
        )
    try:
        claim_folder(out, "benchmark", config.name, "--out", STORE_FILE, options.storage)
        study = cells.open_study(config, open_storage(url, options.heartbeat))
        adopted = cells.adopt_unrecorded(study, plan.fingerprints)
        changed = cells.changed_cells(study, plan.fingerprints)
    except RipienoInputError as error:
        raise SystemExit(f"ripieno: error: {str(error).splitlines()[0]}") from None
    if adopted:
        log.info(
            f"ripieno: {adopted} finished cells recorded no fingerprint (an older ripieno fitted them);"
            " they are taken as made from this file and checked from here on"
        )
    wanted_changed = {c.key: changed[c.key] for c in plan.wanted if c.key in changed}
    if options.report_only:
        if changed:
            log.info(
                f"ripieno: {len(changed)} finished cells were fitted from other inputs and are left out"
                " of the report (--refit_changed fits them again)"
            )
        write_outputs(config, url, out, options.heartbeat, len(plan.fingerprints), plan.fingerprints)
        return
    if wanted_changed and not options.refit_changed:
        key, why = next(iter(wanted_changed.items()))
        raise SystemExit(
            f"ripieno: error: {len(wanted_changed)} finished cells of {out} were fitted from other"
            f" inputs (first: {key}: {why}); run with --refit_changed to fit them again, or give"
            " another --out for a new benchmark."
        )
    if wanted_changed:
        shown = "; ".join(f"{key} ({why})" for key, why in list(wanted_changed.items())[:5])
        more = f"; and {len(wanted_changed) - 5} more" if len(wanted_changed) > 5 else ""
        count = len(wanted_changed)
        log.info(f"ripieno: --refit_changed: fitting {count} changed cells again: {shown}{more}")
    stop: str | None = None
    try:
        with fits_interrupted():
            run_workers(config, plan.wanted, url, options, plan.fingerprints, wanted_changed)
    except RipienoInputError as error:
        stop = f"ripieno: error: {str(error).splitlines()[0]}"
    except KeyboardInterrupt:
        stop = "interrupted"
    frame = write_outputs(config, url, out, options.heartbeat, len(plan.fingerprints), plan.fingerprints)
    mine = frame[frame["cell"].isin([c.key for c in plan.wanted])] if len(frame) else frame
    complete = int((mine["state"] == "COMPLETE").sum()) if len(mine) else 0
    if stop == "interrupted":
        raise SystemExit(
            f"ripieno: interrupted (Ctrl-C): {complete}/{len(plan.wanted)} cells finished and are kept"
            f" in {url}; the interrupted cell runs again.\n"
            f"ripieno: continue with: {shlex.join(['ripieno', 'benchmark', *argv])}"
        )
    if stop is not None:
        raise SystemExit(stop)
    if len(mine) and not complete:
        raise SystemExit(
            f"ripieno: error: none of the {len(mine)} cells finished: each failed by its own error"
            f" ({out / 'results.csv'}, column ripieno_error); fix it and run with --retry_failed."
        )


@dataclass(frozen=True)
class _Plan:
    """What a ``ripieno benchmark`` command will do, checked before anything is written."""

    config: BenchmarkConfig
    wanted: list[cells.Cell]
    out: Path
    url: str
    fingerprints: dict[str, dict[str, Any]]


def _plan(options: argparse.Namespace) -> _Plan:
    """The file, the cells to run, the output folder and store, each cell's fingerprint; writes nothing.

    Raises:
        RipienoInputError: a bad option, file, folder or store (one line).
    """
    if options.workers < 1 or options.heartbeat < 1:
        raise RipienoInputError(
            f"--workers and --heartbeat must be at least 1, got {options.workers} and {options.heartbeat}."
        )
    config, wanted, sources = _load(options)
    out = options.out or OUT_ROOT / folder_name(config.name)
    url = options.storage or f"sqlite:///{(out / STORE_FILE).resolve()}"
    check_folder(out, "benchmark", config.name, "--out", STORE_FILE, options.storage)
    check_storage(url)
    tables = {d.name: table_identity(config, d.name, sources) for d in config.datasets}
    fingerprints = {c.key: cells.cell_fingerprint(config, c, tables) for c in cells.wanted_cells(config)}
    return _Plan(config, wanted, out, url, fingerprints)


def _load(options: argparse.Namespace) -> tuple[BenchmarkConfig, list[cells.Cell], dict[str, Any]]:
    """The benchmark file, checked; the cells to run here; the data class's shipped tables.

    ``--datasets`` and ``--models`` narrow the cells.
    """
    probe = load_benchmark(options.config)
    _, module = datamodule_class(probe.data_class, f"benchmark {probe.source}")
    sources = dict(getattr(module, "SOURCES", {}) or {})
    config = load_benchmark(options.config, known=tuple(sources))
    for kind in {m.kind for m in config.models} & set(GBDT_KINDS):
        require("benchmark", kind, f"ripieno benchmark's {kind} model")
    datasets = _narrow("--datasets", options.datasets, [d.name for d in config.datasets], config.source)
    models = _narrow("--models", options.models, [m.name for m in config.models], config.source)
    wanted = [c for c in cells.wanted_cells(config) if c.dataset in datasets and c.model in models]
    return config, wanted, sources


def _narrow(option: str, chosen: list[str] | None, names: list[str], source: str) -> list[str]:
    """``chosen`` if every one is in ``names`` (else one line naming it), or all ``names``."""
    unknown = [n for n in chosen or [] if n not in names]
    if unknown:
        raise RipienoInputError(f"{option} {unknown[0]!r} is not in {source}; it has {names}.")
    return list(chosen) if chosen else names


def run_workers(
    config: BenchmarkConfig,
    wanted: list[cells.Cell],
    url: str,
    options: argparse.Namespace,
    fingerprints: dict[str, dict[str, Any]] | None = None,
    refit: dict[str, str] | None = None,
) -> None:
    """``--workers`` workers: in this process for one, else in spawned processes (Ctrl-C reaches all)."""
    args = (config, wanted, url, options.heartbeat, options.retry_failed, fingerprints, refit)
    if options.workers == 1:
        _worker(*args)
        return
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_worker_process, args=args, name=f"ripieno-benchmark-{i}")
        for i in range(options.workers)
    ]
    for process in processes:
        process.start()
    join_workers(processes)


def _worker_process(*args: Any) -> None:  # noqa: ANN401 - ``_worker``'s arguments
    """A spawned worker: messages on stdout, stops with its parent; the parent reports the stop."""
    stop_with_parent()
    with command_output():
        try:
            with fits_interrupted():
                _worker(*args)
        except KeyboardInterrupt:
            raise SystemExit(1) from None
        except RipienoInputError as error:
            log.info(f"ripieno: error: {str(error).splitlines()[0]}")
            raise SystemExit(1) from None


def _worker(
    config: BenchmarkConfig,
    wanted: list[cells.Cell],
    url: str,
    heartbeat: int,
    retry_failed: bool,
    fingerprints: dict[str, dict[str, Any]] | None = None,
    refit: dict[str, str] | None = None,
) -> None:
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # again: a spawned worker starts afresh
    try:
        with warnings.catch_warnings(), quiet_lightning():
            for pattern in FIT_WARNINGS:
                warnings.filterwarnings("ignore", message=pattern)
            cells.run_worker(
                config,
                open_storage(url, heartbeat),
                wanted=wanted,
                heartbeat=heartbeat,
                retry_failed=retry_failed,
                on_cell=_progress,
                fingerprints=fingerprints,
                refit=refit,
            )
    finally:
        optuna.logging.set_verbosity(verbosity)


def _progress(trial: FrozenTrial) -> None:
    """One line per finished cell."""
    key = trial.user_attrs.get(cells.CELL_ATTR, "?")
    if trial.state != TrialState.COMPLETE:
        log.info(f"ripieno: cell {key} FAILED: {trial.user_attrs.get(ERROR_ATTR, 'see the store')}")
        return
    task = trial.user_attrs.get("task", "regression")
    metric, _ = PRIMARY[task]
    log.info(
        f"ripieno: cell {key}  test {metric}={trial.user_attrs.get(f'test_{metric}', float('nan')):.4f}"
        f"  {trial.user_attrs.get('seconds', 0):.1f} s"
    )


def results_frame(
    config: BenchmarkConfig, study: optuna.Study, fingerprints: dict[str, dict[str, Any]] | None = None
) -> pd.DataFrame:
    """One row per finished cell of ``config`` (completed, or failed by its own error with ``error``).

    A cell fitted again after a failure (``--retry_failed``) has one row, its latest outcome; a
    completed fit always wins over a failed one. With ``fingerprints``, only fits of each cell's
    current fingerprint count (a cell fitted from other inputs has no row until fitted again).
    """
    kinds = {m.name: m.kind for m in config.models}
    datasets = {d.name for d in config.datasets}
    rows: dict[str, dict[str, Any]] = {}
    for trial in study.get_trials(deepcopy=False):
        key = trial.user_attrs.get(cells.CELL_ATTR)
        if key is None or cells.DUPLICATE_ATTR in trial.user_attrs:
            continue
        cell = cells.Cell.from_key(key)
        if cell.dataset not in datasets or cell.model not in kinds or cell.protocol != config.protocol:
            continue
        if trial.state != TrialState.COMPLETE and ERROR_ATTR not in trial.user_attrs:
            continue
        recorded = cells.recorded_fingerprint(study, trial)
        if fingerprints and recorded is not None and key in fingerprints and (
            first_difference(recorded, fingerprints[key]) is not None
        ):
            continue
        hidden = (cells.CELL_ATTR, cells.FINGERPRINT_ATTR)
        attrs = {k: v for k, v in trial.user_attrs.items() if k not in hidden}
        if rows.get(key, {}).get("state") == "COMPLETE" and trial.state != TrialState.COMPLETE:
            continue
        rows[key] = {
            "cell": key,
            "protocol": cell.protocol,
            "dataset": cell.dataset,
            "model": cell.model,
            "kind": kinds[cell.model],
            "seed": cell.seed,
            "state": "COMPLETE" if trial.state == TrialState.COMPLETE else "FAILED",
            **attrs,
        }
    specs = {m.name: m for m in config.models}
    for row in rows.values():  # whether early stopping or the epoch / tree cap ended the fit
        if row["state"] == "COMPLETE" and row.get("iterations") is not None:
            params = json.loads(row["params"]) if isinstance(row.get("params"), str) else {}
            row["iteration_cap"] = iteration_cap(specs[row["model"]], params)
            row["capped"] = bool(int(row["iterations"]) >= row["iteration_cap"])
    frame = pd.DataFrame(list(rows.values()))
    if len(frame):  # a stable order: the file's data sets, models and seeds
        order = {c.key: i for i, c in enumerate(cells.wanted_cells(config))}
        keys = list(frame["cell"])
        frame = frame.iloc[sorted(range(len(frame)), key=lambda i: order.get(keys[i], len(order)))]
    return frame.reset_index(drop=True)


def write_outputs(
    config: BenchmarkConfig,
    url: str,
    out: Path,
    heartbeat: int,
    total: int,
    fingerprints: dict[str, dict[str, Any]] | None = None,
) -> pd.DataFrame:
    """``results.csv``, ``report.md``, ``ranks.png`` and ``coverage.png`` from the store (each atomically).

    Returns:
        The rows of ``results.csv``.
    """
    study = cells.open_study(config, open_storage(url, heartbeat))
    frame = results_frame(config, study, fingerprints)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_output(out / "results.csv", "w") as handle:
        frame.to_csv(handle, index=False, lineterminator="\n")
    complete = frame[frame["state"] == "COMPLETE"] if len(frame) else frame
    failed = len(frame) - len(complete)
    if not len(complete):
        log.info(f"ripieno: benchmark {config.name}: no cell finished yet; results {out / 'results.csv'}")
        return frame
    figure = rank_figure(summary(complete), out / "ranks.png")
    coverage = coverage_figure(complete, out / "coverage.png")
    text = render(complete, config.name, figure=figure, total=total, coverage=coverage)
    if failed:
        text += f"\n{failed} cells failed by their own error (results.csv, column ripieno_error).\n"
    refitted = int(frame[cells.REFIT_ATTR].notna().sum()) if cells.REFIT_ATTR in frame else 0
    if refitted:
        text += (
            f"\n{refitted} cells were fitted again because their inputs changed (--refit_changed;"
            f" results.csv, column {cells.REFIT_ATTR} says what changed).\n"
        )
    with atomic_output(out / "report.md", "w") as handle:
        handle.write(text)
    log.info(
        f"ripieno: benchmark {config.name}: {len(complete)}/{total} cells finished"
        + (f", {failed} failed" if failed else "")
        + f"\nripieno: results  {out / 'results.csv'}"
        f"\nripieno: report   {out / 'report.md'}"
    )
    return frame
