"""GeoReg: a loss against covariance spectral imbalance and collapsed class centroids.

Added to the training loss through the module's loss-term extension point
(``LossTermsMixin``):

    weight * (spectral_weight * (1 - Iso(z)) + volume_weight * (-log V(z, y)))

with ``z`` the batch's fused embedding (``step_output[feature_key]``, e.g.
``FusionClassifier``'s ``features``) and ``y`` its labels (``ripieno.framework.loes.geometry_loss``
defines both terms). The terms are computed in float32 with autocast off, so they are the
same under bf16/fp16 mixed precision. Batches with a single class skip the volume term.

``variant="reference"`` is the public GeoReg code's loss instead, per batch,

    weight * (Var(eigenvalues of cov(z) + 1e-4 I, clamped at 1e-6) - log(area + 1e-6))

with ``area`` that of the triangle of three distinct random classes' centroids in the batch (0
below 3 classes; ``reference_georeg_terms``), on the raw embedding, with the reference's weight
0.1. Ours differs on purpose: both of our terms are scale-free (a bounded isotropy and a
normalised simplex volume over *every* class in the batch), so the loss cannot be lowered by
shrinking or inflating the embedding, and it is deterministic; the eigenvalue variance grows
with the square of the embedding's scale and one random triangle is a noisy signal.

Logged each epoch (``train``, ``val`` and ``test``), over the epoch's embeddings (per
rank, averaged across ranks): ``georeg/<stage>/isotropy`` and
``georeg/<stage>/centroid_log_volume``. With ``weight=0`` the callback only measures.

On an accelerator nothing here makes the host wait during a training step, when the number of
classes is known (``n_classes``, or the module's ``n_classes``): the volume term has fixed
shapes (``centroid_log_volume_of_present_classes``), and the epoch's measures are running sums
kept on the device (``EpochGeometry``), read once per epoch. Without ``n_classes`` the term
finds the batch's classes with ``torch.unique`` and the epoch's embeddings are kept on the
host, one read per step. The ``reference`` variant draws its random class triangle on the host,
as the public code does, so it reads the batch's classes every step.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from typing_extensions import override

from ripieno.framework.loes.geometry_loss import (
    EpochGeometry,
    centroid_log_volume,
    centroid_log_volume_of_present_classes,
    reference_georeg_terms,
    spectral_imbalance,
)
from ripieno.framework.loes.geometry_loss import isotropy as batch_isotropy
from ripieno.framework.members import LossTermsModel, require_capability


class GeoReg(Callback):
    """Geometry regulariser for a module that returns its embedding in the step output.

    The module needs the ``LossTermsModel`` capability (``ripieno.framework.members``);
    ``setup`` stops the run without it.

    Args:
        weight: overall weight of the term (the reference's is 0.1, our default too).
        spectral_weight: ``ripieno`` only: weight of ``1 - Iso`` (default 1).
        volume_weight: ``ripieno`` only: weight of ``-log V`` (default 1).
        feature_key: key of the embedding in the step output dict.
        target_key: key of the labels in the batch dict.
        normalize: ``ripieno`` only: L2-normalise embeddings before both terms (default True).
        variant: ``ripieno`` (ours, default) or ``reference`` (the public GeoReg loss).
        seed: ``reference`` only: seed of the random class triangles.
        n_classes: Number of classes; ``None`` takes the module's ``n_classes`` (see the module
            notes: without either, each training step reads the batch's classes on the host).
    """

    def __init__(self, weight: float = 0.1, spectral_weight: float | None = None,
                 volume_weight: float | None = None, feature_key: str = "features", target_key: str = "y",
                 normalize: bool | None = None, variant: Literal["ripieno", "reference"] = "ripieno",
                 seed: int = 0, n_classes: int | None = None) -> None:
        super().__init__()
        if variant not in ("ripieno", "reference"):
            raise ValueError(f"GeoReg variant must be 'ripieno' or 'reference', got {variant!r}.")
        if variant == "reference":
            given = [name for name, value in (("spectral_weight", spectral_weight),
                                              ("volume_weight", volume_weight), ("normalize", normalize))
                     if value is not None]
            if given:
                raise ValueError(f"{given} are options of GeoReg variant='ripieno'; the reference loss has"
                                 " only its weight. Drop them, or use variant='ripieno'.")
        spectral_weight = 1.0 if spectral_weight is None else spectral_weight
        volume_weight = 1.0 if volume_weight is None else volume_weight
        if min(weight, spectral_weight, volume_weight) < 0:
            raise ValueError("GeoReg weights must be >= 0.")
        self.weight, self.spectral_weight, self.volume_weight = weight, spectral_weight, volume_weight
        self.feature_key, self.target_key = feature_key, target_key
        self.normalize = True if normalize is None else normalize
        self.variant, self.seed = variant, seed
        self._generator = torch.Generator().manual_seed(seed)
        self.n_classes = n_classes
        self._classes: int | None = n_classes  # resolved in setup
        self._epoch: dict[str, tuple[list[Tensor], list[Tensor]]] = {}
        self._epoch_sums: dict[str, EpochGeometry] = {}
        self.history: list[dict[str, float]] = []

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(weight=self.weight, feature_key=self.feature_key)

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles callbacks through torch's shared-memory reductions, and a spawned child cannot
        # rebuild the shared storage of a generator's state tensor: carry the state as plain bytes instead.
        state = self.__dict__.copy()
        state["_generator"] = bytes(self._generator.get_state().numpy())
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        generator_state = state.pop("_generator")
        self.__dict__.update(state)
        self._generator = torch.Generator()
        self._generator.set_state(torch.frombuffer(bytearray(generator_state), dtype=torch.uint8))

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"generator": self._generator.get_state()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "generator" in state_dict:
            self._generator.set_state(state_dict["generator"])

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        require_capability(self, pl_module, LossTermsModel, "mix in"
                           " ripieno.framework.methods.loss_terms.LossTermsMixin and add"
                           " registered_loss_terms(...) to the training loss")
        pl_module.remove_loss_term("georeg")
        pl_module.register_loss_term("georeg", self._term)
        if self.n_classes is None:
            classes = getattr(pl_module, "n_classes", None)
            self._classes = int(classes) if isinstance(classes, int) and classes >= 2 else None

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        pl_module.remove_loss_term("georeg")

    def _features(self, step_output: dict[str, Any]) -> Tensor:
        if self.feature_key not in step_output:
            raise KeyError(f"GeoReg needs the step output to hold the embedding under {self.feature_key!r};"
                           f" it has {sorted(step_output)}.")
        return step_output[self.feature_key]

    def _term(self, module: L.LightningModule, batch: Any, step_output: dict[str, Any]) -> Tensor:  # noqa: ANN401
        z, y = self._features(step_output), batch[self.target_key]
        with torch.autocast(device_type=z.device.type, enabled=False):
            if self.variant == "reference":
                variance, log_area = reference_georeg_terms(z, y, self._generator)
                return self.weight * (variance - log_area)
            total = self.spectral_weight * spectral_imbalance(z, self.normalize)
            if self.volume_weight > 0 and self._classes is not None:  # 0 below two classes, no host read
                total = total - self.volume_weight * centroid_log_volume_of_present_classes(
                    z, y, self._classes, self.normalize)
            elif self.volume_weight > 0 and len(torch.unique(y)) >= 2:
                total = total - self.volume_weight * centroid_log_volume(z, y, self.normalize)
        return self.weight * total

    def _collect(self, stage: str, outputs: Any, batch: Any) -> None:  # noqa: ANN401
        if isinstance(outputs, dict) and self.feature_key in outputs and self._classes is not None:
            if stage not in self._epoch_sums:
                self._epoch_sums[stage] = EpochGeometry(self._classes, self.normalize)
            self._epoch_sums[stage].add(outputs[self.feature_key], batch[self.target_key])
        elif isinstance(outputs, dict) and self.feature_key in outputs:
            store = self._epoch.setdefault(stage, ([], []))
            store[0].append(outputs[self.feature_key].detach().float().cpu())
            store[1].append(batch[self.target_key].detach().cpu())

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                           batch: Any, batch_idx: int) -> None:  # noqa: ANN401
        self._collect("train", outputs, batch)

    @override
    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        self._collect("val", outputs, batch)

    def _log_epoch(self, stage: str, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sums = self._epoch_sums.pop(stage, None)
        z_parts, y_parts = self._epoch.pop(stage, ([], []))
        if trainer.sanity_checking or (sums is None and not z_parts):
            return
        if sums is not None:
            values = sums.values()
            if not values:
                return
        else:
            z, y = torch.cat(z_parts), torch.cat(y_parts)
            values = {"isotropy": float(batch_isotropy(z, self.normalize))}
            valid = y >= 0
            if len(torch.unique(y[valid])) >= 2:
                values["centroid_log_volume"] = float(centroid_log_volume(z[valid], y[valid], self.normalize))
        for name, value in values.items():
            pl_module.log(f"georeg/{stage}/{name}", value, sync_dist=True)
        self.history.append({"stage": stage, "epoch": trainer.current_epoch, **values})

    @override
    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        self._collect("test", outputs, batch)

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_epoch("test", trainer, pl_module)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_epoch("train", trainer, pl_module)

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log_epoch("val", trainer, pl_module)
