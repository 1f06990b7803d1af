"""The ``ripieno`` console script: one front door to every command.

``ripieno --help`` (or a bare ``ripieno``) lists every command with a line on what it does,
``ripieno --version`` names the installed versions, a mistyped command gets the closest one, and
``ripieno <command> --help`` gives the command's own options. This module imports only the
standard library and the command it dispatches to: the help, the version and ``ripieno recipes``
import no torch, so they answer at once.
"""

from __future__ import annotations

import difflib
import os
import shutil
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ripieno.framework.messages import command_output

LIGHTNING_COMMANDS: dict[str, str] = {
    "fit": "train a recipe, then test its best checkpoint (ripieno fit -c tabular/lometab_wine)",
    "validate": "score a checkpoint on the validation split (--ckpt_path)",
    "test": "score a checkpoint on the test split (--ckpt_path)",
    "predict": "write a checkpoint's predictions for the test split or new rows (--ckpt_path)",
}
"""LightningCLI's subcommands, run by ``RipienoCLI``."""
OWN_COMMANDS: dict[str, str] = {
    "recipes": "list the shipped recipes, search spaces and benchmark files",
    "tune": "an Optuna study over a recipe's settings; writes best.yaml (needs ripieno[tune])",
    "benchmark": "every model on every table of a benchmark file, resumable (needs ripieno[benchmark])",
    "select_members": "save the best k members of a trained ensemble as a new checkpoint",
}
"""ripieno's own commands."""
COMMANDS = {**LIGHTNING_COMMANDS, **OWN_COMMANDS}
DOCS_DIR = Path(__file__).resolve().parents[2] / "docs"
"""The documentation pages: ``docs/`` in a checkout, ``ripieno/docs`` in the installed wheel."""
VERSIONED = ("torch", "lightning", "torchmetrics")


def main(args: list[str] | None = None) -> None:
    """Entry point of the ``ripieno`` console script and ``python -m ripieno``.

    Args:
        args: the command line without the program name (``None``: ``sys.argv[1:]``): a command
            of ``COMMANDS`` and its arguments, ``--help`` or ``--version``.
    """
    args = list(sys.argv[1:] if args is None else args)
    try:
        with command_output():
            _run(args)
    except BrokenPipeError:  # the reader left (ripieno recipes | head): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error when Python flushes
        raise SystemExit(1) from None


def help_text() -> str:
    """What ``ripieno --help`` prints: usage, every command with its line, the options, the docs."""
    width = max(map(len, COMMANDS)) + 2
    lines = [
        "usage: ripieno <command> [options]        ripieno <command> --help: that command's options",
        "",
        "Many views of one model, trained with Lightning: implicit ensembles (LoMETab, TabM), model",
        "copies (M-cover), posterior samples (last-layer GLM) and layer choices (LOES).",
        "",
        "Training (LightningCLI; a recipe is a shipped name or your own YAML file):",
        *(f"  {name:<{width}}{text}" for name, text in LIGHTNING_COMMANDS.items()),
        "",
        "ripieno's own:",
        *(f"  {name:<{width}}{text}" for name, text in OWN_COMMANDS.items()),
        "",
        "Options:",
        f"  {'-h, --help':<{width}}show this message",
        f"  {'--version':<{width}}show the versions of ripieno, torch, lightning and torchmetrics",
        "",
        f"Documentation: {DOCS_DIR} (markdown pages: cli.md, tune.md, benchmark.md, one per method)",
    ]
    return "\n".join(lines)


def version_text() -> str:
    """``ripieno X (torch Y, lightning Z, torchmetrics W)``, from the installed distributions."""
    return f"ripieno {_version('ripieno')} ({', '.join(f'{n} {_version(n)}' for n in VERSIONED)})"


def _version(distribution: str) -> str:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return "not installed" if distribution != "ripieno" else "0+unknown (a checkout, not installed)"


def _run(args: list[str]) -> None:
    """``main`` with ripieno's messages shown on stdout."""
    first = args[0] if args else None
    if first in (None, "-h", "--help", "help"):
        print(help_text())
        if first is None:
            raise SystemExit(2)  # a command is needed
        return
    if first in ("-V", "--version"):
        print(version_text())
        return
    if first == "recipes":
        _recipes(args[1:])
    elif first == "tune":
        from ripieno.framework.extras import require

        for module in ("optuna", "optuna_integration"):  # imported only by this command
            require("tune", module, "ripieno tune")
        from ripieno.framework.cli.tune_command import tune_main

        tune_main(args[1:])
    elif first == "benchmark":
        from ripieno.framework.extras import require

        require("benchmark", "optuna", "ripieno benchmark")  # imported only by this command
        from ripieno.framework.cli.benchmark_command import benchmark_main

        benchmark_main(args[1:])
    elif first == "select_members":
        from ripieno.framework.cli.select_members import select_members_main

        select_members_main(args[1:])
    elif first in LIGHTNING_COMMANDS or first.startswith("-"):
        _lightning(args)
    else:
        close = difflib.get_close_matches(first, list(COMMANDS), n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else f"; the commands are {', '.join(COMMANDS)}"
        raise SystemExit(
            f"ripieno: error: unknown command {first!r}{hint}; ripieno --help says what each does."
        )


def _recipes(args: list[str]) -> None:
    """``ripieno recipes``: the shipped recipes, spaces and benchmarks (no options but ``--help``)."""
    if any(a in ("-h", "--help") for a in args):
        print("usage: ripieno recipes\n\n" + OWN_COMMANDS["recipes"] + "; run one with ripieno fit -c NAME.")
        return
    if args:
        raise SystemExit(f"ripieno: error: ripieno recipes takes no arguments, got {' '.join(args)!r}.")
    print_recipes()


def _lightning(args: list[str]) -> None:
    """``fit`` / ``validate`` / ``test`` / ``predict`` through ``RipienoCLI``, errors in one line."""
    from ripieno.framework.runner.command import RipienoCLI, quiet_cli_notices
    from ripieno.framework.runner.error_lines import one_line_error
    from ripieno.framework.runner.recipes import RecipeNotFoundError, resolve_config_args

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


def print_recipes() -> None:
    """Print every shipped recipe's name and one-line description."""
    from ripieno.framework.runner.recipes import list_benchmarks, list_recipes

    recipes = list_recipes()
    width = max(len(r.name) for r in recipes)
    room = max(shutil.get_terminal_size((120, 24)).columns - width - 4, 20)
    print("Shipped recipes (run one with `ripieno fit -c NAME`):")
    for recipe in recipes:
        text = recipe.description
        print(f"  {recipe.name:<{width}}  {text if len(text) <= room else text[: room - 3] + '...'}")
    from ripieno.framework.tuning.space import list_spaces

    print("\nSearch spaces (`ripieno tune -c RECIPE` takes the one that suits it; `--space NAME` another):")
    for space in list_spaces():
        text = f"{space.description} (recipes: {', '.join(space.recipes)})"
        print(f"  {space.name:<{width}}  {text if len(text) <= room else text[: room - 3] + '...'}")

    print("\nBenchmarks (`ripieno benchmark -c NAME`):")
    for name, text in list_benchmarks():
        print(f"  {name:<{width}}  {text if len(text) <= room else text[: room - 3] + '...'}")
