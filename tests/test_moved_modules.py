"""Module paths from before framework/ was grouped by role still import, as the same module objects."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import ripieno.framework  # noqa: F401  (installs the finder)
from ripieno.framework._moved import MOVED, REMOVED_IN, MovedModuleFinder


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_imports_the_module_that_holds_it_now(old):
    module = importlib.import_module(old)
    target = MOVED[old]
    if isinstance(target, str):
        assert module is importlib.import_module(target)
    else:  # a split module: every public name of its parts, found through the old path in the parts' order
        parts = [importlib.import_module(part) for part in target]
        for part in parts:
            for name in getattr(part, "__all__", None) or [n for n in vars(part) if not n.startswith("_")]:
                first = next(p for p in parts if hasattr(p, name))
                assert getattr(module, name) is getattr(first, name)


def test_the_finder_answers_only_for_old_paths():
    finder = MovedModuleFinder()
    assert finder.find_spec("ripieno.framework.tabular_spec") is not None
    assert finder.find_spec("ripieno.framework.specs.tabular") is None
    assert finder.find_spec("json") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("ripieno.framework.no_such_module")


def test_old_dotted_names_in_user_code_work_in_a_fresh_process():
    code = ("from ripieno.framework.schedules import WarmupCosineLR;"
            "from ripieno.framework.tabular_spec import TabularSpec;"
            "from ripieno.framework.loes.features import minilm_dir, cached_layer_embeddings;"
            "from ripieno.framework.cli import RipienoCLI, main, resolve_config_args;"
            "import ripieno.framework.estimators as e; print(e.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ripieno.framework.methods.estimators"


def test_old_paths_and_names_warn_once_naming_the_new_path_and_the_removal():
    # in a fresh process: a module imported once is cached, and the warning belongs to that first import
    code = ("from ripieno.framework.schedules import WarmupCosineLR\n"
            "import ripieno.framework.schedules\n"  # cached: no second warning
            "from ripieno.framework.cli import RipienoCLI, main, select_members\n"  # current names: none
            "from ripieno.framework.cli import resolve_config_args\n"
            "import ripieno.framework.loes.features\n")
    out = subprocess.run([sys.executable, "-W", "default::DeprecationWarning", "-c", code],
                         capture_output=True, text=True, check=True)
    lines = [line for line in out.stderr.splitlines() if "DeprecationWarning" in line and "ripieno" in line]
    removal = f"the old path is removed in ripieno {REMOVED_IN}"
    assert lines == [
        "<string>:1: RipienoDeprecationWarning: ripieno.framework.schedules is now"
        f" ripieno.framework.methods.schedules: import it from there ({removal})",
        "<string>:4: RipienoDeprecationWarning: ripieno.framework.cli.resolve_config_args is now"
        " ripieno.framework.runner.command.resolve_config_args: import it from there"
        f" (the old name is removed in ripieno {REMOVED_IN})",
        "<string>:5: RipienoDeprecationWarning: ripieno.framework.loes.features is now"
        " ripieno.framework.loes.extraction and ripieno.framework.loes.feature_cache and"
        f" ripieno.framework.backbones.loading: import it from there ({removal})",
    ]


def test_an_old_package_path_gives_its_modules_once_and_nothing_new():
    import ripieno.framework.cli.tune.space as old
    import ripieno.framework.tuning.space as new

    assert old is new  # the old package's module, not a second copy loaded under the old name
    with pytest.raises(ModuleNotFoundError, match="ripieno.framework.cli.tune.study"):
        importlib.import_module("ripieno.framework.cli.tune.study")  # never existed under the old path
