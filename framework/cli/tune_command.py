"""``ripieno tune``: an Optuna study over any recipe, its best configuration written back as a recipe.

``ripieno tune -c tabular/lometab_churn --n_trials 40`` runs trials that are ``ripieno fit`` runs
of the recipe with values drawn from a search space (the recipe family's shipped space, or
``--space``), and writes ``trials.csv``, ``best.yaml`` and figures into the study folder
(``runs/tune/<study_name>``). Other ``--key=value`` arguments go to every trial unchanged.

This module is the door only: the options (one per field of ``TuneOptions``, same defaults), the
lines printed and the exit status. The study itself is ``ripieno.framework.tuning.tune`` and its
steps, which a notebook calls directly. Running the same command again continues the study;
Ctrl-C stops the running trial (it runs again when the study continues), writes ``trials.csv`` and
``best.yaml`` from the store and says how to go on.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.messages import get_logger
from ripieno.framework.runner.help_text import plain
from ripieno.framework.runner.recipes import RecipeNotFoundError
from ripieno.framework.tuning.study import (
    TuneOptions,
    prepare,
    quiet_optuna,
    run_study,
    start_line,
    write_results,
)

log = get_logger(__name__)


def build_parser() -> argparse.ArgumentParser:
    """The options of ``ripieno tune`` (other ``--key=value`` arguments go to every trial)."""
    defaults = TuneOptions()
    parser = argparse.ArgumentParser(
        prog="ripieno tune",
        description=plain(__doc__.split("\n\n")[0]),
        epilog="Any other --key=value argument is passed to every trial's `ripieno fit`.",
    )
    parser.add_argument(
        "-c",
        "--config",
        action="append",
        required=True,
        help="a recipe (name as `ripieno recipes` lists it, or a YAML file); repeatable",
    )
    parser.add_argument("--n_trials", type=int, default=defaults.n_trials,
                        help=f"trials the study finishes (default {defaults.n_trials})")
    parser.add_argument("--timeout", type=float, default=defaults.timeout,
                        help="seconds after which no new trial starts")
    parser.add_argument("--study_name", default=defaults.study_name,
                        help="default: the recipe's name, '/' as '_'")
    parser.add_argument(
        "--storage",
        default=defaults.storage,
        help="Optuna storage URL (postgresql://..., mysql+pymysql://..., sqlite:///...) or a"
        " journal file (journal:PATH or PATH.log); default: study.db in the study folder",
    )
    parser.add_argument(
        "--space",
        default=defaults.space,
        help="a shipped search space or a YAML file (default: the recipe family's shipped space)",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=defaults.seed,
        help="sampler seed: trial n draws with a seed derived from it and n, so a continued or shared"
        " study never repeats a trial (default: random)",
    )
    parser.add_argument("--workers", type=int, default=defaults.workers,
                        help="processes on this machine sharing the study")
    parser.add_argument("--study_dir", type=Path, default=defaults.study_dir,
                        help="default: runs/tune/<study_name>")
    parser.add_argument(
        "--final_seeds",
        type=int,
        default=defaults.final_seeds,
        help="train and test the best configuration with this many seeds at the end",
    )
    parser.add_argument(
        "--keep_checkpoints",
        choices=("all", "best"),
        default=defaults.keep_checkpoints,
        help="'best' deletes the other trials' checkpoints at the end",
    )
    parser.add_argument("--pruner", choices=("median", "hyperband", "none"), default=defaults.pruner)
    parser.add_argument(
        "--pruner_warmup",
        type=int,
        default=defaults.pruner_warmup,
        help=f"epochs before the median pruner may stop a trial (default {defaults.pruner_warmup})",
    )
    parser.add_argument("--startup_trials", type=int, default=defaults.startup_trials,
                        help=f"random trials before TPE (the TabM paper's {defaults.startup_trials})")
    parser.add_argument(
        "--heartbeat",
        type=int,
        default=defaults.heartbeat,
        help="seconds between a trial's heartbeats; a trial silent for twice this is retried",
    )
    parser.add_argument("--threads", type=int, default=defaults.threads,
                        help="torch / BLAS threads of each worker (default: the cores divided among the"
                        " workers; one worker keeps the process's own)")
    return parser


def tune_main(argv: list[str]) -> None:
    """``ripieno tune`` (module docstring); Optuna's own log lines and notices are off while it runs."""
    with quiet_optuna():
        _tune(argv)


def _tune(argv: list[str]) -> None:
    parsed, passed = build_parser().parse_known_args(argv)
    fields = vars(parsed)
    config = fields.pop("config")
    try:
        options = TuneOptions(**fields)
        setup = prepare(config, passed, options)
    except (RipienoInputError, RecipeNotFoundError) as error:
        raise SystemExit(f"ripieno: error: {str(error).splitlines()[0]}") from None
    log.info(start_line(setup, config, options))
    try:
        run_study(setup, options)
    except RipienoInputError as error:
        raise SystemExit(f"ripieno: error: {str(error).splitlines()[0]}") from None
    except KeyboardInterrupt:
        result = write_results(setup, options, interrupted=True)
        log.info("\n".join([
            *result.summary_lines(),
            f"ripieno: interrupted (Ctrl-C): the {result.finished} finished trials are kept in"
            f" {setup.storage}; the interrupted trial runs again when the study goes on.",
            f"ripieno: continue with: {shlex.join(['ripieno', 'tune', *argv])}",
        ]))
        raise SystemExit(1) from None
    result = write_results(setup, options)
    log.info("\n".join(result.summary_lines()))
    if result.best is None:
        raise SystemExit(1)
