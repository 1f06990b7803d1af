"""ripieno as a wheel installed into somebody else's project.

The wheel is built from a copy of the checkout, installed with ``--no-deps`` into a fresh
target folder, and used from a project that has its own ``callbacks/``, ``datamodules/``
and ``framework/`` packages: ripieno's names must never resolve to the user's folders.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from ripieno.framework.runner.recipes import list_benchmarks, list_recipes
from ripieno.framework.tuning.space import list_spaces

ROOT = Path(__file__).resolve().parents[1]
# What the build reads: pyproject.toml, the README (long description) and every folder a package
# maps to, taken from pyproject itself so a new package folder cannot be left out of the copy.
_PACKAGE_DIRS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
SOURCES = ("pyproject.toml", "README.md", *sorted({d.split("/")[0] for d in _PACKAGE_DIRS.values()}))

USER_SCRIPT = '''
import json
import lightning as L
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import callbacks, datamodules, framework  # the user's own packages
from ripieno.callbacks import DiversityMonitor, GeoReg, LastLayerSampler
from ripieno.datamodules import TabularDataModule
from ripieno.framework import MemberModule, TabularEnsembleModule
from ripieno.framework.metrics import PairwiseKLDivergence

assert callbacks.OWNER == datamodules.OWNER == framework.OWNER == "user"


class Mine(L.LightningModule):
    """A user's own 3-member classifier: returns member_outputs (B, 3, 4)."""

    member_output_kind = "logits"

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(5, 3 * 4)

    def forward(self, x):
        return self.net(x).view(len(x), 3, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        out = self(x)
        loss = F.cross_entropy(out.flatten(0, 1), y.repeat_interleave(3))
        return {"loss": loss, "member_outputs": out.detach(), "target": y}

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return {"member_outputs": self(x), "target": y}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
x, y = torch.randn(64, 5), torch.randint(0, 4, (64,))
loader = DataLoader(TensorDataset(x, y), batch_size=16)
model = Mine()
monitor = DiversityMonitor()
trainer = L.Trainer(max_epochs=1, callbacks=[monitor], logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(model, loader, loader)
oracle = PairwiseKLDivergence(input_kind="logits")
with torch.no_grad():
    oracle.update(model(x))
print(json.dumps({"monitor": monitor.history[-1]["diversity/val/pairwise_kl"],
                  "oracle": float(oracle.compute())}))
'''


def _run(args: list[str], cwd: Path, env: dict[str, str], timeout: int = 600) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A wheel built from a copy of the checkout, installed --no-deps into a target folder."""
    base = tmp_path_factory.mktemp("wheel")
    source = base / "source"
    for name in SOURCES:
        item = ROOT / name
        if item.is_dir():
            shutil.copytree(item, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            source.mkdir(exist_ok=True)
            shutil.copy(item, source / name)
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "-w", str(base / "dist"), str(source)], base, env)
    (wheel,) = (base / "dist").glob("ripieno-*.whl")
    target = base / "site"
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
          str(wheel)], base, env)
    project = base / "project"
    for name in ("callbacks", "datamodules", "framework"):
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text('OWNER = "user"\n')
    return {"wheel": wheel, "target": target, "project": project}


def _project_env(installed: dict[str, Path]) -> dict[str, str]:
    """The project's folder first on the path (as ``python script.py`` there has it), then the install."""
    path = os.pathsep.join([str(installed["project"]), str(installed["target"])])
    return {**os.environ, "PYTHONPATH": path}


@pytest.mark.slow
def test_the_wheel_installs_one_top_level_package_with_the_recipes(installed):
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        names = wheel.namelist()
        (top_level,) = [n for n in names if n.endswith("top_level.txt")]
        assert wheel.read(top_level).decode().split() == ["ripieno"]
    assert {n.split("/")[0] for n in names} == {"ripieno", next(n for n in names if ".dist-info/" in n)
                                                .split("/")[0]}
    shipped = {r.name for r in list_recipes()}
    in_wheel = {n.removeprefix("ripieno/recipes/").removesuffix(".yaml") for n in names
                if n.startswith("ripieno/recipes/") and n.endswith(".yaml")}
    benchmarks = {name for name, _ in list_benchmarks()}  # ripieno benchmark's files
    assert in_wheel == shipped | {f"spaces/{s.name}" for s in list_spaces()} | benchmarks  # and tune's spaces
    modules = {n for n in names if n.endswith(".py")}
    for folder in ("framework", "callbacks", "datamodules"):
        for path in (ROOT / folder).rglob("*.py"):
            assert f"ripieno/{folder}/{path.relative_to(ROOT / folder).as_posix()}" in modules
    typed = {n for n in names if n.endswith("/py.typed")}
    assert typed == {"ripieno/py.typed", "ripieno/framework/py.typed", "ripieno/callbacks/py.typed",
                     "ripieno/datamodules/py.typed"}


@pytest.mark.slow
def test_the_wheel_requires_no_modality_package_and_offers_the_extras(installed):
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        (metadata,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
        lines = wheel.read(metadata).decode().splitlines()
    requires = [line.removeprefix("Requires-Dist: ") for line in lines if line.startswith("Requires-Dist: ")]
    core = {r.split(";")[0].split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip().lower()
            for r in requires if "extra ==" not in r}
    assert core.isdisjoint({"transformers", "tokenizers", "timm", "torchvision", "torchaudio", "soundfile"})
    extras = {line.removeprefix("Provides-Extra: ") for line in lines if line.startswith("Provides-Extra: ")}
    assert {"text", "vision", "audio", "all"} <= extras
    assert any(r.startswith("ripieno[audio,text,vision]") or r.startswith("ripieno[text,vision,audio]")
               for r in requires if 'extra == "all"' in r), requires


@pytest.mark.slow
def test_imports_resolve_to_the_install_not_the_users_folders(installed):
    code = ("import ripieno, ripieno.framework, ripieno.callbacks, ripieno.datamodules, callbacks;"
            "from ripieno.callbacks import DiversityMonitor, LastLayerSampler, GeoReg;"
            "from ripieno.datamodules import TabularDataModule;"
            "from ripieno.framework import TabularEnsembleModule;"
            "print(ripieno.framework.__file__); print(ripieno.callbacks.__file__); print(callbacks.OWNER)")
    out = _run([sys.executable, "-c", code], installed["project"], _project_env(installed)).split()
    assert all(Path(p).is_relative_to(installed["target"]) for p in out[:2])
    assert out[2] == "user"


@pytest.mark.slow
def test_a_shipped_recipe_runs_by_name_from_the_users_project(installed):
    env = _project_env(installed)
    listed = _run([sys.executable, "-m", "ripieno", "recipes"], installed["project"], env)
    assert "tabular/lometab_churn" in listed
    out = _run([str(installed["target"] / "bin" / "ripieno"), "fit", "-c", "tabular/lometab_churn",
                "--trainer.fast_dev_run=true", "--data.init_args.max_rows=600",
                "--trainer.enable_progress_bar=false", "--trainer.default_root_dir=out"],
               installed["project"], env)
    assert "ripieno: test metrics" in out
    assert (installed["project"] / "out").is_dir()


@pytest.mark.slow
def test_a_users_module_composes_with_diversity_monitor(installed):
    script = installed["project"] / "train_mine.py"
    script.write_text(USER_SCRIPT)
    out = _run([sys.executable, str(script)], installed["project"], _project_env(installed))
    values = json.loads(out.strip().splitlines()[-1])
    assert values["monitor"] == pytest.approx(values["oracle"], rel=1e-5)
    assert values["monitor"] > 0
