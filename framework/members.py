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

What else a callback reads from a module is declared here too, one runtime-checkable protocol
per capability (``TaskModel``, ``OutputAffineModel``, ``PredictionFrameModel``,
``LossTermsModel``, ``CopyParametersModel``, ``CollapseParametersModel``,
``PermutationBankModel``). A callback that needs one checks it in ``setup`` with
``require_capability``, which stops the run before training with one line naming the
callback, the capability, the module's class and the fix; an optional one (the callback's
docstring says what it does without it) is read with ``isinstance``.

Example:
    >>> import torch
    >>> logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])  # one row, two members
    >>> member_probabilities(logits, "logits").mean(1)
    tensor([[0.5000, 0.5000]])
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, NotRequired, Protocol, TypedDict, get_args, runtime_checkable

import torch
from torch import Tensor

from ripieno.framework.errors import RipienoInputError

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


# ---------------------------------------------------------------- capabilities
# What callbacks read from a module, one protocol per capability. A callback checks the ones it needs in
# ``setup`` (``require_capability``), so a module without one stops before training with one line.


class MissingCapabilityError(RipienoInputError, TypeError):
    """A callback needs a module capability that the module lacks; the message names both and the fix."""


@runtime_checkable
class MemberModel(Protocol):
    """Member outputs: steps return ``StepOutput`` and ``member_output_kind`` says how to read it.

    Needed by ``DiversityMonitor`` and ``TemperatureScaling`` with ``output_kind="auto"``.
    """

    member_output_kind: MemberOutputKind


@runtime_checkable
class TaskModel(Protocol):
    """A module that names its task: ``multiclass``, ``binary`` or ``regression``.

    The posterior samplers read it with ``likelihood="auto"``; a module without it is read as
    a classifier (the samplers say so in the log), so a regression module sets it or the
    sampler's ``likelihood``.
    """

    task: str


@runtime_checkable
class OutputAffineModel(Protocol):
    """Regression outputs in standardised units: ``output_affine = (scale, shift)`` maps them to the target's.

    Optional for the posterior samplers: a module without it is in the target's units.
    """

    output_affine: tuple[float, float]


@runtime_checkable
class PredictionFrameModel(Protocol):
    """A named prediction table: ``prediction_frame(member_predictions) -> pandas.DataFrame``.

    Optional for ``MemberPredictionWriter``: without it the CSV has the ``prediction`` columns only.
    """

    def prediction_frame(self, members: Tensor) -> Any:  # noqa: ANN401  (a pandas DataFrame)
        """One row per prediction, with named columns."""
        ...


@runtime_checkable
class LossTermsModel(Protocol):
    """The loss-term extension point (``ripieno.framework.methods.loss_terms.LossTermsMixin``).

    Needed by ``GeoReg`` and ``ReplicaCoupling``.
    """

    def register_loss_term(self, name: str, fn: Any) -> None:  # noqa: ANN401
        """Add ``fn(module, batch, step_output)`` to every training loss."""
        ...

    def remove_loss_term(self, name: str) -> None:
        """Stop adding the term ``name``."""
        ...


@runtime_checkable
class CopyParametersModel(Protocol):
    """M model copies: ``copy_parameters()`` lists parameters with the copies on axis 0.

    Needed (on the module or its ``net``) by ``ReplicaCoupling`` and ``ElasticAveraging``.
    """

    def copy_parameters(self) -> Any:  # noqa: ANN401  (an iterable of tensors)
        """The copy-stacked parameters."""
        ...


@runtime_checkable
class CollapseParametersModel(Protocol):
    """A collapsed predictor a callback can install: ``set_collapse_parameters(parameters)``.

    Needed by ``ElasticAveraging`` (its centre is the collapsed predictor).
    """

    def set_collapse_parameters(self, parameters: list[Tensor] | None) -> None:
        """Install ``parameters`` (``None``: the copies' mean)."""
        ...


@runtime_checkable
class PermutationBankModel(Protocol):
    """M-cover routing: a ``permutation_bank`` in force and ``draw_permutation_bank(generator)``.

    Needed (on the module or a submodule) by ``RoutingResampler``;
    ``ripieno.framework.mcover.copies.PermutationCopiesMixin`` provides it.
    """

    @property
    def permutation_bank(self) -> Any:  # noqa: ANN401  (a PermutationBank)
        """The bank in force."""
        ...

    def draw_permutation_bank(self, generator: torch.Generator) -> None:
        """Draw a new bank with ``generator`` and install it."""
        ...


def capability_members(capability: type) -> list[str]:
    """The attribute and method names a capability protocol declares.

    Example:
        >>> capability_members(PermutationBankModel)
        ['draw_permutation_bank', 'permutation_bank']
    """
    names = set(getattr(capability, "__annotations__", {}))
    names |= {name for name in vars(capability) if not name.startswith("_")}
    return sorted(names)


def require_capability(callback: object | str, module: object, capability: type, fix: str,
                       within: Iterable[object] | None = None) -> Any:  # noqa: ANN401
    """The first of ``within`` (default: ``module`` alone) that has ``capability``, else a one-line error.

    Args:
        callback: the callback that needs it (its class, or this string, names it in the message).
        module: the LightningModule (its class names it in the message).
        capability: a runtime-checkable protocol of this module.
        fix: how to provide it, e.g. ``"mix in LossTermsMixin"``.
        within: where to look (e.g. ``module.modules()``); default ``[module]``.

    Raises:
        MissingCapabilityError: none has it; the message reads ``<Callback> needs the <Capability>
            capability (<members>), which <Module> lacks (missing: <names>); <fix>.``

    Example:
        >>> class Plain:
        ...     pass
        >>> try:
        ...     require_capability(object(), Plain(), TaskModel, "set task = 'regression'")
        ... except MissingCapabilityError as error:
        ...     print(error)
        object needs the TaskModel capability (task), which Plain lacks (missing: task); set task =
        'regression'.
    """
    candidates = [module] if within is None else [c for c in within if c is not None]
    for candidate in candidates:
        if isinstance(candidate, capability):
            return candidate
    members = capability_members(capability)
    owner = callback if isinstance(callback, str) else type(callback).__name__
    missing = [name for name in members if not hasattr(module, name)] or members
    raise MissingCapabilityError(
        f"{owner} needs the {capability.__name__} capability ({', '.join(members)}), which"
        f" {type(module).__name__} lacks (missing: {', '.join(missing)}); {fix.rstrip('.')}.")


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
