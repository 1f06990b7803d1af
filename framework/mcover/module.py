"""MCoverClassifier: M copies of an MLP or committee machine trained through routing.

The module owns its kernel ``Q`` and a bank of ``S`` permutations per routing slot (a
persistent buffer, so checkpoints resume with the bank in force). ``RoutingResampler``
redraws the bank during training; without it the first bank (``routing_seed``) stays.

Training: copy ``a`` is trained by backprop on its own cross-entropy through the routing
(``routing="exact"``: step ``t`` uses permutation ``t mod S`` of every slot;
``routing="block_message"``: every step mixes with the bank's empirical mixing matrices).
The loss is the sum over copies (``copy_cross_entropy``). Evaluation uses no routing:
each copy is its own network, and the module logs

* ``{val,test}/accuracy``, ``/nll``: the copy average (mean of the copies' probabilities);
* ``{val,test}/collapsed_accuracy``, ``/collapsed_nll``: the collapsed predictor
  (``RoutedMLP.collapse``: mean weights, or the parameters a callback installed with
  ``set_collapse_parameters``, e.g. EASGD's centre);
* ``{val,test}/copy_accuracy``: the mean of the copies' individual accuracies;
* committee machines also log ``{val,test}/vote_accuracy`` (the collapsed hard committee's
  majority vote).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import lightning as L
import torch
import torchmetrics
from torch import Tensor, nn

from ripieno.framework.image_spec import ImageSpec
from ripieno.framework.mcover.kernels import KernelKind, make_kernel
from ripieno.framework.mcover.permutations import MAX_EXACT_M, PermutationBank, SamplerKind
from ripieno.framework.mcover.routed_mlp import Activation, Head, RoutedMLP, copy_cross_entropy
from ripieno.framework.methods.loss_terms import LossTermsMixin
from ripieno.framework.methods.rng_state import RNGStateMixin

Routing = Literal["exact", "block_message"]


class MCoverClassifier(LossTermsMixin, RNGStateMixin, L.LightningModule):
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
    """

    task = "multiclass"
    member_output_kind = "logits"

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
        self.kernel = make_kernel(kernel, m, sigma=sigma, mu=mu, matrix=kernel_matrix)
        auto: SamplerKind = "exact" if m <= MAX_EXACT_M else "mcmc"
        self.sampler: SamplerKind = auto if sampler == "auto" else sampler
        self.net = RoutedMLP(math.prod(spec.image_shape), hidden, spec.n_classes, m, n_blocks=n_blocks,
                             activation=activation, head=head, committee_size=committee_size, init=init)
        bank = PermutationBank.draw(self.kernel, max(self.net.n_slots, 1), bank_size,
                                    torch.Generator().manual_seed(routing_seed), self.sampler)
        self.register_buffer("bank_perms", bank.perms)  # persistent: checkpoints carry the bank
        self._collapse_parameters: list[Tensor] | None = None
        self.__dict__["_collapsed"] = None  # a cache, not a submodule: kept out of state_dict
        self.metrics = nn.ModuleDict({stage: self._make_metrics(spec.n_classes, head)
                                      for stage in ("val_", "test_")})

    @staticmethod
    def _make_metrics(n_classes: int, head: str) -> nn.ModuleDict:
        metrics = {
            "accuracy": torchmetrics.Accuracy(task="multiclass", num_classes=n_classes),
            "nll": torchmetrics.MeanMetric(),
            "collapsed_accuracy": torchmetrics.Accuracy(task="multiclass", num_classes=n_classes),
            "collapsed_nll": torchmetrics.MeanMetric(),
            "copy_accuracy": torchmetrics.MeanMetric(),
        }
        if head == "committee":
            metrics["vote_accuracy"] = torchmetrics.MeanMetric()
        return nn.ModuleDict(metrics)

    # ------------------------------------------------------------------- routing
    @property
    def permutation_bank(self) -> PermutationBank:
        """The bank in force (``(n_slots, S, M)`` permutations)."""
        return PermutationBank(self.bank_perms)

    def draw_permutation_bank(self, generator: torch.Generator) -> None:
        """Draw a new bank from this module's kernel with ``generator`` and install it."""
        bank = PermutationBank.draw(self.kernel, self.bank_perms.shape[0], self.bank_perms.shape[1],
                                    generator, self.sampler)
        self.bank_perms.copy_(bank.perms.to(self.bank_perms.device))

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
        """The collapsed predictor of the current weights."""
        if self._collapse_parameters is None:
            return self.net.collapse()
        n = self.net.n_layers
        params = self._collapse_parameters
        return self.net._base_network(list(params[:n]), list(params[n:]))

    # --------------------------------------------------------------------- steps
    def forward(self, x: Tensor, routing: Tensor | None = None) -> Tensor:
        """Outputs of every copy ``(B, M, C)``; no routing unless ``routing`` is given."""
        return self.net(x, routing)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Sum of the copies' routed cross-entropies plus every registered loss term."""
        logits = self.net(batch["x"], self.routing_for_step(self.global_step))
        out = {"loss": copy_cross_entropy(logits, batch["y"]), "member_outputs": logits.detach(),
               "target": batch["y"]}
        out["loss"] = out["loss"] + self.registered_loss_terms(batch, out)
        self.log("train/loss", out["loss"], prog_bar=True, on_step=True, on_epoch=True,
                 batch_size=len(batch["y"]))
        return out

    def on_validation_epoch_start(self) -> None:
        """Fresh metric states and the collapsed predictor of the current weights."""
        self._start_eval("val_")

    def on_test_epoch_start(self) -> None:
        """Fresh metric states and the collapsed predictor of the current weights."""
        self._start_eval("test_")

    def _start_eval(self, stage: str) -> None:
        for metric in self.metrics[stage].values():
            metric.reset()
        self.__dict__["_collapsed"] = self.collapsed_network()

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> dict[str, Tensor]:
        """Copy-average and collapsed metrics on the validation split."""
        return self._eval_step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int,
                  dataloader_idx: int = 0) -> dict[str, Tensor]:
        """As validation; OOD batches (labels ``-1``) only pass through."""
        return self._eval_step(batch, "test")

    def predict_step(self, batch: dict[str, Tensor], batch_idx: int,
                     dataloader_idx: int = 0) -> dict[str, Tensor]:
        """Copy-average ``prediction (B, C)``, ``member_outputs (B, M, C)`` and ``collapsed (B, C)``."""
        logits = self.net(batch["x"])
        collapsed = self.collapsed_network()(batch["x"])
        return {"prediction": torch.softmax(logits.float(), -1).mean(1), "member_outputs": logits,
                "collapsed": torch.softmax(collapsed.float(), -1)}

    def _eval_step(self, batch: dict[str, Tensor], stage: str) -> dict[str, Tensor]:
        x, y = batch["x"], batch["y"]
        logits = self.net(x)
        out = {"member_outputs": logits, "target": y}
        valid = y >= 0
        if not valid.any():
            return out
        logits, target, x = logits[valid].float(), y[valid], x[valid]
        metrics = self.metrics[f"{stage}_"]
        probs = torch.softmax(logits, -1).mean(1)
        assert self._collapsed is not None
        collapsed = torch.softmax(self._collapsed(x).float(), -1)
        metrics["accuracy"].update(probs, target)
        metrics["nll"].update(-probs.gather(1, target[:, None]).clamp_min(1e-12).log())
        metrics["collapsed_accuracy"].update(collapsed, target)
        metrics["collapsed_nll"].update(-collapsed.gather(1, target[:, None]).clamp_min(1e-12).log())
        metrics["copy_accuracy"].update((logits.argmax(-1) == target[:, None]).float().mean(1))
        if "vote_accuracy" in metrics:
            hidden = self._collapsed[:-2](x)  # the collapsed committee's pre-activations
            votes = self.net.readout.vote(hidden)
            decision = (votes + 1e-3 * collapsed).argmax(-1)  # ties: the soft committee decides
            metrics["vote_accuracy"].update((decision == target).float())
        loss = copy_cross_entropy(logits, target)
        self.log(f"{stage}/loss", loss, batch_size=len(target), sync_dist=True, add_dataloader_idx=False)
        for name, metric in metrics.items():
            self.log(f"{stage}/{name}", metric, prog_bar=name == "accuracy", add_dataloader_idx=False)
        return out

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """SGD with momentum, or AdamW, over all copies."""
        hp = self.hparams
        if hp.optimizer == "sgd":
            return torch.optim.SGD(self.parameters(), lr=hp.lr, momentum=hp.momentum,
                                   weight_decay=hp.weight_decay)
        return torch.optim.AdamW(self.parameters(), lr=hp.lr, weight_decay=hp.weight_decay)
