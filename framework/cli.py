"""The ``ripieno`` command: LightningCLI with ripieno's links and conveniences.

``ripieno fit -c recipes/tabular/lometab_diamonds.yaml`` trains a recipe; ``validate``,
``test`` and ``predict`` work the same way, and ``--print_config`` prints a config that
runs unchanged. Extras over plain LightningCLI:

* ``data.spec`` (what the datamodule learned from its training split) is linked into
  ``model.data_spec`` at instantiation, so data errors surface before training;
* with ``tensorboard`` installed, TensorBoard events are written beside the CSV logs
  (``--tensorboard false`` turns this off);
* ``--test_after_fit true`` (the recipes' default) tests the best checkpoint after
  ``fit`` and prints the test metrics and where the logs, checkpoint and config went.
"""

from __future__ import annotations

import os

os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import importlib.util  # noqa: E402
from pathlib import Path  # noqa: E402

from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI  # noqa: E402
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger  # noqa: E402


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


def _spec_as_dict(spec: object) -> object:
    """Plain-dict form of a spec, so checkpoints load with ``weights_only=True``."""
    to_dict = getattr(spec, "to_dict", None)
    return to_dict() if callable(to_dict) else spec


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``ripieno`` console script and ``python -m framework``."""
    RipienoCLI(save_config_kwargs={"overwrite": True}, args=args)
