"""The ``ripieno`` command: one thin door to the runner and the engines.

``main`` dispatches the console script (``main``); ``tune_command`` and ``benchmark_command`` are
``ripieno tune`` and ``ripieno benchmark`` behind argparse (the studies and benchmarks themselves are
``ripieno.framework.tuning`` and ``ripieno.framework.benchmark``, callable from Python);
``select_members`` is ``ripieno select_members``. ``RipienoCLI``, the LightningCLI that ``fit``,
``validate``, ``test`` and ``predict`` run, lives in ``ripieno.framework.runner.command`` and is
re-exported here.
"""

from typing import TYPE_CHECKING

from ripieno.framework.cli.main import main

if TYPE_CHECKING:
    from ripieno.framework.runner.command import RipienoCLI

__all__ = ["RipienoCLI", "main"]


def __getattr__(name: str) -> object:
    """``RipienoCLI``, and the names of ``runner.command`` from when this package was one module.

    ``ripieno --help`` imports none of them. An old name (``ripieno.framework.cli.resolve_config_args``)
    still resolves, with a ``DeprecationWarning`` naming ``ripieno.framework.runner.command`` and the
    release that removes it.
    """
    import importlib
    import importlib.util
    import warnings

    from ripieno.framework.errors import REMOVED_IN, RipienoDeprecationWarning

    if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")  # a submodule imports itself
    command = importlib.import_module("ripieno.framework.runner.command")
    if not hasattr(command, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in __all__:
        warnings.warn(f"ripieno.framework.cli.{name} is now ripieno.framework.runner.command.{name}:"
                      f" import it from there (the old name is removed in ripieno {REMOVED_IN})",
                      RipienoDeprecationWarning, stacklevel=2)
    return getattr(command, name)
