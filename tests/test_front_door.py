"""The ``ripieno`` command's front door: every command listed, ``--version``, typos, every ``--help``.

Oracles: exact texts and the interpreter's own record of what it imported. ``ripieno --help``,
``--version`` and ``recipes`` import no torch, Lightning, transformers, Optuna, GBDT or LOES module
(``sys.modules`` after the call, in a fresh process): that is why they answer at once (the
timings are in ``bench/cli_startup.py``, not here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import version

import pytest

from ripieno.framework.cli.main import COMMANDS, main

HEAVY = ("torch", "lightning", "transformers", "optuna", "xgboost", "lightgbm", "catboost",
         "ripieno.framework.loes", "ripieno.framework.mcover", "sklearn")


def _ripieno(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ripieno", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_help_lists_every_command_with_a_line_and_a_bare_ripieno_shows_it_too(capsys):
    main(["--help"])
    text = capsys.readouterr().out
    for command in ("fit", "validate", "test", "predict", "recipes", "tune", "benchmark", "select_members"):
        assert f"\n  {command} " in text, command
    assert "``" not in text and "--version" in text
    with pytest.raises(SystemExit) as stop:
        main([])
    assert stop.value.code == 2 and capsys.readouterr().out == text


def test_version_names_the_installed_distributions(capsys):
    main(["--version"])
    assert capsys.readouterr().out == (
        f"ripieno {version('ripieno')} (torch {version('torch')}, lightning {version('lightning')},"
        f" torchmetrics {version('torchmetrics')})\n"
    )


@pytest.mark.parametrize(("typed", "closest"), [("tunee", "tune"), ("fitt", "fit"), ("recipe", "recipes"),
                                                 ("bench", "benchmark"), ("select", "select_members")])
def test_a_mistyped_command_is_one_line_with_the_closest(typed, closest):
    with pytest.raises(SystemExit) as stop:
        main([typed])
    assert str(stop.value) == (
        f"ripieno: error: unknown command {typed!r} (did you mean {closest!r}?); ripieno --help says what"
        " each does."
    )


HELPS = r"""
import contextlib, io, json, sys
from ripieno.framework.cli.main import COMMANDS, main
shown = {}
for command in sorted(COMMANDS):
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([command, "--help"])
        except SystemExit as stop:
            code = stop.code or 0
    shown[command] = [code, out.getvalue(), err.getvalue()]
print("HELPS " + json.dumps(shown))
"""


def test_every_command_honours_help_in_plain_text():
    done = subprocess.run([sys.executable, "-c", HELPS], capture_output=True, text=True, timeout=600)
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("HELPS ")]
    shown = json.loads(line.removeprefix("HELPS "))
    assert sorted(shown) == sorted(COMMANDS)
    for command, (code, out, err) in shown.items():
        assert code == 0, (command, err[-2000:])
        assert "usage:" in out.lower(), (command, out[:300])
        assert "``" not in out and ":class:" not in out, command
        assert "Traceback" not in err, (command, err[-2000:])


PROBE = r"""
import json, sys
from ripieno.framework.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["recipes"], ["tunee"]])
def test_the_front_door_imports_none_of_the_heavy_libraries(args):
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=300)
    modules = json.loads(done.stderr.strip().splitlines()[-1])
    loaded = sorted({m for m in modules for heavy in HEAVY if m == heavy or m.startswith(heavy + ".")})
    assert loaded == [], f"ripieno {' '.join(args)} imported {loaded[:8]}"


def test_importing_the_packages_imports_no_method_until_a_name_is_used():
    probe = (
        "import sys, json; import ripieno.framework, ripieno.callbacks, ripieno.datamodules;"
        " before = set(sys.modules); from ripieno.framework import TabularEnsembleModule;"
        " print(json.dumps([sorted(before), 'ripieno.framework.methods.tabular_ensemble' in sys.modules,"
        " set(ripieno.framework.__all__) <= set(dir(ripieno.framework))]))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    before, imported, listed = json.loads(done.stdout.strip().splitlines()[-1])
    assert not [m for m in before if m.split(".")[0] in ("torch", "lightning", "transformers")]
    assert imported and listed


def test_recipes_takes_no_arguments_and_a_closed_pipe_is_no_traceback():
    done = _ripieno("recipes", "extra")
    assert done.returncode == 1 and done.stderr.strip() == (
        "ripieno: error: ripieno recipes takes no arguments, got 'extra'."
    )
    piped = subprocess.run(f"{sys.executable} -m ripieno recipes | head -1", shell=True, capture_output=True,
                           text=True, timeout=300)
    assert piped.stdout.startswith("Shipped recipes") and "Traceback" not in piped.stderr
