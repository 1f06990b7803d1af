"""DiversityMonitor: how different the members of an ensemble are, during training.

Works with any LightningModule whose validation/test step returns a dict holding member
outputs shaped ``(B, K, ...)`` (members on axis 1, ``ripieno.framework.members``), not only ripieno's.
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_only
from torchmetrics import MetricCollection
from typing_extensions import override

from ripieno.framework.members import MemberModel, require_capability
from ripieno.framework.metrics.diversity import Ambiguity, MemberDisagreement, PairwiseKLDivergence

OutputKind = Literal["auto", "logits", "binary_logits", "probs", "regression"]


class DiversityMonitor(Callback):
    r"""Log member diversity on validation and test epochs under ``diversity/``.

    Classification: ``diversity/{stage}/pairwise_kl`` (mean ``KL(p_i || p_j)`` over
    ordered member pairs, nats) and ``diversity/{stage}/disagreement`` (fraction of
    ordered pairs with different argmax). Regression: ``diversity/{stage}/ambiguity``
    (mean squared deviation of members from the ensemble mean, so that mean member MSE =
    ensemble MSE + ambiguity). Computed in float32 with autocast disabled, reduced
    across DDP ranks by torchmetrics. Each validation epoch's values are kept in
    ``history`` (saved in checkpoints) for plots of diversity over training.

    Example::

        trainer = L.Trainer(callbacks=[DiversityMonitor()])

    Args:
        output_kind: how to read member outputs: ``logits`` (multiclass),
            ``binary_logits`` (one logit per member), ``probs``, ``regression``, or
            ``auto`` to use ``pl_module.member_output_kind`` (the module's ``MemberModel``
            capability, ``ripieno.framework.members``; ``setup`` stops the run without it).
        output_key: key of the member outputs in the step's output dict.
        stages: which of ``val`` and ``test`` to monitor.
    """

    def __init__(
        self,
        output_kind: OutputKind = "auto",
        output_key: str = "member_outputs",
        stages: tuple[str, ...] = ("val", "test"),
    ) -> None:
        super().__init__()
        if output_kind not in ("auto", "logits", "binary_logits", "probs", "regression"):
            raise ValueError(f"Unknown output_kind {output_kind!r}.")
        unknown = set(stages) - {"val", "test"}
        if unknown:
            raise ValueError(f"stages may contain 'val' and 'test' only, got {sorted(unknown)}.")
        self.output_kind = output_kind
        self.output_key = output_key
        self.stages = tuple(stages)
        self.history: list[dict[str, float]] = []
        self._metrics: dict[str, MetricCollection] = {}

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(output_key=self.output_key, stages=self.stages)

    def _resolve_kind(self, pl_module: L.LightningModule) -> str:
        if self.output_kind != "auto":
            return self.output_kind
        fix = ("set member_output_kind on the module, or pass"
               " DiversityMonitor(output_kind='logits'|'binary_logits'|'probs'|'regression')")
        kind = require_capability(self, pl_module, MemberModel, fix).member_output_kind
        if kind not in ("logits", "binary_logits", "probs", "regression"):
            raise ValueError(f"DiversityMonitor cannot read {type(pl_module).__name__}'s member_output_kind"
                             f" {kind!r}; {fix}.")
        return kind

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        kind = self._resolve_kind(pl_module)
        for name in self.stages:
            if kind == "regression":
                metrics = {"ambiguity": Ambiguity()}
            else:
                metrics = {
                    "pairwise_kl": PairwiseKLDivergence(input_kind=kind),
                    "disagreement": MemberDisagreement(input_kind=kind),
                }
            self._metrics[name] = MetricCollection(metrics, prefix=f"diversity/{name}/")

    def _update(self, stage: str, pl_module: L.LightningModule, outputs: Any) -> None:  # noqa: ANN401
        if stage not in self._metrics:
            return
        if not isinstance(outputs, dict) or self.output_key not in outputs:
            raise ValueError(
                f"DiversityMonitor needs the {stage} step to return a dict with"
                f" {self.output_key!r} shaped (batch, members, ...); got"
                f" {type(outputs).__name__} {list(outputs) if isinstance(outputs, dict) else ''}."
            )
        member_outputs = outputs[self.output_key].detach()
        metrics = self._metrics[stage].to(member_outputs.device)
        metrics.update(member_outputs)

    def _log(self, stage: str, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        if stage not in self._metrics:
            return {}
        values = {name: float(v) for name, v in self._metrics[stage].compute().items()}
        self._metrics[stage].reset()
        if trainer.sanity_checking:
            return values
        for name, value in values.items():  # already reduced by torchmetrics: the mean over ranks keeps it
            pl_module.log(name, torch.tensor(value), sync_dist=True)
        return values

    @override
    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        self._update("val", pl_module, outputs)

    @override
    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        self._update("test", pl_module, outputs)

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        values = self._log("val", trainer, pl_module)
        if values and not trainer.sanity_checking:
            self._record(trainer, values)

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._log("test", trainer, pl_module)

    @rank_zero_only
    def _record(self, trainer: L.Trainer, values: dict[str, float]) -> None:
        self.history.append({"epoch": trainer.current_epoch, "step": trainer.global_step, **values})

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"history": list(self.history)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = list(state_dict.get("history", []))
