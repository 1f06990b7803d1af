"""Every docstring example in ripieno runs and prints what it shows."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import ripieno

PACKAGES = ("ripieno.framework", "ripieno.callbacks", "ripieno.datamodules")


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        names.append(package)
        names += [info.name for info in pkgutil.walk_packages(module.__path__, package + ".")]
    return sorted(names)


def test_the_packages_are_found():
    assert ripieno is not None and "ripieno.framework.specs.sklearn_state" in _modules()


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"
