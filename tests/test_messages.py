"""The ``ripieno`` logger: rank-zero filtered, no handler added by the library, shown by the command."""

from __future__ import annotations

import ast
import io
import logging
from pathlib import Path

import pytest
from lightning.fabric.utilities.rank_zero import rank_zero_only

from ripieno.framework.messages import LOGGER_NAME, command_output, get_logger

ROOT = Path(__file__).resolve().parents[1]
LIBRARY = ("framework", "callbacks", "datamodules")
#: Where printing is the product: the command's own output (recipes list, select_members; and RipienoCLI's
#: test metrics and warnings, in the runner).
COMMAND_OUTPUT = (ROOT / "framework" / "cli", ROOT / "framework" / "runner" / "command.py")


def _calls(name: str) -> list[str]:
    found = []
    for folder in LIBRARY:
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == name:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_library_messages_go_through_the_ripieno_logger():
    assert _calls("rank_zero_info") == []
    prints = [where for where in _calls("print")
              if not any((ROOT / where.split(":")[0]).is_relative_to(place) for place in COMMAND_OUTPUT)]
    assert prints == []


def test_loggers_live_under_ripieno():
    assert get_logger("ripieno.datamodules.text").name == "ripieno.datamodules.text"
    with pytest.raises(ValueError, match="under 'ripieno'"):
        get_logger("myproject.module")


def test_only_rank_zero_logs(monkeypatch, caplog):
    logger = get_logger("ripieno.tests.rank")
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        logger.info("from rank zero")
        monkeypatch.setattr(rank_zero_only, "rank", 1, raising=False)
        logger.info("from rank one")
    assert [r.getMessage() for r in caplog.records] == ["from rank zero"]


def test_the_library_adds_no_handler_and_sets_no_level():
    import ripieno.callbacks  # noqa: F401
    import ripieno.datamodules  # noqa: F401
    import ripieno.framework  # noqa: F401

    top = logging.getLogger(LOGGER_NAME)
    assert top.handlers == [] and top.level == logging.NOTSET


def test_the_command_shows_info_for_one_call_and_restores_the_logger():
    stream = io.StringIO()
    with command_output(stream):
        get_logger("ripieno.tests.command").info("ripieno: shown")
    get_logger("ripieno.tests.command").info("ripieno: after the command")
    assert stream.getvalue() == "ripieno: shown\n"
    top = logging.getLogger(LOGGER_NAME)
    assert top.handlers == [] and top.level == logging.NOTSET


def test_a_user_configured_logger_is_left_as_the_user_set_it():
    top = logging.getLogger(LOGGER_NAME)
    mine = logging.StreamHandler(io.StringIO())
    top.addHandler(mine)
    top.setLevel(logging.WARNING)
    try:
        stream = io.StringIO()
        with command_output(stream):
            get_logger("ripieno.tests.user").info("ripieno: silenced by the user")
        assert stream.getvalue() == "" and top.handlers == [mine] and top.level == logging.WARNING
    finally:
        top.removeHandler(mine)
        top.setLevel(logging.NOTSET)
