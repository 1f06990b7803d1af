"""The README's pictures, from real runs: a reliability diagram, LOES per-layer scores, GeoReg isotropy.

Each figure is drawn from a run's own outputs (nothing is simulated):

* ``reliability_ll_glm_fashion_mnist.png``: ``uq/ll_glm_fashion_mnist`` with
  ``TemperatureScaling`` in front of ``LastLayerSampler`` (``temperature: callback``); the
  sampler's reliability diagram is copied from the run folder (no logger: it is written
  under ``default_root_dir``).
* ``loes_scores_efficientnet_lite0.png``: the per-step score table that
  ``loes/vision_efficientnet_lite0_loes`` writes into its run folder (``scores_path``; ridge loss, 1 - Iso,
  redundancy and the total per candidate layer, the chosen one marked).
* ``georeg_isotropy_bbc_news.png``: ``georeg/val/isotropy`` per epoch of
  ``loes/text_minilm_georeg_bbc_news`` with GeoReg (weight 0.1) and without (weight 0), from
  the CSV logger's ``metrics.csv``.

Run from the checkout (about 10 minutes on two cores, most of it extracting features)::

    python -m experiments.figures --out docs/results/figures
"""

from __future__ import annotations

import argparse
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import yaml
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from experiments.runs import results_dir
from ripieno.framework.cli import main as ripieno
from ripieno.framework.runner.recipes import find_recipe


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print(f"figures: wrote {path}")
    return path


def reliability(out: Path, work: Path) -> Path:
    """Run LL-GLM on Fashion-MNIST behind TemperatureScaling; copy its reliability diagram."""
    root = work / "ll_glm_fashion_mnist"

    def calibrate(config: dict) -> None:
        callbacks = config["trainer"]["callbacks"]
        for callback in callbacks:
            if callback["class_path"].endswith("LastLayerSampler"):
                callback["init_args"]["temperature"] = "callback"
        callbacks.insert(0, {"class_path": "ripieno.callbacks.TemperatureScaling"})

    _run_edited("uq/ll_glm_fashion_mnist", root, calibrate, "--trainer.logger=false")
    found = sorted(root.rglob("reliability_LastLayerSampler*.png"))
    if not found:
        raise FileNotFoundError(f"The run under {root} wrote no reliability diagram.")
    target = out / "reliability_ll_glm_fashion_mnist.png"
    shutil.copyfile(found[-1], target)
    print(f"figures: wrote {target}")
    return target


def loes_scores(out: Path, work: Path) -> Path:
    """Run the EfficientNet-Lite0 LOES recipe and plot its per-step score table."""
    root = work / "loes_efficientnet"
    ripieno(["fit", "-c", "loes/vision_efficientnet_lite0_loes", f"--trainer.default_root_dir={root}",
             "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.max_epochs=1"])
    # the run writes selection_scores.csv into its run folder, or selection_scores_N.csv beside an earlier one
    scores = max(root.glob("selection_scores*.csv"), key=lambda path: path.stat().st_mtime_ns)
    table = pd.read_csv(scores)
    steps = sorted(table["step"].unique())
    fig = Figure(figsize=(4.2 * len(steps), 3.4))
    for i, step in enumerate(steps):
        ax = fig.add_subplot(1, len(steps), i + 1)
        rows = table[table["step"] == step]
        x = rows["hidden_state"].astype(int)
        ax.plot(x, rows["ridge_loss"], "o-", label="ridge loss")
        ax.plot(x, 1 - rows["iso"], "s--", label="1 - Iso")
        if rows["red"].notna().any():
            ax.plot(x, rows["red"], "^:", label="redundancy")
        ax.plot(x, rows["total"], "k-", lw=2, label="total (weighted)")
        chosen = rows[rows["selected"].astype(bool)]
        ax.plot(chosen["hidden_state"], chosen["total"], "r*", ms=14, label="chosen")
        ax.set_title(f"step {step}")
        ax.set_xlabel("hidden state (stage)")
        if i == 0:
            ax.set_ylabel("score (lower is better)")
    handles = {h.get_label(): h for a in fig.axes for h in a.get_lines()}
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=len(handles), fontsize=8,
               bbox_to_anchor=(0.5, -0.16))
    fig.suptitle("LOES on EfficientNet-Lite0 (ImageNet), MNIST 5k: per-layer terms at each step"
                 " (layers already chosen drop out)", y=1.04)
    return _save(fig, out / "loes_scores_efficientnet_lite0.png")


def georeg_isotropy(out: Path, work: Path) -> Path:
    """GeoReg (weight 0.1) and no GeoReg (0) on BBC News: validation isotropy per epoch."""
    fig = Figure(figsize=(5.5, 3.6))
    ax = fig.add_subplot(1, 1, 1)
    for weight in (0.0, 0.1):
        root = work / f"georeg_{weight:g}"
        _georeg_run(root, weight)
        metrics = pd.read_csv(next(root.rglob("metrics.csv")))
        curve = metrics.dropna(subset=["georeg/val/isotropy"])
        ax.plot(curve["epoch"], curve["georeg/val/isotropy"], "o-",
                label="our GeoReg (variant ripieno), weight 0.1" if weight else "no GeoReg (measured only)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("isotropy of the fused embedding (val)")
    ax.set_title("GeoReg on MiniLM layers, BBC News (5 topics)")
    ax.legend()
    return _save(fig, out / "georeg_isotropy_bbc_news.png")


def _georeg_run(root: Path, weight: float) -> None:
    """``loes/text_minilm_georeg_bbc_news`` with GeoReg's weight set (0: the terms are only measured)."""

    def set_weight(config: dict) -> None:
        for callback in config["trainer"]["callbacks"]:
            if callback["class_path"].endswith("GeoReg"):
                callback.setdefault("init_args", {})["weight"] = weight

    _run_edited("loes/text_minilm_georeg_bbc_news", root, set_weight, "--tensorboard=false")


def _run_edited(recipe: str, root: Path, edit: Callable[[dict], None], *args: str) -> None:
    """``ripieno fit`` on a shipped recipe after ``edit`` changed its config (saved under ``root``)."""
    config = yaml.safe_load(find_recipe(recipe).read_text())
    edit(config)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(config))
    ripieno(["fit", "-c", str(path), f"--trainer.default_root_dir={root}",
             "--trainer.enable_progress_bar=false", *args])


def main(argv: list[str] | None = None) -> None:
    """Make every figure (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m experiments.figures",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=results_dir("figures"))
    parser.add_argument("--work", type=Path, default=Path("runs/figures"))
    parser.add_argument("--only", nargs="+", choices=["reliability", "loes_scores", "georeg_isotropy"],
                        default=["reliability", "loes_scores", "georeg_isotropy"])
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only:
        {"reliability": reliability, "loes_scores": loes_scores, "georeg_isotropy": georeg_isotropy}[name](
            args.out, args.work)


if __name__ == "__main__":
    main()
