"""TemperatureScaling: post-hoc calibration of any classifier that returns member logits.

Temperature scaling (Guo et al., 2017) divides a trained classifier's logits by one scalar
``T > 0`` fitted on held-out data: accuracy of a single network is unchanged, its
confidence is not. Design:

* **What it reads.** The dict that a validation/test step returns, with the keys of
  ``DiversityMonitor`` and ``MemberModule``: ``member_outputs`` ``(B, M, C)`` logits
  (``(B, C)``: one member; ``(B, M, 1)`` or ``(B, M)`` with ``binary_logits``; with
  ``probs``, their logarithms, which equal the logits up to a per-row constant) and
  ``target`` ``(B,)`` class labels (``output_key``/``target_key`` rename them). So any
  LightningModule joins, not only ripieno's. ``output_kind="auto"`` reads
  ``pl_module.member_output_kind``. Rows labelled below 0 (an OOD loader's ``-1``) are
  skipped. Regression outputs are refused: there is no logit to scale.
* **What it fits.** One ``T`` shared by all members, minimising the validation NLL of the
  member-mean predictive ``p_i(T) = (1/M) sum_m softmax(z_im / T)`` (each member is
  tempered, then probabilities are averaged), ``NLL(T) = -mean_i log p_i(T)[y_i]``: at
  ``T = 1`` this is the ``val/nll`` that ``MemberModule`` logs.
* **How.** A 1-D search over ``log T`` within ``bounds``: a grid of ``grid_size``
  points, then golden-section search in the bracket of the best grid point down to
  ``tol`` (in ``log T``); float64 on CPU, no gradients (it runs inside the evaluation
  loop's inference mode), deterministic. For one member the NLL is convex in ``1/T``;
  the grid guards against a member mixture with more than one dip. A ``T`` on a bound
  warns.
* **When.** At the end of every validation epoch (the sanity check is skipped), on that
  epoch's outputs: after ``fit`` the last validation epoch's ``T`` is kept, and
  ``trainer.validate(...)`` is an explicit fitting pass (e.g. on a calibration split).
  Under DDP the outputs of all ranks are gathered (uneven shards allowed), every rank
  fits on the same rows, and rank 0's ``T`` is broadcast, so all ranks hold the same
  ``T``. Logged as ``calibrated/val/temperature`` and ``calibrated/val/nll`` (after
  scaling); the NLL before and after are in ``nll_before``/``nll_after``.
* **What it changes.** Nothing of the module: its own outputs and metrics stay
  uncalibrated. On test it logs ``calibrated/test/nll``, ``ece`` (15 bins), ``brier``
  and ``temperature`` of the tempered predictive and sends the calibrated reliability
  diagram to the logger (``ripieno.callbacks.figure_logging``). On predict, when
  ``predict_step`` returns a dict, it adds ``calibrated_prediction`` ``(B, C)``, from
  ``member_outputs`` when the dict has them, else from ``member_predictions``
  (probabilities, as ``MemberModule.predict_step`` returns); other outputs are left as
  they are, with one warning.
* **State.** ``temperature`` and the validation NLLs are in ``state_dict``, so a
  checkpoint carries the fitted ``T`` to a later ``test``/``predict``. Under
  ``ddp_spawn`` the workers' callbacks do not travel back to the launching process
  (Lightning returns weights and metrics only): test or predict there with
  ``ckpt_path=...``, or read ``trainer.callback_metrics["calibrated/val/temperature"]``.
* **Shared with ``PostHocCalibration``.** Reading the step dicts, gathering the validation rows
  of every rank and scoring the calibrated predictive on test live in ``MemberOutputCalibration``,
  the base of both callbacks.
* **Posterior samplers.** ``LastLayerSampler`` and the other
  ``PosteriorPredictiveCallback`` samplers take ``temperature=<this callback>`` (or
  ``"callback"`` in a recipe) and divide their sampled logits by this ``T``.

Example::

    scaling = TemperatureScaling()
    trainer = L.Trainer(callbacks=[scaling, LastLayerSampler(temperature=scaling)])
    trainer.fit(model, datamodule=data)  # T fitted on the last validation epoch
    trainer.test(model, datamodule=data)  # calibrated/test/nll, ..., uq/test/* at z / T
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import Tensor
from torchmetrics.utilities.distributed import gather_all_tensors
from typing_extensions import override

from ripieno.callbacks.figure_logging import log_reliability_diagram
from ripieno.callbacks.sampler_settings import check_count, check_positive, setting_error
from ripieno.framework.members import MemberModel, require_capability
from ripieno.framework.metrics.diversity import member_log_probs
from ripieno.framework.metrics.uq import BrierScore, ExpectedCalibrationError, PredictiveNLL
from ripieno.framework.uq.temperature import fit_temperature, member_mean_nll

# the fit lives in framework/uq; MemberOutputCalibration is the base that PostHocCalibration shares
__all__ = ["MemberOutputCalibration", "TemperatureScaling", "fit_temperature", "member_mean_nll"]

OutputKind = Literal["auto", "logits", "binary_logits", "probs"]
_KINDS = ("logits", "binary_logits", "probs")


class MemberOutputCalibration(Callback, ABC):
    """Base of the post-hoc calibration callbacks: reads member outputs, gathers validation rows, scores test.

    It reads ``output_key`` (member outputs) and ``target_key`` (class labels) from the dict that a
    validation/test step returns, resolves ``output_kind="auto"`` from ``pl_module.member_output_kind``
    in ``setup`` (regression is refused), keeps each validation epoch's rows and gathers those of every
    rank (``_gathered``, a collective under DDP), and on test scores the calibrated predictive:
    ``<prefix>/test/nll``, ``ece``, ``brier`` and the reliability diagram. A subclass says what rows it
    keeps of the member outputs (``_rows``), fits on them in ``on_validation_epoch_end``, and gives the
    calibrated member probabilities of test rows (``_calibrated_members``). ``TemperatureScaling`` and
    ``PostHocCalibration`` are the two.

    Example:
        >>> issubclass(TemperatureScaling, MemberOutputCalibration)
        True

    Args:
        output_kind: ``logits``, ``binary_logits``, ``probs``, or ``auto`` (``pl_module.member_output_kind``).
        output_key: key of the member outputs in the step's output dict.
        target_key: key of the class labels in the step's output dict.
        prefix: first part of the logged names (``<prefix>/test/nll``).
        n_bins: confidence bins of the calibrated ECE and reliability diagram.
    """

    def __init__(self, output_kind: OutputKind = "auto", output_key: str = "member_outputs",
                 target_key: str = "target", prefix: str = "calibrated", n_bins: int = 15) -> None:
        super().__init__()
        owner = type(self).__name__
        if output_kind not in ("auto", *_KINDS):
            raise setting_error(owner, "output_kind", output_kind,
                                "Unknown output_kind (regression outputs have no logit to scale)",
                                "use 'auto', 'logits', 'binary_logits' or 'probs'")
        check_count(owner, "n_bins", n_bins, 1, "the calibration error bins the confidences")
        self.output_kind, self.output_key, self.target_key = output_kind, output_key, target_key
        self.prefix, self.n_bins = prefix, n_bins
        self._kind: str = output_kind if output_kind != "auto" else "logits"  # "auto" resolves in setup
        self._val: list[tuple[Tensor, Tensor]] = []
        self._metrics: dict[str, Any] = {}
        self._warned_predict = False

    @abstractmethod
    def _rows(self, member_outputs: Tensor) -> Tensor:
        """The rows ``(B, M, C)`` kept of a batch's member outputs (``_member_shape`` checks them)."""

    @abstractmethod
    def _fitted(self) -> object:
        """The fitted calibration; raises ``RuntimeError`` naming the fix before one was fitted or loaded."""

    @abstractmethod
    def _calibrated_members(self, rows: Tensor) -> Tensor:
        """Calibrated probabilities ``(B, M', C)`` of test rows, as the metrics read them."""

    def _diagram_title(self) -> str | None:
        """Text before the ECE in the reliability diagram's title."""
        return None

    def _test_values(self) -> dict[str, float]:
        """Values logged as ``<prefix>/test/<name>`` beside the metrics."""
        return {}

    # ------------------------------------------------------------------ reading
    def _resolve_kind(self, pl_module: L.LightningModule) -> str:
        kind = self.output_kind
        if kind == "auto":
            fix = ("set member_output_kind on the module, or pass"
                   f" {type(self).__name__}(output_kind='logits'|'binary_logits'|'probs')")
            kind = require_capability(self, pl_module, MemberModel, fix).member_output_kind
            if kind is None:
                raise ValueError(f"{type(self).__name__} cannot read {type(pl_module).__name__}'s"
                                 f" member_output_kind None; {fix}.")
        if kind == "regression":
            raise ValueError(f"{type(self).__name__} calibrates classification logits;"
                             f" {type(pl_module).__name__} returns regression outputs"
                             " (member_output_kind='regression'). Score regression uncertainty with the"
                             " Gaussian NLL and CRPS instead.")
        if kind not in _KINDS:
            raise ValueError(f"{type(self).__name__} cannot read member outputs of kind {kind!r}; use"
                             " 'logits', 'binary_logits' or 'probs'.")
        return kind

    @staticmethod
    def _member_shape(member_outputs: Tensor, kind: str) -> Tensor:
        """Detached member outputs ``(B, M, C)`` (``(B, M, 1)`` or ``(B, M)`` binary logits), checked."""
        x = member_outputs.detach()
        if kind != "binary_logits" and x.ndim == 2:
            x = x[:, None]
        if kind == "binary_logits" and x.ndim == 3 and x.shape[-1] != 1:
            raise ValueError(f"Expected binary logits shaped (batch, members, 1) or (batch, members), got"
                             f" {tuple(x.shape)}.")
        if x.ndim != 3 and not (kind == "binary_logits" and x.ndim == 2):
            raise ValueError(f"Expected member outputs shaped (batch, members, classes), got"
                             f" {tuple(x.shape)}.")
        if kind != "binary_logits" and x.shape[-1] < 2:
            raise ValueError(f"Expected at least 2 classes on the last axis, got {tuple(x.shape)}; a single"
                             " logit per member is output_kind='binary_logits'.")
        return x

    def _read(self, stage: str, outputs: Any, labelled_only: bool = True) -> tuple[Tensor, Tensor]:  # noqa: ANN401
        """Labelled rows of a step's output: ``_rows`` of its member outputs ``(B, M, C)``, targets ``(B,)``.

        With ``labelled_only=False`` every row is kept (unlabelled ones as ``-1``) and the labels
        are not read on the host: validation batches stay on the device, and the epoch's rows are
        filtered and checked once, at its end (``_labelled``).
        """
        if not isinstance(outputs, dict) or self.output_key not in outputs or self.target_key not in outputs:
            got = (f"a dict with keys {sorted(outputs)}" if isinstance(outputs, dict)
                   else type(outputs).__name__)
            raise ValueError(f"{type(self).__name__} needs the {stage} step to return a dict with"
                             f" {self.output_key!r} (member logits shaped (batch, members, classes)) and"
                             f" {self.target_key!r} (class labels (batch,)); got {got}. Return"
                             f" {{{self.output_key!r}: logits, {self.target_key!r}: y}} from {stage}_step,"
                             " or pass output_key/target_key.")
        rows = self._rows(outputs[self.output_key])
        target = outputs[self.target_key].detach()
        if target.ndim != 1 or target.shape[0] != rows.shape[0] or target.is_floating_point():
            raise ValueError(f"Expected integer class labels shaped ({rows.shape[0]},) under"
                             f" {self.target_key!r}, got {target.dtype} shaped {tuple(target.shape)}.")
        if not labelled_only:
            return rows, target.long()
        return self._labelled(rows, target)

    @staticmethod
    def _labelled(rows: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
        """The rows with a label (``>= 0``), after checking that every label is a class."""
        keep = target >= 0
        rows, target = rows[keep], target[keep].long()
        if target.numel() and int(target.max()) >= rows.shape[-1]:
            raise ValueError(f"Class labels must lie in [0, {rows.shape[-1] - 1}], got"
                             f" {int(target.max())}.")
        return rows, target

    # -------------------------------------------------------------------- hooks
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._kind = self._resolve_kind(pl_module)
        has_validation = is_overridden("validation_step", pl_module, L.LightningModule)
        if stage in ("fit", "validate") and not has_validation:
            raise ValueError(f"{type(self).__name__} fits on validation outputs, but"
                             f" {type(pl_module).__name__} has no validation_step: return"
                             f" {{{self.output_key!r}: logits, {self.target_key!r}: y}} from one.")

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.limit_val_batches == 0:
            raise ValueError(f"{type(self).__name__} fits on validation data, but limit_val_batches=0 turns"
                             " validation off.")

    @override
    def on_validation_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._val = []

    @override
    def on_validation_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        if not trainer.sanity_checking:  # kept on the device; filtered once at the epoch's end
            self._val.append(self._read("validation", outputs, labelled_only=False))

    def _gathered(self, trainer: L.Trainer) -> tuple[Tensor, Tensor]:
        """This epoch's validation rows of every rank (collective under DDP)."""
        parts, self._val = self._val, []
        if parts:
            rows, target = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        else:  # no batch on this rank: still take part in the gather
            rows = torch.zeros(0, 1, 2, device=trainer.strategy.root_device)
            target = torch.zeros(0, dtype=torch.long, device=rows.device)
        if trainer.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            pairs = zip(gather_all_tensors(rows.contiguous()), gather_all_tensors(target.contiguous()),
                        strict=True)
            kept = [(r, t) for r, t in pairs if t.numel()]
            if not kept:
                return rows[:0], target[:0]
            rows, target = torch.cat([k[0] for k in kept]), torch.cat([k[1] for k in kept])
        return rows, target

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fitted()
        self._metrics = {}  # built on the first batch, when the class count is known

    @override
    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        rows, target = self._read("test", outputs)
        if not self._metrics:
            n = rows.shape[-1]
            metrics = {"nll": PredictiveNLL(input_kind="probs"), "brier": BrierScore(input_kind="probs"),
                       "ece": ExpectedCalibrationError(n, n_bins=self.n_bins, input_kind="probs")}
            self._metrics = {k: m.to(rows.device) for k, m in metrics.items()}
        if target.numel() == 0:
            return
        probs = self._calibrated_members(rows)  # (B, M', C)
        for metric in self._metrics.values():
            metric.update(probs, target)

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self._metrics:
            return
        extra = self._test_values()
        name = f"reliability_{self.prefix.replace('/', '_')}"
        log_reliability_diagram(trainer, self._metrics["ece"], f"{self.prefix}/test/reliability", name,
                                title=self._diagram_title())
        values = {name: metric.compute() for name, metric in self._metrics.items()}
        for name, value in {**values, **extra}.items():  # reduced by compute(): rank-equal
            pl_module.log(f"{self.prefix}/test/{name}", value, sync_dist=True, add_dataloader_idx=False)
        for metric in self._metrics.values():
            metric.reset()


class TemperatureScaling(MemberOutputCalibration):
    """Fit one temperature on validation outputs; log calibrated test metrics (module docstring).

    Example:
        >>> scaling = TemperatureScaling()
        >>> scaling.load_state_dict({"temperature": 2.0})
        >>> scaling.calibrated_probabilities(torch.tensor([[[2.0, 0.0]]]))  # softmax([1, 0])
        tensor([[0.7311, 0.2689]])

    Args:
        output_kind: how to read member outputs: ``logits``, ``binary_logits``, ``probs``,
            or ``auto`` for ``pl_module.member_output_kind`` (the module's ``MemberModel``
            capability, ``ripieno.framework.members``; ``setup`` stops the run without it).
        output_key: key of the member outputs in the step's output dict.
        target_key: key of the class labels in the step's output dict.
        prefix: first part of the logged names (``calibrated/test/nll``).
        bounds: the search interval ``(low, high)`` of ``T``.
        grid_size: grid points over ``log T`` before the golden-section refinement.
        tol: width in ``log T`` at which the search stops.
        n_bins: confidence bins of the calibrated ECE and reliability diagram.

    Attributes:
        temperature: the fitted ``T`` (``None`` before the first validation epoch).
        nll_before: validation NLL at ``T = 1`` of the last fit.
        nll_after: validation NLL at the fitted ``T``.
    """

    def __init__(
        self,
        output_kind: OutputKind = "auto",
        output_key: str = "member_outputs",
        target_key: str = "target",
        prefix: str = "calibrated",
        bounds: tuple[float, float] = (0.01, 100.0),
        grid_size: int = 41,
        tol: float = 1e-6,
        n_bins: int = 15,
    ) -> None:
        super().__init__(output_kind, output_key, target_key, prefix, n_bins)
        owner = type(self).__name__
        if len(bounds) != 2 or not 0 < bounds[0] < bounds[1] < math.inf:
            raise setting_error(owner, "bounds", bounds,
                                "bounds must be (low, high) with 0 < low < high < inf, the interval searched"
                                " for T", "e.g. bounds=[0.01, 100.0]")
        check_count(owner, "grid_size", grid_size, 3, "the grid must bracket its best point")
        check_positive(owner, "tol", tol, "the search stops at this width in log T")
        self.bounds, self.grid_size, self.tol = tuple(bounds), grid_size, tol
        self.temperature: float | None = None
        self.nll_before: float | None = None
        self.nll_after: float | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(output_key=self.output_key, prefix=self.prefix)

    # ------------------------------------------------------------------ reading
    def log_probabilities(self, member_outputs: Tensor, kind: str | None = None) -> Tensor:
        """Member log-probabilities ``(B, M, C)`` (float32) of member outputs of ``kind``.

        Args:
            member_outputs: ``(B, M, C)`` or ``(B, C)`` (one member) logits or probabilities;
                ``(B, M, 1)`` or ``(B, M)`` binary logits.
            kind: ``logits``, ``binary_logits`` or ``probs`` (default: the module's, from ``setup``).
        """
        kind = kind or self._kind
        x = self._member_shape(member_outputs, kind)
        with torch.autocast(x.device.type, enabled=False):
            return member_log_probs(x, kind)  # type: ignore[arg-type]

    @override
    def _rows(self, member_outputs: Tensor) -> Tensor:
        return self.log_probabilities(member_outputs)

    def calibrated_probabilities(self, member_outputs: Tensor, kind: str | None = None) -> Tensor:
        """The calibrated predictive ``(1/M) sum_m softmax(z_m / T)``, ``(B, C)``.

        Args:
            member_outputs: member outputs as ``log_probabilities`` takes them.
            kind: how to read them (default: the module's).

        Raises:
            RuntimeError: before a temperature was fitted or loaded.
        """
        return torch.softmax(self.log_probabilities(member_outputs, kind) / self._fitted(), -1).mean(1)

    @override
    def _fitted(self) -> float:
        if self.temperature is None:
            raise RuntimeError("TemperatureScaling has no fitted temperature: run trainer.fit with validation"
                               " data or trainer.validate(model, dataloaders) first, or test/predict from a"
                               " checkpoint that holds one (ckpt_path=...).")
        return self.temperature

    @override
    def _calibrated_members(self, rows: Tensor) -> Tensor:
        return torch.softmax(rows / self._fitted(), -1)  # (B, M, C)

    @override
    def _diagram_title(self) -> str:
        return f"T = {self._fitted():.3g}"

    @override
    def _test_values(self) -> dict[str, float]:
        return {"temperature": self._fitted()}

    # -------------------------------------------------------------------- hooks
    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        log_probs, target = self._labelled(*self._gathered(trainer))
        if target.numel() == 0:
            rank_zero_warn("TemperatureScaling: no labelled validation rows in this epoch; the temperature"
                           f" stays {self.temperature}.")
            return
        log_probs, target = log_probs.cpu(), target.cpu()
        temperature = fit_temperature(log_probs, target, self.bounds, self.grid_size, self.tol)
        temperature = float(trainer.strategy.broadcast(temperature, src=0))
        if min(abs(math.log(temperature / b)) for b in self.bounds) < 1e-3:
            rank_zero_warn(f"TemperatureScaling: the fitted temperature {temperature:.4g} is on a bound of"
                           f" {self.bounds}; widen bounds (or check the logits are not constant).")
        self.temperature = temperature
        self.nll_before = member_mean_nll(log_probs, target, 1.0)
        self.nll_after = member_mean_nll(log_probs, target, temperature)
        for name, value in (("temperature", temperature), ("nll", self.nll_after)):  # the same on every rank
            pl_module.log(f"{self.prefix}/val/{name}", value, sync_dist=True, add_dataloader_idx=False)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.temperature is None:
            raise RuntimeError("TemperatureScaling saw no validation rows during fit, so it has no"
                               " temperature: give the Trainer validation data (a datamodule with"
                               " val_dataloader, or val_dataloaders=...) or fit one afterwards with"
                               " trainer.validate(...).")

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fitted()

    @override
    def on_predict_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                             batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        if isinstance(outputs, dict) and self.output_key in outputs:
            outputs["calibrated_prediction"] = self.calibrated_probabilities(outputs[self.output_key])
        elif isinstance(outputs, dict) and "member_predictions" in outputs:
            outputs["calibrated_prediction"] = self.calibrated_probabilities(outputs["member_predictions"],
                                                                             "probs")
        elif not self._warned_predict:
            got = (f"a dict with keys {sorted(outputs)}" if isinstance(outputs, dict)
                   else type(outputs).__name__)
            rank_zero_warn(f"TemperatureScaling adds calibrated_prediction to predict outputs that are dicts"
                           f" holding {self.output_key!r} (member logits) or 'member_predictions' (member"
                           f" probabilities); predict_step returned {got}, left as it is.")
            self._warned_predict = True

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "nll_before": self.nll_before, "nll_after": self.nll_after}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.temperature = state_dict.get("temperature")
        self.nll_before, self.nll_after = state_dict.get("nll_before"), state_dict.get("nll_after")
