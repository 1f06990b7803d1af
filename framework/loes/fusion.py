"""The fusion head over selected layers, and its LightningModule.

``LayerFusionHead``: per selected layer ``LayerNorm -> Linear(D, d_proj) -> GELU``, the
projections concatenated into the fused embedding ``z`` (``K * d_proj``), dropout, then a
linear task head. ``head="scalar_mix"`` is the ELMo-style baseline (``ScalarMix`` of all
given layers, then ``LayerNorm -> Linear -> GELU`` and the task head) and
``head="linear"`` a linear probe on the concatenated layers.

``FusionClassifier`` trains the head on frozen, cached features (batches
``{"layers": (B, K, D), "y"}`` from ``LayerEmbeddingDataModule``) or, with
``finetune_backbone=True``, fine-tunes the backbone too: batches then hold the backbone's
inputs, and the selected layers are pooled live exactly as the cache pooled them.
Its step output carries ``features`` (the fused embedding) for ``ripieno.callbacks.GeoReg``.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics
from torch import Tensor, nn

from ripieno.framework.loes.features import _frame_mask, hidden_states, load_pretrained_backbone, pool
from ripieno.framework.loes.scalar_mix import ScalarMix
from ripieno.framework.loes.spec import LayerFeatureSpec
from ripieno.framework.methods.loss_terms import LossTermsMixin
from ripieno.framework.methods.rng_state import RNGStateMixin

HeadKind = Literal["fusion", "scalar_mix", "linear"]


class LayerFusionHead(nn.Module):
    """Fuse ``K`` layer embeddings ``(B, K, D)`` into ``z`` and classify.

    Args:
        n_layers: ``K``.
        d_in: embedding width ``D``.
        n_classes: classes.
        d_proj: projection width per layer.
        dropout: dropout on the fused embedding.
        kind: ``fusion``, ``scalar_mix`` or ``linear``.
    """

    def __init__(self, n_layers: int, d_in: int, n_classes: int, d_proj: int = 128, dropout: float = 0.1,
                 kind: HeadKind = "fusion") -> None:
        super().__init__()
        if kind not in ("fusion", "scalar_mix", "linear"):
            raise ValueError(f"head must be 'fusion', 'scalar_mix' or 'linear', got {kind!r}.")
        self.kind = kind
        if kind == "fusion":
            self.branches = nn.ModuleList(
                nn.Sequential(nn.LayerNorm(d_in), nn.Linear(d_in, d_proj), nn.GELU())
                for _ in range(n_layers))
            d_fused = n_layers * d_proj
        elif kind == "scalar_mix":
            self.mix = ScalarMix(n_layers)
            self.project = nn.Sequential(nn.LayerNorm(d_in), nn.Linear(d_in, d_proj), nn.GELU())
            d_fused = d_proj
        else:
            d_fused = n_layers * d_in
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_fused, n_classes)

    def fuse(self, layers: Tensor) -> Tensor:
        """The fused embedding ``z`` of ``(B, K, D)`` layer embeddings."""
        if self.kind == "fusion":
            return torch.cat([branch(layers[:, i]) for i, branch in enumerate(self.branches)], dim=-1)
        if self.kind == "scalar_mix":
            return self.project(self.mix(list(layers.unbind(1))))
        return layers.flatten(1)

    def forward(self, layers: Tensor) -> tuple[Tensor, Tensor]:
        """``(logits (B, C), z)``."""
        z = self.fuse(layers)
        return self.classifier(self.dropout(z)), z


class FusionClassifier(LossTermsMixin, RNGStateMixin, L.LightningModule):
    """Classifier on selected intermediate layers of a pretrained model.

    Logs ``{val,test}/accuracy`` and ``/nll``; ``train/loss`` includes registered loss
    terms (GeoReg).

    Args:
        data_spec: the ``LayerFeatureSpec`` (or dict); linked from ``data.spec`` by the CLI.
        head: ``fusion``, ``scalar_mix`` (ELMo baseline) or ``linear``.
        d_proj: projection width per layer.
        dropout: dropout on the fused embedding.
        lr: AdamW learning rate of the head.
        weight_decay: AdamW weight decay.
        finetune_backbone: fine-tune the backbone (batches hold its inputs) instead of
            reading cached features.
        backbone_lr: learning rate of the backbone when fine-tuning.
    """

    task = "multiclass"
    member_output_kind = "logits"

    def __init__(self, data_spec: LayerFeatureSpec | dict[str, Any], head: HeadKind = "fusion",
                 d_proj: int = 128, dropout: float = 0.1, lr: float = 1e-3, weight_decay: float = 1e-2,
                 finetune_backbone: bool = False, backbone_lr: float = 2e-5) -> None:
        super().__init__()
        spec = LayerFeatureSpec.coerce(data_spec)
        data_spec = spec.to_dict()
        self.save_hyperparameters()
        if spec.finetune_backbone != finetune_backbone:
            raise ValueError(f"The datamodule was set up with finetune_backbone={spec.finetune_backbone} but"
                             f" the model with {finetune_backbone}; set both (data and model) alike.")
        self.spec = spec
        self.head = LayerFusionHead(len(spec.selected_layers), spec.d_model, spec.n_classes, d_proj, dropout,
                                    head)
        self.backbone = load_pretrained_backbone(spec.backbone_dir) if finetune_backbone else None
        if self.backbone is not None:
            self.backbone.train()  # from_pretrained returns eval mode; fine-tuning wants its dropout
        self.metrics = nn.ModuleDict({stage: nn.ModuleDict({
            "accuracy": torchmetrics.Accuracy(task="multiclass", num_classes=spec.n_classes),
            "nll": torchmetrics.MeanMetric()}) for stage in ("val_", "test_")})

    def layers(self, batch: dict[str, Tensor]) -> Tensor:
        """The selected layers' embeddings ``(B, K, D)``: cached, or pooled live."""
        if self.backbone is None:
            return batch["layers"]
        inputs = {k: batch[k] for k in self.spec.input_keys}
        states = hidden_states(self.backbone, inputs)
        b, t = states[0].shape[:2]
        mask = _frame_mask(self.backbone, inputs.get("attention_mask"), t, b)
        return torch.stack([pool(states[i], mask, self.spec.pooling) for i in self.spec.selected_layers], 1)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """``(logits, fused embedding)`` of a batch."""
        return self.head(self.layers(batch))

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Cross-entropy plus registered loss terms; ``features`` is the fused embedding."""
        logits, z = self(batch)
        out = {"loss": F.cross_entropy(logits.float(), batch["y"]), "features": z,
               "member_outputs": logits.detach()[:, None], "target": batch["y"]}
        out["loss"] = out["loss"] + self.registered_loss_terms(batch, out)
        self.log("train/loss", out["loss"], prog_bar=True, on_step=True, on_epoch=True,
                 batch_size=len(batch["y"]))
        out["features"] = z.detach()
        return out

    def on_validation_epoch_start(self) -> None:
        """Fresh metric states."""
        for metric in self.metrics["val_"].values():
            metric.reset()

    def on_test_epoch_start(self) -> None:
        """Fresh metric states."""
        for metric in self.metrics["test_"].values():
            metric.reset()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Accuracy and NLL on the validation split."""
        return self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Accuracy and NLL on the test split."""
        return self._eval_step(batch, "test")

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Class probabilities ``prediction (B, C)`` and the fused embedding ``features``."""
        logits, z = self(batch)
        return {"prediction": torch.softmax(logits.float(), -1), "features": z}

    def _eval_step(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        logits, z = self(batch)
        y = batch["y"]
        probs = torch.softmax(logits.float(), -1)
        metrics = self.metrics[f"{stage}_"]
        metrics["accuracy"].update(probs, y)
        metrics["nll"].update(-probs.gather(1, y[:, None]).clamp_min(1e-12).log())
        loss = F.cross_entropy(logits.float(), y)
        self.log(f"{stage}/loss", loss, batch_size=len(y), sync_dist=True)
        for name, metric in metrics.items():
            self.log(f"{stage}/{name}", metric, prog_bar=name == "accuracy")
        return {"loss": loss, "features": z.detach(), "member_outputs": logits.detach()[:, None], "target": y}

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW; the backbone (when fine-tuned) at its own learning rate."""
        hp = self.hparams
        groups = [{"params": self.head.parameters(), "lr": hp.lr}]
        if self.backbone is not None:
            groups.append({"params": self.backbone.parameters(), "lr": hp.backbone_lr})
        return torch.optim.AdamW(groups, weight_decay=hp.weight_decay)
