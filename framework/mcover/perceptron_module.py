"""BinaryPerceptronSA: simulated annealing of binary perceptron copies as a LightningModule.

Each training step runs ``sweeps_per_step`` Metropolis sweeps of a
``RoutedPerceptronAnnealer`` on the step's batch (no gradients:
``automatic_optimization = False``; a no-op optimiser is stepped once per training step so
that ``global_step`` counts steps). ``method`` picks the variant:

* ``plain``: identity routing, no coupling (``m = 1`` is textbook SA; ``m > 1`` gives
  independent runs collapsed by majority vote);
* ``replicated``: identity routing, replica coupling ``gamma0 (1 + gamma_growth)^t``
  (Baldassi et al. 2016);
* ``mcover``: routing through permutations drawn from ``kernel`` (default a Gaussian
  ring), ``bank.at(t // resample_every)`` at sweep ``t``; no coupling unless ``gamma0`` is set.

The copies ``w (M, N)`` (int8), the sweep counter and the permutation bank are buffers,
and the copies' generator states go into checkpoints, so a resumed run continues the same
chain. ``RoutingResampler`` may redraw the bank (``draw_permutation_bank``). The energy is
not differentiable, so callbacks' loss terms (``register_loss_term``) do not apply here.
``BinaryPerceptronSA`` is a ``MemberModule`` whose members are the copies: ``member_outputs``
are the copies' fields ``(B, M)`` (real values whose sign is the label, read as
``regression``). The annealer runs on the CPU in one process; under DDP every rank would anneal its own
shard of the training set, so train on one device.

Collapse (``collapse``, as for ``MCoverClassifier``; ``ripieno.framework.mcover.collapse``):
``mean_weights`` (the default) is the student ``sign(sum_a w_a)``, the sign of the copies'
mean weights; ``best_copy`` the copy with the fewest errors on the validation split (ties:
the lower index), chosen at the end of every validation epoch and kept in the
``best_copy_index`` buffer; ``copy_average`` the copies' majority vote
``sign(sum_a sign(w_a . x))`` (ties: the ``mean_weights`` student), the hard-label form of
the mean of the copies' predictions.

Logged: ``train/energy`` (the annealed energy ``sum_a E_a - gamma sum_{a<b} w_a . w_b``),
``train/error_routed`` (mean training error of the routed copies), ``train/beta``,
``train/gamma``, ``train/acceptance``; on validation and test, from the teacher in the data
spec, ``{val,test}/gen_error_{mean_weights,best_copy,copy_average}`` (the last estimated by
``vote_generalization_error``), ``/gen_error_collapsed`` (the ``collapse`` rule's) and
``/gen_error_copies`` (mean of the copies' own errors), and, on the split's patterns,
``/error_{mean_weights,best_copy,copy_average}``, ``/error_collapsed``, ``/accuracy`` (the
``collapse`` rule's) and ``/best_copy_index``. ``predict_step``'s ``prediction`` is the
``collapse`` rule's label.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
import torchmetrics
from torch import Tensor, nn
from torchmetrics import Metric, MetricCollection
from typing_extensions import override

from ripieno.framework.mcover.collapse import CollapseRule, CopyScores, best_copy_index, check_collapse_rule
from ripieno.framework.mcover.copies import PermutationCopiesMixin
from ripieno.framework.mcover.kernels import KernelKind, make_kernel
from ripieno.framework.mcover.perceptron import (
    AnnealingSchedule,
    RoutedPerceptronAnnealer,
    TeacherStudentSpec,
    collapse,
    copy_generators,
    generalization_error,
    initial_copies,
    vote_generalization_error,
    vote_labels,
)
from ripieno.framework.mcover.permutations import MAX_EXACT_M, PermutationBank, SamplerKind
from ripieno.framework.members import PredictOutput, StepOutput
from ripieno.framework.methods.loss_terms import LossTerm
from ripieno.framework.methods.member_module import MemberModule

Method = Literal["plain", "replicated", "mcover"]
METHODS: tuple[str, ...] = ("plain", "replicated", "mcover")


class BinaryPerceptronSA(PermutationCopiesMixin, MemberModule):
    """Plain, replicated or M-cover simulated annealing of a binary perceptron.

    Args:
        data_spec: the data's ``TeacherStudentSpec`` (or dict); linked from ``data.spec`` by the CLI.
        method: ``plain``, ``replicated`` or ``mcover`` (module docstring).
        m: copies ``M``.
        kernel: mixing kernel (``mcover``; default ``gaussian_ring``); ``plain`` and
            ``replicated`` route by the identity (``None`` or ``diagonal``).
        sigma: ring width (``gaussian_ring``).
        mu: ring shift (``gaussian_ring``).
        kernel_matrix: the ``M x M`` matrix for ``kernel="matrix"``.
        n_blocks: contiguous blocks of the ``N`` inputs, one routing slot each.
        bank_size: permutations ``S`` per slot.
        sampler: ``auto`` (exact for ``M <= 8``, else MCMC), ``exact``, ``mcmc``, ``gumbel``.
        routing_seed: seed of the first bank.
        resample_every: sweeps per permutation of the bank.
        sweeps_per_step: sweeps per training step.
        n_sweeps: length of the ``beta`` ramp; ``None``: every sweep of the fit
            (``trainer.estimated_stepping_batches * sweeps_per_step``).
        beta0: inverse temperature at the first sweep.
        beta1: inverse temperature at the end of the ramp.
        gamma0: initial replica coupling; ``None``: ``0.05`` for ``replicated``, else ``0``.
        gamma_growth: ``gamma_t = gamma0 (1 + gamma_growth)^t``.
        seed: seed of the copies' initial weights and of their proposal generators.
        collapse: the collapsed student: ``mean_weights``, ``best_copy`` (on validation) or
            ``copy_average`` (module docstring).
    """

    chosen_copy_noun = "student"
    bank_on_cpu = True  # the annealer runs on the CPU

    def __init__(
        self,
        data_spec: TeacherStudentSpec | dict[str, Any],
        method: Method = "mcover",
        m: int = 5,
        kernel: KernelKind | None = None,
        sigma: float = 0.5,
        mu: float = 0.0,
        kernel_matrix: list[list[float]] | None = None,
        n_blocks: int = 5,
        bank_size: int = 64,
        sampler: Literal["auto"] | SamplerKind = "auto",
        routing_seed: int = 0,
        resample_every: int = 20,
        sweeps_per_step: int = 10,
        n_sweeps: int | None = None,
        beta0: float = 0.5,
        beta1: float = 5.0,
        gamma0: float | None = None,
        gamma_growth: float = 0.004,
        seed: int = 0,
        collapse: CollapseRule = "mean_weights",
    ) -> None:
        super().__init__()
        spec = TeacherStudentSpec.coerce(data_spec)
        data_spec = spec.to_dict()
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
        if m < 1 or (method != "plain" and m < 2):
            raise ValueError(f"method={method!r} needs m >= {1 if method == 'plain' else 2} copies, got {m}.")
        if method != "mcover" and kernel not in (None, "diagonal"):
            raise ValueError(f"method={method!r} routes by the identity; kernel={kernel!r} needs"
                             " method='mcover'.")
        if method == "plain" and gamma0:
            raise ValueError("method='plain' has no replica coupling; use method='replicated' for"
                             " gamma0 > 0.")
        if sweeps_per_step < 1 or bank_size < 1:
            raise ValueError(f"sweeps_per_step and bank_size must be >= 1, got {sweeps_per_step} and"
                             f" {bank_size}.")
        kernel = kernel or ("gaussian_ring" if method == "mcover" else "diagonal")
        gamma0 = gamma0 if gamma0 is not None else (0.05 if method == "replicated" else 0.0)
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.spec = spec
        self.n_copies = m
        self.collapse_rule = check_collapse_rule(collapse)
        self.kernel = make_kernel(kernel, m, sigma=sigma, mu=mu, matrix=kernel_matrix)
        auto: SamplerKind = "exact" if m <= MAX_EXACT_M else "mcmc"
        self.sampler: SamplerKind = auto if sampler == "auto" else sampler
        # validated now (an n_sweeps placeholder until the fit's length is known)
        self._schedule_args = {"beta0": beta0, "beta1": beta1, "gamma0": gamma0, "gamma_growth": gamma_growth,
                               "resample_every": resample_every}
        AnnealingSchedule(n_sweeps=n_sweeps or 1, **self._schedule_args)
        if not 1 <= n_blocks <= spec.n_inputs:
            raise ValueError(f"n_blocks must be between 1 and n_inputs={spec.n_inputs}, got {n_blocks}.")
        self._generators = copy_generators(torch.Generator().manual_seed(seed), m)
        self.register_buffer("w", initial_copies(spec.n_inputs, self._generators).to(torch.int8))
        self.init_permutation_copies(n_blocks, bank_size, routing_seed)  # bank_perms, best_copy_index
        self.register_buffer("sweep", torch.zeros((), dtype=torch.long))
        self.register_buffer("teacher", spec.teacher_tensor().to(torch.int8), persistent=False)
        self.__dict__["_annealer"] = None  # built on the first training batch; not a submodule
        self._n_sweeps = n_sweeps
        self.init_members("regression")
        self.copy_scores = nn.ModuleDict({key: CopyScores(m) for key in self.metrics})  # states not saved

    def build_metrics(self) -> dict[str, Metric]:
        """The mean-weight student's and the majority vote's errors on the split's patterns.

        The best copy's and the ``collapsed`` errors come from ``copy_scores`` at epoch end.
        """
        return {"error_mean_weights": torchmetrics.MeanMetric(),
                "error_copy_average": torchmetrics.MeanMetric()}

    def register_loss_term(self, name: str, fn: LossTerm) -> None:
        """Loss terms need gradients; annealing has none, so this refuses them."""
        raise TypeError(f"BinaryPerceptronSA is trained by simulated annealing, without gradients: the"
                        f" loss term {name!r} cannot apply. Use a gradient-trained module (e.g."
                        " MCoverClassifier).")

    # ------------------------------------------------------------------- routing
    def on_permutation_bank_drawn(self, bank: PermutationBank) -> None:
        """The annealer (if built) routes through the new bank from its next sweep."""
        if self._annealer is not None:
            self._annealer.set_permutation_bank(bank)

    # ------------------------------------------------------------------ students
    def copies(self) -> Tensor:
        """The copies ``w (M, N)`` as float64 ``+-1`` on the CPU."""
        return self.w.detach().cpu().to(torch.float64)

    def collapse(self) -> Tensor:
        """The ``mean_weights`` student ``sign(sum_a w_a)`` (ties: copy 0), float64 ``(N,)``."""
        return collapse(self.copies())

    def collapsed_labels(self, x: Tensor) -> Tensor:
        """The ``collapse`` rule's labels ``(B,)`` in ``{-1, +1}`` for patterns ``x``."""
        x = x.to(torch.float64)
        if self.collapse_rule == "best_copy":
            return torch.where(self(x)[:, self.chosen_copy()] > 0, 1.0, -1.0).to(torch.float64)
        if self.collapse_rule == "copy_average":
            return vote_labels(self(x), x @ self.collapse().to(x.device))
        return torch.where(x @ self.collapse().to(x.device) > 0, 1.0, -1.0).to(torch.float64)

    def schedule(self) -> AnnealingSchedule:
        """The annealing schedule (its length fixed by ``n_sweeps`` or by the fit)."""
        if self._n_sweeps is None:
            trainer = self._trainer
            if trainer is None:
                raise RuntimeError("n_sweeps=None takes the schedule length from the Trainer; attach one"
                                   " (trainer.fit) or pass n_sweeps.")
            steps = trainer.estimated_stepping_batches
            if not math.isfinite(steps):
                raise RuntimeError("The fit has no fixed length (max_epochs=-1?); pass n_sweeps for the"
                                   " schedule.")
            self._n_sweeps = int(steps) * self.hparams.sweeps_per_step
        return AnnealingSchedule(n_sweeps=max(self._n_sweeps, 1), **self._schedule_args)

    def _annealer_for(self, x: Tensor, y: Tensor) -> RoutedPerceptronAnnealer:
        if self._annealer is None:
            annealer = RoutedPerceptronAnnealer(x, y, self.n_copies, self.hparams.n_blocks, self.schedule(),
                                                generator=self._generators, bank=self.permutation_bank,
                                                w0=self.copies())
            annealer.load_state_dict({"w": self.copies(), "sweep": int(self.sweep), "accepted": 0,
                                      "generators": [g.get_state() for g in self._generators]})
            self.__dict__["_annealer"] = annealer
        else:
            self._annealer.set_data(x, y)
        return self._annealer

    # --------------------------------------------------------------------- steps
    @override
    def forward(self, x: Tensor) -> Tensor:
        """Fields of every copy (no routing), ``(B, M)``: ``w_a . x / sqrt(N)``."""
        w = self.w.to(device=x.device, dtype=torch.float64)
        return (x.to(torch.float64) @ w.T) / math.sqrt(w.shape[1])

    @override
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        """``sweeps_per_step`` Metropolis sweeps on the batch."""
        x, y = batch["x"].detach().cpu(), batch["y"].detach().cpu()
        annealer = self._annealer_for(x, y)
        accepted = annealer.accepted
        beta, gamma = annealer.schedule.beta(annealer.sweep), annealer.schedule.gamma(annealer.sweep)
        annealer.anneal(self.hparams.sweeps_per_step)
        proposals = self.hparams.sweeps_per_step * self.n_copies * annealer.n
        self.w.copy_(annealer.weights().to(device=self.w.device, dtype=torch.int8))
        self.sweep.fill_(annealer.sweep)
        self.optimizers().step()  # counts the step (global_step); changes nothing
        n = len(y)
        self.log("train/energy", annealer.energy(), prog_bar=True, batch_size=n)
        self.log("train/error_routed", float(annealer.energies().double().mean()) / max(n, 1), batch_size=n)
        self.log("train/beta", beta, batch_size=n)
        self.log("train/gamma", gamma, batch_size=n)
        self.log("train/acceptance", (annealer.accepted - accepted) / proposals, batch_size=n)

    def step(self, batch: dict[str, Tensor], stage: str) -> StepOutput:
        """The copies' fields as member outputs and the mean-weight student's fields (no loss)."""
        x = batch["x"].to(torch.float64)
        return {"member_outputs": self(x), "target": batch["y"].to(torch.float64),
                "mean_weights_fields": x @ self.collapse().to(x.device)}  # type: ignore[typeddict-unknown-key]

    def update_metrics(self, metrics: MetricCollection, out: StepOutput) -> int:
        """Every rule's errors on the batch (the best copy's from every copy's own)."""
        fields, target = out["member_outputs"], out["target"]
        tie_fields = out["mean_weights_fields"]  # type: ignore[typeddict-item]
        mean_weights = torch.where(tie_fields > 0, 1.0, -1.0).to(torch.float64)
        metrics["error_mean_weights"].update((mean_weights != target).to(torch.float64))
        metrics["error_copy_average"].update((vote_labels(fields, tie_fields) != target).to(torch.float64))
        self.copy_scores[f"{metrics.prefix.rstrip('/')}_"].update(
            torch.where(fields > 0, 1.0, -1.0).to(torch.float64) == target[:, None])
        return len(target)

    @override
    def predict_step(self, batch: dict[str, Tensor], batch_idx: int,
                     dataloader_idx: int = 0) -> PredictOutput:
        """``prediction`` (the ``collapse`` rule's label in ``{-1, +1}``) and the copies' fields."""
        x = batch["x"].to(torch.float64)
        return {"prediction": self.collapsed_labels(x), "member_predictions": self(x)}

    @override
    def on_validation_epoch_start(self) -> None:
        """Fresh metric states."""
        super().on_validation_epoch_start()
        self.copy_scores["val_"].reset()

    @override
    def on_test_epoch_start(self) -> None:
        """Fresh metric states."""
        super().on_test_epoch_start()
        self.copy_scores["test_"].reset()

    @override
    def on_validation_epoch_end(self) -> None:
        """Choose the best copy on the split (not in sanity checks); log every rule's errors."""
        scores = self.copy_scores["val_"]
        index = best_copy_index(scores.per_copy()["accuracy"]) if scores.update_called else self.chosen_copy()
        if scores.update_called and not self.trainer.sanity_checking:
            self.best_copy_index.fill_(index)
        self._log_eval("val", index)

    @override
    def on_test_epoch_end(self) -> None:
        """Log every rule's errors; the best copy is the one chosen on validation."""
        self._log_eval("test", self.chosen_copy())

    def logged_metric_names(self, stage: str) -> set[str]:
        """The base module's names plus every rule's errors (``_log_eval``)."""
        names = [f"gen_error_{rule}" for rule in ("mean_weights", "best_copy", "copy_average", "collapsed",
                                                   "copies")]
        names += ["best_copy_index", "error_best_copy", "error_collapsed", "accuracy"]
        return super().logged_metric_names(stage) | {f"{stage}/{name}" for name in names}

    def _log_eval(self, stage: str, index: int) -> None:
        """Generalisation errors (from the teacher) and the split's errors of every rule."""
        teacher, copies = self.teacher.cpu().to(torch.float64), self.copies()
        gen = {"mean_weights": generalization_error(self.collapse(), teacher),
               "best_copy": generalization_error(copies[index], teacher),
               "copy_average": vote_generalization_error(copies, teacher)}
        values = {f"gen_error_{rule}": float(value) for rule, value in gen.items()}
        values |= {"gen_error_collapsed": float(gen[self.collapse_rule]),
                   "gen_error_copies": float(generalization_error(copies, teacher).mean()),
                   "best_copy_index": float(index)}
        for name, value in values.items():
            self.log(f"{stage}/{name}", value, prog_bar=name == "gen_error_collapsed", sync_dist=True)
        scores, metrics = self.copy_scores[f"{stage}_"], self.metrics[f"{stage}_"]
        if not scores.update_called:
            return
        errors = {"best_copy": 1.0 - scores.per_copy()["accuracy"][index],
                  "mean_weights": metrics["error_mean_weights"].compute(),
                  "copy_average": metrics["error_copy_average"].compute()}
        self.log(f"{stage}/error_best_copy", errors["best_copy"].float(), sync_dist=True)
        self.log(f"{stage}/error_collapsed", errors[self.collapse_rule].float(), sync_dist=True)
        self.log(f"{stage}/accuracy", 1.0 - errors[self.collapse_rule].float(), sync_dist=True)

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """A no-op optimiser, stepped once per training step.

        The copies change by Metropolis moves only, but Lightning counts ``global_step`` in
        optimiser steps, and checkpointing, logging and ``RoutingResampler`` rely on it.
        """
        return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)

    # -------------------------------------------------------------- checkpoints
    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store the copies' generator states (the copies, sweep and bank are buffers)."""
        super().on_save_checkpoint(checkpoint)
        checkpoint["perceptron_generators"] = [g.get_state() for g in self._generators]
        checkpoint["perceptron_n_sweeps"] = self._n_sweeps

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the generator states; the annealer is rebuilt from the buffers on the next batch.

        Checkpoints from before ``best_copy_index`` existed load with no copy chosen.
        """
        super().on_load_checkpoint(checkpoint)
        self.default_best_copy_index(checkpoint)
        for g, state in zip(self._generators, checkpoint.get("perceptron_generators", []), strict=False):
            g.set_state(state)
        if checkpoint.get("perceptron_n_sweeps") is not None:
            self._n_sweeps = int(checkpoint["perceptron_n_sweeps"])
        self.__dict__["_annealer"] = None
