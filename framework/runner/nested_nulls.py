"""``null`` overrides below a class's ``init_args``, handed to jsonargparse in a form it reads right.

jsonargparse (4.51 to 4.53 at least) passes an override two levels below a class, such as
``--data.init_args.selection.scores_path=null``, to the class's own parser as the text
``--selection.scores_path=None``: a ``str | None`` setting silently becomes the text
``'None'``, and other types refuse it. The same override written one level up as a mapping,
``--data.init_args.selection={"scores_path": null}``, is merged into the configured group as
intended, so ``nest_null_overrides`` rewrites every such ``null`` override into that form before
the command parses its arguments. Other overrides are left as they are.
"""

from __future__ import annotations

import json
from typing import Any

#: The command-line spellings of ``null`` (YAML's, and Python's ``None``).
NULLS = frozenset({"null", "Null", "NULL", "~", "None"})
_INIT_ARGS = ".init_args."


def nest_null_overrides(args: list[Any]) -> list[Any]:
    """``args`` with each ``--<class>.init_args.<a>.<b>...=null`` as ``--<class>.init_args.<a>={"b": ...}``.

    Both ``--key=null`` and ``--key null`` are rewritten; anything that is not a string, or not
    a ``null`` two levels or more below an ``init_args``, is kept.

    Example:
        >>> nest_null_overrides(["--data.init_args.selection.scores_path=null", "--data.init_args.k=null"])
        ['--data.init_args.selection={"scores_path": null}', '--data.init_args.k=null']
        >>> nest_null_overrides(["--data.init_args.source.init_args.max_rows", "null"])
        ['--data.init_args.source={"init_args": {"max_rows": null}}']
    """
    out: list[Any] = []
    i = 0
    while i < len(args):
        arg, following = args[i], args[i + 1] if i + 1 < len(args) else None
        key, value, used = None, None, 1
        if isinstance(arg, str) and arg.startswith("--"):
            if "=" in arg:
                key, value = arg[2:].split("=", 1)
            elif following in NULLS:
                key, value, used = arg[2:], following, 2
        head, _, rest = (key or "").partition(_INIT_ARGS)
        if value in NULLS and rest and "." in rest:
            first, *path = rest.split(".")
            nested: Any = None
            for part in reversed(path):
                nested = {part: nested}
            out.append(f"--{head}{_INIT_ARGS}{first}={json.dumps(nested)}")
        else:
            out.extend(args[i:i + used])
        i += used
    return out
