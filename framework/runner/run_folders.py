"""Run folders that two runs can never share.

Lightning's file loggers pick ``version_N`` by listing the folder and taking the next number,
so two runs started together in one folder can both pick ``version_0`` and write into each
other's metrics, checkpoints and config. ``claim_version`` creates the folder itself with
``mkdir``, which the operating system lets only one process win; the loser moves on to the
next number. ``claim_logger_versions`` does this for every CSV/TensorBoard logger a CLI config
declares without a version, and ``use_claimed_versions`` gives the loggers the claimed
numbers. ``RunConfigSaver`` writes a run's ``config.yaml`` only if no other run has written
one there.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> root = Path(tempfile.mkdtemp()) / "logs"
    >>> claim_version(root), claim_version(root), sorted(p.name for p in root.iterdir())
    (0, 1, ['version_0', 'version_1'])
"""

from __future__ import annotations

import contextlib
import importlib
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import lightning as L
from jsonargparse import Namespace
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from typing_extensions import override

from ripieno.framework.errors import RipienoInputError, file_problem
from ripieno.framework.outputs.output_files import (
    OutputWriteError,
    atomic_output,
    os_error_message,
    write_new_file,
)
from ripieno.framework.runner.lightning_private import launcher_rank, logger_version, set_logger_version

VERSION_FOLDER = re.compile(r"version_(\d+)")
FILE_LOGGERS = (CSVLogger, TensorBoardLogger)
"""Loggers whose run folder is ``save_dir/name/version_N``."""


def claim_version(root: str | Path) -> int:
    """Create ``root/version_N`` for the smallest free N above every existing version.

    Args:
        root: The folder that holds the versions (a logger's ``save_dir/name``).

    Returns:
        The claimed N; ``root/version_N`` exists, was empty and belongs to this call.
    """
    folder = Path(root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        taken = [int(m.group(1)) for p in folder.iterdir() if (m := VERSION_FOLDER.fullmatch(p.name))]
        version = max(taken, default=-1) + 1
        while True:
            try:
                (folder / f"version_{version}").mkdir()
            except FileExistsError:
                version += 1
                continue
            return version
    except OSError as error:  # read-only, a file in the way, a name too long: one line, before any work
        raise OutputWriteError(os_error_message(error, folder, "the run folder")) from None


def first_process() -> bool:
    """Whether this is the job's first process (``RANK``/``LOCAL_RANK`` unset or 0), which claims."""
    return launcher_rank() in (None, 0)


def claim_logger_versions(trainer_config: Namespace) -> dict[Path, int]:
    """Claim a version for every file logger in a CLI trainer config that has none.

    Loggers that share one folder share one version. The config itself is left as it is, so
    the ``config.yaml`` saved with the run names no version and reruns claim their own;
    ``use_claimed_versions`` hands the numbers to the instantiated loggers. Only the first
    process of a job claims (``RANK``/``LOCAL_RANK`` unset or 0): Lightning broadcasts its log
    folder to the others. Remote folders (``s3://...``) are left to the logger.

    Args:
        trainer_config: The ``trainer`` section of a parsed LightningCLI config.

    Returns:
        The claimed version of each logger folder (``save_dir/name``).
    """
    if not first_process():
        return {}
    loggers = trainer_config.get("logger")
    claimed: dict[Path, int] = {}
    for logger in loggers if isinstance(loggers, list) else [loggers]:
        root = _versions_root(logger)
        if root is not None and root not in claimed:
            claimed[root] = claim_version(root)
    return claimed


def use_claimed_versions(loggers: Iterable[Logger], claimed: dict[Path, int]) -> None:
    """Give each file logger without a version the one claimed for its folder."""
    for logger in loggers:
        if isinstance(logger, FILE_LOGGERS) and logger_version(logger) is None:  # set by the constructor only
            root = Path(logger.save_dir or ".") / logger.name if logger.name else Path(logger.save_dir or ".")
            if root in claimed:
                set_logger_version(logger, claimed[root])


def release_unused(claimed: dict[Path, int]) -> None:
    """Remove claimed run folders that are still empty (the run stopped before writing)."""
    for root, version in claimed.items():
        with contextlib.suppress(OSError):  # not empty, or already gone: keep it
            (root / f"version_{version}").rmdir()


def _versions_root(logger: Any) -> Path | None:  # noqa: ANN401
    """``save_dir/name`` of a file logger's config that has no version yet, else ``None``."""
    if not isinstance(logger, Namespace) or not isinstance(logger.get("class_path"), str):
        return None
    module, _, name = logger["class_path"].rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    init_args = logger.get("init_args") or Namespace()
    if not (isinstance(cls, type) and issubclass(cls, FILE_LOGGERS)) or init_args.get("version") is not None:
        return None
    save_dir = str(init_args.get("save_dir") or ".")
    if "://" in save_dir:
        return None
    name = init_args.get("name", "lightning_logs")
    return Path(save_dir) / name if name else Path(save_dir)


class RunFolderTakenError(RipienoInputError):
    """The run folder already holds another run's ``config.yaml``."""


class RunConfigSaver(SaveConfigCallback):
    """``SaveConfigCallback`` that creates ``config.yaml`` exclusively, before the run opens its folder.

    Lightning checks for an existing ``config.yaml`` in the callback's ``setup``, after the
    loggers have opened the run folder (the CSV logger deletes a ``metrics.csv`` it finds
    there), and its check-then-write lets two runs that share a folder both pass. Here the
    ``ripieno`` command calls ``write_before_run`` before the Trainer starts: an exclusive
    create (``open(..., "x")``) lets exactly one run write, and the other stops with a message
    that names the folder, before it has touched anything. A run without a logger has no run
    folder of its own (its config goes to ``default_root_dir``), so it takes the first free
    name of ``config.yaml``, ``config_1.yaml``, ... instead. ``overwrite=True``, multi-file
    configs and remote folders keep Lightning's behaviour.
    """

    written_early = False

    def config_text(self) -> str:
        """The run's complete config as its ``config.yaml`` holds it."""
        return self.parser.dump(self.config, skip_none=False)

    def write_before_run(self, trainer: L.Trainer) -> None:
        """Create the run's config file now (the first process only); raise if the run folder is taken.

        Raises:
            RunFolderTakenError: the run folder already holds a ``config.yaml``.
        """
        log_dir = trainer.log_dir
        if self.overwrite or not self.save_to_log_dir or self.multifile or log_dir is None \
                or "://" in str(log_dir):
            return
        path = Path(log_dir) / self.config_filename
        if trainer.is_global_zero:
            text = self.config_text()
            if _create(path, text, numbered=not trainer.loggers) is None:
                raise RunFolderTakenError(file_problem(
                    path, "already exists: another run wrote its config into this run folder",
                    "start this run in a new folder (leave trainer.logger's version unset so ripieno picks"
                    " a free one, or choose another --trainer.default_root_dir)"))
        self.written_early = True

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if not self.written_early:
            super().setup(trainer, pl_module, stage)
            return
        if not self.already_saved and trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True


def _create(path: Path, text: str, numbered: bool) -> Path | None:
    """Write ``text`` to a new file ``path`` (or, if ``numbered``, its first free ``stem_N`` sibling).

    Returns:
        The file written, or ``None`` when ``path`` exists and ``numbered`` is false.
    """
    if numbered:
        return write_new_file(path, text, what="the run's config")
    try:
        with atomic_output(path, "w", replace=False, what="the run's config") as file:
            file.write(text)
    except FileExistsError:
        return None
    return path
