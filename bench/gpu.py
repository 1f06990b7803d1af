"""The GPU checks of issue 24 (item 5) in one prepared run: five sections, each a ratio measured side by side.

What is measured
    (a) ``tabular step``: one training step (forward, mean member cross-entropy, backward,
        AdamW step, gradients reset with ``set_to_none``) of the ``tabm`` package's TabM
        (arch ``tabm``, ``rtdl_num_embeddings`` piecewise-linear embeddings version B),
        ripieno's rank-1 TabM and ripieno's LoMETab at r=4 (``TabularEnsembleNet``,
        ``adapter="rank1" | "lometab"``), each in fp32 and under bf16 autocast, eager and
        ``torch.compile``d: 12 rows, the model setup of ``bench/tabm_full_model.py`` (K=32,
        d_block=512, 3 blocks, batch 256, 8 numeric features x 32 bins, 2 categorical ones).
        Each row runs 3 untimed steps first (compilation happens there; their seconds are
        shown), then ``rounds`` rounds of ``steps`` steps (the device synchronised around each
        round), the rows interleaved with the order rotated every round; the table shows the
        median ms per step and its ratio to the package's eager fp32 row. fp32 rows use
        torch's default matmul precision (``highest``: no TF32).
    (b) ``GLM sampling``: LL-GLM against DNN-GLM posterior sampling (``GLMPosteriorSampler``,
        batched CG with ``tol=0``, so both run exactly the same iterations) on one LeNet-5
        classifier (``make_backbone("lenet")`` and a linear head) with random weights and
        synthetic Fashion-MNIST-shaped data: the helpers of ``bench/glm_sampler.py``
        (``make_data``, ``make_sampler``, ``timed``, ``peak_growth``). Time is the median
        ``sampler.fit`` over the rounds (the order alternating); memory is the peak growth
        of ``torch.cuda.max_memory_allocated`` during one more fit (``n/a`` on CPU).
    (c) ``DDP step``: one training step of a tiny tabular recipe-like module
        (``TabularEnsembleModule``, LoMETab K=16 r=4, 2 blocks of 128, on ``mlc_churn``,
        batch 128 per device) under a Lightning ``Trainer(strategy="ddp_spawn")`` on all
        visible GPUs against one GPU: the median time per step on rank 0 (device synchronised
        around each step, after warm-up steps) and the throughput ratio. Skipped, with the
        reason printed, on fewer than 2 GPUs (``--ddp-cpu`` runs it on 2 CPU processes with
        gloo: a check of the code path, not a measurement).
    (d) ``LOES extraction``: rows/s of ``extract_layer_embeddings`` (mean pooling of the 7
        hidden states) through the shipped all-MiniLM-L6-v2 on ``rows`` Rotten Tomatoes
        training snippets (max length 64, batches of 256, one untimed warm-up batch first), and
        the selection share: ``select_layers`` (LOES, K=3, LOO ridge loss) on the extracted
        rows divided by the extraction time (medians of ``rounds``; the calls of
        ``bench/loes_selection.py``, copied: that script keeps them inside its ``main``).
    (e) ``host syncs``: calls that make the host wait for the device, per training step, for
        one shipped recipe of each method family (tabular LoMETab ``tabular/lometab_churn``,
        M-cover MLP ``mcover/mlp_ring_mnist5k``, image classifier
        ``uq/mc_dropout_fashion_mnist``, LOES fusion ``loes/text_minilm_georeg``), run through
        the ``ripieno`` command in-process (shipped callbacks included) in a temporary working
        directory. One untimed 1-step fit first (warm-up; fills the LOES feature cache), then a
        2-step and a 6-step fit; per step = (syncs of the 6-step fit - syncs of the 2-step
        fit) / (optimizer steps of the one - of the other), so the per-fit and per-epoch work
        cancels. Counted two ways: on CUDA the warnings of ``torch.cuda.set_sync_debug_mode
        ("warn")`` (every sync in the process, Lightning's included; ``n/a`` on CPU), and on
        every device ``ripieno.framework.host_syncs.HostSyncCounter`` limited to ripieno's own
        ``framework``, ``callbacks`` and ``datamodules`` (the command-line code excluded). The
        sites of the per-step syncs (file:line) follow the table.

Time
    Each section prints its elapsed seconds, and the report ends with the total; the default
    sizes are meant to finish all sections in under 8 minutes on one H100 (most of it the six
    ``torch.compile`` warm-ups of (a) and the fits of (e)). ``--sections`` runs a subset.

Failures
    A failing section (or a failing row of one) prints ``section X failed: <one line>`` (the
    traceback goes to stderr) and the other sections still run; the exit code is 1 if any
    section failed.

Run
    ``.venv/bin/python bench/gpu.py`` on a machine with a GPU (without one it stops and says
    so); ``--out report.md`` also writes the printed report as a markdown file (never over an
    existing one). ``--dry-run`` is a CPU smoke test of every section at tiny sizes, one round,
    (a) compiled with the ``aot_eager`` backend (``--compile-backend`` to change; inductor's
    C++ compiles would take minutes), memory ``n/a``, DDP skipped: about 85 s of CPU time on
    2 cores (its wall time grows with the machine's load). Sizes: ``FULL`` and ``DRY`` below.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("KINETO_LOG_LEVEL", "99")
os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # `bench` importable when run as a script

import lightning as L  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor, nn  # noqa: E402

MIB = 2**20
PROG = "bench/gpu.py"


# ----------------------------------------------------------------------------- settings and report
@dataclass(frozen=True)
class Sizes:
    """Sizes of every section (``FULL`` for a GPU, ``DRY`` for the CPU smoke test).

    Attributes:
        rounds: timing rounds of (a), (b) and (d).
        k: TabM members in (a).
        d_block: hidden width in (a).
        blocks: hidden blocks in (a).
        batch: batch rows in (a).
        n_num: numeric features in (a).
        n_bins: PLE bins per numeric feature in (a).
        d_embedding: PLE embedding width in (a).
        steps: steps per timing round in (a).
        warmup: untimed steps per row in (a) (compilation included).
        glm_train: training images in (b).
        glm_batch: batch size in (b).
        glm_samples: posterior samples S in (b).
        glm_iters: CG iterations in (b).
        ddp_rows: rows of ``mlc_churn`` in (c).
        ddp_batch: batch rows per device in (c).
        ddp_steps: training steps per run in (c).
        ddp_warmup: first steps left out of the median in (c).
        loes_rows: Rotten Tomatoes snippets in (d).
        sync_batch: batch size override of the recipes in (e) (``None``: the recipe's).
        sync_rows: rows of the tabular and image data in (e).
        sync_text_rows: Rotten Tomatoes snippets of the LOES recipe in (e).
    """

    rounds: int = 7
    k: int = 32
    d_block: int = 512
    blocks: int = 3
    batch: int = 256
    n_num: int = 8
    n_bins: int = 32
    d_embedding: int = 16
    steps: int = 20
    warmup: int = 3
    glm_train: int = 2048
    glm_batch: int = 256
    glm_samples: int = 10
    glm_iters: int = 5
    ddp_rows: int = 5000
    ddp_batch: int = 128
    ddp_steps: int = 60
    ddp_warmup: int = 10
    loes_rows: int = 2000
    sync_batch: int | None = None
    sync_rows: int = 3000
    sync_text_rows: int = 1000


FULL = Sizes()
DRY = Sizes(rounds=1, k=4, d_block=16, blocks=1, batch=32, n_num=4, n_bins=8, d_embedding=8, steps=2,
            warmup=1, glm_train=64, glm_batch=32, glm_samples=2, glm_iters=1, ddp_rows=600, ddp_batch=32,
            ddp_steps=6, ddp_warmup=2, loes_rows=64, sync_batch=8, sync_rows=300, sync_text_rows=120)


@dataclass(frozen=True)
class Settings:
    """What one run measures and where.

    Attributes:
        sizes: the section sizes.
        device: where everything runs.
        dry_run: the CPU smoke test.
        compile_backend: ``torch.compile`` backend of (a).
        ddp_cpu: run (c) on 2 CPU processes (gloo) instead of skipping it without GPUs.
        families: the method families of (e) (keys of ``FAMILIES``).
    """

    sizes: Sizes
    device: torch.device
    dry_run: bool
    compile_backend: str
    ddp_cpu: bool = False
    families: tuple[str, ...] = ()


class Report:
    """Lines printed as they come and kept for the ``--out`` markdown file."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def line(self, text: str = "") -> None:
        """Print ``text`` and keep it."""
        print(text, flush=True)
        self.lines.extend(text.split("\n"))

    def table(self, header: list[str], rows: list[list[str]], left: int = 1) -> None:
        """Print a markdown table.

        Args:
            header: column names.
            rows: cells, one list per row.
            left: how many leading columns are left-aligned (the rest are right-aligned).
        """
        self.line("| " + " | ".join(header) + " |")
        self.line("|" + "|".join("---" if i < left else "---:" for i in range(len(header))) + "|")
        for row in rows:
            self.line("| " + " | ".join(row) + " |")

    def text(self) -> str:
        """The whole report as one string."""
        return "\n".join(self.lines) + "\n"


def one_line(error: BaseException) -> str:
    """``Type: first line of the message``, at most 300 characters."""
    message = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {message[0]}" if message else type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _fmt(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _mib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / MIB:.1f}"


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- (a) tabular step
@dataclass
class _StepRow:
    name: str
    precision: str
    mode: str
    run: Callable[[], None] | None = None
    warmup_s: float | None = None
    times: list[float] | None = None
    error: str | None = None


def _tabular_models(s: Sizes) -> tuple[dict[str, Callable[[], nn.Module]], list[int], int]:
    """Builders of the three models of (a) (``bench/tabm_full_model.py``'s setup)."""
    import rtdl_num_embeddings as rne
    import tabm

    from ripieno.framework.nn import TabularEnsembleNet

    cards, n_classes = [5, 3], 2
    bins = rne.compute_bins(torch.randn(4096, s.n_num), n_bins=s.n_bins)[: s.n_num]

    def ours(**kwargs: Any) -> nn.Module:  # noqa: ANN401
        return TabularEnsembleNet(s.n_num, cards, n_classes, k=s.k, n_blocks=s.blocks, d_block=s.d_block,
                                  dropout=0.1, bins=bins, d_embedding=s.d_embedding, **kwargs)

    builders: dict[str, Callable[[], nn.Module]] = {
        "tabm package TabM": lambda: tabm.TabM.make(
            n_num_features=s.n_num, cat_cardinalities=cards, d_out=n_classes, arch_type="tabm", k=s.k,
            n_blocks=s.blocks, d_block=s.d_block, dropout=0.1,
            num_embeddings=rne.PiecewiseLinearEmbeddings(bins, s.d_embedding, activation=False, version="B")),
        "ripieno rank1 (TabM)": lambda: ours(adapter="rank1"),
        "ripieno lometab r=4": lambda: ours(adapter="lometab", rank=4),
    }
    return builders, cards, n_classes


def _make_step(model: nn.Module, batch: tuple[Tensor, Tensor, Tensor], device: torch.device,
               bf16: bool) -> Callable[[], None]:
    """One training step of ``model`` on ``batch`` (AdamW, mean member cross-entropy)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x_num, x_cat, y = batch

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            out = model(x_num, x_cat)  # (B, K, C)
            loss = F.cross_entropy(out.flatten(0, 1).float(), y.repeat_interleave(out.shape[1]))
        loss.backward()
        optimizer.step()

    return step


def section_tabular(report: Report, cfg: Settings) -> list[str]:
    """(a): TabM package vs ripieno rank-1 vs LoMETab r=4, fp32/bf16, eager/compiled."""
    s, device = cfg.sizes, cfg.device
    torch.manual_seed(0)
    builders, cards, n_classes = _tabular_models(s)
    x_num = torch.randn(s.batch, s.n_num, device=device)
    x_cat = torch.stack([torch.randint(0, c, (s.batch,)) for c in cards], 1).to(device)
    y = torch.randint(0, n_classes, (s.batch,), device=device)
    rows = [_StepRow(name, precision, mode) for name in builders for precision in ("fp32", "bf16")
            for mode in ("eager", "compiled")]
    for row in rows:
        try:
            torch.manual_seed(0)
            model = builders[row.name]().to(device).train()
            if row.mode == "compiled":
                model = torch.compile(model, backend=cfg.compile_backend)
            step = _make_step(model, (x_num, x_cat, y), device, row.precision == "bf16")
            _sync(device)
            start = time.perf_counter()
            for _ in range(s.warmup):
                step()
            _sync(device)
            row.warmup_s, row.run, row.times = time.perf_counter() - start, step, []
        except Exception as error:  # noqa: BLE001 - one failing row must not stop the others
            row.error = one_line(error)
            traceback.print_exc()
    live = [row for row in rows if row.run is not None]
    for r in range(s.rounds):
        for row in live[r % max(len(live), 1):] + live[: r % max(len(live), 1)]:
            if row.error is not None or row.run is None or row.times is None:
                continue
            try:
                _sync(device)
                start = time.perf_counter()
                for _ in range(s.steps):
                    row.run()
                _sync(device)
                row.times.append((time.perf_counter() - start) / s.steps * 1e3)
            except Exception as error:  # noqa: BLE001
                row.error = one_line(error)
                traceback.print_exc()
    base_row = rows[0]
    base = statistics.median(base_row.times) if base_row.times and base_row.error is None else None
    report.line(f"one training step, K={s.k}, d_block={s.d_block}, {s.blocks} blocks, batch {s.batch}, PLE "
                f"({s.n_num} features x {s.n_bins} bins, d_embedding {s.d_embedding}), device {device}, "
                f"compile backend {cfg.compile_backend}, median of {s.rounds} interleaved rounds of "
                f"{s.steps} steps, ratio to the tabm package's eager fp32 row\n")
    table = []
    for row in rows:
        if row.error is not None or not row.times:
            table.append([row.name, row.precision, row.mode, "failed", "n/a", _fmt(row.warmup_s, 1),
                          f"failed: {row.error}"])
            continue
        ms = statistics.median(row.times)
        table.append([row.name, row.precision, row.mode, f"{ms:.3f}",
                      _fmt(None if base is None else ms / base), _fmt(row.warmup_s, 1), ""])
    report.table(["variant", "precision", "mode", "ms/step", "ratio to tabm eager fp32", "warm-up s", "note"],
                 table, left=3)
    failures = [f"{row.name} {row.precision} {row.mode}: {row.error or 'no timing'}" for row in rows
                if row.error is not None or not row.times]
    del rows, live
    torch._dynamo.reset()
    _release(device)
    return failures


# ----------------------------------------------------------------------------- (b) GLM sampling
class LeNetClassifier(nn.Module):
    """LeNet-5 features (``make_backbone("lenet")``) and a linear ``head`` with 10 outputs."""

    def __init__(self) -> None:
        super().__init__()
        from ripieno.framework.methods.image_classifier import make_backbone

        self.features, d = make_backbone("lenet", (1, 28, 28), 0)
        self.head = nn.Linear(d, 10)

    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(B, 10)`` for images ``(B, 1, 28, 28)``."""
        return self.head(self.features(x))


def _first(batch: tuple[Tensor, Tensor]) -> Tensor:
    return batch[0]


def _second(batch: tuple[Tensor, Tensor]) -> Tensor:
    return batch[1]


def section_glm(report: Report, cfg: Settings) -> list[str]:
    """(b): LL-GLM vs DNN-GLM sampler fit time and peak memory."""
    from bench.glm_sampler import make_data, make_sampler, peak_growth, timed
    from ripieno.framework.uq.linearization import FullNetworkLinearization, LastLayerLinearization

    s, device = cfg.sizes, cfg.device
    torch.manual_seed(0)
    model = LeNetClassifier().to(device)
    loader, _ = make_data(s.glm_train, s.glm_batch, device)
    variants = {"LL-GLM": LastLayerLinearization(model, _first),
                "DNN-GLM": FullNetworkLinearization(model, _first)}
    for lin in variants.values():  # warm-up: one batch, one CG iteration
        make_sampler(lin, s.glm_samples, 1).fit(loader[:1], _second)
    times: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(s.rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            sampler = make_sampler(variants[name], s.glm_samples, s.glm_iters)
            seconds, _ = timed(lambda sampler=sampler: sampler.fit(loader, _second), device)
            times[name].append(seconds)
            del sampler
    peaks: dict[str, int | None] = {}
    for name, lin in variants.items():
        if device.type == "cuda":
            sampler = make_sampler(lin, s.glm_samples, s.glm_iters)
            peaks[name] = peak_growth(lambda sampler=sampler: sampler.fit(loader, _second), device)
            del sampler
        else:
            peaks[name] = None
    report.line(f"LeNet-5 classifier ({sum(p.numel() for p in model.parameters()):,} parameters), "
                f"N={s.glm_train}, batch {s.glm_batch}, S={s.glm_samples}, {s.glm_iters} CG iterations, "
                f"device {device}, median fit time of {s.rounds} rounds (order alternating); memory: peak "
                "growth of torch.cuda.max_memory_allocated during one fit\n")
    ll_t, ll_m = statistics.median(times["LL-GLM"]), peaks["LL-GLM"]
    table = []
    for name, lin in variants.items():
        t, m = statistics.median(times[name]), peaks[name]
        table.append([name, f"{lin.n_params:,}", f"{t:.3f}", f"{t / ll_t:.2f}", _mib(m),
                      _fmt(None if m is None or not ll_m else m / ll_m)])
    report.table(["variant", "linearised params", "fit s", "time x LL-GLM", "peak growth MiB",
                  "memory x LL-GLM"], table)
    dnn_t, dnn_m = statistics.median(times["DNN-GLM"]), peaks["DNN-GLM"]
    memory = "n/a (CPU)" if dnn_m is None or not ll_m else f"{dnn_m / ll_m:.1f}x"
    report.line(f"\nDNN-GLM / LL-GLM: time {dnn_t / ll_t:.1f}x, memory {memory}")
    _release(device)
    return []


# ----------------------------------------------------------------------------- (c) DDP step
class StepTimer(L.Callback):
    """Times every training step (device synchronised) and writes rank 0's times as JSON.

    Args:
        path: the JSON file (a list of seconds) that global rank 0 writes at the end.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.times: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any,  # noqa: ANN401
                             batch_idx: int) -> None:
        """Start the clock once the device is idle."""
        _sync(pl_module.device)
        self._start = time.perf_counter()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,  # noqa: ANN401
                           batch: Any, batch_idx: int) -> None:  # noqa: ANN401
        """Stop the clock after the optimizer step has finished on the device."""
        _sync(pl_module.device)
        self.times.append(time.perf_counter() - self._start)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Global rank 0 writes its step times."""
        if trainer.is_global_zero:
            tmp = f"{self.path}.tmp"
            Path(tmp).write_text(json.dumps(self.times))
            os.replace(tmp, self.path)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        """Close a gloo process group at the worker's exit (Lightning does so only for nccl)."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            from ripieno.framework.runner.process_group_exit import close_process_group_at_exit

            close_process_group_at_exit()


def ddp_step_times(accelerator: str, devices: int, s: Sizes, folder: Path) -> list[float]:
    """Step times (s) on rank 0 of a tiny LoMETab fit on ``devices`` devices (``ddp_spawn`` if > 1).

    Args:
        accelerator: ``cuda`` or ``cpu``.
        devices: number of devices (processes).
        s: sizes (``ddp_rows``, ``ddp_batch``, ``ddp_steps``).
        folder: where the run and the times file go.

    Returns:
        The seconds of every step on global rank 0, warm-up included.
    """
    from ripieno.datamodules import LoaderSettings, SplitSettings, TabularDataModule
    from ripieno.framework import TabularEnsembleModule

    L.seed_everything(0, verbose=False)
    data = TabularDataModule("mlc_churn", n_bins=32, max_rows=s.ddp_rows, split=SplitSettings(seed=0),
                             loader=LoaderSettings(batch_size=s.ddp_batch))
    model = TabularEnsembleModule(data.spec, k=16, adapter="lometab", rank=4, n_blocks=2, d_block=128,
                                  dropout=0.1, d_embedding=8)
    path = folder / f"times_{accelerator}_{devices}.json"
    with _quiet():
        trainer = L.Trainer(accelerator=accelerator, devices=devices,
                            strategy="ddp_spawn" if devices > 1 else "auto", max_steps=s.ddp_steps,
                            max_epochs=-1, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            default_root_dir=str(folder), callbacks=[StepTimer(str(path))])
        trainer.fit(model, datamodule=data)
    return list(json.loads(path.read_text()))


def section_ddp(report: Report, cfg: Settings) -> list[str]:
    """(c): a DDP training step on all visible GPUs against one GPU."""
    s = cfg.sizes
    if cfg.ddp_cpu:
        accelerator, n = "cpu", 2
    else:
        n = torch.cuda.device_count() if cfg.device.type == "cuda" else 0
        if n < 2:
            report.line(f"DDP step: skipped: {n} visible GPU(s), DDP needs at least 2 "
                        f"(device {cfg.device}; torch.cuda.device_count() = {torch.cuda.device_count()})")
            return []
        accelerator = "cuda"
    with tempfile.TemporaryDirectory(prefix="gpu-bench-ddp-") as tmp:
        single = ddp_step_times(accelerator, 1, s, Path(tmp))
        multi = ddp_step_times(accelerator, n, s, Path(tmp))
    one = statistics.median(single[s.ddp_warmup:] or single)
    many = statistics.median(multi[s.ddp_warmup:] or multi)
    report.line(f"tiny tabular module (TabularEnsembleModule, LoMETab K=16 r=4, 2 x 128, mlc_churn "
                f"{s.ddp_rows} rows), batch {s.ddp_batch} per device, {s.ddp_steps} steps, median step on "
                f"rank 0 after {s.ddp_warmup} warm-up steps, accelerator {accelerator}"
                f"{' (gloo: a code-path check, not a measurement)' if cfg.ddp_cpu else ''}\n")
    report.table(["run", "devices", "rows/step", "ms/step", "step x 1 device", "throughput x 1 device"], [
        ["single device", "1", str(s.ddp_batch), f"{one * 1e3:.2f}", "1.00", "1.00"],
        ["ddp_spawn", str(n), str(n * s.ddp_batch), f"{many * 1e3:.2f}", f"{many / one:.2f}",
         f"{n * one / many:.2f}"],
    ])
    _release(cfg.device)
    return []


# ----------------------------------------------------------------------------- (d) LOES extraction
def section_loes(report: Report, cfg: Settings) -> list[str]:
    """(d): MiniLM extraction throughput and the LOES selection share of it."""
    from transformers import AutoModel

    from ripieno.datamodules import LoaderSettings, TextDataModule
    from ripieno.framework.loes import extract_layer_embeddings, minilm_dir, select_layers

    s, device = cfg.sizes, cfg.device
    torch.manual_seed(0)
    data = TextDataModule("rotten_tomatoes", tokenizer_dir=str(minilm_dir()), max_length=64,
                          max_rows=int(s.loes_rows / 0.72) + 10, loader=LoaderSettings(eval_batch_size=256))
    train = data._split("train")  # the training split in a fixed order (as bench/loes_selection.py)
    n = min(s.loes_rows, len(train))
    batches = [train.__getitems__(list(range(i, min(i + 256, n)))) for i in range(0, n, 256)]
    keys = ["input_ids", "attention_mask"]
    with _quiet():
        model = AutoModel.from_pretrained(str(minilm_dir())).eval().to(device)
    extract_layer_embeddings(model, batches[:1], keys, "mean", progress=False)  # warm-up
    extraction, selection = [], []
    layers: list[Tensor] = []
    chosen: list[int] = []
    for _ in range(s.rounds):
        _sync(device)
        start = time.perf_counter()
        emb, labels = extract_layer_embeddings(model, batches, keys, "mean", progress=False)
        _sync(device)
        extraction.append(time.perf_counter() - start)
        layers = list(emb.unbind(0))
        start = time.perf_counter()
        result = select_layers(layers, labels, 3, loss="loo", lam=1.0, alpha=0.1, gamma=0.05, eta=0.01)
        selection.append(time.perf_counter() - start)
        chosen = list(result.layers)
    ext, sel = statistics.median(extraction), statistics.median(selection)
    report.line(f"all-MiniLM-L6-v2 ({len(layers)} hidden states, mean pooling), {n} Rotten Tomatoes "
                f"snippets, max length 64, batch 256, extraction on {device}, selection (LOES K=3, LOO) on "
                f"{layers[0].device if layers else 'n/a'}, {torch.get_num_threads()} torch threads, medians "
                f"of {s.rounds} rounds\n")
    report.table(["model", "rows", "extract s", "rows/s", "select s", "selection share", "layers"], [
        ["MiniLM", str(n), f"{ext:.3f}", f"{n / ext:.0f}", f"{sel:.3f}", f"{100 * sel / ext:.2f}%",
         str(chosen)]])
    del model, layers
    _release(device)
    return []


# ----------------------------------------------------------------------------- (e) host syncs
FAMILIES = {
    "tabular LoMETab": "tabular/lometab_churn",
    "M-cover MLP": "mcover/mlp_ring_mnist5k",
    "image classifier": "uq/mc_dropout_fashion_mnist",
    "LOES fusion": "loes/text_minilm_georeg",
}


def _family_args(family: str, s: Sizes, cache: Path) -> list[str]:
    """The command-line arguments that size one family's recipe for (e)."""
    args = ["-c", FAMILIES[family]]
    if family == "tabular LoMETab":
        args.append(f"--data.init_args.max_rows={s.sync_rows}")
    elif family in ("M-cover MLP", "image classifier"):
        args.append(f"--data.init_args.max_train_rows={s.sync_rows}")
    else:
        source = {"class_path": "ripieno.datamodules.TextDataModule",
                  "init_args": {"dataset": "rotten_tomatoes", "max_length": 64, "split": {"seed": 0},
                                "max_rows": s.sync_text_rows}}
        args += [f"--data.init_args.source={json.dumps(source)}", "--data.init_args.progress=false",
                 "--data.init_args.selection.scores_path=null", f"--data.init_args.cache.dir={cache}"]
    if s.sync_batch is not None:  # the modality DataModules group it; LayerEmbeddingDataModule has its own
        grouped = family in ("tabular LoMETab", "M-cover MLP", "image classifier")
        args.append(f"--data.init_args.{'loader.' if grouped else ''}batch_size={s.sync_batch}")
    return args


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Lightning's info lines, printed output and progress bars out of the report."""
    from ripieno.framework.messages import quiet_lightning

    with quiet_lightning(logging.ERROR), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        yield


@contextlib.contextmanager
def _restored_torch_flags(folder: Path) -> Iterator[None]:
    """Run inside ``folder``; restore the cwd and the determinism flags a recipe's Trainer sets."""
    cwd = os.getcwd()
    flags = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark)
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)
        torch.use_deterministic_algorithms(flags[0], warn_only=flags[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = flags[2], flags[3]


@dataclass
class _FitCount:
    steps: int
    cuda_syncs: Counter[str] | None
    syncs: Counter[str]


def _counted_fit(family: str, n_steps: int, cfg: Settings, folder: Path, count: bool) -> _FitCount:
    """One ``ripieno fit`` of ``n_steps`` steps of ``family``'s recipe, its host syncs counted.

    Args:
        family: a key of ``FAMILIES``.
        n_steps: ``limit_train_batches`` of the one epoch.
        cfg: the run's settings.
        folder: a fresh working directory and run folder.
        count: count syncs (``False``: the warm-up fit).

    Returns:
        Optimizer steps taken, the CUDA sync-debug warnings by site (``None`` off CUDA) and the
        ``HostSyncCounter`` syncs by site.

    Raises:
        RuntimeError: the command stopped with an error (its message).
    """
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from ripieno.framework.cli import main
    from ripieno.framework.host_syncs import HostSyncCounter

    folder.mkdir(parents=True)
    args = ["fit", *_family_args(family, cfg.sizes, folder.parent / "features"), "--trainer.max_epochs=1",
            f"--trainer.limit_train_batches={n_steps}", "--trainer.limit_val_batches=2",
            "--test_after_fit=false", "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false", f"--trainer.accelerator={cfg.device.type}",
            "--trainer.devices=1", f"--trainer.default_root_dir={folder}"]
    import ripieno.callbacks
    import ripieno.datamodules
    import ripieno.framework

    ours = [Path(m.__file__).parent for m in (ripieno.framework, ripieno.callbacks, ripieno.datamodules)
            if m.__file__ is not None]
    counter = HostSyncCounter(only_from=ours, not_from=[ours[0] / "cli", ours[0] / "runner"])
    steps = [0]
    handle = register_optimizer_step_post_hook(
        lambda *_: steps.__setitem__(0, steps[0] + 1))
    on_cuda = cfg.device.type == "cuda"
    caught: list[warnings.WarningMessage] = []
    try:
        with _restored_torch_flags(folder), warnings.catch_warnings(record=True) as caught, _quiet():
            warnings.simplefilter("always")
            if count and on_cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                if count:
                    # NonFiniteGuard reads its loss check every step on CPU only (free there): count
                    # as on an accelerator, where it reads every 50 steps
                    from ripieno.callbacks import NonFiniteGuard

                    every = NonFiniteGuard._every
                    NonFiniteGuard._every = lambda self, trainer: 50  # type: ignore[method-assign]
                    try:
                        with counter:
                            main(args)
                    finally:
                        NonFiniteGuard._every = every  # type: ignore[method-assign]
                else:
                    main(args)
            except SystemExit as stop:
                if stop.code not in (None, 0):
                    raise RuntimeError(str(stop.code)) from None
            finally:
                if on_cuda:
                    torch.cuda.set_sync_debug_mode(0)
    finally:
        handle.remove()
    cuda_syncs = None
    if on_cuda:
        cuda_syncs = Counter(f"{_short(w.filename)}:{w.lineno}" for w in caught
                             if "synchroniz" in str(w.message))
    syncs = Counter(f"{_short(c.where)} {c.call}" for c in counter.calls)
    return _FitCount(steps[0], cuda_syncs, syncs)


def _short(where: str) -> str:
    """A path (``file:line``) relative to the repository or to site-packages, when inside one."""
    for root in (Path(torch.__file__).parents[1], REPO):
        with contextlib.suppress(ValueError):
            return str(Path(where).relative_to(root))
    return where


def _per_step(small: _FitCount, big: _FitCount, field: str) -> tuple[str, Counter[str]]:
    """Syncs per step between two fits, and the sites that grew (per step, rounded)."""
    a, b = getattr(small, field), getattr(big, field)
    if a is None or b is None:
        return "n/a (CPU)", Counter()
    steps = big.steps - small.steps
    if steps <= 0:
        return f"n/a ({small.steps} and {big.steps} optimizer steps)", Counter()
    grew = Counter({site: n for site, n in (b - a).items() if n > 0})
    return f"{(b.total() - a.total()) / steps:.2f}", grew


def section_syncs(report: Report, cfg: Settings) -> list[str]:
    """(e): host syncs per training step of one recipe of each method family."""
    failures, table = [], []
    sites: dict[str, list[str]] = {"HostSyncCounter syncs": [], "CUDA sync warnings": []}
    with tempfile.TemporaryDirectory(prefix="gpu-bench-syncs-") as tmp:
        for family in cfg.families or tuple(FAMILIES):
            try:
                root = Path(tmp) / family.replace(" ", "_")
                _counted_fit(family, 1, cfg, root / "warmup", count=False)
                small = _counted_fit(family, 2, cfg, root / "fit2", count=True)
                big = _counted_fit(family, 6, cfg, root / "fit6", count=True)
                cuda, cuda_grew = _per_step(small, big, "cuda_syncs")
                cpu, grew = _per_step(small, big, "syncs")
                table.append([family, FAMILIES[family], f"{small.steps} / {big.steps}", cuda, cpu])
                steps = max(big.steps - small.steps, 1)
                for kind, counts in (("HostSyncCounter syncs", grew), ("CUDA sync warnings", cuda_grew)):
                    top = ", ".join(f"{site} x{n / steps:g}" for site, n in counts.most_common(5))
                    sites[kind].append(f"- {family}: {top or 'none'}")
            except Exception as error:  # noqa: BLE001 - one failing family must not stop the others
                failures.append(f"{family}: {one_line(error)}")
                traceback.print_exc()
                table.append([family, FAMILIES[family], "failed", "n/a", f"failed: {one_line(error)}"])
            finally:
                _release(cfg.device)
    report.line(f"one training step per family through `ripieno fit` (accelerator {cfg.device.type}); "
                "per step = (syncs of a 6-step fit - syncs of a 2-step fit) / (their optimizer steps' "
                "difference); NonFiniteGuard reads its loss check every 50 steps, as on an accelerator\n")
    report.table(["family", "recipe", "optimizer steps (2-step / 6-step fit)", "CUDA sync warnings / step",
                  "HostSyncCounter / step"], table, left=3)
    for kind, lines in sites.items():
        if kind == "HostSyncCounter syncs" or cfg.device.type == "cuda":
            report.line(f"\nsites of the per-step {kind} (file:line, x per step; at most 5):")
            for line in lines:
                report.line(line)
    return failures


# ----------------------------------------------------------------------------- driver
SECTIONS: dict[str, tuple[str, Callable[[Report, Settings], list[str]]]] = {
    "a": ("tabular step: tabm package TabM vs ripieno rank-1 TabM vs LoMETab r=4", section_tabular),
    "b": ("GLM sampling: LL-GLM vs DNN-GLM time and peak memory", section_glm),
    "c": ("DDP step: all visible GPUs vs one", section_ddp),
    "d": ("LOES extraction: MiniLM throughput and selection share", section_loes),
    "e": ("host syncs per training step, per method family", section_syncs),
}


def run_sections(report: Report, cfg: Settings, keys: str) -> list[str]:
    """Run the chosen sections, each guarded; return the keys of the failed ones."""
    failed = []
    for key, (title, fn) in SECTIONS.items():
        if key not in keys:
            continue
        report.line(f"\n## ({key}) {title}\n")
        start = time.perf_counter()
        try:
            problems = fn(report, cfg)
        except (Exception, SystemExit) as error:  # noqa: BLE001 - the other sections still run
            traceback.print_exc()
            problems = [one_line(error)]
        if problems:
            failed.append(key)
            text = "; ".join(problems)
            report.line(f"\nsection {key} failed: {text if len(text) <= 600 else text[:597] + '...'}")
        report.line(f"\nsection {key} time: {time.perf_counter() - start:.1f} s")
    return failed


def write_report(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (``path.tmp`` then ``os.replace``), never over a file."""
    if path.exists():
        raise SystemExit(f"{PROG}: {path} exists; not overwritten (choose another --out)")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, run the sections, print (and write) the report; return the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU smoke test: tiny sizes, one round, every section (no GPU needed)")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write the report to this markdown file (refused if it exists)")
    parser.add_argument("--sections", default="".join(SECTIONS),
                        help=f"which sections to run, e.g. 'ade' (default: {''.join(SECTIONS)})")
    parser.add_argument("--compile-backend", default=None,
                        help="torch.compile backend of (a) (default: inductor; aot_eager in --dry-run)")
    parser.add_argument("--ddp-cpu", action="store_true",
                        help="run (c) on 2 CPU processes (gloo) instead of skipping it: a code-path check")
    parser.add_argument("--families", default="all",
                        help="(e)'s method families, comma-separated first words: tabular,m-cover,image,loes")
    args = parser.parse_args(argv)
    by_word = {name.split()[0].lower(): name for name in FAMILIES}
    words = list(by_word) if args.families == "all" else [w.strip().lower() for w in args.families.split(",")]
    if set(words) - set(by_word):
        raise SystemExit(f"{PROG}: unknown families {sorted(set(words) - set(by_word))}; choose from"
                         f" {', '.join(by_word)}")
    if args.out is not None and args.out.exists():
        raise SystemExit(f"{PROG}: {args.out} exists; not overwritten (choose another --out)")
    if args.out is not None and not args.out.resolve().parent.is_dir():
        raise SystemExit(f"{PROG}: the folder of --out {args.out} does not exist")
    unknown = set(args.sections) - set(SECTIONS)
    if unknown:
        raise SystemExit(f"{PROG}: unknown section(s) {''.join(sorted(unknown))}; "
                         f"choose from {''.join(SECTIONS)}")
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit(f"{PROG}: a GPU is needed (torch.cuda.is_available() is False); "
                         "use --dry-run for the CPU smoke test")
    device = torch.device("cpu" if args.dry_run else "cuda")
    backend = args.compile_backend or ("aot_eager" if args.dry_run else "inductor")
    cfg = Settings(DRY if args.dry_run else FULL, device, args.dry_run, backend, args.ddp_cpu,
                   tuple(by_word[w] for w in words))
    report = Report()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    dry = " - DRY RUN (CPU, tiny sizes)" if args.dry_run else ""
    report.line(f"# GPU benchmark (issue 24, item 5){dry}\n")
    report.line(f"torch {torch.__version__}, lightning {L.__version__}, device {device} ({name}), "
                f"visible GPUs {torch.cuda.device_count()}, torch threads {torch.get_num_threads()}, "
                f"sections {args.sections}")
    start = time.perf_counter()
    failed = run_sections(report, cfg, args.sections)
    report.line(f"\ntotal time: {time.perf_counter() - start:.1f} s; "
                f"{'failed sections: ' + ', '.join(failed) if failed else 'all sections ran'}")
    if args.out is not None:
        write_report(args.out, report.text())
        print(f"report written to {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
