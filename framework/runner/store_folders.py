"""Folders and stores that ``ripieno tune`` and ``ripieno benchmark`` own, and nothing else.

* A study folder (``--study_dir``) or benchmark folder (``--out``) carries a marker,
  ``ripieno_store.json``, naming what it holds (``tune`` or ``benchmark``, its name and its store).
  A folder with the marker of the same study is continued; of another study, or of the same name in
  another store (whose trials would be numbered from 0 again, into the same trial folders), refused:
  one folder holds one study. A folder without the marker that holds anything is refused, since its
  files are the user's.
  A folder from before the marker existed is recognised by its Optuna store (``study.db`` /
  ``benchmark.db``) and marked.
* A storage that exists must be a store ripieno can open: an SQLite file with Optuna's tables, or
  an Optuna journal (JSON records, one per line); anything else (a user's log or database) is
  refused before a byte is written to it. An empty file holds nothing to lose and is accepted.
* Names become folder names only through ``folder_name``: no separators, no ``..``.

Example:
    >>> folder_name("../../x"), folder_name("tabular/lometab_wine"), folder_name("..")
    ('_.._x', 'tabular_lometab_wine', 'study')
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.outputs.output_files import atomic_output

MARKER = "ripieno_store.json"
"""The file that makes a folder a tune study's or a benchmark's own (written when the folder is claimed)."""
SQLITE_HEADER = b"SQLite format 3\x00"
OPTUNA_TABLES = frozenset({
    "alembic_version", "studies", "study_directions", "study_system_attributes", "study_user_attributes",
    "trial_heartbeats", "trial_intermediate_values", "trial_params", "trial_system_attributes",
    "trial_user_attributes", "trial_values", "trials", "version_info",
})
"""Optuna's RDB tables (its ``_rdb.models``, Alembic's): an SQLite file with others is not ours."""


class StoreFolderError(RipienoInputError):
    """A folder or store that ripieno did not make, or that holds another study; nothing was written."""


def folder_name(name: str) -> str:
    """``name`` as one safe folder name: runs of other characters as ``_``, no leading or trailing dots."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(name)).strip(".")
    return safe or "study"


def check_folder(
    folder: Path, kind: str, name: str, option: str, store_file: str, storage: str | None
) -> None:
    """Refuse ``folder`` for ``kind`` ``name`` unless it is new, empty, or already its own; writes nothing.

    Args:
        folder: the study or benchmark folder.
        kind: ``tune`` or ``benchmark``.
        name: the study's or benchmark's name.
        option: the command-line option that named the folder (for the message).
        store_file: the default store's file name in the folder (``study.db``): with Optuna's
            tables and no marker, the folder was made by an older ripieno (it is marked when claimed).
        storage: the ``--storage`` given, or ``None`` for the folder's own store (``store_file``).

    Raises:
        StoreFolderError: a file, a folder of another study, or a folder of the user's files.
    """
    if folder.exists() and not folder.is_dir():
        raise StoreFolderError(f"{option} {folder} is a file, not a folder; name a new or empty folder.")
    marker = folder / MARKER
    if marker.is_file():
        record = {"kind": kind, "name": name, "storage": storage or store_file}
        _check_marker(marker, record, option, store_file)
    elif folder.is_dir() and any(folder.iterdir()) and not is_optuna_sqlite(folder / store_file):
        raise StoreFolderError(
            f"{option} {folder} holds files ripieno did not write (no {MARKER}); name an empty or new"
            " folder, so that none of them is replaced."
        )


def claim_folder(
    folder: Path, kind: str, name: str, option: str, store_file: str, storage: str | None
) -> None:
    """``check_folder``, then create the folder and its marker (module docstring); arguments as there.

    Raises:
        StoreFolderError: as ``check_folder``.
    """
    check_folder(folder, kind, name, option, store_file, storage)
    marker = folder / MARKER
    if marker.is_file():
        return
    record = {"kind": kind, "name": name, "storage": storage or store_file}
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with atomic_output(marker, "w", replace=False, what=f"the {kind} folder's marker") as handle:
            handle.write(json.dumps(record, indent=2) + "\n")
    except FileExistsError:  # another command claimed it at the same moment: it must be this study
        _check_marker(marker, record, option, store_file)


def _check_marker(marker: Path, record: dict[str, str], option: str, store_file: str) -> None:
    try:
        found = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise StoreFolderError(
            f"{option} {marker.parent}: its {MARKER} cannot be read; name another folder."
        ) from None
    if {k: found.get(k) for k in ("kind", "name")} != {k: record[k] for k in ("kind", "name")}:
        raise StoreFolderError(
            f"{option} {marker.parent} holds {found.get('kind')} {found.get('name')!r}, not"
            f" {record['kind']} {record['name']!r}; one folder holds one study: give this one"
            f" its own {option}."
        )
    if found.get("storage", record["storage"]) != record["storage"]:
        def said(storage: str) -> str:
            return f"{storage} in the folder" if storage == store_file else storage

        own = found["storage"] == store_file
        again = "without --storage" if own else f"with --storage {found['storage']}"
        raise StoreFolderError(
            f"{option} {marker.parent} holds {record['kind']} {record['name']!r} of the store"
            f" {said(found['storage'])}, not {said(record['storage'])}; continue it {again}, or give"
            f" the other store's study its own {option}."
        )


def is_optuna_sqlite(path: Path) -> bool:
    """Whether ``path`` is an SQLite file holding Optuna's tables and no others (opened read-only)."""
    tables = _sqlite_tables(path)
    return tables is not None and "studies" in tables and tables <= OPTUNA_TABLES


def _sqlite_tables(path: Path) -> frozenset[str] | None:
    """The tables of an SQLite file (``None``: not an SQLite file, or unreadable)."""
    try:
        with path.open("rb") as handle:
            if handle.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                return None
        connection = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
        finally:
            connection.close()
    except (OSError, sqlite3.Error):
        return None
    return frozenset(row[0] for row in rows)


def check_storage_file(url: str, journal: Path | None, option: str = "--storage") -> None:
    """Refuse a storage file that exists and is not a store ripieno can open (module docstring).

    Args:
        url: the storage URL.
        journal: the journal file ``url`` names, or ``None`` for a database URL.
        option: the option that named it (for the message).

    Raises:
        StoreFolderError: a folder, or an existing non-empty file that is no Optuna store.
    """
    path = journal if journal is not None else _sqlite_path(url)
    if path is None or not path.exists():
        return
    if path.is_dir():
        raise StoreFolderError(f"{option} {path} is a folder; name a file (a new one, or a study's store).")
    if path.stat().st_size == 0:
        return
    if journal is not None:
        if not _is_journal(path):
            raise StoreFolderError(
                f"{option} {path} exists and is not an Optuna journal (its first line is no journal"
                " record), so nothing was written to it; name a new file or a study's journal."
            )
        return
    tables = _sqlite_tables(path)
    if tables is None or not tables <= OPTUNA_TABLES:  # a store being created has some of Optuna's tables
        what = (
            "not an SQLite file"
            if tables is None
            else f"an SQLite database with other tables ({sorted(tables - OPTUNA_TABLES)[0]})"
        )
        raise StoreFolderError(
            f"{option} {path} exists and is {what}, so nothing was written to it; name a new file"
            " or a study's store."
        )


def _sqlite_path(url: str) -> Path | None:
    if not url.startswith("sqlite:///"):
        return None
    rest = url.removeprefix("sqlite:///").split("?", 1)[0]
    return Path(rest) if rest and rest != ":memory:" else None


def _is_journal(path: Path) -> bool:
    """Whether the first line of ``path`` is an Optuna journal record (a JSON object with ``op_code``)."""
    try:
        with path.open("rb") as handle:
            line = handle.readline(1 << 20)
        record: Any = json.loads(line)
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and "op_code" in record

