"""TabularEnsembleModule: LoMETab, TabM, TabM-mini, additive, MLP and deep ensembles.

Training loss = mean over members of the per-member loss; prediction = mean of member
probabilities (classification) or outputs (regression), reported in the target's
original units. Steps follow the member protocol (``ripieno.framework.members``:
``member_outputs (B, K, out)`` and ``target``), so DiversityMonitor and other member-aware
callbacks work unchanged.

Regression can also be distributional (``regression_head``): each member then predicts a
Gaussian or a set of quantiles (``ripieno.framework.nn.distributional_heads``), while
``member_outputs`` stay the members' means (medians) so that every consumer of the protocol
works as before; ``predictive_distribution`` and ``predict_step`` give the rest.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from typing import Any, Literal

import lightning as L
import torch
import torchmetrics
from torch import Tensor
from torchmetrics import Metric, MetricCollection
from typing_extensions import override

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.members import (
    StepOutput,
    member_output_kind_of_task,
    member_probabilities,
    member_values,
)
from ripieno.framework.methods.member_module import MemberModule
from ripieno.framework.methods.member_selection import (
    MemberSelection,
    SelectionMethod,
    SelectionMetric,
    choose_members,
    collect_member_predictions,
    subset_members,
)
from ripieno.framework.methods.tabular_prediction import TabularPredictionMixin
from ripieno.framework.metrics.mixture import (
    IntervalCoverage,
    MixtureCalibrationError,
    MixtureCRPS,
    MixtureNLL,
    QuantileLoss,
    mixture_moments,
)
from ripieno.framework.nn.distributional_heads import (
    DEFAULT_QUANTILE_LEVELS,
    RegressionHead,
    check_regression_head,
    gaussian_head,
    gaussian_nll,
    head_width,
    pinball_loss,
    sorted_quantiles,
)
from ripieno.framework.nn.embeddings import PiecewiseLinearEmbeddings
from ripieno.framework.nn.ensemble_linear import (
    DEFAULT_ADAPTER_INIT,
    Adapter,
    AdapterInit,
    Compute,
    EnsembleLinear,
    ScalingInit,
)
from ripieno.framework.nn.tabular_backbone import AdapterLayers, TabularEnsembleNet
from ripieno.framework.specs.tabular import TabularSpec

CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
"""``torch.compile`` modes (``mode=``)."""


def _call_net(net: TabularEnsembleNet, x_num: Tensor | None, x_cat: Tensor | None) -> Tensor:
    """``net(x_num, x_cat)``: the function ``compile=True`` compiles (the network is its argument)."""
    return net(x_num, x_cat)


class TabularEnsembleModule(TabularPredictionMixin, MemberModule):
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
        sigma_init: adapter init scale: std of the entries of ``A_k`` and ``B_k`` with
            ``adapter_init="plain"``, of ``A_k B_k^T`` with ``rank_normalized``, of
            ``A_k B_k^T`` relative to ``W``'s entries with ``relative``.
        d_embedding: numeric embedding size (used when the spec has bins).
        share_embeddings: share numeric embeddings across members (``False`` for a true
            deep ensemble).
        rank1_init: initialisation of the first layer's ``r`` for ``rank1``.
        compute: ``auto``, ``factored`` or ``materialized`` evaluation of ``lometab``.
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay for weight matrices; biases, embeddings and
            adapters (``r``, ``s``, ``A``, ``B``; multiplicative around 1, so decay would
            pull them to the wrong point) get none.
        adapter_init: draw of ``A_k``, ``B_k`` (``lometab``/``additive``; ignored by the
            other adapters). ``plain`` (default): entries ``N(0, sigma_init^2)``, the
            LoMETab paper's draw, so ``A_k B_k^T`` has std ``sqrt(rank) * sigma_init**2``
            and rank and ``sigma_init`` both set the initial diversity; the additive
            ablation gets the same draw, so it differs from LoMETab only in how the
            adapter enters. ``rank_normalized`` (``lometab``): std ``sigma_init`` for every
            rank, so ``sigma_init`` alone sets the initial spread. ``relative``
            (``additive``): std ``sigma_init`` times ``W``'s std for every rank, the
            perturbation size of ``lometab``/``rank_normalized`` (a like-for-like ablation).
            ``ripieno.framework.nn.ensemble_linear`` documents the exact draws.
        compile: run the network of the Trainer's steps (training, validation, test,
            predict; also ``predict_frame`` and ``select_members``) through ``torch.compile``.
            It is compiled at the first step, not here, and changes no result beyond float
            rounding: ``net`` stays the registered module, so the state_dict keys and the
            checkpoints are those of an eager module and load into either. Calling the module
            itself (``model(x)``, the posterior callbacks' ``torch.func`` passes) stays eager.
        compile_mode: ``torch.compile``'s ``mode`` (``default``, ``reduce-overhead``,
            ``max-autotune``, ``max-autotune-no-cudagraphs``); used with ``compile`` only.
        regression_head: what each member predicts (regression only; every adapter):
            ``point`` (default) one value, trained with the squared error; ``gaussian`` a
            mean and a variance (``softplus(raw) + 1e-6`` in standardised units), trained
            with the Gaussian NLL (``beta_nll``), the ensemble's predictive being the
            equal-weight mixture of the members' Gaussians; ``quantile`` one value per
            ``quantile_levels`` level, sorted so that they never cross, trained with the
            pinball loss averaged over levels and members. ``member_outputs`` and
            ``member_predictions`` hold the members' means (``gaussian``) or medians
            (``quantile``); ``predictive_distribution`` the variances or quantiles. Metrics
            added: ``nll`` (mixture NLL; ``crps`` is then the mixture's, closed form) for
            ``gaussian``; ``pinball`` and ``coverage`` (of the outer levels' interval) for
            ``quantile``, whose ``crps`` scores the member medians as for ``point``.
            ``{train,val,test}/loss`` is always the training objective (standardised units).
        quantile_levels: the levels of the ``quantile`` head (distinct, in ``(0, 1)``, with
            0.5, the point prediction); default ``(0.05, 0.5, 0.95)``. The lowest and
            highest give the interval that conformalised quantile regression corrects
            (``SplitConformal("cqr")`` on ``predictive_distribution``'s ``lower``/``upper``).
        beta_nll: beta-NLL exponent of the ``gaussian`` head (Seitzer et al., 2022): each
            row's NLL is multiplied by ``stop_gradient(variance) ** beta_nll``; 0 (default)
            is the plain NLL, 0.5 their recommendation.

    Example:
        >>> import torch
        >>> spec = TabularSpec(task="binary", n_num_features=3, n_classes=2)
        >>> model = TabularEnsembleModule(spec, k=4, d_block=8, adapter_init="rank_normalized")
        >>> model(torch.randn(5, 3)).shape
        torch.Size([5, 4, 1])
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
        adapter_init: AdapterInit = DEFAULT_ADAPTER_INIT,
        compile: bool = False,
        compile_mode: CompileMode = "default",
        regression_head: RegressionHead = "point",
        quantile_levels: tuple[float, ...] = DEFAULT_QUANTILE_LEVELS,
        beta_nll: float = 0.0,
    ) -> None:
        super().__init__()
        spec = TabularSpec.coerce(data_spec)
        self.quantile_levels = check_regression_head(regression_head, spec.task, quantile_levels, beta_nll)
        self.regression_head: RegressionHead = regression_head
        self.save_hyperparameters()
        self.use_spec(spec)  # hparams keep the compact spec; its fitted state goes to checkpoints
        self.task: Literal["regression", "binary", "multiclass"] = spec.task
        d_out = (spec.d_out if regression_head == "point"
                 else head_width(regression_head, self.quantile_levels))
        self.net = TabularEnsembleNet(
            n_num_features=spec.n_num_features, cat_cardinalities=spec.cat_cardinalities,
            d_out=d_out, k=k, adapter=adapter, adapter_layers=adapter_layers,
            n_blocks=n_blocks, d_block=d_block, dropout=dropout, rank=rank,
            sigma_init=sigma_init, bins=spec.bin_tensors(), d_embedding=d_embedding,
            share_embeddings=share_embeddings, rank1_init=rank1_init, compute=compute,
            adapter_init=adapter_init,
        )
        self.init_members(member_output_kind_of_task(spec.task), spec.n_classes)
        self.compile_mode: CompileMode | None = compile_mode if compile else None
        self._compiled_net: Callable[..., Tensor] | None = None  # built at the first step

    # ----------------------------------------------------------------- model interface
    @property
    def output_affine(self) -> tuple[float, float]:
        """``(scale, shift)`` from raw outputs to the modelled target's units (regression).

        Read by the posterior samplers, which take each member's raw output as one standardised
        value: a distributional head (two or more outputs per member) is refused there.
        """
        if self.task == "regression" and self.regression_head != "point":
            raise RipienoInputError(f"Posterior samplers read one standardised value per member, but"
                                    f" regression_head={self.regression_head!r} outputs several; use"
                                    " regression_head='point' with LastLayerSampler, SWAG, MC-dropout or"
                                    " Laplace.")
        if self.task == "regression":
            return float(self.spec.target_std), float(self.spec.target_mean)
        return 1.0, 0.0

    @override
    def forward(self, x_num: Tensor | dict[str, Tensor] | None, x_cat: Tensor | None = None) -> Tensor:
        """Raw member outputs ``(B, K, d_out)``: logits, or standardised regression values.

        ``x_num`` may be a batch dict with ``x_num``/``x_cat`` (what posterior callbacks pass).
        """
        if isinstance(x_num, dict):
            x_num, x_cat = x_num.get("x_num"), x_num.get("x_cat")
        return self.net(x_num, x_cat)

    def member_predictions(self, raw: Tensor) -> Tensor:
        """Member outputs for users: probabilities ``(B, K, C)`` or regression values ``(B, K)``.

        Regression values are in the modelled target's units (standardisation undone): the
        members' means, or medians for ``regression_head="quantile"``.
        """
        if self.task == "regression":
            if self.regression_head == "quantile":
                raw = sorted_quantiles(raw)[..., self.quantile_levels.index(0.5), None]
            return raw[..., 0].float() * self.spec.target_std + self.spec.target_mean
        return member_probabilities(raw, self.member_output_kind)

    def member_distribution(self, raw: Tensor) -> dict[str, Tensor]:
        """The members' predictive distributions from raw outputs, in the modelled target's units.

        Always ``member_mean`` ``(B, K)`` (``member_predictions``: means, or medians for the
        ``quantile`` head). ``gaussian``: ``member_variance`` ``(B, K)``, and the mixture's
        ``mean`` and ``variance`` ``(B,)`` (mean of the variances plus variance of the means).
        ``quantile``: ``member_quantiles`` ``(B, K, L)`` (sorted levels), ``quantiles`` ``(B, L)``
        (their member mean), and ``lower`` and ``upper`` ``(B,)`` (member means of the lowest and
        highest levels, the interval CQR corrects).
        """
        out = {"member_mean": self.member_predictions(raw)}
        scale, shift = float(self.spec.target_std), float(self.spec.target_mean)
        if self.regression_head == "gaussian":
            _, variance = gaussian_head(raw)
            out["member_variance"] = variance * scale**2
            out["mean"], out["variance"] = mixture_moments(out["member_mean"], out["member_variance"])
        elif self.regression_head == "quantile":
            quantiles = sorted_quantiles(raw) * scale + shift
            out["member_quantiles"] = quantiles
            out["quantiles"] = quantiles.mean(1)
            out["lower"], out["upper"] = out["quantiles"][:, 0], out["quantiles"][:, -1]
        return out

    @torch.no_grad()
    def predictive_distribution(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``member_distribution`` of a batch (dict with ``x_num``, ``x_cat``), without gradients.

        Example:
            >>> import torch
            >>> spec = TabularSpec(task="regression", n_num_features=3, target_mean=1.0, target_std=2.0)
            >>> model = TabularEnsembleModule(spec, k=4, d_block=8, regression_head="gaussian")
            >>> out = model.predictive_distribution({"x_num": torch.randn(5, 3)})
            >>> out["member_variance"].shape, out["variance"].shape
            (torch.Size([5, 4]), torch.Size([5]))
        """
        return self.member_distribution(self.step_network(batch["x_num"], batch.get("x_cat")))

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
    def forward_members(self, batch: dict[str, Tensor]) -> Tensor:
        """Member outputs of the protocol: logits, or regression values in target units ``(B, K, 1)``.

        The base's ``step`` scores them: the loss of rows labelled ``-1`` is left out, and the
        regression squared error is divided by ``target_scale() ** 2`` (the loss of the
        standardised outputs).
        """
        raw = self.step_network(batch["x_num"], batch.get("x_cat"))
        return self.member_predictions(raw)[..., None] if self.task == "regression" else raw

    def step_network(self, x_num: Tensor | None, x_cat: Tensor | None) -> Tensor:
        """Raw member outputs ``(B, K, d_out)`` as the steps compute them.

        Without ``compile`` this is ``self(x_num, x_cat)``. With it, ``torch.compile`` of a
        function that calls ``self.net`` (built at the first call), so ``net`` stays the one
        registered module: no ``_orig_mod.`` prefix reaches the state_dict or a checkpoint.
        """
        if self.compile_mode is None:
            return self(x_num, x_cat)
        if self._compiled_net is None:
            # a code object of this module's own: dynamo counts recompiles per code object, so
            # modules of other shapes in one process (a tuning study) would otherwise share the
            # limit (8) and, past it, run eager with only a log line
            own = types.FunctionType(_call_net.__code__.replace(), _call_net.__globals__, _call_net.__name__)
            self._compiled_net = torch.compile(own, mode=self.compile_mode)
        return self._compiled_net(self.net, x_num, x_cat)

    @override
    def __getstate__(self) -> dict[str, Any]:
        """The module's state without the compiled function (it may not pickle; rebuilt at the next step)."""
        state = super().__getstate__()
        state["_compiled_net"] = None
        return state

    def target_scale(self) -> float:
        """Regression trains on the squared error of standardised targets (``target_std``)."""
        return float(self.spec.target_std) if self.task == "regression" else 1.0

    @override
    def step(self, batch: dict[str, Tensor], stage: str) -> StepOutput:
        """The protocol's step; with a distributional head, its loss and the members' distributions.

        ``member_outputs`` are then the members' means or medians ``(B, K, 1)`` in the modelled
        target's units, and the step output also holds the detached ``member_variance`` ``(B, K)``
        or ``member_quantiles`` ``(B, K, L)`` (same units) that the metrics score.
        """
        if self.regression_head == "point":
            return super().step(batch, stage)
        raw = self.step_network(batch["x_num"], batch.get("x_cat"))
        target = batch["y"]
        distribution = self.member_distribution(raw)
        out: Any = {"member_outputs": distribution["member_mean"][..., None], "target": target,
                    "loss": self.distributional_loss(raw, target)}
        for key in ("member_variance", "member_quantiles"):
            if key in distribution:
                out[key] = distribution[key].detach()
        return out

    def distributional_loss(self, raw: Tensor, target: Tensor) -> Tensor:
        """The training loss of a distributional head on standardised targets, mean over rows and members.

        ``gaussian``: the (beta-weighted) Gaussian NLL; ``quantile``: the pinball loss averaged
        over levels too.
        """
        with torch.autocast(raw.device.type, enabled=False):
            y = (target.float() - float(self.spec.target_mean)) / float(self.spec.target_std)
            if self.regression_head == "gaussian":
                mean, variance = gaussian_head(raw)
                return gaussian_nll(mean, variance, y, float(self.hparams.beta_nll)).mean()
            return pinball_loss(sorted_quantiles(raw), y, self.quantile_levels).mean()

    def build_metrics(self) -> dict[str, Metric]:
        """The protocol's metrics, and ``rmse_original`` (raw units) for transformed targets.

        A ``gaussian`` head's ``crps`` is the mixture's (``MixtureCRPS``) and it adds ``nll``
        (``MixtureNLL``) and ``ece`` (``MixtureCalibrationError``, of its central intervals); a
        ``quantile`` head adds ``pinball`` (``QuantileLoss`` of the member-mean quantiles) and
        ``coverage`` (``IntervalCoverage`` of their outer levels).
        """
        metrics = super().build_metrics()
        if self.task == "regression" and self.spec.target_transform != "none":
            metrics["rmse_original"] = torchmetrics.MeanSquaredError(squared=False)
        if self.regression_head == "gaussian":
            metrics["crps"], metrics["nll"] = MixtureCRPS(), MixtureNLL()
            metrics["ece"] = MixtureCalibrationError()
        elif self.regression_head == "quantile":
            metrics["pinball"], metrics["coverage"] = QuantileLoss(self.quantile_levels), IntervalCoverage()
        return metrics

    def update_metrics(self, metrics: MetricCollection, out: StepOutput) -> int:
        """The protocol's metrics, plus the RMSE in the raw target's units and a head's own scores."""
        if self.regression_head != "point":
            return self._update_distributional_metrics(metrics, out)
        n = super().update_metrics(metrics, out)
        if "rmse_original" in metrics:
            prediction = member_values(out["member_outputs"].detach()).mean(1)
            metrics["rmse_original"].update(self.to_original_units(prediction),
                                            self.to_original_units(out["target"].float()))
        return n

    def _update_distributional_metrics(self, metrics: MetricCollection, out: StepOutput) -> int:
        """``update_metrics`` of a distributional head (the base's, with the head's ``crps``)."""
        values, target = member_values(out["member_outputs"].detach()), out["target"].float()
        prediction = values.mean(1)
        for name in ("rmse", "mae", "r2"):
            metrics[name].update(prediction, target)
        if "rmse_original" in metrics:
            metrics["rmse_original"].update(self.to_original_units(prediction),
                                            self.to_original_units(target))
        extra: Any = out
        if self.regression_head == "gaussian":
            metrics["crps"].update(values, extra["member_variance"], target)
            metrics["nll"].update(values, extra["member_variance"], target)
            metrics["ece"].update(values, extra["member_variance"], target)
        else:
            quantiles = extra["member_quantiles"].mean(1)
            metrics["crps"].update(values, target)
            metrics["pinball"].update(quantiles, target)
            metrics["coverage"].update(quantiles[:, 0], quantiles[:, -1], target)
        return len(target)

    @override
    def predict_step(self, batch: dict[str, Tensor], batch_idx: int, dataloader_idx: int = 0) -> Any:  # noqa: ANN401
        """The protocol's ``prediction`` and ``member_predictions``; a distributional head adds its own.

        ``gaussian``: ``member_variance`` ``(B, K)`` and ``variance`` ``(B,)`` (the mixture's);
        ``quantile``: ``member_quantiles`` ``(B, K, L)``, ``quantile_lower`` and ``quantile_upper``
        ``(B,)`` (the interval CQR corrects). These are in the modelled target's units
        (``prediction`` is in the original ones).
        """
        if self.regression_head == "point":
            return super().predict_step(batch, batch_idx, dataloader_idx)
        distribution = self.member_distribution(self.step_network(batch["x_num"], batch.get("x_cat")))
        members = distribution["member_mean"]
        out = {"prediction": self.to_original_units(members.mean(1)), "member_predictions": members}
        for key in ("member_variance", "variance", "member_quantiles"):
            if key in distribution:
                out[key] = distribution[key]
        if "lower" in distribution:  # not lower / upper: those name ConformalPrediction's interval
            out["quantile_lower"], out["quantile_upper"] = distribution["lower"], distribution["upper"]
        return out

    # ------------------------------------------------------------- member selection
    member_selection: MemberSelection | None = None
    """How this module's members were chosen from a larger trained one (``select_members``)."""

    def select_members(
        self,
        k: int,
        metric: SelectionMetric = "loss",
        method: SelectionMethod = "greedy",
        datamodule: L.LightningDataModule | None = None,
        dataloader: Iterable[dict[str, Tensor]] | None = None,
    ) -> TabularEnsembleModule:
        """A ``k``-member module made of this one's best members on validation rows.

        ``greedy`` is Caruana-style forward selection with replacement (a member may be chosen
        more than once; it then counts that many times), ``topk`` the ``k`` members with the
        best own score (``ripieno.framework.methods.member_selection``). The returned module
        predicts exactly the mean over the chosen members; ``member_selection`` on it records
        the indices and the validation scores and is saved in its checkpoints.

        Args:
            k: members to keep.
            metric: ``loss`` (NLL of the mean probability, or MSE of the mean prediction)
                or ``error`` (classification error rate).
            method: ``greedy`` or ``topk``.
            datamodule: whose ``val_dataloader`` gives the validation rows (default: the
                attached trainer's datamodule).
            dataloader: the validation batches instead (dicts with ``x_num``, ``x_cat``, ``y``).

        Example:
            >>> import torch
            >>> spec = TabularSpec(task="multiclass", n_num_features=2, n_classes=3)
            >>> model = TabularEnsembleModule(spec, k=6, d_block=8)
            >>> val = [{"x_num": torch.randn(32, 2), "y": torch.randint(0, 3, (32,))}]
            >>> small = model.select_members(2, dataloader=val)
            >>> small.hparams.k, len(small.member_selection.indices)
            (2, 2)
        """
        if dataloader is None:
            if datamodule is None:
                trainer = self._trainer
                datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
            if datamodule is None:
                raise ValueError("select_members needs validation rows: pass datamodule= or dataloader=.")
            dataloader = datamodule.val_dataloader()
        predictions, target = collect_member_predictions(self, dataloader)
        selection = choose_members(predictions, target, k, method, metric)
        selected = subset_members(self, selection.indices)
        selected.use_spec(self.spec)  # built from the compact hparams: give it the fitted state too
        selected.member_selection = selection
        return selected

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Also save ``member_selection`` (plain Python)."""
        super().on_save_checkpoint(checkpoint)
        if self.member_selection is not None:
            checkpoint["ripieno_member_selection"] = self.member_selection.to_dict()

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore ``member_selection``."""
        super().on_load_checkpoint(checkpoint)
        if "ripieno_member_selection" in checkpoint:
            self.member_selection = MemberSelection(**checkpoint["ripieno_member_selection"])

    # ------------------------------------------------------------------- optimiser
    def optimizer_parameters(self) -> list[dict[str, Any]]:
        """Weight decay only on shared/packed weight matrices."""
        decay, no_decay = [], []
        for module in self.net.modules():
            for name, param in module.named_parameters(recurse=False):
                is_weight = isinstance(module, EnsembleLinear) and name == "weight"
                if isinstance(module, PiecewiseLinearEmbeddings):
                    is_weight = False
                (decay if is_weight else no_decay).append(param)
        return [{"params": decay, "weight_decay": self.hparams.weight_decay},
                {"params": no_decay, "weight_decay": 0.0}]
