"""No host synchronisation per training step in any shipped method family (issue 24, item 3).

On a GPU, a ``.item()``, ``bool(tensor)``, ``.cpu()``, ``torch.unique`` or boolean mask in a
training step stalls the host until the device catches up. ``HostSyncCounter`` (a CPU stand-in
for ``torch.cuda.set_sync_debug_mode``) records every such call made from ripieno's own code
while a shipped recipe trains five steps; the steps in the middle of the epoch (after the first
step's lazy set-up, before the epoch-end work) must make none. ``NonFiniteGuard`` reads its
loss check every step on CPU, where it is free, and every 50 steps on an accelerator: the test
runs it as on an accelerator.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import pytest

from ripieno.callbacks import NonFiniteGuard
from ripieno.framework.host_syncs import HostSync, HostSyncCounter
from ripieno.framework.runner.command import RipienoCLI
from ripieno.framework.runner.recipes import find_recipe

ROOT = Path(__file__).resolve().parents[1]


class _StepMarks(L.Callback):
    """Writes a mark into the counter's record at the start of every training batch."""

    def __init__(self, counter: HostSyncCounter) -> None:
        self.counter = counter

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: object,
                             batch_idx: int) -> None:
        self.counter.calls.append(HostSync(f"<step {batch_idx}>", ""))


def syncs_of_middle_steps(recipe: str, *overrides: str) -> list[str]:
    """Host syncs from ripieno code between the start of step 1 and the start of step 4 of a fit."""
    cli = RipienoCLI(args=["--config", str(find_recipe(recipe)), "--trainer.max_epochs=1",
                           "--trainer.limit_train_batches=5", "--trainer.limit_val_batches=1",
                           "--trainer.num_sanity_val_steps=0", "--trainer.enable_progress_bar=false",
                           "--trainer.logger=false", "--trainer.default_root_dir=run", *overrides], run=False)
    counter = HostSyncCounter(only_from=[ROOT / "framework", ROOT / "callbacks", ROOT / "datamodules"],
                              not_from=[ROOT / "framework" / "cli", ROOT / "framework" / "runner"])
    cli.trainer.callbacks.append(_StepMarks(counter))
    assert any(isinstance(c, NonFiniteGuard) for c in cli.trainer.callbacks)  # the command's guard is in
    with counter:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    marks = [str(c) for c in counter.calls]
    assert "<step 4> at " in marks, marks  # five steps ran
    return marks[marks.index("<step 1> at ") + 1:marks.index("<step 4> at ")]


@pytest.fixture(autouse=True)
def _guard_as_on_an_accelerator(monkeypatch, tmp_path):
    monkeypatch.setattr(NonFiniteGuard, "_every", lambda self, trainer: 50)
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("recipe, overrides", [
    ("tabular/lometab_churn", ["--data.init_args.max_rows=3000"]),
    ("mcover/mlp_ring_mnist5k", []),
    ("uq/mc_dropout_fashion_mnist", []),
    ("loes/text_minilm_georeg", ["--data.init_args.source.init_args.max_rows=600"]),
], ids=["tabular-lometab", "mcover-ring", "image-mc-dropout", "loes-fusion-georeg"])
def test_a_training_step_makes_no_host_sync(recipe, overrides):
    assert syncs_of_middle_steps(recipe, *overrides) == ["<step 2> at ", "<step 3> at "]


def test_the_counter_sees_a_per_step_read():
    """The oracle can fail: with the guard reading every step (as on CPU), each step shows its read."""
    NonFiniteGuard._every = lambda self, trainer: 1  # undone by the autouse monkeypatch
    middle = syncs_of_middle_steps("tabular/lometab_churn", "--data.init_args.max_rows=3000")
    assert [m.split(" at ")[0] for m in middle] == ["Tensor.item", "<step 2>", "Tensor.item", "<step 3>",
                                                    "Tensor.item"]
