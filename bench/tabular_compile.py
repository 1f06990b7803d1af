"""One training step of the tabular network, eager next to ``torch.compile`` (``compile: true``).

What is measured
    ``TabularEnsembleNet`` with piecewise-linear embeddings (``--n_num`` numeric features with
    ``--n_bins`` bins, ``--d_embedding``), two categorical inputs, ``--blocks`` hidden layers of
    width ``--d``, ``--k`` members and a member head, on a batch of ``--batch`` rows (defaults:
    K=32, d_block=512, 3 blocks, batch 256). One step is forward, the mean member
    cross-entropy, backward and an AdamW step (gradients reset with ``set_to_none``). As
    ``TabularEnsembleModule(compile=True)`` does, only the network is compiled
    (``torch.compile(net, mode=--mode)``, inductor); loss, backward and optimiser stay as they
    are. Rows: ``rank1`` (TabM) and ``lometab`` at r=4 (``compute="auto"``, which is the
    ``materialized`` order at this batch), each eager and compiled from the same weights.

Time
    ``torch.utils.benchmark.Timer``; the four steps interleave over ``--rounds`` rounds and the
    table shows the median step in ms and the ratio compiled/eager, measured side by side in
    this one process with the thread count printed. Compilation is not in the step times: the
    first compiled step (compile plus one step) is timed on its own and printed as ``compile s``,
    then every variant takes ``--warmup`` more steps before the rounds. ``graphs`` and
    ``breaks`` count what dynamo made of the network (LoMETab's ``_LoMEMatmul`` defines a
    custom ``jvp``, which dynamo does not trace, so each of its layers is a graph break and runs
    eager between compiled pieces).

Run: ``python bench/tabular_compile.py`` (``--quick``: a small network, a check that it runs).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters
from torch.utils import benchmark

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling bench script, run as a script
from tabm_full_model import _step, model_arguments, ripieno_net, synthetic_batch  # noqa: E402


def main() -> None:
    """Print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--mode", default="default", help="torch.compile mode")
    parser.add_argument("--quick", action="store_true",
                        help="K=4, d_block=64, 2 blocks, batch 64, 3 rounds: checks that it runs")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    if args.quick:
        args.k, args.d, args.blocks, args.batch, args.rounds = 4, 64, 2, 64, 3
    device = torch.device(args.device)
    torch.manual_seed(0)
    cards, n_classes, bins, x_num, x_cat, y = synthetic_batch(args, device)

    def net(**kwargs: object) -> torch.nn.Module:
        return ripieno_net(args, cards, n_classes, bins, **kwargs).to(device).train()

    networks = {"rank1 (TabM)": net(adapter="rank1"), "lometab r=4": net(adapter="lometab", rank=4)}
    timers: dict[str, benchmark.Timer] = {}
    compile_s: dict[str, float] = {}
    graphs: dict[str, tuple[int, int]] = {}
    for name, eager in networks.items():
        for kind in ("eager", "compiled"):
            model = eager if kind == "eager" else copy.deepcopy(eager)
            if kind == "compiled":
                torch._dynamo.reset()
                counters.clear()
                model = torch.compile(model, mode=args.mode)
            optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
            start = time.perf_counter()
            _step(model, optimizer, x_num, x_cat, y)  # compiles (compiled) or allocates (eager)
            if device.type == "cuda":
                torch.cuda.synchronize()
            if kind == "compiled":
                compile_s[name] = time.perf_counter() - start
                graphs[name] = (int(counters["stats"]["unique_graphs"]),
                                sum(counters["graph_break"].values()))
            for _ in range(args.warmup):
                _step(model, optimizer, x_num, x_cat, y)
            timers[f"{name} {kind}"] = benchmark.Timer(
                "step(model, opt, x_num, x_cat, y)",
                globals={"step": _step, "model": model, "opt": optimizer, "x_num": x_num, "x_cat": x_cat,
                         "y": y})
    times: dict[str, list[float]] = {name: [] for name in timers}
    names = list(timers)
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timers[name].timeit(1).median * 1e3)
    print(f"one training step, K={args.k}, d_block={args.d}, {args.blocks} blocks, batch {args.batch}, PLE "
          f"({args.n_num} features x {args.n_bins} bins), device {device}, torch {torch.__version__},"
          f" threads {torch.get_num_threads()}, compile mode {args.mode},"
          f" median of {args.rounds} interleaved rounds")
    print(f"{'network':<14} {'eager ms':>9} {'compiled ms':>12} {'compiled/eager':>15} {'compile s':>10}"
          f" {'graphs':>7} {'breaks':>7}")
    for name in networks:
        eager_ms = statistics.median(times[f"{name} eager"])
        compiled_ms = statistics.median(times[f"{name} compiled"])
        n_graphs, n_breaks = graphs[name]
        print(f"{name:<14} {eager_ms:>9.1f} {compiled_ms:>12.1f} {compiled_ms / eager_ms:>15.2f}"
              f" {compile_s[name]:>10.1f} {n_graphs:>7} {n_breaks:>7}")


if __name__ == "__main__":
    main()
