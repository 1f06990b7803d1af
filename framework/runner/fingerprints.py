"""What decides a stored result, recorded beside it and compared when a study or benchmark goes on.

A tune study and each benchmark cell record a *fingerprint*: the resolved recipe (overrides
included), the search space, the model's parameters, and the identity of the data: for a file
a config or benchmark names, its path, size, modification time and SHA-256 of its content; for a
shipped table, the package and version that carry it. Continuing a store with another fingerprint
is refused in one line naming the first difference (``first_difference``); a file whose content
is unchanged but whose modification time moved (copied, touched) is the same data.

Example:
    >>> first_difference({"model": {"rank": 4, "k": 8}}, {"model": {"rank": 8, "k": 8}})
    'model.rank: 4 then, 8 now'
    >>> first_difference({"a": 1}, {"a": 1}) is None
    True
"""

from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

CHUNK = 1 << 20
COMPARED_FILE_FIELDS = ("size", "sha256")
"""A data file is the same when these agree (its ``mtime`` is recorded, and shown, not compared)."""


def file_identity(path: str | Path) -> dict[str, Any]:
    r"""Size, modification time (ns) and SHA-256 of a file's content.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "t.csv"
        >>> _ = path.write_text("a,b\n1,2\n")
        >>> identity = file_identity(path)
        >>> identity["size"], identity["sha256"][:12]
        (8, '492d5ea49605')
    """
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    stat = Path(path).stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest.hexdigest()}


def _strings(value: Any) -> Iterator[str]:  # noqa: ANN401 - any parsed config value
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def data_files(config: Any) -> dict[str, dict[str, Any]]:  # noqa: ANN401 - any parsed config
    """The identity of every existing file a config's string values name (relative to this folder).

    Example:
        >>> data_files({"data": {"path": "no/such/file.csv", "target": "y"}})
        {}
    """
    found: dict[str, dict[str, Any]] = {}
    for text in _strings(config):
        if not text or len(text) > 4096 or "\n" in text or text in found:
            continue
        try:
            if Path(text).expanduser().is_file():
                found[text] = file_identity(Path(text).expanduser())
        except OSError:  # a name too long for the file system is no file
            continue
    return found


def package_version(package: str) -> str:
    """``package version`` of an installed distribution (``package (not installed)`` otherwise).

    Example:
        >>> package_version("no-such-distribution-ripieno")
        'no-such-distribution-ripieno (not installed)'
    """
    try:
        return f"{package} {importlib.metadata.version(package)}"
    except importlib.metadata.PackageNotFoundError:
        return f"{package} (not installed)"


def without_keys(config: dict[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    """A deep copy of ``config`` without the dotted ``keys`` (``model.init_args.rank``).

    Example:
        >>> without_keys({"model": {"init_args": {"rank": 4, "k": 8}}}, ["model.init_args.rank", "x.y"])
        {'model': {'init_args': {'k': 8}}}
    """
    result = copy.deepcopy(config)
    for key in keys:
        node: Any = result
        *parents, last = key.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return result


ADDED_OPTION_DEFAULTS: dict[str, Any] = {
    "calibration_size": 0.0,  # TabularDataModule: no calibration rows, the old splits
    "regression_head": "point",  # TabularEnsembleModule: the old head, bitwise (test_distributional_heads)
    "quantile_levels": [0.05, 0.5, 0.95],  # read only by regression_head="quantile"
    "beta_nll": 0.0,  # read only by regression_head="gaussian"
}
"""Options added after stores were written, and the value at which each does what the code did before.

A store recorded before an option existed lacks its key; the option at this value is not a change.
"""


def _show(value: Any) -> str:  # noqa: ANN401 - any recorded value
    text = json.dumps(value, sort_keys=True, default=str) if isinstance(value, dict | list) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def first_difference(old: Any, new: Any, prefix: str = "") -> str | None:  # noqa: ANN401
    """``key: <old> then, <new> now`` for the first key (in ``new``'s order) whose values differ, or ``None``.

    Data file identities (mappings with ``sha256``) compare by size and content only.
    """
    if isinstance(old, dict) and isinstance(new, dict):
        if "sha256" in old and "sha256" in new:
            if all(old.get(f) == new.get(f) for f in COMPARED_FILE_FIELDS):
                return None
            sizes = f"{old.get('size')} bytes then, {new.get('size')} now"
            return f"{prefix or 'file'}: its content changed ({sizes})"
        for key in [*new, *(k for k in old if k not in new)]:
            where = f"{prefix}.{key}" if prefix else str(key)
            if key not in old:
                if key in ADDED_OPTION_DEFAULTS and _comparable(new[key]) == ADDED_OPTION_DEFAULTS[key]:
                    continue  # an option added since, at the default that does what the old code did
                return f"{where}: absent then, {_show(new[key])} now"
            if key not in new:
                return f"{where}: {_show(old[key])} then, absent now"
            found = first_difference(old[key], new[key], where)
            if found is not None:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        for index, (a, b) in enumerate(zip(old, new, strict=True)):
            found = first_difference(a, b, f"{prefix}[{index}]")
            if found is not None:
                return found
        return None
    if old == new and type(old) is type(new) or _same_number(old, new):
        return None
    return f"{prefix or 'value'}: {_show(old)} then, {_show(new)} now"


def _same_number(a: Any, b: Any) -> bool:  # noqa: ANN401
    numbers = (int, float)
    return isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool) \
        and not isinstance(b, bool) and float(a) == float(b)


def digest(fingerprint: Any) -> str:  # noqa: ANN401 - JSON-able
    """A short SHA-256 of a fingerprint's canonical JSON, with file modification times left out.

    Example:
        >>> digest({"a": 1, "b": [1, 2]}) == digest({"b": [1, 2], "a": 1})
        True
        >>> touched = {"f": {"size": 3, "sha256": "ab", "mtime_ns": 2}}
        >>> digest({"f": {"size": 3, "sha256": "ab", "mtime_ns": 1}}) == digest(touched)
        True
    """
    text = json.dumps(_comparable(fingerprint), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _comparable(value: Any) -> Any:  # noqa: ANN401
    if isinstance(value, dict):
        if "sha256" in value:
            return {f: value.get(f) for f in COMPARED_FILE_FIELDS}
        return {k: _comparable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_comparable(v) for v in value]
    return value
