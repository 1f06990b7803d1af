"""YAML files from users are read with limits on alias expansion and size, everything else as before.

Oracles: the exact one-line messages; PyYAML's ``yaml.safe_load`` (and jsonargparse's own ``yaml``
loader and ``--print_config`` in its ``yaml`` mode) for every file that is allowed.

The bombs are the classic one, 9 levels of 9 aliases: 387,420,489 values once expanded. Read
without the guard, each front door below expands them (a ``repr`` in an error message, the
config parser's walk over the values): measured before the guard, ``ripieno fit`` ran 94 s and
``benchmark`` and ``tune`` about 48 s each, all past 4 GiB, before failing. With the guard they
are refused before anything is built, so these tests stay small and quick; without it they
would hang or run out of memory rather than pass.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from jsonargparse import ArgumentParser, get_loader

from ripieno.framework.cli import main
from ripieno.framework.runner.command import RipienoCLI, quiet_cli_notices, resolve_config_args
from ripieno.framework.runner.yaml_files import (
    BOUNDED_YAML_MODE,
    MAX_FILE_BYTES,
    InvalidYamlError,
    YamlFileError,
    _jsonargparse_load,
    load_yaml,
    use_bounded_yaml,
)

SHIPPED = sorted(Path("recipes").rglob("*.yaml"))
BOMB = ("its YAML aliases expand to more than 100,000 values (a YAML alias bomb?); write the values out"
        " instead of nesting aliases.")
WINE = "tabular/lometab_wine"


def _chain(levels: int = 9, width: int = 9) -> str:
    """A flow list of anchors, each naming ``width`` aliases of the one before: ``width ** levels`` lols."""
    items = [f"&a0 [{', '.join(['lol'] * width)}]"]
    items += [f"&a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


def _refusal(args: list[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(args)
    return str(stop.value.code)


def test_the_classic_bomb_is_refused_by_the_loader():
    text = "lols: " + _chain() + "\n"
    with pytest.raises(YamlFileError) as refused:
        load_yaml(text, "recipe.yaml")
    assert str(refused.value) == f"recipe.yaml: {BOMB}"


def test_a_bomb_in_a_recipe_is_refused_by_fit(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"trainer:\n  callbacks: {_chain()}\n")
    assert _refusal(["fit", "-c", str(recipe)]) == f"ripieno: error: {recipe}: {BOMB}"
    assert _refusal(["fit", f"--config={recipe}"]) == f"ripieno: error: {recipe}: {BOMB}"


def test_a_bomb_in_a_nested_config_file_or_a_value_is_refused_with_its_key(tmp_path):
    callbacks = tmp_path / "callbacks.yaml"
    callbacks.write_text(_chain() + "\n")
    assert (_refusal(["fit", "-c", WINE, f"--trainer.callbacks={callbacks}"])
            == f"ripieno: error: trainer.callbacks: {callbacks}: {BOMB}")
    assert (_refusal(["fit", "-c", WINE, f"--trainer.callbacks={_chain()}"])
            == f"ripieno: error: trainer.callbacks: the value given: {BOMB}")


def test_a_bomb_in_a_benchmark_file_is_refused(tmp_path):
    benchmark = tmp_path / "bench.yaml"
    benchmark.write_text(f"seeds: {_chain()}\nmodels: {{lometab: {{kind: ensemble}}}}\n")
    assert _refusal(["benchmark", "-c", str(benchmark)]) == f"ripieno: error: benchmark {benchmark}: {BOMB}"


def test_a_bomb_in_a_search_space_is_refused(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text(f"recipes: {_chain()}\nparams:\n"
                     "  model.init_args.lr: {type: float, low: 1.0e-4, high: 1.0e-2}\n")
    args = ["tune", "-c", WINE, "--space", str(space), "--study_dir", str(tmp_path / "study")]
    assert _refusal(args) == f"ripieno: error: {space}: {BOMB}"
    assert not (tmp_path / "study").exists()


def test_merge_keys_count_what_they_merge():
    text = "a0: &a0 {k: 1}\n" + "".join(
        f"a{i}: &a{i} {{<<: [{', '.join([f'*a{i - 1}'] * 9)}]}}\n" for i in range(1, 10))
    with pytest.raises(YamlFileError) as refused:
        load_yaml(text, "merges.yaml")
    assert str(refused.value) == f"merges.yaml: {BOMB}"


def test_a_recursive_alias_is_refused(tmp_path):
    expected = ("the YAML value anchored at line 2 contains an alias to itself (a recursive alias); write"
                " the values out instead.")
    with pytest.raises(YamlFileError) as refused:
        load_yaml("seed_everything: 1\ntrainer: &t\n  again: [*t]\n", "loop.yaml")
    assert str(refused.value) == f"loop.yaml: {expected}"
    recipe = tmp_path / "loop.yaml"
    recipe.write_text("seed_everything: 1\ntrainer: &t\n  callbacks: [*t]\n")
    assert _refusal(["fit", "-c", str(recipe)]) == f"ripieno: error: {recipe}: {expected}"


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("#" * MAX_FILE_BYTES + "\n")
    expected = (f"{big}: is 10,485,761 bytes, more than the 10,485,760 a YAML file ripieno reads may have;"
                " make it smaller.")
    with pytest.raises(YamlFileError) as refused:
        load_yaml(big)
    assert str(refused.value) == expected
    assert _refusal(["fit", "-c", str(big)]) == f"ripieno: error: {expected}"
    args = ["tune", "-c", WINE, "--space", str(big), "--study_dir", str(tmp_path / "study")]
    assert _refusal(args) == f"ripieno: error: {expected}"


ORDINARY = """\
defaults: &defaults
  lr: 0.001
  layers: [64, 64]
  schedule: {warmup: 5, kind: cosine}
small:
  <<: *defaults
  layers: [16]
large:
  <<: [*defaults, {extra: true}]
  lr: 1.0e-4
same_layers: *defaults
when: 2024-01-02
"""


def test_anchors_and_merge_keys_load_as_safe_load_loads_them(tmp_path):
    path = tmp_path / "ordinary.yaml"
    path.write_text(ORDINARY)
    assert load_yaml(ORDINARY) == yaml.safe_load(ORDINARY)
    assert load_yaml(path) == yaml.safe_load(ORDINARY)
    assert load_yaml(path)["small"] == {"lr": 0.001, "layers": [16],
                                        "schedule": {"warmup": 5, "kind": "cosine"}}
    assert _jsonargparse_load(ORDINARY) == get_loader("yaml")(ORDINARY)
    assert load_yaml("") is None and load_yaml("# only a comment\n") is None


@pytest.mark.parametrize("path", SHIPPED, ids=str)
def test_every_shipped_file_loads_as_before(path):
    text = path.read_text()
    assert load_yaml(path) == yaml.safe_load(text)
    assert _jsonargparse_load(text, path=path.name) == get_loader("yaml")(text)


def test_the_shipped_files_are_all_checked():
    assert {p.parts[1] for p in SHIPPED} >= {"benchmarks", "spaces", "tabular", "loes", "mcover", "uq"}
    assert len(SHIPPED) >= 60


def _printed(args: list[str], capsys: pytest.CaptureFixture, **parser_kwargs: object) -> str:
    with quiet_cli_notices(), pytest.raises(SystemExit) as stop:
        RipienoCLI(args=resolve_config_args([*args, "--print_config"]), parser_kwargs=parser_kwargs)
    assert stop.value.code in (0, None)
    return capsys.readouterr().out


def test_print_config_is_what_jsonargparse_yaml_mode_prints(tmp_path, capsys):
    mine = tmp_path / "mine.yaml"  # a user's overrides with an anchor, an alias and a merge key
    mine.write_text("trainer:\n  <<: &quick {max_epochs: 3, enable_progress_bar: false}\n"
                    "  limit_train_batches: &n 2\n  limit_val_batches: *n\n")
    for args in (["fit", "-c", WINE, "-c", str(mine)],
                 ["fit", "-c", "uq/ll_glm_lometab_churn", "--trainer.max_epochs=2"]):
        printed = _printed(args, capsys)
        assert printed == _printed(args, capsys, parser_mode="yaml")  # jsonargparse's own yaml mode
    assert "limit_val_batches: 2" in _printed(["fit", "-c", WINE, "-c", str(mine)], capsys)


def test_the_bounded_mode_is_registered_by_the_command_and_leaves_yaml_mode_alone():
    importing = ("import jsonargparse._loaders_dumpers as l, ripieno.framework.runner.command, "
                 "ripieno.framework.cli.main; print(sorted(l.loaders))")
    done = subprocess.run([sys.executable, "-c", importing], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert BOUNDED_YAML_MODE not in done.stdout  # importing ripieno registers nothing
    yaml_loader = get_loader("yaml")
    assert use_bounded_yaml() == BOUNDED_YAML_MODE
    assert get_loader("yaml") is yaml_loader and ArgumentParser().parser_mode == "yaml"


def test_invalid_yaml_is_one_line_with_its_line(tmp_path):
    text = "params:\n  lr: [1, 2\n"
    with pytest.raises(yaml.YAMLError) as parser:
        yaml.safe_load(text)
    line = parser.value.problem_mark.line + 1
    problem = str(parser.value).splitlines()[0]
    with pytest.raises(InvalidYamlError) as refused:
        load_yaml(text, "bad.yaml")
    assert str(refused.value) == f"bad.yaml: not valid YAML (line {line}): {problem}; fix the file."
    assert refused.value.line == line == 3
    space = tmp_path / "space.yaml"
    space.write_text(text)
    args = ["tune", "-c", WINE, "--space", str(space), "--study_dir", str(tmp_path / "study")]
    assert _refusal(args) == f"ripieno: error: {space}: not valid YAML at line 3; fix the file."
    benchmark = tmp_path / "bench.yaml"
    benchmark.write_text(text)
    assert _refusal(["benchmark", "-c", str(benchmark)]) == (
        f"ripieno: error: benchmark {benchmark}: not valid YAML (line 3): {problem}.")
