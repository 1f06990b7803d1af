"""What an estimator's fit keeps and skips: the best epoch's weights in memory, no unread logging.

Oracles: the weights and ``val/loss`` recorded at every validation by a callback of the same
fit (the kept weights are the first epoch of least ``val/loss``, exactly), Lightning's own
``ModelCheckpoint`` when a user adds one, and a user's logger still receiving every column.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from ripieno.framework.methods.best_weights import BestWeights
from ripieno.framework.methods.estimators import EnsembleClassifier, EnsembleRegressor

QUICK = {"k": 2, "d_block": 16, "n_blocks": 1, "lr": 5e-2, "batch_size": 64, "random_state": 0}


class Recorder(Callback):
    """Each validation's ``val/loss`` and a copy of the weights."""

    def __init__(self) -> None:
        self.losses: list[float] = []
        self.states: list[dict[str, torch.Tensor]] = []

    def on_validation_end(self, trainer, pl_module):  # noqa: D102
        self.losses.append(float(trainer.callback_metrics["val/loss"]))
        self.states.append({k: v.detach().clone() for k, v in pl_module.state_dict().items()})


def _table(n: int = 240) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4))
    return x, x[:, 0] + 0.3 * rng.normal(size=n)


@pytest.mark.parametrize("cls", [EnsembleClassifier, EnsembleRegressor])
def test_the_kept_weights_are_the_first_epoch_of_least_validation_loss(cls):
    x, y = _table()
    y = (y > 0).astype(int) if cls is EnsembleClassifier else y
    recorder = Recorder()
    model = cls(**QUICK, max_epochs=12, patience=3, trainer_kwargs={"callbacks": [recorder]}).fit(x, y)
    best = int(np.argmin(recorder.losses))  # the first of equal values, as ModelCheckpoint keeps it
    assert 0 < best < len(recorder.losses) - 1 or len(recorder.losses) == 12  # a real choice was made
    assert model.best_score_ == recorder.losses[best]
    kept = model.model_.state_dict()
    assert kept.keys() == recorder.states[best].keys()
    for name, value in recorder.states[best].items():
        assert torch.equal(kept[name], value), name


def test_a_users_model_checkpoint_still_writes_its_files(tmp_path):
    x, y = _table()
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/loss", save_top_k=1)
    model = EnsembleRegressor(**QUICK, max_epochs=3, patience=5,
                              trainer_kwargs={"callbacks": [checkpoint]}).fit(x, y)
    assert len(list((tmp_path / "ckpt").glob("*.ckpt"))) == 1
    assert float(checkpoint.best_model_score) == model.best_score_  # the same choice, from the file's side


def test_a_users_logger_gets_every_column_and_a_bare_fit_logs_none_it_does_not_read(tmp_path):
    x, y = _table()
    y = (y > 0).astype(int)
    logged = EnsembleClassifier(**QUICK, max_epochs=2, trainer_kwargs={
        "logger": CSVLogger(tmp_path, name="run", version=0), "log_every_n_steps": 1}).fit(x, y)
    columns = set(pd.read_csv(tmp_path / "run" / "version_0" / "metrics.csv").columns)
    assert {"train/loss_step", "train/loss_epoch", "val/loss", "val/accuracy", "val/auroc"} <= columns
    assert logged.model_.log_loss_columns and logged.model_.validation_metrics
    bare = EnsembleClassifier(**QUICK, max_epochs=2).fit(x, y)
    assert not bare.model_.log_loss_columns and not bare.model_.validation_metrics
    assert not list(tmp_path.glob("**/checkpoints"))  # no default ModelCheckpoint wrote anything


def test_best_weights_treats_nan_as_the_worst_and_keeps_the_first_of_ties():
    best = BestWeights(monitor="m", mode="min")

    class Trainer:
        sanity_checking = False
        current_epoch = 0
        callback_metrics: dict[str, torch.Tensor] = {}

    module = torch.nn.Linear(1, 1)
    trainer = Trainer()
    for epoch, value in enumerate([math.nan, 2.0, 2.0, 1.0, math.nan]):
        trainer.current_epoch, trainer.callback_metrics = epoch, {"m": torch.tensor(value)}
        with torch.no_grad():
            module.weight.fill_(epoch)
        best.on_validation_end(trainer, module)
    assert (best.best_epoch, best.best_score) == (3, 1.0)
    best.restore(module)
    assert module.weight.item() == 3.0
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        BestWeights(mode="lowest")
