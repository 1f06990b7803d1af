"""Optional dependencies, installed by extras: ``text``, ``vision``, ``audio`` (``all`` is the three).

A table needs none of them. Code that needs one imports it where it is used, through
``require``: when the package is missing, the user reads one line naming the extra to install
instead of a traceback from deep inside an import.

Example:
    >>> import json
    >>> require("text", "json", "A reader") is json
    True
    >>> try:
    ...     require("text", "not_installed_here", "TextDataModule")
    ... except MissingExtraError as error:
    ...     print(error)
    TextDataModule needs the 'text' extra: pip install 'ripieno[text]' (not_installed_here is not installed).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ripieno.framework.errors import RipienoInputError

EXTRAS: dict[str, tuple[str, ...]] = {
    "text": ("transformers", "tokenizers"),
    "vision": ("transformers", "timm", "torchvision"),
    "audio": ("transformers", "torchaudio", "soundfile"),
    "tune": ("optuna", "optuna_integration"),
}
"""The modules each extra provides (pyproject.toml lists their distributions and floors)."""


class MissingExtraError(RipienoInputError, ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


def require(extra: str, module: str, what: str) -> ModuleType:
    """Import ``module``, or raise ``MissingExtraError`` naming the ``extra`` that installs it.

    Args:
        extra: The extra that provides ``module`` (``text``, ``vision``, ``audio``, or ``all``).
        module: The module to import, e.g. ``"transformers"`` or ``"torchaudio.functional"``.
        what: The class or function that needs it, for the message, e.g. ``"TextDataModule"``.

    Returns:
        The imported module.

    Raises:
        MissingExtraError: ``module`` (or a package it needs) is not installed; also an
            ``ImportError``, so ``except ImportError`` keeps working.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        missing = (error.name or module).split(".")[0]
        raise MissingExtraError(f"{what} needs the {extra!r} extra: pip install 'ripieno[{extra}]'"
                                f" ({missing} is not installed).") from error
