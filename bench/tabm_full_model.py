"""One training step of the whole tabular model: the ``tabm`` package's TabM next to ours.

What is measured
    A full model with piecewise-linear embeddings (``rtdl_num_embeddings`` version B for
    the package, ours for ripieno; same bins, ``--d_embedding``), categorical one-hot
    inputs, ``--blocks`` hidden layers of width ``--d``, ``--k`` members and a member head,
    on a batch of ``--batch`` rows (defaults: K=32, d_block=512, 3 blocks, batch 256,
    8 numeric features with 32 bins, 2 categorical ones). One step is forward, the mean
    member cross-entropy, backward and an AdamW step (gradients reset with
    ``set_to_none``). Rows: ``tabm.TabM`` (arch ``tabm``), ours ``rank1`` (the same
    network, tested equal to the package's in ``tests/test_tabm_equivalence.py``), ours
    ``lometab`` at r=4 and r=16 (``compute="auto"``) and r=4 with ``materialized`` and
    ``factored`` forced. At the default batch ``auto`` runs the ``materialized`` order, so
    those two rows run the same code: how far apart they land is the run's noise.

Time
    ``torch.utils.benchmark.Timer``; every variant takes one warm-up step, then the variants
    interleave over ``--rounds`` rounds (the order rotates each round), each timed over
    ``--steps`` consecutive steps. The ratio column is the median over rounds of each round's
    time divided by the package's time in the same round (paired, so a slow spell of this
    shared machine hits both sides of a ratio alike), with the spread of those per-round
    ratios (25th-75th percentile); the ms column is the median step. The ``factored`` row,
    about 7x slower, is timed after the rounds (3 samples) so that it does not space the
    others' samples apart. Thread count printed.

Where LoMETab's cost goes, and what is left of the gap
    TabM's member weight is never formed: ``((x * r_k) @ W^T) * s_k`` costs one shared
    GEMM. LoMETab's ``W * (1 + A_k B_k^T)`` cannot be factored that way for r > 1: the
    ``materialized`` order builds the ``(K, out, in)`` member weights, runs batched GEMMs
    on them, and in backward needs the ``(K, out, in)`` member-weight gradients for the
    gradients of ``A_k``, ``B_k`` and ``W``. Its GEMMs do the same multiply-adds as TabM's
    (measured alike: 45-48 ms each for the forward of one 512 x 512 layer on the 2-core
    EPYC); what LoMETab adds is about six elementwise passes over ``(K, out, in)``
    tensors per layer and the thin rank-r products.
    Formed for all 32 members at once these are 32 MiB each and went to
    DRAM and back on every pass (a 1.25x-1.33x step before); ``_LoMEMatmul`` now forms
    them two members (2 MiB) at a time so each pass hits cache, and runs the thin
    gradient products of ``A_k``, ``B_k`` in the orientation MKL is fast at on the host
    (``framework/nn/thin_products.py`` times both once per shape: 4-6x apart, and the fast
    one differs between Intel and AMD CPUs; ``grad_A`` ran in the slow one on this EPYC until
    2026-12-07, about 8 ms per 512 x 512 layer and step). What remains (within the
    run-to-run noise of this machine at r=4) is those cache-resident passes and the
    rank-r products. The ``factored`` order runs ``rank + 1`` shared GEMMs on inputs
    scaled by the columns of ``B_k`` (about ``rank + 1`` times TabM's multiply-adds);
    ``auto`` picks it only for small ``batch * (rank + 1)``.

Under load (``--load``)
    The same table from fresh processes, three quiet and three beside a fixed concurrent load (a
    2-thread 1024 x 1024 float32 GEMM loop in another process, started before the measuring
    process, so that its thin-product timings are taken under the load too), alternating; each
    run ``--rounds`` rounds (default 9 here). Printed side by side: each variant's median ratio in
    every run. Then, for every thin-product key of the LoMETab layers (``thin_products``): which
    orientation is fast (timed quietly, 15 paired rounds), how many of each run's choices were the
    slow one, and 20 fresh decisions under the load by the current rule (paired rounds, median,
    margin) and by the rule before it (the best of two timings of each side, one after the other).

Run: ``python bench/tabm_full_model.py`` (``make bench`` runs it with the others);
``python bench/tabm_full_model.py --load`` for the quiet / loaded comparison (about 10 minutes).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import rtdl_num_embeddings as rne
import tabm
import torch
import torch.nn.functional as F
from torch.utils import benchmark

from ripieno.framework.nn import TabularEnsembleNet, thin_products
from ripieno.framework.nn.ensemble_linear import (
    EnsembleLinear,
    _low_rank,
    lometab_member_chunk,
)
from ripieno.framework.nn.thin_products import thin_matmul

LOAD = ("import torch; torch.set_num_threads(2); a = torch.full((1024, 1024), 0.5)\n"
        "while True:\n    a @ a")
"""The fixed concurrent load: a 2-thread GEMM loop, what another job on the same cores looks like."""


def _bins(n_features: int, n_bins: int, rows: torch.Tensor) -> list[torch.Tensor]:
    return rne.compute_bins(rows, n_bins=n_bins)[:n_features]


def synthetic_batch(args: argparse.Namespace, device: torch.device) -> tuple[
        list[int], int, list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """The benches' input: categorical cardinalities, classes, PLE bins, and one batch ``x_num, x_cat, y``."""
    cards, n_classes = [5, 3], 2
    bins = _bins(args.n_num, args.n_bins, torch.randn(4096, args.n_num))
    x_num = torch.randn(args.batch, args.n_num, device=device)
    x_cat = torch.stack([torch.randint(0, c, (args.batch,)) for c in cards], 1).to(device)
    y = torch.randint(0, n_classes, (args.batch,), device=device)
    return cards, n_classes, bins, x_num, x_cat, y


def ripieno_net(args: argparse.Namespace, cards: list[int], n_classes: int, bins: list[torch.Tensor],
                **kwargs: object) -> torch.nn.Module:
    """The ``TabularEnsembleNet`` of ripieno at the bench's sizes (``kwargs``: adapter and options)."""
    return TabularEnsembleNet(args.n_num, cards, n_classes, k=args.k, n_blocks=args.blocks, d_block=args.d,
                              dropout=0.1, bins=bins, d_embedding=args.d_embedding, **kwargs)


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, x_num: torch.Tensor,
          x_cat: torch.Tensor, y: torch.Tensor) -> None:
    optimizer.zero_grad(set_to_none=True)
    out = model(x_num, x_cat)  # (B, K, C)
    loss = F.cross_entropy(out.flatten(0, 1), y.repeat_interleave(out.shape[1]))
    loss.backward()
    optimizer.step()


def _member_weight_work(model: torch.nn.Module) -> tuple[callable, callable]:  # type: ignore[valid-type]
    """Two timed functions over ``model``'s LoMETab layers: what LoMETab adds to TabM's step.

    ``extra`` runs, chunk by chunk as ``_LoMEMatmul`` does, every pass that TabM has no
    counterpart of: forming the member weights (forward), forming ``A_k B_k^T`` and the
    member weights again (backward), ``grad_m = G_k * W``, the two thin gradient products and
    ``sum_k G_k * (1 + A_k B_k^T)`` (with a stand-in ``G_k``). ``stream`` is six elementwise
    passes over all ``(K, out, in)`` members at once, out of cache: the memory-bandwidth cost
    such passes would have if they were not chunked.
    """
    layers = [m for m in model.modules() if isinstance(m, EnsembleLinear) and m.adapter == "lometab"]
    work = []
    for layer in layers:
        w, a, b = layer.weight.detach(), layer.adapter_a.detach(), layer.adapter_b.detach()
        chunk = lometab_member_chunk(layer.k, layer.out_features, layer.in_features, w.device)
        work.append((w, a, b, chunk, torch.randn(chunk, *w.shape, device=w.device),
                     torch.randn(layer.k, *w.shape, device=w.device)))

    def extra() -> None:
        for w, a, b, chunk, g, _ in work:
            for s in range(0, a.shape[0], chunk):
                e = min(s + chunk, a.shape[0])
                torch.addcmul(w, _low_rank(a[s:e], b[s:e]), w)  # forward: the member weights
                m = _low_rank(a[s:e], b[s:e])  # backward: recomputed
                torch.addcmul(w, m, w)  # grad_x's member weights
                grad_m = g[:e - s] * w
                thin_matmul(grad_m, b[s:e])
                thin_matmul(grad_m.transpose(1, 2), a[s:e])
                _ = torch.addcmul(g[:e - s], g[:e - s], m).sum(0)  # grad_w's share

    def stream() -> None:
        for w, _, _, _, _, big in work:
            for _ in range(6):  # the six elementwise passes of ``extra``, over all members at once
                torch.mul(big, w)

    return extra, stream


def model_arguments(parser: argparse.ArgumentParser) -> None:
    """The network's size options and the rounds, shared with ``bench/tabular_compile.py``."""
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--d", type=int, default=512)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--n_num", type=int, default=8)
    parser.add_argument("--n_bins", type=int, default=32)
    parser.add_argument("--d_embedding", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)


def _child(args: argparse.Namespace, rounds: int) -> dict[str, object]:
    """One run of this script in a fresh process; its ratios and thin-product choices."""
    command = [sys.executable, __file__, "--json", "--rounds", str(rounds), "--steps", str(args.steps),
               "--k", str(args.k), "--d", str(args.d), "--blocks", str(args.blocks),
               "--batch", str(args.batch)]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("JSON ")]
    return json.loads(line[5:])


def _old_rule(plain: Callable[[], object], swapped: Callable[[], object]) -> float:
    """The rule before paired rounds: best of two timings of each side after a warm-up, plain first."""
    def best(fn: Callable[[], object]) -> float:
        fn()
        fastest = math.inf
        for _ in range(2):
            start = time.perf_counter()
            fn()
            fastest = min(fastest, time.perf_counter() - start)
        return fastest
    return best(plain) / best(swapped)


def _key_functions(key: list[object]) -> tuple[Callable[[], object], Callable[[], object]]:
    shape, transposed, columns, dtype = key
    dtype = getattr(torch, str(dtype).removeprefix("torch."))
    if transposed:
        big = torch.full((*shape[:-2], shape[-1], shape[-2]), 0.5, dtype=dtype).mT
    else:
        big = torch.full(tuple(shape), 0.5, dtype=dtype)
    thin = torch.full((*shape[:-2], shape[-1], columns), 0.25, dtype=dtype)
    return (lambda: torch.matmul(big, thin)), (lambda: thin_products._swapped(big, thin))


def compare_under_load(args: argparse.Namespace) -> None:
    """Three quiet and three loaded runs side by side, then the thin-product choices under the load."""
    rounds = args.rounds if args.rounds != 15 else 9
    runs: list[tuple[str, dict[str, object]]] = []
    for index in range(3):
        runs.append((f"quiet {index + 1}", _child(args, rounds)))
        load = subprocess.Popen([sys.executable, "-c", LOAD])
        try:
            time.sleep(2)  # the load is running before the measuring process starts
            runs.append((f"loaded {index + 1}", _child(args, rounds)))
        finally:
            load.kill()
            load.wait()
    names = list(runs[0][1]["ratios"])
    print(f"one training step, K={args.k}, d_block={args.d}, {args.blocks} blocks, batch {args.batch};"
          f" each cell the median of {rounds} paired per-round ratios to the tabm package's TabM in that run;"
          " loaded: beside a 2-thread GEMM loop")
    order = [r for r in runs if r[0].startswith("quiet")] + [r for r in runs if r[0].startswith("loaded")]
    print(f"{'variant':<36}" + "".join(f"{name:>10}" for name, _ in order))
    for name in names:
        print(f"{name:<36}" + "".join(f"{run['ratios'][name]:>10.2f}" for _, run in order))
    keys = {json.dumps(c[:4]): c[:4] for _, run in runs for c in run["choices"]}
    truth = {k: thin_products.paired_ratio(*_key_functions(key), rounds=15) for k, key in keys.items()}
    slow = {label: sum(1 for c in run["choices"] if c[4] != (truth[json.dumps(c[:4])] < 1)
                       and abs(math.log(truth[json.dumps(c[:4])])) > math.log(thin_products.PLAIN_MARGIN))
            for label, run in runs}
    print(f"thin-product keys: {len(keys)}; the fast orientation timed quietly (15 paired rounds): plain on"
          f" {sum(r < 1 for r in truth.values())}, transposed on {sum(r >= 1 for r in truth.values())};"
          f" plain / transposed time {min(truth.values()):.2f}-{max(truth.values()):.2f}")
    print("choices of the slow orientation (where the two are more than the margin apart), per run: "
          + ", ".join(f"{label} {count}" for label, count in slow.items()))
    load = subprocess.Popen([sys.executable, "-c", LOAD])
    try:
        time.sleep(2)
        wrong_new = wrong_old = 0
        for k, key in keys.items():
            fast_plain = truth[k] < 1
            if abs(math.log(truth[k])) <= math.log(thin_products.PLAIN_MARGIN):
                continue  # within the margin either choice costs little
            for _ in range(20):
                plain, swapped = _key_functions(key)
                margin = thin_products.PLAIN_MARGIN
                wrong_new += (thin_products.paired_ratio(plain, swapped) * margin < 1) != fast_plain
                wrong_old += (_old_rule(plain, swapped) * margin < 1) != fast_plain
    finally:
        load.kill()
        load.wait()
    decided = 20 * sum(abs(math.log(r)) > math.log(thin_products.PLAIN_MARGIN) for r in truth.values())
    print(f"fresh decisions under the load, slow orientation chosen: paired rounds (now) {wrong_new} of"
          f" {decided}, best of two (before) {wrong_old} of {decided}")


def main() -> None:
    """Print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    model_arguments(parser)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=2, help="consecutive steps per timed sample")
    parser.add_argument("--load", action="store_true",
                        help="3 quiet and 3 loaded runs in fresh processes, side by side (module docstring)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a --load run's child
    parser.set_defaults(rounds=15)
    args = parser.parse_args()
    if args.load:
        compare_under_load(args)
        return
    device = torch.device(args.device)
    torch.manual_seed(0)
    cards, n_classes, bins, x_num, x_cat, y = synthetic_batch(args, device)

    def ours(**kwargs: object) -> torch.nn.Module:
        return ripieno_net(args, cards, n_classes, bins, **kwargs)

    variants = {
        "tabm package TabM": lambda: tabm.TabM.make(
            n_num_features=args.n_num, cat_cardinalities=cards, d_out=n_classes, arch_type="tabm", k=args.k,
            n_blocks=args.blocks, d_block=args.d, dropout=0.1,
            num_embeddings=rne.PiecewiseLinearEmbeddings(bins, args.d_embedding, activation=False,
                                                         version="B")),
        "ripieno rank1 (TabM)": lambda: ours(adapter="rank1"),
        "ripieno lometab r=4": lambda: ours(adapter="lometab", rank=4),
        "ripieno lometab r=16": lambda: ours(adapter="lometab", rank=16),
        "ripieno lometab r=4 materialized": lambda: ours(adapter="lometab", rank=4, compute="materialized"),
        "ripieno lometab r=4 factored": lambda: ours(adapter="lometab", rank=4, compute="factored"),
    }
    timers = {}
    for name, build in variants.items():
        model = build().to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        _step(model, optimizer, x_num, x_cat, y)  # warm-up (allocations, lazy state)
        timers[name] = benchmark.Timer("step(model, opt, x_num, x_cat, y)",
                                       globals={"step": _step, "model": model, "opt": optimizer,
                                                "x_num": x_num, "x_cat": x_cat, "y": y})
    apart = [name for name in variants if name.endswith("factored")]
    names = [name for name in variants if name not in apart]
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timers[name].timeit(args.steps).mean * 1e3)
    for name in apart:
        times[name] = [timers[name].timeit(1).mean * 1e3 for _ in range(3)]
    base_times = times["tabm package TabM"]
    base = statistics.median(base_times)
    lometab = variants["ripieno lometab r=4"]().to(device).train()
    extra, stream = _member_weight_work(lometab)
    extra_ms = statistics.median(benchmark.Timer("f()", globals={"f": extra}).timeit(1).median * 1e3
                                 for _ in range(args.rounds))
    stream_ms = statistics.median(benchmark.Timer("f()", globals={"f": stream}).timeit(1).median * 1e3
                                  for _ in range(args.rounds))
    print(f"one training step, K={args.k}, d_block={args.d}, {args.blocks} blocks, batch {args.batch}, PLE "
          f"({args.n_num} features x {args.n_bins} bins), device {device}, torch threads "
          f"{torch.get_num_threads()}, {args.rounds} interleaved rounds of {args.steps} steps")
    print(f"{'variant':<36} {'ms':>9} {'ratio to tabm':>14} {'per-round ratio 25-75%':>24}")
    for name in variants:
        ms = statistics.median(times[name])
        if name in apart:
            print(f"{name:<36} {ms:>9.1f} {ms / base:>14.2f} {'(timed apart, 3 steps)':>24}")
            continue
        ratios = [t / b for t, b in zip(times[name], base_times, strict=True)]
        low, _, high = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else (ratios[0],) * 3
        print(f"{name:<36} {ms:>9.1f} {statistics.median(ratios):>14.2f} {f'{low:.2f}-{high:.2f}':>24}")
    lometab_ms = statistics.median(times["ripieno lometab r=4"])
    print(f"LoMETab r=4's own work (member weights and their gradients, chunked as in the step):"
          f" {extra_ms:.1f} ms, {extra_ms / lometab_ms:.0%} of its step; the package's step + this ="
          f" {(base + extra_ms) / base:.2f}x the package, an upper bound: TabM's own passes over the"
          f" activations (x * r_k, * s_k and their gradients), which LoMETab has not, offset part of it")
    print(f"the same six elementwise passes over all {args.k} members at once (out of cache):"
          f" {stream_ms:.1f} ms")
    if args.json:  # for compare_under_load: the median ratios and the thin-product choices made
        ratios = {name: statistics.median(t / b for t, b in zip(times[name], base_times, strict=False))
                  for name in variants if name not in apart}
        choices = [[list(key[0]), key[1], key[2], str(key[3]), choice.plain]
                   for key, choice in thin_products._CHOICES.items()]
        print("JSON " + json.dumps({"ratios": ratios, "choices": choices}))


if __name__ == "__main__":
    main()
