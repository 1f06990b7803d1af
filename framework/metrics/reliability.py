"""Reliability diagram of a predictive distribution, as a matplotlib figure or a PNG.

Bins are torchmetrics' equal-width confidence bins (those of ``ExpectedCalibrationError``),
and the ECE in the title is the same number that metric reports. The figure is drawn
with matplotlib's object API and the Agg canvas, never ``pyplot``, so it is safe in
worker processes and leaves no global figure state behind.
"""

from __future__ import annotations

from pathlib import Path

import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from torch import Tensor
from torchmetrics.functional.classification import multiclass_calibration_error

from ripieno.framework.outputs.output_files import atomic_output


def reliability_diagram(
    probs: Tensor,
    target: Tensor,
    path: str | Path,
    n_bins: int = 15,
    title: str | None = None,
) -> Path:
    """Plot accuracy against confidence of the predictive mean and save it as a PNG.

    Bars show the accuracy of the points whose top-label confidence falls in each bin;
    red outlines show the gap to the bin's mean confidence; the diagonal is perfect
    calibration. The title carries the l1 ECE.

    Args:
        probs: class probabilities ``(B, C)``, or per-sample probabilities ``(B, S, C)``
            that are averaged over samples first.
        target: ``(B,)`` integer class labels.
        path: where to write the PNG (parent folders are created).
        n_bins: number of equal-width confidence bins on ``[0, 1]``.
        title: text put before the ECE in the title.

    Returns:
        The path of the written PNG.
    """
    if probs.ndim not in (2, 3):
        raise ValueError(f"Expected probabilities (batch, classes) or (batch, samples, classes), "
                         f"got {tuple(probs.shape)}.")
    if target.ndim != 1 or target.shape[0] != probs.shape[0]:
        raise ValueError(f"Expected targets shaped ({probs.shape[0]},), got {tuple(target.shape)}.")
    p = probs.detach().float().cpu()
    if p.ndim == 3:
        p = p.mean(1)
    if p.numel() and (p.min() < 0 or p.max() > 1):
        raise ValueError("reliability_diagram expects probabilities in [0, 1], not logits.")
    y = target.detach().long().cpu()
    ece = multiclass_calibration_error(p, y, num_classes=p.shape[1], n_bins=n_bins, norm="l1").item()
    confidence, predicted = p.max(-1)
    return reliability_diagram_from_confidences(confidence, (predicted == y).float(), path, n_bins,
                                                title, ece=ece)


def reliability_diagram_from_confidences(
    confidence: Tensor,
    correct: Tensor,
    path: str | Path,
    n_bins: int = 15,
    title: str | None = None,
    ece: float | None = None,
) -> Path:
    """The same diagram from top-label confidences and 0/1 correctness per point, as a PNG.

    These are the ``confidences``/``accuracies`` states of torchmetrics' calibration
    error, so a callback can draw the diagram of exactly what its ECE metric saw (after
    syncing the states across DDP ranks).

    Args:
        confidence: ``(N,)`` top-label probabilities.
        correct: ``(N,)`` 1 where the top label is right, else 0.
        path: where to write the PNG (parent folders are created).
        n_bins: number of equal-width confidence bins on ``[0, 1]``.
        title: text put before the ECE in the title.
        ece: the ECE to print (default: computed from these bins).

    Returns:
        The path of the written PNG.
    """
    fig = reliability_figure(confidence, correct, n_bins, title, ece)
    out = Path(path)
    with atomic_output(out, "wb", what="the reliability diagram") as file:
        fig.savefig(file, format="png")
    return out


def reliability_figure(
    confidence: Tensor,
    correct: Tensor,
    n_bins: int = 15,
    title: str | None = None,
    ece: float | None = None,
) -> Figure:
    """The reliability diagram of top-label confidences as a matplotlib ``Figure`` (Agg canvas).

    What a logger's image API takes (TensorBoard's ``add_figure``); arguments as
    ``reliability_diagram_from_confidences``.

    Returns:
        A figure that belongs to no ``pyplot`` state (nothing to close).
    """
    confidence, correct = confidence.detach().float().cpu(), correct.detach().float().cpu()
    # torchmetrics' bins are [b_i, b_{i+1}); a confidence of exactly 1 joins the last bin here.
    bins = (confidence * n_bins).long().clamp(max=n_bins - 1)
    count = torch.bincount(bins, minlength=n_bins).float()
    filled = count > 0
    accuracy = torch.bincount(bins, weights=correct, minlength=n_bins) / count.clamp_min(1)
    mean_conf = torch.bincount(bins, weights=confidence, minlength=n_bins) / count.clamp_min(1)
    if ece is None:
        ece = float(((mean_conf - accuracy).abs() * count).sum() / count.sum().clamp_min(1))
    left = torch.arange(n_bins).float() / n_bins
    left, accuracy, gap = (t[filled].numpy() for t in (left, accuracy, mean_conf - accuracy))

    fig = Figure(figsize=(4.5, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 1.0 / n_bins
    ax.bar(left, accuracy, width=width, align="edge", color="tab:blue", edgecolor="black",
           linewidth=0.5, label="accuracy")
    ax.bar(left, gap, bottom=accuracy, width=width, align="edge", color="none", edgecolor="tab:red",
           hatch="//", linewidth=0.5, label="gap")
    ax.plot([0, 1], [0, 1], linestyle="--", color="gray", linewidth=1)
    ax.set(xlim=(0, 1), ylim=(0, 1), xlabel="confidence", ylabel="accuracy", aspect="equal")
    ax.legend(loc="upper left")
    ax.set_title(f"{title}  (ECE = {ece:.4f})" if title else f"ECE = {ece:.4f}")
    fig.tight_layout()
    return fig
