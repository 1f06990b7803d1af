"""Optuna studies over any recipe, as a library: ``tune`` returns the study and its best configuration.

``tune("tabular/lometab_churn", n_trials=40)`` runs trials that are ``ripieno fit`` runs of the
recipe with values drawn from a search space (the recipe family's shipped space, or ``space``),
and writes ``trials.csv``, ``best.yaml`` and figures into the study folder
(``runs/tune/<study_name>``); ``overrides`` (``--key=value`` strings) go to every trial unchanged.
``ripieno tune`` (``ripieno.framework.cli.tune_command``) is this function behind argparse.

The study lives in a storage: an SQLite file in the study folder by default; ``storage`` takes
any Optuna storage URL or a journal file, so commands on several machines join one study.
``workers=N`` runs N processes here. Running the same study again continues it. Before any
trial, the space is checked against the recipe: a key it does not accept, an empty range or an
unknown distribution stops with one line naming it.

A study folder holds one study and nothing of the user's (``store_folders``); a study records what
decides its results, the resolved recipe with every override, the space and the data files'
content (``fingerprints``), and a call that would continue it with anything else is refused.
With ``seed``, trial ``n`` draws with a seed derived from the seed and ``n``, so a continued or
shared study never repeats earlier trials. Ctrl-C stops the running trial (it runs again when the
study continues) and writes ``trials.csv`` and ``best.yaml`` from the store.

Example:
    >>> from ripieno.framework.tuning import tune  # doctest: +SKIP
    >>> result = tune("tabular/lometab_wine", n_trials=20, study_dir="runs/tune/wine")  # doctest: +SKIP
    >>> result.best.value, result.best_yaml  # doctest: +SKIP
    (0.061..., PosixPath('runs/tune/wine/best.yaml'))
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.messages import command_output, get_logger
from ripieno.framework.runner.command import resolve_config_args
from ripieno.framework.runner.config_errors import ConfigError
from ripieno.framework.runner.fingerprints import data_files, without_keys
from ripieno.framework.runner.interrupts import fits_interrupted, join_workers, stop_with_parent
from ripieno.framework.runner.recipes import RECIPES_DIR, recipe_name
from ripieno.framework.runner.store_folders import check_folder, claim_folder, folder_name
from ripieno.framework.runner.worker_threads import resolve_threads, thread_plan, worker_threads
from ripieno.framework.tuning import results
from ripieno.framework.tuning.space import SearchSpace, SearchSpaceError, default_space, find_space
from ripieno.framework.tuning.study_storage import check_storage, counts, open_storage, storage_url
from ripieno.framework.tuning.trial_run import override_args, recipe_config
from ripieno.framework.tuning.worker import PRESENTATION_KEYS, TuneSetup, load_study, run_worker

if TYPE_CHECKING:
    import optuna
    import pandas as pd
    from optuna.trial import FrozenTrial

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


@dataclass(frozen=True)
class TuneOptions:
    """How a study runs; ``ripieno tune`` has one option per field, by the same name and default.

    Args:
        n_trials: trials the study finishes.
        timeout: seconds after which no new trial starts (``None``: no limit).
        study_name: the study's name in its storage (default: the recipe's name, ``/`` as ``_``).
        storage: an Optuna storage URL or a journal file (default: ``study.db`` in the study folder).
        space: a shipped search space or a YAML file (default: the recipe family's shipped space).
        seed: sampler seed: trial ``n`` draws with a seed derived from it and ``n`` (``None``: random).
        workers: processes on this machine sharing the study.
        study_dir: the study folder (default ``runs/tune/<study_name>``).
        final_seeds: train and test the best configuration with this many seeds at the end.
        keep_checkpoints: ``best`` deletes the other trials' checkpoints at the end.
        pruner: ``median``, ``hyperband`` or ``none``.
        pruner_warmup: epochs before the median pruner may stop a trial.
        startup_trials: random trials before TPE (the TabM paper's 20).
        heartbeat: seconds between a trial's heartbeats; a trial silent for twice this is retried.
        threads: torch / BLAS / OpenMP threads of each worker (default: the cores divided among the
            workers, so that workers x threads <= cores; one worker keeps the process's own).

    Raises:
        RipienoInputError: a value out of its range, in one line naming it.
    """

    n_trials: int = 40
    timeout: float | None = None
    study_name: str | None = None
    storage: str | None = None
    space: str | None = None
    seed: int | None = None
    workers: int = 1
    study_dir: Path | None = None
    final_seeds: int = 0
    keep_checkpoints: Literal["all", "best"] = "all"
    pruner: Literal["median", "hyperband", "none"] = "median"
    pruner_warmup: int = 2
    startup_trials: int = 20
    heartbeat: int = 30
    threads: int | None = None

    def __post_init__(self) -> None:
        """Every number in its range and every choice known; one line naming the first that is not."""
        at_least = {
            "--n_trials": (self.n_trials, 1),
            "--workers": (self.workers, 1),
            "--heartbeat": (self.heartbeat, 1),
            "--pruner_warmup": (self.pruner_warmup, 0),
            "--startup_trials": (self.startup_trials, 0),
            "--final_seeds": (self.final_seeds, 0),
            **({"--threads": (self.threads, 1)} if self.threads is not None else {}),
        }
        for option, (value, low) in at_least.items():
            if isinstance(value, bool) or not isinstance(value, int):
                raise RipienoInputError(f"{option} must be a whole number, got {value!r}.")
            if value < low:
                raise RipienoInputError(f"{option} must be at least {low}, got {value}.")
        if self.timeout is not None and not self.timeout > 0:
            raise RipienoInputError(f"--timeout must be a positive number of seconds, got {self.timeout:g}.")
        for option, value, choices in (("--keep_checkpoints", self.keep_checkpoints, ("all", "best")),
                                       ("--pruner", self.pruner, ("median", "hyperband", "none"))):
            if value not in choices:
                raise RipienoInputError(f"{option} must be one of {', '.join(choices)}, got {value!r}.")
        if self.study_dir is not None:
            object.__setattr__(self, "study_dir", Path(self.study_dir))


@dataclass
class TuneResult:
    """What a study left: the study itself, its best trial and configuration, and the files written.

    Args:
        study: the Optuna study (from its storage: every worker's and machine's trials).
        setup: what every worker of the study ran (recipe, space, storage, objective).
        trials: one row per trial (what ``trials.csv`` holds).
        best: the best completed trial (``None``: no trial completed, and no ``best.yaml``).
        best_config: the best configuration as a recipe (what ``best.yaml`` holds; ``None`` without one).
        trials_csv: ``trials.csv`` in the study folder.
        best_yaml: ``best.yaml`` (``ripieno fit -c`` runs it), or ``None``.
        figures: the figures written (optimisation history, parameter importances).
        skipped_figures: why a figure was not drawn, one line each.
        removed_checkpoints: checkpoints of the other trials deleted (``keep_checkpoints="best"``).
        final: the best configuration's test metrics over ``final_seeds`` seeds (``final.csv``), or ``None``.
        final_csv: ``final.csv``, or ``None``.
        interrupted: Ctrl-C stopped the study; the files were written from the store.
    """

    study: optuna.Study
    setup: TuneSetup
    trials: pd.DataFrame
    best: FrozenTrial | None
    best_config: dict[str, Any] | None
    trials_csv: Path
    best_yaml: Path | None = None
    figures: list[Path] = field(default_factory=list)
    skipped_figures: list[str] = field(default_factory=list)
    removed_checkpoints: int | None = None
    final: pd.DataFrame | None = None
    final_csv: Path | None = None
    interrupted: bool = False

    @property
    def finished(self) -> int:
        """Trials of the study that finished (completed, pruned or failed by their own error)."""
        return sum(1 for t in self.study.get_trials(deepcopy=False) if counts(t) and t.state.is_finished())

    @property
    def study_dir(self) -> Path:
        """The study folder."""
        return self.setup.study_dir

    def summary_lines(self) -> list[str]:
        """The lines ``ripieno tune`` ends with: trials finished, the best trial and where the files are."""
        setup = self.setup
        states = self.trials["state"].value_counts().to_dict() if len(self.trials) else {}
        lines = [
            "",
            f"ripieno: study {setup.study_name}: {self.finished}/{setup.n_trials} trials finished ("
            + ", ".join(f"{n} {s.lower()}" for s, n in sorted(states.items()))
            + ")",
        ]
        if self.best is None:
            return [*lines, "ripieno: no trial completed; nothing to write as best.yaml"
                    " (trials.csv says why).",
                    f"ripieno: trials     {self.trials_csv}"]
        shown = " ".join(
            f"{k.rsplit('.', 1)[-1]}={v:.4g}" if isinstance(v, float) else f"{k.rsplit('.', 1)[-1]}={v}"
            for k, v in self.best.user_attrs.get("values", {}).items()
        )
        lines += [
            f"ripieno: best       trial {self.best.number}: {setup.monitor} = {self.best.value:.6g}  {shown}",
            f"ripieno: best.yaml  {self.best_yaml}  (ripieno fit -c {self.best_yaml})",
            f"ripieno: trials     {self.trials_csv}",
            f"ripieno: figures    {', '.join(str(p) for p in self.figures) or '(none)'}",
        ]
        lines += [f"ripieno:            ({why})" for why in self.skipped_figures]
        if self.removed_checkpoints is not None:
            lines.append(f"ripieno: removed {self.removed_checkpoints} checkpoints of the other trials"
                         " (--keep_checkpoints best)")
        if self.final is not None:
            lines.append(f"ripieno: the best configuration over {len(self.final)} seeds (test metrics,"
                         f" {self.final_csv}):")
            lines += results.summarise_final(self.final)
        return lines


def tune(
    config: str | Path | Sequence[str | Path],
    overrides: Sequence[str] = (),
    **options: Any,  # noqa: ANN401 - ``TuneOptions``' fields
) -> TuneResult:
    """Run (or continue) an Optuna study over a recipe; return the study and its best configuration.

    Args:
        config: a recipe (a name as ``ripieno recipes`` lists it, or a YAML file), or several
            applied in order (``ripieno tune -c A -c B``).
        overrides: ``--key=value`` arguments passed to every trial's ``ripieno fit``.
        **options: ``TuneOptions``' fields (``n_trials``, ``space``, ``storage``, ``workers``, ...).

    Returns:
        The ``TuneResult``; its files are in ``result.study_dir``.

    Raises:
        RipienoInputError: a bad option, recipe, space, folder or storage, before any trial runs.
        KeyboardInterrupt: Ctrl-C, after the files were written from the store.
    """
    chosen = TuneOptions(**options)
    with quiet_optuna():  # the study says what happens in its own lines, as ``ripieno tune`` does
        setup = prepare(config, overrides, chosen)
        log.info(start_line(setup, config, chosen))
        try:
            run_study(setup, chosen)
        except KeyboardInterrupt:
            write_results(setup, chosen, interrupted=True)
            raise
        result = write_results(setup, chosen)
    log.info("\n".join(result.summary_lines()))
    return result


def prepare(
    config: str | Path | Sequence[str | Path], overrides: Sequence[str], options: TuneOptions
) -> TuneSetup:
    """Check the folder and storage, the recipe and space; describe the study. Nothing is written.

    Raises:
        RipienoInputError: a bad recipe, space, folder or storage (one line); a refusal leaves no folder.
        RecipeNotFoundError: a recipe name that is not shipped and no file.
    """
    configs = resolve_config_args([arg for c in _names(config) for arg in ("-c", c)])
    fit_args = [*configs, *overrides]
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


def _names(config: str | Path | Sequence[str | Path]) -> list[str]:
    """One recipe or several, as strings."""
    return [str(config)] if isinstance(config, str | Path) else [str(c) for c in config]


def start_line(setup: TuneSetup, config: str | Path | Sequence[str | Path], options: TuneOptions) -> str:
    """The line a study starts with.

    Its name, trials, recipes (as ``config`` names them), objective, storage and the workers' threads.
    """
    threads = thread_plan(options.workers, resolve_threads(options.workers, options.threads))
    return (
        f"ripieno: study {setup.study_name}: {setup.n_trials} trials of {' '.join(_names(config))},"
        f" {setup.monitor} {setup.direction[:3]}imised, space {setup.space.name or setup.space.source}"
        f" ({len(setup.space.params)} keys); storage {setup.storage}; {threads}"
    )


def run_study(setup: TuneSetup, options: TuneOptions) -> None:
    """Claim the study folder, create or check the study, and run ``options.workers`` workers until done.

    Raises:
        RipienoInputError: the folder or the stored study refuses (what made it is not what runs now).
        KeyboardInterrupt: Ctrl-C; the running trial is marked to run again.
    """
    claim_folder(setup.study_dir, "tune", setup.study_name, "--study_dir", STORE_FILE, options.storage)
    load_study(setup, announce=True)  # created here, or checked: what made it is what runs now
    with fits_interrupted():
        run_workers(setup, options.workers, options.threads)


def write_results(setup: TuneSetup, options: TuneOptions, *, interrupted: bool = False) -> TuneResult:
    """Write ``trials.csv``, ``best.yaml`` and the figures from the store; train the final seeds.

    After Ctrl-C (``interrupted``): the files from the store, no final seeds.
    """
    study = load_study(setup, storage=open_storage(setup.storage, setup.heartbeat))
    folder = setup.study_dir
    folder.mkdir(parents=True, exist_ok=True)
    frame = results.trial_rows(study, setup)
    results.write_csv(frame, folder / "trials.csv")
    best = results.best_trial(study)
    result = TuneResult(study=study, setup=setup, trials=frame, best=best, best_config=None,
                        trials_csv=folder / "trials.csv", interrupted=interrupted)
    if best is None:
        return result
    result.best_config = results.best_config(study, setup, best)
    result.best_yaml = results.write_best_yaml(study, setup, best, folder / "best.yaml")
    result.figures, result.skipped_figures = results.write_figures(study, folder)
    if options.keep_checkpoints == "best":
        result.removed_checkpoints = results.drop_checkpoints(study, folder, best)
    if not interrupted and options.final_seeds > 0:
        result.final = results.final_seeds(setup, folder / "best.yaml", options.final_seeds)
        result.final_csv = folder / "final.csv"
        results.write_csv(result.final, result.final_csv)
    return result


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


def run_workers(setup: TuneSetup, workers: int, threads: int | None = None) -> None:
    """Run ``workers`` workers on this machine: in this process for one, else in spawned processes.

    Each runs with ``resolve_threads(workers, threads)`` torch / BLAS threads (``worker_threads``).
    On Ctrl-C the spawned workers are interrupted too and waited for (``join_workers``), so that
    each marks its running trial to run again before the report is written.
    """
    if workers == 1:
        with worker_threads(threads):
            run_worker(setup)
        return
    each = resolve_threads(workers, threads)
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_worker_process, args=(setup, index, each), name=f"ripieno-tune-{index}")
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    join_workers(processes)


def _worker_process(setup: TuneSetup, index: int, threads: int) -> None:
    """A spawned worker with ``threads`` threads.

    Its messages go to stdout, like the command's; it stops when its parent dies.
    """
    stop_with_parent()
    with command_output(), quiet_optuna(), worker_threads(threads):
        try:
            with fits_interrupted():
                run_worker(setup)
        except KeyboardInterrupt:
            raise SystemExit(1) from None  # the parent says what was kept
        except RipienoInputError as error:
            raise SystemExit(f"ripieno: error: worker {index}: {str(error).splitlines()[0]}") from None


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
