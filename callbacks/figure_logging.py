"""Figures for the user: to the trainer's loggers, or as PNGs in the run folder.

``log_figure`` sends one matplotlib figure to every logger of the trainer, by what each
logger can show:

* ``TensorBoardLogger``: ``logger.experiment.add_figure(tag, figure, global_step)`` (an
  image event; TensorBoard's helper imports ``pyplot`` to render, the figure itself is not
  ``pyplot``'s and is not closed);
* ``MLFlowLogger``: ``logger.experiment.log_figure(run_id, figure, "<name>.png")``, an
  artifact of the run;
* any other logger with ``log_image(key, images, step)`` (``WandbLogger``, and users'
  loggers of that signature): the figure rendered to an ``(H, W, 3)`` uint8 array;
* every other logger (``CSVLogger``, ...): ``<name>.png`` in its ``log_dir`` (else its
  ``save_dir``); with no logger at all, ``<name>.png`` in ``trainer.default_root_dir``.

``log_reliability_diagram`` draws the reliability diagram of a torchmetrics calibration
error from its states synced across DDP ranks (a collective call: every rank runs it) and
logs it on global rank 0 only; loggers and files are rank 0's.
"""

from __future__ import annotations

import io
from pathlib import Path

import lightning as L
import numpy as np
from lightning.pytorch.loggers import Logger, MLFlowLogger, TensorBoardLogger
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torchmetrics.classification import MulticlassCalibrationError
from torchmetrics.utilities import dim_zero_cat

from ripieno.framework.metrics.reliability import reliability_figure
from ripieno.framework.outputs.output_files import write_new_file


def figure_rgb(figure: Figure) -> np.ndarray:
    """The figure rendered by the Agg canvas as an ``(H, W, 3)`` uint8 array."""
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _png(figure: Figure, folder: str | Path, name: str) -> Path:
    """Write ``<folder>/<name>.png``, or ``<name>_1.png``, ... when a run before wrote that name."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return write_new_file(Path(folder) / f"{name}.png", buffer.getvalue(), what="the figure")


def _log_to(logger: Logger, trainer: L.Trainer, figure: Figure, tag: str, name: str) -> str | Path:
    step = trainer.global_step
    if isinstance(logger, TensorBoardLogger):
        logger.experiment.add_figure(tag, figure, global_step=step, close=False)
        return f"tensorboard:{tag}"
    if isinstance(logger, MLFlowLogger):
        logger.experiment.log_figure(logger.run_id, figure, f"{name}.png")
        return f"mlflow:{name}.png"
    if callable(getattr(logger, "log_image", None)):
        logger.log_image(key=tag, images=[figure_rgb(figure)], step=step)
        return f"{type(logger).__name__}:{tag}"
    folder = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None) or trainer.default_root_dir
    return _png(figure, folder, name)


def log_figure(trainer: L.Trainer, figure: Figure, tag: str, name: str) -> list[str | Path]:
    """Send ``figure`` to every logger of ``trainer`` (module docstring); call on rank 0.

    Args:
        trainer: the trainer whose loggers (or ``default_root_dir``) receive the figure.
        figure: a matplotlib figure.
        tag: the image's tag/key in loggers that show images (``uq/test/reliability``).
        name: file stem for PNGs and artifacts (``reliability_LastLayerSampler``).

    Returns:
        Where it went: a ``Path`` per PNG written, ``"<logger>:<tag>"`` per logger image.
    """
    if not trainer.loggers:
        return [_png(figure, trainer.default_root_dir, name)]
    return [_log_to(logger, trainer, figure, tag, name) for logger in trainer.loggers]


def log_reliability_diagram(trainer: L.Trainer, ece: MulticlassCalibrationError, tag: str, name: str,
                            title: str | None = None) -> list[str | Path]:
    """Log the reliability diagram of what ``ece`` saw on all ranks; call on every rank.

    Args:
        trainer: the trainer whose loggers receive the figure.
        ece: a torchmetrics calibration error (its ``confidences``/``accuracies`` states).
        tag: the image's tag in loggers that show images.
        name: file stem for PNGs and artifacts.
        title: text before the ECE in the title.

    Returns:
        Where it went (``log_figure``); empty on other ranks or when no point was seen.
    """
    with ece.sync_context():  # all ranks' points: collective (a no-op in one process)
        confidence, correct = dim_zero_cat(ece.confidences), dim_zero_cat(ece.accuracies)
    if not trainer.is_global_zero or confidence.numel() == 0:
        return []
    figure = reliability_figure(confidence, correct, n_bins=ece.n_bins, title=title)
    return log_figure(trainer, figure, tag, name)
