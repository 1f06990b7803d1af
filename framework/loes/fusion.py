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
from typing_extensions import override

from ripieno.framework.backbones.loading import load_pretrained_backbone
from ripieno.framework.loes.extraction import _frame_mask, hidden_states, pool, stack_padded
from ripieno.framework.loes.scalar_mix import ScalarMix
from ripieno.framework.members import PredictOutput, StepOutput, member_probabilities
from ripieno.framework.methods.member_module import MemberModule
from ripieno.framework.specs.layer_features import LayerFeatureSpec

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
        layer_dims: the width of each layer when they differ (inputs zero-padded to
            ``d_in``; each branch reads its layer's first ``layer_dims[k]`` entries);
            ``None``: all ``d_in``. ``scalar_mix`` needs one width.

    Shape:
        - Input: ``(B, K, D)``: batch, selected layers, ``d_in`` (narrower layers zero-padded).
        - Output: ``(logits, z)``: logits ``(B, n_classes)`` and the fused embedding ``z``,
          ``(B, K * d_proj)`` (``fusion``), ``(B, d_proj)`` (``scalar_mix``) or
          ``(B, sum(layer_dims))`` (``linear``).

    Example:
        >>> head = LayerFusionHead(n_layers=3, d_in=16, n_classes=4, d_proj=8)
        >>> logits, z = head(torch.randn(5, 3, 16))
        >>> logits.shape, z.shape
        (torch.Size([5, 4]), torch.Size([5, 24]))
    """

    def __init__(self, n_layers: int, d_in: int, n_classes: int, d_proj: int = 128, dropout: float = 0.1,
                 kind: HeadKind = "fusion", layer_dims: list[int] | None = None) -> None:
        super().__init__()
        if kind not in ("fusion", "scalar_mix", "linear"):
            raise ValueError(f"head must be 'fusion', 'scalar_mix' or 'linear', got {kind!r}.")
        dims = list(layer_dims) if layer_dims else [d_in] * n_layers
        if len(dims) != n_layers:
            raise ValueError(f"layer_dims has {len(dims)} widths for {n_layers} layers.")
        if kind == "scalar_mix" and len(set(dims)) > 1:
            raise ValueError(f"head='scalar_mix' mixes layers of one width; these have widths {dims}. Use"
                             " head='fusion' (a projection per layer) or 'linear'.")
        self.kind, self.layer_dims = kind, dims
        if kind == "fusion":
            self.branches = nn.ModuleList(
                nn.Sequential(nn.LayerNorm(d), nn.Linear(d, d_proj), nn.GELU()) for d in dims)
            d_fused = n_layers * d_proj
        elif kind == "scalar_mix":
            self.mix = ScalarMix(n_layers)
            self.project = nn.Sequential(nn.LayerNorm(d_in), nn.Linear(d_in, d_proj), nn.GELU())
            d_fused = d_proj
        else:
            d_fused = sum(dims)
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_fused, n_classes)

    def fuse(self, layers: Tensor) -> Tensor:
        """The fused embedding ``z`` of ``(B, K, D)`` layer embeddings."""
        if self.kind == "fusion":
            parts = [branch(layers[:, i, : self.layer_dims[i]]) for i, branch in enumerate(self.branches)]
            return torch.cat(parts, dim=-1)
        if self.kind == "scalar_mix":
            return self.project(self.mix(list(layers.unbind(1))))
        return torch.cat([layers[:, i, :d] for i, d in enumerate(self.layer_dims)], dim=-1)

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
                                    head, layer_dims=spec.layer_dims or None)
        self.backbone = load_pretrained_backbone(spec.backbone_dir) if finetune_backbone else None
        if self.backbone is not None:
            self.backbone.train()  # from_pretrained returns eval mode; fine-tuning wants its dropout
        self.init_members("logits", spec.n_classes)

    def layers(self, batch: dict[str, Tensor]) -> Tensor:
        """The selected layers' embeddings ``(B, K, D)``: cached, or pooled live."""
        if self.backbone is None:
            return batch["layers"]
        inputs = {k: batch[k] for k in self.spec.input_keys}
        states = hidden_states(self.backbone, inputs, layer_names=self.spec.layer_names or None)
        pooled = []
        for i in self.spec.selected_layers:  # one mask per length: a CNN's stages differ
            b, t = states[i].shape[:2]
            # a model input or not; made on the states' device, never copied from the host each step
            mask = _frame_mask(self.backbone, batch.get("attention_mask"), t, b, states[i].device)
            pooled.append(pool(states[i], mask, self.spec.pooling))
        return stack_padded(pooled)[0]

    @override
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
        out: StepOutput = {"member_outputs": members, "target": batch["y"], "features": z}
        loss = self.labelled_loss(members, batch["y"], stage)
        if loss is not None:
            out["loss"] = loss
        return out

    @override
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
