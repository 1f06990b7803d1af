"""The ``ripieno`` console script: ``recipes``, ``select_members`` or a LightningCLI subcommand."""

from __future__ import annotations

import sys

from ripieno.framework.cli.command import RipienoCLI, print_recipes, quiet_cli_notices, resolve_config_args
from ripieno.framework.cli.error_lines import one_line_error
from ripieno.framework.cli.recipes import RecipeNotFoundError
from ripieno.framework.cli.select_members import select_members_main
from ripieno.framework.extras import require
from ripieno.framework.messages import command_output


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``ripieno`` console script and ``python -m ripieno``.

    Args:
        args: the command line without the program name (``None``: ``sys.argv[1:]``):
            ``recipes``, ``select_members`` (``ripieno.framework.cli.select_members``), ``tune``
            (``ripieno.framework.cli.tune.command``), ``benchmark``
            (``ripieno.framework.cli.benchmark.command``), or a
            LightningCLI subcommand and its arguments.
    """
    args = list(sys.argv[1:] if args is None else args)
    with command_output():
        _run(args)


def _run(args: list[str]) -> None:
    """``main`` with ripieno's messages shown on stdout."""
    if args[:1] == ["recipes"]:
        print_recipes()
        return
    if args[:1] == ["tune"]:
        for module in ("optuna", "optuna_integration"):  # imported only by this command
            require("tune", module, "ripieno tune")
        from ripieno.framework.cli.tune.command import tune_main

        tune_main(args[1:])
        return
    if args[:1] == ["benchmark"]:
        require("benchmark", "optuna", "ripieno benchmark")  # imported only by this command
        from ripieno.framework.cli.benchmark.command import benchmark_main

        benchmark_main(args[1:])
        return
    if args[:1] == ["select_members"]:
        select_members_main(args[1:])
        return
    try:
        args = resolve_config_args(args)
    except RecipeNotFoundError as error:
        raise SystemExit(f"ripieno: {error}") from None
    try:
        with quiet_cli_notices():
            RipienoCLI(args=args)
    except KeyboardInterrupt:  # outside training (data preparation, the summary); inside, Lightning stops
        raise SystemExit("ripieno: interrupted (Ctrl-C) outside training; files already written are whole"
                         " (every output is written atomically).") from None
    except Exception as error:
        line = one_line_error(error)
        if line is None:
            raise
        raise SystemExit(f"ripieno: error: {line}") from None
