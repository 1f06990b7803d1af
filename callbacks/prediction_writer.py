"""MemberPredictionWriter: write ensemble and member predictions from ``predict``.

Works with any module whose ``predict_step`` returns a dict of tensors with the batch on
axis 0 (ripieno's modules return ``prediction`` and ``member_predictions (B, K, ...)``).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import pandas as pd
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from typing_extensions import override

from ripieno.framework.members import PredictionFrameModel
from ripieno.framework.messages import get_logger
from ripieno.framework.outputs.output_files import numbered_names, write_new_file

log = get_logger(__name__)


class MemberPredictionWriter(BasePredictionWriter):
    """Save predictions at the end of ``predict`` as ``.pt`` (all keys) and ``.csv``.

    ``predictions.pt`` holds every key of the step outputs concatenated over batches
    (member axis kept). ``predictions.csv`` is, for modules with ``prediction_frame`` (the
    optional ``PredictionFrameModel`` capability, ``ripieno.framework.members``: the
    tabular ones), one row per predicted row in data order: the datamodule's id column
    (``prediction_ids``; else ``index``), class probabilities named by class, the label and
    the member spread, and ``ConformalPrediction``'s ``lower`` / ``upper`` or ``set`` / ``set_size``
    when it ran; for other modules, the ensemble ``prediction`` (one column per class
    for probabilities) after the dataset ``index``. Under DDP each rank writes ``predictions_rank{r}.*``
    with the dataset indices it predicted, so nothing is lost or duplicated silently.

    Nothing is written over: when ``predictions.pt`` or ``.csv`` exists in the folder (an
    earlier ``predict``), the files are ``predictions_1.*`` (then ``_2``, ...), written
    atomically; the run prints where they went and ``written`` lists them.

    Args:
        output_dir: folder for the files; default: the trainer's log dir (or root dir).
        csv_key: key written to the CSV (the default ``prediction`` gives the named table
            where the module has ``prediction_frame``), or ``None`` to skip the CSV.
    """

    def __init__(self, output_dir: str | None = None, csv_key: str | None = "prediction") -> None:
        super().__init__(write_interval="epoch")
        self.output_dir = output_dir
        self.csv_key = csv_key
        self.written: list[Path] = []

    @override
    def write_on_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule,
                           predictions: Sequence[Any], batch_indices: Sequence[Any]) -> None:
        batches = predictions[0] if predictions and isinstance(predictions[0], list) else predictions
        if not batches:
            return
        if not isinstance(batches[0], dict):
            raise TypeError(
                "MemberPredictionWriter needs predict_step to return a dict of tensors, got"
                f" {type(batches[0]).__name__}."
            )
        merged = {key: torch.cat([b[key].detach().cpu() for b in batches]) for key in batches[0]}
        indices = batch_indices[0] if batch_indices and isinstance(batch_indices[0], list) else batch_indices
        if indices:
            merged["index"] = torch.as_tensor([i for batch in indices for i in batch])
        folder = Path(self.output_dir or trainer.log_dir or trainer.default_root_dir)
        stem = "predictions" if trainer.world_size == 1 else f"predictions_rank{trainer.global_rank}"
        buffer = io.BytesIO()
        torch.save(merged, buffer)
        outputs: dict[str, bytes | str] = {".pt": buffer.getvalue()}
        frame = self._named_table(trainer, pl_module, merged)
        if frame is None and self.csv_key is not None and self.csv_key in merged:
            values = merged[self.csv_key].float()
            values = values[:, None] if values.ndim == 1 else values.flatten(1)
            columns = [self.csv_key] if values.shape[1] == 1 else [
                f"{self.csv_key}_{j}" for j in range(values.shape[1])]
            frame = pd.DataFrame(values.numpy(), columns=columns)
            if "index" in merged:
                frame.insert(0, "index", merged["index"].numpy())
        if frame is not None:
            outputs[".csv"] = frame.to_csv(index=False, lineterminator="\n")
        self.written = _write_new_files(folder, stem, outputs)
        log.info(f"ripieno: predictions written to {', '.join(map(str, self.written))}")

    def _named_table(self, trainer: L.Trainer, pl_module: L.LightningModule,
                     merged: dict[str, torch.Tensor]) -> pd.DataFrame | None:
        """The module's named table (``prediction_frame``) with the datamodule's row ids, if both exist."""
        if self.csv_key != "prediction" or "member_predictions" not in merged:
            return None
        if not isinstance(pl_module, PredictionFrameModel):  # optional: the plain columns instead
            return None
        table = _with_conformal_columns(pl_module.prediction_frame(merged["member_predictions"]), merged)
        ids_of = getattr(trainer.datamodule, "prediction_ids", None) if trainer.datamodule else None
        if "index" in merged:
            indices = merged["index"].tolist()
            name, ids = ids_of(indices) if ids_of is not None else ("index", indices)
            table.insert(0, name, ids)
            table = table.iloc[sorted(range(len(indices)), key=indices.__getitem__)].reset_index(drop=True)
        return table


def _with_conformal_columns(table: pd.DataFrame, merged: dict[str, torch.Tensor]) -> pd.DataFrame:
    """``ConformalPrediction``'s outputs as columns: ``lower`` / ``upper``, or ``set`` and ``set_size``.

    The set names its classes as the ``proba_<class>`` columns do, joined by ``|`` in class order.
    """
    if "lower" in merged and "upper" in merged:
        table["lower"] = merged["lower"].double().numpy()
        table["upper"] = merged["upper"].double().numpy()
    if "prediction_set" in merged:
        names = [c.removeprefix("proba_") for c in table.columns if c.startswith("proba_")]
        sets = merged["prediction_set"].bool()
        if sets.shape[1] != len(names):
            raise ValueError(f"prediction_set has {sets.shape[1]} classes but the table {len(names)}.")
        table["set"] = ["|".join(n for n, kept in zip(names, row, strict=True) if kept)
                        for row in sets.tolist()]
        table["set_size"] = sets.sum(1).numpy()
    return table


def _write_new_files(folder: Path, stem: str, outputs: dict[str, bytes | str]) -> list[Path]:
    """Write ``stem<suffix>`` for each output under the first ``stem``, ``stem_1``, ... free for all.

    Each file is written atomically and never over an existing one (``write_new_file``), so a
    second ``predict`` into the same folder keeps the first one's files and writes
    ``predictions_1.pt`` / ``predictions_1.csv`` beside them.
    """
    name = next(candidate.name for candidate in numbered_names(folder / stem)
                if not any((folder / f"{candidate.name}{suffix}").exists() for suffix in outputs))
    return [write_new_file(folder / f"{name}{suffix}", data, what="the predictions")
            for suffix, data in outputs.items()]
