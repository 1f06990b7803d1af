"""ImageClassifier: a plain supervised network for the uncertainty experiments.

One member (``member_outputs (B, 1, C)``); uncertainty comes post hoc from ripieno.callbacks
(``LastLayerSampler`` for LL-GLM/DNN-GLM, ``MCDropoutSampler``). The last layer is
``head`` (an ``nn.Linear``), which LL-GLM finds without configuration; dropout sits right
before it so MC-dropout has something to sample.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics
from torch import Tensor, nn

from ripieno.framework.image_spec import ImageSpec
from ripieno.framework.methods.loss_terms import LossTermsMixin
from ripieno.framework.methods.rng_state import RNGStateMixin

Backbone = Literal["cnn", "mlp"]


def make_backbone(kind: Backbone, image_shape: tuple[int, int, int], width: int) -> tuple[nn.Module, int]:
    """A small feature extractor and its output width.

    ``cnn``: two conv(3x3)-ReLU-maxpool stages (``width``, ``2 width`` channels) and a
    ``4 width`` linear layer (LeNet-like, for 28x28 and 8x8 inputs); ``mlp``: flatten and
    two ``4 width`` layers.
    """
    c, h, w = image_shape
    if kind == "mlp":
        layers = [nn.Flatten(), nn.Linear(c * h * w, 4 * width), nn.ReLU(),
                  nn.Linear(4 * width, 4 * width), nn.ReLU()]
        return nn.Sequential(*layers), 4 * width
    if kind != "cnn":
        raise ValueError(f"Unknown backbone {kind!r}; use 'cnn' or 'mlp'.")
    if min(h, w) < 4:
        raise ValueError(f"The cnn backbone needs images of at least 4x4, got {h}x{w}; use 'mlp'.")
    conv = nn.Sequential(
        nn.Conv2d(c, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
    )
    d_conv = 2 * width * (h // 4) * (w // 4)
    return nn.Sequential(conv, nn.Linear(d_conv, 4 * width), nn.ReLU()), 4 * width


class ImageClassifier(LossTermsMixin, RNGStateMixin, L.LightningModule):
    """Softmax classifier with a small CNN or MLP backbone.

    Logs ``{val,test}/accuracy``, ``/nll`` and ``/ece`` (15 bins) of the trained network;
    batches from a test dataloader whose labels are ``-1`` (OOD, see ``ImageDataModule``)
    are skipped by these metrics.

    Args:
        data_spec: the data's ``ImageSpec`` (or dict); linked from ``data.spec`` by the CLI.
        backbone: ``cnn`` or ``mlp``.
        width: channel/width multiplier of the backbone.
        dropout: dropout before the last layer (also what MC-dropout samples).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
    """

    task = "multiclass"
    member_output_kind = "logits"

    def __init__(
        self,
        data_spec: ImageSpec | dict[str, Any],
        backbone: Backbone = "cnn",
        width: int = 16,
        dropout: float = 0.1,
        lr: float = 1e-3,
        weight_decay: float = 1e-4,
    ) -> None:
        super().__init__()
        spec = ImageSpec.coerce(data_spec)
        data_spec = spec.to_dict()
        self.save_hyperparameters()
        self.spec = spec
        self.features, d = make_backbone(backbone, spec.image_shape, width)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(d, spec.n_classes)
        self.metrics = nn.ModuleDict(
            {stage: self._make_metrics(spec.n_classes) for stage in ("val_", "test_")}
        )

    @staticmethod
    def _make_metrics(n_classes: int) -> nn.ModuleDict:
        return nn.ModuleDict({
            "accuracy": torchmetrics.Accuracy(task="multiclass", num_classes=n_classes),
            "nll": torchmetrics.MeanMetric(),
            "ece": torchmetrics.CalibrationError(task="multiclass", num_classes=n_classes, n_bins=15),
        })

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(B, C)`` for images ``(B, C_in, H, W)``."""
        return self.head(self.dropout(self.features(x)))

    def _step(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        logits = self(batch["x"])
        valid = batch["y"] >= 0
        loss = F.cross_entropy(logits[valid].float(), batch["y"][valid]) if valid.any() else logits.sum() * 0
        return {"loss": loss, "member_outputs": logits.detach()[:, None], "target": batch["y"],
                "logits": logits}

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Cross-entropy plus every registered loss term."""
        out = self._step(batch)
        out["loss"] = out["loss"] + self.registered_loss_terms(batch, out)
        self.log("train/loss", out["loss"], prog_bar=True, on_step=True, on_epoch=True,
                 batch_size=len(batch["y"]))
        del out["logits"]
        return out

    def on_validation_epoch_start(self) -> None:
        """Empty metric states (see TabularEnsembleModule)."""
        for metric in self.metrics["val_"].values():
            metric.reset()

    def on_test_epoch_start(self) -> None:
        """Empty metric states."""
        for metric in self.metrics["test_"].values():
            metric.reset()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Loss, accuracy, NLL and ECE on the validation split."""
        return self._eval_step(batch, "val")

    def test_step(
        self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0
    ) -> dict[str, Tensor]:
        """As validation; OOD batches (labels ``-1``) only pass through."""
        return self._eval_step(batch, "test")

    def predict_step(
        self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0
    ) -> dict[str, Tensor]:
        """Class probabilities ``prediction (B, C)`` and ``logits``."""
        logits = self(batch["x"])
        return {"prediction": torch.softmax(logits.float(), -1), "logits": logits}

    def _eval_step(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        out = self._step(batch)
        logits, y = out.pop("logits"), batch["y"]
        valid = y >= 0
        if valid.any():
            probs = torch.softmax(logits[valid].float(), -1)
            target = y[valid]
            metrics = self.metrics[f"{stage}_"]
            metrics["accuracy"].update(probs, target)
            metrics["ece"].update(probs, target)
            metrics["nll"].update(-probs.gather(1, target[:, None]).clamp_min(1e-12).log())
            self.log(f"{stage}/loss", out["loss"], batch_size=int(valid.sum()), sync_dist=True,
                     add_dataloader_idx=False)
            for name, metric in metrics.items():
                self.log(f"{stage}/{name}", metric, prog_bar=name == "accuracy", add_dataloader_idx=False)
        return out

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW over all parameters."""
        hp = self.hparams
        return torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
