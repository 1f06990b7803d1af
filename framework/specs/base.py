"""DataSpec: the base of every data spec, owning its serialisation and coercion.

A data spec is a dataclass that a datamodule fills once its data is prepared and a module
sizes itself from (the ripieno CLI links ``data.spec`` into ``model.data_spec``). Modules
keep it in their hyperparameters and checkpoints, so its stored form is plain Python:
``to_dict`` turns tuples into lists (YAML-friendly, ``torch.load(weights_only=True)``-safe)
and ``coerce`` takes the spec or that dict back.

Fitted state (a tabular spec's preprocessing and bin edges) is large and not a
hyperparameter: a spec names those fields in ``fitted_fields``; ``hparams_dict`` leaves them
out (adding ``fitted_digest``, a short hash, so two specs fitted on other rows still
differ), ``fitted_state`` returns them for the checkpoint, and ``with_fitted_state`` puts
them back.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, ClassVar, TypeVar

from ripieno.framework.errors import RipienoInputError

SpecT = TypeVar("SpecT", bound="DataSpec")

FITTED_STATE_KEY = "ripieno_data_spec_fitted"
"""Checkpoint key of a module's fitted data state (``DataSpec.fitted_state``)."""
DIGEST_KEY = "fitted_digest"
"""Key of ``hparams_dict`` that fingerprints the fitted state left out of it."""


class DataSpecError(RipienoInputError):
    """Raised for a spec whose values break an invariant a module relies on."""


def plain(value: Any) -> Any:  # noqa: ANN401
    """``value`` with every tuple turned into a list, recursively (dicts and lists walked).

    Example:
        >>> plain({"shape": (3, 8, 8), "bins": [(0.0, 1.0)]})
        {'shape': [3, 8, 8], 'bins': [[0.0, 1.0]]}
    """
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


class DataSpec:
    """Serialisation and coercion of a dataclass data spec; subclasses are ``@dataclass``.

    Attributes:
        fitted_fields: fields holding fitted state (kept out of ``hparams_dict``, saved by
            the module in its checkpoint under ``FITTED_STATE_KEY``).

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class PointSpec(DataSpec):
        ...     n_features: int
        ...     shape: tuple[int, int] = (2, 2)
        >>> PointSpec(3).to_dict()
        {'n_features': 3, 'shape': [2, 2]}
        >>> PointSpec.coerce({"n_features": 3, "shape": [2, 2]}).n_features
        3
    """

    fitted_fields: ClassVar[tuple[str, ...]] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form, fitted state included (lists, no tuples)."""
        return plain(dataclasses.asdict(self))  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[SpecT], value: dict[str, Any]) -> SpecT:
        """The spec ``to_dict`` or ``hparams_dict`` described (``fitted_digest`` is dropped)."""
        return cls(**{key: item for key, item in value.items() if key != DIGEST_KEY})

    @classmethod
    def coerce(cls: type[SpecT], value: SpecT | dict[str, Any]) -> SpecT:
        """Accept a spec or its dict form.

        Raises:
            TypeError: for anything else, naming the class and what to pass.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            return cls.from_dict(value)
        raise TypeError(f"data_spec must be a {cls.__name__} or dict, got {type(value).__name__}; pass"
                        " datamodule.spec (the ripieno CLI links it for you).")

    # ------------------------------------------------------------------ fitted state
    def fitted_state(self) -> dict[str, Any]:
        """The fitted fields that are set, as plain Python (empty when none is)."""
        full = self.to_dict()
        return {name: full[name] for name in self.fitted_fields if full[name] is not None}

    def hparams_dict(self) -> dict[str, Any]:
        """What hyperparameters and loggers keep: ``to_dict`` without the fitted fields.

        Fitted fields kept by a subclass's ``fitted_state`` (short class names) stay. A
        ``fitted_digest`` (16 hex digits of the fitted state's SHA-256) stands for the rest when
        it is set, so a spec fitted on other rows still differs.
        """
        state = self.fitted_state()
        out = {k: v for k, v in self.to_dict().items()
               if k not in state and not (k in self.fitted_fields and v is None)}
        if state:
            out[DIGEST_KEY] = fitted_digest(state)
        return out

    def with_fitted_state(self: SpecT, state: dict[str, Any]) -> SpecT:
        """A copy of this spec with the fitted fields of ``state`` (``fitted_state``'s form)."""
        unknown = sorted(set(state) - set(self.fitted_fields))
        if unknown:
            raise DataSpecError(f"{type(self).__name__} has no fitted field(s) {unknown}; the fitted state"
                                f" was saved by another spec class.")
        return dataclasses.replace(self, **state)  # type: ignore[type-var]


def fitted_digest(state: dict[str, Any]) -> str:
    """16 hex digits of the SHA-256 of ``state`` as canonical JSON.

    Example:
        >>> fitted_digest({"bins": [[0.0, 1.0]]}) == fitted_digest({"bins": [[0.0, 1.0]]})
        True
    """
    text = json.dumps(state, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
