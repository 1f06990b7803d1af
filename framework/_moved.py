"""Module paths from before ``framework/`` was grouped by role, still importable.

Users' YAML (``class_path: ripieno.framework.schedules.WarmupCosineLR``), code and pickles
name modules by their old paths. ``MOVED`` maps each old path to where the module lives now
(or, for ``loes.features``, which was split, to the modules that share its names); a finder
placed on ``sys.meta_path`` the first time ``ripieno.framework`` is imported answers for
exactly these names and no others, so importing an old path gives the new module object
itself (``ripieno.framework.tabular_spec is ripieno.framework.specs.tabular``). New code and
the shipped recipes use the new paths.

Each old path warns once per process with a ``DeprecationWarning`` naming its new path and the
release that removes it (``REMOVED_IN``), attributed to the line that imported it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

from ripieno.framework.errors import REMOVED_IN, RipienoDeprecationWarning

MOVED: dict[str, str | tuple[str, ...]] = {
    "ripieno.framework.checkpoint_io": "ripieno.framework.outputs.checkpoint_io",
    "ripieno.framework.config_errors": "ripieno.framework.runner.config_errors",
    "ripieno.framework.error_lines": "ripieno.framework.runner.error_lines",
    "ripieno.framework.estimators": "ripieno.framework.methods.estimators",
    "ripieno.framework.generated_folders": "ripieno.framework.outputs.generated_folders",
    "ripieno.framework.image_spec": "ripieno.framework.specs.image",
    "ripieno.framework.model_folder": "ripieno.framework.backbones.model_folder",
    "ripieno.framework.monitor_check": "ripieno.framework.runner.monitor_check",
    "ripieno.framework.optimizer_config": "ripieno.framework.runner.optimizer_config",
    "ripieno.framework.output_files": "ripieno.framework.outputs.output_files",
    "ripieno.framework.prediction_table": "ripieno.framework.outputs.prediction_table",
    "ripieno.framework.quiet": "ripieno.framework.messages",
    "ripieno.framework.recipes": "ripieno.framework.runner.recipes",
    "ripieno.framework.resume_check": "ripieno.framework.runner.resume_check",
    "ripieno.framework.run_folders": "ripieno.framework.runner.run_folders",
    "ripieno.framework.run_logs": "ripieno.framework.runner.run_logs",
    "ripieno.framework.schedules": "ripieno.framework.methods.schedules",
    "ripieno.framework.select_members_cli": "ripieno.framework.cli.select_members",
    "ripieno.framework.sklearn_state": "ripieno.framework.specs.sklearn_state",
    "ripieno.framework.spawn_results": "ripieno.framework.runner.spawn_results",
    "ripieno.framework.tabular_preprocessing": "ripieno.framework.specs.tabular_preprocessing",
    "ripieno.framework.tabular_spec": "ripieno.framework.specs.tabular",
    "ripieno.framework.text_spec": "ripieno.framework.specs.text",
    "ripieno.framework.loes.spec": "ripieno.framework.specs.layer_features",
    "ripieno.framework.loes.conversion": "ripieno.framework.backbones.conversion",
    "ripieno.framework.loes.convert_dinov2": "ripieno.framework.backbones.convert_dinov2",
    "ripieno.framework.loes.convert_efficientnet": "ripieno.framework.backbones.convert_efficientnet",
    "ripieno.framework.loes.convert_whisper": "ripieno.framework.backbones.convert_whisper",
    "ripieno.framework.loes.small_models": "ripieno.framework.backbones.small_models",
    "ripieno.framework.loes.features": ("ripieno.framework.loes.extraction",
                                        "ripieno.framework.loes.feature_cache",
                                        "ripieno.framework.backbones.loading"),
    # framework/cli/ split into the runner (RipienoCLI and its checks), the tuning and benchmark
    # engines and the command-line door (after ripieno 0.1.0)
    "ripieno.framework.cli.checkpoint_request": "ripieno.framework.runner.checkpoint_request",
    "ripieno.framework.cli.command": "ripieno.framework.runner.command",
    "ripieno.framework.cli.config_errors": "ripieno.framework.runner.config_errors",
    "ripieno.framework.cli.error_lines": "ripieno.framework.runner.error_lines",
    "ripieno.framework.cli.fingerprints": "ripieno.framework.runner.fingerprints",
    "ripieno.framework.cli.help_text": "ripieno.framework.runner.help_text",
    "ripieno.framework.cli.interrupts": "ripieno.framework.runner.interrupts",
    "ripieno.framework.cli.lightning_private": "ripieno.framework.runner.lightning_private",
    "ripieno.framework.cli.monitor_check": "ripieno.framework.runner.monitor_check",
    "ripieno.framework.cli.moved_arguments": "ripieno.framework.runner.moved_arguments",
    "ripieno.framework.cli.nested_nulls": "ripieno.framework.runner.nested_nulls",
    "ripieno.framework.cli.optimizer_config": "ripieno.framework.runner.optimizer_config",
    "ripieno.framework.cli.process_group_exit": "ripieno.framework.runner.process_group_exit",
    "ripieno.framework.cli.recipes": "ripieno.framework.runner.recipes",
    "ripieno.framework.cli.resume_check": "ripieno.framework.runner.resume_check",
    "ripieno.framework.cli.run_folders": "ripieno.framework.runner.run_folders",
    "ripieno.framework.cli.run_logs": "ripieno.framework.runner.run_logs",
    "ripieno.framework.cli.section_instantiator": "ripieno.framework.runner.section_instantiator",
    "ripieno.framework.cli.spawn_results": "ripieno.framework.runner.spawn_results",
    "ripieno.framework.cli.store_folders": "ripieno.framework.runner.store_folders",
    "ripieno.framework.cli.yaml_files": "ripieno.framework.runner.yaml_files",
    "ripieno.framework.cli.tune": "ripieno.framework.tuning",
    "ripieno.framework.cli.tune.ddp_trials": "ripieno.framework.runner.ddp_trials",
    "ripieno.framework.cli.tune.results": "ripieno.framework.tuning.results",
    "ripieno.framework.cli.tune.space": "ripieno.framework.tuning.space",
    "ripieno.framework.cli.tune.study_storage": "ripieno.framework.tuning.study_storage",
    "ripieno.framework.cli.tune.trial_run": "ripieno.framework.tuning.trial_run",
    "ripieno.framework.cli.tune.trial_seeds": "ripieno.framework.tuning.trial_seeds",
    "ripieno.framework.cli.tune.worker": "ripieno.framework.tuning.worker",
    "ripieno.framework.cli.tune.command": ("ripieno.framework.cli.tune_command",
                                           "ripieno.framework.tuning.study"),
    "ripieno.framework.cli.benchmark": "ripieno.framework.benchmark",
    "ripieno.framework.cli.benchmark.cells": "ripieno.framework.benchmark.cells",
    "ripieno.framework.cli.benchmark.config": "ripieno.framework.benchmark.config",
    "ripieno.framework.cli.benchmark.models": "ripieno.framework.benchmark.models",
    "ripieno.framework.cli.benchmark.report": "ripieno.framework.benchmark.report",
    "ripieno.framework.cli.benchmark.uncertainty": "ripieno.framework.benchmark.uncertainty",
    "ripieno.framework.cli.benchmark.command": ("ripieno.framework.cli.benchmark_command",
                                                "ripieno.framework.benchmark.run"),
}


class _UnionModule(types.ModuleType):
    """An old module whose names now live in several modules (looked up in order)."""

    def __init__(self, name: str, sources: Sequence[str]) -> None:
        super().__init__(name, f"Moved: the names of {name} now live in {', '.join(sources)}.")
        self._sources = tuple(sources)

    def __getattr__(self, attr: str) -> object:
        for source in self._sources:
            module = importlib.import_module(source)
            if hasattr(module, attr):
                return getattr(module, attr)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")


class _MovedModuleLoader(importlib.abc.Loader):
    """Loads an old path as the module that now holds it."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        """The new module itself (or a union of the modules that share a split module's names)."""
        target = MOVED[spec.name]
        new = " and ".join(target) if isinstance(target, tuple) else target
        warnings.warn(f"{spec.name} is now {new}: import it from there (the old path is removed in ripieno"
                      f" {REMOVED_IN})", RipienoDeprecationWarning, stacklevel=importer_stacklevel())
        if isinstance(target, tuple):
            return _UnionModule(spec.name, target)
        return importlib.import_module(target)

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the target module already ran."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds only the old paths in ``MOVED``; every other import goes to the next finder."""

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        """A spec for an old path, else ``None``.

        Raises:
            ModuleNotFoundError: a name under an old package path that never existed there
                (``ripieno.framework.cli.tune.study``): the path finder would load the new
                package's module a second time under it.
        """
        if fullname not in MOVED:
            if fullname.rpartition(".")[0] in MOVED:
                raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
            return None
        return importlib.machinery.ModuleSpec(fullname, _MovedModuleLoader())


def importer_stacklevel() -> int:
    """The ``stacklevel`` that attributes a warning to the code that ran the import statement.

    Between it and the warning lie this module's frames and the import system's
    (``<frozen importlib...>``); ``warnings.warn`` skips the latter itself, so only ours are counted.
    """
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen importlib")
                                 or frame.f_code.co_filename == __file__):
        level += frame.f_code.co_filename == __file__
        frame = frame.f_back
    return level


def install() -> None:
    """Put one ``MovedModuleFinder`` first on ``sys.meta_path`` (idempotent).

    First, not last: an old package path (``ripieno.framework.cli.tune``) answers with the new
    package, whose ``__path__`` the path finder would search for ``ripieno.framework.cli.tune.space``
    and load ``tuning/space.py`` a second time under the old name. The finder answers only ``MOVED``.
    """
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
