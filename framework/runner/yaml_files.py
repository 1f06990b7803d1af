r"""Reading the YAML files users give ripieno, with limits on their size and on alias expansion.

A YAML alias (``*name``) repeats the value its anchor (``&name``) marks without repeating its
text, so a few lines that nest aliases (the "billion laughs") stand for billions of values: read
plainly, such a file fills the memory before anything can be said about it. ``load_yaml`` first
composes the document (aliases stay shared nodes, so this is as cheap as the text), counts the
values the aliases add when expanded, memoised by node so that the count itself is linear in
the file, and refuses, in one line and before building anything:

* a file larger than ``MAX_FILE_BYTES``;
* aliases that expand to more than ``MAX_ALIAS_VALUES`` values beyond the file's own;
* an alias inside the value it names (a recursive alias);
* text that is not YAML (with its line).

Everything else loads exactly as ``yaml.safe_load`` loads it, merge keys (``<<: *defaults``)
included. ``ripieno fit/validate/test/predict`` read recipes through jsonargparse: ``RipienoCLI``
parses in the ``BOUNDED_YAML_MODE`` that ``use_bounded_yaml`` registers (jsonargparse's own YAML
loader, after the same checks), so other parsers in the process keep jsonargparse's defaults.

Example:
    >>> load_yaml("defaults: &d {lr: 0.1}\nrun: {<<: *d, seed: 1}\n", "recipe.yaml")
    {'defaults': {'lr': 0.1}, 'run': {'lr': 0.1, 'seed': 1}}
    >>> bomb = "a: &a [x, x]\n" + "".join(
    ...     f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefg", "bcdefgh"))
    >>> try:
    ...     load_yaml(bomb, "bomb.yaml")  # 20 million values once expanded
    ... except YamlFileError as error:
    ...     print(error)
    bomb.yaml: its YAML aliases expand to more than 100,000 values (a YAML alias bomb?); write the
    values out instead of nesting aliases.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from ripieno.framework.errors import RipienoInputError, file_problem, first_line
from ripieno.framework.runner.moved_arguments import regroup_moved_arguments

MAX_ALIAS_VALUES = 100_000
"""Most values (YAML nodes) that aliases may add to a file once expanded.

Measured on the shipped recipes, benchmarks and spaces (66 files): the largest, and the only
one whose aliases add anything, is ``recipes/benchmarks/tabular_paper.yaml`` (4,702 bytes):
its aliases add 228 values to its own 527, 755 once expanded. Every other file is at most 134
values. The classic bomb (9 levels of 9 aliases) adds about 436 million."""
MAX_FILE_BYTES = 10 * 1024 * 1024
"""Largest YAML file read (10 MiB; the largest shipped file is 4,702 bytes)."""
BOUNDED_YAML_MODE = "ripieno_yaml"
"""The jsonargparse ``parser_mode`` that loads like its ``yaml`` mode, after ``load_yaml``'s checks."""


class YamlFileError(RipienoInputError):
    """A YAML file ripieno will not read: too large, an alias bomb, a recursive alias."""


class InvalidYamlError(YamlFileError):
    """Text that is not YAML; ``line`` (1-based, ``None`` if unknown) and ``problem`` say where and what."""

    def __init__(self, where: str, line: int | None, problem: str) -> None:
        """The one-line message for ``where``, naming ``line`` and the parser's ``problem``."""
        at = f" (line {line})" if line is not None else ""
        super().__init__(file_problem(where, f"not valid YAML{at}: {problem}", "fix the file"))
        self.where, self.line, self.problem = where, line, problem

    def __reduce__(self) -> tuple[type[InvalidYamlError], tuple[str, int | None, str]]:
        """Pickled with its own arguments (an error raised in a worker process reaches its parent)."""
        return type(self), (self.where, self.line, self.problem)


class _SafeLoader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader; ripieno's own class, so nothing is added to PyYAML's."""


def load_yaml(source: str | os.PathLike[str], where: str | None = None) -> Any:  # noqa: ANN401
    r"""Load a YAML document as ``yaml.safe_load`` does, refusing what is too large to build.

    Args:
        source: The YAML text (a ``str``), or the path of a YAML file (a ``Path``).
        where: How messages name the file (default: the path, or ``"the YAML text"``).

    Returns:
        The document's value (``None`` for an empty document).

    Raises:
        YamlFileError: a file over ``MAX_FILE_BYTES``, aliases that expand past
            ``MAX_ALIAS_VALUES`` or into themselves; ``InvalidYamlError`` for text that is
            not YAML. The message is one line.
        OSError: the file cannot be read.

    Example:
        >>> load_yaml("a: &x [1, 2]\nb: *x\n")
        {'a': [1, 2], 'b': [1, 2]}
        >>> try:
        ...     load_yaml("a: [1, 2\n", "my.yaml")
        ... except InvalidYamlError as error:
        ...     print(error, error.line, sep="\n")
        my.yaml: not valid YAML (line 2): while parsing a flow sequence; fix the file.
        2
    """
    if isinstance(source, str):
        text, where = source, where or "the YAML text"
        check_size(len(text.encode("utf-8", "surrogatepass")), where)
    else:
        where = where or os.fspath(source)
        text = read_yaml_text(source, where)
    loader = _SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            raise InvalidYamlError(where, mark.line + 1 if mark is not None else None,
                                   first_line(error)) from None
        if node is None:
            return None
        check_aliases(node, where)
        return loader.construct_document(node)
    except RecursionError:
        raise YamlFileError(file_problem(where, "its YAML nests values too deeply to read",
                                         "flatten the nesting")) from None
    finally:
        loader.dispose()


def read_yaml_text(path: str | os.PathLike[str], where: str | None = None) -> str:
    r"""A YAML file's text (UTF-8), refused before it is read when it is over ``MAX_FILE_BYTES``.

    Raises:
        YamlFileError: the file is too large.
        OSError: it cannot be read.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     path = Path(folder) / "space.yaml"
        ...     _ = path.write_text("params: {}\n")
        ...     read_yaml_text(path)
        'params: {}\n'
    """
    where = where or os.fspath(path)
    check_size(os.stat(path).st_size, where)
    return Path(path).read_text(encoding="utf-8")


def check_size(size: int, where: str) -> None:
    """Refuse ``size`` bytes of YAML over ``MAX_FILE_BYTES``.

    Example:
        >>> try:
        ...     check_size(20 * 2**20, "big.yaml")
        ... except YamlFileError as error:
        ...     print(error)
        big.yaml: is 20,971,520 bytes, more than the 10,485,760 a YAML file ripieno reads may have;
        make it smaller.
    """
    if size > MAX_FILE_BYTES:
        raise YamlFileError(file_problem(
            where, f"is {size:,} bytes, more than the {MAX_FILE_BYTES:,} a YAML file ripieno reads may have",
            "make it smaller"))


def check_aliases(root: yaml.Node, where: str, limit: int = MAX_ALIAS_VALUES) -> int:
    r"""Refuse a composed document whose aliases add more than ``limit`` values, or nest in themselves.

    Each node's size once expanded (itself plus its items', keys and values both) is computed
    once, in an explicit depth-first walk (no recursion); an alias is a node met again, so
    the walk visits each node of the composed graph once. The values aliases add are the
    expanded size less the number of distinct nodes; a subtree already past the limit stops
    the walk (its own excess is never more than the whole document's).

    Args:
        root: The document's node (``yaml.compose`` or a loader's ``get_single_node``).
        where: How messages name the file.
        limit: Most values aliases may add.

    Returns:
        The document's size once expanded (values, counting mapping keys).

    Raises:
        YamlFileError: one line naming the file, the problem and the fix.

    Example:
        >>> check_aliases(yaml.compose("a: &x [1, 2]\nb: *x\n"), "f.yaml")
        9
        >>> try:
        ...     check_aliases(yaml.compose("&x [1, *x]"), "loop.yaml")
        ... except YamlFileError as error:
        ...     print(error)
        loop.yaml: the YAML value anchored at line 1 contains an alias to itself (a recursive alias);
        write the values out instead.
    """
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()  # entered, not finished: the path from the root
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, finished = stack.pop()
        children = _children(node)
        if finished:
            open_nodes.discard(id(node))
            size = 1 + sum(sizes[id(child)] for child in children)
            sizes[id(node)] = size
            if size - len(sizes) > limit:
                raise YamlFileError(file_problem(
                    where, f"its YAML aliases expand to more than {limit:,} values (a YAML alias bomb?)",
                    "write the values out instead of nesting aliases"))
            continue
        if id(node) in sizes:
            continue
        open_nodes.add(id(node))
        stack.append((node, True))
        for child in children:
            if id(child) in open_nodes:
                raise YamlFileError(file_problem(
                    where, f"the YAML value anchored at line {child.start_mark.line + 1} contains an alias to"
                    " itself (a recursive alias)", "write the values out instead"))
            if id(child) not in sizes:
                stack.append((child, False))
    return sizes[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [item for pair in node.value for item in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def use_bounded_yaml() -> str:
    """Register ``BOUNDED_YAML_MODE`` with jsonargparse and return its name, for a parser's ``parser_mode``.

    Values load with jsonargparse's ``yaml`` loader (its results are unchanged) after
    ``load_yaml``'s checks; invalid YAML raises PyYAML's own error, which jsonargparse reports
    as before. Only the new mode name is added: the ``yaml`` mode, and every parser that does not
    ask for this mode, are left as they were.

    Example:
        >>> from jsonargparse import ArgumentParser
        >>> parser = ArgumentParser(parser_mode=use_bounded_yaml())
        >>> _ = parser.add_argument("--numbers", type=list)
        >>> parser.parse_args(["--numbers", "[&x 1, *x]"]).numbers
        [1, 1]
    """
    from jsonargparse import set_loader  # only commands that parse configs pay for the import

    set_loader(BOUNDED_YAML_MODE, _jsonargparse_load, exceptions=(yaml.YAMLError,))
    return BOUNDED_YAML_MODE


def _jsonargparse_load(stream: str, path: str | os.PathLike[str] = "") -> Any:  # noqa: ANN401
    """``BOUNDED_YAML_MODE``'s loader: jsonargparse's ``yaml`` loader, after the size and alias checks."""
    from jsonargparse import get_loader

    where = _file_being_loaded() or os.fspath(path) or "the value given"
    check_size(len(stream.encode("utf-8", "surrogatepass")), where)
    loader = _JsonargparseCheckLoader(stream)
    try:
        node = loader.get_single_node()  # invalid YAML: PyYAML's error, as jsonargparse's own loader raises
        if node is not None:
            check_aliases(node, where)
    finally:
        loader.dispose()
    return regroup_moved_arguments(get_loader("yaml")(stream), where)


class _JsonargparseCheckLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """The parser jsonargparse's ``yaml`` loader is built on (libyaml when PyYAML has it), to compose only."""


def _file_being_loaded() -> str:
    """The config file jsonargparse is reading, as the user named it ('' if none, or unknown)."""
    try:
        from jsonargparse._util import config_load_stack  # private: read defensively
    except ImportError:
        return ""
    stack = config_load_stack.get()
    return str(stack[-1][1]) if stack else ""
