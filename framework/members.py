"""The member protocol: how every ripieno model reports its several predictions.

Every method here makes several predictions from one model: ensemble members (LoMETab,
TabM, deep ensembles), model copies (M-cover), posterior samples (LL-GLM, SWAG,
MC-dropout) or, for single-network modules, one member. They all use one shape:

* a step (training, validation, test) returns a dict, ``StepOutput``, with
  ``member_outputs`` shaped ``(batch, members, ...)``, the batch's ``target`` and, where
  the module has one, ``features`` (an embedding of each row, e.g. LOES's fused layers);
* the module says how to read ``member_outputs`` with ``member_output_kind``:
  ``logits`` (``(B, M, C)`` class logits), ``binary_logits`` (``(B, M, 1)`` logit of the
  positive class) or ``regression`` (``(B, M)`` or ``(B, M, 1)`` values in the modelled
  target's units);
* reductions live here: the model's prediction is the mean of member *probabilities*
  (classification) or member outputs (regression), and the training loss is the mean of
  per-member losses;
* ``predict_step`` returns ``prediction`` (``(B, C)`` probabilities, or ``(B,)`` values in
  the target's original units) and ``member_predictions`` (``(B, M, C)`` or ``(B, M)``).

Because of this one shape, ``DiversityMonitor``, the UQ metrics and
``MemberPredictionWriter`` serve every method, and a user's own LightningModule joins by
returning the same keys and setting ``member_output_kind``.

Example:
    >>> import torch
    >>> logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])  # one row, two members
    >>> member_probabilities(logits, "logits").mean(1)
    tensor([[0.5000, 0.5000]])
"""

from __future__ import annotations

from typing import Literal, NotRequired, Protocol, TypedDict, get_args, runtime_checkable

import torch
from torch import Tensor

MemberOutputKind = Literal["logits", "binary_logits", "regression"]
MEMBER_OUTPUT_KINDS: tuple[str, ...] = get_args(MemberOutputKind)


class StepOutput(TypedDict):
    """What a training, validation or test step returns.

    ``loss`` is missing where a step has none (gradient-free training, an OOD batch).
    """

    loss: NotRequired[Tensor]
    member_outputs: Tensor
    target: Tensor
    features: NotRequired[Tensor]


class PredictOutput(TypedDict):
    """What ``predict_step`` returns; modules may add their own keys (``features``, ...)."""

    prediction: Tensor
    member_predictions: Tensor


@runtime_checkable
class MemberModel(Protocol):
    """A model whose steps return ``StepOutput`` and that says how to read it."""

    member_output_kind: MemberOutputKind


def member_output_kind_of_task(task: str) -> MemberOutputKind:
    """The kind of a task's member outputs: ``multiclass`` -> ``logits``, ``binary`` -> ``binary_logits``."""
    return {"multiclass": "logits", "binary": "binary_logits"}.get(task, "regression")  # type: ignore[return-value]


def check_member_output_kind(kind: str) -> MemberOutputKind:
    """``kind`` if it is one of ``MEMBER_OUTPUT_KINDS``, else a ``ValueError`` naming them."""
    if kind not in MEMBER_OUTPUT_KINDS:
        raise ValueError(f"member_output_kind must be one of {MEMBER_OUTPUT_KINDS}, got {kind!r}.")
    return kind  # type: ignore[return-value]


def member_probabilities(member_outputs: Tensor, kind: MemberOutputKind) -> Tensor:
    """Per-member class probabilities ``(B, M, C)`` (float32) of classification outputs.

    Args:
        member_outputs: ``(B, M, C)`` logits, or ``(B, M, 1)`` binary logits.
        kind: ``logits`` or ``binary_logits``.
    """
    with torch.autocast(member_outputs.device.type, enabled=False):
        x = member_outputs.float()
        if kind == "binary_logits":
            p1 = torch.sigmoid(x[..., 0])
            return torch.stack([1 - p1, p1], dim=-1)
        if kind == "logits":
            return torch.softmax(x, dim=-1)
    raise ValueError(f"member_probabilities needs classification outputs, got kind {kind!r}.")


def member_values(member_outputs: Tensor) -> Tensor:
    """Regression member outputs as ``(B, M)`` float32 (a trailing axis of 1 is dropped)."""
    x = member_outputs.float()
    return x[..., 0] if x.ndim == 3 and x.shape[-1] == 1 else x


def member_predictions(member_outputs: Tensor, kind: MemberOutputKind) -> Tensor:
    """Probabilities ``(B, M, C)`` for classification, values ``(B, M)`` for regression."""
    if kind == "regression":
        return member_values(member_outputs)
    return member_probabilities(member_outputs, kind)
