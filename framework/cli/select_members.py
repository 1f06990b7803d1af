"""``ripieno select_members``: save the best ``k`` members of a trained ensemble as a checkpoint.

``ripieno select_members -c <config> --ckpt_path best.ckpt --k 8`` rebuilds the run's
datamodule from the config (a shipped recipe name or the run's saved ``config.yaml``; any
``--data...`` override works as for ``fit``), loads the model from the checkpoint, picks
members on the validation split (``TabularEnsembleModule.select_members``), validates the
full and the selected ensemble side by side and writes the selected one as a checkpoint
that ``ripieno predict`` / ``test`` / ``load_from_checkpoint`` read like any other.

The checkpoint is written atomically (a temporary file in the same folder, renamed into
place) and never over a file by surprise, and every refusal comes before the data is read:

* ``--k`` below 1 is refused as soon as the options are parsed, and with ``--method topk``
  (distinct members) a ``--k`` above the checkpoint's saved member count ``k``; ``greedy``
  selects with replacement, so any ``--k >= 1`` is valid (a member chosen twice counts twice);
* ``--out`` naming the input checkpoint (or a ``-c`` config) is always refused;
* an existing ``--out`` is refused unless ``--overwrite`` is given, which replaces only a
  checkpoint file (a ``torch.save`` archive), never a table or a config;
* the default name, ``<ckpt>-<method><k>.ckpt`` beside the input, is never replaced: when it
  is taken (an earlier selection), the next free ``<ckpt>-<method><k>_1.ckpt``, ``_2``, ... is
  written and printed, as ``predict`` does with its tables.
"""

from __future__ import annotations

import argparse
import inspect
import io
import os
import zipfile
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from typing_extensions import override

from ripieno.framework.checkpoint_file import CheckpointFileError
from ripieno.framework.errors import file_problem
from ripieno.framework.methods.member_selection import METHODS, METRICS
from ripieno.framework.outputs.output_files import atomic_output, write_new_file
from ripieno.framework.runner.checkpoint_request import CheckpointRequest
from ripieno.framework.runner.command import CONFIG_FLAGS, RipienoCLI, quiet_cli_notices, resolve_config_args
from ripieno.framework.runner.error_lines import one_line_error
from ripieno.framework.runner.help_text import plain
from ripieno.framework.runner.lightning_private import current_checkpoint
from ripieno.framework.runner.recipes import RecipeNotFoundError

USAGE = ("ripieno select_members -c CONFIG --ckpt_path CKPT --k K [--method greedy|topk]"
         " [--metric loss|error] [--out FILE [--overwrite]] [config overrides ...]")
PREFIX = "ripieno select_members: "


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ripieno select_members", usage=USAGE, description=plain(__doc__),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt_path", required=True, help="checkpoint of the trained ensemble")
    parser.add_argument("--k", type=int, required=True, help="members to keep")
    parser.add_argument("--method", choices=METHODS, default="greedy",
                        help="greedy: Caruana forward selection with replacement; topk: best own score")
    parser.add_argument("--metric", choices=METRICS, default="loss",
                        help="loss: NLL (classification) or MSE (regression); error: error rate")
    parser.add_argument("--out", default=None,
                        help="output checkpoint (default: <ckpt>-<method><k>.ckpt beside the input, or its"
                             " first free <name>_N.ckpt when taken); never the input checkpoint")
    parser.add_argument("--overwrite", action="store_true",
                        help="let --out replace an existing checkpoint file (atomically)")
    return parser


class _SelectMembersCLI(RipienoCLI):
    """``RipienoCLI`` without subcommands that also reads a run's saved ``config.yaml``.

    A run saves the config of its subcommand, with that subcommand's own keys
    (``ckpt_path``, ``weights_only``, ``verbose``...); this parser accepts them and ignores
    them (the checkpoint is ``select_members``' own ``--ckpt_path``).
    """

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """RipienoCLI's arguments, plus every subcommand's own keys, accepted and unused."""
        super().add_arguments_to_parser(parser)
        known = {name for action in parser._actions for name in action.option_strings}
        for key in _subcommand_keys():
            if f"--{key}" not in known:
                parser.add_argument(f"--{key}", type=Any, default=None,
                                    help=f"read from a run's config and not used by select_members ({key})")


def _subcommand_keys() -> list[str]:
    """The Trainer-method keys a subcommand's saved config holds (``ckpt_path``, ``verbose``...)."""
    keys: list[str] = []
    for subcommand, skip in LightningCLI.subcommands().items():
        for name in inspect.signature(getattr(L.Trainer, subcommand)).parameters:
            if name != "self" and name not in skip and name not in keys:
                keys.append(name)
    return keys


def _same_file(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` name one file (the same resolved path, or the same inode)."""
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop
        return False


def _config_files(args: list[str]) -> list[Path]:
    """The files given with ``-c`` / ``--config`` in ``args`` (already resolved)."""
    files = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg in CONFIG_FLAGS]
    files += [arg.split("=", 1)[1] for arg in args if arg.startswith("--config=")]
    return [Path(f) for f in files]


def _check_k(options: argparse.Namespace, request: CheckpointRequest) -> None:
    """Refuse a ``--k`` the checkpoint's ensemble cannot give, from its saved ``k`` (no data is read).

    ``greedy`` selects with replacement, so any ``k >= 1`` is valid (a member chosen twice
    counts twice); ``topk`` keeps distinct members, so at most the trained member count.

    Raises:
        SystemExit: one line with the valid range and the fix.
    """
    n_members = request.hparams.get("k")
    if options.method != "topk" or isinstance(n_members, bool) or not isinstance(n_members, int):
        return  # greedy: no upper bound; no saved k: choose_members checks it against the predictions
    if options.k > n_members:
        raise SystemExit(f"{PREFIX}--method topk keeps distinct members: --k {options.k} > the {n_members}"
                         f" members of {request.path}; give --k from 1 to {n_members}, or --method greedy"
                         " (it selects with replacement: any k >= 1).")


def _output(options: argparse.Namespace, ckpt: Path, configs: list[Path]) -> tuple[Path, bool]:
    """The checkpoint to write and whether it is the default name; refusals as ``SystemExit``.

    Raises:
        SystemExit: one line naming the file and the fix, before any work is done.
    """
    default = ckpt.with_name(f"{ckpt.stem}-{options.method}{options.k}.ckpt")
    if options.out is None:
        if options.overwrite:
            raise SystemExit(PREFIX + "--overwrite lets --out replace a file; give --out too (the default"
                             f" name {default} is never replaced: when taken, the next free"
                             f" {default.stem}_1.ckpt, ... is written).")
        return default, True
    out = Path(options.out).expanduser()
    inputs = [(ckpt, "the checkpoint to select from (--ckpt_path)")]
    inputs += [(config, "the config given with -c") for config in configs]
    for given, what in inputs:
        if _same_file(out, given):
            raise SystemExit(PREFIX + file_problem(
                out, f"is {what}: --out never writes over an input (even with --overwrite)",
                "give --out a new file, or leave out --out to write beside the checkpoint under a free name"))
    if out.is_dir():
        raise SystemExit(PREFIX + file_problem(out, "is a folder", f"give --out a file in it, e.g. --out"
                                               f" {out / default.name}"))
    if out.exists() and not options.overwrite:
        raise SystemExit(PREFIX + file_problem(
            out, "exists already and --out does not replace files unless told",
            "give --out a new file (or leave out --out to write beside the checkpoint under a free name),"
            " or add --overwrite to replace it"))
    if out.exists() and not zipfile.is_zipfile(out):
        raise SystemExit(PREFIX + file_problem(
            out, "exists and is not a checkpoint (not a torch.save archive): --overwrite replaces only"
            " checkpoint files", "give --out a new file or an existing .ckpt to replace"))
    return out, False


def _save(trainer: L.Trainer, path: Path, default_name: bool, replace: bool) -> Path:
    """Write the trainer's checkpoint atomically; the default name is never replaced (module docstring)."""
    checkpoint = current_checkpoint(trainer, weights_only=False)
    if default_name:
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        return write_new_file(path, buffer.getvalue(), what="the checkpoint")
    try:
        with atomic_output(path, "wb", replace=replace, what="the checkpoint") as file:
            torch.save(checkpoint, file)
    except FileExistsError:  # written by another process since the check
        raise SystemExit(PREFIX + file_problem(
            path, "was created by another process while the members were selected",
            "give --out a new file, or add --overwrite to replace it")) from None
    return path


def select_members_main(args: list[str]) -> Path:
    """Run ``ripieno select_members``; returns the written checkpoint's path.

    Args:
        args: the command line after ``select_members`` (``-c`` and overrides go to the
            config parser, the rest is this command's own options).

    Raises:
        SystemExit: bad input (a ``--k`` the ensemble cannot give, a missing config or checkpoint,
            an ``--out`` that would replace a file, a config error), as one line naming it and the fix.
    """
    options, rest = _parser().parse_known_args(args)
    if options.k < 1:
        raise SystemExit(f"{PREFIX}--k {options.k}: at least 1 member must be kept; give --k 1 or more"
                         " (--method greedy: any k >= 1, members may repeat; --method topk: 1 to the"
                         " ensemble's member count).")
    if not any(a in CONFIG_FLAGS or a.startswith("--config=") for a in rest):
        raise SystemExit(PREFIX + "give the run's config with -c (a recipe name or the config.yaml saved"
                         " beside its logs), so the validation split can be rebuilt.")
    ckpt = Path(options.ckpt_path).expanduser()
    request = CheckpointRequest(ckpt, lightning_names=False)
    try:
        request.checkpoint  # noqa: B018 - read once here: a missing or damaged file stops before any work
        rest = resolve_config_args(rest)
    except (CheckpointFileError, RecipeNotFoundError) as error:
        raise SystemExit(f"{PREFIX}{error}") from None
    _check_k(options, request)
    out, default_name = _output(options, ckpt, _config_files(rest))
    try:
        return _select(options, rest, request, out, default_name)
    except Exception as error:
        line = one_line_error(error)
        if line is None:
            raise
        raise SystemExit(f"{PREFIX}{line}") from None


def _select(options: argparse.Namespace, rest: list[str], request: CheckpointRequest, out: Path,
            default_name: bool) -> Path:
    """Build the run's datamodule, select, validate both ensembles, save and print the checkpoint."""
    ckpt = Path(request.path)
    with quiet_cli_notices():  # no logger: nothing is written into the run's log folders
        cli = _SelectMembersCLI(args=[*rest, "--trainer.logger=false"], run=False, save_config_callback=None)
    model_cls = type(cli.model)
    if not hasattr(model_cls, "select_members"):
        raise SystemExit(f"{PREFIX}{model_cls.__name__} has no select_members; it works with"
                         " TabularEnsembleModule.")
    model = request.load_module(model_cls)  # from the checkpoint read above, not read again
    selected = model.select_members(options.k, metric=options.metric, method=options.method,
                                    datamodule=cli.datamodule)
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", default_root_dir=ckpt.parent)
    full = trainer.validate(model, datamodule=cli.datamodule, verbose=False)[0]
    small = trainer.validate(selected, datamodule=cli.datamodule, verbose=False)[0]
    out = _save(trainer, out, default_name, replace=options.overwrite)
    choice = selected.member_selection
    lines = [f"ripieno: {options.method} selection of {options.k} of {model.hparams.k} members"
             f" (validation {options.metric}: {choice.score:.6g}, all members: {choice.score_all:.6g})",
             f"  members {choice.indices} ({len(set(choice.indices))} distinct)",
             f"  {'validation metric':<24} {'all members':>12} {'selected':>12}"]
    for name in sorted(full):
        lines.append(f"  {name:<24} {full[name]:>12.6g} {small.get(name, float('nan')):>12.6g}")
    lines.append(f"ripieno: checkpoint {out}")
    print("\n".join(lines), flush=True)
    return out
