"""``ripieno tune``: an Optuna study over any recipe, its best configuration written back as a recipe.

``ripieno tune -c tabular/lometab_churn --n_trials 40`` runs trials that are ``ripieno fit`` runs
of the recipe with values drawn from a search space (the recipe family's shipped space, or
``--space``), and writes ``trials.csv``, ``best.yaml`` and figures into the study folder
(``runs/tune/<study_name>``). Other ``--key=value`` arguments go to every trial unchanged.

The study lives in a storage: an SQLite file in the study folder by default; ``--storage`` takes
any Optuna storage URL or a journal file, so commands on several machines join one study.
``--workers N`` runs N processes here. Running the same command again continues the study.
Before any trial, the space is checked against the recipe: a key it does not accept, an empty
range or an unknown distribution stops the command with one line naming it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ripieno.framework.cli.command import resolve_config_args
from ripieno.framework.cli.config_errors import ConfigError
from ripieno.framework.cli.recipes import RECIPES_DIR, RecipeNotFoundError, recipe_name
from ripieno.framework.cli.tune import results
from ripieno.framework.cli.tune.space import SearchSpace, SearchSpaceError, default_space, find_space
from ripieno.framework.cli.tune.study_storage import counts, open_storage, storage_url
from ripieno.framework.cli.tune.trial_run import override_args, recipe_config
from ripieno.framework.cli.tune.worker import TuneSetup, load_study, run_worker
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.messages import command_output, get_logger

log = get_logger(__name__)

CHECKPOINT_CLASSES = (
    "lightning.pytorch.callbacks.ModelCheckpoint",
    "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
)
STUDY_ROOT = Path("runs") / "tune"
TUNE_WARNINGS = (
    ".*isinstance.treespec, LeafSpec.*",
    "Some regimes for parameter .* have less than",
    ".*is experimental.*",
)
"""Notices that say nothing to a ``ripieno tune`` user (Lightning's pytree deprecation, Optuna's
importance caveat on a few trials, Optuna's experimental-API notes)."""


def build_parser() -> argparse.ArgumentParser:
    """The options of ``ripieno tune`` (other ``--key=value`` arguments go to every trial)."""
    parser = argparse.ArgumentParser(
        prog="ripieno tune",
        description=__doc__.split("\n\n")[0],
        epilog="Any other --key=value argument is passed to every trial's `ripieno fit`.",
    )
    parser.add_argument(
        "-c",
        "--config",
        action="append",
        required=True,
        help="a recipe (name as `ripieno recipes` lists it, or a YAML file); repeatable",
    )
    parser.add_argument("--n_trials", type=int, default=40, help="trials the study finishes (default 40)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds after which no new trial starts")
    parser.add_argument("--study_name", default=None, help="default: the recipe's name, '/' as '_'")
    parser.add_argument(
        "--storage",
        default=None,
        help="Optuna storage URL (postgresql://..., mysql+pymysql://..., sqlite:///...) or a"
        " journal file (journal:PATH or PATH.log); default: study.db in the study folder",
    )
    parser.add_argument(
        "--space",
        default=None,
        help="a shipped search space or a YAML file (default: the recipe family's shipped space)",
    )
    parser.add_argument("--seed", type=int, default=None, help="sampler seed (worker i uses seed + i)")
    parser.add_argument("--workers", type=int, default=1, help="processes on this machine sharing the study")
    parser.add_argument("--study_dir", type=Path, default=None, help="default: runs/tune/<study_name>")
    parser.add_argument(
        "--final_seeds",
        type=int,
        default=0,
        help="train and test the best configuration with this many seeds at the end",
    )
    parser.add_argument(
        "--keep_checkpoints",
        choices=("all", "best"),
        default="all",
        help="'best' deletes the other trials' checkpoints at the end",
    )
    parser.add_argument("--pruner", choices=("median", "hyperband", "none"), default="median")
    parser.add_argument(
        "--pruner_warmup",
        type=int,
        default=2,
        help="epochs before the median pruner may stop a trial (default 2)",
    )
    parser.add_argument(
        "--startup_trials", type=int, default=20, help="random trials before TPE (the TabM paper's 20)"
    )
    parser.add_argument(
        "--heartbeat",
        type=int,
        default=30,
        help="seconds between a trial's heartbeats; a trial silent for twice this is retried",
    )
    return parser


def tune_main(argv: list[str]) -> None:
    """``ripieno tune`` (module docstring); Optuna's own log lines and notices are off while it runs."""
    with quiet_optuna():
        _tune(argv)


@contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's log lines and the ``TUNE_WARNINGS`` notices off in the block (the study prints its own)."""
    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            for pattern in TUNE_WARNINGS:
                warnings.filterwarnings("ignore", message=pattern)
            yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def _tune(argv: list[str]) -> None:
    options, passed = build_parser().parse_known_args(argv)
    try:
        setup = prepare(options, passed)
    except (RipienoInputError, RecipeNotFoundError) as error:
        raise SystemExit(f"ripieno: error: {str(error).splitlines()[0]}") from None
    log.info(
        f"ripieno: study {setup.study_name}: {setup.n_trials} trials of {' '.join(options.config)},"
        f" {setup.monitor} {setup.direction[:3]}imised, space {setup.space.name or setup.space.source}"
        f" ({len(setup.space.params)} keys); storage {setup.storage}"
    )
    try:
        load_study(setup)  # created here, or checked: the same space, metric and direction
        run_workers(setup, options.workers)
    except RipienoInputError as error:
        raise SystemExit(f"ripieno: error: {str(error).splitlines()[0]}") from None
    report(setup, options)


def prepare(options: argparse.Namespace, passed: list[str]) -> TuneSetup:
    """Resolve the recipe and space, check the space against the recipe, and describe the study.

    Raises:
        RipienoInputError: a bad option, recipe, space or storage (one line).
    """
    if options.n_trials < 1 or options.workers < 1 or options.heartbeat < 1:
        raise RipienoInputError("--n_trials, --workers and --heartbeat must be at least 1.")
    configs = resolve_config_args([arg for c in options.config for arg in ("-c", c)])
    fit_args = [*configs, *passed]
    first = Path(configs[1])
    shipped = recipe_name(first) if first.resolve().is_relative_to(RECIPES_DIR) else None
    space = find_space(options.space) if options.space else default_space(shipped)
    base = check_space(fit_args, space)
    monitor, mode = _objective(base, configs)
    name = options.study_name or re.sub(r"[^A-Za-z0-9_.-]+", "_", shipped or first.with_suffix("").name)
    study_dir = options.study_dir or STUDY_ROOT / name
    return TuneSetup(
        fit_args=fit_args,
        space=space,
        study_name=name,
        storage=storage_url(options.storage, study_dir),
        study_dir=study_dir,
        n_trials=options.n_trials,
        monitor=monitor,
        direction="minimize" if mode == "min" else "maximize",
        seed=options.seed,
        startup_trials=options.startup_trials,
        pruner=options.pruner,
        pruner_warmup=options.pruner_warmup,
        timeout=options.timeout,
        heartbeat=options.heartbeat,
    )


def check_space(fit_args: list[str], space: SearchSpace) -> dict[str, Any]:
    """Parse the recipe with values of every key (every categorical choice once); return its config.

    Raises:
        SearchSpaceError: a key the recipe does not accept, or a value it rejects, with the closest key.
    """
    examples = {key: dist.examples() for key, dist in space.params.items()}
    rounds = max(len(values) for values in examples.values())
    base: dict[str, Any] = {}
    for index in range(rounds):
        values = {key: found[index % len(found)] for key, found in examples.items()}
        try:
            config = recipe_config([*fit_args, *override_args(values)])
        except ConfigError as error:
            where = space.name or space.source or "the search space"
            raise SearchSpaceError(f"search space {where}: {str(error).splitlines()[0]}") from None
        base = base or config
    return base


def _objective(config: dict[str, Any], configs: list[str]) -> tuple[str, str]:
    """The recipe's first ``ModelCheckpoint`` ``monitor`` and ``mode``."""
    callbacks = ((config.get("trainer") or {}).get("callbacks")) or []
    for callback in callbacks if isinstance(callbacks, list) else [callbacks]:
        if isinstance(callback, dict) and callback.get("class_path") in CHECKPOINT_CLASSES:
            init = callback.get("init_args") or {}
            if init.get("monitor"):
                return str(init["monitor"]), str(init.get("mode") or "min")
    raise RipienoInputError(
        f"{configs[-1]}: no ModelCheckpoint with a monitor, so a trial has no metric to"
        " return; add one to trainer.callbacks (monitor: val/..., mode: min or max)."
    )


def run_workers(setup: TuneSetup, workers: int) -> None:
    """Run ``workers`` workers on this machine: in this process for one, else in spawned processes."""
    if workers == 1:
        run_worker(setup, 0)
        return
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_worker_process, args=(setup, index), name=f"ripieno-tune-{index}")
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join()


def _worker_process(setup: TuneSetup, index: int) -> None:
    """A spawned worker: its messages on stdout, like the command's."""
    with command_output(), quiet_optuna():
        try:
            run_worker(setup, index)
        except RipienoInputError as error:
            raise SystemExit(f"ripieno: error: worker {index}: {str(error).splitlines()[0]}") from None


def report(setup: TuneSetup, options: argparse.Namespace) -> None:
    """Write ``trials.csv``, ``best.yaml`` and the figures; train the final seeds; print where they are."""
    study = load_study(setup, storage=open_storage(setup.storage, setup.heartbeat))
    folder = setup.study_dir
    folder.mkdir(parents=True, exist_ok=True)
    frame = results.trial_rows(study, setup)
    results.write_csv(frame, folder / "trials.csv")
    finished = [t for t in study.get_trials(deepcopy=False) if counts(t) and t.state.is_finished()]
    states = frame["state"].value_counts().to_dict() if len(frame) else {}
    lines = [
        "",
        f"ripieno: study {setup.study_name}: {len(finished)}/{setup.n_trials} trials finished ("
        + ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items()))
        + ")",
    ]
    best = results.best_trial(study)
    if best is None:
        lines.append("ripieno: no trial completed; nothing to write as best.yaml (trials.csv says why).")
        lines.append(f"ripieno: trials     {folder / 'trials.csv'}")
        log.info("\n".join(lines))
        raise SystemExit(1)
    results.write_best_yaml(setup, best, folder / "best.yaml")
    figures, skipped = results.write_figures(study, folder)
    shown = " ".join(
        f"{k.rsplit('.', 1)[-1]}={v:.4g}" if isinstance(v, float) else f"{k.rsplit('.', 1)[-1]}={v}"
        for k, v in best.user_attrs.get("values", {}).items()
    )
    lines += [
        f"ripieno: best       trial {best.number}: {setup.monitor} = {best.value:.6g}  {shown}",
        f"ripieno: best.yaml  {folder / 'best.yaml'}  (ripieno fit -c {folder / 'best.yaml'})",
        f"ripieno: trials     {folder / 'trials.csv'}",
        f"ripieno: figures    {', '.join(str(p) for p in figures) or '(none)'}",
    ]
    lines += [f"ripieno:            ({why})" for why in skipped]
    if options.keep_checkpoints == "best":
        removed = results.drop_checkpoints(study, folder, best)
        lines.append(f"ripieno: removed {removed} checkpoints of the other trials (--keep_checkpoints best)")
    if options.final_seeds > 0:
        final = results.final_seeds(setup, best, options.final_seeds)
        results.write_csv(final, folder / "final.csv")
        lines.append(
            f"ripieno: the best configuration over {options.final_seeds} seeds (test metrics,"
            f" {folder / 'final.csv'}):"
        )
        lines += results.summarise_final(final)
    log.info("\n".join(lines))
