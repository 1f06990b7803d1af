r"""Config errors that lead with the offending key and the closest valid one.

jsonargparse reports a typo in a recipe or an override after the whole usage text, as a
nested list of the union types it tried (``Option 'rnak' is not accepted`` under ``Parser key
"model"``). ``explain_config_error`` turns that report into one line that names the key as
the user would write it, what is wrong and the closest valid key, followed by the parser's
own details for the cases it does not recognise.

Example:
    >>> message = '''Parser key "model":
    ...   Does not validate against any of the Union subtypes
    ...   Errors:
    ...     - Problem with given class_path 'ripieno.framework.TabularEnsembleModule':
    ...         Option 'rnak' is not accepted'''
    >>> first = explain_config_error(message, option_names=[]).splitlines()[0]
    >>> print(first.replace("; ", ";\n"))
    model.init_args.rnak is not an argument of ripieno.framework.TabularEnsembleModule;
    did you mean model.init_args.rank?
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import re
from collections.abc import Iterable

from ripieno.framework.errors import RipienoInputError

_PARSER_KEY = re.compile(r'Parser key "([^"]+)"')
_CLASS_PATH = re.compile(r"Problem with given class_path '([^']+)'")
_NOT_ACCEPTED = re.compile(r"Option '([^']+)' is not accepted|Key \"([^\"]+)\" is not expected")
_UNRECOGNIZED = re.compile(r"[Uu]nrecognized arguments: (.+)")
_EXPECTED = re.compile(r"Expected a <class '([^']+)'>")
_GIVEN = re.compile(r"Given value: (.+)")
_NOT_SUBCLASS = re.compile(r"Import path (\S+) does not correspond to a subclass of (\w+)")
_NESTED_VALUE = re.compile(r"Expected a (.+?)\. Got value: (.+)")
MAX_DETAIL_LINES = 12


class ConfigError(RipienoInputError):
    """A recipe, config file or command-line override that the CLI cannot parse."""


def explain_config_error(message: str, option_names: Iterable[str], config_files: Iterable[str] = ()) -> str:
    """The parser's error with a first line naming the offending key and the closest valid one.

    Args:
        message: jsonargparse's error text.
        option_names: The subcommand's known option names (``--trainer.max_epochs`` ...), for
            unrecognised command-line arguments.
        config_files: The config files given (``-c``), named when one is not valid YAML.

    Returns:
        The explanation: one line, then up to ``MAX_DETAIL_LINES`` of the parser's details; only
        the line for a key that moved or a class that is not of the type asked for (the
        parser's details, a list of union types tried, add nothing there).
    """
    whole = _moved_init_args(message) or _not_a_subclass(message)
    if whole is not None:
        return whole
    first = (_unknown_init_arg(message) or _bad_init_arg_value(message)
             or _unrecognized(message, option_names) or _wrong_value(message)
             or _bad_yaml(message, list(config_files)))
    details = [line for line in message.strip().splitlines() if line.strip()]
    if first is None:
        first = _first_problem(details)
    lines = [first if first.endswith(("?", ".")) else first + "."]
    if details:
        lines.append("Details from the config parser:")
        lines += ["  " + line for line in details[:MAX_DETAIL_LINES]]
    lines.append("See the settings with: ripieno <subcommand> -c <recipe> --print_config")
    return "\n".join(lines)


def _moved_init_args(message: str) -> str | None:
    """Flat arguments that a class now reads from a group: the keys its ``MOVED_ARGUMENTS`` names instead.

    A class that grouped its arguments keeps a table ``{old name: "group.name"}``; a name given
    flat (or a group given a plain value, as ``selection: loes``) is answered with the grouped
    keys, every one of them when the parser shows the whole mapping that was given.
    """
    key, class_path = _PARSER_KEY.search(message), _CLASS_PATH.search(message)
    cls = _imported(class_path.group(1)) if key and class_path else None
    moved = getattr(cls, "MOVED_ARGUMENTS", None)
    if not (key and class_path and isinstance(moved, dict)):
        return None
    given_line = _GIVEN.search(message)
    try:
        given = ast.literal_eval(given_line.group(1).strip()) if given_line else None
    except (ValueError, SyntaxError):
        given = None
    init_args = given.get("init_args") if isinstance(given, dict) else None
    names = list(init_args) if isinstance(init_args, dict) else []
    option = _NOT_ACCEPTED.search(message)
    names += [option.group(1) or option.group(2)] if option else []
    plain = re.search(r'Parser key "([^"]+)":\s*Unable to load config', message)  # a group given a value
    current = set(_arguments_of(class_path.group(1)))  # a group's own name: only when given a plain value
    names = [name for name in names if name in moved and name not in current]
    names += [plain.group(1)] if plain and plain.group(1) in moved else []
    section = f"{key.group(1)}.init_args"
    pairs = {f"{section}.{name}": f"{section}.{moved[name]}" for name in dict.fromkeys(names)}
    if not pairs:
        return None
    keys = "; ".join(f"{old} is now {new}" for old, new in pairs.items())
    return f"{class_path.group(1)} groups its settings: {keys} (see its docstring for the grouped form)."


def _not_a_subclass(message: str) -> str | None:
    """A ``class_path`` of a class that is not of the argument's type (a source that is no datamodule)."""
    keys, found = _PARSER_KEY.findall(message), _NOT_SUBCLASS.search(message)
    if len(keys) < 2 or not (found and _CLASS_PATH.search(message)):
        return None
    return (f"{keys[0]}.init_args.{keys[1]}: {found.group(1)} is not a {found.group(2)}; give the class_path"
            f" of one.")


def _unknown_init_arg(message: str) -> str | None:
    """``Option 'x' is not accepted`` for a class: the key and the class's closest argument."""
    key, class_path, option = _PARSER_KEY.search(message), _CLASS_PATH.search(message), \
        _NOT_ACCEPTED.search(message)
    if not (key and class_path and option):
        return None
    name = option.group(1) or option.group(2)
    full = f"{key.group(1)}.init_args.{name}"
    close = difflib.get_close_matches(name, _arguments_of(class_path.group(1)), n=1, cutoff=0.6)
    hint = f"; did you mean {key.group(1)}.init_args.{close[0]}?" if close else ""
    return f"{full} is not an argument of {class_path.group(1)}{hint}"


def _bad_init_arg_value(message: str) -> str | None:
    """A class argument with a value of the wrong type or outside its choices."""
    keys, class_path = _PARSER_KEY.findall(message), _CLASS_PATH.search(message)
    value = _NESTED_VALUE.search(message)
    if len(keys) < 2 or not (class_path and value):
        return None
    expected = re.sub(r"<class '([^']+)'>", r"\1", value.group(1).replace("typing.Literal", "one of "))
    return (f"{keys[0]}.init_args.{keys[1]} of {class_path.group(1)} expects {expected},"
            f" got {value.group(2).strip()!r}")


def _unrecognized(message: str, option_names: Iterable[str]) -> str | None:
    match = _UNRECOGNIZED.search(message)
    if not match:
        return None
    given = match.group(1).split()[0]
    flag = given.split("=", 1)[0]
    close = difflib.get_close_matches(flag, list(option_names), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{flag.lstrip('-')} is not a setting of this command (given as {given}){hint}"


def _wrong_value(message: str) -> str | None:
    key, expected, given = _PARSER_KEY.search(message), _EXPECTED.findall(message), _GIVEN.search(message)
    if not (key and expected and given) or _CLASS_PATH.search(message):
        return None
    kinds = " or ".join(dict.fromkeys("None" if kind == "NoneType" else kind for kind in expected))
    if kinds == "None":  # the real expectation is worded otherwise (an import path, a file)
        return None
    return f"{key.group(1)} expects {kinds}, got {given.group(1).strip()!r}"


def _bad_yaml(message: str, config_files: list[str]) -> str | None:
    if "Problems parsing config" not in message:
        return None
    where = next((line.strip() for line in message.splitlines() if "line " in line), "")
    files = ", ".join(config_files) or "a config file"
    return f"{files}: not a valid YAML config ({where or message.splitlines()[0]})"


def _first_problem(details: list[str]) -> str:
    """The parser's key and its first listed problem, when nothing more specific is known."""
    if not details:
        return "the config could not be parsed"
    key = _PARSER_KEY.match(details[0].strip())
    if key and len(details) > 1:
        return f"{key.group(1)}: {details[1].strip().removeprefix('- ')}"
    return details[0].strip()


def _imported(class_path: str) -> type | None:
    """The class named by its import path (``None`` if it cannot be imported)."""
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None


def _arguments_of(class_path: str) -> list[str]:
    """The keyword arguments of a class named by its import path (empty if it cannot be imported)."""
    try:
        parameters = inspect.signature(_imported(class_path)).parameters.values()
    except (ValueError, TypeError):
        return []
    return [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
