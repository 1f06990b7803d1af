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

A study folder holds one study and nothing of the user's (``store_folders``); a study records what
decides its results, the resolved recipe with every override, the space and the data files'
content (``fingerprints``), and a command that would continue it with anything else is refused.
With ``--seed``, trial ``n`` draws with a seed derived from the seed and ``n``, so a continued or
shared study never repeats earlier trials. Ctrl-C stops the running trial (it runs again when the
study continues), writes ``trials.csv`` and ``best.yaml`` from the store and says how to go on.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shlex
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ripieno.framework.cli.command import resolve_config_args
from ripieno.framework.cli.config_errors import ConfigError
from ripieno.framework.cli.fingerprints import data_files, without_keys
from ripieno.framework.cli.help_text import plain
from ripieno.framework.cli.interrupts import fits_interrupted, join_workers, stop_with_parent
from ripieno.framework.cli.recipes import RECIPES_DIR, RecipeNotFoundError, recipe_name
from ripieno.framework.cli.store_folders import check_folder, claim_folder, folder_name
from ripieno.framework.cli.tune import results
from ripieno.framework.cli.tune.space import SearchSpace, SearchSpaceError, default_space, find_space
from ripieno.framework.cli.tune.study_storage import check_storage, counts, open_storage, storage_url
from ripieno.framework.cli.tune.trial_run import override_args, recipe_config
from ripieno.framework.cli.tune.worker import PRESENTATION_KEYS, TuneSetup, load_study, run_worker
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.messages import command_output, get_logger

log = get_logger(__name__)

CHECKPOINT_CLASSES = (
    "lightning.pytorch.callbacks.ModelCheckpoint",
    "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
)
STUDY_ROOT = Path("runs") / "tune"
STORE_FILE = "study.db"
"""The default store's file in the study folder."""
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
    parser.add_argument(
        "--seed",
        type=int,
        default=None,
        help="sampler seed: trial n draws with a seed derived from it and n, so a continued or shared"
        " study never repeats a trial (default: random)",
    )
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
    """Optuna's log lines and the ``TUNE_WARNINGS`` notices off in the block (the study prints its own).

    Optuna's warnings go too: a failed trial's, with its traceback, says less than the study's own
    line for it (the error in one line, or that Ctrl-C stopped it).
    """
    import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
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
        claim_folder(setup.study_dir, "tune", setup.study_name, "--study_dir", STORE_FILE, options.storage)
        load_study(setup, announce=True)  # created here, or checked: what made it is what runs now
        with fits_interrupted():
            run_workers(setup, options.workers)
    except RipienoInputError as error:
        raise SystemExit(f"ripieno: error: {str(error).splitlines()[0]}") from None
    except KeyboardInterrupt:
        report(setup, options, again=shlex.join(["ripieno", "tune", *argv]))
    report(setup, options)


def prepare(options: argparse.Namespace, passed: list[str]) -> TuneSetup:
    """Check the options, the study folder and storage, the recipe and space; describe the study.

    Nothing is written: a refusal leaves no folder behind.

    Raises:
        RipienoInputError: a bad option, recipe, space, folder or storage (one line).
    """
    check_options(options)
    configs = resolve_config_args([arg for c in options.config for arg in ("-c", c)])
    fit_args = [*configs, *passed]
    first = Path(configs[1])
    shipped = recipe_name(first) if first.resolve().is_relative_to(RECIPES_DIR) else None
    name = options.study_name or folder_name(shipped or first.with_suffix("").name)
    study_dir = options.study_dir or STUDY_ROOT / folder_name(name)
    storage = storage_url(options.storage, study_dir)
    check_folder(study_dir, "tune", name, "--study_dir", STORE_FILE, options.storage)
    check_storage(storage)
    space = find_space(options.space) if options.space else default_space(shipped)
    base = check_space(fit_args, space)
    monitor, mode = _objective(base, configs)
    recipe = without_keys(base, space.params)
    return TuneSetup(
        fit_args=fit_args,
        space=space,
        study_name=name,
        storage=storage,
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
        recipe=recipe,
        data=data_files(without_keys(recipe, PRESENTATION_KEYS)),
    )


def check_options(options: argparse.Namespace) -> None:
    """Every numeric option in its range, in one line naming the first that is not.

    Raises:
        RipienoInputError: the option, its value and the range it must be in.
    """
    at_least = {
        "--n_trials": (options.n_trials, 1),
        "--workers": (options.workers, 1),
        "--heartbeat": (options.heartbeat, 1),
        "--pruner_warmup": (options.pruner_warmup, 0),
        "--startup_trials": (options.startup_trials, 0),
        "--final_seeds": (options.final_seeds, 0),
    }
    for option, (value, low) in at_least.items():
        if value < low:
            raise RipienoInputError(f"{option} must be at least {low}, got {value}.")
    if options.timeout is not None and not options.timeout > 0:
        raise RipienoInputError(f"--timeout must be a positive number of seconds, got {options.timeout:g}.")


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
    """Run ``workers`` workers on this machine: in this process for one, else in spawned processes.

    On Ctrl-C the spawned workers are interrupted too and waited for (``join_workers``), so that
    each marks its running trial to run again before the report is written.
    """
    if workers == 1:
        run_worker(setup)
        return
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_worker_process, args=(setup, index), name=f"ripieno-tune-{index}")
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    join_workers(processes)


def _worker_process(setup: TuneSetup, index: int) -> None:
    """A spawned worker: its messages on stdout, like the command's; it stops when its parent dies."""
    stop_with_parent()
    with command_output(), quiet_optuna():
        try:
            with fits_interrupted():
                run_worker(setup)
        except KeyboardInterrupt:
            raise SystemExit(1) from None  # the parent says what was kept
        except RipienoInputError as error:
            raise SystemExit(f"ripieno: error: worker {index}: {str(error).splitlines()[0]}") from None


def report(setup: TuneSetup, options: argparse.Namespace, again: str | None = None) -> None:
    """Write ``trials.csv``, ``best.yaml`` and the figures; train the final seeds; print where they are.

    After Ctrl-C (``again``: the command that continues the study): the files from the store, no
    final seeds, and how to continue; the command then stops (exit status 1).
    """
    interrupted = again is not None
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
    stop = (
        f"ripieno: interrupted (Ctrl-C): the {len(finished)} finished trials are kept in"
        f" {setup.storage}; the interrupted trial runs again when the study goes on.\n"
        f"ripieno: continue with: {again}"
    )
    if best is None:
        lines.append("ripieno: no trial completed; nothing to write as best.yaml (trials.csv says why).")
        lines.append(f"ripieno: trials     {folder / 'trials.csv'}")
        log.info("\n".join([*lines, stop] if interrupted else lines))
        raise SystemExit(1)
    results.write_best_yaml(study, setup, best, folder / "best.yaml")
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
    if interrupted:
        log.info("\n".join([*lines, stop]))
        raise SystemExit(1)
    if options.final_seeds > 0:
        final = results.final_seeds(setup, folder / "best.yaml", options.final_seeds)
        results.write_csv(final, folder / "final.csv")
        lines.append(
            f"ripieno: the best configuration over {options.final_seeds} seeds (test metrics,"
            f" {folder / 'final.csv'}):"
        )
        lines += results.summarise_final(final)
    log.info("\n".join(lines))
