"""The one door to Lightning's private names: every one ripieno uses is reached here and nowhere else.

A Lightning minor release may move, rename or reshape a private name without notice. So each use
has one wrapper below, ``PRIVATE_NAMES`` lists them with what ripieno needs them for, and
``CHECKED_ON`` names the Lightning versions they were read against. ``tests/test_lightning_private.py``
checks every entry against the installed Lightning (it exists, with the shape ripieno relies on) and
fails naming the entry that moved; ``tests/test_layering.py`` checks that no other ripieno module
imports or touches one. ``RipienoCLI``'s overrides of private ``LightningCLI`` hooks cannot go through
a wrapper: they are listed in ``CLI_HOOKS`` (and carry ``@override``), the ``LightningCLI``
attributes its subclasses read in ``CLI_ATTRIBUTES``.

Each wrapper exists because no public API gives the same thing (one line each, below).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lightning as L
from lightning.fabric.utilities.rank_zero import _get_rank
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, _get_module_type, _InstantiatorFn
from lightning.pytorch.core.saving import _load_state
from lightning.pytorch.loggers import CSVLogger, Logger
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.pytorch.utilities.migration.utils import _pl_migrate_checkpoint

#: Lightning versions every entry of ``PRIVATE_NAMES`` was read against (source and tests).
CHECKED_ON: tuple[str, ...] = ("2.6.6",)


@dataclass(frozen=True)
class PrivateName:
    """One private Lightning name ripieno relies on.

    Attributes:
        owner: the module, or ``module:Class``, that holds it.
        name: the private name.
        kind: ``function``, ``class``, ``attribute`` (set on instances) or ``hook`` (a method ripieno
            overrides or calls on a subclass).
        used_for: what ripieno does with it, and where.
    """

    owner: str
    name: str
    kind: str
    used_for: str


PRIVATE_NAMES: tuple[PrivateName, ...] = (
    PrivateName("lightning.pytorch.cli", "_get_module_type", "function",
                "the base class of a config section given as a class or a callable (cli.command, tune)"),
    PrivateName("lightning.pytorch.cli", "_InstantiatorFn", "class",
                "the instantiator ripieno gives each section's own class (cli.section_instantiator)"),
    PrivateName("lightning.pytorch.cli:LightningCLI", "_dump_config", "hook",
                "fills config_dump before a section's class is built (cli.section_instantiator, tune)"),
    PrivateName("lightning.pytorch.cli:LightningArgumentParser", "_optimizers", "attribute",
                "whether --optimizer is LightningCLI's automatic one (cli.command)"),
    PrivateName("lightning.pytorch.cli:LightningArgumentParser", "_lr_schedulers", "attribute",
                "whether --lr_scheduler is LightningCLI's automatic one (cli.command)"),
    PrivateName("lightning.pytorch.core.saving", "_load_state", "function",
                "load_from_checkpoint's steps on a checkpoint already read (cli.checkpoint_request)"),
    PrivateName("lightning.pytorch.utilities.migration.utils", "_pl_migrate_checkpoint", "function",
                "upgrades an old checkpoint read once, as load_from_checkpoint does (checkpoint_request)"),
    PrivateName("lightning.pytorch.strategies.launchers.multiprocessing", "_MultiProcessingLauncher", "class",
                "ddp_spawn's launcher, extended to bring the fit state back (cli.spawn_results)"),
    PrivateName("lightning.pytorch.strategies.launchers.multiprocessing:_MultiProcessingLauncher",
                "_wrapping_function", "hook", "closes each worker's process group (cli.spawn_results)"),
    PrivateName("lightning.pytorch.strategies.launchers.multiprocessing:_MultiProcessingLauncher",
                "_start_method", "attribute", "the replaced launcher keeps the user's start method"),
    PrivateName("lightning.pytorch.strategies:Strategy", "_launcher", "attribute",
                "where the strategy keeps its launcher (cli.spawn_results)"),
    PrivateName("lightning.pytorch.strategies:Strategy", "_checkpoint_io", "attribute",
                "whether a strategy object brings its own CheckpointIO (cli.command)"),
    PrivateName("lightning.fabric.utilities.rank_zero", "_get_rank", "function",
                "the rank from the launcher's environment, before a Trainer exists (cli.run_folders)"),
    PrivateName("lightning.pytorch.loggers:CSVLogger", "_experiment", "attribute",
                "gives a CSV logger ripieno's keeping writer before its first write (cli.run_logs)"),
    PrivateName("lightning.pytorch.loggers:CSVLogger", "_version", "attribute",
                "gives a file logger the run folder version claimed atomically (cli.run_folders)"),
    PrivateName("lightning.pytorch:Trainer", "_checkpoint_connector", "attribute",
                "the checkpoint the Trainer would save, without saving it (cli.select_members)"),
)

#: Private ``LightningCLI`` hooks ``RipienoCLI`` (and its subclasses) override, each with ``@override``.
CLI_HOOKS: tuple[str, ...] = ("_add_instantiators", "_parse_ckpt_path", "_run_subcommand",
                              "_add_configure_optimizers_method_to_model")
#: Private ``LightningCLI`` attributes and methods its subclasses read on ``self``.
CLI_ATTRIBUTES: tuple[str, ...] = ("_model_class", "_datamodule_class", "_subcommand_parsers", "_parser",
                                   "_get")

#: Lightning's instantiator base class (no public equivalent: ``add_instantiator`` takes its instances).
InstantiatorFn = _InstantiatorFn
#: Lightning's ``ddp_spawn`` launcher class (no public launcher class to extend).
MultiProcessingLauncher = _MultiProcessingLauncher


def module_type(value: Any) -> type:  # noqa: ANN401 - a class or a callable returning one
    """The class a config section holds, given as a class or a callable (LightningCLI's own rule)."""
    return _get_module_type(value)


def dump_config(cli: LightningCLI) -> None:
    """Fill ``cli.config_dump`` from the parsed config (LightningCLI does it lazily, privately)."""
    cli._dump_config()


def automatic_optimizer_links(parser: LightningArgumentParser) -> dict[str, Any]:
    """``{key: link}`` of the optimizer and scheduler arguments the parser has registered."""
    return {key: link for key, (_, link) in {**parser._optimizers, **parser._lr_schedulers}.items()}


def load_module_state(cls: type[L.LightningModule], checkpoint: dict[str, Any]) -> L.LightningModule:
    """``cls.load_from_checkpoint``'s steps on a checkpoint already read (no public form takes a dict)."""
    return _load_state(cls, checkpoint)


def migrate_checkpoint(checkpoint: dict[str, Any], path: str | None) -> dict[str, Any]:
    """Upgrade a checkpoint written by an older Lightning, as ``load_from_checkpoint`` does."""
    return _pl_migrate_checkpoint(checkpoint, checkpoint_path=path)


def replace_spawn_launcher(strategy: Strategy,
                           make: Callable[[Strategy, str], _MultiProcessingLauncher]) -> bool:
    """Give ``strategy`` ``make(strategy, start_method)`` if it launches with exactly Lightning's launcher.

    Returns:
        Whether the launcher was replaced (a user's own launcher, or none, is kept).
    """
    launcher = getattr(strategy, "_launcher", None)
    if type(launcher) is not _MultiProcessingLauncher:
        return False
    strategy._launcher = make(strategy, launcher._start_method)
    return True


def has_own_checkpoint_io(strategy: Strategy) -> bool:
    """Whether a strategy object was given a CheckpointIO of its own (its property would make one)."""
    return strategy._checkpoint_io is not None


def launcher_rank() -> int | None:
    """This process's global rank from the launcher's environment variables; ``None`` outside a launch."""
    return _get_rank()


def csv_logger_unstarted(logger: Logger) -> bool:
    """Whether ``logger`` is a ``CSVLogger`` that has not made its experiment writer yet."""
    return isinstance(logger, CSVLogger) and logger._experiment is None


def set_csv_experiment(logger: CSVLogger, experiment: Any) -> None:  # noqa: ANN401 - an ExperimentWriter
    """Give an unstarted ``CSVLogger`` the experiment writer it will write through."""
    logger._experiment = experiment


def logger_version(logger: Logger) -> int | str | None:
    """The version a file logger was constructed with (``None``: it would pick one on first use)."""
    return logger._version


def set_logger_version(logger: Logger, version: int) -> None:
    """Give a file logger without a version the one claimed for it."""
    logger._version = version


def current_checkpoint(trainer: L.Trainer, weights_only: bool = False) -> dict[str, Any]:
    """The checkpoint ``trainer.save_checkpoint`` would write, as a dict, without writing it."""
    return trainer._checkpoint_connector.dump_checkpoint(weights_only=weights_only)
