"""Configs written for a class before it grouped its arguments keep loading, with a warning per moved key.

A ripieno class that grouped flat constructor arguments (``LayerEmbeddingDataModule``: ``k`` ->
``selection.k``) lists them in ``MOVED_ARGUMENTS`` (``{old name: "group.field"}``). Every config value
ripieno's command loads from YAML (a recipe, a nested config file, a ``--key=value``) passes through
``regroup_moved_arguments``: below a ``class_path`` of such a class, each old key in ``init_args`` moves
into its group, with a ``RipienoDeprecationWarning`` naming the new key and the release that removes the
old one. A group given a plain value (``selection: loes``, from before ``selection`` was a group) moves
to the field it meant. A key given both ways is refused in one line, before anything runs. Only
``ripieno.`` class paths are looked at (imported to read their table); anything else is left as loaded.
On the command line a flat key (``--data.init_args.k=2``) is refused naming the grouped one
(``config_errors``): there is no file to keep working.

Example:
    >>> import warnings
    >>> config = {"data": {"class_path": "ripieno.datamodules.LayerEmbeddingDataModule",
    ...                    "init_args": {"k": 3, "selection": "loes", "batch_size": 8}}}
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     regroup_moved_arguments(config, "old.yaml")["data"]["init_args"]
    {'batch_size': 8, 'selection': {'method': 'loes', 'k': 3}}
    >>> print(caught[1].message)  # doctest: +ELLIPSIS
    old.yaml: data.init_args.k is now data.init_args.selection.k (ripieno...LayerEmbeddingDataModule); ...
"""

from __future__ import annotations

import importlib
import inspect
import warnings
from typing import Any

from ripieno.framework.errors import REMOVED_IN, RipienoDeprecationWarning, RipienoInputError


class MovedArgumentError(RipienoInputError):
    """An argument given both under its old flat key and under its group."""


def regroup_moved_arguments(value: Any, where: str, path: str = "") -> Any:  # noqa: ANN401 - loaded YAML
    """``value`` with the flat keys of grouped ripieno classes moved into their groups (module docstring).

    Args:
        value: a loaded config value (dicts and lists are walked; they are changed in place).
        where: the file (or "the value given") for the warning's first words.
        path: the key of ``value`` in the whole config, for the messages.

    Returns:
        ``value``, regrouped.

    Raises:
        MovedArgumentError: a setting given both as its old key and in its group.
    """
    if isinstance(value, list):
        for i, item in enumerate(value):
            regroup_moved_arguments(item, where, f"{path}[{i}]")
    if not isinstance(value, dict):
        return value
    init_args = value.get("init_args")
    if isinstance(value.get("class_path"), str) and isinstance(init_args, dict):
        _regroup(value["class_path"], init_args, where, f"{path}.init_args" if path else "init_args")
    for key, item in value.items():
        regroup_moved_arguments(item, where, f"{path}.{key}" if path else str(key))
    return value


def _regroup(class_path: str, init_args: dict[str, Any], where: str, section: str) -> None:
    moved, parameters = _moved_arguments(class_path)
    # a group given a plain value first: it becomes the group the other old keys then move into
    for name in sorted((n for n in init_args if n in moved), key=lambda n: moved[n].split(".")[0] != n):
        group, field = moved[name].split(".", 1)
        if name in parameters and (name != group or isinstance(init_args[name], dict | None)):
            continue  # a current argument (a group given as a group)
        old = init_args.pop(name)
        target = init_args.get(group) if name != group else None
        if target is None:
            target = init_args[group] = {}
        if not isinstance(target, dict):
            raise MovedArgumentError(
                f"{where}: {section}.{group} is a group of settings and {section}.{name} belongs in it; give"
                f" {section}.{moved[name]} instead of {section}.{name}.")
        if field in target:
            raise MovedArgumentError(
                f"{where}: {section}.{name} and {section}.{moved[name]} are the same setting, given twice;"
                f" keep {section}.{moved[name]}.")
        target[field] = old
        warnings.warn(f"{where}: {section}.{name} is now {section}.{moved[name]} ({class_path}); the flat key"
                      f" is removed in ripieno {REMOVED_IN}", RipienoDeprecationWarning, stacklevel=2)


def _moved_arguments(class_path: str) -> tuple[dict[str, str], frozenset[str]]:
    """The class's ``MOVED_ARGUMENTS`` and constructor parameters (none for other classes)."""
    if not class_path.startswith("ripieno."):
        return {}, frozenset()
    module_name, _, name = class_path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError):
        return {}, frozenset()  # the parser says what is wrong with the class path
    moved = getattr(cls, "MOVED_ARGUMENTS", None)
    if not isinstance(moved, dict) or not moved:
        return {}, frozenset()
    return moved, frozenset(inspect.signature(cls).parameters)
