"""Does a checkpoint hold the model a config describes? The differences, listed.

Plain LightningCLI copies a checkpoint's hyperparameters over the config when ``--ckpt_path``
is given, so a run can train a model other than the one its config names, under that
config's name. ripieno's CLI does the opposite: the config decides, and a checkpoint made
with another model class, other hyperparameters or another data spec stops the run before
it trains. ``hparam_differences`` lists what differs, one line per setting, with nested
settings (the data spec) flattened to dotted names.

Example:
    >>> checkpoint = {"_class_path": "pkg.Model", "rank": 4, "lr": 0.002,
    ...               "data_spec": {"n_classes": 2, "bins": [0.1, 0.5, 0.9]}}
    >>> config = {"_class_path": "pkg.Model", "rank": 8, "lr": 0.002,
    ...           "data_spec": {"n_classes": 3, "bins": [0.1, 0.4, 0.8]}}
    >>> for line in hparam_differences(checkpoint, config):
    ...     print(line)
    model.init_args.data_spec.bins[1]: checkpoint 0.5, config 0.4 (2 of 3 positions differ)
    model.init_args.data_spec.n_classes: checkpoint 2, config 3
    model.init_args.rank: checkpoint 4, config 8
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

CLASS_KEY = "_class_path"
IGNORED_KEYS = frozenset({"_instantiator"})
"""Bookkeeping that Lightning's CLI stores beside the hyperparameters."""
RUN_ONLY_ARGS = frozenset({"compile", "compile_mode"})
"""Model arguments that change how the network runs, not what it is: a checkpoint trained with
``compile: true`` resumes, tests and predicts with ``compile: false`` and the other way round,
and a checkpoint saved before the argument existed is not refused for lacking it."""

_MISSING = object()
_MAX_VALUE_CHARS = 60


class Difference(NamedTuple):
    """One setting that differs: its top-level argument (``class_path`` for the class) and its line."""

    key: str
    line: str


def hparam_differences(checkpoint: Mapping[str, Any], config: Mapping[str, Any], *,
                       prefix: str = "model", skip: Iterable[str] = ()) -> list[str]:
    """Every setting whose value differs between a checkpoint's and a config's hyperparameters.

    The lines of ``compare_hparams`` (arguments and return there).
    """
    return [difference.line for difference in compare_hparams(checkpoint, config, prefix=prefix, skip=skip)]


def compare_hparams(checkpoint: Mapping[str, Any], config: Mapping[str, Any], *,
                    prefix: str = "model", skip: Iterable[str] = ()) -> list[Difference]:
    """Every setting whose value differs between a checkpoint's and a config's hyperparameters.

    Args:
        checkpoint: The checkpoint's ``hyper_parameters`` (or ``datamodule_hyper_parameters``).
        config: The same for the model the config describes, in the form Lightning's CLI
            saves (``_class_path`` plus the init arguments).
        prefix: The config section, used in the setting names (``model`` or ``data``).
        skip: Top-level keys to leave out (e.g. link targets not known yet).

    Returns:
        Sorted ``Difference`` s, lines ``<setting>: checkpoint <value>, config <value>``; the class first.
    """
    skipped = IGNORED_KEYS | RUN_ONLY_ARGS | set(skip)
    found = []
    ours, theirs = checkpoint.get(CLASS_KEY), config.get(CLASS_KEY)
    if ours is not None and theirs is not None and ours != theirs:
        found.append(Difference("class_path", f"{prefix}.class_path: checkpoint {ours}, config {theirs}"))
    old = {k: v for k, v in checkpoint.items() if k not in skipped and k != CLASS_KEY}
    new = {k: v for k, v in config.items() if k not in skipped and k != CLASS_KEY}
    head = f"{prefix}.init_args"
    flat_old, flat_new = _flatten(old, head), _flatten(new, head)
    for key in sorted(flat_old.keys() | flat_new.keys()):
        a, b = flat_old.get(key, _MISSING), flat_new.get(key, _MISSING)
        if not same_value(a, b):
            found.append(Difference(key[len(head) + 1:].split(".", 1)[0], _difference(key, a, b)))
    return found


def section_hparams(section: Mapping[str, Any]) -> dict[str, Any]:
    """The ``hyper_parameters`` Lightning's CLI saves for a config section.

    A ``{class_path, init_args, dict_kwargs}`` section becomes ``{_class_path, **arguments}``;
    any other mapping is kept as it is.

    Example:
        >>> section_hparams({"class_path": "pkg.Model", "init_args": {"rank": 4}})
        {'_class_path': 'pkg.Model', 'rank': 4}
    """
    if "class_path" not in section:
        return dict(section)
    return {CLASS_KEY: section["class_path"], **(section.get("init_args") or {}),
            **(section.get("dict_kwargs") or {})}


def _difference(key: str, a: Any, b: Any) -> str:  # noqa: ANN401
    """One line for one differing setting; equal-length lists say where they first differ."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        where = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if not same_value(x, y)]
        more = f" ({len(where)} of {len(a)} positions differ)" if len(where) > 1 else ""
        i = where[0]
        return f"{key}[{i}]: checkpoint {_show(a[i])}, config {_show(b[i])}{more}"
    return f"{key}: checkpoint {_show(a)}, config {_show(b)}"


def _flatten(values: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}.{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, name))
        else:
            flat[name] = value
    return flat


def same_value(a: Any, b: Any) -> bool:  # noqa: ANN401
    """Equal as hyperparameters: lists and tuples alike, ``True`` never ``1``."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b


def _show(value: Any) -> str:  # noqa: ANN401
    if value is _MISSING:
        return "(not set)"
    if isinstance(value, list | tuple) and len(repr(value)) > _MAX_VALUE_CHARS:
        return f"a list of {len(value)} values"
    text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."
