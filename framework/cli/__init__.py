"""The ``ripieno`` command: LightningCLI with ripieno's links, guards and one-line errors.

``command`` is the LightningCLI subclass; ``main`` dispatches the console script; the other
modules are its checks (``config_errors``, ``monitor_check``, ``resume_check``), its run folder
and logs (``run_folders``, ``run_logs``, ``spawn_results``), the optimizer options
(``optimizer_config``), the shipped recipes (``recipes``) and ``select_members``.
"""

from ripieno.framework.cli.command import RipienoCLI
from ripieno.framework.cli.main import main

__all__ = ["RipienoCLI", "main"]


def __getattr__(name: str) -> object:
    """The command's other names (``ripieno.framework.cli`` was one module before the package)."""
    from ripieno.framework.cli import command

    try:
        return getattr(command, name)
    except AttributeError:
        raise AttributeError(f"module 'ripieno.framework.cli' has no attribute {name!r}") from None
