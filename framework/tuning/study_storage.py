"""Where a study lives, and which of its trials count towards ``--n_trials``.

Storage: an SQLite file in the study folder by default; any SQLAlchemy URL Optuna takes
(``postgresql://...``, ``mysql+pymysql://...``) for machines that share one database; or a
journal file (``journal:/shared/disk/study.log``, or a path ending ``.log``) for machines that share a
disk. RDB storages get Optuna's heartbeat: a trial whose process died (SIGKILL, a lost machine)
is marked failed once its heartbeat is older than the grace period, and Optuna's
``RetryHeartbeatStaleTrialCallback`` enqueues it again with the same parameters. Optuna's journal
storage has no heartbeat, so ``JournalHeartbeat`` gives it the same rule through a trial
system attribute.

Counting: a trial counts when it is complete, pruned, running or waiting, or failed by an
error of its own (``ripieno_error``). A trial whose process died does not count (its retry
does), and neither does a *surplus* trial: one that two workers started at once beyond
``--n_trials``, which stops before it runs anything. So the study ends with exactly
``--n_trials`` counted trials, none run twice.
"""

from __future__ import annotations

import threading
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.runner.store_folders import check_storage_file

ERROR_ATTR = "ripieno_error"
"""User attribute of a trial that failed by an error of its own (it counts; it is not retried)."""
SURPLUS_ATTR = "ripieno_surplus"
"""User attribute of a trial started beyond ``--n_trials`` by a concurrent worker (it never ran)."""
ALIVE_ATTR = "ripieno_alive"
"""System attribute: the last time (Unix seconds) a journal-stored trial's worker was seen alive."""
RETRY_OF_ATTR = "failed_trial"
"""System attribute ``RetryHeartbeatStaleTrialCallback`` gives a retry: the number of the trial it repeats."""
MAX_RETRY = 2
CREATE_ATTEMPTS = 5
RACE_SIGNS = ("UNIQUE constraint failed: alembic_version", "already exists", "database is locked")
"""What SQLAlchemy / Alembic say when two processes create one store's tables at once."""
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)


def counts(trial: FrozenTrial) -> bool:
    """Whether ``trial`` counts towards ``--n_trials`` (module docstring)."""
    return trial.state in COUNTED_STATES or (
        trial.state == TrialState.FAIL and ERROR_ATTR in trial.user_attrs
    )


def storage_url(storage: str | None, study_dir: Path) -> str:
    """The storage a ``--storage`` value names (``None``: ``sqlite:///<study_dir>/study.db``)."""
    return storage or f"sqlite:///{(study_dir / 'study.db').resolve()}"


def check_storage(url: str, option: str = "--storage") -> None:
    """Refuse a storage file that exists and is no Optuna store, writing nothing (``store_folders``).

    Raises:
        RipienoInputError: a folder, or a file that is neither an Optuna SQLite store nor a journal.
    """
    check_storage_file(url, _journal_path(url), option)


def open_storage(url: str, heartbeat: int, option: str = "--storage") -> optuna.storages.BaseStorage:
    """The Optuna storage for ``url``, with a heartbeat of ``heartbeat`` seconds where Optuna has one.

    A file that exists and is no Optuna store (a user's log or database) is refused before anything
    is written to it (``store_folders.check_storage_file``). Commands that create one new SQLite
    store at the same moment both open it: the one that loses the race to create Optuna's tables
    opens the store the other made.

    Raises:
        RipienoInputError: a URL Optuna cannot open (the database driver is missing, a bad path),
            or a file that is not a store.
    """
    check_storage(url, option)
    journal = _journal_path(url)
    for attempt in range(CREATE_ATTEMPTS):
        try:
            return _open(url, journal, heartbeat)
        except RipienoInputError as error:
            if attempt + 1 == CREATE_ATTEMPTS or not _lost_creation_race(error):
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


def _lost_creation_race(error: BaseException) -> bool:
    """Whether opening failed because another process was creating the same store's tables."""
    text = str(error)
    return any(sign in text for sign in RACE_SIGNS)


def _open(url: str, journal: Path | None, heartbeat: int) -> optuna.storages.BaseStorage:
    try:
        if journal is not None:
            journal.parent.mkdir(parents=True, exist_ok=True)
            return JournalStorage(JournalFileBackend(str(journal)))
        engine_kwargs: dict[str, Any] = {}
        if url.startswith("sqlite"):
            Path(url.split("///", 1)[-1]).parent.mkdir(parents=True, exist_ok=True)
            engine_kwargs["connect_args"] = {"timeout": 120}  # workers on one file wait for its lock
        else:
            engine_kwargs["pool_pre_ping"] = True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat,
                grace_period=2 * heartbeat,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY),
            )
    except ModuleNotFoundError as error:
        raise RipienoInputError(
            f"--storage {url}: the database driver {error.name!r} is not installed; pip"
            " install it (psycopg2-binary for PostgreSQL, pymysql for MySQL)."
        ) from None
    except Exception as error:  # noqa: BLE001 - SQLAlchemy and the drivers raise many types
        raise RipienoInputError(
            f"--storage {url}: cannot be opened ({str(error).splitlines()[0]}); check the"
            " URL, the server and its credentials."
        ) from None


def reap_stale_trials(study: optuna.Study, heartbeat: int) -> None:
    """Fail the running trials whose worker died, so they are retried (module docstring)."""
    storage = study._storage
    backend = getattr(storage, "_backend", storage)
    if isinstance(backend, RDBStorage):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            optuna.storages.fail_stale_trials(study)
        return
    now = time.time()
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        seen = trial.system_attrs.get(ALIVE_ATTR)
        started = trial.datetime_start.timestamp() if trial.datetime_start else now
        if now - float(seen if seen is not None else started) <= 2 * heartbeat:
            continue
        try:
            storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        except (RuntimeError, ValueError, optuna.exceptions.UpdateFinishedTrialError):
            continue  # another worker finished or failed it first
        history = [*trial.system_attrs.get("retry_history", []), trial.number]
        if len(history) > MAX_RETRY:
            continue
        system_attrs = {k: v for k, v in trial.system_attrs.items() if k != ALIVE_ATTR}
        study.add_trial(
            optuna.create_trial(
                state=TrialState.WAITING,
                params=trial.params,
                distributions=trial.distributions,
                user_attrs=trial.user_attrs,
                system_attrs={**system_attrs, RETRY_OF_ATTR: trial.number, "retry_history": history},
            )
        )


class JournalHeartbeat:
    """A thread marking a journal-stored trial alive every ``interval`` seconds (RDB storages have their own).

    Args:
        study: the study the trial belongs to.
        trial_id: the trial's storage id.
        interval: seconds between marks.
    """

    def __init__(self, study: optuna.Study, trial_id: int, interval: int) -> None:
        storage = study._storage
        self._storage = storage
        self._active = isinstance(getattr(storage, "_backend", storage), JournalStorage)
        self._trial_id, self._interval = trial_id, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="ripieno-journal-heartbeat")

    def __enter__(self) -> JournalHeartbeat:
        if self._active:
            self._mark()
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._active:
            self._stop.set()
            self._thread.join()

    def _mark(self) -> None:
        """One sign of life."""
        self._storage.set_trial_system_attr(self._trial_id, ALIVE_ATTR, time.time())

    def _beat(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self._mark()
            except Exception:  # noqa: BLE001 - the trial finished meanwhile; nothing left to mark
                return


def _journal_path(url: str) -> Path | None:
    """The journal file a ``--storage`` value names, or ``None`` for a database URL."""
    if url.startswith("journal:"):
        return Path(url.removeprefix("journal:").removeprefix("//")).expanduser()
    if "://" not in url and url.endswith((".log", ".journal")):
        return Path(url).expanduser()
    return None
