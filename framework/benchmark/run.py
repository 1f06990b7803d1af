"""Every model on every table of a benchmark file, resumable and shared, as a library: ``run_benchmark``.

``run_benchmark("benchmarks/tabular_cpu")`` fits each (data set, model, seed) cell of the file
(``config``) once, records it in a store in the output folder (``runs/benchmark/<name>``), writes
``results.csv`` (one row per finished cell), ``report.md``, ``ranks.png`` and ``coverage.png``, and
returns them with the results table. Calling it again continues a stopped benchmark (finished cells
are never rerun); ``workers=N`` runs N processes here, and calls on several machines given one
``storage`` (``ripieno tune``'s storages: a database URL or a journal file on a shared disk) split
the cells between them. ``ripieno benchmark`` (``ripieno.framework.cli.benchmark_command``) is this
function behind argparse.

The output folder holds one benchmark and nothing of the user's (``store_folders``). Each cell
records what decided its result (``cells.cell_fingerprint``): a rerun whose file changed a
finished cell's model, data arguments, table or conformal settings is refused, naming the first
change, unless ``refit_changed`` fits those cells again (the report says which). Ctrl-C stops the
running cell (it runs again when the benchmark is repeated) and writes the report from the store.

Example:
    >>> from ripieno.framework.benchmark import run_benchmark  # doctest: +SKIP
    >>> result = run_benchmark("benchmarks/tabular_cpu", datasets=["wine"],
    ...                        out="runs/bench_wine")  # doctest: +SKIP
    >>> result.results.groupby("model")["test_accuracy"].mean()  # doctest: +SKIP
"""

from __future__ import annotations

import json
import multiprocessing
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from ripieno.framework.benchmark import cells
from ripieno.framework.benchmark.config import (
    BenchmarkConfig,
    datamodule_class,
    load_benchmark,
    table_identity,
)
from ripieno.framework.benchmark.models import GBDT_KINDS, PRIMARY, iteration_cap
from ripieno.framework.benchmark.report import coverage_figure, rank_figure, render, summary
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.extras import require
from ripieno.framework.messages import command_output, get_logger, quiet_lightning
from ripieno.framework.outputs.output_files import atomic_output
from ripieno.framework.runner.fingerprints import first_difference
from ripieno.framework.runner.interrupts import fits_interrupted, join_workers, stop_with_parent
from ripieno.framework.runner.store_folders import check_folder, claim_folder, folder_name
from ripieno.framework.runner.worker_threads import resolve_threads, thread_plan, worker_threads
from ripieno.framework.tuning.study import quiet_optuna
from ripieno.framework.tuning.study_storage import ERROR_ATTR, check_storage, open_storage

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


@dataclass(frozen=True)
class BenchmarkOptions:
    """How a benchmark runs; ``ripieno benchmark`` has one option per field, by the same name and default.

    Args:
        out: the output folder (default ``runs/benchmark/<name>``).
        storage: a shared store: an Optuna storage URL or journal file (default: ``benchmark.db`` in ``out``).
        workers: processes on this machine sharing the cells.
        datasets: only these data sets' cells (default: all of the file's).
        models: only these models' cells (default: all of the file's).
        retry_failed: run again the cells that failed by an error.
        refit_changed: fit again the finished cells whose model, data arguments, table or conformal
            settings changed since (without it, such a rerun is refused).
        report_only: write ``results.csv`` and ``report.md`` from the store, fit nothing.
        heartbeat: seconds between a running cell's signs of life.
        threads: torch / BLAS / OpenMP threads of each worker, the GBDTs' included (default: the cores
            divided among the workers, so that workers x threads <= cores; one worker keeps the
            process's own).

    Raises:
        RipienoInputError: ``workers``, ``heartbeat`` or ``threads`` under 1.
    """

    out: Path | None = None
    storage: str | None = None
    workers: int = 1
    datasets: Sequence[str] | None = None
    models: Sequence[str] | None = None
    retry_failed: bool = False
    refit_changed: bool = False
    report_only: bool = False
    heartbeat: int = 30
    threads: int | None = None

    def __post_init__(self) -> None:
        """Numbers checked; ``out`` as a path; ``datasets`` / ``models`` as lists (one name is one name)."""
        for option, value in (("--workers", self.workers), ("--heartbeat", self.heartbeat),
                              ("--threads", 1 if self.threads is None else self.threads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RipienoInputError(f"{option} must be a whole number of at least 1, got {value!r}.")
        if self.out is not None:
            object.__setattr__(self, "out", Path(self.out))
        for name in ("datasets", "models"):
            value = getattr(self, name)
            if isinstance(value, str):
                object.__setattr__(self, name, [value])
            elif value is not None:
                object.__setattr__(self, name, list(value))


@dataclass
class BenchmarkResult:
    """What a benchmark left: the results table and the files written from its store.

    Args:
        config: the benchmark file, checked.
        results: one row per finished cell of the file (``results.csv``; ``state`` COMPLETE or FAILED).
        out: the output folder.
        storage: the store's URL.
        cells: the cells this call was asked to run (after ``datasets`` / ``models``).
        finished: how many of those have a row (completed, or failed by their own error).
        complete: how many of those completed.
        results_csv: ``results.csv``.
        report: ``report.md`` (``None`` while no cell has finished).
        figures: ``ranks.png`` and ``coverage.png`` where drawn.
        interrupted: Ctrl-C stopped the run; the files were written from the store.
        error: the one-line error that stopped a worker (``None``: none did).
    """

    config: BenchmarkConfig
    results: pd.DataFrame
    out: Path
    storage: str
    cells: int
    finished: int
    complete: int
    results_csv: Path
    report: Path | None = None
    figures: list[Path] = field(default_factory=list)
    interrupted: bool = False
    error: str | None = None


def run_benchmark(config: str | Path, **options: Any) -> BenchmarkResult:  # noqa: ANN401 - BenchmarkOptions' fields
    """Fit every cell of a benchmark file not yet finished; return the results table and report paths.

    Args:
        config: a benchmark file, or a shipped one (``benchmarks/tabular_cpu``; ``ripieno recipes``
            lists them).
        **options: ``BenchmarkOptions``' fields (``out``, ``workers``, ``datasets``, ``models``, ...).

    Returns:
        The ``BenchmarkResult`` (the results table as ``result.results``).

    Raises:
        RipienoInputError: a bad option, file, folder or store, or finished cells fitted from other
            inputs without ``refit_changed``, before any cell is fitted; or the error that stopped a
            worker, after the files were written.
        KeyboardInterrupt: Ctrl-C, after the files were written from the store.
    """
    chosen = BenchmarkOptions(**options)
    with quiet_optuna():  # the benchmark says what happens in its own lines, as ``ripieno benchmark`` does
        found = plan(config, chosen)
        if not chosen.report_only:
            log.info(found.start_line(chosen))
        result = execute(found, chosen)
    if result.interrupted:
        raise KeyboardInterrupt
    if result.error is not None:
        raise RipienoInputError(result.error)
    return result


def execute(found: BenchmarkPlan, options: BenchmarkOptions) -> BenchmarkResult:
    """Claim the folder, check the store against the plan, fit the cells, write the files from the store.

    A worker's error and Ctrl-C end the fitting, not the call: the files are written and the result
    says which (``interrupted``, ``error``).

    Raises:
        RipienoInputError: the folder or store refuses, or finished cells were fitted from other
            inputs and ``refit_changed`` is off (before anything is fitted).
    """
    config, out, url = found.config, found.out, found.url
    claim_folder(out, "benchmark", config.name, "--out", STORE_FILE, options.storage)
    study = cells.open_study(config, open_storage(url, options.heartbeat))
    adopted = cells.adopt_unrecorded(study, found.fingerprints)
    changed = cells.changed_cells(study, found.fingerprints)
    if adopted:
        log.info(
            f"ripieno: {adopted} finished cells recorded no fingerprint (an older ripieno fitted them);"
            " they are taken as made from this file and checked from here on"
        )
    wanted_changed = {c.key: changed[c.key] for c in found.wanted if c.key in changed}
    total = len(found.fingerprints)
    if options.report_only:
        if changed:
            log.info(
                f"ripieno: {len(changed)} finished cells were fitted from other inputs and are left out"
                " of the report (--refit_changed fits them again)"
            )
        return write_outputs(config, url, out, options.heartbeat, total, found.fingerprints, found.wanted)
    if wanted_changed and not options.refit_changed:
        key, why = next(iter(wanted_changed.items()))
        raise RipienoInputError(
            f"{len(wanted_changed)} finished cells of {out} were fitted from other inputs (first: {key}:"
            f" {why}); run with --refit_changed to fit them again, or give another --out for a new benchmark."
        )
    if wanted_changed:
        shown = "; ".join(f"{key} ({why})" for key, why in list(wanted_changed.items())[:5])
        more = f"; and {len(wanted_changed) - 5} more" if len(wanted_changed) > 5 else ""
        count = len(wanted_changed)
        log.info(f"ripieno: --refit_changed: fitting {count} changed cells again: {shown}{more}")
    interrupted, error = False, None
    try:
        with fits_interrupted():
            run_workers(config, found.wanted, url, options, found.fingerprints, wanted_changed)
    except RipienoInputError as stop:
        error = str(stop).splitlines()[0]
    except KeyboardInterrupt:
        interrupted = True
    result = write_outputs(config, url, out, options.heartbeat, total, found.fingerprints, found.wanted)
    result.interrupted, result.error = interrupted, error
    return result


@dataclass(frozen=True)
class BenchmarkPlan:
    """What a benchmark run will do, checked before anything is written.

    Args:
        config: the benchmark file, checked.
        wanted: the cells to run here (after ``datasets`` / ``models``).
        out: the output folder.
        url: the store's URL.
        fingerprints: what decides each cell's result, for every cell of the file.
    """

    config: BenchmarkConfig
    wanted: list[cells.Cell]
    out: Path
    url: str
    fingerprints: dict[str, dict[str, Any]]

    def start_line(self, options: BenchmarkOptions) -> str:
        """The line a run starts with: data sets x models x seeds, the protocol, the store, the threads."""
        threads = thread_plan(options.workers, resolve_threads(options.workers, options.threads))
        datasets = list(dict.fromkeys(c.dataset for c in self.wanted))
        models = list(dict.fromkeys(c.model for c in self.wanted))
        return (
            f"ripieno: benchmark {self.config.name}: {len(datasets)} data sets x {len(models)} models"
            f" x {len(self.config.seeds)} seeds = {len(self.wanted)} cells, protocol {self.config.protocol};"
            f" store {self.url}; {threads}"
        )


def plan(config: str | Path, options: BenchmarkOptions) -> BenchmarkPlan:
    """The file, the cells to run, the output folder and store, each cell's fingerprint; writes nothing.

    Args:
        config: a benchmark file, or a shipped one's name.
        options: how it runs.

    Raises:
        RipienoInputError: a bad option, file, folder or store (one line).
    """
    config, wanted, sources = _load(config, options)
    out = options.out or OUT_ROOT / folder_name(config.name)
    url = options.storage or f"sqlite:///{(out / STORE_FILE).resolve()}"
    check_folder(out, "benchmark", config.name, "--out", STORE_FILE, options.storage)
    check_storage(url)
    tables = {d.name: table_identity(config, d.name, sources) for d in config.datasets}
    fingerprints = {c.key: cells.cell_fingerprint(config, c, tables) for c in cells.wanted_cells(config)}
    return BenchmarkPlan(config, wanted, out, url, fingerprints)


def _load(
    path: str | Path, options: BenchmarkOptions
) -> tuple[BenchmarkConfig, list[cells.Cell], dict[str, Any]]:
    """The benchmark file, checked; the cells to run here; the data class's shipped tables.

    ``--datasets`` and ``--models`` narrow the cells.
    """
    probe = load_benchmark(str(path))
    _, module = datamodule_class(probe.data_class, f"benchmark {probe.source}")
    sources = dict(getattr(module, "SOURCES", {}) or {})
    config = load_benchmark(str(path), known=tuple(sources))
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
    options: BenchmarkOptions,
    fingerprints: dict[str, dict[str, Any]] | None = None,
    refit: dict[str, str] | None = None,
) -> None:
    """``--workers`` workers: in this process for one, else in spawned processes (Ctrl-C reaches all).

    Each runs with ``resolve_threads(workers, threads)`` torch / BLAS threads (``worker_threads``),
    which the GBDT fits follow too.
    """
    args = (config, wanted, url, options.heartbeat, options.retry_failed, fingerprints, refit)
    if options.workers == 1:
        with worker_threads(options.threads):
            _worker(*args)
        return
    threads = resolve_threads(options.workers, options.threads)
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_worker_process, args=(threads, *args), name=f"ripieno-benchmark-{i}")
        for i in range(options.workers)
    ]
    for process in processes:
        process.start()
    join_workers(processes)


def _worker_process(threads: int, *args: Any) -> None:  # noqa: ANN401 - ``_worker``'s arguments
    """A spawned worker with ``threads`` threads.

    Its messages go to stdout and it stops with its parent; the parent reports the stop.
    """
    stop_with_parent()
    with command_output(), worker_threads(threads):
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
    wanted: Sequence[cells.Cell] | None = None,
) -> BenchmarkResult:
    """``results.csv``, ``report.md``, ``ranks.png`` and ``coverage.png`` from the store (each atomically).

    Args:
        config: the benchmark file.
        url: the store's URL.
        out: the output folder.
        heartbeat: seconds between a running cell's signs of life (opening the store).
        total: the file's cell count (the report says how many finished of it).
        fingerprints: each cell's current inputs (``results_frame``).
        wanted: the cells of this run (``BenchmarkResult.complete`` counts those; default: every cell).

    Returns:
        The results table and the files written.
    """
    study = cells.open_study(config, open_storage(url, heartbeat))
    frame = results_frame(config, study, fingerprints)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_output(out / "results.csv", "w") as handle:
        frame.to_csv(handle, index=False, lineterminator="\n")
    keys = [c.key for c in (wanted if wanted is not None else cells.wanted_cells(config))]
    mine = frame[frame["cell"].isin(keys)] if len(frame) else frame
    complete_here = int((mine["state"] == "COMPLETE").sum()) if len(mine) else 0
    result = BenchmarkResult(config=config, results=frame, out=out, storage=url, cells=len(keys),
                             finished=len(mine), complete=complete_here,
                             results_csv=out / "results.csv")
    complete = frame[frame["state"] == "COMPLETE"] if len(frame) else frame
    failed = len(frame) - len(complete)
    if not len(complete):
        log.info(f"ripieno: benchmark {config.name}: no cell finished yet; results {out / 'results.csv'}")
        return result
    figure = rank_figure(summary(complete), out / "ranks.png")
    coverage = coverage_figure(complete, out / "coverage.png")
    result.figures = [path for path in (figure, coverage) if path is not None]
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
    result.report = out / "report.md"
    log.info(
        f"ripieno: benchmark {config.name}: {len(complete)}/{total} cells finished"
        + (f", {failed} failed" if failed else "")
        + f"\nripieno: results  {out / 'results.csv'}"
        f"\nripieno: report   {out / 'report.md'}"
    )
    return result
