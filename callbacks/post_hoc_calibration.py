"""PostHocCalibration: vector scaling or isotonic regression of any classifier's member outputs.

What ``TemperatureScaling`` does with one temperature, this callback does with the richer maps of
``ripieno.framework.uq.calibrators``:

* ``method="vector"`` (Guo et al., 2017): a scale and a bias per class on the member logits,
  ``p = (1/M) sum_m softmax(w * z_m + b)``, fitted by L-BFGS on the validation NLL (``l2`` pulls
  ``w`` towards 1 and ``b`` towards 0). A superset of temperature scaling; it can change the
  predicted class.
* ``method="isotonic"``: a monotone step-linear map per class (one-vs-rest) of the member-mean
  probabilities, rows renormalised, as scikit-learn's ``CalibratedClassifierCV(method="isotonic")``.
  Non-parametric: it wants more validation rows than scaling does, and it can give a class the
  probability 0 (the NLL counts it at float32's smallest positive number, about 87 nats).

Design (the reading, gathering and test scoring are ``TemperatureScaling``'s, shared through
``MemberOutputCalibration``):

* **What it reads.** ``member_outputs`` ``(B, M, C)`` and ``target`` ``(B,)`` of the dict that a
  validation/test step returns (``output_key``/``target_key`` rename them); ``output_kind="auto"``
  reads ``pl_module.member_output_kind``; rows labelled below 0 are skipped; a regression module is
  refused in ``setup``. The calibrator gets logits as they are (not log-softmaxed: a per-class scale
  does not cancel the per-row constant), a binary logit ``s`` as the two logits ``[0, s]``, and
  probabilities as they are (``input_kind="probs"``), all in float32.
* **When and where it fits.** At the end of every validation epoch (not the sanity check), on that
  epoch's labelled rows of all ranks (gathered, uneven shards allowed): after ``fit`` the last
  validation epoch's calibrator is kept, and ``trainer.validate(...)`` is an explicit fitting pass.
  Every rank fits on the same gathered rows, then rank 0's state is broadcast and loaded on every
  rank. Fitting everywhere, not on rank 0 alone, means that rows the calibrator refuses are refused
  on every rank alike, so no rank waits in a broadcast that rank 0 never reaches; broadcasting,
  rather than trusting equal fits, makes the states equal to the bit even where ranks' CPUs sum in
  another order. Rows it cannot fit on (one class only, NaN outputs) warn, and the previous
  calibrator stays. Logged: ``<prefix>/val/nll``, the calibrated validation NLL (``nll_before``
  and ``nll_after`` hold the NLL before and after).
* **What it changes.** Nothing of the module. On test it logs ``<prefix>/test/nll``, ``ece``
  (``n_bins`` bins) and ``brier`` of the calibrated predictive and sends its reliability diagram to
  the logger. On predict it adds ``calibrated_prediction`` ``(B, C)`` to dict outputs that hold
  ``member_outputs``, or ``member_predictions`` (member probabilities, as
  ``MemberModule.predict_step`` returns) where the calibrator can read probabilities: isotonic
  always, vector scaling only when it was fitted on probabilities. Other outputs are left as they
  are, with one warning.
* **State.** The calibrator's plain ``state_dict`` (floats, lists, strings) and the validation
  NLLs are in ``state_dict``, so a checkpoint carries the fit to a later ``test``/``predict``
  (``ckpt_path=...``). ``state_key`` holds ``method``, ``output_key`` and ``prefix``; two
  calibration callbacks with one ``prefix`` would log the same names, and ``setup`` refuses them.

Example::

    calibration = PostHocCalibration("isotonic")
    trainer = L.Trainer(callbacks=[calibration])
    trainer.fit(model, datamodule=data)  # fitted on the last validation epoch's rows
    trainer.test(model, datamodule=data)  # calibrated/test/nll, ece, brier
"""

from __future__ import annotations

from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from ripieno.callbacks.sampler_settings import check_positive, setting_error
from ripieno.callbacks.temperature_scaling import MemberOutputCalibration, OutputKind
from ripieno.framework.uq.calibrators import CalibrationError, Calibrator, make_calibrator

__all__ = ["PostHocCalibration"]

Method = Literal["vector", "isotonic"]
_TITLES = {"vector": "vector scaling", "isotonic": "isotonic regression"}
_TINY = torch.finfo(torch.float32).tiny  # where PredictiveNLL floors probabilities


def _nll(probs: Tensor, target: Tensor) -> float:
    """``-mean_i log p_i[y_i]`` of a predictive ``(n, C)``, floored as ``PredictiveNLL`` floors it."""
    return float(-probs.double().gather(1, target[:, None]).clamp_min(_TINY).log().mean())


class PostHocCalibration(MemberOutputCalibration):
    """Fit vector scaling or isotonic regression on validation outputs; log calibrated test metrics.

    See the module docstring for what it reads, when it fits and what it logs.

    Example:
        >>> p1 = torch.tensor([0.1, 0.3, 0.35, 0.6, 0.8, 0.9])
        >>> probs = torch.stack([1 - p1, p1], 1)  # (6, C=2): one member's probabilities
        >>> calibration = PostHocCalibration("isotonic", output_kind="probs")
        >>> calibration.fit(probs, torch.tensor([0, 1, 0, 1, 1, 1])).calibrated_probabilities(probs[:3])
        tensor([[1.0000, 0.0000],
                [0.5000, 0.5000],
                [0.5000, 0.5000]])

    Args:
        method: ``vector`` (a scale and a bias per class) or ``isotonic`` (a monotone map per class).
        output_kind: how to read member outputs: ``logits``, ``binary_logits``, ``probs``, or ``auto``
            for ``pl_module.member_output_kind`` (``setup`` stops the run without it).
        output_key: key of the member outputs in the step's output dict.
        target_key: key of the class labels in the step's output dict.
        prefix: first part of the logged names (``calibrated/test/nll``).
        n_bins: confidence bins of the calibrated ECE and reliability diagram.
        l2: vector scaling's penalty weight on ``w - 1`` and ``b`` (0: the plain maximum likelihood fit).

    Attributes:
        calibrator: the fitted ``VectorScaling`` or ``IsotonicCalibration`` (``None`` before a fit).
        nll_before: validation NLL of the uncalibrated member-mean predictive at the last fit.
        nll_after: validation NLL of the calibrated predictive.
    """

    def __init__(
        self,
        method: Method = "vector",
        output_kind: OutputKind = "auto",
        output_key: str = "member_outputs",
        target_key: str = "target",
        prefix: str = "calibrated",
        n_bins: int = 15,
        l2: float = 0.0,
    ) -> None:
        super().__init__(output_kind, output_key, target_key, prefix, n_bins)
        owner = type(self).__name__
        if method not in _TITLES:
            raise setting_error(owner, "method", method, "method must be 'vector' or 'isotonic'",
                                "use one of them, or TemperatureScaling for one temperature")
        check_positive(owner, "l2", l2, "it weighs vector scaling's penalty on w - 1 and b", allow_zero=True)
        if method == "isotonic" and l2:
            raise setting_error(owner, "l2", l2, "l2 penalises vector scaling's w - 1 and b, which isotonic"
                                " regression does not have", "leave l2 at 0, or use method='vector'")
        self.method, self.l2 = method, float(l2)
        self.calibrator: Calibrator | None = None
        self.nll_before: float | None = None
        self.nll_after: float | None = None

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(method=self.method, output_key=self.output_key, prefix=self.prefix)

    # ------------------------------------------------------------------ reading
    @staticmethod
    def _input_kind(kind: str) -> str:
        """The calibrator's ``input_kind`` for member outputs of ``kind``."""
        return "probs" if kind == "probs" else "logits"

    def _inputs(self, member_outputs: Tensor, kind: str) -> Tensor:
        """What the calibrator reads, float32 ``(B, M, C)``: logits, ``[0, s]`` of binary logits, or probs."""
        x = self._member_shape(member_outputs, kind).float()
        if kind == "binary_logits":
            s = x.reshape(x.shape[0], x.shape[1])
            x = torch.stack([torch.zeros_like(s), s], -1)
        return x

    @override
    def _rows(self, member_outputs: Tensor) -> Tensor:
        return self._inputs(member_outputs, self._kind)

    @override
    def _fitted(self) -> Calibrator:
        if self.calibrator is None:
            raise RuntimeError(f"PostHocCalibration has no fitted {self.method} calibrator: run trainer.fit"
                               " with validation data or trainer.validate(model, dataloaders) first, or"
                               " test/predict from a checkpoint that holds one (ckpt_path=...).")
        return self.calibrator

    def _reads_probabilities(self) -> bool:
        """Whether probabilities give the calibrated prediction (isotonic reads softmax(log p) = p)."""
        return self.method == "isotonic" or self._fitted().input_kind == "probs"

    def _predict(self, x: Tensor, input_kind: str) -> Tensor:
        """The calibrated predictive ``(B, C)`` (float32, on ``x``'s device) of calibrator inputs ``x``."""
        calibrator = self._fitted()
        if input_kind != calibrator.input_kind:
            if calibrator.input_kind == "probs":
                x = x.softmax(-1)
            elif self.method == "isotonic":
                x = x.clamp_min(_TINY).log()
            else:
                raise ValueError("PostHocCalibration(method='vector') was fitted on member logits and cannot"
                                 " read probabilities: their logarithms differ from the logits by a per-row"
                                 " constant that a per-class scale does not cancel; give the member logits.")
        return calibrator.predict_proba(x).to(device=x.device, dtype=torch.float32)

    def calibrated_probabilities(self, member_outputs: Tensor, kind: str | None = None) -> Tensor:
        """The calibrated predictive ``(B, C)`` (float32, on the outputs' device).

        Args:
            member_outputs: ``(B, M, C)`` or ``(B, C)`` (one member) logits or probabilities;
                ``(B, M, 1)`` or ``(B, M)`` binary logits.
            kind: ``logits``, ``binary_logits`` or ``probs`` (default: the module's, from ``setup``).

        Raises:
            RuntimeError: before a calibrator was fitted or loaded.
            ValueError: probabilities for vector scaling fitted on logits.
        """
        kind = kind or self._kind
        return self._predict(self._inputs(member_outputs, kind), self._input_kind(kind))

    @override
    def _calibrated_members(self, rows: Tensor) -> Tensor:
        return self._predict(rows, self._input_kind(self._kind))[:, None]  # one predictive: (B, 1, C)

    @override
    def _diagram_title(self) -> str:
        return _TITLES[self.method]

    # ------------------------------------------------------------------ fitting
    def _fit_rows(self, rows: Tensor, target: Tensor, input_kind: str) -> dict[str, Any]:
        """The state after fitting on labelled rows: the calibrator's and the NLLs before and after."""
        rows, target = rows.cpu(), target.cpu()
        settings = {"l2": self.l2} if self.method == "vector" else {}
        calibrator = make_calibrator(self.method, input_kind=input_kind, **settings).fit(rows, target)
        x = rows.double()
        before = _nll((x if input_kind == "probs" else x.softmax(-1)).mean(1), target)
        return {"method": self.method, "calibrator": calibrator.state_dict(), "nll_before": before,
                "nll_after": _nll(calibrator.predict_proba(x), target)}

    def fit(self, member_outputs: Tensor, target: Tensor) -> PostHocCalibration:
        """Fit on member outputs and labels directly, as a validation epoch fits on its rows.

        In a Trainer the callback fits by itself; this is for outputs already at hand.

        Args:
            member_outputs: as ``calibrated_probabilities`` takes them, of this callback's ``output_kind``.
            target: ``(B,)`` integer class labels; rows labelled below 0 are skipped.

        Raises:
            CalibrationError: rows the calibrator cannot fit on (one class only, NaN outputs).
        """
        outputs = {self.output_key: member_outputs, self.target_key: torch.as_tensor(target)}
        rows, labels = self._read("fit", outputs)
        self.load_state_dict(self._fit_rows(rows, labels, self._input_kind(self._kind)))
        return self

    # -------------------------------------------------------------------- hooks
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        for other in trainer.callbacks:
            same = isinstance(other, MemberOutputCalibration) and other.prefix == self.prefix
            if same and other is not self:
                raise setting_error(type(self).__name__, "prefix", self.prefix,
                                    f"{type(other).__name__} among the Trainer's callbacks logs under the"
                                    " same prefix, so their names would collide",
                                    f"give one another prefix, e.g. prefix='calibrated_{self.method}'")

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        rows, target = self._labelled(*self._gathered(trainer))
        if target.numel() == 0:
            rank_zero_warn("PostHocCalibration: no labelled validation rows in this epoch; the calibrator"
                           " stays as it was.")
            return
        try:
            state = self._fit_rows(rows, target, self._input_kind(self._kind))
        except CalibrationError as error:  # every rank holds the same rows, so every rank is here
            rank_zero_warn("PostHocCalibration could not fit on this validation epoch's rows, so the"
                           f" calibrator stays as it was: {error}")
            return
        self.load_state_dict(trainer.strategy.broadcast(state, src=0))  # rank 0's fit on every rank
        pl_module.log(f"{self.prefix}/val/nll", self.nll_after, sync_dist=True, add_dataloader_idx=False)

    @override
    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.calibrator is None:
            raise RuntimeError("PostHocCalibration has no calibrator after fit: no validation epoch gave"
                               " labelled rows it could fit on (see the warnings); give the Trainer"
                               " validation data with labels of 2 classes or more, or fit one afterwards with"
                               " trainer.validate(...).")

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fitted()

    @override
    def on_predict_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                             batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        has_probs = isinstance(outputs, dict) and "member_predictions" in outputs
        if isinstance(outputs, dict) and self.output_key in outputs:
            outputs["calibrated_prediction"] = self.calibrated_probabilities(outputs[self.output_key])
        elif has_probs and self._reads_probabilities():
            outputs["calibrated_prediction"] = self.calibrated_probabilities(outputs["member_predictions"],
                                                                             "probs")
        elif not self._warned_predict:
            got = (f"a dict with keys {sorted(outputs)}" if isinstance(outputs, dict)
                   else type(outputs).__name__)
            why = "; vector scaling fitted on logits cannot read probabilities" if has_probs else ""
            rank_zero_warn(f"PostHocCalibration adds calibrated_prediction to predict outputs that are dicts"
                           f" holding {self.output_key!r} (member outputs), or 'member_predictions' (member"
                           f" probabilities) where the calibrator reads them{why}; predict_step returned"
                           f" {got}, left as it is.")
            self._warned_predict = True

    @override
    def state_dict(self) -> dict[str, Any]:
        calibrator = None if self.calibrator is None else self.calibrator.state_dict()
        return {"method": self.method, "calibrator": calibrator, "nll_before": self.nll_before,
                "nll_after": self.nll_after}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        method, state = state_dict.get("method", self.method), state_dict.get("calibrator")
        if method != self.method:
            raise ValueError(f"PostHocCalibration(method={self.method!r}) cannot load the state of a"
                             f" {method!r} calibration; load it into PostHocCalibration(method={method!r}).")
        calibrator: Calibrator | None = None
        if state is not None:
            calibrator = make_calibrator(method)
            calibrator.load_state_dict(state)
        self.calibrator = calibrator
        self.nll_before, self.nll_after = state_dict.get("nll_before"), state_dict.get("nll_after")
