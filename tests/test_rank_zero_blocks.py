"""Code that runs on global rank 0 only never reaches a collective (the other ranks would never join).

``trainer.log_dir`` broadcasts, as do ``strategy.broadcast``, ``barrier``, ``all_gather`` and a
nested ``trainer.test``/``fit``; reached on rank 0 alone, each hangs (NCCL) or crashes the run when
the other ranks leave ("Connection closed by peer", gloo). Oracle: the source itself, read with
``ast``: every block guarded by a rank-0 test (``if trainer.is_global_zero:``, ``if not
trainer.is_global_zero: return`` and the statements after it, ``first_process()``, a
``rank_zero_only`` function) is searched for those names. The checker is itself checked on the
pattern that crashed every multi-GPU fit (``after_fit`` reading ``trainer.log_dir`` on rank 0).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("framework", "callbacks", "datamodules")
COLLECTIVE_CALLS = frozenset({"broadcast", "barrier", "all_gather", "all_reduce", "reduce_boolean_decision",
                              "sync", "sync_context", "test", "fit", "validate", "predict"})
"""Calls that every rank must make: collectives and the Trainer's loops (which run them)."""
RANK_ZERO_WORDS = ("is_global_zero", "global_rank", "first_process", "rank_zero_only.rank", "local_rank")


def _is_rank_zero_test(test: ast.expr) -> bool | None:
    """True for a test that holds on rank 0 only, False for its negation, None for other tests."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _is_rank_zero_test(test.operand)
        return None if inner is None else not inner
    text = ast.unparse(test)
    if not any(word in text for word in RANK_ZERO_WORDS):
        return None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        if isinstance(test.ops[0], ast.NotEq | ast.Gt):
            return False
        if isinstance(test.ops[0], ast.In) and "(None, 0)" not in text and "None, 0" not in text:
            return None
    return True


def _collectives(nodes: list[ast.stmt]) -> list[tuple[int, str]]:
    """Each collective reached in ``nodes`` (line, source), nested function bodies excluded."""
    found = []
    stack: list[ast.AST] = list(nodes)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            continue
        reads_log_dir = isinstance(node, ast.Attribute) and node.attr == "log_dir"
        if reads_log_dir and "trainer" in ast.unparse(node.value):
            found.append((node.lineno, ast.unparse(node)))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in COLLECTIVE_CALLS and _on_trainer_or_dist(node.func.value):
            found.append((node.lineno, ast.unparse(node.func)))
        stack.extend(ast.iter_child_nodes(node))
    return found


def _on_trainer_or_dist(value: ast.expr) -> bool:
    text = ast.unparse(value)
    return any(word in text for word in ("trainer", "strategy", "distributed", "dist", "fabric"))


def rank_zero_collectives(source: str) -> list[tuple[int, str]]:
    """Collectives reached inside rank-0-only code of ``source`` (module docstring)."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []

    def visit_block(statements: list[ast.stmt]) -> None:
        for index, statement in enumerate(statements):
            if isinstance(statement, ast.If):
                kind = _is_rank_zero_test(statement.test)
                if kind is True:
                    found.extend(_collectives(statement.body))
                    visit_block(statement.orelse)
                    continue
                if kind is False:
                    if statement.body and isinstance(statement.body[-1], ast.Return | ast.Continue):
                        found.extend(_collectives(statements[index + 1:]))  # a guard: the rest is rank 0's
                        return
                    found.extend(_collectives(statement.orelse))
                    visit_block(statement.body)
                    continue
            for field in ("body", "orelse", "finalbody", "handlers"):
                child = getattr(statement, field, None)
                if isinstance(child, list) and child and isinstance(child[0], ast.stmt | ast.excepthandler):
                    visit_block([c for c in child if isinstance(c, ast.stmt)] if field != "handlers"
                                else [s for h in child for s in h.body])
            if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                    "rank_zero_only" in ast.unparse(d) for d in statement.decorator_list):
                found.extend(_collectives(statement.body))

    visit_block(tree.body)
    return found


def test_the_checker_finds_the_pattern_that_crashed_multi_gpu_fits():
    crashed = """
def after_fit(self):
    trainer = self.trainer
    results = trainer.test(self.model)
    if trainer.is_global_zero:
        log_dir = trainer.log_dir or trainer.default_root_dir
        print(log_dir)
"""
    assert rank_zero_collectives(crashed) == [(6, "trainer.log_dir")]
    guarded = """
def hook(trainer, metric):
    if not trainer.is_global_zero:
        return
    trainer.strategy.barrier()
"""
    assert rank_zero_collectives(guarded) == [(5, "trainer.strategy.barrier")]
    decorated = """
@rank_zero_only
def save(trainer):
    trainer.strategy.broadcast(1)
"""
    assert rank_zero_collectives(decorated) == [(4, "trainer.strategy.broadcast")]
    fixed = """
def after_fit(self):
    log_dir = self.trainer.log_dir
    if self.trainer.is_global_zero:
        print(log_dir)
"""
    assert rank_zero_collectives(fixed) == []


def test_no_collective_is_reached_on_rank_zero_alone():
    found = {
        str(path.relative_to(ROOT)): sites
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (sites := rank_zero_collectives(path.read_text(encoding="utf-8")))
    }
    assert found == {}, f"collectives inside rank-0-only code: {found}"
