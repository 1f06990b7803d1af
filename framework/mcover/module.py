"""MCoverClassifier: M copies of an MLP or committee machine trained through routing.

The module owns its kernel ``Q`` and a bank of ``S`` permutations per routing slot (a
persistent buffer, so checkpoints resume with the bank in force). ``RoutingResampler``
redraws the bank during training; without it the first bank (``routing_seed``) stays.

Training: copy ``a`` is trained by backprop on its own cross-entropy through the routing
(``routing="exact"``: step ``t`` uses permutation ``t mod S`` of every slot;
``routing="block_message"``: every step mixes with the bank's empirical mixing matrices).
The loss is the sum over copies (``copy_cross_entropy``). Evaluation uses no routing:
each copy is its own network.

Collapse (``collapse``, ``ripieno.framework.mcover.collapse``): the copies become one
predictor by ``mean_weights`` (the network of the copies' mean weights, or of the
parameters a callback installed with ``set_collapse_parameters``, e.g. EASGD's centre;
the default), ``best_copy`` (the copy with the best validation accuracy, chosen at the end
of every validation epoch and kept in the ``best_copy_index`` buffer, so checkpoints carry
it) or ``copy_average`` (the mean of the copies' probabilities). Every rule is scored at
every validation and test epoch; the module logs

* ``{val,test}/collapsed_accuracy``, ``/collapsed_nll``: the predictor ``collapse`` names;
* ``{val,test}/mean_weights_accuracy``, ``/mean_weights_nll``: the mean-weight network;
* ``{val,test}/best_copy_accuracy``, ``/best_copy_nll``, ``/best_copy_index``: on
  validation the copy chosen there (its score is the maximum over copies, so it is
  optimistic), on test the copy chosen on validation;
* ``{val,test}/copy_average_accuracy``, ``/copy_average_nll`` and, as for every member
  module, ``{val,test}/accuracy``, ``/nll``, ``/ece``: the copy average;
* ``{val,test}/copy_accuracy``: the mean of the copies' individual accuracies;
* committee machines also log ``{val,test}/vote_accuracy`` (the mean-weight hard
  committee's majority vote).

``predict_step`` returns the copy average as ``prediction`` (the member protocol) and the
``collapse`` rule's probabilities as ``collapsed``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import torch
import torch.nn.functional as F
import torchmetrics
from torch import Tensor, nn
from torchmetrics import Metric, MetricCollection
from typing_extensions import override

from ripieno.framework.mcover.collapse import CollapseRule, CopyScores, best_copy_index, check_collapse_rule
from ripieno.framework.mcover.copies import PermutationCopiesMixin
from ripieno.framework.mcover.kernels import KernelKind, make_kernel
from ripieno.framework.mcover.permutations import MAX_EXACT_M, SamplerKind
from ripieno.framework.mcover.routed_mlp import Activation, Head, RoutedMLP, copy_cross_entropy
from ripieno.framework.members import PredictOutput, StepOutput
from ripieno.framework.methods.member_module import MemberModule
from ripieno.framework.metrics.uq import PredictiveNLL
from ripieno.framework.specs.image import ImageSpec

Routing = Literal["exact", "block_message"]


class MCoverClassifier(PermutationCopiesMixin, MemberModule):
    """M-cover routed classifier on flattened inputs (images from ``ImageDataModule``).

    Args:
        data_spec: the data's ``ImageSpec`` (or dict); linked from ``data.spec`` by the CLI.
        m: copies ``M`` (``1`` with any kernel is plain SGD).
        hidden: hidden widths (MLP); empty for a committee machine.
        head: ``linear`` (MLP) or ``committee`` (soft committee machine, fixed readout).
        committee_size: hidden units per class (``committee``).
        activation: ``relu`` or ``tanh`` (MLP).
        kernel: ``diagonal``, ``uniform``, ``gaussian_ring`` or ``matrix``.
        sigma: ring width (``gaussian_ring``).
        mu: ring shift (``gaussian_ring``).
        kernel_matrix: the ``M x M`` matrix for ``kernel="matrix"``.
        routing: ``exact`` (sampled permutations) or ``block_message`` (mixing matrices).
        n_blocks: blocks of incoming coordinates per routed layer.
        bank_size: permutations ``S`` per slot.
        sampler: ``auto`` (exact for ``M <= 8``, else MCMC), ``exact``, ``mcmc``, ``gumbel``.
        routing_seed: seed of the first bank.
        init: ``independent`` or ``identical`` copies at initialisation.
        optimizer: ``sgd`` (momentum) or ``adamw``.
        lr: learning rate.
        momentum: SGD momentum.
        weight_decay: weight decay.
        collapse: the collapsed predictor: ``mean_weights``, ``best_copy`` (on validation) or
            ``copy_average`` (module docstring).
    """

    task = "multiclass"

    def __init__(
        self,
        data_spec: ImageSpec | dict[str, Any],
        m: int = 5,
        hidden: list[int] | None = None,
        head: Head = "linear",
        committee_size: int = 5,
        activation: Activation = "relu",
        kernel: KernelKind = "gaussian_ring",
        sigma: float = 1.0,
        mu: float = 0.0,
        kernel_matrix: list[list[float]] | None = None,
        routing: Routing = "exact",
        n_blocks: int = 1,
        bank_size: int = 16,
        sampler: Literal["auto"] | SamplerKind = "auto",
        routing_seed: int = 0,
        init: Literal["independent", "identical"] = "independent",
        optimizer: Literal["sgd", "adamw"] = "sgd",
        lr: float = 0.05,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        collapse: CollapseRule = "mean_weights",
    ) -> None:
        super().__init__()
        spec = ImageSpec.coerce(data_spec)
        data_spec = spec.to_dict()
        hidden = list(hidden) if hidden is not None else ([] if head == "committee" else [256])
        self.save_hyperparameters()
        if routing not in ("exact", "block_message"):
            raise ValueError(f"routing must be 'exact' or 'block_message', got {routing!r}.")
        if optimizer not in ("sgd", "adamw"):
            raise ValueError(f"optimizer must be 'sgd' or 'adamw', got {optimizer!r}.")
        if bank_size < 1:
            raise ValueError(f"bank_size must be >= 1, got {bank_size}.")
        self.spec = spec
        self.n_copies = m
        self.collapse_rule = check_collapse_rule(collapse)
        self.kernel = make_kernel(kernel, m, sigma=sigma, mu=mu, matrix=kernel_matrix)
        auto: SamplerKind = "exact" if m <= MAX_EXACT_M else "mcmc"
        self.sampler: SamplerKind = auto if sampler == "auto" else sampler
        self.net = RoutedMLP(math.prod(spec.image_shape), hidden, spec.n_classes, m, n_blocks=n_blocks,
                             activation=activation, head=head, committee_size=committee_size, init=init)
        self.init_permutation_copies(self.net.n_slots, bank_size, routing_seed)  # bank_perms, best_copy_index
        self._collapse_parameters: list[Tensor] | None = None
        self.__dict__["_mean_weights"] = None  # a cache, not a submodule: kept out of state_dict
        self.init_members("logits", spec.n_classes)
        self.copy_scores = nn.ModuleDict({key: CopyScores(m) for key in self.metrics})  # states not saved

    def build_metrics(self) -> dict[str, Metric]:
        """The copy average's metrics, the mean-weight network's and the copies' own accuracy.

        The best copy's and the ``collapsed`` scores come from ``copy_scores`` at epoch end.
        """
        n = self.spec.n_classes
        metrics = super().build_metrics()
        metrics |= {
            "copy_average_accuracy": torchmetrics.Accuracy(task="multiclass", num_classes=n, average="micro"),
            "copy_average_nll": PredictiveNLL(input_kind="probs"),
            "mean_weights_accuracy": torchmetrics.Accuracy(task="multiclass", num_classes=n, average="micro"),
            "mean_weights_nll": PredictiveNLL(input_kind="logits"),
            "copy_accuracy": torchmetrics.MeanMetric(),
        }
        if self.hparams.head == "committee":
            metrics["vote_accuracy"] = torchmetrics.MeanMetric()
        return metrics

    # ------------------------------------------------------------------- routing
    def routing_for_step(self, step: int) -> Tensor | None:
        """What ``RoutedMLP.forward`` gets at training step ``step``."""
        if self.net.n_slots == 0:
            return None
        if self.hparams.routing == "exact":
            return self.permutation_bank.at(step)
        return self.permutation_bank.mixing()

    def set_collapse_parameters(self, parameters: list[Tensor] | None) -> None:
        """Install the collapsed predictor's parameters.

        ``parameters`` follow ``RoutedMLP.copy_parameters``'s order without the copies axis
        (e.g. EASGD's centre); ``None`` restores the copies' mean.
        """
        self._collapse_parameters = parameters

    def collapsed_network(self) -> nn.Sequential:
        """The ``mean_weights`` rule's network of the current weights (or of the installed parameters)."""
        if self._collapse_parameters is None:
            return self.net.collapse()
        n = self.net.n_layers
        params = self._collapse_parameters
        return self.net._base_network(list(params[:n]), list(params[n:]))

    # --------------------------------------------------------------------- steps
    @override
    def forward(self, x: Tensor, routing: Tensor | None = None) -> Tensor:
        """Outputs of every copy ``(B, M, C)``; no routing unless ``routing`` is given."""
        return self.net(x, routing)

    def forward_members(self, batch: dict[str, Tensor]) -> Tensor:
        """Every copy's logits without routing, ``(B, M, C)``: each copy is its own network."""
        return self.net(batch["x"])

    def member_loss(self, member_outputs: Tensor, target: Tensor, row_weight: Tensor | None = None) -> Tensor:
        """Sum over copies of each copy's cross-entropy (``copy_cross_entropy``); see ``MemberModule``."""
        return copy_cross_entropy(member_outputs.float(), target, row_weight)

    def collapsed_probabilities(self, x: Tensor) -> Tensor:
        """The ``collapse`` rule's predictive probabilities ``(B, C)`` for inputs ``x``."""
        if self.collapse_rule == "mean_weights":
            network = self._mean_weights if self._mean_weights is not None else self.collapsed_network()
            return torch.softmax(network(x).float(), -1)
        if self.collapse_rule == "best_copy":
            return torch.softmax(self.net.copy_network(self.chosen_copy())(x).float(), -1)
        return torch.softmax(self.net(x).float(), -1).mean(1)

    def step(self, batch: dict[str, Tensor], stage: str) -> StepOutput:
        """Training routes through the bank in force; evaluation adds the mean-weight network's logits."""
        if stage == "train":
            logits = self.net(batch["x"], self.routing_for_step(self.global_step))
            out: StepOutput = {"member_outputs": logits, "target": batch["y"]}
            loss = self.labelled_loss(logits, batch["y"], stage)  # a tensor in training
            if loss is not None:
                out["loss"] = loss
            return out
        out = super().step(batch, stage)
        collapsed = self._mean_weights if self._mean_weights is not None else self.collapsed_network()
        out["mean_weights_outputs"] = collapsed(batch["x"])  # type: ignore[typeddict-unknown-key]
        if self.hparams.head == "committee":
            hidden = collapsed[:-2](batch["x"])  # the mean-weight committee's pre-activations
            out["votes"] = self.net.readout.vote(hidden)  # type: ignore[typeddict-unknown-key]
        return out

    def update_metrics(self, metrics: MetricCollection, out: StepOutput) -> int:
        """The copy average's metrics, then the mean-weight network's and every copy's own."""
        n = super().update_metrics(metrics, out)
        if n == 0:
            return 0
        target, logits = out["target"], out["member_outputs"].detach().float()
        collapsed = out["mean_weights_outputs"].detach().float()  # type: ignore[typeddict-item]
        votes = out.get("votes")
        scored = self.scored_rows(target)
        if scored is not None:
            target, logits, collapsed = target[scored], logits[scored], collapsed[scored]
            votes = votes[scored] if votes is not None else None
        probs = torch.softmax(logits, -1)
        metrics["copy_average_accuracy"].update(probs.mean(1), target)
        metrics["copy_average_nll"].update(probs, target)
        metrics["mean_weights_accuracy"].update(collapsed, target)
        metrics["mean_weights_nll"].update(collapsed, target)
        correct = logits.argmax(-1) == target[:, None]
        metrics["copy_accuracy"].update(correct.float().mean(1))
        copy_nll = F.cross_entropy(logits.transpose(1, 2), target[:, None].expand(-1, logits.shape[1]),
                                   reduction="none")
        self.copy_scores[f"{metrics.prefix.rstrip('/')}_"].update(correct, copy_nll)
        if votes is not None:
            decision = (votes + 1e-3 * torch.softmax(collapsed, -1)).argmax(-1)  # ties: the soft committee
            metrics["vote_accuracy"].update((decision == target).float())
        return n

    @override
    def on_validation_epoch_start(self) -> None:
        """Fresh metric states and the mean-weight network of the current weights."""
        super().on_validation_epoch_start()
        self.copy_scores["val_"].reset()
        self.__dict__["_mean_weights"] = self.collapsed_network()

    @override
    def on_test_epoch_start(self) -> None:
        """Fresh metric states and the mean-weight network of the current weights."""
        super().on_test_epoch_start()
        self.copy_scores["test_"].reset()
        self.__dict__["_mean_weights"] = self.collapsed_network()

    @override
    def on_predict_epoch_start(self) -> None:
        """The mean-weight network of the current weights."""
        self.__dict__["_mean_weights"] = self.collapsed_network()

    @override
    def on_predict_epoch_end(self) -> None:
        """Drop the cached mean-weight network (the weights may change after this)."""
        self.__dict__["_mean_weights"] = None

    @override
    def on_validation_epoch_end(self) -> None:
        """Choose the best copy on this validation (not in sanity checks) and log every rule."""
        self.__dict__["_mean_weights"] = None
        scores = self._copy_scores("val")
        if scores is None:
            return
        index = best_copy_index(scores["accuracy"], scores["nll"])
        if not self.trainer.sanity_checking:
            self.best_copy_index.fill_(index)
        self._log_collapse_rules("val", scores, index)

    @override
    def on_test_epoch_end(self) -> None:
        """Log every rule; the best copy is the one chosen on validation."""
        self.__dict__["_mean_weights"] = None
        scores = self._copy_scores("test")
        if scores is not None:
            self._log_collapse_rules("test", scores, self.chosen_copy())

    def logged_metric_names(self, stage: str) -> set[str]:
        """The base module's names plus the collapse rules' (``_log_collapse_rules``)."""
        rules = ("best_copy_accuracy", "best_copy_nll", "collapsed_accuracy", "collapsed_nll",
                 "best_copy_index")
        return super().logged_metric_names(stage) | {f"{stage}/{name}" for name in rules}

    def _copy_scores(self, stage: str) -> dict[str, Tensor] | None:
        metric = self.copy_scores[f"{stage}_"]
        return metric.per_copy() if metric.update_called else None

    def _log_collapse_rules(self, stage: str, scores: dict[str, Tensor], index: int) -> None:
        """``best_copy_*`` of copy ``index`` and ``collapsed_*`` of the ``collapse`` rule."""
        metrics = self.metrics[f"{stage}_"]
        values = {"best_copy_accuracy": scores["accuracy"][index], "best_copy_nll": scores["nll"][index]}
        if self.collapse_rule == "best_copy":
            values |= {"collapsed_accuracy": values["best_copy_accuracy"],
                       "collapsed_nll": values["best_copy_nll"]}
        else:
            values |= {"collapsed_accuracy": metrics[f"{self.collapse_rule}_accuracy"].compute(),
                       "collapsed_nll": metrics[f"{self.collapse_rule}_nll"].compute()}
        for name, value in values.items():
            self.log(f"{stage}/{name}", value.float(), sync_dist=True)
        self.log(f"{stage}/best_copy_index", float(index), sync_dist=True)

    @override
    def predict_step(self, batch: dict[str, Tensor], batch_idx: int,
                     dataloader_idx: int = 0) -> PredictOutput:
        """Copy average ``prediction (B, C)``, ``member_predictions (B, M, C)``, ``collapsed (B, C)``.

        ``collapsed`` holds the ``collapse`` rule's probabilities.
        """
        out = super().predict_step(batch, batch_idx, dataloader_idx)
        out["collapsed"] = self.collapsed_probabilities(batch["x"])  # type: ignore[typeddict-unknown-key]
        return out

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Checkpoints from before ``best_copy_index`` existed load with no copy chosen."""
        super().on_load_checkpoint(checkpoint)
        self.default_best_copy_index(checkpoint)

    def build_optimizer(self, parameters: Iterable[Tensor] | list[dict[str, Any]]) -> torch.optim.Optimizer:
        """SGD with momentum, or AdamW, over all copies."""
        hp = self.hparams
        if hp.optimizer == "sgd":
            return torch.optim.SGD(parameters, lr=hp.lr, momentum=hp.momentum, weight_decay=hp.weight_decay)
        return super().build_optimizer(parameters)
