"""``ripieno select_members``: save the best ``k`` members of a trained ensemble as a checkpoint.

``ripieno select_members -c <config> --ckpt_path best.ckpt --k 8`` rebuilds the run's
datamodule from the config (a shipped recipe name or the run's saved ``config.yaml``; any
``--data...`` override works as for ``fit``), loads the model from the checkpoint, picks
members on the validation split (``TabularEnsembleModule.select_members``), validates the
full and the selected ensemble side by side and writes the selected one as a checkpoint
that ``ripieno predict`` / ``test`` / ``load_from_checkpoint`` read like any other.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import lightning as L

from ripieno.framework.checkpoint_file import CheckpointFileError, read_checkpoint
from ripieno.framework.methods.member_selection import METHODS, METRICS

USAGE = ("ripieno select_members -c CONFIG --ckpt_path CKPT --k K [--method greedy|topk]"
         " [--metric loss|error] [--out FILE] [config overrides ...]")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ripieno select_members", usage=USAGE, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt_path", required=True, help="checkpoint of the trained ensemble")
    parser.add_argument("--k", type=int, required=True, help="members to keep")
    parser.add_argument("--method", choices=METHODS, default="greedy",
                        help="greedy: Caruana forward selection with replacement; topk: best own score")
    parser.add_argument("--metric", choices=METRICS, default="loss",
                        help="loss: NLL (classification) or MSE (regression); error: error rate")
    parser.add_argument("--out", default=None,
                        help="output checkpoint (default: <ckpt>-<method><k>.ckpt beside the input)")
    return parser


def select_members_main(args: list[str]) -> Path:
    """Run ``ripieno select_members``; returns the written checkpoint's path.

    Args:
        args: the command line after ``select_members`` (``-c`` and overrides go to the
            config parser, the rest is this command's own options).
    """
    from ripieno.framework.cli import RipienoCLI, quiet_cli_notices, resolve_config_args

    options, rest = _parser().parse_known_args(args)
    if not any(a in ("-c", "--config") or a.startswith("--config=") for a in rest):
        raise SystemExit("ripieno select_members: give the run's config with -c (a recipe name or the"
                         " config.yaml saved beside its logs), so the validation split can be rebuilt.")
    ckpt = Path(options.ckpt_path).expanduser()
    try:
        read_checkpoint(ckpt)
    except CheckpointFileError as error:
        raise SystemExit(f"ripieno select_members: {error}") from None
    with quiet_cli_notices():
        cli = RipienoCLI(args=resolve_config_args(rest), run=False, save_config_callback=None)
    model_cls = type(cli.model)
    if not hasattr(model_cls, "select_members"):
        raise SystemExit(f"ripieno select_members: {model_cls.__name__} has no select_members; it works"
                         " with TabularEnsembleModule.")
    model = model_cls.load_from_checkpoint(ckpt, weights_only=True, map_location="cpu")
    selected = model.select_members(options.k, metric=options.metric, method=options.method,
                                    datamodule=cli.datamodule)
    trainer = L.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", default_root_dir=ckpt.parent)
    full = trainer.validate(model, datamodule=cli.datamodule, verbose=False)[0]
    small = trainer.validate(selected, datamodule=cli.datamodule, verbose=False)[0]
    default_out = ckpt.with_name(f"{ckpt.stem}-{options.method}{options.k}.ckpt")
    out = Path(options.out) if options.out else default_out
    out.parent.mkdir(parents=True, exist_ok=True)
    trainer.save_checkpoint(out)
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
