"""Forward+backward time and memory of the ensemble MLP hot path, per adapter.

What is measured
    The hidden MLP of ``TabularEnsembleNet``: ``--blocks`` (default 3) ``EnsembleLinear``
    layers of width ``--d`` (input width ``--d`` too) with ReLU in between, applied to a
    member input of shape ``(--batch, --k, --d)`` (defaults 256, 32, 512), once per
    adapter: ``lometab`` (rank 1, 4, 16 with ``compute="auto"``, and rank 4 with
    ``factored`` and ``materialized`` forced), ``rank1`` (TabM), ``packed`` (independent
    weights), ``additive`` (rank 4), ``shared`` (one MLP, K identical members) and a
    Python loop over K separate ``nn.Sequential`` MLPs of the same widths applied to
    ``x[:, k]`` (outputs stacked). The input does not require grad (raw features enter
    the first layer). One step is ``loss = out.square().mean(); loss.backward()`` with
    gradients reset with ``set_to_none`` before every step.

    A second table repeats a few variants at a small batch (``--small-batch``, default
    4), where ``lometab``'s ``auto`` mode switches to the factored evaluation order.

Time
    ``torch.utils.benchmark.Timer``, one ``timeit(1)`` call (two untimed warmup steps,
    then the timed step) per variant per round; the rounds interleave the variants
    (order rotated every round) so that drifts of the machine hit all of them alike;
    the table shows the median over rounds in ms. Slow rows stop after ``--budget``
    seconds (at least 3 rounds). All variants run in the same process with the same
    thread count (printed).

CPU allocator
    By default (``--cpu-malloc heap``) the script stops glibc from returning freed
    memory to the kernel before it measures. Otherwise glibc gives large freed blocks
    back (``munmap`` above its dynamic mmap threshold, heap trimming above its trim
    threshold) and the next allocation page-faults and zero-fills them again. Every
    ``(K, out, in)`` float32 temporary is 32 MiB at K=32, d=512, so the rows that build
    such temporaries pay this churn or not depending on what the process ran before
    (this script's own history usually leaves enough free heap to absorb them; a fresh
    process training one model may not). ``heap`` (``M_MMAP_MAX=0`` and a huge
    ``M_TRIM_THRESHOLD``) reuses freed blocks like CUDA's caching allocator, so the
    timings do not depend on the order the rows run in. ``--cpu-malloc glibc`` keeps
    glibc's defaults. The last column shows fresh pages the kernel mapped per step
    (minor page faults from ``getrusage``); with ``heap`` it is about 0 after warmup.

Memory
    ``peak MiB``: parameter and input bytes plus the peak growth of allocated memory
    during one step (activations, temporaries, gradients). On CUDA the growth is
    ``torch.cuda.max_memory_allocated`` (after ``reset_peak_memory_stats``) minus the
    memory allocated before the step. On CPU, where no allocator peak counter exists,
    it is the maximum of the running sum of the CPU allocations and frees that
    ``torch.profiler`` (``profile_memory=True``) records during the step (a private
    profiler API; the column shows ``n/a`` if it is unavailable).
    ``saved MiB``: bytes autograd keeps for backward (unique storages of all tensors
    seen by ``torch.autograd.graph.saved_tensors_hooks``, which also sees tensors that
    custom ``autograd.Function``s store with ``ctx.save_for_backward``) plus the output
    and parameter bytes, deduplicated by storage. It leaves out temporaries that exist
    only inside an op or inside backward, which ``peak MiB`` includes.

Run
    ``.venv/bin/python bench/ensemble_linear.py`` (defaults as the issue asks; a couple
    of minutes on 2 CPU cores), ``--quick`` for a smoke test, ``--device cuda``,
    ``--dtype bfloat16`` (autocast), ``--k/--d/--batch/--blocks`` for other shapes.

Nothing is asserted: the last lines state whether ``lometab`` r=4 is within 1.3x of
``rank1`` and faster than the K-MLP loop in this run.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ.setdefault("KINETO_LOG_LEVEL", "99")  # the profiler's C++ start/stop chatter

import torch  # noqa: E402
from torch import Tensor, nn  # noqa: E402
from torch.utils.benchmark import Timer

from ripieno.framework.nn.ensemble_linear import Adapter, Compute, EnsembleLinear

MIB = 2**20
PAGE_BYTES = resource.getpagesize()


class KMLPLoop(nn.Module):
    """K independent MLPs run one after the other in a Python loop.

    Args:
        d: input and hidden width.
        k: number of members.
        blocks: number of ``Linear`` layers per MLP (ReLU between them).
    """

    def __init__(self, d: int, k: int, blocks: int) -> None:
        super().__init__()
        self.members = nn.ModuleList(_mlp([nn.Linear(d, d) for _ in range(blocks)]) for _ in range(k))

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(B, K, d)`` to ``(B, K, d)`` by applying member ``k`` to ``x[:, k]``."""
        return torch.stack([mlp(x[:, i]) for i, mlp in enumerate(self.members)], dim=1)


def _mlp(layers: list[nn.Module]) -> nn.Sequential:
    """Interleave ``layers`` with ReLU (none after the last layer)."""
    modules: list[nn.Module] = []
    for i, layer in enumerate(layers):
        if i:
            modules.append(nn.ReLU())
        modules.append(layer)
    return nn.Sequential(*modules)


def ensemble_mlp(
    d: int, k: int, blocks: int, adapter: Adapter, rank: int = 4, compute: Compute = "auto"
) -> nn.Module:
    """Build the benchmarked stack of ``EnsembleLinear`` layers.

    Args:
        d: input and hidden width.
        k: number of members.
        blocks: number of layers.
        adapter: ``EnsembleLinear`` adapter.
        rank: adapter rank (``lometab``/``additive``).
        compute: evaluation order (``auto``/``factored``/``materialized``).

    Returns:
        ``EnsembleLinear -> ReLU -> ... -> EnsembleLinear``.
    """
    return _mlp([EnsembleLinear(d, d, k, adapter=adapter, rank=rank, compute=compute) for _ in range(blocks)])


@dataclass
class Variant:
    """One benchmarked model with its results.

    Attributes:
        name: row label.
        model: the module to run.
        times: seconds per step, one entry per round.
        faulted_bytes: bytes of fresh pages the process touched per step (minor page
            faults times the page size), one entry per round.
        peak_bytes: peak memory of one step (``None`` if unavailable).
        saved_bytes: autograd-saved + output + parameter bytes of one step.
    """

    name: str
    model: nn.Module
    times: list[float] = field(default_factory=list)
    faulted_bytes: list[float] = field(default_factory=list)
    peak_bytes: int | None = None
    saved_bytes: int = 0

    @property
    def params(self) -> int:
        """Number of parameters."""
        return sum(p.numel() for p in self.model.parameters())


def _autocast(x: Tensor, dtype: torch.dtype | None) -> torch.autocast:
    """Autocast to ``dtype`` on ``x``'s device, or a disabled autocast for ``None``."""
    return torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def make_step(model: nn.Module, x: Tensor, autocast_dtype: torch.dtype | None) -> Callable[[], None]:
    """Return a closure running one forward+backward step of ``model`` on ``x``.

    Args:
        model: module mapping ``(B, K, d)`` to ``(B, K, d)``.
        x: input batch.
        autocast_dtype: dtype for ``torch.autocast``, or ``None`` for plain precision.

    Returns:
        A function that resets the gradients (``set_to_none``) and runs one step.
    """
    params = list(model.parameters())

    def step() -> None:
        for p in params:
            p.grad = None
        with _autocast(x, autocast_dtype):
            out = model(x)
            loss = out.float().square().mean()
        loss.backward()

    return step


def _storage_key(t: Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def saved_bytes(model: nn.Module, x: Tensor, autocast_dtype: torch.dtype | None) -> int:
    """Bytes of the tensors autograd saves for backward, plus output and parameters.

    Args:
        model: module to run.
        x: input batch.
        autocast_dtype: dtype for ``torch.autocast``, or ``None``.

    Returns:
        Total ``nbytes`` of the unique storages (by data pointer) of all saved tensors,
        the output and the parameters.
    """
    storages: dict[int, int] = {}

    def pack(t: Tensor) -> Tensor:
        ptr, nbytes = _storage_key(t)
        storages[ptr] = max(storages.get(ptr, 0), nbytes)
        return t

    for p in model.parameters():
        p.grad = None
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with _autocast(x, autocast_dtype):
            out = model(x)
        loss = out.float().square().mean()
    for t in [out, *model.parameters()]:
        ptr, nbytes = _storage_key(t)
        storages[ptr] = max(storages.get(ptr, 0), nbytes)
    loss.backward()
    for p in model.parameters():
        p.grad = None
    return sum(storages.values())


def _cpu_peak_delta(step: Callable[[], None]) -> int | None:
    """Peak of the running sum of CPU allocations during ``step`` (profiler events)."""
    try:
        from torch._C._profiler import _EventType
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        events = []
        stack = list(prof.profiler.kineto_results.experimental_event_tree())
        while stack:
            event = stack.pop()
            if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
                events.append((event.start_time_ns, event.extra_fields.alloc_size))
            stack.extend(event.children)
    except Exception:  # noqa: BLE001 - private API: report n/a instead of failing
        return None
    current = peak = 0
    for _, size in sorted(events):
        current += size
        peak = max(peak, current)
    return peak


def peak_bytes(model: nn.Module, x: Tensor, step: Callable[[], None]) -> int | None:
    """Peak memory of one step, including parameters and input (see module docstring).

    Args:
        model: module the step runs (for its parameter bytes on CPU).
        x: input batch (its bytes are counted on CPU).
        step: one forward+backward step.

    Returns:
        Peak bytes, or ``None`` when it cannot be measured.
    """
    resident = sum(p.untyped_storage().nbytes() for p in model.parameters()) + x.untyped_storage().nbytes()
    if x.device.type == "cuda":
        # Other variants' parameters live on the device too: count only this step's growth.
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        return resident + torch.cuda.max_memory_allocated() - before
    delta = _cpu_peak_delta(step)
    return None if delta is None else resident + delta


def measure(
    variants: list[Variant],
    x: Tensor,
    autocast_dtype: torch.dtype | None,
    rounds: int,
    warmup: int,
    budget_s: float,
    min_rounds: int = 3,
) -> None:
    """Fill ``times``, ``peak_bytes`` and ``saved_bytes`` of every variant.

    Each round times every variant once (one ``Timer.timeit(1)`` call, which itself runs
    two untimed warmup steps first), in an order rotated every round. A variant stops
    being timed once it has ``min_rounds`` times and has used ``budget_s`` seconds of
    wall time, so slow rows get fewer (but at least ``min_rounds``) samples.

    Args:
        variants: models to measure (results are stored on them).
        x: input batch.
        autocast_dtype: dtype for ``torch.autocast``, or ``None``.
        rounds: maximum number of timing rounds.
        warmup: untimed steps per variant before anything is measured.
        budget_s: wall-time budget per variant for the timing rounds.
        min_rounds: rounds every variant gets regardless of the budget.
    """
    steps = [make_step(v.model, x, autocast_dtype) for v in variants]
    for v, step in zip(variants, steps, strict=True):
        for _ in range(warmup):
            step()
        v.saved_bytes = saved_bytes(v.model, x, autocast_dtype)
        v.peak_bytes = peak_bytes(v.model, x, step)
    timers = [Timer(stmt="step()", globals={"step": s}, num_threads=torch.get_num_threads()) for s in steps]
    spent = [0.0] * len(variants)
    n = len(variants)
    for r in range(max(rounds, min_rounds)):
        for i in range(n):
            j = (i + r) % n
            if len(variants[j].times) >= min_rounds and (spent[j] >= budget_s or r >= rounds):
                continue
            start, faults = time.perf_counter(), _minor_faults()
            variants[j].times.append(timers[j].timeit(1).median)
            # timeit(1) runs three steps: two warmup steps and the timed one.
            variants[j].faulted_bytes.append((_minor_faults() - faults) * PAGE_BYTES / 3)
            spent[j] += time.perf_counter() - start


def _minor_faults() -> int:
    """Minor page faults of this process so far (fresh pages the kernel had to map)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def use_heap_malloc() -> bool:
    """Make glibc keep freed memory instead of returning it to the kernel.

    Sets ``M_MMAP_MAX = 0`` (every block comes from the heap) and a 1 GiB
    ``M_TRIM_THRESHOLD`` (the heap is not trimmed after frees), so freed blocks are
    reused without new page faults, as with CUDA's caching allocator. See the module
    docstring for why the default behaviour makes CPU timings order-dependent.

    Returns:
        Whether both settings were accepted (``False`` off glibc).
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**30))
    except (OSError, AttributeError):
        return False


def _ratio(value: float | None, base: float | None) -> str:
    return "n/a" if value is None or not base else f"{value / base:.2f}"


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.1f}"


def print_table(title: str, variants: list[Variant], baseline: str = "rank1") -> None:
    """Print a markdown table with time and memory ratios to ``baseline``.

    Args:
        title: heading printed above the table.
        variants: measured variants.
        baseline: name of the reference row.
    """
    base = next(v for v in variants if v.name == baseline)
    base_t = statistics.median(base.times)
    print(f"\n### {title}\n")
    print(
        "| variant | ms fwd+bwd (median) | x rank1 | peak MiB | x rank1 | "
        "saved MiB (autograd-saved + output + params) | x rank1 | params (M) | page-faulted MiB/step |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for v in variants:
        t = statistics.median(v.times)
        print(
            f"| {v.name} | {t * 1e3:.1f} | {t / base_t:.2f} | {_mib(v.peak_bytes)} | "
            f"{_ratio(v.peak_bytes, base.peak_bytes)} | {_mib(v.saved_bytes)} | "
            f"{_ratio(v.saved_bytes, base.saved_bytes)} | {v.params / 1e6:.3f} | "
            f"{statistics.median(v.faulted_bytes) / MIB:.0f} |"
        )


def _lometab_name(rank: int, compute: str, model: nn.Module, batch: int) -> str:
    layer = next(m for m in model.modules() if isinstance(m, EnsembleLinear))
    order = "factored" if layer.uses_factored(batch) else "materialized"
    return f"lometab r={rank} ({compute}: {order})" if compute == "auto" else f"lometab r={rank} ({compute})"


def main() -> None:
    """Parse arguments, run both sections and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--k", type=int, default=32, help="ensemble members")
    parser.add_argument("--d", type=int, default=512, help="input and hidden width (d_block)")
    parser.add_argument("--batch", type=int, default=256, help="batch size of the main table")
    parser.add_argument("--small-batch", type=int, default=4, help="batch size of the small-batch table")
    parser.add_argument("--blocks", type=int, default=3, help="EnsembleLinear layers in the MLP")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--rounds", type=int, default=7, help="maximum timing rounds per variant")
    parser.add_argument("--budget", type=float, default=8.0, help="timing seconds per variant (min 3 rounds)")
    parser.add_argument(
        "--cpu-malloc",
        choices=("heap", "glibc"),
        default="heap",
        help="CPU only: 'heap' disables glibc's mmap for big blocks (reproducible, like CUDA's caching "
        "allocator); 'glibc' keeps the default allocator (see use_heap_malloc)",
    )
    parser.add_argument("--quick", action="store_true", help="few rounds and a small shape: smoke test")
    args = parser.parse_args()
    if args.quick:
        args.k, args.d, args.batch = min(args.k, 4), min(args.d, 64), min(args.batch, 32)
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds, budget = (3, 1.0) if args.quick else (args.rounds, args.budget)
    warmup = 1 if args.quick else 2
    device = torch.device(args.device)
    malloc = "n/a (not CPU)"
    if device.type == "cpu":
        malloc = "glibc default"
        if args.cpu_malloc == "heap":
            malloc = "heap (glibc mmap disabled)" if use_heap_malloc() else "glibc default (mallopt failed)"
    autocast_dtype = torch.bfloat16 if args.dtype == "bfloat16" else None
    k, d, blocks = args.k, args.d, args.blocks

    torch.manual_seed(0)
    print(
        f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, dtype {args.dtype}, "
        f"K={k}, d={d}, blocks={blocks}, batch={args.batch}, small batch={args.small_batch}, "
        f"rounds<={rounds}, budget {budget:g} s/variant, load average before start "
        f"{os.getloadavg()[0]:.2f}, CPU allocator {malloc}"
    )
    start = time.perf_counter()

    def lometab(rank: int, compute: Compute, batch: int) -> Variant:
        model = ensemble_mlp(d, k, blocks, "lometab", rank, compute)
        return Variant(_lometab_name(rank, compute, model, batch), model)

    batch = args.batch
    main_variants = [
        Variant("rank1", ensemble_mlp(d, k, blocks, "rank1")),
        lometab(1, "auto", batch),
        lometab(4, "auto", batch),
        lometab(16, "auto", batch),
        lometab(4, "factored", batch),
        lometab(4, "materialized", batch),
        Variant("additive r=4", ensemble_mlp(d, k, blocks, "additive", 4)),
        Variant("packed", ensemble_mlp(d, k, blocks, "packed")),
        Variant("shared", ensemble_mlp(d, k, blocks, "shared")),
        Variant("K-MLP loop", KMLPLoop(d, k, blocks)),
    ]
    for v in main_variants:
        v.model.to(device)
    measure(main_variants, torch.randn(batch, k, d, device=device), autocast_dtype, rounds, warmup, budget)
    print_table(f"batch {batch}, K={k}, d={d}, {blocks} layers", main_variants)

    small = args.small_batch
    small_variants = [
        Variant("rank1", ensemble_mlp(d, k, blocks, "rank1")),
        lometab(4, "auto", small),
        lometab(4, "factored", small),
        lometab(4, "materialized", small),
        Variant("K-MLP loop", KMLPLoop(d, k, blocks)),
    ]
    for v in small_variants:
        v.model.to(device)
    x_small = torch.randn(small, k, d, device=device)
    measure(small_variants, x_small, autocast_dtype, rounds * 3, warmup, budget / 2)
    print_table(f"small batch {small}, K={k}, d={d}, {blocks} layers", small_variants)

    t = {v.name: statistics.median(v.times) for v in main_variants}
    target = next(name for name in t if name.startswith("lometab r=4 (auto"))
    ratio = t[target] / t["rank1"]
    print(
        f"\n{target}: {ratio:.2f}x rank1 -> '<= 1.3x rank1' {'met' if ratio <= 1.3 else 'NOT met'}; "
        f"{t[target] * 1e3:.1f} ms vs K-MLP loop {t['K-MLP loop'] * 1e3:.1f} ms -> 'faster than K-MLP loop' "
        f"{'met' if t[target] < t['K-MLP loop'] else 'NOT met'}"
    )
    print(f"total benchmark time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
