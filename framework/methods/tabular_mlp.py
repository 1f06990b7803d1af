"""TabularMLP: a plain one-member MLP for the uncertainty experiments on tables.

Unlike ``TabularEnsembleModule`` (members, packed heads, standardised outputs), this
network ends in one ``nn.Linear`` ``head`` whose outputs are already in the modelled
target's units (regression) or are logits (classification), so post-hoc samplers
(``LastLayerSampler``, MC-dropout, SWAG, Laplace) linearise exactly what the metrics see.
Regression still trains on standardised targets: the head starts at ``bias = mean``,
``weight * std`` and the squared error is divided by the target variance, which is the
standardised loss written in original units.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import override

from ripieno.framework.members import member_output_kind_of_task
from ripieno.framework.methods.member_module import MemberModule
from ripieno.framework.methods.tabular_prediction import TabularPredictionMixin
from ripieno.framework.nn.embeddings import OneHotEncoding
from ripieno.framework.specs.tabular import TabularSpec


class TabularMLP(TabularPredictionMixin, MemberModule):
    """MLP over numeric features and one-hot categoricals, one linear head.

    One member (``member_outputs (B, 1, d_out)``); logs the ``MemberModule`` metrics of the
    network itself. ``forward`` takes ``(x_num, x_cat)`` or a batch dict.

    Args:
        data_spec: the data's ``TabularSpec`` (or dict); linked from ``data.spec``.
        hidden: widths of the hidden layers.
        dropout: dropout after each hidden layer (what MC-dropout samples).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
    """

    def __init__(
        self,
        data_spec: TabularSpec | dict[str, Any],
        hidden: list[int] | None = None,
        dropout: float = 0.1,
        lr: float = 1e-3,
        weight_decay: float = 1e-4,
    ) -> None:
        super().__init__()
        spec = TabularSpec.coerce(data_spec)
        hidden = list(hidden) if hidden is not None else [128, 128]
        self.save_hyperparameters()
        self.use_spec(spec)  # hparams keep the compact spec; its fitted state goes to checkpoints
        self.task = spec.task
        self.cat_encoding = OneHotEncoding(spec.cat_cardinalities) if spec.cat_cardinalities else None
        d_in = spec.n_num_features + (self.cat_encoding.d_out if self.cat_encoding is not None else 0)
        layers: list[nn.Module] = []
        for width in hidden:
            layers += [nn.Linear(d_in, width), nn.ReLU(), nn.Dropout(dropout)]
            d_in = width
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(d_in, spec.d_out)
        if spec.task == "regression":
            with torch.no_grad():
                self.head.weight.mul_(spec.target_std)
                self.head.bias.fill_(spec.target_mean)
        self.init_members(member_output_kind_of_task(spec.task), spec.n_classes)

    @override
    def forward(self, x_num: Tensor | dict[str, Tensor], x_cat: Tensor | None = None) -> Tensor:
        """Outputs ``(B, d_out)``: regression values in target units, or logits."""
        if isinstance(x_num, dict):
            x_num, x_cat = x_num["x_num"], x_num.get("x_cat")
        parts = [x_num] if x_num.shape[-1] > 0 else []
        if self.cat_encoding is not None and x_cat is not None:
            parts.append(self.cat_encoding(x_cat))
        return self.head(self.body(torch.cat(parts, dim=-1)))

    def forward_members(self, batch: dict[str, Tensor]) -> Tensor:
        """The network's outputs as one member, ``(B, 1, d_out)``."""
        return self(batch)[:, None]

    def target_scale(self) -> float:
        """Regression trains on the squared error of standardised targets."""
        return float(self.spec.target_std)

    def to_original_units(self, prediction: Tensor) -> Tensor:
        """Undo the target transform (``exp`` for ``log``)."""
        return prediction.exp() if self.spec.target_transform == "log" else prediction
