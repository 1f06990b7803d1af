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

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics
from torch import Tensor, nn

from ripieno.framework.methods.loss_terms import LossTermsMixin
from ripieno.framework.methods.rng_state import RNGStateMixin
from ripieno.framework.nn.embeddings import OneHotEncoding
from ripieno.framework.tabular_spec import TabularSpec


class TabularMLP(LossTermsMixin, RNGStateMixin, L.LightningModule):
    """MLP over numeric features and one-hot categoricals, one linear head.

    Logs ``{val,test}/rmse`` (regression) or ``/accuracy`` and ``/nll`` (classification)
    of the network itself. ``forward`` takes ``(x_num, x_cat)`` or a batch dict.

    Args:
        data_spec: the data's ``TabularSpec`` (or dict); linked from ``data.spec``.
        hidden: widths of the hidden layers.
        dropout: dropout after each hidden layer (what MC-dropout samples).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
    """

    member_output_kind = "logits"

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
        data_spec = spec.to_dict()
        hidden = list(hidden) if hidden is not None else [128, 128]
        self.save_hyperparameters()
        self.spec, self.task = spec, spec.task
        if spec.task == "regression":
            self.member_output_kind = "regression"
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
        self.metrics = nn.ModuleDict({s: self._make_metrics() for s in ("val_", "test_")})

    def _make_metrics(self) -> nn.ModuleDict:
        if self.task == "regression":
            return nn.ModuleDict({"rmse": torchmetrics.MeanSquaredError(squared=False)})
        return nn.ModuleDict({"accuracy": torchmetrics.Accuracy(task="multiclass",
                                                                num_classes=max(self.spec.n_classes or 2, 2)),
                              "nll": torchmetrics.MeanMetric()})

    def forward(self, x_num: Tensor | dict[str, Tensor], x_cat: Tensor | None = None) -> Tensor:
        """Outputs ``(B, d_out)``: regression values in target units, or logits."""
        if isinstance(x_num, dict):
            x_num, x_cat = x_num["x_num"], x_num.get("x_cat")
        parts = [x_num] if x_num.shape[-1] > 0 else []
        if self.cat_encoding is not None and x_cat is not None:
            parts.append(self.cat_encoding(x_cat))
        return self.head(self.body(torch.cat(parts, dim=-1)))

    def loss(self, out: Tensor, y: Tensor) -> Tensor:
        """Standardised squared error, or (binary) cross-entropy."""
        if self.task == "regression":
            return F.mse_loss(out[:, 0].float(), y.float()) / self.spec.target_std**2
        if self.task == "binary":
            return F.binary_cross_entropy_with_logits(out[:, 0].float(), y.float())
        return F.cross_entropy(out.float(), y)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Loss plus every registered loss term."""
        out = self(batch)
        step = {"loss": self.loss(out, batch["y"]), "member_outputs": out.detach()[:, None],
                "target": batch["y"]}
        step["loss"] = step["loss"] + self.registered_loss_terms(batch, step)
        self.log("train/loss", step["loss"], prog_bar=True, on_step=True, on_epoch=True,
                 batch_size=len(batch["y"]))
        return step

    def on_validation_epoch_start(self) -> None:
        """Empty metric states (see TabularEnsembleModule)."""
        for metric in self.metrics["val_"].values():
            metric.reset()

    def on_test_epoch_start(self) -> None:
        """Empty metric states."""
        for metric in self.metrics["test_"].values():
            metric.reset()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Loss and task metrics on the validation split."""
        return self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Loss and task metrics on the test split."""
        return self._eval_step(batch, "test")

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """``prediction``: values in original units (``exp`` undone for log targets) or probabilities."""
        out = self(batch)
        if self.task == "regression":
            pred = out[:, 0].float()
            return {"prediction": pred.exp() if self.spec.target_transform == "log" else pred}
        return {"prediction": self._probabilities(out)}

    def _probabilities(self, out: Tensor) -> Tensor:
        if self.task == "binary":
            p1 = torch.sigmoid(out[:, 0].float())
            return torch.stack([1 - p1, p1], -1)
        return torch.softmax(out.float(), -1)

    def _eval_step(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        out, y = self(batch), batch["y"]
        loss = self.loss(out, y)
        metrics = self.metrics[f"{stage}_"]
        if self.task == "regression":
            metrics["rmse"].update(out[:, 0].float(), y.float())
        else:
            probs = self._probabilities(out)
            metrics["accuracy"].update(probs, y)
            metrics["nll"].update(-probs.gather(1, y[:, None]).clamp_min(1e-12).log())
        self.log(f"{stage}/loss", loss, batch_size=len(y), sync_dist=True)
        for name, metric in metrics.items():
            self.log(f"{stage}/{name}", metric, prog_bar=True)
        return {"loss": loss, "member_outputs": out.detach()[:, None], "target": y}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW over all parameters."""
        hp = self.hparams
        return torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
