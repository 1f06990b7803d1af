r"""A table whose header repeats a column name is refused, from its raw header.

pandas reads a header ``a,b,a`` as columns ``a``, ``b``, ``a.1``: the table then has an ``a``
that holds the *first* copy and an extra column that nothing uses, so a model trains (or
predicts) on the wrong values without a word. ``check_unique_columns`` reads the header as
written (the first row of a CSV/TSV parsed without a header, with the same separator,
encoding and compression; a Parquet file's schema) and raises one line naming the file, the
repeated names and the fix. It does not guess from ``.1`` suffixes: a real column may be
called ``a.1``.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> file = Path(tempfile.mkdtemp()) / "t.csv"
    >>> _ = file.write_text("a,b,a,a.1\n1,2,3,4\n")
    >>> header_names(file, "csv")
    ['a', 'b', 'a', 'a.1']
    >>> try:
    ...     check_unique_columns(file, header_names(file, "csv"))
    ... except ValueError as error:
    ...     print(str(error).split(", so")[0].split(": ", 1)[1])
    has the column name 'a' more than once in its header (columns 1 and 3)
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pandas as pd

from ripieno.framework.errors import file_problem

TableKind = Literal["csv", "tsv", "parquet"]
SEPARATORS = {"csv": ",", "tsv": "\t"}


def header_names(file: Path, kind: TableKind, encoding: str = "utf-8") -> list[str]:
    """The column names of ``file`` as its header writes them (before pandas renames repeats).

    CSV and TSV files go through pandas' own parser with ``header=None`` and one row, so
    quoting, a byte-order mark, leading blank lines and compression are read exactly as the
    table itself is; Parquet names come from the schema (pyarrow).
    """
    if kind == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(file).names)
    first = pd.read_csv(file, sep=SEPARATORS[kind], encoding=encoding, header=None, nrows=1, dtype=str,
                        keep_default_na=False)
    return [str(name) for name in first.iloc[0].tolist()] if len(first) else []


def duplicated_columns(names: list[str]) -> dict[str, list[int]]:
    """Each name that ``names`` repeats, with its 1-based positions (empty names are not compared).

    pandas gives an empty header field a name of its own (``Unnamed: 3``), so two of them are
    not one column read twice.
    """
    positions: dict[str, list[int]] = {}
    for number, name in enumerate(names, start=1):
        if name.strip():
            positions.setdefault(name, []).append(number)
    return {name: where for name, where in positions.items() if len(where) > 1}


def check_unique_columns(file: str | Path, names: list[str], error: type[Exception] = ValueError) -> None:
    """Raise ``error`` (one line: the file, the repeated names, the fix) if ``names`` repeats one.

    Args:
        file: the table file, for the message.
        names: its header as written (``header_names``).
        error: the exception class raised.
    """
    repeated = duplicated_columns(names)
    if not repeated:
        return
    places = [f"{name!r} (columns {' and '.join(map(str, where))})" for name, where in repeated.items()]
    if len(places) == 1:
        name, where = places[0].split(" (", 1)
        problem = f"has the column name {name} more than once in its header ({where}"
    else:
        problem = f"repeats column names in its header: {', '.join(places)}"
    raise error(file_problem(
        file, f"{problem}, so ripieno cannot tell which copy holds the data",
        "rename or remove the extra copies so that every column name is unique"))
