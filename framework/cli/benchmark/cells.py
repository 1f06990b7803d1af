"""The benchmark's results store and its workers: one Optuna study whose trials are the cells.

A *cell* is one (protocol, data set, model, seed) fit. The store is an Optuna study
(``benchmark:<name>``) in ``ripieno tune``'s storages: an SQLite file in the output folder by
default, or any ``--storage`` URL or journal file, so workers on several machines share it. A
worker takes the next cell of its own list that is neither done nor running: it adds a waiting trial
carrying the cell's key (or finds one, e.g. a dead worker's retry) and claims it by moving it to
running, which the storage grants to one worker only; it fits the cell and records its scores on
the trial. A worker never runs a cell outside its list (``--datasets`` / ``--models``).

Rules, so that a benchmark can be stopped and continued and shared:

* a cell is *done* when a trial of it completed, or failed by an error of its own (recorded, not
  retried unless ``--retry_failed``); done cells are never run again;
* a trial whose worker died (SIGKILL, a lost machine) is failed by the heartbeat (RDB storages:
  Optuna's; journal: ``JournalHeartbeat``) and its cell is enqueued again;
* a cell claimed by two workers at once (each through its own new trial) runs once: the later trial
  sees the earlier one running or complete and stops before fitting (marked ``ripieno_duplicate``).

The tuned protocol runs, inside the first cell of a (data set, model), a ``ripieno tune``-style
study ``benchmark:<name>:tune:<data set>:<model>`` (TPE over the model's ``space``, each trial a fit
scored on the validation rows); every seed's cell then fits the best values.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from ripieno.framework.cli.benchmark.config import BenchmarkConfig
from ripieno.framework.cli.benchmark.models import PRIMARY, FitResult, fit_and_score
from ripieno.framework.cli.error_lines import one_line_error
from ripieno.framework.cli.tune.space import SearchSpace
from ripieno.framework.cli.tune.study_storage import (
    ERROR_ATTR,
    SURPLUS_ATTR,
    JournalHeartbeat,
    counts,
    reap_stale_trials,
)
from ripieno.framework.errors import RipienoInputError, first_line
from ripieno.framework.messages import get_logger
from ripieno.framework.specs.table_splits import TableSplits, TableSplitsSource

log = get_logger(__name__)

CELL_ATTR = "ripieno_cell"
DUPLICATE_ATTR = "ripieno_duplicate"
RESULT_ATTR = "ripieno_result"
MAX_FAILURES_IN_A_ROW = 3


@dataclass(frozen=True)
class Cell:
    """One fit of the benchmark: ``protocol/dataset/model/seed``."""

    protocol: str
    dataset: str
    model: str
    seed: int

    @property
    def key(self) -> str:
        """The cell's key in the store."""
        return f"{self.protocol}/{self.dataset}/{self.model}/{self.seed}"

    @classmethod
    def from_key(cls, key: str) -> Cell:
        """The cell a key names (data set names may not hold ``/``)."""
        protocol, dataset, model, seed = key.split("/")
        return cls(protocol, dataset, model, int(seed))


def wanted_cells(config: BenchmarkConfig) -> list[Cell]:
    """Every cell of ``config``: data set-major, then model, then seed (the order workers take them)."""
    return [
        Cell(config.protocol, d.name, m.name, s)
        for d in config.datasets
        for m in config.models
        for s in config.seeds
    ]


def study_name(config: BenchmarkConfig) -> str:
    """The store's study name."""
    return f"benchmark:{config.name}"


def open_study(config: BenchmarkConfig, storage: optuna.storages.BaseStorage) -> optuna.Study:
    """The benchmark's study (created on first use)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.create_study(
            study_name=study_name(config), storage=storage, load_if_exists=True, direction="minimize"
        )


def cell_states(study: optuna.Study, retry_failed: bool = False) -> tuple[set[str], set[str]]:
    """Keys of the done cells and of the running ones (module docstring); waiting trials are free."""
    done, active = set(), set()
    for trial in study.get_trials(deepcopy=False):
        key = trial.user_attrs.get(CELL_ATTR)
        if key is None or DUPLICATE_ATTR in trial.user_attrs:
            continue
        if trial.state == TrialState.COMPLETE or (
            trial.state == TrialState.FAIL and ERROR_ATTR in trial.user_attrs and not retry_failed
        ):
            done.add(key)
        elif trial.state == TrialState.RUNNING:
            active.add(key)
    return done, active


@dataclass
class DataCache:
    """Each table's splits, prepared once per worker and reused by every model and seed."""

    config: BenchmarkConfig
    tables: dict[str, TableSplits] = field(default_factory=dict)

    def get(self, name: str) -> TableSplits:
        """The splits of data set ``name`` (the benchmark's ``data`` settings, then the entry's own)."""
        if name not in self.tables:
            self.tables[name] = load_table(self.config, name)
        return self.tables[name]


def load_table(config: BenchmarkConfig, name: str) -> TableSplits:
    """Instantiate the benchmark's datamodule for data set ``name`` and return its splits.

    Raises:
        RipienoInputError: the datamodule cannot serve ``table_splits`` (a class without it).
    """
    module_name, _, class_name = config.data_class.rpartition(".")
    import importlib

    cls = getattr(importlib.import_module(module_name), class_name)
    datamodule = cls(**{**config.data, **config.dataset(name).args})
    if not isinstance(datamodule, TableSplitsSource):
        raise RipienoInputError(
            f"data_class {config.data_class} has no table_splits(); use a datamodule that"
            " serves one, such as ripieno.datamodules.TabularDataModule."
        )
    return datamodule.table_splits()


class _Skip(Exception):  # noqa: N818 - not an error: a surplus tuning trial that never ran
    pass


def result_attrs(result: FitResult, data: TableSplits, params: dict[str, Any]) -> dict[str, Any]:
    """What a completed cell records (``results.csv`` columns)."""
    return {
        **{f"test_{k}": v for k, v in result.test.items()},
        **{f"val_{k}": v for k, v in result.val.items()},
        "seconds": round(result.seconds, 3),
        "n_parameters": result.n_parameters,
        "iterations": result.iterations,
        "task": data.task,
        "train_rows": data.rows()["train"],
        "params": json.dumps(params, sort_keys=True),
    }


class CellHeartbeat(JournalHeartbeat):
    """Signs of life of a claimed cell's trial: Optuna's heartbeat on RDB storages, ours on journals."""

    def __init__(self, study: optuna.Study, trial_id: int, interval: int) -> None:
        super().__init__(study, trial_id, interval)
        backend = getattr(study._storage, "_backend", study._storage)
        self._rdb = backend if isinstance(backend, RDBStorage) and backend.get_heartbeat_interval() else None
        if self._rdb is not None:
            self._active = True

    def _mark(self) -> None:
        if self._rdb is not None:
            self._rdb.record_heartbeat(self._trial_id)
        else:
            super()._mark()


def claim(study: optuna.Study, cell: Cell) -> Trial | None:
    """A running trial of ``cell`` that this worker owns, or ``None`` if another worker has the cell."""
    storage = study._storage
    waiting = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if t.user_attrs.get(CELL_ATTR) == cell.key
    ]
    if not waiting:
        study.add_trial(optuna.create_trial(state=TrialState.WAITING, user_attrs={CELL_ATTR: cell.key}))
        waiting = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if t.user_attrs.get(CELL_ATTR) == cell.key
        ]
    for trial in waiting:
        try:
            if storage.set_trial_state_values(trial._trial_id, TrialState.RUNNING):
                break
        except (RuntimeError, ValueError, optuna.exceptions.UpdateFinishedTrialError):
            continue  # another worker moved it first
    else:
        return None
    mine = Trial(study, trial._trial_id)
    for other in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)):
        if (
            other.user_attrs.get(CELL_ATTR) == cell.key
            and other.number != mine.number
            and (other.state == TrialState.COMPLETE or other.number < mine.number)
        ):
            mine.set_user_attr(DUPLICATE_ATTR, other.number)
            study.tell(mine, state=TrialState.FAIL)
            return None
    return mine


def run_cell(config: BenchmarkConfig, trial: Trial, cell: Cell, cache: DataCache, heartbeat: int) -> float:
    """Fit ``cell`` on its claimed ``trial`` and record its scores; returns the primary test metric.

    Raises:
        Exception: the fit's error, recorded on the trial as ``ripieno_error``.
    """
    try:
        spec = config.model(cell.model)
        with CellHeartbeat(trial.study, trial._trial_id, heartbeat):
            data = cache.get(cell.dataset)
            params = (
                tuned_params(config, cell, data, trial.study._storage) if cell.protocol == "tuned" else {}
            )
            result = fit_and_score(spec, data, cell.seed, params)
    except Exception as error:
        trial.set_user_attr(
            ERROR_ATTR, one_line_error(error) or f"{type(error).__name__}: {first_line(error)}"
        )
        raise
    attrs = result_attrs(result, data, params)
    for name, value in attrs.items():
        trial.set_user_attr(name, value)
    metric, _ = PRIMARY[data.task]
    return float(result.test[metric])


def tuned_params(config: BenchmarkConfig, cell: Cell, data: TableSplits, storage: Any) -> dict[str, Any]:  # noqa: ANN401
    """The best values of the (data set, model) tuning study, running its missing trials first."""
    spec = config.model(cell.model)
    if not spec.space:
        return {}
    space = SearchSpace.from_dict({"params": spec.space})
    metric, mode = PRIMARY[data.task]
    settings = config.tuning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(
            study_name=f"{study_name(config)}:tune:{cell.dataset}:{cell.model}",
            storage=storage,
            load_if_exists=True,
            direction="maximize" if mode == "max" else "minimize",
            sampler=optuna.samplers.TPESampler(n_startup_trials=settings.startup_trials, seed=settings.seed),
        )

    def objective(trial: Trial) -> float:
        ahead = [t for t in trial.study.get_trials(deepcopy=False) if t.number < trial.number and counts(t)]
        if len(ahead) >= settings.n_trials:
            trial.set_user_attr(SURPLUS_ATTR, True)
            raise _Skip
        values = space.suggest(trial)
        trial.set_user_attr("values", values)
        try:
            result = fit_and_score(spec, data, settings.fit_seed, values)
        except Exception as error:
            trial.set_user_attr(ERROR_ATTR, one_line_error(error) or first_line(error))
            raise
        trial.set_user_attr("seconds", round(result.seconds, 3))
        return float(result.val[metric])

    while True:
        trials = study.get_trials(deepcopy=False)
        if sum(counts(t) for t in trials) >= settings.n_trials:
            if not any(t.state == TrialState.RUNNING for t in trials):
                break
            time.sleep(2.0)  # another worker's trial of this study is still running
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.optimize(objective, n_trials=1, catch=(Exception,), gc_after_trial=True)
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    if not complete:
        raise RipienoInputError(
            f"tuning {cell.model} on {cell.dataset}: no trial completed; the trials'"
            f" errors are in study {study.study_name}."
        )
    best = max(complete, key=lambda t: t.value) if mode == "max" else min(complete, key=lambda t: t.value)
    return dict(best.user_attrs["values"])


def run_worker(
    config: BenchmarkConfig,
    storage: optuna.storages.BaseStorage,
    *,
    wanted: list[Cell] | None = None,
    heartbeat: int = 30,
    poll: float = 2.0,
    retry_failed: bool = False,
    on_cell: Callable[[FrozenTrial], None] | None = None,
) -> None:
    """Run this worker's cells until each is done here or elsewhere (module docstring).

    Args:
        config: the benchmark.
        storage: the open store.
        wanted: the cells this worker may run (default: every cell of ``config``).
        heartbeat: seconds between a running cell's signs of life.
        poll: seconds between looks at cells other workers run.
        retry_failed: run again (once per command) the cells that failed by their own error.
        on_cell: called with each finished trial (progress lines).
    """
    study = open_study(config, storage)
    cache = DataCache(config)
    wanted = wanted_cells(config) if wanted is None else wanted
    failures, last_error = 0, None
    tried: set[str] = set()
    while True:
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise RipienoInputError(
                f"{failures} cells in a row failed, the last with: {last_error}; fix that"
                " and run the same command again (finished cells are kept)."
            )
        reap_stale_trials(study, heartbeat)
        done, running = cell_states(study, retry_failed)
        todo = [c for c in wanted if c.key not in done and c.key not in running and c.key not in tried]
        if not todo:
            if any(c.key in running for c in wanted):
                time.sleep(poll)  # another worker's cells; a dead one's come back through the heartbeat
                continue
            return
        cell = todo[0]
        trial = claim(study, cell)
        if trial is None:
            continue
        if retry_failed:
            tried.add(cell.key)
        try:
            value = run_cell(config, trial, cell, cache, heartbeat)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C (Lightning turns it into SystemExit): rerun it
            study.tell(trial, state=TrialState.FAIL)
            raise
        except Exception:  # noqa: BLE001 - recorded on the trial (ripieno_error); the next cell runs
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, value)
        finished = study._storage.get_trial(trial._trial_id)
        if on_cell is not None:
            on_cell(finished)
        last_error = finished.user_attrs.get(ERROR_ATTR)
        failures = failures + 1 if last_error else 0
