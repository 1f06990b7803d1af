"""One M-cover training step against M independent copies (same M, widths, batch).

What is measured
    One SGD step (``zero_grad(set_to_none=True)``, forward, sum of the copies'
    cross-entropies, backward, ``optimizer.step()``) of an MLP with widths
    ``--in-features``, ``--hidden`` x ``--layers``, 10 classes (defaults 784, 1024 x 2),
    batch ``--batch`` (256), ``--m`` copies (5), ``--blocks`` blocks per routed layer (4):

    * ``routed exact``: ``RoutedMLP`` with one sampled permutation per slot, a fresh bank
      entry every step (what ``MCoverClassifier`` does with ``routing="exact"``);
    * ``routed block-message``: ``RoutedMLP`` mixing with the bank's empirical mixing
      matrices (``routing="block_message"``, bank of 16);
    * ``independent (stacked)``: the same ``RoutedMLP`` with no routing: M independent
      copies in one batched computation (what a diagonal kernel costs);
    * ``independent (loop)``: M separate ``nn.Sequential`` MLPs, one after the other.

Time
    ``torch.utils.benchmark.Timer``, one timed step after two untimed warmups per variant
    per round; rounds interleave the variants (order rotated each round); the table shows
    the median over ``--rounds`` in ms, and each variant's ratio to both independent
    baselines, all measured in this one run.

Run
    ``.venv/bin/python bench/mcover_step.py`` (about a minute on 2 CPU cores),
    ``--quick`` for a smoke test, ``--device cuda`` on a GPU.

Nothing is asserted; the last line states whether the routed step is within 1.3x of
the stacked independent copies (the issue's target).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.benchmark import Timer

from ripieno.framework.mcover import PermutationBank, make_kernel
from ripieno.framework.mcover.routed_mlp import RoutedMLP, copy_cross_entropy


def routed_step(net: RoutedMLP, bank: PermutationBank, mode: str, x: torch.Tensor,
                y: torch.Tensor) -> Callable[[], None]:
    """A training step of ``net`` with routing ``mode`` (``exact``, ``block``, ``none``)."""
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    mixing = bank.mixing().to(x.device)
    perms = bank.perms.to(x.device)
    state = {"step": 0}

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        routing = {"exact": perms[:, state["step"] % perms.shape[1]], "block": mixing, "none": None}[mode]
        copy_cross_entropy(net(x, routing), y).backward()
        opt.step()
        state["step"] += 1

    return step


def loop_step(nets: list[nn.Module], x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    """A training step of M separate MLPs, one after the other."""
    opt = torch.optim.SGD([p for n in nets for p in n.parameters()], lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = sum(F.cross_entropy(n(x), y) for n in nets)
        loss.backward()
        opt.step()

    return step


def main() -> None:
    """Print the timing table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=5)
    parser.add_argument("--in-features", type=int, default=784)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.rounds, args.batch = 128, 3, 64
    device = torch.device(args.device)
    torch.manual_seed(0)
    widths = [args.hidden] * args.layers
    net = RoutedMLP(args.in_features, widths, 10, args.m, n_blocks=args.blocks).to(device)
    bank = PermutationBank.draw(make_kernel("gaussian_ring", args.m, sigma=1.0), net.n_slots, 16,
                                torch.Generator().manual_seed(0))
    x = torch.randn(args.batch, args.in_features, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    variants = {
        "routed exact": routed_step(net, bank, "exact", x, y),
        "routed block-message": routed_step(net, bank, "block", x, y),
        "independent (stacked)": routed_step(net, bank, "none", x, y),
        "independent (loop)": loop_step([net.copy_network(a).to(device) for a in range(args.m)], x, y),
    }
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for step in variants.values():
        step(), step()
    sync()
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            timer = Timer(stmt="step(); sync()", globals={"step": variants[name], "sync": sync})
            times[name].append(timer.timeit(1).median * 1e3)
    median = {name: statistics.median(t) for name, t in times.items()}
    print(f"M={args.m}, widths {args.in_features}-{args.hidden}x{args.layers}-10, batch {args.batch},"
          f" {args.blocks} blocks, {args.device}, {torch.get_num_threads()} threads, {args.rounds} rounds")
    print(f"{'variant':24s} {'ms/step':>9s} {'/ stacked':>10s} {'/ loop':>8s}")
    for name, ms in median.items():
        print(f"{name:24s} {ms:9.2f} {ms / median['independent (stacked)']:10.2f}"
              f" {ms / median['independent (loop)']:8.2f}")
    worst = max(median["routed exact"], median["routed block-message"]) / median["independent (stacked)"]
    print(f"target: routed step within 1.3x of M independent copies (stacked): {worst:.2f}x -> "
          f"{'met' if worst <= 1.3 else 'NOT met'}")


if __name__ == "__main__":
    main()
