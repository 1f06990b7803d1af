"""Predictions of tabular modules on a user's own rows, from the module (checkpoint) alone.

The fitted state of the module's ``TabularSpec`` (preprocessing, bin edges, long class
names: ``TabularSpec.fitted_state``) is not a hyperparameter: the module's hyperparameters
hold the compact spec (``hparams_dict``) and its checkpoints hold the fitted state under
``FITTED_STATE_KEY``, restored by ``on_load_checkpoint`` before the weights load.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch
from torch import Tensor

from ripieno.framework.members import member_predictions
from ripieno.framework.outputs.prediction_table import insert_ids, prediction_table
from ripieno.framework.specs.base import FITTED_STATE_KEY
from ripieno.framework.specs.tabular import TabularSpec
from ripieno.framework.specs.tabular_preprocessing import TabularPreprocessor

ROW_ID = "row"
"""Name of the id column when the table has no ``id_column``: the row's position."""


class TabularPredictionMixin:
    """``predict_frame`` and ``prediction_frame`` for modules with a ``TabularSpec`` in ``spec``.

    The spec carries the fitted preprocessing (``spec.preprocessing``); the checkpoint hooks
    save and restore it (module docstring), so a module loaded from a checkpoint turns raw
    rows into inputs exactly as its training data was prepared. A module keeps the compact
    spec in ``hparams.data_spec`` (``use_spec``).
    """

    spec: TabularSpec

    def use_spec(self, spec: TabularSpec) -> None:
        """Make ``spec`` the module's spec; ``hparams.data_spec`` keeps its compact form."""
        self.spec = spec
        self.__dict__.pop("_tabular_preprocessor", None)
        for name in ("_hparams", "_hparams_initial"):  # what loggers and checkpoints receive
            hparams = getattr(self, name, None)
            if hparams is not None and "data_spec" in hparams:
                hparams["data_spec"] = spec.hparams_dict()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Save the spec's fitted state (plain Python) beside the hyperparameters."""
        super().on_save_checkpoint(checkpoint)  # type: ignore[misc]
        state = self.spec.fitted_state()
        if state:
            checkpoint[FITTED_STATE_KEY] = state

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the spec's fitted state (called after ``__init__``, before the weights load)."""
        super().on_load_checkpoint(checkpoint)  # type: ignore[misc]
        state = checkpoint.get(FITTED_STATE_KEY)
        if state:
            self.use_spec(self.spec.with_fitted_state(state))

    @property
    def preprocessor(self) -> TabularPreprocessor:
        """The fitted preprocessing of the training table (built once from the spec)."""
        cached = self.__dict__.get("_tabular_preprocessor")
        if cached is None:
            if self.spec.preprocessing is None:
                raise ValueError(
                    "This model's data_spec has no fitted preprocessing (a spec built by hand, or the"
                    " compact hparams spec without its checkpoint), so it cannot read raw rows; train it"
                    " with TabularDataModule, load it with load_from_checkpoint, or pass model inputs to"
                    " forward()."
                )
            cached = TabularPreprocessor.from_state(self.spec.preprocessing)
            self.__dict__["_tabular_preprocessor"] = cached
        return cached

    def prediction_frame(self, members: Tensor) -> pd.DataFrame:
        """Member predictions ``(B, K, C)`` or ``(B, K)`` as a named table (``prediction_table``)."""
        regression = self.spec.task == "regression"
        return prediction_table(members, None if regression else self.spec.class_labels(),
                                self.to_original_units if regression else None)  # type: ignore[attr-defined]

    @torch.no_grad()
    def predict_members(self, frame: pd.DataFrame, batch_size: int = 4096) -> Tensor:
        """Member predictions of raw rows: probabilities ``(N, K, C)`` or values ``(N, K)``.

        Regression values are in the modelled target's units (``prediction_frame`` maps
        them to the original ones). Columns are found by name, as in ``predict_frame``.

        Args:
            frame: the rows.
            batch_size: rows per forward pass.
        """
        if len(frame) == 0:
            raise ValueError("Got an empty table; give at least one row to predict.")
        x_num, x_cat = self.preprocessor.transform(frame)
        device = next(self.parameters()).device  # type: ignore[attr-defined]
        was_training = self.training  # type: ignore[attr-defined]
        self.eval()  # type: ignore[attr-defined]
        try:
            parts = []
            for start in range(0, len(frame), batch_size):
                batch = {"x_num": torch.as_tensor(x_num[start:start + batch_size], device=device),
                         "x_cat": torch.as_tensor(x_cat[start:start + batch_size], device=device)}
                outputs = self.forward_members(batch)  # type: ignore[attr-defined]
                parts.append(member_predictions(outputs, self.member_output_kind).cpu())  # type: ignore[attr-defined]
        finally:
            self.train(was_training)  # type: ignore[attr-defined]
        return torch.cat(parts)

    def predict_frame(self, frame: pd.DataFrame, batch_size: int = 4096) -> pd.DataFrame:
        """Predict raw rows: one output row per input row, in input order, index kept.

        Columns are found by name (order does not matter; columns the model does not use are
        ignored with a note; missing ones are an error naming them). The output starts with the
        spec's ``id_column`` when the frame has it (else ``row``, the position), then the columns
        of ``prediction_table``: ``proba_<class>``, ``prediction`` (a label of the training
        target's type, ``TabularSpec.class_labels``), ``member_std`` and ``disagreement``
        (classification), or ``prediction`` in the target's original units and
        ``member_std`` (regression).

        Args:
            frame: the rows, as read from the user's CSV/Parquet file.
            batch_size: rows per forward pass.
        """
        spec = self.spec
        if len(frame):
            self.preprocessor.note_extra_columns(
                frame, expected=[c for c in (spec.target_name, spec.id_column) if c])
        table = self.prediction_frame(self.predict_members(frame, batch_size))
        if spec.id_column is not None and spec.id_column in frame.columns:
            insert_ids(table, spec.id_column, frame[spec.id_column].tolist())
        else:
            insert_ids(table, ROW_ID, range(len(frame)))
        table.index = frame.index
        return table
