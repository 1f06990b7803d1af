"""Search spaces for ``ripieno tune``: CLI keys mapped to Optuna distributions, read from YAML.

A space file names the recipes it suits and one distribution per config key, in the form the
``ripieno fit`` command line takes (``model.init_args.rank``)::

    # LoMETab: the TabM paper's space plus rank and sigma_init.
    recipes: [tabular/lometab_*]
    params:
      model.init_args.rank: {type: categorical, choices: [1, 2, 4, 8, 16]}
      model.init_args.lr: {type: float, low: 1.0e-4, high: 3.0e-3, log: true}
      model.init_args.n_blocks: {type: int, low: 1, high: 5}
      model.init_args.weight_decay: {type: float, low: 1.0e-4, high: 0.1, log: true, or_zero: true}

``or_zero: true`` is the TabM paper's "zero or a log-uniform value" (its ``?loguniform``): the
trial first draws ``?<key>`` in ``{False, True}``, and only on ``True`` the value. Shipped spaces
live beside the recipes (``spaces/<family>/<name>.yaml``) and install with them.

Example:
    >>> import optuna
    >>> space = SearchSpace.from_dict({"params": {
    ...     "model.init_args.rank": {"type": "categorical", "choices": [1, 4]},
    ...     "model.init_args.lr": {"type": "float", "low": 1e-4, "high": 1e-2, "log": True},
    ...     "model.init_args.dropout": {"type": "float", "low": 0.0, "high": 0.5, "or_zero": True}}})
    >>> trial = optuna.trial.FixedTrial({"model.init_args.rank": 4, "model.init_args.lr": 1e-3,
    ...                                  "?model.init_args.dropout": False})
    >>> space.suggest(trial)
    {'model.init_args.rank': 4, 'model.init_args.lr': 0.001, 'model.init_args.dropout': 0.0}
"""

from __future__ import annotations

import difflib
import fnmatch
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.runner.recipes import RECIPES_DIR, SUFFIXES
from ripieno.framework.runner.yaml_files import InvalidYamlError, YamlFileError, load_yaml, read_yaml_text

SPACES_DIR = RECIPES_DIR / "spaces"
"""Where the shipped search spaces are (``recipes/spaces`` in a checkout, ``ripieno/recipes/spaces``)."""
TYPES = ("categorical", "float", "int")
FIELDS = {
    "categorical": {"type", "choices"},
    "float": {"type", "low", "high", "log", "step", "or_zero"},
    "int": {"type", "low", "high", "log", "step", "or_zero"},
}
OPTIONAL_PREFIX = "?"
"""Prefix of the yes/no draw that precedes an ``or_zero`` value (the TabM paper's ``?loguniform``)."""


class SearchSpaceError(RipienoInputError):
    """A search space that cannot be sampled: the message names the key and the fix."""


@dataclass(frozen=True)
class Distribution:
    """One key's distribution: ``categorical`` choices, or a ``float`` / ``int`` range.

    Args:
        kind: ``categorical``, ``float`` or ``int``.
        choices: the values of a categorical key.
        low: the smallest value of a range.
        high: the largest value of a range.
        log: sample a range log-uniformly (``low`` must be positive).
        step: the grid of a range (``int`` default 1).
        or_zero: zero with probability the sampler chooses, else a value from the range.
    """

    kind: str
    choices: tuple[Any, ...] = ()
    low: float = 0.0
    high: float = 0.0
    log: bool = False
    step: float | None = None
    or_zero: bool = False

    def suggest(self, trial: Any, key: str) -> Any:  # noqa: ANN401 - optuna.Trial or FixedTrial
        """Draw this key's value in ``trial``."""
        if self.or_zero and not trial.suggest_categorical(OPTIONAL_PREFIX + key, [False, True]):
            return 0 if self.kind == "int" else 0.0
        if self.kind == "categorical":
            return trial.suggest_categorical(key, list(self.choices))
        if self.kind == "int":
            return trial.suggest_int(
                key, int(self.low), int(self.high), step=int(self.step or 1), log=self.log
            )
        return trial.suggest_float(key, self.low, self.high, step=self.step, log=self.log)

    def example(self) -> Any:  # noqa: ANN401 - a value of the key's own type
        """A value this distribution can draw (checked against the recipe before any trial)."""
        if self.kind == "categorical":
            return self.choices[0]
        return int(self.low) if self.kind == "int" else float(self.low)

    def examples(self) -> list[Any]:
        """Every categorical choice, or both ends of a range (and zero for ``or_zero``)."""
        if self.kind == "categorical":
            return list(self.choices)
        ends = [self.low, self.high] + ([0] if self.or_zero else [])
        return [int(v) for v in ends] if self.kind == "int" else [float(v) for v in ends]


@dataclass(frozen=True)
class SearchSpace:
    """A search space: config keys and their distributions, and the recipes it suits.

    Args:
        params: each CLI key (``model.init_args.rank``) and its distribution.
        recipes: glob patterns of the shipped recipe names this space is the default for.
        description: the first comment line of its file.
        source: the file it was read from (empty for a space built in code).
    """

    params: dict[str, Distribution]
    recipes: tuple[str, ...] = ()
    description: str = ""
    source: str = ""
    name: str = field(default="")

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], source: str = "", name: str = "", description: str = ""
    ) -> SearchSpace:
        """Read and check a space's mapping (``params`` and optional ``recipes``).

        Raises:
            SearchSpaceError: an unknown field or distribution, an empty range or choice list.
        """
        where = f"{source}: " if source else ""
        if not isinstance(data, Mapping) or not isinstance(data.get("params"), Mapping) or not data["params"]:
            raise SearchSpaceError(
                f"{where}a search space needs a non-empty 'params' mapping of config keys"
                " to distributions, e.g. params: {model.init_args.lr: {type: float, low:"
                " 1.0e-4, high: 3.0e-3, log: true}}."
            )
        unknown = sorted(set(data) - {"params", "recipes"})
        if unknown:
            raise SearchSpaceError(
                f"{where}unknown field {unknown[0]!r}{_closest(unknown[0], ['params', 'recipes'])};"
                " a space has 'params' and optionally 'recipes'."
            )
        params = {str(key): _distribution(str(key), spec, where) for key, spec in data["params"].items()}
        recipes = data.get("recipes") or ()
        if isinstance(recipes, str):
            recipes = (recipes,)
        return cls(
            params=params,
            recipes=tuple(str(r) for r in recipes),
            description=description,
            source=source,
            name=name,
        )

    @classmethod
    def from_file(cls, path: str | Path, name: str = "") -> SearchSpace:
        """Read a space from a YAML file (its first comment line is its description)."""
        path = Path(path)
        try:
            text = read_yaml_text(path)
            data = load_yaml(text, str(path))  # bounded: a YAML alias bomb is refused, not expanded
        except OSError as error:
            raise SearchSpaceError(f"{path}: cannot be read ({error.strerror}); check the path.") from None
        except InvalidYamlError as error:
            at = f" at line {error.line}" if error.line is not None else ""
            raise SearchSpaceError(f"{path}: not valid YAML{at}; fix the file.") from None
        except YamlFileError as error:
            raise SearchSpaceError(str(error)) from None
        return cls.from_dict(data, source=str(path), name=name, description=_description(text))

    def suggest(self, trial: Any) -> dict[str, Any]:  # noqa: ANN401 - optuna.Trial or FixedTrial
        """Draw every key's value in ``trial``, in the space's order."""
        return {key: dist.suggest(trial, key) for key, dist in self.params.items()}

    def describe(self) -> dict[str, str]:
        """Each key and its distribution as text (what a study records to recognise its space)."""
        return {key: repr(dist) for key, dist in self.params.items()}

    def suits(self, recipe_name: str) -> bool:
        """Whether this space is a default for the shipped recipe ``recipe_name``."""
        return any(fnmatch.fnmatchcase(recipe_name, pattern) for pattern in self.recipes)


def list_spaces() -> list[SearchSpace]:
    """Every shipped search space, sorted by name (``tabular/lometab``)."""
    paths = sorted(p for suffix in SUFFIXES for p in SPACES_DIR.rglob(f"*{suffix}"))
    return sorted(
        (SearchSpace.from_file(p, name=p.relative_to(SPACES_DIR).with_suffix("").as_posix()) for p in paths),
        key=lambda s: s.name,
    )


def find_space(name: str | Path) -> SearchSpace:
    """The space ``--space`` names: a YAML file, or a shipped space's name (``tabular/lometab``).

    Raises:
        SearchSpaceError: neither a file nor a shipped space; the closest names are given.
    """
    given = Path(name).expanduser()
    if given.is_file():
        return SearchSpace.from_file(given)
    relative = given.as_posix().removeprefix("recipes/").removeprefix("spaces/")
    for candidate in [SPACES_DIR / relative] + [SPACES_DIR / (relative + s) for s in SUFFIXES]:
        if candidate.is_file():
            return SearchSpace.from_file(candidate, name=Path(relative).with_suffix("").as_posix())
    names = [s.name for s in list_spaces()]
    raise SearchSpaceError(
        f"--space {name}: no such file and no shipped space of that name"
        f"{_closest(relative, names)}; `ripieno recipes` lists the shipped spaces."
    )


def default_space(recipe_name: str | None) -> SearchSpace:
    """The shipped space whose ``recipes`` patterns match the shipped recipe ``recipe_name``.

    Raises:
        SearchSpaceError: the recipe is the user's own file, or no shipped space suits it.
    """
    if recipe_name is None:
        raise SearchSpaceError(
            "the recipe is your own file, so no shipped search space is chosen for it; pass"
            " --space with a shipped space (`ripieno recipes` lists them) or your own YAML."
        )
    suited = [space for space in list_spaces() if space.suits(recipe_name)]
    if not suited:
        raise SearchSpaceError(
            f"no shipped search space suits recipe {recipe_name}; pass --space with a"
            " shipped space (`ripieno recipes` lists them) or your own YAML."
        )
    return suited[0]


def _distribution(key: str, spec: Any, where: str) -> Distribution:  # noqa: ANN401 - YAML value
    """One checked ``Distribution`` from its YAML mapping."""
    if not isinstance(spec, Mapping):
        raise SearchSpaceError(
            f"{where}{key}: a distribution is a mapping such as {{type: float, low: 0.1,"
            f" high: 1.0}}, got {spec!r}."
        )
    kind = str(spec.get("type", ""))
    if kind not in TYPES:
        raise SearchSpaceError(
            f"{where}{key}: unknown distribution type {kind!r}{_closest(kind, TYPES)};"
            f" use one of {', '.join(TYPES)}."
        )
    extra = sorted(set(spec) - FIELDS[kind])
    if extra:
        raise SearchSpaceError(
            f"{where}{key}: {kind} has no field {extra[0]!r}{_closest(extra[0], sorted(FIELDS[kind]))}."
        )
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise SearchSpaceError(f"{where}{key}: categorical needs a non-empty list 'choices'.")
        return Distribution("categorical", choices=tuple(choices))
    try:
        low, high = float(spec["low"]), float(spec["high"])
    except (KeyError, TypeError, ValueError):
        raise SearchSpaceError(f"{where}{key}: {kind} needs numbers 'low' and 'high'.") from None
    log, step = bool(spec.get("log", False)), spec.get("step")
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise SearchSpaceError(
            f"{where}{key}: empty range low={spec['low']} > high={spec['high']}; swap them."
        )
    if log and low <= 0:
        raise SearchSpaceError(
            f"{where}{key}: log needs low > 0, got low={spec['low']}; use or_zero: true"
            " for 'zero or a log-uniform value'."
        )
    if step is not None and (log or float(step) <= 0):
        raise SearchSpaceError(f"{where}{key}: step must be positive and cannot be combined with log.")
    if kind == "int" and not (low.is_integer() and high.is_integer()):
        raise SearchSpaceError(
            f"{where}{key}: int needs whole 'low' and 'high', got {spec['low']}, {spec['high']}."
        )
    return Distribution(
        kind,
        low=low,
        high=high,
        log=log,
        step=None if step is None else float(step),
        or_zero=bool(spec.get("or_zero", False)),
    )


def _closest(word: str, options: list[str] | tuple[str, ...]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _description(text: str) -> str:
    """The first comment line of a space file."""
    for line in text.splitlines():
        if line.strip().startswith("#"):
            return line.strip().lstrip("#").strip()
        if line.strip():
            break
    return ""
