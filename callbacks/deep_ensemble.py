"""DeepEnsembleSampler: independently trained networks as the members of a predictive.

Deep ensembles (Lakshminarayanan et al., 2017) need M separate trainings, so this
callback does not train: it loads M checkpoints of the same LightningModule class
(trained with different seeds, e.g. ``ripieno fit ... --seed_everything=k``) and uses
their outputs as the S = M members ``(B, M, C)`` that ``PosteriorPredictiveCallback``
evaluates. The module under test only provides the class and the device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch

from ripieno.callbacks.posterior_predictive import PosteriorPredictiveCallback
from ripieno.callbacks.sampler_evaluation import (
    DEFAULT_EVALUATION,
    MOVED_ARGUMENTS,
    SamplerEvaluation,
    evaluation_with_moved,
)
from ripieno.callbacks.sampler_settings import SamplerSettingError, setting_error
from ripieno.framework.checkpoint_file import read_checkpoint
from ripieno.framework.uq.linearization import call_model


class MissingMemberError(SamplerSettingError, FileNotFoundError):
    """A member checkpoint of a ``DeepEnsembleSampler`` is not on disk (one line: which, and the fix)."""


class DeepEnsembleSampler(PosteriorPredictiveCallback):
    """Evaluate M trained checkpoints as one ensemble.

    Args:
        checkpoints: paths of M >= 2 checkpoints of the tested module's class.
        evaluation: how samples are read and scored, the same for every sampler
            (``SamplerEvaluation``: likelihood, noise variance, batch keys, OOD loader,
            temperature). The flat arguments of earlier releases still work, with a warning.
    """

    #: The flat arguments of earlier releases and their place in ``evaluation`` (a recipe file's load
    #: regroups them, with a warning).
    MOVED_ARGUMENTS: ClassVar[dict[str, str]] = MOVED_ARGUMENTS

    def __init__(
        self,
        checkpoints: list[str],
        *,
        evaluation: SamplerEvaluation = DEFAULT_EVALUATION,
        **moved: Any,
    ) -> None:
        self.evaluation = evaluation_with_moved(type(self).__name__, evaluation, moved)
        super().__init__(**self.evaluation.callback_kwargs())
        if len(checkpoints) < 2:
            raise setting_error(type(self).__name__, "checkpoints", checkpoints,
                                f"a deep ensemble needs at least 2 checkpoints (its members), got"
                                f" {len(checkpoints)}, as the predictive uncertainty is their spread",
                                "train the module with 2 or more seeds and list every checkpoint")
        missing = [c for c in checkpoints if not Path(c).is_file()]
        if missing:
            error = setting_error(type(self).__name__, "checkpoints", missing, "these files do not exist",
                                  "train the members first, or check the paths")
            raise MissingMemberError(str(error))
        self.checkpoints = list(checkpoints)
        self.members: list[L.LightningModule] = []

    def prepare(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Load the members (in eval mode, on the module's device)."""
        cls = type(pl_module)
        for path in self.checkpoints:  # a missing or damaged member file is named, with the fix
            read_checkpoint(path, option="DeepEnsembleSampler(checkpoints=...)")
        self.members = [
            cls.load_from_checkpoint(path, map_location=pl_module.device, weights_only=True).eval()
            for path in self.checkpoints]
        self.likelihood = self.resolve_likelihood(pl_module)
        if self.likelihood == "regression":
            self.noise_variance = float(self.regression_noise_variance(trainer, pl_module) or 1.0)

    @torch.no_grad()
    def sample(self, pl_module: L.LightningModule, batch: Any) -> torch.Tensor:  # noqa: ANN401
        """Member outputs ``(B, M, C)``."""
        inputs = self.input_fn(pl_module)(batch)
        outs = [call_model(member, inputs).float() for member in self.members]
        out = torch.stack(outs, dim=1)
        return out.reshape(out.shape[0], len(self.members), -1)
