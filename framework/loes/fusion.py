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

import torch
from torch import Tensor, nn

from ripieno.framework.loes.features import _frame_mask, hidden_states, load_pretrained_backbone, pool
from ripieno.framework.loes.scalar_mix import ScalarMix
from ripieno.framework.loes.spec import LayerFeatureSpec
from ripieno.framework.members import PredictOutput, StepOutput, member_probabilities
from ripieno.framework.methods.member_module import MemberModule

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


class FusionClassifier(MemberModule):
    """Classifier on selected intermediate layers of a pretrained model.

    Logs the ``MemberModule`` metrics (``{val,test}/accuracy``, ``/nll``, ...); ``train/loss``
    includes registered loss terms (GeoReg).

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
        self.init_members("logits", spec.n_classes)

    def layers(self, batch: dict[str, Tensor]) -> Tensor:
        """The selected layers' embeddings ``(B, K, D)``: cached, or pooled live."""
        if self.backbone is None:
            return batch["layers"]
        inputs = {k: batch[k] for k in self.spec.input_keys}
        states = hidden_states(self.backbone, inputs)
        b, t = states[0].shape[:2]
        mask = _frame_mask(self.backbone, batch.get("attention_mask"), t, b)  # a model input or not
        return torch.stack([pool(states[i], mask, self.spec.pooling) for i in self.spec.selected_layers], 1)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """``(logits, fused embedding)`` of a batch."""
        return self.head(self.layers(batch))

    def forward_members(self, batch: dict[str, Tensor]) -> Tensor:
        """Logits as one member, ``(B, 1, C)``."""
        return self(batch)[0][:, None]

    def step(self, batch: dict[str, Tensor], stage: str) -> StepOutput:
        """Cross-entropy; ``features`` is the fused embedding (what GeoReg regularises)."""
        logits, z = self(batch)
        members = logits[:, None]
        return {"loss": self.member_loss(members, batch["y"]), "member_outputs": members,
                "target": batch["y"], "features": z}

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int,
                     dataloader_idx: int = 0) -> PredictOutput:
        """Class probabilities ``prediction (B, C)``, ``member_predictions`` and ``features``."""
        logits, z = self(batch)
        members = member_probabilities(logits[:, None], "logits")
        return {"prediction": members.mean(1), "member_predictions": members, "features": z}  # type: ignore[typeddict-unknown-key]

    def optimizer_parameters(self) -> list[dict[str, Any]]:
        """The head at ``lr``; the backbone (when fine-tuned) at ``backbone_lr``."""
        groups = [{"params": self.head.parameters(), "lr": self.hparams.lr}]
        if self.backbone is not None:
            groups.append({"params": self.backbone.parameters(), "lr": self.hparams.backbone_lr})
        return groups
