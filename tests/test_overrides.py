"""Every hook a ripieno LightningModule, LightningDataModule or Callback overrides carries ``@override``.

Oracle: ``typing_extensions.override`` sets ``__override__ = True`` on the function it decorates;
the hooks are the names the Lightning base class defines, found by walking each class's MRO.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import lightning as L
import pytest

PACKAGES = ("ripieno.framework", "ripieno.callbacks", "ripieno.datamodules")
LIGHTNING_BASES = (L.LightningModule, L.LightningDataModule, L.Callback)


def _classes() -> list[type]:
    found: dict[str, type] = {}
    for package in PACKAGES:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            module = importlib.import_module(info.name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if cls.__module__ == info.name and issubclass(cls, LIGHTNING_BASES):
                    found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return [found[name] for name in sorted(found)]


def _missing(cls: type) -> list[str]:
    bases = [base for base in LIGHTNING_BASES if issubclass(cls, base)]
    missing = []
    for name, value in vars(cls).items():
        if name.startswith("__") or not inspect.isfunction(value):
            continue
        if any(hasattr(base, name) for base in bases) and not getattr(value, "__override__", False):
            missing.append(name)
    return missing


CLASSES = _classes()


def test_the_walk_finds_the_shipped_modules_and_callbacks():
    names = {cls.__name__ for cls in CLASSES}
    assert {"TabularEnsembleModule", "MemberModule", "DiversityMonitor", "TabularDataModule"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__qualname__)
def test_every_overridden_hook_is_marked(cls):
    assert _missing(cls) == []


def test_the_check_sees_an_unmarked_hook():
    class Unmarked(L.Callback):
        def on_train_start(self, trainer, pl_module):  # no @override
            pass

    assert _missing(Unmarked) == ["on_train_start"]
