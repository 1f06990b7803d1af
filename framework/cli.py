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
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jsonargparse import Namespace
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.recipes import RecipeNotFoundError, find_recipe, list_recipes

CONFIG_FLAGS = ("-c", "--config")
LOG_NAME = "logs"
"""Folder of the default CSV logger inside ``trainer.default_root_dir``."""


class RipienoCLI(LightningCLI):
    """LightningCLI that links data specs into models and can test after fitting."""

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Link ``data.spec`` -> ``model.data_spec`` and add ``--test_after_fit``."""
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

    def before_instantiate_classes(self) -> None:
        """Default CSV logger; ``predict`` on new rows reads its preprocessing from the checkpoint."""
        config = self.config.get(self.subcommand, self.config) if self.subcommand else self.config
        if self.subcommand == "predict":
            _preprocessing_from_checkpoint(config)
        _data_progress_follows_trainer(config)
        trainer = config.get("trainer")
        if trainer is None or trainer.get("logger") not in (None, True):
            return
        trainer["logger"] = Namespace(
            class_path="lightning.pytorch.loggers.CSVLogger",
            init_args=Namespace(save_dir=str(trainer.get("default_root_dir") or "."), name=LOG_NAME),
        )

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
        results = trainer.test(self.model, datamodule=self.datamodule,
                               ckpt_path=best or None, verbose=False)
        if trainer.is_global_zero:
            lines = ["", "ripieno: test metrics of " + (f"best checkpoint {best}" if best else
                                                        "the final weights")]
            for name, value in sorted((results[0] if results else {}).items()):
                lines.append(f"  {name:<32} {value:.6g}")
            log_dir = trainer.log_dir or trainer.default_root_dir
            lines.append(f"ripieno: logs       {log_dir}")
            if any(isinstance(lg, TensorBoardLogger) for lg in trainer.loggers):
                lines.append(f"ripieno: view with  tensorboard --logdir {log_dir}")
            if checkpoint is not None:
                lines.append(f"ripieno: checkpoint {best or '(none saved)'}")
                if checkpoint.last_model_path:
                    lines.append(f"ripieno: last       {checkpoint.last_model_path}")
            config_path = Path(log_dir) / "config.yaml"
            lines.append(f"ripieno: config     {config_path if config_path.exists() else '(not saved)'}")
            print("\n".join(lines), flush=True)


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


def _spec_as_dict(spec: object) -> object:
    """Plain-dict form of a spec, so checkpoints load with ``weights_only=True``."""
    to_dict = getattr(spec, "to_dict", None)
    return to_dict() if callable(to_dict) else spec


def resolve_config_args(args: list[str]) -> list[str]:
    """Replace every ``-c/--config NAME`` that is not a file by the shipped recipe ``NAME``.

    Raises:
        RecipeNotFoundError: for a name that is neither a file nor a shipped recipe.
    """
    resolved: list[str] = []
    expect_config = False
    for arg in args:
        if expect_config:
            resolved.append(str(find_recipe(arg)))
            expect_config = False
        elif arg in CONFIG_FLAGS:
            resolved.append(arg)
            expect_config = True
        elif arg.startswith("--config="):
            resolved.append("--config=" + str(find_recipe(arg.split("=", 1)[1])))
        else:
            resolved.append(arg)
    return resolved


def print_recipes() -> None:
    """Print every shipped recipe's name and one-line description."""
    recipes = list_recipes()
    width = max(len(r.name) for r in recipes)
    room = max(shutil.get_terminal_size((120, 24)).columns - width - 4, 20)
    print("Shipped recipes (run one with `ripieno fit -c NAME`):")
    for recipe in recipes:
        text = recipe.description
        print(f"  {recipe.name:<{width}}  {text if len(text) <= room else text[: room - 3] + '...'}")


@contextmanager
def quiet_cli_notices() -> Iterator[None]:
    """Silence notices that are noise for ``ripieno`` users, for this call only.

    jsonargparse's deprecation notices (Lightning triggers them) and Lightning's warning that
    ``args=`` is meant for Python use (``main`` passes the resolved command line that way).
    """
    name = "JSONARGPARSE_DEPRECATION_WARNINGS"
    previous = os.environ.get(name)
    os.environ.setdefault(name, "off")
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            yield
    finally:
        if previous is None:
            os.environ.pop(name, None)


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``ripieno`` console script and ``python -m ripieno``.

    Args:
        args: the command line without the program name (``None``: ``sys.argv[1:]``):
            ``recipes``, ``select_members`` (``ripieno.framework.select_members_cli``), or a
            LightningCLI subcommand and its arguments.
    """
    args = list(sys.argv[1:] if args is None else args)
    if args[:1] == ["recipes"]:
        print_recipes()
        return
    if args[:1] == ["select_members"]:
        from ripieno.framework.select_members_cli import select_members_main

        select_members_main(args[1:])
        return
    try:
        args = resolve_config_args(args)
    except RecipeNotFoundError as error:
        raise SystemExit(f"ripieno: {error}") from None
    try:
        with quiet_cli_notices():
            RipienoCLI(save_config_kwargs={"overwrite": True}, args=args)
    except RipienoInputError as error:
        raise SystemExit(f"ripieno: error: {error}") from None
