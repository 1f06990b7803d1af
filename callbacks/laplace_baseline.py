"""LaplaceSampler: a Laplace-approximation baseline through ``laplace-torch`` (optional).

After ``fit`` (or before ``test``/``predict`` when no fit ran in this process) the
callback builds ``laplace.Laplace`` around the trained module (last-layer or all
weights; Kronecker-factored, full or diagonal GGN), fits it on the datamodule's
training data, optionally tunes the prior precision by the marginal likelihood, and
draws S samples of the linearised (``pred_type="glm"``) predictive per batch:

* classification: ``Laplace.predictive_samples`` gives softmax *probabilities*; the
  callback returns their logarithms (clamped at the smallest positive float) as the
  "logits" the base class expects, so its softmax recovers the probabilities exactly;
* regression: S draws from ``N(f_mu, f_var)``, the GLM functional mean and covariance
  ``laplace`` returns for ``la(x, pred_type="glm")``; the observation noise
  ``sigma^2`` is added by the base class's metrics.

Draws use the callback's own generator, seeded by ``seed`` and the batch count, which
restarts with every test/predict run. ``laplace-torch`` is an optional dependency
(``pip install laplace-torch==0.3``, or the ``laplace`` extra); it is imported lazily
in ``prepare``. The module must take a single tensor input (``laplace`` feeds ``X``
tensors); a binary single-logit model is not supported (use two logits).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal

import lightning as L
import torch
from torch import Tensor, nn
from typing_extensions import override

from ripieno.callbacks.posterior_predictive import PosteriorPredictiveCallback, plain_copy
from ripieno.callbacks.sampler_evaluation import (
    DEFAULT_EVALUATION,
    MOVED_ARGUMENTS,
    SamplerEvaluation,
    evaluation_with_moved,
)
from ripieno.callbacks.sampler_settings import (
    check_choice,
    check_n_samples,
    check_positive,
    setting_error,
)
from ripieno.framework.messages import get_logger
from ripieno.framework.uq.linearization import find_last_linear

log = get_logger(__name__)


INSTALL_HINT = "pip install 'laplace-torch==0.3'"


class _TensorInputModel(nn.Module):
    """The module called on one tensor, with 2-D ``(B, C)`` output as ``laplace`` needs."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Tensor) -> Tensor:
        """``module(x)`` reshaped to ``(B, C)``."""
        out = self.module(x)
        return out if out.ndim == 2 else out.reshape(out.shape[0], -1)


class _XYLoader:
    """A dataloader re-yielding ripieno batches as the ``(X, y)`` tuples ``laplace`` reads.

    ``laplace`` reads ``len(loader.dataset)`` for the data-set size N.
    """

    def __init__(self, loader: Any, to_xy: Callable[[Any], tuple[Tensor, Tensor]]) -> None:  # noqa: ANN401
        self.loader, self.to_xy, self.dataset = loader, to_xy, loader.dataset

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return (self.to_xy(batch) for batch in self.loader)

    def __len__(self) -> int:
        return len(self.loader)


class LaplaceSampler(PosteriorPredictiveCallback):
    """Fit a ``laplace-torch`` Laplace approximation after training; evaluate and predict.

    Logged on test, under ``uq/test/``: as ``PosteriorPredictiveCallback``.

    Args:
        subset_of_weights: ``last_layer`` or ``all``.
        hessian_structure: ``kron``, ``full`` or ``diag``.
        last_layer_name: module name (in the LightningModule) of the last linear layer
            for ``last_layer`` (default: its last ``nn.Linear``).
        n_samples: predictive samples S (at least 2: the uncertainty is their spread).
        prior_precision: prior precision, or its initial value when optimised.
        optimize_prior: tune the prior precision by the Laplace marginal likelihood
            (``optimize_prior_precision(pred_type="glm", method="marglik")``).
        prior_structure: structure of the tuned prior precision: ``scalar``,
            ``layerwise`` or (not with ``kron``) ``diag``.
        evaluation: how samples are read and scored, the same for every sampler
            (``SamplerEvaluation``: likelihood, noise variance, batch keys, OOD loader,
            temperature). The flat arguments of earlier releases still work, with a warning.
        seed: seed of the sampler's own generator.
        progress_bar: show laplace-torch's progress bars over the curvature fit and the prior
            tuning (default: when the trainer shows its own, on rank 0).
    """

    #: The flat arguments of earlier releases and their place in ``evaluation`` (a recipe file's load
    #: regroups them, with a warning).
    MOVED_ARGUMENTS: ClassVar[dict[str, str]] = MOVED_ARGUMENTS

    def __init__(
        self,
        subset_of_weights: Literal["last_layer", "all"] = "last_layer",
        *,
        hessian_structure: Literal["kron", "full", "diag"] = "kron",
        last_layer_name: str | None = None,
        n_samples: int = 10,
        prior_precision: float = 1.0,
        optimize_prior: bool = True,
        prior_structure: Literal["scalar", "layerwise", "diag"] = "scalar",
        seed: int = 0,
        progress_bar: bool | None = None,
        evaluation: SamplerEvaluation = DEFAULT_EVALUATION,
        **moved: Any,
    ) -> None:
        self.evaluation = evaluation_with_moved(type(self).__name__, evaluation, moved)
        super().__init__(**self.evaluation.callback_kwargs(),
                         likelihoods=("auto", "regression", "classification"))
        self.progress_bar = progress_bar
        owner = type(self).__name__
        check_choice(owner, "subset_of_weights", subset_of_weights, ("last_layer", "all"))
        check_choice(owner, "hessian_structure", hessian_structure, ("kron", "full", "diag"))
        check_choice(owner, "prior_structure", prior_structure, ("scalar", "layerwise", "diag"))
        if optimize_prior and hessian_structure == "kron" and prior_structure == "diag":
            raise setting_error(owner, "prior_structure", prior_structure,
                                "a Kronecker-factored Laplace takes a scalar or layerwise prior precision",
                                "use prior_structure='scalar' or 'layerwise', or another hessian_structure")
        check_n_samples(owner, n_samples)
        check_positive(owner, "prior_precision", prior_precision, "it is the Gaussian prior's precision"
                       " (or its initial value when tuned)")
        self.subset_of_weights, self.hessian_structure = subset_of_weights, hessian_structure
        self.last_layer_name, self.n_samples = last_layer_name, n_samples
        self.prior_precision, self.optimize_prior = prior_precision, optimize_prior
        self.prior_structure, self.seed = prior_structure, seed
        self.la: Any = None
        #: the prior precision of the fitted approximation (after tuning), on CPU.
        self.fitted_prior_precision: Tensor | None = None
        self._calls = 0

    @property
    @override
    def state_key(self) -> str:
        return self._generate_state_key(subset_of_weights=self.subset_of_weights,
                                        hessian_structure=self.hessian_structure)

    # ------------------------------------------------------------------ helpers
    def _input(self, batch: Any, device: torch.device) -> Tensor:  # noqa: ANN401
        x = self.model_input(batch)
        if not isinstance(x, Tensor):
            raise TypeError(f"LaplaceSampler needs a single tensor model input, got {type(x).__name__};"
                            " laplace-torch feeds the network one tensor X.")
        return plain_copy(x).to(device)

    def _to_xy(self, device: torch.device) -> Callable[[Any], tuple[Tensor, Tensor]]:
        def to_xy(batch: Any) -> tuple[Tensor, Tensor]:  # noqa: ANN401
            x, y = self._input(batch, device), plain_copy(self.target(batch)).to(device)
            if self.likelihood == "regression":
                y = y.float()
                return x, y.unsqueeze(-1) if y.ndim == 1 else y
            return x, y.long()
        return to_xy

    @staticmethod
    def _eval_modes(module: nn.Module) -> list[tuple[nn.Module, bool]]:
        modes = [(m, m.training) for m in module.modules()]
        module.eval()
        return modes

    @staticmethod
    def _restore_modes(modes: list[tuple[nn.Module, bool]]) -> None:
        for m, flag in modes:
            m.train(flag)

    # ------------------------------------------------------------------ fitting
    def prepare(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Build and fit the Laplace approximation on the training data.

        Raises:
            ImportError: if ``laplace-torch`` is not installed.
            ValueError: for a binary (single-logit) likelihood.
            RuntimeError: without a datamodule that has a train_dataloader.
        """
        try:
            from laplace import Laplace
        except ImportError as err:
            raise ImportError(f"LaplaceSampler needs laplace-torch, an optional dependency: {INSTALL_HINT}"
                              " (or install ripieno's 'laplace' extra).") from err
        likelihood = self.resolve_likelihood(pl_module)
        if likelihood == "binary":
            raise ValueError("LaplaceSampler supports softmax classification and regression, not a binary"
                             " single logit; give the model two output logits (task=multiclass).")
        loader = trainer.datamodule.train_dataloader() if trainer.datamodule is not None else None
        if loader is None:
            raise RuntimeError("LaplaceSampler needs a datamodule with a train_dataloader.")
        self.likelihood = likelihood
        device = pl_module.device
        kwargs: dict[str, Any] = {"prior_precision": self.prior_precision}
        if self.subset_of_weights == "last_layer":
            kwargs["last_layer_name"] = "module." + find_last_linear(pl_module, self.last_layer_name)[0]
        with torch.inference_mode(False), torch.enable_grad():
            if likelihood == "regression":
                noise = self.regression_noise_variance(trainer, pl_module, loader,
                                                       lambda b: self._input(b, device))
                kwargs["sigma_noise"] = float(noise) ** 0.5  # type: ignore[arg-type]  (a loader is given)
            modes = self._eval_modes(pl_module)
            try:
                la = Laplace(_TensorInputModel(pl_module), likelihood,
                             subset_of_weights=self.subset_of_weights,
                             hessian_structure=self.hessian_structure, **kwargs)
                progress = self.show_progress(trainer, self.progress_bar)
                la.fit(_XYLoader(loader, self._to_xy(device)), progress_bar=progress)
                if self.optimize_prior:
                    with warnings.catch_warnings():
                        warnings.filterwarnings("ignore", message=".*link_approx.*")
                        la.optimize_prior_precision(pred_type="glm", method="marglik",
                                                    init_prior_prec=self.prior_precision,
                                                    prior_structure=self.prior_structure,
                                                    progress_bar=progress)
            finally:
                self._restore_modes(modes)
        self.la = la
        self.fitted_prior_precision = la.prior_precision.detach().cpu().clone()
        if likelihood == "regression":
            self.noise_variance = float(la.sigma_noise) ** 2
        log.info(f"LaplaceSampler: {type(la).__name__} fitted, prior precision"
                 f" {self.fitted_prior_precision.flatten()[:4].tolist()}")

    def __getstate__(self) -> dict[str, Any]:
        """Picklable state for ``ddp_spawn``.

        laplace-torch's fitted object holds forward hooks that do not pickle, so it stays
        behind; each process refits it before its first test/predict batch, on the training
        data in a fixed order, which gives every rank the same approximation.
        """
        state = self.__dict__.copy()
        state["la"] = None
        return state

    def is_stale(self, pl_module: L.LightningModule) -> bool:
        """Whether the module's weights differ from those the approximation was fitted at."""
        if self.la is None:
            return True
        current = [p.detach() for p in pl_module.parameters() if p.requires_grad]
        if self.subset_of_weights == "all":  # laplace holds the live module and its MAP vector
            flat = torch.cat([p.reshape(-1) for p in current]).to(self.la.mean)
            return not torch.equal(flat, self.la.mean)
        fitted = [p.detach() for p in self.la.model.model.module.parameters() if p.requires_grad]
        return len(fitted) != len(current) or not all(
            torch.equal(a.to(b.device), b) for a, b in zip(fitted, current, strict=True))

    # ----------------------------------------------------------------- sampling
    @override
    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_test_start(trainer, pl_module)
        self._calls = 0  # every test run draws the same samples

    @override
    def on_predict_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_predict_start(trainer, pl_module)
        self._calls = 0  # every predict run draws the same samples

    def generator(self, calls: int, device: torch.device) -> torch.Generator:
        """The generator of the ``calls``-th ``sample`` call of a run (1-based)."""
        return torch.Generator(device=device).manual_seed(self.seed * 1_000_003 + calls)

    def sample(self, pl_module: L.LightningModule, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """S GLM-predictive samples, ``(B, S, C)``: log-probabilities or regression means."""
        if self.la is None:
            raise RuntimeError("LaplaceSampler is not prepared; run fit, test or predict first.")
        la = self.la
        device = la._device
        self._calls += 1
        generator = self.generator(self._calls, device)
        with torch.inference_mode(False), torch.enable_grad():
            x = self._input(batch, device)
            modes = self._eval_modes(pl_module)  # 'all' runs the live module
            try:
                if self.likelihood == "regression":
                    f_mu, f_var = la(x, pred_type="glm")  # (B, C), (B, C, C)
                else:
                    probs = la.predictive_samples(x, pred_type="glm", n_samples=self.n_samples,
                                                  generator=generator)  # (S, B, C)
            finally:
                self._restore_modes(modes)
        if self.likelihood == "regression":
            f_mu, f_var = f_mu.detach().double(), f_var.detach().double()
            evals, evecs = torch.linalg.eigh(f_var)
            root = evecs * evals.clamp(min=0).sqrt().unsqueeze(-2)  # root @ root^T = f_var
            z = torch.randn((f_mu.shape[0], self.n_samples, f_mu.shape[1]), generator=generator,
                            device=device, dtype=torch.float64)
            return (f_mu.unsqueeze(1) + torch.einsum("bij,bsj->bsi", root, z)).float()
        probs = probs.detach().float()
        return probs.clamp(min=torch.finfo(probs.dtype).tiny).log().permute(1, 0, 2).contiguous()
