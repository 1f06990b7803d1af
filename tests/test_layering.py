"""The house by role: no import circles, and no import from a lower room to a higher one.

Oracle: the import statements themselves (every ``import``/``from ... import`` of a ripieno module,
at module level or inside a function), read from the source with ``ast``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"framework": "ripieno.framework", "callbacks": "ripieno.callbacks",
            "datamodules": "ripieno.datamodules"}

#: framework/'s rooms from the bottom up; a room imports only from rooms of lower layers (and itself).
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"errors", "lazy_exports"}),  # shared root modules: one-line errors, lazy names, then the rest
    frozenset({"messages", "members", "extras", "checkpoint_file", "host_syncs"}),
    frozenset({"outputs", "specs", "nn"}),
    frozenset({"metrics", "backbones", "uq"}),
    frozenset({"methods"}),
    frozenset({"loes", "mcover"}),
    frozenset({"runner"}),  # RipienoCLI: running a recipe, with what the engines share
    frozenset({"tuning"}),
    frozenset({"benchmark"}),  # its cells may be tuned (tuning's spaces, storages and sampler)
    frozenset({"cli"}),  # the `ripieno` command: argparse doors to the runner and the engines
)
COMMAND_ROOMS = frozenset({"runner", "tuning", "benchmark", "cli"})  # the command and what only it runs
FACADES = frozenset({"__init__", "_moved"})  # ripieno.framework re-exports public names from every room


def _modules() -> dict[str, Path]:
    found = {}
    for folder, package in PACKAGES.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ripieno."):
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("ripieno."))
    return {name for name in names if name in MODULES}


GRAPH = {module: _imports(path) - {module} for module, path in MODULES.items()}


def _room(module: str) -> str:
    parts = module.split(".")
    if parts[1] != "framework":
        return parts[1]
    return parts[2] if len(parts) > 2 else "__init__"


def _layer(room: str) -> int:
    (index,) = [i for i, rooms in enumerate(LAYERS) if room in rooms]
    return index


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_planted_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    # Package __init__ files re-export their own modules; an edge from a package to its own
    # __init__ (``from ripieno.framework.cli import main`` inside cli/) is not a circle of modules.
    graph = {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in GRAPH.items()}
    assert _cycles(graph) == []


def test_every_framework_room_is_placed_in_a_layer():
    rooms = {_room(m) for m in MODULES if m.startswith("ripieno.framework.")} - FACADES
    placed = set().union(*LAYERS)
    assert rooms <= placed, f"place {sorted(rooms - placed)} in LAYERS"


def test_framework_rooms_import_only_from_lower_layers():
    upward = []
    for module, targets in GRAPH.items():
        room = _room(module)
        if not module.startswith("ripieno.framework.") or room in FACADES:
            continue
        for target in targets:
            target_room = _room(target)
            if target_room in FACADES and target != "ripieno.framework":
                continue
            if not target.startswith("ripieno.framework"):
                upward.append(f"{module} -> {target} (framework imports {target_room})")
            elif target == "ripieno.framework":
                upward.append(f"{module} -> ripieno.framework (import the defining module instead)")
            elif target_room != room and _layer(target_room) >= _layer(room):
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_callbacks_and_datamodules_do_not_import_the_command_or_each_other():
    wrong = [f"{m} -> {t}" for m, targets in GRAPH.items() for t in targets
             if _room(m) in ("callbacks", "datamodules")
             and (_room(t) in COMMAND_ROOMS or {_room(m), _room(t)} == {"callbacks", "datamodules"})]
    assert wrong == []


def test_no_test_module_imports_another_test_module() -> None:
    # shared pieces live in tests/helpers/ (as Lightning's tests_pytorch/helpers); a test file or conftest
    # imported by name runs its module-level code twice and couples unrelated tests
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name}" for name in names
                          if name.split(".")[0] == "conftest" or name.split(".")[0].startswith("test_")]
    assert not offenders, "\n".join(offenders)


def _on_super(node: ast.Attribute) -> bool:
    """``super().name``: an override calling the hook it overrides (listed in the door, checked there)."""
    value = node.value
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def test_lightnings_private_names_are_reached_only_through_one_door() -> None:
    from ripieno.framework.runner.lightning_private import CLI_ATTRIBUTES, PRIVATE_NAMES

    door = MODULES["ripieno.framework.runner.lightning_private"]
    attributes = {entry.name for entry in PRIVATE_NAMES if entry.kind in ("attribute", "hook")}
    offenders = []
    for name, path in MODULES.items():
        if path == door:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "lightning":
                offenders += [f"{name}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") or "._" in f".{node.module}"]
            elif isinstance(node, ast.Attribute) and node.attr in attributes and not _on_super(node):
                offenders.append(f"{name}:{node.lineno} touches .{node.attr}")
            elif (isinstance(node, ast.Attribute) and node.attr in CLI_ATTRIBUTES
                  and not (isinstance(node.value, ast.Name) and node.value.id == "self")):
                offenders.append(f"{name}:{node.lineno} reads LightningCLI's .{node.attr} from outside")
    assert not offenders, "\n".join(offenders)
