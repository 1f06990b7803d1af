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
    """``RipienoCLI``, and the names of ``command`` from when this package was one module, on first use.

    ``ripieno --help`` imports none of them. An old name (``ripieno.framework.cli.resolve_config_args``)
    still resolves, with a ``DeprecationWarning`` naming ``ripieno.framework.cli.command`` and the release
    that removes it.
    """
    import importlib
    import importlib.util
    import warnings

    from ripieno.framework.errors import REMOVED_IN, RipienoDeprecationWarning

    if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")  # a submodule imports itself
    command = importlib.import_module("ripieno.framework.cli.command")  # not `from . import`: recursion
    if not hasattr(command, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in __all__:
        warnings.warn(f"ripieno.framework.cli.{name} is now ripieno.framework.cli.command.{name}: import it"
                      f" from there (the old name is removed in ripieno {REMOVED_IN})",
                      RipienoDeprecationWarning, stacklevel=2)
    return getattr(command, name)
