"""``SamplerEvaluation``: how every post-hoc sampler reads batches and scores its predictive, declared once.

The five samplers (``LastLayerSampler``, ``MCDropoutSampler``, ``SWAGSampler``, ``LaplaceSampler``,
``DeepEnsembleSampler``) differ in how they draw their samples and agree on everything after: which
batch keys hold the inputs and targets, the likelihood, the regression noise, the OOD test loader,
VARROC's predicted class and the temperature. Those seven settings are this one group, the
sampler's ``evaluation`` argument, as ``LayerEmbeddingDataModule`` groups its settings.

In a recipe::

    - class_path: ripieno.callbacks.MCDropoutSampler
      init_args:
        n_samples: 10
        evaluation: {ood_dataloader_idx: 1, input_key: [x_num, x_cat]}

The flat arguments of earlier releases (``ood_dataloader_idx: 1`` beside ``n_samples``) still load
from a recipe file and still work in Python, each with a ``RipienoDeprecationWarning`` naming
``evaluation.<name>`` (removed in ripieno 0.3.0); every sampler lists them in ``MOVED_ARGUMENTS``.

Example:
    >>> from ripieno.callbacks import MCDropoutSampler
    >>> sampler = MCDropoutSampler(n_samples=4, evaluation=SamplerEvaluation(input_key=["x_num", "x_cat"]))
    >>> sampler.input_key, sampler.evaluation.likelihood
    (['x_num', 'x_cat'], 'auto')
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

from ripieno.callbacks.temperature_scaling import (
    TemperatureScaling,  # at run time: jsonargparse reads the hint
)
from ripieno.framework.errors import fold_flat_arguments


@dataclass(frozen=True)
class SamplerEvaluation:
    """The settings every post-hoc sampler shares (module docstring).

    Attributes:
        likelihood: ``auto`` (from the module's ``task``), ``regression``, ``classification`` or
            ``binary`` (``LaplaceSampler``: not ``binary``).
        noise_variance: regression noise ``sigma^2``; ``None`` estimates it as the mean squared
            training residual.
        input_key: key of the model input in dict batches (tuples use element 0); a list of keys
            passes a dict of them (e.g. ``[input_ids, attention_mask]``).
        target_key: key of the target in dict batches (tuples use element 1).
        ood_dataloader_idx: index of a test dataloader holding OOD inputs (they feed ``varroc_ood``).
        varroc_prediction: whose argmax is VARROC's predicted class: ``predictive_mean`` or ``map``
            (the trained network alone).
        temperature: divide sampled logits by this before the softmax: a float ``> 0``, a
            ``TemperatureScaling`` callback, ``"callback"`` (the one in the trainer's callbacks) or
            ``None``.
    """

    likelihood: Literal["auto", "regression", "classification", "binary"] = "auto"
    noise_variance: float | None = None
    input_key: str | list[str] = "x"
    target_key: str = "y"
    ood_dataloader_idx: int | None = None
    varroc_prediction: Literal["predictive_mean", "map"] = "predictive_mean"
    temperature: float | TemperatureScaling | Literal["callback"] | None = None

    def callback_kwargs(self) -> dict[str, Any]:
        """The settings as ``PosteriorPredictiveCallback``'s keyword arguments."""
        return {field.name: getattr(self, field.name) for field in fields(self)}


#: The defaults (every sampler's ``evaluation`` default; frozen, so one instance serves all).
DEFAULT_EVALUATION = SamplerEvaluation()
#: The evaluation settings' names, each once a flat argument of every sampler.
EVALUATION_FIELDS: tuple[str, ...] = tuple(field.name for field in fields(SamplerEvaluation))
#: ``{flat name: "evaluation.<name>"}``: what a recipe file's old flat keys become when it loads.
MOVED_ARGUMENTS: dict[str, str] = {name: f"evaluation.{name}" for name in EVALUATION_FIELDS}


def evaluation_with_moved(owner: str, evaluation: SamplerEvaluation | dict[str, Any] | None,
                          moved: dict[str, Any]) -> SamplerEvaluation:
    """``evaluation`` with the flat keyword arguments of earlier releases folded in, each warned about.

    Args:
        owner: the sampler's class name (for the messages).
        evaluation: the group given, as a ``SamplerEvaluation`` or a dict of its fields (a recipe's
            ``init_args`` read in Python), or ``None`` (the defaults).
        moved: the keyword arguments the sampler did not take itself.

    Returns:
        The evaluation settings.

    Raises:
        TypeError: a keyword that is neither the sampler's nor a moved evaluation setting, as Python
            says for any unexpected keyword.
        ValueError: a setting given both flat and in ``evaluation``.
    """
    evaluation = SamplerEvaluation() if evaluation is None else evaluation
    if isinstance(evaluation, dict):
        evaluation = SamplerEvaluation(**evaluation)
    unknown = [name for name in moved if name not in MOVED_ARGUMENTS]
    if unknown:
        raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
    return fold_flat_arguments(owner, "evaluation", evaluation, DEFAULT_EVALUATION,
                               {name: (name, value) for name, value in moved.items()}, stacklevel=3)
