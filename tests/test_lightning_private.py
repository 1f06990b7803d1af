"""Every private Lightning name ripieno uses still exists with the shape ripieno relies on.

Oracle: the installed Lightning itself. Each entry of ``lightning_private.PRIVATE_NAMES`` is looked up
(modules and classes by import, instance attributes on a real instance, hooks with their signature),
so a Lightning release that moves one fails here naming the entry, not somewhere deep in a run.
``tests/test_layering.py`` checks that no other module reaches a private name.
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings

import lightning
import lightning.fabric.utilities.rank_zero as fabric_rank_zero
import lightning.pytorch.utilities.rank_zero as pytorch_rank_zero
import pytest
import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy

from ripieno.framework.cli.select_members import _SelectMembersCLI
from ripieno.framework.runner import lightning_private as door
from ripieno.framework.runner.command import RipienoCLI
from ripieno.framework.tuning.trial_run import TrialCLI


def _owner(entry: door.PrivateName) -> object:
    module, _, cls = entry.owner.partition(":")
    found = importlib.import_module(module)
    for part in filter(None, cls.split(".")):
        found = getattr(found, part)
    return found


def _spawning_strategy(tmp_path) -> DDPStrategy:
    """A ``ddp_spawn`` strategy as a Trainer sets it up (nothing is launched).

    Building it sets Lightning's process-wide rank (``rank_zero_only.rank``) from the environment;
    the previous value is put back, so later tests log as rank 0 whatever this one saw.
    """
    before = (fabric_rank_zero.rank_zero_only.rank, pytorch_rank_zero.rank_zero_only.rank)
    try:
        trainer = lightning.pytorch.Trainer(strategy="ddp_spawn", accelerator="cpu", devices=2, logger=False,
                                            enable_checkpointing=False, default_root_dir=tmp_path)
    finally:
        fabric_rank_zero.rank_zero_only.rank, pytorch_rank_zero.rank_zero_only.rank = before
    return trainer.strategy


def _instance_with_attributes(owner: type, tmp_path) -> object:
    """A real instance of ``owner`` as ripieno meets it (instance attributes are set in ``__init__``)."""
    if issubclass(owner, LightningArgumentParser):
        return LightningArgumentParser()
    if issubclass(owner, CSVLogger):
        return CSVLogger(save_dir=tmp_path)
    if owner is lightning.pytorch.Trainer:
        return lightning.pytorch.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                                         default_root_dir=tmp_path)
    if owner is door.MultiProcessingLauncher:
        return door.MultiProcessingLauncher(DDPStrategy(start_method="spawn"), start_method="spawn")
    if issubclass(owner, lightning.pytorch.strategies.Strategy):
        return _spawning_strategy(tmp_path)
    raise AssertionError(f"no instance recipe for {owner}: add one for the new entry")


def _moved(entry: door.PrivateName) -> str:
    return (f"Lightning {lightning.__version__} moved {entry.owner}.{entry.name} ({entry.used_for});"
            f" checked on {door.CHECKED_ON}: update framework/runner/lightning_private.py")


@pytest.mark.parametrize("entry", door.PRIVATE_NAMES, ids=lambda e: f"{e.owner}.{e.name}")
def test_every_private_name_is_where_ripieno_reaches_it(entry, tmp_path):
    owner = _owner(entry)
    if entry.kind == "attribute":
        instance = _instance_with_attributes(owner, tmp_path)
        assert hasattr(instance, entry.name), _moved(entry)
    else:
        assert hasattr(owner, entry.name), _moved(entry)
        found = getattr(owner, entry.name)
        assert inspect.isclass(found) if entry.kind == "class" else callable(found)
    if lightning.__version__ not in door.CHECKED_ON:
        warnings.warn(f"lightning {lightning.__version__} is not in lightning_private.CHECKED_ON"
                      f" {door.CHECKED_ON}: read the entries against it, then add it", stacklevel=1)


def test_the_wrappers_do_what_ripieno_needs(tmp_path, monkeypatch):
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):  # the Trainers below: rank 0
        monkeypatch.delenv(key, raising=False)
    parser = LightningArgumentParser()
    parser.add_optimizer_args(torch.optim.Adam)
    parser.add_lr_scheduler_args(torch.optim.lr_scheduler.StepLR)
    assert door.automatic_optimizer_links(parser) == {"optimizer": "AUTOMATIC", "lr_scheduler": "AUTOMATIC"}

    logger = CSVLogger(save_dir=tmp_path)
    assert door.csv_logger_unstarted(logger) and door.logger_version(logger) is None
    door.set_logger_version(logger, 7)
    assert logger.version == 7 and door.logger_version(logger) == 7
    assert not door.csv_logger_unstarted(TensorBoardLogger(save_dir=tmp_path))
    logger.experiment  # noqa: B018 - makes its writer
    assert not door.csv_logger_unstarted(logger)

    assert door.module_type(lightning.pytorch.LightningModule) is lightning.pytorch.LightningModule
    assert not door.has_own_checkpoint_io(DDPStrategy())

    strategy = _spawning_strategy(tmp_path)
    assert type(strategy.launcher) is door.MultiProcessingLauncher
    class Own(door.MultiProcessingLauncher):
        pass

    assert door.replace_spawn_launcher(strategy, Own)
    assert type(strategy.launcher) is Own and strategy.launcher._start_method == "spawn"
    assert not door.replace_spawn_launcher(strategy, Own)  # one not exactly Lightning's is kept

    # last: a Trainer built while LOCAL_RANK=1 would make this process rank 1 for every later test
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(key, raising=False)
    assert door.launcher_rank() is None
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert door.launcher_rank() == 1


@pytest.mark.parametrize("hook", door.CLI_HOOKS)
def test_overridden_cli_hooks_keep_lightnings_signature(hook):
    assert hasattr(LightningCLI, hook), f"LightningCLI no longer has {hook}: RipienoCLI's override is dead"
    ours, theirs = getattr(RipienoCLI, hook), getattr(LightningCLI, hook)
    assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters)


@pytest.mark.parametrize("cli", [RipienoCLI, TrialCLI, _SelectMembersCLI])
def test_cli_private_methods_are_listed_hooks_or_ripienos_own(cli):
    # a private method that Lightning also defines is an override and must be listed (and checked above);
    # one Lightning does not define must not become one by accident in a later release
    for name, _ in inspect.getmembers(cli, inspect.isfunction):
        if name.startswith("_") and not name.startswith("__") and name in vars(cli):
            assert (name in door.CLI_HOOKS) == hasattr(LightningCLI, name), name


@pytest.mark.parametrize("name", door.CLI_ATTRIBUTES)
def test_cli_attributes_subclasses_read_are_lightnings(name):
    # set in __init__ or while adding subcommands (only when the CLI runs): read from LightningCLI's source
    source = inspect.getsource(LightningCLI)
    assert re.search(rf"self\.{name}\b[^=\n]*=|def {name}\(", source), f"LightningCLI no longer has {name}"
