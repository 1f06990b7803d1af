"""``ripieno benchmark``: every model on every table of a benchmark file, resumable and shared.

``ripieno benchmark -c benchmarks/tabular_cpu`` fits each (data set, model, seed) cell of the file
(``config``) once, records it in a store in the output folder (``runs/benchmark/<name>``), and writes
``results.csv`` (one row per finished cell), ``report.md`` and ``ranks.png``. Run the same command
again to continue a stopped benchmark (finished cells are never rerun); ``--workers N`` runs N
processes here, and commands on several machines given one ``--storage`` (``ripieno tune``'s
storages: a database URL or a journal file on a shared disk) split the cells between them.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import warnings
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
from optuna.trial import FrozenTrial, TrialState

from ripieno.framework.cli.benchmark import cells
from ripieno.framework.cli.benchmark.config import BenchmarkConfig, list_benchmarks, load_benchmark
from ripieno.framework.cli.benchmark.models import GBDT_KINDS, PRIMARY
from ripieno.framework.cli.benchmark.report import rank_figure, render, summary
from ripieno.framework.cli.tune.study_storage import ERROR_ATTR, open_storage, storage_url
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.extras import require
from ripieno.framework.messages import command_output, get_logger, quiet_lightning
from ripieno.framework.outputs.output_files import atomic_output

log = get_logger(__name__)

OUT_ROOT = Path("runs") / "benchmark"
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
    parser = argparse.ArgumentParser(prog="ripieno benchmark", description=__doc__.split("\n\n")[0])
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
        "--report_only", action="store_true", help="write results.csv and report.md, fit nothing"
    )
    parser.add_argument(
        "--heartbeat", type=int, default=30, help="seconds between a running cell's signs of life"
    )
    return parser


def benchmark_main(argv: list[str]) -> None:
    """``ripieno benchmark`` (module docstring); Optuna's own log lines are off while it runs."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        _benchmark(argv)
    finally:
        optuna.logging.set_verbosity(verbosity)


def _benchmark(argv: list[str]) -> None:
    options = build_parser().parse_args(argv)
    try:
        config, wanted = _load(options)
    except RipienoInputError as error:
        raise SystemExit(f"ripieno: error: {str(error).splitlines()[0]}") from None
    out = options.out or OUT_ROOT / config.name
    if not options.storage and out.is_dir() and any(out.iterdir()) and not (out / "benchmark.db").is_file():
        raise SystemExit(
            f"ripieno: error: --out {out} holds other files and no benchmark store; name an empty or new"
            " folder (ripieno benchmark writes results.csv and report.md there)."
        )
    url = (
        storage_url(options.storage, out)
        if options.storage
        else f"sqlite:///{(out / 'benchmark.db').resolve()}"
    )
    total = len(wanted)
    if not options.report_only:
        log.info(
            f"ripieno: benchmark {config.name}: {len(config.datasets)} data sets x"
            f" {len(config.models)} models"
            f" x {len(config.seeds)} seeds = {total} cells, protocol {config.protocol}; store {url}"
        )
        try:
            run_workers(config, wanted, url, options)
        except RipienoInputError as error:
            raise SystemExit(f"ripieno: error: {str(error).splitlines()[0]}") from None
        except KeyboardInterrupt:
            write_outputs(config, url, out, options.heartbeat, len(cells.wanted_cells(config)))
            raise SystemExit(
                "ripieno: interrupted (Ctrl-C); finished cells are kept in the store: run the same"
                " command to continue."
            ) from None
    write_outputs(config, url, out, options.heartbeat, len(cells.wanted_cells(config)))


def _load(options: argparse.Namespace) -> tuple[BenchmarkConfig, list[cells.Cell]]:
    """The benchmark file, checked, and the cells to run here (``--datasets`` / ``--models`` narrow them)."""
    probe = load_benchmark(options.config)
    module = importlib.import_module(probe.data_class.rpartition(".")[0])
    known = tuple(getattr(module, "SOURCES", {}) or ())
    config = load_benchmark(options.config, known=known)
    for kind in {m.kind for m in config.models} & set(GBDT_KINDS):
        require("benchmark", kind, f"ripieno benchmark's {kind} model")
    datasets = _narrow("--datasets", options.datasets, [d.name for d in config.datasets], config.source)
    models = _narrow("--models", options.models, [m.name for m in config.models], config.source)
    wanted = [c for c in cells.wanted_cells(config) if c.dataset in datasets and c.model in models]
    return config, wanted


def _narrow(option: str, chosen: list[str] | None, names: list[str], source: str) -> list[str]:
    """``chosen`` if every one is in ``names`` (else one line naming it), or all ``names``."""
    unknown = [n for n in chosen or [] if n not in names]
    if unknown:
        raise RipienoInputError(f"{option} {unknown[0]!r} is not in {source}; it has {names}.")
    return list(chosen) if chosen else names


def run_workers(
    config: BenchmarkConfig, wanted: list[cells.Cell], url: str, options: argparse.Namespace
) -> None:
    """``--workers`` workers: in this process for one, else in spawned processes."""
    args = (config, wanted, url, options.heartbeat, options.retry_failed)
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
    for process in processes:
        process.join()


def _worker_process(
    config: BenchmarkConfig, wanted: list[cells.Cell], url: str, heartbeat: int, retry_failed: bool
) -> None:
    with command_output():
        try:
            _worker(config, wanted, url, heartbeat, retry_failed)
        except RipienoInputError as error:
            log.info(f"ripieno: error: {str(error).splitlines()[0]}")
            raise SystemExit(1) from None


def _worker(
    config: BenchmarkConfig, wanted: list[cells.Cell], url: str, heartbeat: int, retry_failed: bool
) -> None:
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # again: a spawned worker starts afresh
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


def results_frame(config: BenchmarkConfig, study: optuna.Study) -> pd.DataFrame:
    """One row per finished cell of ``config`` (completed, or failed by its own error with ``error``).

    A cell fitted again after a failure (``--retry_failed``) has one row, its latest outcome; a
    completed fit always wins over a failed one.
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
        attrs = {k: v for k, v in trial.user_attrs.items() if k != cells.CELL_ATTR}
        if rows.get(key, {}).get("state") == "COMPLETE" and trial.state != TrialState.COMPLETE:
            continue
        rows[key] = {
            "protocol": cell.protocol,
            "dataset": cell.dataset,
            "model": cell.model,
            "kind": kinds[cell.model],
            "seed": cell.seed,
            "state": "COMPLETE" if trial.state == TrialState.COMPLETE else "FAILED",
            **attrs,
        }
    frame = pd.DataFrame(list(rows.values()))
    if len(frame):  # a stable order: the file's data sets, models and seeds
        order = {c.key: i for i, c in enumerate(cells.wanted_cells(config))}
        keys = [f"{r.protocol}/{r.dataset}/{r.model}/{r.seed}" for r in frame.itertuples()]
        frame = frame.iloc[sorted(range(len(frame)), key=lambda i: order.get(keys[i], len(order)))]
    return frame.reset_index(drop=True)


def write_outputs(config: BenchmarkConfig, url: str, out: Path, heartbeat: int, total: int) -> None:
    """``results.csv``, ``report.md`` and ``ranks.png`` from the store (each written atomically)."""
    study = cells.open_study(config, open_storage(url, heartbeat))
    frame = results_frame(config, study)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_output(out / "results.csv", "w") as handle:
        frame.to_csv(handle, index=False, lineterminator="\n")
    complete = frame[frame["state"] == "COMPLETE"] if len(frame) else frame
    failed = len(frame) - len(complete)
    if not len(complete):
        log.info(f"ripieno: benchmark {config.name}: no cell finished yet; results {out / 'results.csv'}")
        return
    figure = rank_figure(summary(complete), out / "ranks.png")
    text = render(complete, config.name, figure=figure, total=total)
    if failed:
        text += f"\n{failed} cells failed by their own error (results.csv, column ripieno_error).\n"
    with atomic_output(out / "report.md", "w") as handle:
        handle.write(text)
    log.info(
        f"ripieno: benchmark {config.name}: {len(complete)}/{total} cells finished"
        + (f", {failed} failed" if failed else "")
        + f"\nripieno: results  {out / 'results.csv'}"
        f"\nripieno: report   {out / 'report.md'}"
    )
