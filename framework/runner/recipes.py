"""The recipes shipped with ripieno: find one by name, list them all.

Recipes are YAML files for ``ripieno fit -c``. They live in the repository's ``recipes/``
folder and install as data beside this package (``ripieno/recipes``), so the same lookup
works in a checkout and in an installed wheel. A recipe is named by its path under that
folder, with or without ``.yaml`` (``tabular/lometab_churn``); its description is its first
comment line.

Example:
    >>> from ripieno.framework.runner.recipes import find_recipe
    >>> find_recipe("tabular/lometab_churn").name
    'lometab_churn.yaml'
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import NamedTuple

RECIPES_DIR = Path(__file__).resolve().parents[2] / "recipes"
"""Where the shipped recipes are: ``recipes/`` in a checkout, ``ripieno/recipes`` when installed."""

SUFFIXES = (".yaml", ".yml")
CONFIG_FLAGS = ("-c", "--config")
"""The options of ``ripieno fit`` and friends that name a recipe."""
SPACES_FOLDER = "spaces"
"""The folder of ``RECIPES_DIR`` that holds ``ripieno tune``'s search spaces, not recipes."""
BENCHMARKS_FOLDER = "benchmarks"
"""The folder of ``RECIPES_DIR`` that holds ``ripieno benchmark``'s files, not recipes."""
SENTENCE_END = re.compile(r"(?<=\w)\.\s+(?=[A-Z])")  # "et al. 2016" and "w_a . w_b" go on


class RecipeNotFoundError(FileNotFoundError):
    """Neither a file at that path nor a shipped recipe of that name exists."""


class Recipe(NamedTuple):
    """A shipped recipe: its name (``tabular/lometab_churn``), file and one-line description."""

    name: str
    path: Path
    description: str


def recipe_name(path: Path) -> str:
    """The name of a shipped recipe file: its path under ``RECIPES_DIR`` without the suffix."""
    return path.resolve().relative_to(RECIPES_DIR).with_suffix("").as_posix()


def list_recipes() -> list[Recipe]:
    """Every shipped recipe, sorted by name."""
    paths = sorted(p for suffix in SUFFIXES for p in RECIPES_DIR.rglob(f"*{suffix}")
                   if p.relative_to(RECIPES_DIR).parts[0] not in (SPACES_FOLDER, BENCHMARKS_FOLDER))
    return sorted((Recipe(recipe_name(p), p, _description(p)) for p in paths), key=lambda r: r.name)


def list_benchmarks() -> list[tuple[str, str]]:
    """Every shipped benchmark file: ``(benchmarks/<name>, first comment line)``."""
    folder = RECIPES_DIR / BENCHMARKS_FOLDER
    paths = sorted(folder.glob("*.yaml")) if folder.is_dir() else []
    return [(f"{BENCHMARKS_FOLDER}/{p.stem}", _description(p)) for p in paths]


def find_recipe(name: str | Path) -> Path:
    """The file a ``-c`` argument means.

    An existing file wins (a user's own YAML keeps working); otherwise ``name`` is looked up
    among the shipped recipes, with or without ``.yaml`` and with or without a leading
    ``recipes/`` (the form the README uses from a checkout).

    Args:
        name: a path, or a shipped recipe's name.

    Raises:
        RecipeNotFoundError: with the closest shipped names, when nothing matches.
    """
    given = Path(name).expanduser()
    if given.is_file():
        return given
    relative = given.as_posix()
    if relative.startswith("recipes/"):
        relative = relative[len("recipes/"):]
    candidates = [RECIPES_DIR / relative] + [RECIPES_DIR / (relative + s) for s in SUFFIXES]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    names = [r.name for r in list_recipes()]
    close = difflib.get_close_matches(Path(relative).with_suffix("").as_posix(), names, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise RecipeNotFoundError(
        f"No file {str(name)!r} and no shipped recipe of that name.{hint} `ripieno recipes` lists the"
        " shipped recipes; give a path to use your own YAML."
    )


def _description(path: Path) -> str:
    """The first sentence of the recipe's leading comment block."""
    lines = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            stripped = line.strip()
            if not stripped.startswith("#"):
                break
            lines.append(stripped.lstrip("#").strip())
    text = " ".join(lines)
    end = SENTENCE_END.search(text)
    return text if end is None else text[: end.start() + 1]


def resolve_config_args(args: list[str]) -> list[str]:
    """Replace every ``-c/--config NAME`` that is not a file by the shipped recipe ``NAME``.

    Raises:
        RecipeNotFoundError: for a name that is neither a file nor a shipped recipe.
    """
    resolved: list[str] = []
    expect_config = False
    for arg in args:
        if expect_config:
            resolved.append(str(find_recipe(arg)))
            expect_config = False
        elif arg in CONFIG_FLAGS:
            resolved.append(arg)
            expect_config = True
        elif arg.startswith("--config="):
            resolved.append("--config=" + str(find_recipe(arg.split("=", 1)[1])))
        else:
            resolved.append(arg)
    return resolved
