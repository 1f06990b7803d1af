"""The ``ripieno`` command: LightningCLI with ripieno's links, guards and one-line errors.

``command`` is the LightningCLI subclass; ``main`` dispatches the console script; the other
modules are its checks (``config_errors``, ``monitor_check``, ``resume_check``), its run folder
and logs (``run_folders``, ``run_logs``, ``spawn_results``), the optimizer options
(``optimizer_config``), the shipped recipes (``recipes``) and ``select_members``.
"""

from typing import TYPE_CHECKING

from ripieno.framework.cli.main import main

if TYPE_CHECKING:
    from ripieno.framework.cli.command import RipienoCLI

__all__ = ["RipienoCLI", "main"]


def __getattr__(name: str) -> object:
    """``RipienoCLI`` and the command's other names, imported on first use (``ripieno --help`` needs none).

    ``ripieno.framework.cli`` was one module before the package: its names keep resolving.
    """
    import importlib

    command = importlib.import_module("ripieno.framework.cli.command")  # not `from . import`: recursion
    try:
        return getattr(command, name)
    except AttributeError:
        raise AttributeError(f"module 'ripieno.framework.cli' has no attribute {name!r}") from None
