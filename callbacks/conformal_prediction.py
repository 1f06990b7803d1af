"""ConformalPrediction: split-conformal sets and intervals for any member module, in Lightning.

Split conformal prediction turns a trained model's outputs into prediction sets
(classification) or intervals (regression) that hold the truth with probability at least
``1 - alpha`` on exchangeable rows, whatever the model. This callback runs it inside a
Lightning run, on ``ripieno.framework.uq.conformal`` (whose scores are tested equal to MAPIE's):

* **Calibration rows.** By default the datamodule's ``calibration_dataloader()``: rows held
  out of training and of early stopping (``TabularDataModule(calibration_size=0.1)``).
  ``calibrate_on="val"`` takes the validation rows instead, on purpose: early stopping and
  checkpoint selection have seen them, so the guarantee is then only approximate.
* **Scores.** Classification: ``lac`` (the default), ``aps`` or ``raps`` on the ensemble's
  mean member probabilities, marginal or per class (``mondrian=True``). Regression:
  ``normalized`` (the default with several members): absolute residuals divided by the
  members' spread, so intervals widen where members disagree, with no second model;
  ``absolute`` (the default with one member): one width for every row; ``cqr`` (the default
  for ``TabularEnsembleModule(regression_head="quantile")``): conformalised quantile
  regression on the members' mean lowest and highest quantiles.
* **When.** At the end of every validation epoch of ``fit`` (after the sanity check), on the
  weights just validated, so every checkpoint carries the threshold of its own weights; and
  again at the start of ``test`` / ``predict`` when the datamodule has the calibration rows.
  Without them (``ripieno predict`` on a new file reads only the checkpoint), the threshold
  saved in the checkpoint is used, after checking that it was computed for these weights.
  Every rank reads all calibration rows and rank 0's thresholds are broadcast, so all ranks
  agree under DDP.
* **What it reads.** The member protocol (``ripieno.framework.members``): ``predict_step``'s
  ``member_predictions`` (``(B, M, C)`` probabilities or ``(B, M)`` values) on calibration
  batches, whose targets are under ``target_key``; the test step's ``member_outputs`` and
  ``target`` with the module's ``member_output_kind``. A user's module joins with those keys.
* **What it gives.** On test: ``conformal/test/coverage`` and ``set_size`` (classification)
  or ``width`` and ``winkler`` (regression, in the modelled target's units, as the module's
  ``rmse``). On predict: ``prediction_set`` ``(B, C)`` booleans, or ``lower`` / ``upper``
  ``(B,)`` in the target's original units, added to ``predict_step``'s dict;
  ``MemberPredictionWriter`` writes them as ``set`` / ``set_size`` or ``lower`` / ``upper``
  columns.

Example::

    data = TabularDataModule(dataset="wine", calibration_size=0.1)
    trainer = L.Trainer(callbacks=[ConformalPrediction(alpha=0.1)])
    trainer.fit(model, datamodule=data)
    trainer.test(model, datamodule=data, ckpt_path="best")  # conformal/test/coverage >= 0.9
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from ripieno.callbacks.sampler_settings import setting_error
from ripieno.framework.members import MemberModel, member_predictions, require_capability
from ripieno.framework.uq.conformal import (
    CLASSIFICATION_METHODS,
    SplitConformal,
    min_calibration_rows,
)

ConformalMethod = Literal["auto", "lac", "aps", "raps", "absolute", "normalized", "cqr"]
_METHODS = ("auto", "lac", "aps", "raps", "absolute", "normalized", "cqr")
_SPREAD_FLOOR = 1e-6  # of the calibration rows' median spread: rows where the members agree exactly
_WEIGHTS_RTOL = 1e-5


class ConformalPrediction(Callback):
    """Split-conformal prediction sets and intervals on held-out calibration rows (module docstring).

    Example:
        >>> conformal = ConformalPrediction(alpha=0.1)
        >>> probs = torch.tensor([[[0.7, 0.2, 0.1]], [[0.2, 0.5, 0.3]]])  # (rows, members, classes)
        >>> conformal.calibrate_outputs(probs, torch.tensor([0, 1]), "logits")
        >>> conformal.conformal.qhat  # LAC: 1 - p(true class); with 2 rows the threshold is +inf
        inf

    Args:
        alpha: the miscoverage allowed, in ``(0, 1)``: sets / intervals cover ``>= 1 - alpha``.
        method: ``auto`` (``lac`` for classes; for regression ``cqr`` with quantile heads, else
            ``normalized`` with several members, else ``absolute``), ``lac``, ``aps``, ``raps``,
            ``absolute``, ``normalized`` or ``cqr``.
        mondrian: classification: one threshold per class (coverage within every class).
        calibrate_on: ``calibration`` (the datamodule's ``calibration_dataloader()``) or ``val``
            (the validation rows, which early stopping has seen: an explicit choice).
        k_reg: RAPS: the rank after which labels are penalised.
        lam: RAPS: the penalty per rank beyond ``k_reg``.
        target_key: key of the targets in a calibration batch (a dict).
        seed: seeds the uniform draws of randomised APS / RAPS scores.
        prefix: first part of the logged names (``conformal/test/coverage``).

    Attributes:
        conformal: the calibrated ``SplitConformal`` (``None`` before calibration).
        spread_floor: the members' spread floor of ``normalized`` (from the calibration rows).
    """

    def __init__(
        self,
        alpha: float = 0.1,
        method: ConformalMethod = "auto",
        mondrian: bool = False,
        calibrate_on: Literal["calibration", "val"] = "calibration",
        k_reg: int | None = None,
        lam: float | None = None,
        target_key: str = "y",
        seed: int = 0,
        prefix: str = "conformal",
    ) -> None:
        super().__init__()
        owner = type(self).__name__
        if not (isinstance(alpha, float | int) and 0.0 < alpha < 1.0):
            raise setting_error(owner, "alpha", alpha, "alpha is the miscoverage allowed",
                                "use a fraction in (0, 1), e.g. alpha=0.1 for 90% sets")
        if method not in _METHODS:
            raise setting_error(owner, "method", method, "Unknown conformal score",
                                f"use one of {', '.join(_METHODS)}")
        if calibrate_on not in ("calibration", "val"):
            raise setting_error(owner, "calibrate_on", calibrate_on, "Unknown calibration rows",
                                "use 'calibration' (held-out rows) or 'val' (validation rows, on purpose)")
        self.alpha, self.method, self.mondrian = float(alpha), method, mondrian
        self.calibrate_on = calibrate_on
        self.k_reg, self.lam, self.target_key, self.seed, self.prefix = k_reg, lam, target_key, seed, prefix
        if method == "raps":  # SplitConformal checks k_reg / lam now, before any training
            SplitConformal("raps", self.alpha, k_reg=k_reg, lam=lam)
        self.conformal: SplitConformal | None = None
        self.spread_floor = 0.0
        self._weights: tuple[float, float] | None = None
        self._kind = "logits"
        self._quantiles = False
        self._sums: dict[str, Tensor] = {}

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(alpha=self.alpha, method=self.method, prefix=self.prefix)

    # ------------------------------------------------------------------ calibration
    def _method_for(self, kind: str, members: int) -> str:
        if kind == "regression":
            if self.mondrian:
                raise ValueError("ConformalPrediction(mondrian=True) calibrates per class, but the module's"
                                 " outputs are regression values; drop mondrian.")
            if self.method in CLASSIFICATION_METHODS:
                raise ValueError(f"ConformalPrediction(method={self.method!r}) makes class sets, but the"
                                 " module's outputs are regression values; use method='auto', 'normalized'"
                                 " or 'absolute'.")
            if self.method == "cqr" and not self._quantiles:
                raise ValueError("ConformalPrediction(method='cqr') corrects quantile predictions, but the"
                                 " module has no quantile head; use"
                                 " TabularEnsembleModule(regression_head='quantile') or method='auto'.")
            if self.method == "auto":
                return "cqr" if self._quantiles else "normalized" if members > 1 else "absolute"
            return self.method
        if self.method in ("absolute", "normalized", "cqr"):
            raise ValueError(f"ConformalPrediction(method={self.method!r}) makes intervals, but the module is"
                             " a classifier; use method='auto', 'lac', 'aps' or 'raps'.")
        return "lac" if self.method == "auto" else self.method

    def calibrate_outputs(self, members: Tensor, target: Tensor, kind: str,
                          bounds: tuple[Tensor, Tensor] | None = None) -> None:
        """Calibrate on member predictions of the calibration rows.

        Args:
            members: ``(N, M, C)`` probabilities (classification) or ``(N, M)`` values.
            target: ``(N,)`` classes (rows below 0 are skipped) or targets.
            kind: the module's ``member_output_kind`` (``regression`` or a classification kind).
            bounds: ``cqr``: the lower and upper quantile predictions ``(N,)``.
        """
        members, target = members.detach().double().cpu(), target.detach().cpu()
        method = self._method_for(kind, members.shape[1])
        conformal = SplitConformal(method, self.alpha, mondrian=self.mondrian, k_reg=self.k_reg,  # type: ignore[arg-type]
                                   lam=self.lam)
        if kind == "regression":
            point, spread = members.mean(1), members.std(1, correction=0)
            outputs: Any = point
            self.spread_floor = 0.0
            if method == "normalized":
                median = float(spread.median()) if len(spread) else 0.0
                self.spread_floor = _SPREAD_FLOOR * median if median > 0 else 1e-12
                outputs = (point, spread.clamp_min(self.spread_floor))
            if method == "cqr":
                if bounds is None:
                    raise ValueError("ConformalPrediction(method='cqr') needs the lower and upper quantile"
                                     " predictions of the calibration rows (bounds=...).")
                outputs = (bounds[0].detach().double().cpu(), bounds[1].detach().double().cpu())
            self.conformal = conformal.calibrate(outputs, target.double())
        else:
            keep = target >= 0
            generator = torch.Generator().manual_seed(self.seed)
            self.conformal = conformal.calibrate(members.mean(1)[keep], target[keep].long(),
                                                 generator=generator)
        if self.conformal.n_calibration < min_calibration_rows(self.alpha):
            rank_zero_warn(f"ConformalPrediction: {self.conformal.n_calibration} calibration rows are too few"
                           f" for alpha={self.alpha} (at least {min_calibration_rows(self.alpha)}), so the"
                           " sets hold every class / the intervals are infinite; raise calibration_size or"
                           " alpha.")

    def _calibration_loader(self, trainer: L.Trainer) -> Any | None:  # noqa: ANN401
        """The calibration rows' DataLoader, or ``None`` when the datamodule has none."""
        data = trainer.datamodule
        if self.calibrate_on == "val":
            return data.val_dataloader() if data is not None and hasattr(data, "val_dataloader") else None
        if data is None or not hasattr(data, "calibration_dataloader"):
            return None
        if not getattr(data, "has_calibration_rows", True):
            return None
        return data.calibration_dataloader()

    def _batches(self, trainer: L.Trainer, pl_module: L.LightningModule,
                 loader: Any) -> Iterator[tuple[dict[str, Tensor], Tensor]]:  # noqa: ANN401
        for index, batch in enumerate(loader):
            if not isinstance(batch, dict) or self.target_key not in batch:
                got = f"keys {sorted(batch)}" if isinstance(batch, dict) else type(batch).__name__
                raise ValueError(f"ConformalPrediction reads the calibration targets from"
                                 f" batch[{self.target_key!r}]; the batch has {got}. Pass"
                                 " target_key=<the key of your targets>.")
            batch = pl_module.transfer_batch_to_device(batch, pl_module.device, 0)
            with trainer.precision_plugin.forward_context():
                out = pl_module.predict_step(batch, index)
            if not isinstance(out, dict) or "member_predictions" not in out:
                raise ValueError(f"ConformalPrediction needs predict_step to return a dict with"
                                 " 'member_predictions' ((B, M, C) probabilities or (B, M) values);"
                                 f" {type(pl_module).__name__}'s does not (see ripieno.framework.members).")
            yield out, batch[self.target_key]

    def calibrate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> bool:
        """Calibrate on the calibration rows with the module's current weights; ``False`` if none."""
        loader = self._calibration_loader(trainer)
        if loader is None:
            return False
        was_training = pl_module.training
        pl_module.eval()
        try:
            with torch.inference_mode():
                parts = list(self._batches(trainer, pl_module, loader))
        finally:
            pl_module.train(was_training)
        if not parts:
            raise ValueError("ConformalPrediction: the calibration loader has no rows; raise"
                             " calibration_size.")
        members = torch.cat([p[0]["member_predictions"].float() for p in parts])
        target = torch.cat([p[1] for p in parts])
        bounds = None
        if self._quantiles:
            bounds = (torch.cat([p[0]["quantile_lower"] for p in parts]),
                      torch.cat([p[0]["quantile_upper"] for p in parts]))
        self.calibrate_outputs(members, target, self._kind, bounds)
        state = trainer.strategy.broadcast(self.state_dict(), src=0)  # every rank keeps rank 0's thresholds
        self.load_state_dict(state)
        self._weights = _weights_fingerprint(pl_module)
        return True

    def _ready(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> SplitConformal:
        """Calibrate now if the rows are there, else check the loaded thresholds fit these weights."""
        if self.calibrate(trainer, pl_module):
            assert self.conformal is not None
            return self.conformal
        if self.conformal is None:
            raise RuntimeError(f"ConformalPrediction has no calibration for {stage}: give the datamodule"
                               " calibration rows (data.init_args.calibration_size=0.1), or"
                               f" {stage} from a checkpoint of a fit that had them (ckpt_path=...).")
        current = _weights_fingerprint(pl_module)
        same = self._weights is None or all(math.isclose(a, b, rel_tol=_WEIGHTS_RTOL, abs_tol=1e-8)
                                            for a, b in zip(self._weights, current, strict=True))
        if not same:
            raise RuntimeError(f"ConformalPrediction's thresholds were calibrated for other weights than the"
                               f" ones being used for {stage}; pass the checkpoint they came with"
                               " (ckpt_path=...) or give the datamodule calibration rows.")
        return self.conformal

    # -------------------------------------------------------------------- hooks
    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        fix = "set member_output_kind on the module (see ripieno.framework.members)"
        kind = require_capability(self, pl_module, MemberModel, fix).member_output_kind
        if kind is None:
            raise ValueError(f"ConformalPrediction cannot read {type(pl_module).__name__}'s"
                             f" member_output_kind None; {fix}.")
        self._kind = kind
        self._quantiles = getattr(pl_module, "regression_head", "point") == "quantile"
        self._method_for(kind, 2)  # a classification score on a regressor (or back) stops here

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.calibrate_on == "calibration":  # checked before the first training step
            data = trainer.datamodule
            if data is None or not hasattr(data, "calibration_dataloader") or not getattr(
                    data, "has_calibration_rows", True):
                raise ValueError("ConformalPrediction calibrates on rows held out of training, but the"
                                 " datamodule has none: set data.init_args.calibration_size (e.g. 0.1), or"
                                 " ConformalPrediction(calibrate_on='val') to reuse the validation rows on"
                                 " purpose.")

    @override
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        self.calibrate(trainer, pl_module)
        qhat = None if self.conformal is None else float(self.conformal.thresholds.max())  # type: ignore[union-attr]
        if qhat is not None and math.isfinite(qhat):  # the same on every rank
            pl_module.log(f"{self.prefix}/qhat", qhat, sync_dist=True, add_dataloader_idx=False)

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._ready(trainer, pl_module, "test")
        device = pl_module.device
        self._sums = {name: torch.zeros((), dtype=torch.float64, device=device)
                      for name in ("rows", "covered", "size", "winkler")}

    @override
    def on_test_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        if not isinstance(outputs, dict) or "member_outputs" not in outputs or "target" not in outputs:
            raise ValueError("ConformalPrediction scores the test step's 'member_outputs' and 'target';"
                             " return them from test_step (see ripieno.framework.members).")
        members = member_predictions(outputs["member_outputs"].detach(), self._kind).double()  # type: ignore[arg-type]
        target = outputs["target"].detach()
        conformal = self.conformal
        assert conformal is not None
        if conformal.is_classification:
            keep = target >= 0
            members, target = members[keep], target[keep].long()
            if not len(target):
                return
            generator = torch.Generator().manual_seed(self.seed + batch_idx)
            sets = conformal.predict_sets(members.mean(1).cpu(), generator=generator).to(target.device)
            covered = sets.gather(1, target[:, None])[:, 0]
            size, winkler = sets.sum(1).double(), torch.zeros(())
        else:
            lower, upper = self._intervals(members.cpu(), outputs.get("member_quantiles"))
            y = target.double().cpu()
            covered = (lower <= y) & (y <= upper)
            size = upper - lower
            winkler = size + (2 / self.alpha) * ((lower - y).clamp_min(0) + (y - upper).clamp_min(0))
        for name, value in (("rows", float(len(covered))), ("covered", covered.double().sum()),
                            ("size", size.sum()), ("winkler", winkler.sum())):
            self._sums[name] += torch.as_tensor(value, dtype=torch.float64).to(self._sums[name].device)

    def _intervals(self, members: Tensor, quantiles: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Intervals ``(lower, upper)`` of member values ``(B, M)`` in the modelled units.

        ``cqr`` reads the member quantiles ``(B, M, L)`` (sorted levels): the members' mean lowest
        and highest, as ``TabularEnsembleModule.predictive_distribution`` gives them.
        """
        conformal = self.conformal
        assert conformal is not None
        if conformal.method == "cqr":
            if quantiles is None:
                raise ValueError("ConformalPrediction(method='cqr') needs the step's 'member_quantiles'.")
            mean = quantiles.detach().double().cpu().mean(1)
            return conformal.predict_intervals((mean[:, 0], mean[:, -1]))
        point = members.mean(1)
        if conformal.method == "normalized":
            spread = members.std(1, correction=0).clamp_min(self.spread_floor)
            return conformal.predict_intervals((point, spread))
        return conformal.predict_intervals(point)

    @override
    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        sums = {name: trainer.strategy.reduce(value, reduce_op="sum") for name, value in self._sums.items()}
        rows = float(sums["rows"])
        if rows == 0:
            rank_zero_warn("ConformalPrediction: no labelled test rows, so no coverage to log.")
            return
        size_name = "set_size" if self.conformal is not None and self.conformal.is_classification else "width"
        values = {"coverage": float(sums["covered"]) / rows, size_name: float(sums["size"]) / rows}
        if size_name == "width":
            values["winkler"] = float(sums["winkler"]) / rows
        for name, value in values.items():  # already summed over ranks
            pl_module.log(f"{self.prefix}/test/{name}", value, add_dataloader_idx=False)

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._ready(trainer, pl_module, "predict")

    @override
    def on_predict_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                             batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:  # noqa: ANN401
        if not isinstance(outputs, dict) or "member_predictions" not in outputs:
            raise ValueError("ConformalPrediction adds sets / intervals to predict_step's dict, which must"
                             " hold 'member_predictions' (see ripieno.framework.members).")
        conformal = self.conformal
        assert conformal is not None
        members = outputs["member_predictions"].detach().double().cpu()
        device = outputs["member_predictions"].device
        if conformal.is_classification:
            generator = torch.Generator().manual_seed(self.seed + batch_idx)
            sets = conformal.predict_sets(members.mean(1), generator=generator)
            outputs["prediction_set"] = sets.to(device)
            return
        lower, upper = self._intervals(members, outputs.get("member_quantiles"))
        to_original = getattr(pl_module, "to_original_units", None)
        if callable(to_original):  # a monotone map (exp for a log target) keeps the coverage
            lower, upper = to_original(lower), to_original(upper)
        outputs["lower"], outputs["upper"] = lower.float().to(device), upper.float().to(device)

    # -------------------------------------------------------------------- state
    @override
    def state_dict(self) -> dict[str, Any]:
        conformal = self.conformal
        fitted = conformal is not None and conformal.thresholds is not None
        return {
            "method": None if conformal is None else conformal.method,
            "thresholds": conformal.thresholds.tolist() if fitted else None,  # type: ignore[union-attr]
            "n_calibration": 0 if conformal is None else conformal.n_calibration,
            "spread_floor": self.spread_floor,
            "weights": self._weights,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        thresholds = state_dict.get("thresholds")
        if thresholds is None:
            self.conformal = None
            return
        self.conformal = SplitConformal(state_dict["method"], self.alpha, mondrian=self.mondrian,
                                        k_reg=self.k_reg, lam=self.lam,
                                        thresholds=torch.tensor(thresholds, dtype=torch.float64),
                                        n_calibration=int(state_dict.get("n_calibration", 0)))
        self.spread_floor = float(state_dict.get("spread_floor", 0.0))
        weights = state_dict.get("weights")
        self._weights = None if weights is None else (float(weights[0]), float(weights[1]))


def _weights_fingerprint(module: torch.nn.Module) -> tuple[float, float]:
    """The sum and the sum of squares of every parameter: which weights a calibration belongs to."""
    total, squares = 0.0, 0.0
    with torch.no_grad():
        for parameter in module.parameters():
            values = parameter.detach().double()
            total += float(values.sum())
            squares += float(values.square().sum())
    return total, squares
