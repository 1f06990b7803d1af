"""A package's public names, imported when first used (PEP 562), so that importing it costs nothing.

``ripieno.framework``, ``ripieno.callbacks`` and ``ripieno.datamodules`` re-export names from
every room: LOES, M-cover, the text and audio datamodules. Imported eagerly, ``import
ripieno.framework.errors`` took 13 s (``python -X importtime``) and ``ripieno --help`` 7 s, most of
it modules the command never runs. Each package lists its names and their modules here instead;
``from ripieno.framework import TabularEnsembleModule`` and a recipe's ``class_path`` import just
that module on first use, and ``dir()`` and ``__all__`` still show every name.

Example:
    >>> getattr_, dir_ = lazy_exports("pkg", {"Path": "pathlib", "dumps": "json"})
    >>> getattr_("dumps").__module__
    'json'
    >>> dir_()[:2]
    ['Path', 'dumps']
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` serving ``names`` ({name: module}) on first use.

    Args:
        package: the package's ``__name__``.
        names: each public name and the module that defines it.

    Returns:
        The module-level ``__getattr__`` (imports the name's module, caches the name in the
        package) and ``__dir__``.
    """

    def __getattr__(name: str) -> object:  # noqa: N807 - the module-level hook of PEP 562
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace = sys.modules.get(package)
        if namespace is not None:
            setattr(namespace, name, value)  # later look-ups do not come here again
        return value

    def __dir__() -> list[str]:  # noqa: N807 - the module-level hook of PEP 562
        namespace = sys.modules.get(package)
        own = list(vars(namespace)) if namespace is not None else []
        return sorted({*own, *names})

    return __getattr__, __dir__
