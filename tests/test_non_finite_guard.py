"""A NaN or inf stops training loudly, and never becomes the best checkpoint (issue 13, item 3)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from ripieno.callbacks import NonFiniteGuard
from ripieno.framework.cli import main
from ripieno.framework.errors import NonFiniteTrainingError
from ripieno.framework.runner.command import refuse_non_finite_best

HERE = Path(__file__).resolve()


class Regression(L.LightningModule):
    """A linear regression that turns its loss NaN at ``nan_step`` or its metric NaN at ``nan_epoch``.

    Args:
        nan_step: Global step whose loss is NaN (``None``: never).
        nan_epoch: Epoch whose ``val/score`` is NaN (``None``: never).
        nan_rank: Only this DDP rank sees the NaN (``None``: every rank).
    """

    def __init__(self, nan_step: int | None = None, nan_epoch: int | None = None,
                 nan_rank: int | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Linear(3, 1)
        self.nan_step, self.nan_epoch, self.nan_rank = nan_step, nan_epoch, nan_rank
        self.weights_seen: list[torch.Tensor] = []

    def _mine(self) -> bool:
        return self.nan_rank is None or self.global_rank == self.nan_rank

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.weights_seen.append(self.net.weight.detach().clone())
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        if self.global_step == self.nan_step and self._mine():
            loss = loss * float("nan")
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        score = torch.nn.functional.mse_loss(self.net(x).squeeze(-1), y)
        if self.current_epoch == self.nan_epoch and self._mine():
            score = score * float("inf")
        self.log("val/score", score, sync_dist=True)
        self.log("val/diagnostic", torch.tensor(float("nan")) if self.nan_step == -1 else score)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    x = torch.randn(64, 3, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5])), batch_size=16)


def _trainer(tmp_path: Path, *callbacks: L.Callback, epochs: int = 3, **kwargs: object) -> L.Trainer:
    return L.Trainer(accelerator="cpu", max_epochs=epochs, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=str(tmp_path), num_sanity_val_steps=0,
                     callbacks=list(callbacks), **kwargs)


def test_a_nan_loss_stops_before_its_update(tmp_path: Path) -> None:
    model = Regression(nan_step=5)
    with pytest.raises(NonFiniteTrainingError, match=r"the training loss is nan at global step 5 \(epoch 1,"
                       r" batch 1\); training stopped before this step's update"):
        _trainer(tmp_path, NonFiniteGuard()).fit(model, _loader(), _loader())
    assert torch.isfinite(model.net.weight).all()
    assert torch.equal(model.net.weight, model.weights_seen[-1])  # the NaN step changed nothing


def test_the_message_names_the_learning_rate(tmp_path: Path) -> None:
    with pytest.raises(NonFiniteTrainingError, match=r"learning rate too high \(the optimizer's is 0\.1\)"):
        _trainer(tmp_path, NonFiniteGuard()).fit(Regression(nan_step=0), _loader())


def test_a_non_finite_metric_stops_before_it_is_checkpointed(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val/score", filename="best-{epoch}")
    with pytest.raises(NonFiniteTrainingError, match=r"val/score = inf, val/diagnostic = inf after validation"
                       r" at global step 8 \(epoch 1\)"):
        _trainer(tmp_path, NonFiniteGuard(), checkpoint).fit(Regression(nan_epoch=1), _loader(), _loader())
    assert [p.name for p in tmp_path.glob("*.ckpt")] == ["best-epoch=0.ckpt"]  # epoch 1 never saved
    assert torch.isfinite(checkpoint.best_model_score)


def test_monitored_scope_ignores_unmonitored_diagnostics(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val/score")
    _trainer(tmp_path, NonFiniteGuard(metrics="monitored"), checkpoint, epochs=1).fit(
        Regression(nan_step=-1), _loader(), _loader())  # val/diagnostic is NaN, val/score is not
    with pytest.raises(NonFiniteTrainingError, match="val/diagnostic = nan"):
        _trainer(tmp_path, NonFiniteGuard(), epochs=1).fit(Regression(nan_step=-1), _loader(), _loader())


def test_a_checkpoint_of_non_finite_weights_is_not_written(tmp_path: Path) -> None:
    model = Regression()
    trainer = _trainer(tmp_path, NonFiniteGuard(), epochs=1)
    trainer.fit(model, _loader())
    with torch.no_grad():
        model.net.bias.fill_(float("nan"))
    with pytest.raises(NonFiniteTrainingError, match=r"the weights net\.bias are not finite"):
        trainer.save_checkpoint(tmp_path / "nan.ckpt")
    assert not (tmp_path / "nan.ckpt").exists()


def test_a_non_finite_best_score_is_never_reported_as_best(tmp_path: Path) -> None:
    checkpoint = ModelCheckpoint(monitor="val/nll")
    checkpoint.best_model_path = str(tmp_path / "best.ckpt")
    checkpoint.best_model_score = torch.tensor(float("nan"))
    with pytest.raises(NonFiniteTrainingError, match="val/nll = nan: it is not reported as best"):
        refuse_non_finite_best(checkpoint)
    checkpoint.best_model_score = torch.tensor(0.3)
    refuse_non_finite_best(checkpoint)


def test_the_command_stops_a_diverging_recipe_with_the_cause(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", "tabular/lometab_churn", "--model.init_args.lr=1e6",
              "--data.init_args.max_rows=600", "--trainer.max_epochs=3",
              f"--trainer.default_root_dir={tmp_path}",
              "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"])
    message = str(stop.value.code)
    assert message.startswith("ripieno: error: the training loss is nan at global step")
    assert "(epoch 0," in message and "the optimizer's is 1e+06" in message
    assert "test metrics of best checkpoint" not in capsys.readouterr().out
    for path in tmp_path.rglob("*.ckpt"):  # none, or only finite ones
        state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_under_ddp_every_rank_stops_when_one_sees_nan(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(HERE), str(tmp_path)], capture_output=True, text=True,
                          timeout=300, cwd=HERE.parent)
    output = done.stdout + done.stderr
    assert done.returncode != 0  # it returned: no rank was left waiting in a collective
    # the spawner reports the first rank to fail: rank 1 with its own value, or rank 0 told by the reduce
    # (rank 0's message says "by": it learns of the NaN from the reduce, not at the step it happened)
    found = r"the training loss (is nan at|is not finite on another process by) global step 2 \(epoch 1"
    assert re.search(found, output)
    assert [p.name for p in tmp_path.rglob("*.ckpt")] == ["epoch=0-step=2.ckpt"]  # the epoch before the NaN


def _ddp_run(root: str) -> None:
    """Two ``ddp_spawn`` ranks; only rank 1's loss turns NaN at step 2. Neither may hang."""
    from helpers.ddp import DestroyGlooAtExit

    trainer = _trainer(Path(root), NonFiniteGuard(), DestroyGlooAtExit(), devices=2, strategy="ddp_spawn")
    trainer.fit(Regression(nan_step=2, nan_rank=1), _loader(), _loader())


if __name__ == "__main__":
    _ddp_run(sys.argv[1])


def test_a_deferred_check_reads_once_per_interval_and_names_the_first_bad_step(tmp_path: Path) -> None:
    """As on an accelerator: the loss check waits on the device, the NaN step's gradients are zeroed."""
    from ripieno.framework.host_syncs import HostSyncCounter

    model = Regression(nan_step=5)  # 4 batches an epoch: step 5 is epoch 1, batch 1
    guard = NonFiniteGuard(check_every_n_steps=50, metrics="monitored", check_checkpoints=False)
    with HostSyncCounter(only_from=[HERE.parents[1] / "callbacks"]) as syncs:
        with pytest.raises(NonFiniteTrainingError, match=r"the training loss is nan at global step 5"
                           r" \(epoch 1, batch 1\); that step and the ones after it updated with zero"
                           r" gradients"):
            _trainer(tmp_path, guard, limit_val_batches=0).fit(model, _loader())
    # read at the end of epoch 0 (the step) and of epoch 1 (the step and the value): not at every step
    assert [s.call for s in syncs.calls] == ["Tensor.item", "Tensor.item", "Tensor.item"]
    assert torch.isfinite(model.net.weight).all()
    # plain SGD: step 5's zeroed NaN gradients left the weights as it found them; steps 6 and 7 trained
    assert torch.equal(model.weights_seen[5], model.weights_seen[6])
    assert not torch.equal(model.weights_seen[6], model.weights_seen[7])


def test_auto_reads_every_step_on_cpu_and_a_bad_interval_is_one_line() -> None:
    with pytest.raises(ValueError, match="check_every_n_steps must be 'auto' or an int >= 1, got 0"):
        NonFiniteGuard(check_every_n_steps=0)
    guard = NonFiniteGuard()
    assert guard._every(L.Trainer(accelerator="cpu", logger=False)) == 1
