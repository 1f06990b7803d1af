"""Replica baselines for M-cover routing: replicated SGD and elastic averaging SGD.

Both act on a module whose ``net.copy_parameters()`` (or ``copy_parameters()``) lists
parameters with the copies on axis 0 (``ripieno.framework.mcover.MCoverClassifier``).

* ``ReplicaCoupling`` (replicated SGD, Baldassi et al. 2020, PNAS "Shaping the learning
  landscape in neural networks around wide flat minima"): adds
  ``gamma_t / 2 * sum_a ||theta_a - theta_bar||^2`` to the loss through the module's
  loss-term extension point, ``theta_bar`` the copies' mean, with a coupling that grows
  ``gamma_t = min(gamma_max, gamma0 * (1 + growth)^t)`` per step ``t``. Its gradient on copy
  ``a`` is ``gamma_t (theta_a - theta_bar)``.
* ``ElasticAveraging`` (EASGD, Zhang, Choromanska & LeCun 2015, synchronous form): a centre
  variable ``c``; every ``period`` optimiser steps, after the step,
  ``theta_a <- theta_a - alpha (theta_a - c)`` and ``c <- c + alpha sum_a (theta_a - c)``
  (with the pre-update differences). The centre is the collapsed predictor (the module's
  ``mean_weights`` rule): it is installed at the start of every fit, validation, test and
  predict run, so testing a checkpoint uses that checkpoint's centre.

Steps are optimiser steps (``trainer.global_step``): with ``accumulate_grad_batches=k`` the
coupling grows once per ``k`` batches and EASGD acts only after a batch that stepped.
"""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor
from typing_extensions import override

from ripieno.framework.members import (
    CollapseParametersModel,
    CopyParametersModel,
    LossTermsModel,
    require_capability,
)

COPIES_FIX = ("use an M-copy module whose copy_parameters() (on it or its net) lists parameters with the"
              " copies on axis 0, such as ripieno.framework.mcover.MCoverClassifier")


def copy_parameters(pl_module: L.LightningModule, callback: object | str = "ReplicaCoupling") -> list[Tensor]:
    """The module's copy-stacked parameters (``copy_parameters()`` on it or its ``net``).

    Raises:
        MissingCapabilityError: neither has the ``CopyParametersModel`` capability (a ``TypeError``).
    """
    owner = require_capability(callback, pl_module, CopyParametersModel, COPIES_FIX,
                               within=(pl_module, getattr(pl_module, "net", None)))
    return list(owner.copy_parameters())


class ReplicaCoupling(Callback):
    """Replicated SGD: couple every copy to the copies' mean with a growing strength.

    The module needs the ``CopyParametersModel`` (on it or its ``net``) and ``LossTermsModel``
    capabilities (``ripieno.framework.members``); ``setup`` stops the run without them.

    Args:
        gamma0: initial coupling.
        growth: per-step growth rate of the coupling.
        gamma_max: the coupling's cap.
    """

    def __init__(self, gamma0: float = 1e-3, growth: float = 1e-3, gamma_max: float = 10.0) -> None:
        super().__init__()
        if gamma0 < 0 or growth < 0 or gamma_max < 0:
            raise ValueError("gamma0, growth and gamma_max must be >= 0.")
        self.gamma0, self.growth, self.gamma_max = gamma0, growth, gamma_max

    def gamma(self, step: int) -> float:
        """``gamma_t`` at training step ``step``."""
        return min(self.gamma_max, self.gamma0 * (1.0 + self.growth) ** step)

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        copy_parameters(pl_module, self)
        require_capability(self, pl_module, LossTermsModel, "mix in"
                           " ripieno.framework.methods.loss_terms.LossTermsMixin and add"
                           " registered_loss_terms(...) to the training loss")
        pl_module.remove_loss_term("replica_coupling")
        pl_module.register_loss_term("replica_coupling", self._term)

    def _term(self, module: L.LightningModule, batch: Any, step_output: dict[str, Any]) -> Tensor:  # noqa: ANN401
        gamma = self.gamma(module.global_step)
        if getattr(module, "_trainer", None) is not None:  # also callable outside a Trainer
            module.log("train/replica_gamma", gamma, on_step=True, on_epoch=False)
        total = sum(((p - p.mean(0, keepdim=True)) ** 2).sum() for p in copy_parameters(module, self))
        return 0.5 * gamma * total

    @override
    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if isinstance(pl_module, LossTermsModel):
            pl_module.remove_loss_term("replica_coupling")


class ElasticAveraging(Callback):
    """Synchronous EASGD: copies and a centre attract each other every ``period`` steps.

    The module needs the ``CopyParametersModel`` (on it or its ``net``) and
    ``CollapseParametersModel`` capabilities (``ripieno.framework.members``); ``setup`` stops
    the run without them.

    Args:
        alpha: the moving rate (``eta * rho`` in the paper); ``M * alpha < 1`` keeps the
            centre update stable.
        period: optimiser steps between elastic updates (the communication period ``tau``).
    """

    def __init__(self, alpha: float = 0.05, period: int = 1) -> None:
        super().__init__()
        if not 0 < alpha < 1 or period < 1:
            raise ValueError(f"Need 0 < alpha < 1 and period >= 1, got alpha={alpha}, period={period}.")
        self.alpha, self.period = alpha, period
        self.centre: list[Tensor] | None = None
        # global_step after the last batch seen: a batch that leaves it unchanged only accumulated
        # gradients. Set from the (restored) trainer at every train start, so it needs no state_dict.
        self._seen_step: int | None = None

    @override
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        copy_parameters(pl_module, self)
        require_capability(self, pl_module, CollapseParametersModel, "give the module"
                           " set_collapse_parameters(parameters) so that the centre is its collapsed"
                           " predictor (ripieno.framework.mcover.MCoverClassifier has it)")

    @override
    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        params = copy_parameters(pl_module, self)
        m = params[0].shape[0]
        if m * self.alpha >= 1:
            raise ValueError(f"EASGD needs M * alpha < 1 for a stable centre; M={m}, alpha={self.alpha}.")
        if self.centre is None:
            self.centre = [p.detach().mean(0).clone() for p in params]
        self._install(pl_module)

    @override
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install(pl_module)

    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install(pl_module)

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install(pl_module)

    def _install(self, pl_module: L.LightningModule) -> None:
        """Give the module the centre (e.g. one loaded from a checkpoint) on its device."""
        if self.centre is None:
            return
        params = copy_parameters(pl_module, self)
        self.centre = [c.to(p.device) for c, p in zip(self.centre, params, strict=True)]
        pl_module.set_collapse_parameters(self.centre)  # type: ignore[operator]  (checked in setup)

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._seen_step = trainer.global_step

    @override
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                           batch: Any, batch_idx: int) -> None:  # noqa: ANN401
        step = trainer.global_step
        if step == self._seen_step:  # no optimiser step in this batch (gradient accumulation)
            return
        self._seen_step = step
        if step % self.period == 0:
            self.elastic_update(pl_module)

    @torch.no_grad()
    def elastic_update(self, pl_module: L.LightningModule) -> None:
        """One EASGD exchange: copies move ``alpha`` towards the centre, the centre towards the copies."""
        assert self.centre is not None
        for p, c in zip(copy_parameters(pl_module, self), self.centre, strict=True):
            diff = p - c
            p.sub_(self.alpha * diff)
            c.add_(self.alpha * diff.sum(0))

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"centre": [c.detach().cpu() for c in self.centre] if self.centre is not None else None}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        centre = state_dict.get("centre")
        self.centre = [c.clone() for c in centre] if centre is not None else None
