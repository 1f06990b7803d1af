"""MemberModule: the one LightningModule base under every ripieno method.

A method module keeps only what is its own: its network, ``forward_members`` (the member
outputs of a batch, see ``ripieno.framework.members``) and, where the default does not fit,
``step``, ``member_loss``, ``build_metrics``/``update_metrics`` or ``optimizer_parameters``.
The base owns the rest, once:

* ``training_step``: the method's loss plus every registered loss term (the extension
  point of ``LossTermsMixin``: GeoReg and users' callbacks add terms there), logged as
  ``train/loss_step`` (this rank's) and ``train/loss_epoch`` (the epoch's mean over every
  rank's rows; ``train/loss`` for monitors);
* ``validation_step``/``test_step``: one template that updates the stage's metrics and
  logs ``{val,test}/loss`` and ``{val,test}/<metric>``; rows labelled ``-1`` (an OOD test
  loader) only pass through;
* per-stage metric collections cloned from one definition (``build_metrics``), reset at
  every epoch start (a ``ddp_spawn`` fit hands back synced states); classification NLL is
  ``PredictiveNLL`` of the member probabilities, i.e. the NLL of their mean, and ``brier``
  the Brier score of that mean; regression ``crps`` scores the members' empirical
  distribution (``EnsembleCRPS``; one member: its absolute error);
* ``predict_step``: ``prediction`` and ``member_predictions`` (``PredictOutput``);
* ``configure_optimizers``: AdamW (``lr``, ``weight_decay`` hyperparameters) over
  ``optimizer_parameters()``, and the ``build_lr_scheduler`` hook;
* RNG states in checkpoints (``RNGStateMixin``), so resumes are exact.

Subclasses call ``init_members(kind, n_classes)`` in ``__init__`` once they know their
task; it sets ``member_output_kind`` and builds the metrics.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterable
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch.utilities.types import LRSchedulerConfigType
from torch import Tensor, nn
from torchmetrics import Metric, MetricCollection
from typing_extensions import override

from ripieno.framework.members import (
    MemberOutputKind,
    PredictOutput,
    StepOutput,
    check_member_output_kind,
    member_predictions,
    member_probabilities,
    member_values,
)
from ripieno.framework.methods.loss_terms import LossTermsMixin
from ripieno.framework.methods.rng_state import RNGStateMixin
from ripieno.framework.metrics.uq import BrierScore, EnsembleCRPS, PredictiveNLL

EVAL_STAGES = ("val", "test")
PROGRESS_BAR_METRICS = ("accuracy", "rmse")
DETACHED_KEYS = ("member_outputs", "features")


class MemberModule(LossTermsMixin, RNGStateMixin, L.LightningModule):
    """Base LightningModule of the member protocol (module docstring).

    Attributes:
        member_output_kind: how to read ``member_outputs`` (``logits``, ``binary_logits``
            or ``regression``).
        n_classes: classes of a classification module (``None`` for regression).
        log_loss_columns: whether ``training_step`` logs the ``train/loss_step`` and
            ``train/loss_epoch`` columns, which only loggers and the progress bar read
            (``train/loss``, the epoch mean that monitors read, is always logged). The
            scikit-learn estimators, which run with neither, turn it off: three ``self.log``
            calls a step were 4% of a small benchmark fit (``bench/fit_cost.py``).
        validation_metrics: whether validation updates and logs the task's metrics beside
            ``val/loss``; the estimators, whose early stopping reads only ``val/loss`` and which
            score their own predictions, turn it off (updating, computing and logging five
            metrics an epoch was another few percent of that fit).
    """

    member_output_kind: MemberOutputKind = "logits"
    n_classes: int | None = None
    log_loss_columns: bool = True
    validation_metrics: bool = True

    def init_members(self, kind: MemberOutputKind, n_classes: int | None = None) -> None:
        """Declare how member outputs read and build the per-stage metrics.

        Args:
            kind: ``logits``, ``binary_logits`` or ``regression``.
            n_classes: classes (classification; 2 for ``binary_logits``).
        """
        self.member_output_kind = check_member_output_kind(kind)
        if kind != "regression" and (n_classes is None or n_classes < 2):
            raise ValueError(f"A {kind} module needs n_classes >= 2, got {n_classes}.")
        self.n_classes = n_classes if kind != "regression" else None
        definition = MetricCollection(self.build_metrics(), compute_groups=False)
        self.metrics = nn.ModuleDict(
            {f"{stage}_": definition.clone(prefix=f"{stage}/") for stage in EVAL_STAGES})

    # ------------------------------------------------------------- what a method supplies
    def forward_members(self, batch: dict[str, Tensor]) -> Tensor:
        """Member outputs ``(B, M, ...)`` of a batch, as ``member_output_kind`` says."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward_members(batch).")

    def member_loss(self, member_outputs: Tensor, target: Tensor, row_weight: Tensor | None = None) -> Tensor:
        """Mean over members and rows of the per-member loss.

        Cross-entropy (``logits``), binary cross-entropy (``binary_logits``) or squared
        error divided by ``target_scale() ** 2`` (``regression``: the loss of standardised
        targets, written in the target's units).

        Args:
            member_outputs: ``(B, K, out)``.
            target: ``(B,)``; every entry a valid label when ``row_weight`` is given.
            row_weight: ``(B,)`` 0/1 weights of the rows (classification): the mean is then
                over the rows of weight 1 (zero, with the graph kept, when there are none),
                computed on the device without reading the mask on the host.
        """
        kind = self.member_output_kind
        m = member_outputs.shape[1]
        with torch.autocast(member_outputs.device.type, enabled=False):
            if kind == "regression":
                values = member_values(member_outputs)
                return F.mse_loss(values, target.float()[:, None].expand(-1, m)) / self.target_scale() ** 2
            reduction = "mean" if row_weight is None else "none"
            if kind == "binary_logits":
                expanded = target.float()[:, None].expand(-1, m)
                loss = F.binary_cross_entropy_with_logits(member_outputs[..., 0].float(), expanded,
                                                          reduction=reduction)
            else:
                loss = F.cross_entropy(member_outputs.float().flatten(0, 1), target.repeat_interleave(m),
                                       reduction=reduction)
            if row_weight is None:
                return loss
            return (loss.view(-1, m) * row_weight[:, None]).sum() / (row_weight.sum().clamp_min(1) * m)

    def target_scale(self) -> float:
        """Scale of the regression target that the loss divides out (1: none)."""
        return 1.0

    def to_original_units(self, prediction: Tensor) -> Tensor:
        """Map a regression prediction from the modelled target's units to the original ones."""
        return prediction

    def step(self, batch: dict[str, Tensor], stage: str) -> StepOutput:
        """Loss and member outputs of a batch; rows labelled ``-1`` are not in the loss.

        A method that overrides ``step`` (to add outputs, or route its training copies) takes
        its loss from ``labelled_loss``, so every method scales and masks alike.

        Args:
            batch: a dict with the model inputs and ``y``.
            stage: ``train``, ``val`` or ``test``.
        """
        outputs, target = self.forward_members(batch), batch["y"]
        out: StepOutput = {"member_outputs": outputs, "target": target}
        loss = self.labelled_loss(outputs, target, stage)
        if loss is not None:
            out["loss"] = loss
        return out

    def labelled_loss(self, member_outputs: Tensor, target: Tensor, stage: str) -> Tensor | None:
        """``member_loss`` of the rows with a label (``scored_rows``): the one masking rule.

        Rows labelled ``-1`` (unlabelled, or an OOD test loader) are left out. A batch without
        a labelled row gives a zero that keeps the graph in training, and no loss (``None``)
        in evaluation.

        Example:
            >>> import torch
            >>> module = MemberModule()
            >>> module.init_members("logits", 3)
            >>> logits, y = torch.zeros(4, 2, 3), torch.tensor([0, 1, -1, -1])
            >>> round(float(module.labelled_loss(logits, y, "val")), 4)  # log 3: only the two labelled
            1.0986
            >>> module.labelled_loss(logits, torch.full((4,), -1), "val") is None
            True
        """
        if stage == "train" and self.member_output_kind != "regression" and _takes_row_weight(self):
            # no host read of the mask in the training step (it would stall an accelerator every step)
            return self.member_loss(member_outputs, target.clamp_min(0), row_weight=(target >= 0).float())
        scored = self.scored_rows(target)
        if scored is None:
            return self.member_loss(member_outputs, target)
        if bool(scored.any()):
            return self.member_loss(member_outputs[scored], target[scored])
        return member_outputs.sum() * 0.0 if stage == "train" else None

    def scored_rows(self, target: Tensor) -> Tensor | None:
        """Mask of rows with a label (classification ``>= 0``), ``None`` when all are."""
        if self.member_output_kind == "regression":
            return None
        scored = target >= 0
        return None if bool(scored.all()) else scored

    # ---------------------------------------------------------------------- metrics
    def build_metrics(self) -> dict[str, Metric]:
        """The metrics of one stage, by kind; cloned for validation and test.

        Classification: micro ``accuracy`` of the mean member probabilities, ``nll``
        (``PredictiveNLL``), ``brier`` (``BrierScore``, summed over classes: ``[0, 2]``),
        top-label ``ece`` (15 bins) and, for two classes, ``auroc``. Regression: ``rmse``,
        ``mae`` and ``r2`` of the mean member output, and ``crps`` of the member outputs
        (``EnsembleCRPS``); all four in the units of ``member_outputs`` and the target (the
        modelled target's).
        """
        if self.member_output_kind == "regression":
            return {"rmse": torchmetrics.MeanSquaredError(squared=False),
                    "mae": torchmetrics.MeanAbsoluteError(), "r2": torchmetrics.R2Score(),
                    "crps": EnsembleCRPS()}
        n = int(self.n_classes or 2)
        metrics: dict[str, Metric] = {
            "accuracy": torchmetrics.Accuracy(task="multiclass", num_classes=n, average="micro"),
            "nll": PredictiveNLL(input_kind="probs"),
            "brier": BrierScore(input_kind="probs"),
            "ece": torchmetrics.CalibrationError(task="multiclass", num_classes=n, n_bins=15),
        }
        if n == 2:
            metrics["auroc"] = torchmetrics.AUROC(task="binary")
        return metrics

    def logged_metric_names(self, stage: str) -> set[str]:
        """The names this module logs on ``stage`` (``val`` or ``test``).

        The ``ripieno`` command checks every ``val/...`` metric that a ``ModelCheckpoint`` or
        ``EarlyStopping`` monitors against them before training, so a monitor the task does
        not have (``val/nll`` on a regression) stops the run at once. A subclass that logs
        more names adds them.
        """
        return {f"{stage}/loss", *self.metrics[f"{stage}_"].keys()}

    def update_metrics(self, metrics: MetricCollection, out: StepOutput) -> int:
        """Update a stage's metrics with a step's output; returns the number of rows scored."""
        outputs, target = out["member_outputs"].detach(), out["target"]
        if self.member_output_kind == "regression":
            values = member_values(outputs)
            prediction = values.mean(1)
            for name in ("rmse", "mae", "r2"):
                if name in metrics:
                    metrics[name].update(prediction, target.float())
            if "crps" in metrics:
                metrics["crps"].update(values, target.float())
            return len(target)
        scored = self.scored_rows(target)
        if scored is not None:
            outputs, target = outputs[scored], target[scored]
        if len(target) == 0:
            return 0
        probs = member_probabilities(outputs, self.member_output_kind)
        prediction, target = probs.mean(1), target.long()
        metrics["accuracy"].update(prediction, target)
        metrics["nll"].update(probs, target)
        if "brier" in metrics:
            metrics["brier"].update(probs, target)
        if "ece" in metrics:
            metrics["ece"].update(prediction, target)
        if "auroc" in metrics:
            metrics["auroc"].update(prediction[:, 1], target)
        return len(target)

    # ------------------------------------------------------------------------ steps
    @override
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> StepOutput:
        """The method's loss plus every registered loss term."""
        out = self.step(batch, "train")
        out["loss"] = out["loss"] + self.registered_loss_terms(batch, out)
        n, loss = len(out["target"]), out["loss"]
        # Lightning 2.6 all-reduces an on_step value at every step when sync_dist=True, so the step value
        # stays per rank and only the epoch mean is reduced across ranks, once per epoch. The logged columns
        # keep Lightning's names for an on_step + on_epoch value; train/loss is the epoch mean for monitors.
        if self.log_loss_columns:
            self.log("train/loss_step", loss, prog_bar=True, on_step=True, on_epoch=False, batch_size=n)
            self.log("train/loss_epoch", loss, on_step=False, on_epoch=True, batch_size=n, sync_dist=True)
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=n, sync_dist=True, logger=False)
        return _detached(out)

    @override
    def validation_step(self, batch: dict[str, Tensor], batch_idx: int,
                        dataloader_idx: int = 0) -> StepOutput:
        """Loss and metrics on the validation split."""
        return self.evaluation_step(batch, "val")

    @override
    def test_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> StepOutput:
        """Loss and metrics on the test split; rows labelled ``-1`` (OOD) only pass through."""
        return self.evaluation_step(batch, "test")

    def evaluation_step(self, batch: dict[str, Tensor], stage: str) -> StepOutput:
        """The validation/test template: step, update the stage's metrics, log."""
        out = self.step(batch, stage)
        metrics = self.metrics[f"{stage}_"]
        if stage == "val" and not self.validation_metrics:
            metrics = {}
            target = out["target"]
            scored = None if self.member_output_kind == "regression" else self.scored_rows(target)
            n = len(target) if scored is None else int(len(target[scored]))
        else:
            n = self.update_metrics(metrics, out)
        if n > 0:
            if "loss" in out:
                self.log(f"{stage}/loss", out["loss"], prog_bar=stage == "val", batch_size=n,
                         sync_dist=True, add_dataloader_idx=False)
            for name, metric in metrics.items():
                self.log(name, metric, prog_bar=name.split("/")[-1] in PROGRESS_BAR_METRICS,
                         add_dataloader_idx=False)
        return _detached(out)

    @override
    def on_validation_epoch_start(self) -> None:
        """Start from empty metric states (a ``ddp_spawn`` fit hands back synced ones)."""
        self.metrics["val_"].reset()

    @override
    def on_test_epoch_start(self) -> None:
        """Start from empty metric states."""
        self.metrics["test_"].reset()

    @override
    def predict_step(self, batch: dict[str, Tensor], batch_idx: int,
                     dataloader_idx: int = 0) -> PredictOutput:
        """``prediction`` (mean member probability, or mean output in original units) and members."""
        members = member_predictions(self.forward_members(batch), self.member_output_kind)
        prediction = members.mean(1)
        if self.member_output_kind == "regression":
            prediction = self.to_original_units(prediction)
        return {"prediction": prediction, "member_predictions": members}

    # -------------------------------------------------------------------- optimiser
    def optimizer_parameters(self) -> Iterable[Tensor] | list[dict[str, Any]]:
        """Parameters (or parameter groups) the optimiser trains: all of them by default."""
        return self.parameters()

    def build_optimizer(self, parameters: Iterable[Tensor] | list[dict[str, Any]]) -> torch.optim.Optimizer:
        """AdamW with the ``lr`` and ``weight_decay`` hyperparameters."""
        hp = self.hparams
        return torch.optim.AdamW(parameters, lr=hp.lr, weight_decay=hp.get("weight_decay", 0.0))

    def build_lr_scheduler(self, optimizer: torch.optim.Optimizer) -> LRSchedulerConfigType | None:
        """A learning-rate schedule for ``optimizer``; ``None`` (constant) by default.

        Override in a method, or give LightningCLI's ``--lr_scheduler`` in a recipe.
        """
        return None

    @override
    def configure_optimizers(self) -> Any:  # noqa: ANN401
        """``build_optimizer(optimizer_parameters())`` and its schedule, if any."""
        optimizer = self.build_optimizer(self.optimizer_parameters())
        scheduler = self.build_lr_scheduler(optimizer)
        return optimizer if scheduler is None else {"optimizer": optimizer, "lr_scheduler": scheduler}


def _detached(out: StepOutput) -> StepOutput:
    """The step output with member outputs and features detached (the loss keeps its graph)."""
    for key in DETACHED_KEYS:
        if key in out:
            out[key] = out[key].detach()  # type: ignore[literal-required]
    return out


@functools.cache
def _accepts_row_weight(member_loss: Any) -> bool:  # noqa: ANN401
    return "row_weight" in inspect.signature(member_loss).parameters


def _takes_row_weight(module: MemberModule) -> bool:
    """Whether ``module.member_loss`` takes ``row_weight`` (a subclass's own override may not)."""
    return _accepts_row_weight(type(module).member_loss)
