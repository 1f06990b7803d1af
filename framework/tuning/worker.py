"""A ``ripieno tune`` worker: it runs the study's trials, one ``ripieno fit`` at a time, until enough ran.

Every worker (``--workers N`` processes on this machine, or ``ripieno tune`` commands on several
machines sharing the storage) runs the same loop: fail the trials whose worker died (they are
retried), stop when ``n_trials`` trials count (``study_storage.counts``) and none is waiting,
else run one more. While other workers still run the last trials it waits for them, so every
command ends with the whole study done. A trial:

* draws its values from the search space and runs the recipe with them as ``--key=value``
  overrides, in ``<study_dir>/trials/trial_NNNN`` (a plain run folder: ``config.yaml``, metrics,
  checkpoints);
* is pruned by Optuna's Lightning callback (``optuna_integration.PyTorchLightningPruningCallback``,
  which works with Lightning 2.6) when its monitored metric lags the others at the same epoch;
* is pruned, not failed, when its loss or metric goes non-finite (``NonFiniteGuard``'s error);
* returns the best epoch's monitored value (the recipe's ``ModelCheckpoint`` ``monitor`` / ``mode``);
* records the complete config it ran (its run folder's ``config.yaml``), from which ``best.yaml``
  is written;
* interrupted by Ctrl-C, is failed without an error of its own, so it does not count and the
  study runs another in its place when it goes on;
* on several devices (``--trainer.strategy=ddp --trainer.devices=N``) is one process group of its
  own: the launched ranks run this trial's ``ripieno fit`` and end with it (``ddp_trials``).

A study records what decides its results (``record``): the monitor and direction, the space, the
resolved recipe with every override (``recipe``, without the space's keys and the presentation
keys a trial sets itself) and the identity of the data files it names. A command that would
continue it with anything else is refused, naming the first difference.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import optuna
from lightning.pytorch.callbacks import Callback
from optuna.trial import FrozenTrial, Trial, TrialState
from optuna_integration import PyTorchLightningPruningCallback
from typing_extensions import override

from ripieno.framework.errors import NonFiniteTrainingError, RipienoInputError, exception_chain, first_line
from ripieno.framework.messages import get_logger, quiet_lightning
from ripieno.framework.runner.command import quiet_cli_notices
from ripieno.framework.runner.ddp_trials import trial_command
from ripieno.framework.runner.error_lines import one_line_error
from ripieno.framework.runner.fingerprints import first_difference, without_keys
from ripieno.framework.runner.interrupts import fits_interrupted
from ripieno.framework.runner.run_folders import RunConfigSaver
from ripieno.framework.tuning.space import SearchSpace
from ripieno.framework.tuning.study_storage import (
    ERROR_ATTR,
    SURPLUS_ATTR,
    JournalHeartbeat,
    counts,
    open_storage,
    reap_stale_trials,
)
from ripieno.framework.tuning.trial_run import (
    QUIET_TRIAL,
    TRIAL_WARNINGS,
    DataCache,
    TrialCLI,
    best_score,
    finite,
    override_args,
)
from ripieno.framework.tuning.trial_seeds import TrialSeededSampler

log = get_logger(__name__)

SPACE_ATTR = "ripieno_study"
"""Study user attribute: the monitor, direction and search space the study was made with."""
VALUES_ATTR = "values"
"""User attribute: the config values a trial ran with (``or_zero`` keys resolved to their value)."""
FOLDER_ATTR = "folder"
EPOCHS_ATTR = "epochs"
PRUNED_ATTR = "pruned_reason"
CONFIG_ATTR = "config"
"""User attribute: the complete config a trial ran, as its run folder's ``config.yaml`` holds it."""
INTERRUPTED_ATTR = "interrupted"
"""User attribute of a trial stopped by Ctrl-C (failed, not counted: another trial runs in its place)."""
PRESENTATION_KEYS = (
    "trainer.default_root_dir",
    "trainer.enable_progress_bar",
    "trainer.enable_model_summary",
    "test_after_fit",
)
"""Config keys every trial sets itself (``QUIET_TRIAL`` and its folder): they decide no result."""
RECORD_LABELS = {
    "monitor": "another monitored metric",
    "direction": "another direction",
    "space": "another search space",
    "recipe": "another recipe or other overrides",
    "data": "other data",
}
"""What a study records (``TuneSetup.record``), in the words a refusal uses."""


@dataclass
class TuneSetup:
    """What every worker of one study needs (picklable, so ``--workers`` processes get a copy).

    Args:
        fit_args: the ``ripieno fit`` arguments of the recipe (``-c`` files and the user's overrides).
        space: the search space.
        study_name: the study's name in the storage.
        storage: the storage URL.
        study_dir: the study folder (trial run folders go in ``trials/``).
        n_trials: how many trials the study must finish.
        monitor: the metric each trial returns (the recipe's ``ModelCheckpoint`` monitor).
        direction: ``minimize`` or ``maximize`` (its ``mode``).
        seed: the sampler's seed (``None``: random); trial ``n`` draws with a seed derived from it and ``n``.
        startup_trials: random trials before TPE models the results (the TabM paper: 20).
        pruner: ``median``, ``hyperband`` or ``none``.
        timeout: seconds after which no new trial starts (``None``: no limit).
        heartbeat: seconds between a running trial's signs of life.
        poll: seconds between looks at a study whose last trials run elsewhere.
        pruner_warmup: epochs a trial runs before the median pruner may stop it.
        recipe: the resolved recipe with every override, without the space's keys.
        data: the identity of each data file the recipe names (``fingerprints.data_files``).
    """

    fit_args: list[str]
    space: SearchSpace
    study_name: str
    storage: str
    study_dir: Path
    n_trials: int
    monitor: str
    direction: str
    seed: int | None = None
    startup_trials: int = 20
    pruner: str = "median"
    timeout: float | None = None
    heartbeat: int = 30
    poll: float = 2.0
    pruner_warmup: int = 2
    recipe: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """What the study records of what decides its results (module docstring)."""
        return {
            "monitor": self.monitor,
            "direction": self.direction,
            "space": self.space.describe(),
            "recipe": without_keys(self.recipe, PRESENTATION_KEYS),
            "data": self.data,
            "presentation": {key: _dotted(self.recipe, key) for key in PRESENTATION_KEYS},
        }


def _dotted(config: dict[str, Any], key: str) -> Any:  # noqa: ANN401 - a config value
    """The value at dotted ``key`` in a nested config (``None`` where absent)."""
    node: Any = config
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def make_sampler(setup: TuneSetup) -> optuna.samplers.BaseSampler:
    """TPE with ``startup_trials`` random trials first; with ``seed``, each trial seeded by its number."""
    return tpe_sampler(setup.startup_trials, setup.seed)


def tpe_sampler(startup_trials: int, seed: int | None) -> optuna.samplers.BaseSampler:
    """TPE with ``startup_trials`` random trials first; a seeded one draws each trial with its own seed.

    Seeded once, a sampler would replay its draws when the study is continued or shared by workers
    (``trial_seeds``); ``seed=None`` draws from fresh entropy.
    """
    if seed is None:
        return optuna.samplers.TPESampler(n_startup_trials=startup_trials)
    return TrialSeededSampler(
        seed, lambda s: optuna.samplers.TPESampler(n_startup_trials=startup_trials, seed=s)
    )


def make_pruner(name: str, warmup: int = 2) -> optuna.pruners.BasePruner:
    """The pruner ``--pruner`` names; the median pruner waits ``warmup`` epochs in each trial."""
    if name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=5, n_warmup_steps=warmup)
    if name == "hyperband":
        return optuna.pruners.HyperbandPruner()
    return optuna.pruners.NopPruner()


def load_study(setup: TuneSetup, storage: Any = None, announce: bool = False) -> optuna.Study:  # noqa: ANN401
    """The study, created on first use, with the sampler and the pruner.

    A new study records what decides its results (``TuneSetup.record``); an existing one must have
    the same. A study made before ripieno recorded some of it gets the missing parts now.

    Args:
        setup: the study's description.
        storage: an open storage (``None``: open ``setup.storage``).
        announce: print a line when a study of an older ripieno gets its record completed.

    Raises:
        RipienoInputError: the study exists with another space, metric, direction, recipe or data.
    """
    storage = storage if storage is not None else open_storage(setup.storage, setup.heartbeat)
    study = optuna.create_study(
        study_name=setup.study_name,
        storage=storage,
        direction=setup.direction,
        sampler=make_sampler(setup),
        pruner=make_pruner(setup.pruner, setup.pruner_warmup),
        load_if_exists=True,
    )
    recorded = study.user_attrs.get(SPACE_ATTR)
    mine = setup.record()
    if recorded is None:
        study.set_user_attr(SPACE_ATTR, mine)
        return study
    for key, label in RECORD_LABELS.items():
        if key not in recorded:
            continue
        difference = first_difference(recorded[key], mine[key])
        if difference is not None:
            raise RipienoInputError(
                f"study {setup.study_name} in {setup.storage} was made with {label} (first"
                f" difference: {difference}); run the command that made it, or start a new study"
                " with --study_name (or another --study_dir)."
            )
    missing = [key for key in mine if key not in recorded]
    if missing:
        study.set_user_attr(SPACE_ATTR, {**recorded, **{key: mine[key] for key in missing}})
        unchecked = [RECORD_LABELS[key].split(" ", 1)[1] for key in missing if key in RECORD_LABELS]
        if announce and unchecked:
            log.info(
                f"ripieno: study {setup.study_name} recorded no {' or '.join(unchecked)} (an older"
                " ripieno made it); this command's are recorded now and checked from here on"
            )
    return study


MAX_FAILURES_IN_A_ROW = 3
"""A worker stops after this many trials in a row failed by an error (not pruned): it is not the values."""


class TrialsFailingError(RipienoInputError):
    """Trials keep failing with an error of the recipe or the machine, whatever values they draw."""


class _EpochCount(Callback):
    """Remembers how many training epochs a trial ran (for ``trials.csv``), pruned or not."""

    def __init__(self) -> None:
        self.epochs = 0

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.epochs = trainer.current_epoch + 1


class _Surplus(Exception):  # noqa: N818 - not an error: the trial was one too many
    """A trial started beyond ``n_trials`` by a concurrent worker; it stops before running anything."""


def run_trial(setup: TuneSetup, trial: Trial, cache: DataCache | None) -> float:
    """Run one trial (module docstring) and return its best monitored value.

    Raises:
        optuna.TrialPruned: pruned by the pruner, or its loss/metric went non-finite.
        Exception: anything else that stopped the trial, recorded on it as ``ripieno_error`` (it counts).
    """
    ahead = [t for t in trial.study.get_trials(deepcopy=False) if t.number < trial.number and counts(t)]
    if len(ahead) >= setup.n_trials:
        trial.set_user_attr(SURPLUS_ATTR, True)
        raise _Surplus
    epochs = _EpochCount()
    try:
        with fits_interrupted():
            return _train(setup, trial, cache, epochs)
    except KeyboardInterrupt:
        trial.set_user_attr(EPOCHS_ATTR, epochs.epochs)
        trial.set_user_attr(INTERRUPTED_ATTR, True)
        raise  # Optuna fails the trial (it does not count) and raises it again
    except optuna.TrialPruned:
        trial.set_user_attr(EPOCHS_ATTR, epochs.epochs)
        trial.set_user_attr(PRUNED_ATTR, f"behind the other trials at epoch {epochs.epochs}")
        raise
    except Exception as error:
        trial.set_user_attr(EPOCHS_ATTR, epochs.epochs)
        non_finite = next((e for e in exception_chain(error) if isinstance(e, NonFiniteTrainingError)), None)
        if non_finite is not None:
            trial.set_user_attr(PRUNED_ATTR, first_line(non_finite))
            raise optuna.TrialPruned(first_line(non_finite)) from None
        trial.set_user_attr(
            ERROR_ATTR, one_line_error(error) or f"{type(error).__name__}: {first_line(error)}"
        )
        raise


def _train(setup: TuneSetup, trial: Trial, cache: DataCache | None, epochs: _EpochCount) -> float:
    """Draw the trial's values, fit the recipe with them, and return the best monitored value."""
    values = setup.space.suggest(trial)
    folder = setup.study_dir / "trials" / f"trial_{trial.number:04d}"
    trial.set_user_attr(VALUES_ATTR, values)
    trial.set_user_attr(FOLDER_ATTR, str(folder))
    args = [
        "fit",
        *setup.fit_args,
        *override_args(values),
        f"--trainer.default_root_dir={folder}",
        *QUIET_TRIAL,
    ]
    pruning = PyTorchLightningPruningCallback(trial, monitor=setup.monitor)
    with (
        quiet_lightning(logging.ERROR, TRIAL_WARNINGS),
        quiet_cli_notices(),
        JournalHeartbeat(trial.study, trial._trial_id, setup.heartbeat),
        trial_command(args, setup.monitor),  # under the ddp launcher, the other ranks run this fit
    ):
        cli = TrialCLI(args=args, trainer_defaults={"callbacks": [pruning, epochs]}, data_cache=cache)
    trial.set_user_attr(EPOCHS_ATTR, epochs.epochs)
    pruning.check_pruned()  # several processes: the pruning decision comes back through the storage
    saver = next((c for c in cli.trainer.callbacks if isinstance(c, RunConfigSaver)), None)
    if saver is not None:
        trial.set_user_attr(CONFIG_ATTR, saver.config_text())
    score, checkpoint = best_score(cli.trainer, setup.monitor)
    if checkpoint is not None and checkpoint.best_model_path:
        trial.set_user_attr("checkpoint", checkpoint.best_model_path)
    if not finite(score):
        raise optuna.TrialPruned(f"no finite {setup.monitor} was logged")
    return float(score)  # type: ignore[arg-type]


def run_worker(
    setup: TuneSetup, storage: Any = None, cache: DataCache | None = None  # noqa: ANN401
) -> None:
    """Run trials until ``n_trials`` trials count and none runs elsewhere (module docstring).

    Every worker draws with the same sampler: with a seed, each trial's own (``trial_seeds``).

    Args:
        setup: the study's description.
        storage: an open storage (``None``: open ``setup.storage``).
        cache: the datamodules kept from earlier trials (``None``: a new, empty one).
    """
    study = load_study(setup, storage)
    cache = cache if cache is not None else DataCache()
    started = time.monotonic()
    announced_wait = False
    failures, last_error = 0, None
    progress = _Progress(setup)
    while True:
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise TrialsFailingError(
                f"{failures} trials in a row failed, the last with: {last_error}; fix"
                " that and run the same command again (the study continues)."
            )
        reap_stale_trials(study, setup.heartbeat)
        trials = study.get_trials(deepcopy=False)
        counted = [t for t in trials if counts(t)]
        waiting = any(t.state == TrialState.WAITING for t in trials)
        if len(counted) >= setup.n_trials and not waiting:
            if not any(t.state == TrialState.RUNNING for t in trials):
                return
            if not announced_wait:
                log.info(
                    "ripieno: waiting for the trials other workers run (a dead one is retried after"
                    f" {2 * setup.heartbeat} s without a heartbeat)"
                )
                announced_wait = True
            time.sleep(setup.poll)
            continue
        if setup.timeout is not None and time.monotonic() - started > setup.timeout:
            log.info(f"ripieno: --timeout {setup.timeout:g} s reached; no new trial starts")
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.optimize(
                lambda trial: run_trial(setup, trial, cache),
                n_trials=1,
                catch=(Exception,),
                callbacks=[progress],
                gc_after_trial=True,
            )
        last_error = progress.last.user_attrs.get(ERROR_ATTR) if progress.last is not None else None
        failures = failures + 1 if last_error else 0


class _Progress:
    """The one line a worker prints per finished trial."""

    def __init__(self, setup: TuneSetup) -> None:
        self.setup = setup
        self.last: FrozenTrial | None = None

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.last = trial
        if trial.user_attrs.get(SURPLUS_ATTR):
            return
        done = sum(1 for t in study.get_trials(deepcopy=False) if counts(t) and t.state.is_finished())
        seconds = trial.duration.total_seconds() if trial.duration else math.nan
        line = f"ripieno: trial {trial.number:>3} ({done}/{self.setup.n_trials}) {trial.state.name:<8}"
        if trial.state == TrialState.COMPLETE:
            line += f" {self.setup.monitor}={trial.value:.6g}"
        elif trial.state == TrialState.PRUNED:
            line += f" ({trial.user_attrs.get(PRUNED_ATTR, 'pruned')})"
        elif trial.state == TrialState.FAIL:
            line += f" ({trial.user_attrs.get(ERROR_ATTR, 'failed')})"
        try:
            best = study.best_trial
            line += f"  best {best.value:.6g} (trial {best.number})"
        except ValueError:
            pass
        values = trial.user_attrs.get(VALUES_ATTR, {})
        shown = " ".join(f"{key.rsplit('.', 1)[-1]}={_short(value)}" for key, value in values.items())
        log.info(f"{line}  {seconds:.1f} s  {shown}")


def _short(value: Any) -> str:  # noqa: ANN401 - any sampled value
    return f"{value:.4g}" if isinstance(value, float) else str(value)
