"""Help texts in plain words: docstrings' reST markup taken out for the terminal.

The commands' ``--help`` reuses their modules' docstrings, which carry reST markup for the API
documentation (````ripieno tune````, ``:class:`X```); a terminal shows it as noise.

Example:
    >>> plain("``ripieno tune -c NAME`` runs :class:`TrialCLI` trials; see `docs`_.")
    'ripieno tune -c NAME runs TrialCLI trials; see docs.'
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LINK = re.compile(r"`([^`<]+?)(?:\s*<[^>]+>)?`_+")


def plain(text: str) -> str:
    """``text`` without reST literals (````x````), roles (``:class:`x```) and link marks (```x`_``)."""
    text = _ROLE.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    return text.replace("``", "")
