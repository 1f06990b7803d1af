"""The ``ripieno`` command: LightningCLI with ripieno's links and conveniences.

``ripieno fit -c tabular/lometab_diamonds`` trains a shipped recipe (a name as listed by
``ripieno recipes``, with or without ``.yaml``, from any folder; a path to a user's own YAML
works as with plain LightningCLI); ``validate``, ``test`` and ``predict`` work the same way,
and ``--print_config`` prints a config that runs unchanged. ``python -m ripieno`` is the same
command. Extras over plain LightningCLI:

* ``data.spec`` (what the datamodule learned from its training split) is linked into
  ``model.data_spec`` at instantiation, so data errors surface before training;
* a config without a logger logs CSV metrics to ``<trainer.default_root_dir>/logs``, so
  ``--trainer.default_root_dir`` moves every output of a run (relative folders are under
  the current folder);
* with ``tensorboard`` installed, TensorBoard events are written beside the CSV logs
  (``--tensorboard false`` turns this off);
* ``predict --ckpt_path best.ckpt --data.init_args.predict_path new.csv`` prepares the new
  rows with the preprocessing stored in the checkpoint (``data.preprocessing_from``);
* ``ripieno select_members -c <config> --ckpt_path best.ckpt --k 8`` saves the best 8
  members of a trained tabular ensemble as a new checkpoint;
* ``--test_after_fit true`` (the recipes' default) tests the best checkpoint after
  ``fit`` and prints the test metrics and where the logs, checkpoint and config went.

And guards (``RipienoCLI``'s docstring has the details):

* ``--ckpt_path``: the config decides the model; a checkpoint of another class, other
  hyperparameters or another data spec stops the run before it trains, listing the
  differences (``--resume_hparams checkpoint`` keeps plain LightningCLI's behaviour);
* two runs never share a run folder (versions claimed with ``mkdir``, ``config.yaml``
  created exclusively);
* a NaN/inf loss, metric or checkpointed weight stops training (``NonFiniteGuard``);
* bad input (a config typo, a monitor the task does not log, a damaged file) ends the
  command with one line that names it and the fix, before any training.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
import math
import os
import re
import sys
import warnings
from argparse import ArgumentError
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Literal, TextIO

import lightning as L
from jsonargparse import DefaultHelpFormatter, Namespace, set_dumper
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.plugins.io import CheckpointIO
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.trainer.states import TrainerStatus
from typing_extensions import override

from ripieno.framework.errors import NonFiniteTrainingError, RipienoDeprecationWarning, exception_chain
from ripieno.framework.messages import get_logger
from ripieno.framework.outputs.output_files import check_writable
from ripieno.framework.runner.checkpoint_request import (  # noqa: F401 - names of this module before
    LIGHTNING_CKPT_NAMES,
    LINKED_MODEL_ARGS,
    CheckpointMismatchError,
    CheckpointRequest,
    LendingCheckpointIO,
)
from ripieno.framework.runner.config_errors import ConfigError, explain_config_error
from ripieno.framework.runner.ddp_trials import FOLLOWER_VARIABLE, PruningFollower
from ripieno.framework.runner.help_text import plain
from ripieno.framework.runner.lightning_private import (
    automatic_optimizer_links,
    has_own_checkpoint_io,
    module_type,
)
from ripieno.framework.runner.monitor_check import FirstValidationCheck, check_monitors
from ripieno.framework.runner.nested_nulls import nest_null_overrides
from ripieno.framework.runner.optimizer_config import Interval, attach_optimizer_config
from ripieno.framework.runner.process_group_exit import close_process_group_at_exit
from ripieno.framework.runner.recipes import (  # noqa: F401 - names of this module before
    CONFIG_FLAGS,
    resolve_config_args,
)
from ripieno.framework.runner.resume_check import section_hparams
from ripieno.framework.runner.run_folders import (
    RunConfigSaver,
    claim_logger_versions,
    claim_version,
    first_process,
    release_unused,
    use_claimed_versions,
)
from ripieno.framework.runner.run_logs import keep_csv_logs, merge_event_files
from ripieno.framework.runner.section_instantiator import SectionInstantiator
from ripieno.framework.runner.spawn_results import keep_spawned_results
from ripieno.framework.runner.yaml_files import YamlFileError, use_bounded_yaml

log = get_logger(__name__)


LOG_NAME = "logs"
"""Folder of the default CSV logger inside ``trainer.default_root_dir``."""
PLAIN_DUMP = "ripieno_plain"
"""A jsonargparse dump format that returns the cleaned config as a dict, not text (no YAML round trip);
registered when a command first compares its config with a checkpoint, not at import."""
GUARD_CLASS = "ripieno.callbacks.NonFiniteGuard"
LR_MONITOR_CLASSES = ("lightning.pytorch.callbacks.LearningRateMonitor",
                      "lightning.pytorch.callbacks.lr_monitor.LearningRateMonitor")
"""Class paths of Lightning's ``LearningRateMonitor``, left out of runs without a logger."""
ResumeHparams = Literal["config", "checkpoint"]
CLI_NOISE = ("💡 Tip: ",)
"""Starts of Lightning's info lines that the command leaves out (an advertisement for a cloud logger)."""
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")
"""The loggers of Lightning's ``rank_zero_info``."""


class _DropMessages(logging.Filter):
    """Drop log records whose message starts with one of ``starts``."""

    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        """Whether to keep ``record``."""
        return not str(record.getMessage()).startswith(self.starts)


class RipienoCLI(LightningCLI):
    """LightningCLI that links data specs into models, guards runs and can test after fitting.

    Over plain LightningCLI (module docstring for the conveniences):

    * ``--ckpt_path``: the config decides the model. The checkpoint file is checked first (a
      missing, empty or damaged file stops with its name and the fix); a checkpoint of another
      model class, other hyperparameters or another data spec stops the run before anything is
      trained, listing the differences and the ways on. ``--resume_hparams checkpoint`` keeps
      plain LightningCLI's behaviour (the checkpoint's hyperparameters replace the config's).
      Checkpoints load with ``weights_only=True``. One ``CheckpointRequest`` reads the file
      once, compares each setting once and lends what it read to the datamodule and the
      Trainer; explaining a mismatch writes nothing.
    * Runs never share a folder: file loggers without a version get one claimed atomically
      (``framework.run_folders``), and ``config.yaml`` is created exclusively.
    * A ``NonFiniteGuard`` is added to every run that has none: a NaN/inf loss, metric or
      checkpointed weight stops training with where and why.
    * A ``val/...`` metric monitored by a ``ModelCheckpoint`` or ``EarlyStopping`` that the
      model does not log for this data stops the run before training, naming the closest one.
    * Recipes, nested config files and YAML values are read with limits on their size and on
      alias expansion (``yaml_files``): a YAML alias bomb stops in one line, at once.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401
        """LightningCLI's arguments; the config is saved by ``RunConfigSaver`` unless told otherwise."""
        kwargs.setdefault("save_config_callback", RunConfigSaver)
        kwargs["parser_kwargs"] = _bounded_yaml_parsers(_raising_parsers(kwargs.get("parser_kwargs")))
        self._request: CheckpointRequest | None = None
        self._lending = ExitStack()  # the checkpoint read once is lent to the run until it ends
        self._claimed: dict[Path, int] = {}
        self._default_log_version: int | None = None
        try:
            with self._lending:
                super().__init__(*args, **kwargs)
        except BaseException:
            release_unused(self._claimed)  # a run that stopped early leaves no empty version folder
            raise

    @override
    def _add_instantiators(self) -> None:
        """Lightning's instantiators, for each section's own class only (``section_instantiator``)."""
        for key, base, subclasses in (("model", self._model_class, self.subclass_mode_model),
                                      ("data", self._datamodule_class, self.subclass_mode_data)):
            self.parser.add_instantiator(SectionInstantiator(self, key, module_type(base)),
                                         module_type(base), subclasses=subclasses)

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link ``data.spec`` -> ``model.data_spec``; add ripieno's options (``--test_after_fit`` ...)."""
        parser.link_arguments(
            "data.spec", "model.init_args.data_spec", apply_on="instantiate", compute_fn=_spec_as_dict
        )
        parser.add_argument(
            "--test_after_fit", type=bool, default=False,
            help="After fit, test the best checkpoint and print where outputs went.",
        )
        parser.add_argument(
            "--tensorboard", type=bool, default=True,
            help="When tensorboard is installed, also write TensorBoard events beside the CSV logs.",
        )
        parser.add_argument(
            "--resume_hparams", type=ResumeHparams, default="config",
            help="With --ckpt_path: 'config' (default) builds the model the config describes and stops if"
                 " the checkpoint holds another; 'checkpoint' lets the checkpoint's hyperparameters replace"
                 " the config's, as plain LightningCLI does.",
        )
        parser.add_argument(
            "--lr_scheduler_interval", type=Interval, default="auto",
            help="How often the lr_scheduler steps: 'step' (every optimizer step), 'epoch', or 'auto'"
                 " (default: 'step' for WarmupCosineLR, WarmupLinearLR, OneCycleLR and CyclicLR, else"
                 " 'epoch').",
        )

    @override
    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:  # noqa: ANN401
        """Parse, and turn a parser error into a ``ConfigError`` that leads with the offending key.

        ``null`` overrides below a class's ``init_args`` in a list of ``args`` (what ``main``
        gives) are first put in the form jsonargparse reads as ``None`` (``nested_nulls``).
        """
        if isinstance(args, list):
            args = nest_null_overrides(args)
        try:
            super().parse_arguments(parser, args)
        except ArgumentError as error:
            refused = _refused_yaml(error)
            if refused is not None:
                raise ConfigError(refused) from None
            given = sys.argv[1:] if args is None else args
            words = [a for a in given if isinstance(a, str)] if isinstance(given, list) else []
            subcommands = getattr(self, "_subcommand_parsers", {})  # none in a CLI built with run=False
            subcommand = next((w for w in words if w in subcommands), None)
            options = _option_names(self._parser(subcommand) if subcommand else parser)
            files = [words[i + 1] for i, w in enumerate(words[:-1]) if w in CONFIG_FLAGS]
            raise ConfigError(explain_config_error(str(error), options, files)) from None

    @override
    def _parse_ckpt_path(self) -> None:
        """Read ``--ckpt_path`` once and check that it holds the config's model (class docstring)."""
        request = self._checkpoint_request()
        if request is None or request.file is None:  # none, or a name Lightning resolves itself
            return
        request.checkpoint  # noqa: B018 - a missing or damaged file stops here, with its name
        self._request = request
        self._lending.enter_context(request.lend())
        if self.config[self.config["subcommand"]].get("resume_hparams") == "checkpoint":
            self._use_checkpoint_hparams(request)
            return
        sections = self._plain_config()
        request.check_config(section_hparams(sections.get("model") or {}),
                             section_hparams(sections.get("data") or {}))

    def _checkpoint_request(self) -> CheckpointRequest | None:
        """The command's ``CheckpointRequest``, made from the parsed config (``None``: no ``--ckpt_path``)."""
        subcommand = self.config.get("subcommand")
        path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not path:
            return None
        files = tuple(str(f) for f in (self.config[subcommand].get("config") or []))
        return CheckpointRequest(path, command=subcommand, config_files=files, parses=self._parses)

    def _plain_config(self) -> dict[str, Any]:
        """This subcommand's config as plain values, in the form Lightning's CLI saves as hyperparameters."""
        subcommand = self.config["subcommand"]
        set_dumper(PLAIN_DUMP, _plain_values)
        plain = self.parser.dump(self.config, format=PLAIN_DUMP, skip_link_targets=False, skip_none=False)
        return plain[subcommand]  # type: ignore[index]  # the PLAIN_DUMP format returns the dict itself

    def _parses(self, sections: dict[str, Any]) -> bool:
        """Whether this config with ``sections`` applied over it still parses (a suggested command runs)."""
        subcommand = self.config["subcommand"]
        try:
            self.parser.parse_object({subcommand: sections}, copy.deepcopy(self.config))
        except (SystemExit, Exception):  # noqa: BLE001 - a command that cannot work is not suggested
            return False
        return True

    def _use_checkpoint_hparams(self, request: CheckpointRequest) -> None:
        """``--resume_hparams checkpoint``: the checkpoint's hyperparameters replace the config's."""
        section = request.model_section()
        if section is None:
            return
        try:
            subcommand = self.config["subcommand"]
            self.config = self.parser.parse_object({subcommand: {"model": section}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise

    @override
    def before_instantiate_classes(self) -> None:
        """Default CSV logger with a claimed version, the guard, ``weights_only`` loading.

        ``predict`` on new rows reads its preprocessing from the checkpoint.
        """
        config = self.config.get(self.subcommand, self.config) if self.subcommand else self.config
        if self.subcommand == "predict":
            _preprocessing_from_checkpoint(config)
        if config.get("ckpt_path") and "weights_only" in config and config.get("weights_only") is None:
            config["weights_only"] = True
        _data_progress_follows_trainer(config)
        trainer = config.get("trainer")
        if trainer is None:
            return
        _add_non_finite_guard(trainer)
        _drop_lr_monitor_without_logger(trainer)
        # Output folders first: a read-only folder or a file in the way stops the run in one line
        # before the data is prepared (LOES extraction can take minutes).
        self._claimed = claim_logger_versions(trainer)
        if first_process():
            root = Path(str(trainer.get("default_root_dir") or "."))
            if _default_logger_wanted(trainer):
                self._default_log_version = claim_version(root / LOG_NAME)
                self._claimed[root / LOG_NAME] = self._default_log_version
            else:
                check_writable(root, "the run's outputs")

    @override
    def instantiate_trainer(self, **kwargs: Any) -> Any:  # noqa: ANN401
        """The Trainer; without a configured logger, a CSV logger in a claimed ``logs/version_N``.

        The logger is made here rather than written into the config, so the saved
        ``config.yaml`` names no folder and a rerun of it follows ``--trainer.default_root_dir``.
        Likewise, a progress bar left unset is off when the output is not a terminal (a pipe, a
        file, a job's log), where it would print a frame per refresh.
        """
        trainer = self._get(self.config_init, "trainer", default={})
        if trainer.get("enable_progress_bar") is None and not _shown_on_a_terminal():
            kwargs.setdefault("enable_progress_bar", False)
        if "logger" not in kwargs and _default_logger_wanted(trainer):
            save_dir = str(trainer.get("default_root_dir") or ".")
            kwargs["logger"] = CSVLogger(save_dir=save_dir, name=LOG_NAME, version=self._default_log_version)
        if "plugins" not in kwargs:
            kwargs["plugins"] = _with_atomic_checkpoints(trainer.get("plugins"), trainer.get("strategy"))
        return super().instantiate_trainer(**kwargs)

    @override
    def _run_subcommand(self, subcommand: str) -> None:
        """Claim the run's ``config.yaml`` before the Trainer opens the run folder, then run.

        Ctrl-C (Lightning stops gracefully, then exits) ends with where the last checkpoint is
        and the command that resumes from it.
        """
        saver = next((c for c in self.trainer.callbacks if isinstance(c, RunConfigSaver)), None)
        if saver is not None:
            saver.write_before_run(self.trainer)
        try:
            super()._run_subcommand(subcommand)
        except SystemExit:
            if self.trainer.state.status != TrainerStatus.INTERRUPTED:
                raise
            raise SystemExit(self._interrupted_message(subcommand)) from None

    def _interrupted_message(self, subcommand: str) -> str:
        """Where an interrupted run stopped, its last checkpoint and how to resume (one paragraph)."""
        trainer = self.trainer
        where = f"epoch {trainer.current_epoch}, global step {trainer.global_step}"
        last = latest_checkpoint(trainer)
        if last is None:
            return f"ripieno: interrupted at {where}; no checkpoint was saved yet: nothing to resume."
        config = Path(trainer.log_dir or trainer.default_root_dir) / "config.yaml"
        config_arg = str(config) if config.is_file() else "<the same config and options>"
        return (f"ripieno: interrupted at {where}. Last checkpoint: {last}\n"
                f"ripieno: resume with: ripieno {subcommand} -c {config_arg} --ckpt_path {last}")

    @override
    def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
        """``--optimizer`` / ``--lr_scheduler`` over the module's own parameter groups (``optimizer_config``).

        Unlike plain LightningCLI, ``--lr_scheduler`` alone schedules the module's own optimizer;
        what cannot work stops here, before training. Optimizer arguments added under other keys
        or linked elsewhere keep LightningCLI's handling.
        """
        parser = self._parser(subcommand)
        registered = automatic_optimizer_links(parser)
        if registered != {"optimizer": "AUTOMATIC", "lr_scheduler": "AUTOMATIC"}:
            super()._add_configure_optimizers_method_to_model(subcommand)
            return
        attach_optimizer_config(
            self.model, self._get(self.config_init, "optimizer"), self._get(self.config_init, "lr_scheduler"),
            interval=self._get(self.config_init, "lr_scheduler_interval", "auto"),
            check=subcommand in (None, "fit"))

    @override
    def after_instantiate_classes(self) -> None:
        """Before anything runs: the checkpoint's whole model (data spec included), the monitors."""
        super().after_instantiate_classes()
        use_claimed_versions(self.trainer.loggers, self._claimed)
        if first_process():
            keep_csv_logs(self.trainer.loggers)
        config = self.config.get(self.subcommand, self.config) if self.subcommand else self.config
        if self._request is not None and config.get("resume_hparams") != "checkpoint":
            hparams = dict(getattr(self.model, "hparams", {}) or {})
            if hparams:
                self._request.check_linked(hparams)
        if self.subcommand == "fit":
            check_monitors(self.model, self.trainer.callbacks)
            self.trainer.callbacks.append(FirstValidationCheck())
            monitor = os.environ.get(FOLLOWER_VARIABLE)
            if monitor and not first_process():  # a rank launched for a tune trial: follow its pruning
                self.trainer.callbacks.append(PruningFollower(monitor))
        # A spawned fit (ddp_spawn) hands its progress and checkpoint paths back to this process,
        # so the test after fit continues from them; spawned workers close their process group.
        keep_spawned_results(self.trainer)
        close_process_group_at_exit()  # this process's group, under a launcher that reruns the command (ddp)

    def before_fit(self) -> None:
        """Add a TensorBoard logger writing into the CSV logger's folder, when installed."""
        config = self.config.get(self.subcommand, self.config)
        if not config.get("tensorboard", True) or importlib.util.find_spec("tensorboard") is None:
            return
        loggers = list(self.trainer.loggers)
        csv = next((lg for lg in loggers if isinstance(lg, CSVLogger)), None)
        if csv is None or any(isinstance(lg, TensorBoardLogger) for lg in loggers):
            return
        loggers.append(TensorBoardLogger(save_dir=csv.save_dir, name=csv.name, version=csv.version,
                                         default_hp_metric=False))
        self.trainer.loggers = loggers

    def after_fit(self) -> None:
        """Optionally test the best checkpoint, then summarise the run's outputs."""
        trainer = self.trainer
        config = self.config.get(self.subcommand, self.config)
        if not config.get("test_after_fit", False):
            return
        checkpoint = next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)), None)
        best = checkpoint.best_model_path if checkpoint is not None else ""
        if checkpoint is not None:
            refuse_non_finite_best(checkpoint)
        results = trainer.test(self.model, datamodule=self.datamodule,
                               ckpt_path=best or None, verbose=False, weights_only=True)
        log_dir = trainer.log_dir or trainer.default_root_dir  # every rank: log_dir is a broadcast
        if trainer.is_global_zero:
            lines = ["", "ripieno: test metrics of " + (f"best checkpoint {best}" if best else
                                                        "the final weights")]
            for name, value in sorted((results[0] if results else {}).items()):
                lines.append(f"  {name:<32} {value:.6g}")
            lines.append(f"ripieno: logs       {log_dir}")
            if any(isinstance(lg, TensorBoardLogger) for lg in trainer.loggers):
                lines.append(f"ripieno: view with  tensorboard --logdir {log_dir}")
            if checkpoint is not None:
                lines.append(f"ripieno: checkpoint {best or '(none saved)'}")
                if checkpoint.last_model_path:
                    lines.append(f"ripieno: last       {checkpoint.last_model_path}")
            config_path = Path(log_dir) / "config.yaml"
            lines.append(f"ripieno: config     {config_path if config_path.exists() else '(not saved)'}")
            if any(isinstance(lg, TensorBoardLogger) for lg in trainer.loggers):
                merge_event_files(log_dir)  # a spawned fit and its test wrote one events file each
            print("\n".join(lines), flush=True)


def latest_checkpoint(trainer: L.Trainer) -> Path | None:
    """The newest checkpoint file a run's ``ModelCheckpoint`` callbacks wrote, if any.

    Their ``last_model_path`` / ``best_model_path`` first, else the newest ``*.ckpt`` in their
    folders (a spawned fit's workers know the paths; the main process may not).
    """
    found: list[Path] = []
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        found += [Path(p) for p in (callback.last_model_path, callback.best_model_path) if p]
        folder = callback.dirpath or (Path(trainer.log_dir) / "checkpoints" if trainer.log_dir else None)
        if folder is not None and Path(folder).is_dir():
            found += list(Path(folder).glob("*" + callback.FILE_EXTENSION))
    existing = [p for p in found if p.is_file()]
    return max(existing, key=lambda p: p.stat().st_mtime_ns) if existing else None


def refuse_non_finite_best(checkpoint: ModelCheckpoint) -> None:
    """Raise ``NonFiniteTrainingError`` if the best checkpoint's monitored score is NaN or inf.

    ``NonFiniteGuard`` keeps such checkpoints from being written; this is the last line for
    runs without it: a non-finite checkpoint is never reported or tested as the best one.
    """
    score = checkpoint.best_model_score
    if checkpoint.best_model_path and score is not None and not math.isfinite(float(score)):
        raise NonFiniteTrainingError(
            f"the best checkpoint {checkpoint.best_model_path} has {checkpoint.monitor} = {float(score)}:"
            " it is not reported as best or tested. Lower the learning rate or check the data, then train"
            " again.")


def _one_line_deprecations(show: Callable[..., None]) -> Callable[..., None]:
    """``warnings.showwarning`` printing ripieno's own deprecations as one ``ripieno: warning:`` line.

    The message already names the file, the old and the new key; where in ripieno it was raised is
    not the user's concern. Every other warning goes to ``show`` as before.
    """

    def showwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    file: TextIO | None = None, line: str | None = None) -> None:
        if issubclass(category, RipienoDeprecationWarning):
            print(f"ripieno: warning: {message}", file=sys.stderr if file is None else file)
            return
        show(message, category, filename, lineno, file, line)

    return showwarning


def _shown_on_a_terminal() -> bool:
    """Whether this process writes to a terminal (stdout and stderr both)."""
    return all(getattr(stream, "isatty", lambda: False)() for stream in (sys.stdout, sys.stderr))


def _raising_parsers(parser_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``parser_kwargs`` with ``exit_on_error=False`` and plain-text help, main parser and subcommands'."""
    kwargs = dict(parser_kwargs or {})
    kwargs.setdefault("exit_on_error", False)
    kwargs.setdefault("formatter_class", PlainHelpFormatter)
    for subcommand in LightningCLI.subcommands():
        kwargs[subcommand] = {"exit_on_error": False, "formatter_class": PlainHelpFormatter,
                              **(kwargs.get(subcommand) or {})}
    return kwargs


class PlainHelpFormatter(DefaultHelpFormatter):
    """jsonargparse's help formatter, with the reST markup of the docstrings it quotes taken out."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain(text))

    def _expand_help(self, action: Any) -> str:  # noqa: ANN401 - an argparse action
        return plain(super()._expand_help(action))


def _bounded_yaml_parsers(parser_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``parser_kwargs`` with ``yaml_files``' bounded YAML mode, unless they name a ``parser_mode``.

    Recipes, nested config files and values then load as in jsonargparse's ``yaml`` mode, but a
    file over ``MAX_FILE_BYTES`` or an alias bomb stops in one line before anything is built.
    The mode is registered here, when a command is built, not when ripieno is imported.
    """
    kwargs = dict(parser_kwargs)
    kwargs.setdefault("parser_mode", use_bounded_yaml())
    for subcommand in LightningCLI.subcommands():
        kwargs[subcommand] = {"parser_mode": kwargs["parser_mode"], **(kwargs.get(subcommand) or {})}
    return kwargs


def _refused_yaml(error: ArgumentError) -> str | None:
    """The line for a config file or value ``yaml_files`` refused (too large, an alias bomb), after its key.

    jsonargparse reports it under the key it was given for, among its own details; the
    refusal says all there is to say.
    """
    refused = next((e for e in exception_chain(error) if isinstance(e, YamlFileError)), None)
    if refused is None:
        return None
    key = re.search(r'Parser key "([^"]+)"', str(error))
    return f"{key.group(1)}: {refused}" if key else str(refused)


def _option_names(parser: LightningArgumentParser) -> list[str]:
    return [name for action in parser._actions for name in action.option_strings if name.startswith("--")]


def _default_logger_wanted(trainer: Namespace | dict[str, Any]) -> bool:
    """Whether the run gets ripieno's default CSV logger (no logger configured, not a fast_dev_run)."""
    logger = trainer.get("logger")
    return (logger is None or logger is True) and not trainer.get("fast_dev_run")


def _with_atomic_checkpoints(plugins: Any, strategy: Any) -> list[Any]:  # noqa: ANN401
    """The Trainer's plugins plus an ``AtomicCheckpointIO``, unless a CheckpointIO is already chosen.

    It is a ``LendingCheckpointIO``: a ``--ckpt_path`` read already is restored without reading it again.

    Strategies that save through their own machinery (DeepSpeed, XLA) or a strategy object that
    carries a CheckpointIO of its own are left as they are.
    """
    listed = list(plugins) if isinstance(plugins, list | tuple) else ([] if plugins is None else [plugins])
    own_io = isinstance(strategy, Strategy) and has_own_checkpoint_io(strategy)
    special = isinstance(strategy, str) and any(name in strategy for name in ("deepspeed", "xla"))
    if own_io or special or any(isinstance(p, CheckpointIO) for p in listed):
        return listed
    return [*listed, LendingCheckpointIO()]


def _add_non_finite_guard(trainer: Namespace) -> None:
    """Append a ``NonFiniteGuard`` to a trainer config's callbacks unless one is there."""
    callbacks = trainer.get("callbacks") or []
    if not isinstance(callbacks, list):
        callbacks = [callbacks]
    if any(isinstance(c, Namespace) and c.get("class_path") == GUARD_CLASS for c in callbacks):
        return
    trainer["callbacks"] = [*callbacks, Namespace(class_path=GUARD_CLASS, init_args=Namespace())]


def _drop_lr_monitor_without_logger(trainer: Namespace) -> None:
    """Leave a ``LearningRateMonitor`` out of a run without a logger (``--trainer.logger false``), and say so.

    It only logs, and Lightning stops such a run; this way a recipe that logs its schedule
    still runs when logging is turned off.
    """
    if trainer.get("logger") not in (False, []):
        return
    callbacks = trainer.get("callbacks") or []
    callbacks = callbacks if isinstance(callbacks, list) else [callbacks]
    kept = [c for c in callbacks
            if not (isinstance(c, Namespace) and c.get("class_path") in LR_MONITOR_CLASSES)]
    if len(kept) < len(callbacks):
        log.info("ripieno: LearningRateMonitor left out: this run has no logger"
                 " (trainer.logger false).")
    trainer["callbacks"] = kept


def _preprocessing_from_checkpoint(config: Namespace) -> None:
    """``predict --ckpt_path C --data.init_args.predict_path F``: prepare F as C's model was trained.

    Without this the datamodule would refit the preprocessing on the training file named in
    the config, which may have changed (or be gone) since the checkpoint was made.
    """
    data = config.get("data")
    init_args = data.get("init_args") if isinstance(data, Namespace) else None
    if (not config.get("ckpt_path") or init_args is None or "preprocessing_from" not in init_args
            or not init_args.get("predict_path") or init_args.get("preprocessing_from")):
        return
    init_args["preprocessing_from"] = str(config["ckpt_path"])


def _data_progress_follows_trainer(config: Namespace) -> None:
    """Give a datamodule's ``progress: null`` the Trainer's ``enable_progress_bar``.

    Its bars cover work done before training (feature extraction); the datamodule is built
    before the Trainer, so it cannot ask it.
    """
    data = config.get("data")
    init_args = data.get("init_args") if isinstance(data, Namespace) else None
    if init_args is None or "progress" not in init_args or init_args.get("progress") is not None:
        return
    trainer = config.get("trainer")
    enabled = trainer.get("enable_progress_bar") if trainer is not None else None
    init_args["progress"] = True if enabled is None else bool(enabled)


def _plain_values(data: dict[str, Any]) -> dict[str, Any]:
    """The ``PLAIN_DUMP`` format: jsonargparse's cleaned, serialised config, kept as the dict it is."""
    return data


def _spec_as_dict(spec: object) -> object:
    """Plain-dict form of a spec, so checkpoints load with ``weights_only=True``."""
    to_dict = getattr(spec, "to_dict", None)
    return to_dict() if callable(to_dict) else spec


@contextmanager
def quiet_cli_notices() -> Iterator[None]:
    """Silence notices that are noise for ``ripieno`` users, for this call only.

    jsonargparse's deprecation notices (Lightning triggers them), Lightning's warning that
    ``args=`` is meant for Python use (``main`` passes the resolved command line that way), its
    own ``LeafSpec`` deprecation (Lightning's code, not the user's), its note that a checkpoint
    tested or predicted in a new run folder keeps only its best path, and its advertising tip for a
    cloud logger. The library leaves them alone: a user's own program decides there.
    """
    name = "JSONARGPARSE_DEPRECATION_WARNINGS"
    previous = os.environ.get(name)
    os.environ.setdefault(name, "off")
    tips = _DropMessages(CLI_NOISE)
    loggers = [logging.getLogger(n) for n in RANK_ZERO_LOGGERS]
    for logger in loggers:
        logger.addFilter(tips)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")
            warnings.filterwarnings("ignore", message="The dirpath has changed from")  # predict/test a ckpt
            warnings.filterwarnings("default", category=RipienoDeprecationWarning)  # old keys: say so
            warnings.showwarning = _one_line_deprecations(warnings.showwarning)
            yield
    finally:
        for logger in loggers:
            logger.removeFilter(tips)
        if previous is None:
            os.environ.pop(name, None)
