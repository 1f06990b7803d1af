"""TabularEnsembleModule: LoMETab, TabM, TabM-mini, additive, MLP and deep ensembles.

Training loss = mean over members of the per-member loss; prediction = mean of member
probabilities (classification) or outputs (regression), reported in the target's
original units. Steps return ``member_outputs (B, K, out)`` and ``target`` (see
DESIGN.md) so DiversityMonitor and other member-aware callbacks work unchanged.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics
from torch import Tensor, nn

from ripieno.framework.methods.loss_terms import LossTermsMixin
from ripieno.framework.methods.rng_state import RNGStateMixin
from ripieno.framework.nn.embeddings import PiecewiseLinearEmbeddings
from ripieno.framework.nn.ensemble_linear import Adapter, Compute, EnsembleLinear, ScalingInit
from ripieno.framework.nn.tabular_backbone import AdapterLayers, TabularEnsembleNet
from ripieno.framework.tabular_spec import TabularSpec


class TabularEnsembleModule(LossTermsMixin, RNGStateMixin, L.LightningModule):
    """K-member tabular network with the ensemble conventions of ripieno.

    Logged metrics: ``{train,val,test}/loss`` (mean member loss on standardised targets
    or logits), and for the ensemble prediction ``val/accuracy``, ``val/nll``
    (``val/auroc`` for binary) or ``val/rmse``, ``val/mae``, ``val/r2`` in the modelled
    target's units (for ``target_transform=log``: log units, as TabM reports diamonds;
    ``val/rmse_original`` in the raw units).

    Args:
        data_spec: the data's ``TabularSpec`` (or its dict); the CLI links it from
            ``data.spec``.
        k: number of members (1 = plain MLP).
        adapter: hidden-layer adapter: ``lometab``, ``rank1`` (TabM), ``additive``,
            ``shared`` (no adapter) or ``packed`` (deep ensemble).
        adapter_layers: adapt ``all`` hidden layers, the ``first`` only, or ``mini``
            (TabM-mini: one per-member input scaling before a fully shared MLP).
        n_blocks: hidden layers.
        d_block: hidden width.
        dropout: dropout rate.
        rank: adapter rank ``r`` (``lometab``, ``additive``).
        sigma_init: adapter init scale (std of entries of ``A_k B_k^T``).
        d_embedding: numeric embedding size (used when the spec has bins).
        share_embeddings: share numeric embeddings across members (``False`` for a true
            deep ensemble).
        rank1_init: initialisation of the first layer's ``r`` for ``rank1``.
        compute: ``auto``, ``factored`` or ``materialized`` evaluation of ``lometab``.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay for weight matrices; biases, embeddings and
            adapters (``r``, ``s``, ``A``, ``B``; multiplicative around 1, so decay would
            pull them to the wrong point) get none.
    """

    def __init__(
        self,
        data_spec: TabularSpec | dict[str, Any],
        k: int = 8,
        adapter: Adapter = "lometab",
        adapter_layers: AdapterLayers = "all",
        n_blocks: int = 2,
        d_block: int = 256,
        dropout: float = 0.1,
        rank: int = 4,
        sigma_init: float = 0.3,
        d_embedding: int = 16,
        share_embeddings: bool = True,
        rank1_init: ScalingInit = "normal",
        compute: Compute = "auto",
        lr: float = 2e-3,
        weight_decay: float = 3e-4,
    ) -> None:
        super().__init__()
        spec = TabularSpec.coerce(data_spec)
        data_spec = spec.to_dict()  # plain dict in hparams: YAML-friendly, weights_only-safe
        self.save_hyperparameters()
        self.spec = spec
        self.task: Literal["regression", "binary", "multiclass"] = spec.task
        self.net = TabularEnsembleNet(
            n_num_features=spec.n_num_features, cat_cardinalities=spec.cat_cardinalities,
            d_out=spec.d_out, k=k, adapter=adapter, adapter_layers=adapter_layers,
            n_blocks=n_blocks, d_block=d_block, dropout=dropout, rank=rank,
            sigma_init=sigma_init, bins=spec.bin_tensors(), d_embedding=d_embedding,
            share_embeddings=share_embeddings, rank1_init=rank1_init, compute=compute,
        )
        self.metrics = nn.ModuleDict({stage: self._make_metrics() for stage in ("val_", "test_")})

    # ----------------------------------------------------------------- model interface
    @property
    def member_output_kind(self) -> str:
        """How to read ``member_outputs``: ``logits``, ``binary_logits`` or ``regression``."""
        return {"multiclass": "logits", "binary": "binary_logits"}.get(self.task, "regression")

    @property
    def output_affine(self) -> tuple[float, float]:
        """``(scale, shift)`` from raw outputs to the modelled target's units (regression)."""
        if self.task == "regression":
            return float(self.spec.target_std), float(self.spec.target_mean)
        return 1.0, 0.0

    def forward(self, x_num: Tensor | dict[str, Tensor] | None, x_cat: Tensor | None = None) -> Tensor:
        """Raw member outputs ``(B, K, d_out)``: logits, or standardised regression values.

        ``x_num`` may be a batch dict with ``x_num``/``x_cat`` (what posterior callbacks pass).
        """
        if isinstance(x_num, dict):
            x_num, x_cat = x_num.get("x_num"), x_num.get("x_cat")
        return self.net(x_num, x_cat)

    def member_predictions(self, raw: Tensor) -> Tensor:
        """Member outputs for users: probabilities ``(B, K, C)`` or regression values ``(B, K)``.

        Regression values are in the modelled target's units (standardisation undone).
        """
        if self.task == "regression":
            return raw[..., 0].float() * self.spec.target_std + self.spec.target_mean
        if self.task == "binary":
            p1 = torch.sigmoid(raw[..., 0].float())
            return torch.stack([1 - p1, p1], dim=-1)
        return torch.softmax(raw.float(), dim=-1)

    def predict_ensemble(self, raw: Tensor) -> Tensor:
        """Ensemble prediction from raw member outputs.

        Mean of member probabilities ``(B, C)``, or mean member output ``(B,)`` in the
        modelled target's units.
        """
        return self.member_predictions(raw).mean(dim=1)

    def to_original_units(self, y: Tensor) -> Tensor:
        """Undo the target transform (``exp`` for ``log``)."""
        return y.exp() if self.spec.target_transform == "log" else y

    # ----------------------------------------------------------------------- steps
    def member_loss(self, raw: Tensor, y: Tensor) -> Tensor:
        """Mean over members (and rows) of the per-member loss."""
        k = raw.shape[1]
        if self.task == "regression":
            target = ((y.float() - self.spec.target_mean) / self.spec.target_std)[:, None]
            return F.mse_loss(raw[..., 0].float(), target.expand(-1, k))
        if self.task == "binary":
            return F.binary_cross_entropy_with_logits(
                raw[..., 0].float(), y.float()[:, None].expand(-1, k)
            )
        return F.cross_entropy(raw.float().flatten(0, 1), y.repeat_interleave(k))

    def _step(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        raw = self(batch["x_num"], batch.get("x_cat"))
        loss = self.member_loss(raw, batch["y"])
        out = raw.detach().float()
        if self.task == "regression":
            out = self.member_predictions(out)[..., None]
        return {"loss": loss, "member_outputs": out, "target": batch["y"], "raw": raw}

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Mean member loss plus every registered loss term."""
        out = self._step(batch)
        out["loss"] = out["loss"] + self.registered_loss_terms(batch, out)
        self.log("train/loss", out["loss"], prog_bar=True, on_step=True, on_epoch=True,
                 batch_size=len(batch["y"]))
        del out["raw"]
        return out

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Loss and ensemble metrics on the validation split."""
        return self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Loss and ensemble metrics on the test split."""
        return self._eval_step(batch, "test")

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Ensemble prediction in original units plus member predictions ``(B, K, ...)``."""
        raw = self(batch["x_num"], batch.get("x_cat"))
        pred = self.predict_ensemble(raw)
        if self.task == "regression":
            pred = self.to_original_units(pred)
        return {"prediction": pred, "member_predictions": self.member_predictions(raw)}

    def on_validation_epoch_start(self) -> None:
        """Start from empty metric states (a ``ddp_spawn`` fit hands back synced ones)."""
        for metric in self.metrics["val_"].values():
            metric.reset()

    def on_test_epoch_start(self) -> None:
        """Start from empty metric states."""
        for metric in self.metrics["test_"].values():
            metric.reset()

    def _eval_step(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        out = self._step(batch)
        raw, y = out.pop("raw"), batch["y"]
        pred = self.predict_ensemble(raw)
        metrics = self.metrics[f"{stage}_"]
        if self.task == "regression":
            for name in ("rmse", "mae", "r2"):
                metrics[name].update(pred, y.float())
            if self.spec.target_transform != "none":
                metrics["rmse_original"].update(self.to_original_units(pred),
                                                self.to_original_units(y.float()))
        else:
            target = y.long()
            metrics["accuracy"].update(pred if self.task == "multiclass" else pred[:, 1], target)
            metrics["nll"].update(-pred.gather(1, target[:, None]).clamp_min(1e-12).log())
            if self.task == "binary":
                metrics["auroc"].update(pred[:, 1], target)
        bs = len(y)
        self.log(f"{stage}/loss", out["loss"], prog_bar=stage == "val", batch_size=bs, sync_dist=True)
        for name, metric in metrics.items():
            self.log(f"{stage}/{name}", metric, prog_bar=name in ("accuracy", "rmse"), batch_size=bs)
        return out

    def _make_metrics(self) -> nn.ModuleDict:
        spec = self.spec
        if spec.task == "regression":
            metrics = {
                "rmse": torchmetrics.MeanSquaredError(squared=False),
                "mae": torchmetrics.MeanAbsoluteError(),
                "r2": torchmetrics.R2Score(),
            }
            if spec.target_transform != "none":
                metrics["rmse_original"] = torchmetrics.MeanSquaredError(squared=False)
            return nn.ModuleDict(metrics)
        task = "binary" if spec.task == "binary" else "multiclass"
        metrics = {
            "accuracy": torchmetrics.Accuracy(task=task, num_classes=spec.n_classes),
            "nll": torchmetrics.MeanMetric(),
        }
        if spec.task == "binary":
            metrics["auroc"] = torchmetrics.AUROC(task="binary")
        return nn.ModuleDict(metrics)

    # ------------------------------------------------------------------- optimiser
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """AdamW; weight decay only on shared/packed weight matrices."""
        decay, no_decay = [], []
        for module in self.net.modules():
            for name, param in module.named_parameters(recurse=False):
                is_weight = isinstance(module, EnsembleLinear) and name == "weight"
                if isinstance(module, PiecewiseLinearEmbeddings):
                    is_weight = False
                (decay if is_weight else no_decay).append(param)
        groups = [{"params": decay, "weight_decay": self.hparams.weight_decay},
                  {"params": no_decay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=self.hparams.lr)
