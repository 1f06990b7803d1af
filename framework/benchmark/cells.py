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
  sees the earlier one running or complete and stops before fitting (marked ``ripieno_duplicate``);
* a cell records its *fingerprint* (``cell_fingerprint``: the model's kind, parameters and space,
  the datamodule's arguments and the table's identity, the tuning settings, the conformal
  settings that decide the calibration and training rows): a finished cell counts
  as done only for the fingerprint it was fitted with. The command refuses to go on when finished
  cells were made from other inputs, or, asked to (``--refit_changed``), fits them again;
  cells of a store made before fingerprints were recorded are taken as made from the current file
  without its conformal settings, which they predate (``adopt_unrecorded``), once, and said so.

The tuned protocol runs, inside the first cell of a (data set, model), a ``ripieno tune``-style
study ``benchmark:<name>:tune:<data set>:<model>:<fingerprint digest>`` (TPE over the model's
``space``, each trial a fit scored on the validation rows, each drawn with its own seed); every
seed's cell then fits the best values.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import optuna
import torch
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, Trial, TrialState

from ripieno.framework.benchmark.config import BenchmarkConfig, datamodule_class, fingerprint_data_args
from ripieno.framework.benchmark.models import PRIMARY, FitResult, fit_and_score
from ripieno.framework.benchmark.uncertainty import ConformalSettings, calibration_splits
from ripieno.framework.errors import RipienoInputError, first_line
from ripieno.framework.messages import get_logger
from ripieno.framework.runner.error_lines import one_line_error
from ripieno.framework.runner.fingerprints import digest, first_difference
from ripieno.framework.specs.table_splits import TableSplits, TableSplitsSource
from ripieno.framework.tuning.space import SearchSpace
from ripieno.framework.tuning.study_storage import (
    ERROR_ATTR,
    SURPLUS_ATTR,
    JournalHeartbeat,
    counts,
    reap_stale_trials,
)
from ripieno.framework.tuning.worker import tpe_sampler

log = get_logger(__name__)

CELL_ATTR = "ripieno_cell"
DUPLICATE_ATTR = "ripieno_duplicate"
RESULT_ATTR = "ripieno_result"
FINGERPRINT_ATTR = "ripieno_fingerprint"
"""User attribute of a cell's trial: what decided its result (``cell_fingerprint``)."""
REFIT_ATTR = "ripieno_refit"
"""User attribute of a cell fitted again because its inputs changed: what changed."""
ADOPTED_ATTR = "ripieno_adopted"
"""Study user attribute: {trial number: fingerprint} of cells an older ripieno fitted without one."""
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


def _moved_arguments(data_class: str) -> dict[str, str]:
    """The data class's ``MOVED_ARGUMENTS`` (its flat arguments of earlier releases), or none."""
    cls, _ = datamodule_class(data_class, "benchmark")
    return dict(getattr(cls, "MOVED_ARGUMENTS", None) or {})


def cell_fingerprint(
    config: BenchmarkConfig, cell: Cell, tables: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """What decides ``cell``'s result: the model, the datamodule's arguments, the table, the tuning.

    And the conformal settings (``ConformalSettings.fingerprint``: the calibration rows, which the
    training rows give up, and ``alpha``), except with ``calibrate_on: none``, whose cells fit and
    score as those of a store made before conformal scores existed.

    Args:
        config: the benchmark.
        cell: the cell.
        tables: each data set's identity (``config.table_identity``).
    """
    spec = config.model(cell.model)
    fingerprint: dict[str, Any] = {
        "model": {"kind": spec.kind, "params": spec.params},
        "data": {
            "class": config.data_class,
            "args": fingerprint_data_args({**config.data, **config.dataset(cell.dataset).args},
                                          _moved_arguments(config.data_class)),
            "table": tables[cell.dataset],
        },
    }
    conformal = config.conformal.fingerprint()
    if conformal is not None:
        fingerprint["conformal"] = conformal
    if cell.protocol == "tuned":
        fingerprint["model"]["space"] = spec.space
        fingerprint["tuning"] = asdict(config.tuning)
    return fingerprint


def recorded_fingerprint(study: optuna.Study, trial: FrozenTrial) -> dict[str, Any] | None:
    """The fingerprint ``trial`` was fitted with (its own, or the one adopted for it), if any."""
    return trial.user_attrs.get(FINGERPRINT_ATTR) or (study.user_attrs.get(ADOPTED_ATTR) or {}).get(
        str(trial.number)
    )


def _finished(trial: FrozenTrial) -> bool:
    """A cell's trial that completed or failed by its own error (not a duplicate)."""
    return (
        CELL_ATTR in trial.user_attrs
        and DUPLICATE_ATTR not in trial.user_attrs
        and (
            trial.state == TrialState.COMPLETE
            or (trial.state == TrialState.FAIL and ERROR_ATTR in trial.user_attrs)
        )
    )


def adopt_unrecorded(study: optuna.Study, fingerprints: dict[str, dict[str, Any]]) -> int:
    """Record the current fingerprint for finished cells an older ripieno fitted without one; how many.

    Only cells of this command (``fingerprints``' keys) are adopted; a finished trial cannot take a
    new attribute, so the study keeps them (``ADOPTED_ATTR``). Such a cell predates the conformal
    settings too: it was fitted on every training row, so it is adopted without them (as
    ``calibrate_on: none``), and a file that carves calibration rows finds it changed.
    """
    adopted = dict(study.user_attrs.get(ADOPTED_ATTR) or {})
    new = {
        str(t.number): {k: v for k, v in fingerprints[t.user_attrs[CELL_ATTR]].items() if k != "conformal"}
        for t in study.get_trials(deepcopy=False)
        if _finished(t)
        and t.user_attrs[CELL_ATTR] in fingerprints
        and recorded_fingerprint(study, t) is None
    }
    if new:
        study.set_user_attr(ADOPTED_ATTR, {**adopted, **new})
    return len(new)


def changed_cells(study: optuna.Study, fingerprints: dict[str, dict[str, Any]]) -> dict[str, str]:
    """{cell key: what changed} for completed cells of ``fingerprints`` none of whose fits matches it.

    A cell with a finished fit of its current fingerprint is not changed, whatever older fits exist.
    A cell that failed with other inputs is no result to replace: it simply runs again.
    """
    current: set[str] = set()
    changed: dict[str, str] = {}
    for trial in study.get_trials(deepcopy=False):
        key = trial.user_attrs.get(CELL_ATTR)
        if key not in fingerprints or not _finished(trial):
            continue
        recorded = recorded_fingerprint(study, trial)
        difference = None if recorded is None else first_difference(recorded, fingerprints[key])
        if difference is None:
            current.add(key)
        elif trial.state == TrialState.COMPLETE:
            changed[key] = difference
    return {key: why for key, why in changed.items() if key not in current}


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


def cell_states(
    study: optuna.Study,
    retry_failed: bool = False,
    fingerprints: dict[str, dict[str, Any]] | None = None,
) -> tuple[set[str], set[str]]:
    """Keys of the done cells and of the running ones (module docstring); waiting trials are free.

    With ``fingerprints``, a finished trial makes its cell done only if it was fitted with the
    cell's current fingerprint (or recorded none).
    """
    done, active = set(), set()
    for trial in study.get_trials(deepcopy=False):
        key = trial.user_attrs.get(CELL_ATTR)
        if key is None or DUPLICATE_ATTR in trial.user_attrs:
            continue
        if trial.state == TrialState.COMPLETE or (
            trial.state == TrialState.FAIL and ERROR_ATTR in trial.user_attrs and not retry_failed
        ):
            recorded = recorded_fingerprint(study, trial)
            if fingerprints is None or recorded is None or key not in fingerprints or (
                first_difference(recorded, fingerprints[key]) is None
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
        """The splits of data set ``name`` (the benchmark's ``data`` settings, then the entry's own).

        With ``conformal.calibrate_on: train``, the calibration rows are carved from the training
        rows here (``calibration_splits``), before any model sees them.
        """
        if name not in self.tables:
            self.tables[name] = calibration_splits(load_table(self.config, name), self.config.conformal)
        return self.tables[name]


def load_table(config: BenchmarkConfig, name: str) -> TableSplits:
    """Instantiate the benchmark's datamodule for data set ``name`` and return its splits.

    Raises:
        RipienoInputError: the datamodule cannot serve ``table_splits`` (a class without it).
    """
    cls, _ = datamodule_class(config.data_class, f"benchmark {config.source}")
    datamodule = cls(**{**config.data, **config.dataset(name).args})
    if not isinstance(datamodule, TableSplitsSource):
        raise RipienoInputError(
            f"data_class {config.data_class} has no table_splits(); use a datamodule that"
            " serves one, such as ripieno.datamodules.TabularDataModule."
        )
    return datamodule.table_splits()


class _Skip(Exception):  # noqa: N818 - not an error: a surplus tuning trial that never ran
    pass


def result_attrs(
    result: FitResult,
    data: TableSplits,
    params: dict[str, Any],
    conformal: ConformalSettings | None = None,
) -> dict[str, Any]:
    """What a completed cell records (``results.csv`` columns), the test split's size among them.

    Where the fit scored conformal sets or intervals, also ``conformal``'s ``alpha`` and
    ``calibrate_on``, and ``calibration_rows``.
    """
    test = np.asarray(data.targets["test"])
    smallest = None
    if data.n_classes:
        smallest = int(np.bincount(test.astype(int), minlength=data.n_classes).min())
    calibration = {}
    if conformal is not None and result.calibration_rows:
        calibration = {"alpha": conformal.alpha, "calibrate_on": conformal.calibrate_on,
                       "calibration_rows": result.calibration_rows}
    return {
        **{f"test_{k}": v for k, v in result.test.items()},
        **{f"val_{k}": v for k, v in result.val.items()},
        "seconds": round(result.seconds, 3),
        "threads": torch.get_num_threads(),  # what the fit ran with (the worker's share of the cores)
        "n_parameters": result.n_parameters,
        "iterations": result.iterations,
        "task": data.task,
        "train_rows": data.rows()["train"],
        "test_rows": data.rows()["test"],
        "test_smallest_class": smallest,
        "params": json.dumps(params, sort_keys=True),
        **calibration,
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


def claim(study: optuna.Study, cell: Cell, fingerprint: dict[str, Any] | None = None) -> Trial | None:
    """A running trial of ``cell`` that this worker owns, or ``None`` if another worker has the cell.

    A completed trial of the cell makes this one a duplicate only if it was fitted with
    ``fingerprint`` (a changed cell is fitted again beside its old result).
    """
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
    if fingerprint is not None:
        mine.set_user_attr(FINGERPRINT_ATTR, fingerprint)
    for other in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.RUNNING)):
        recorded = recorded_fingerprint(study, other)
        current = fingerprint is None or recorded is None or first_difference(recorded, fingerprint) is None
        if (
            other.user_attrs.get(CELL_ATTR) == cell.key
            and other.number != mine.number
            and (
                (other.state == TrialState.COMPLETE and current)
                or (other.state == TrialState.RUNNING and other.number < mine.number)
            )
        ):
            mine.set_user_attr(DUPLICATE_ATTR, other.number)
            study.tell(mine, state=TrialState.FAIL)
            return None
    return mine


def run_cell(
    config: BenchmarkConfig,
    trial: Trial,
    cell: Cell,
    cache: DataCache,
    heartbeat: int,
    fingerprint: dict[str, Any] | None = None,
) -> float:
    """Fit ``cell`` on its claimed ``trial`` and record its scores; returns the primary test metric.

    Args:
        config: the benchmark.
        trial: the cell's claimed trial.
        cell: the cell.
        cache: the worker's prepared tables.
        heartbeat: seconds between signs of life.
        fingerprint: what decides the cell's result (``cell_fingerprint``; ``claim`` records it).

    Raises:
        Exception: the fit's error, recorded on the trial as ``ripieno_error``.
    """
    try:
        spec = config.model(cell.model)
        with CellHeartbeat(trial.study, trial._trial_id, heartbeat):
            data = cache.get(cell.dataset)
            params = (
                tuned_params(config, cell, data, trial.study._storage, fingerprint)
                if cell.protocol == "tuned"
                else {}
            )
            result = fit_and_score(spec, data, cell.seed, params, config.conformal)
    except Exception as error:
        trial.set_user_attr(
            ERROR_ATTR, one_line_error(error) or f"{type(error).__name__}: {first_line(error)}"
        )
        raise
    attrs = result_attrs(result, data, params, config.conformal)
    for name, value in attrs.items():
        trial.set_user_attr(name, value)
    metric, _ = PRIMARY[data.task]
    return float(result.test[metric])


def tuning_study_name(config: BenchmarkConfig, cell: Cell, fingerprint: dict[str, Any] | None) -> str:
    """The tuning study of ``cell``'s (data set, model): its name ends with its fingerprint's digest.

    So a changed model, space, table or tuning setting starts a new study rather than mixing trials
    of two setups; ``None`` (no fingerprint given) names the study without a digest. Of the
    conformal settings only the carve of the training rows counts (trials score the validation
    rows: ``alpha`` or calibrating on them changes no trial).
    """
    name = f"{study_name(config)}:tune:{cell.dataset}:{cell.model}"
    if fingerprint is None:
        return name
    decisive = {k: v for k, v in fingerprint.items() if k != "conformal"}
    conformal = fingerprint.get("conformal") or {}
    if conformal.get("calibrate_on") == "train":
        decisive["calibration"] = {k: conformal[k] for k in ("calibration_size", "seed")}
    return f"{name}:{digest(decisive)}"


def tuned_params(
    config: BenchmarkConfig,
    cell: Cell,
    data: TableSplits,
    storage: Any,  # noqa: ANN401 - an Optuna storage
    fingerprint: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The best values of the (data set, model) tuning study, running its missing trials first.

    Each trial draws with a seed derived from ``tuning.seed`` and its number (``trial_seeds``), so
    the study's trials differ however many workers share it and however often it is continued.
    """
    spec = config.model(cell.model)
    if not spec.space:
        return {}
    space = SearchSpace.from_dict({"params": spec.space})
    metric, mode = PRIMARY[data.task]
    settings = config.tuning
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study = optuna.create_study(
            study_name=tuning_study_name(config, cell, fingerprint),
            storage=storage,
            load_if_exists=True,
            direction="maximize" if mode == "max" else "minimize",
            sampler=tpe_sampler(settings.startup_trials, settings.seed),
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
    fingerprints: dict[str, dict[str, Any]] | None = None,
    refit: dict[str, str] | None = None,
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
        fingerprints: each wanted cell's fingerprint: a cell is done only for its current one.
        refit: {cell key: what changed} of cells fitted again because their inputs changed
            (recorded on their new trials as ``ripieno_refit``).
    """
    study = open_study(config, storage)
    fingerprints = fingerprints or {}
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
        done, running = cell_states(study, retry_failed, fingerprints or None)
        todo = [c for c in wanted if c.key not in done and c.key not in running and c.key not in tried]
        if not todo:
            if any(c.key in running for c in wanted):
                time.sleep(poll)  # another worker's cells; a dead one's come back through the heartbeat
                continue
            return
        cell = todo[0]
        trial = claim(study, cell, fingerprints.get(cell.key))
        if trial is None:
            continue
        if retry_failed:
            tried.add(cell.key)
        if refit and cell.key in refit:
            trial.set_user_attr(REFIT_ATTR, refit[cell.key])
        try:
            value = run_cell(config, trial, cell, cache, heartbeat, fingerprints.get(cell.key))
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
