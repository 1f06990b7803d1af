"""Every public layer and metric documents its shapes and shows a runnable example.

A public layer is an ``nn.Module`` subclass, a public metric a ``torchmetrics.Metric`` subclass,
defined under a public name in a public module of ripieno's packages (no leading underscore
anywhere in the path), or exported in a package's ``__all__``. LightningModules are not layers:
their contract is the member protocol (``ripieno.framework.members``) and their recipes.
Each class docstring (its own, not an inherited one) must carry a ``Shape:`` section in
torch.nn's form (``- Input: ...`` and ``- Output: ...``) and an ``Example:`` section with
``>>>`` lines that doctest collects; ``tests/test_doctests.py`` runs every such example.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil
import re

import lightning as L
import pytest
from torch import nn
from torchmetrics import Metric

PACKAGES = ("ripieno.framework", "ripieno.callbacks", "ripieno.datamodules")


def _public_modules() -> list[str]:
    names = []
    for package in PACKAGES:
        module = importlib.import_module(package)
        names.append(package)
        names += [info.name for info in pkgutil.walk_packages(module.__path__, package + ".")]
    return sorted(name for name in names if not any(part.startswith("_") for part in name.split(".")))


def _is_layer_or_metric(obj: object) -> bool:
    return (inspect.isclass(obj) and issubclass(obj, (nn.Module, Metric))
            and not issubclass(obj, L.LightningModule))


def _public_classes() -> dict[str, type]:
    """``module.Class`` -> class, for every public layer and metric of ripieno."""
    found: dict[str, type] = {}
    for name in _public_modules():
        module = importlib.import_module(name)
        exported = set(getattr(module, "__all__", ()))
        for attr, obj in vars(module).items():
            defined_here = getattr(obj, "__module__", None) == name and not attr.startswith("_")
            if _is_layer_or_metric(obj) and (defined_here or attr in exported):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return dict(sorted(found.items()))


CLASSES = _public_classes()


def _section(doc: str, title: str) -> str | None:
    """The body of a Google-style section ``title:`` of ``doc`` (indented lines below it), or ``None``."""
    match = re.search(rf"^(?P<indent>[ \t]*){title}:[ \t]*\n(?P<body>(?:(?P=indent)[ \t]+\S.*\n?|[ \t]*\n)+)",
                      doc, flags=re.MULTILINE)
    return match.group("body") if match else None


def docs_problems(cls: type) -> list[str]:
    """What the class docstring lacks: a ``Shape:`` section with Input/Output items, an ``Example:``."""
    doc = cls.__dict__.get("__doc__") or ""
    problems = []
    shape = _section(doc, "Shape")
    if shape is None:
        problems.append("no Shape: section")
    elif not all(re.search(rf"^\s*- {item}:", shape, re.MULTILINE) for item in ("Input", "Output")):
        problems.append("Shape: needs an '- Input:' and an '- Output:' item")
    example = _section(doc, "Example")
    if example is None or ">>>" not in example:
        problems.append("no Example: section with >>> lines")
    elif not doctest.DocTestParser().get_examples(doc):
        problems.append("Example: has no example doctest can parse")
    return problems


def test_the_walk_finds_layers_and_metrics_of_every_room_and_nothing_else():
    names = set(CLASSES)
    for expected in ("ripieno.framework.nn.ensemble_linear.EnsembleLinear",
                     "ripieno.framework.mcover.routed_mlp.RoutedMLP",
                     "ripieno.framework.loes.scalar_mix.ScalarMix",
                     "ripieno.framework.loes.fusion.LayerFusionHead",
                     "ripieno.framework.metrics.uq.VarROC",
                     "ripieno.framework.mcover.collapse.CopyScores"):
        assert expected in names
    assert not any(issubclass(cls, L.LightningModule) for cls in CLASSES.values())
    assert not any(part.startswith("_") for name in names for part in name.split("."))


def test_the_check_rejects_a_layer_without_shape_or_example():
    class Bare(nn.Module):
        """A layer.

        Args:
            width: its width.
        """

    class HalfShape(nn.Module):
        """A layer.

        Shape:
            - Input: ``(B, D)``.

        Example:
            This layer has no example yet.
        """

    assert docs_problems(Bare) == ["no Shape: section", "no Example: section with >>> lines"]
    assert docs_problems(HalfShape) == ["Shape: needs an '- Input:' and an '- Output:' item",
                                        "no Example: section with >>> lines"]


@pytest.mark.parametrize("name", list(CLASSES))
def test_public_layer_or_metric_documents_shape_and_example(name):
    assert docs_problems(CLASSES[name]) == [], f"{name}: add a Shape: and an Example: to its docstring"


@pytest.mark.parametrize("name", list(CLASSES))
def test_the_doctest_run_collects_its_example(name):
    cls = CLASSES[name]
    module = importlib.import_module(cls.__module__)
    tests = doctest.DocTestFinder().find(module)
    assert any(test.name.endswith(f".{cls.__qualname__}") and test.examples for test in tests)
