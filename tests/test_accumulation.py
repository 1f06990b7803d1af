"""Gradient accumulation: step-keyed callbacks act once per optimiser step, not once per batch.

Oracle: with ``B`` batches an epoch and ``accumulate_grad_batches=k`` Lightning takes
``ceil(B / k)`` optimiser steps an epoch (the last, short window steps too). EASGD with
``period=p`` acts after the optimiser steps whose new ``global_step`` is a multiple of ``p``;
``RoutingResampler(every_n_steps=n)`` redraws before the optimiser steps ``0, n, 2n, ...``, at
the first batch of the step.
"""

import math

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from ripieno.callbacks import ElasticAveraging, RoutingResampler
from ripieno.datamodules import ImageDataModule, LoaderSettings
from ripieno.framework import MCoverClassifier

BATCHES, EPOCHS, PERIOD = 10, 2, 2


class _Probe(L.Callback):
    """Records, per training batch, the step and whether the bank or the EASGD centre changed."""

    def __init__(self, easgd, resampler):
        self.easgd, self.resampler = easgd, resampler
        self.draws, self.updates = [], []  # (global_step, batch_idx) at each redraw / elastic update

    def on_train_start(self, trainer, pl_module):
        self._drawn = self.resampler.draws  # a resumed run starts from the checkpoint's count

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # after the resampler's hook
        if self.resampler.draws > self._drawn:
            self.draws.append((trainer.global_step, batch_idx))
        self._drawn = self.resampler.draws

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # after EASGD's hook
        centre = [c.clone() for c in self.easgd.centre]
        if getattr(self, "_centre", None) is not None and any(
                not torch.equal(a, b) for a, b in zip(centre, self._centre, strict=True)):
            self.updates.append((trainer.global_step, batch_idx))
        self._centre = centre


def _fit(tmp_path, accumulate, epochs=EPOCHS, ckpt_path=None, checkpoint=None):
    torch.manual_seed(0)
    dm = ImageDataModule("digits", max_train_rows=160,
                         loader=LoaderSettings(batch_size=8))  # more than BATCHES batches
    model = MCoverClassifier(dm.spec, m=3, hidden=[8], kernel="gaussian_ring", bank_size=4, lr=0.05)
    easgd = ElasticAveraging(alpha=0.1, period=PERIOD)
    resampler = RoutingResampler(every_n_steps=PERIOD, seed=3)
    probe = _Probe(easgd, resampler)
    callbacks = [resampler, easgd, probe] + ([checkpoint] if checkpoint is not None else [])
    trainer = L.Trainer(max_epochs=epochs, accumulate_grad_batches=accumulate, limit_train_batches=BATCHES,
                        limit_val_batches=0, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=checkpoint is not None,
                        deterministic=True, default_root_dir=tmp_path, callbacks=callbacks)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path, weights_only=True)
    return trainer, model, easgd, resampler, probe


@pytest.mark.parametrize("accumulate", [1, 4])
def test_easgd_and_resampler_act_once_per_optimizer_step(tmp_path, accumulate):
    trainer, _, _, resampler, probe = _fit(tmp_path, accumulate)
    per_epoch = math.ceil(BATCHES / accumulate)
    steps = EPOCHS * per_epoch
    assert trainer.global_step == steps  # the oracle's step count is Lightning's
    # EASGD: after the optimiser steps that bring global_step to PERIOD, 2 PERIOD, ...
    assert [step for step, _ in probe.updates] == list(range(PERIOD, steps + 1, PERIOD))
    # ... each at the last batch of an accumulation window (the epoch's last batch closes a short one)
    window_ends = {min(i + accumulate, BATCHES) - 1 for i in range(0, BATCHES, accumulate)}
    assert {batch for _, batch in probe.updates} <= window_ends
    # RoutingResampler: the period is in optimiser steps, the redraw at the first batch of the step
    assert [step for step, _ in probe.draws] == list(range(0, steps, PERIOD))
    assert resampler.draws == len(range(0, steps, PERIOD))
    assert {batch for _, batch in probe.draws} <= set(range(0, BATCHES, accumulate))


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_resume_under_accumulation_continues_the_same_run(tmp_path):
    _, straight, straight_easgd, straight_resampler, _ = _fit(tmp_path / "straight", 4, epochs=3)
    first = ModelCheckpoint(dirpath=tmp_path / "first", save_last=True)
    _fit(tmp_path / "first", 4, epochs=2, checkpoint=first)
    _, resumed, easgd, resampler, probe = _fit(tmp_path / "resumed", 4, epochs=3,
                                               ckpt_path=first.last_model_path)
    # 3 optimiser steps an epoch: the resumed epoch (steps 6, 7, 8) redraws before step 6 and 8 and
    # exchanges with the centre after step 8 only, as the straight run did
    assert [step for step, _ in probe.draws] == [6, 8]
    assert [step for step, _ in probe.updates] == [8]
    assert resampler.draws == straight_resampler.draws == 5
    assert torch.equal(resumed.bank_perms, straight.bank_perms)
    for a, b in zip(easgd.centre, straight_easgd.centre, strict=True):
        assert torch.equal(a, b)
    for (name, a), (_, b) in zip(resumed.state_dict().items(), straight.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
