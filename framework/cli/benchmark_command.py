"""``ripieno benchmark``: every model on every table of a benchmark file, resumable and shared.

``ripieno benchmark -c benchmarks/tabular_cpu`` fits each (data set, model, seed) cell of the file
once, records it in a store in the output folder (``runs/benchmark/<name>``), and writes
``results.csv`` (one row per finished cell), ``report.md``, ``ranks.png`` and ``coverage.png``. Run
the same command again to continue a stopped benchmark (finished cells are never rerun).

This module is the door only: the options (one per field of ``BenchmarkOptions``, same defaults),
the lines printed and the exit status. The benchmark itself is
``ripieno.framework.benchmark.run_benchmark`` and its steps, which a notebook calls directly.
Ctrl-C stops the running cell (it runs again when the command is repeated), writes the report from
the store and says how to go on; a benchmark none of whose cells finished ends with a non-zero status.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from ripieno.framework.benchmark.config import list_benchmarks
from ripieno.framework.benchmark.run import BenchmarkOptions, execute, plan
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.messages import get_logger
from ripieno.framework.runner.help_text import plain
from ripieno.framework.tuning.study import quiet_optuna

log = get_logger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``ripieno benchmark``."""
    defaults = BenchmarkOptions()
    parser = argparse.ArgumentParser(prog="ripieno benchmark", description=plain(__doc__.split("\n\n")[0]))
    parser.add_argument(
        "-c",
        "--config",
        required=True,
        help=f"a benchmark file or a shipped one ({', '.join(list_benchmarks()) or 'none'})",
    )
    parser.add_argument("--out", type=Path, default=defaults.out,
                        help="output folder (default runs/benchmark/<name>)")
    parser.add_argument("--storage", default=defaults.storage,
                        help="a shared store: an Optuna storage URL or journal file")
    parser.add_argument("--workers", type=int, default=defaults.workers,
                        help="processes on this machine sharing the cells")
    parser.add_argument("--datasets", nargs="+", default=defaults.datasets,
                        help="only these data sets' cells")
    parser.add_argument("--models", nargs="+", default=defaults.models, help="only these models' cells")
    parser.add_argument("--retry_failed", action="store_true",
                        help="run again the cells that failed by an error")
    parser.add_argument(
        "--refit_changed",
        action="store_true",
        help="fit again the finished cells whose model, data arguments, table or conformal settings"
        " changed since (without it, such a rerun is refused)",
    )
    parser.add_argument("--report_only", action="store_true",
                        help="write results.csv and report.md, fit nothing")
    parser.add_argument("--heartbeat", type=int, default=defaults.heartbeat,
                        help="seconds between a running cell's signs of life")
    parser.add_argument("--threads", type=int, default=defaults.threads,
                        help="torch / BLAS threads of each worker, the GBDTs' too (default: the cores divided"
                        " among the workers; one worker keeps the process's own)")
    return parser


def benchmark_main(argv: list[str]) -> None:
    """``ripieno benchmark`` (module docstring); Optuna's own log lines are off while it runs."""
    with quiet_optuna():
        _benchmark(argv)


def _benchmark(argv: list[str]) -> None:
    fields = vars(build_parser().parse_args(argv))
    config = fields.pop("config")
    try:
        options = BenchmarkOptions(**fields)
        found = plan(config, options)
        if not options.report_only:
            log.info(found.start_line(options))
        result = execute(found, options)
    except RipienoInputError as error:
        raise SystemExit(f"ripieno: error: {str(error).splitlines()[0]}") from None
    if options.report_only:
        return
    if result.interrupted:
        raise SystemExit(
            f"ripieno: interrupted (Ctrl-C): {result.complete}/{result.cells} cells finished and are kept"
            f" in {result.storage}; the interrupted cell runs again.\n"
            f"ripieno: continue with: {shlex.join(['ripieno', 'benchmark', *argv])}"
        )
    if result.error is not None:
        raise SystemExit(f"ripieno: error: {result.error}")
    if result.finished and not result.complete:
        raise SystemExit(
            f"ripieno: error: none of the {result.finished} cells finished: each failed by its own error"
            f" ({result.results_csv}, column ripieno_error); fix it and run with --retry_failed."
        )
