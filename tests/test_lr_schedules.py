"""Learning-rate schedules from recipes keep the module's parameter groups (issue 20, item 5).

Oracles: transformers' warm-up schedules (closed forms), torch's own schedulers stepped by hand,
and the weight decay each parameter group asked for.
"""

from __future__ import annotations

import lightning as L
import pandas as pd
import pytest
import torch
import yaml
from lightning.pytorch.cli import ReduceLROnPlateau
from transformers import (
    get_cosine_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_linear_schedule_with_warmup,
)

from ripieno.framework import TabularEnsembleModule
from ripieno.framework.cli import main
from ripieno.framework.methods.schedules import ScheduleError, WarmupCosineLR, WarmupLinearLR
from ripieno.framework.runner.optimizer_config import (
    OptimizerConfigError,
    attach_optimizer_config,
    scheduler_interval,
)

SMALL = ["--data.init_args.max_rows=300", "--data.init_args.loader.batch_size=32", "--model.init_args.k=2",
         "--model.init_args.d_block=16", "--trainer.max_epochs=2", "--trainer.log_every_n_steps=1",
         "--test_after_fit=false", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false"]
LR_MONITOR = ["--trainer.callbacks+=LearningRateMonitor", "--trainer.callbacks.logging_interval=step"]


def _rates(scheduler: torch.optim.lr_scheduler.LRScheduler, steps: int) -> list[float]:
    """Each group's learning rate before each of ``steps`` optimizer steps (step-major, flat)."""
    rates = []
    for _ in range(steps):
        rates += scheduler.get_last_lr()
        scheduler.optimizer.step()
        scheduler.step()
    return rates


def _optimizer(lrs: tuple[float, ...] = (1e-3, 3e-5)) -> torch.optim.Optimizer:
    return torch.optim.AdamW([{"params": [torch.zeros(1, requires_grad=True)], "lr": lr} for lr in lrs])


# ------------------------------------------------------------------ closed forms against transformers
@pytest.mark.parametrize(("warmup", "total"), [(0, 10), (3, 12), (5, 5), (8, 4), (1, 1)])
def test_warmup_schedules_equal_transformers_step_by_step(warmup, total):
    steps = total + 4  # past the end too
    cases = [
        (WarmupCosineLR(_optimizer(), warmup, total),
         get_cosine_schedule_with_warmup(_optimizer(), warmup, total)),
        (WarmupCosineLR(_optimizer(), warmup, total, min_lr_ratio=0.1),
         get_cosine_with_min_lr_schedule_with_warmup(_optimizer(), warmup, total, min_lr_rate=0.1)),
        (WarmupLinearLR(_optimizer(), warmup, total),
         get_linear_schedule_with_warmup(_optimizer(), warmup, total)),
    ]
    for ours, oracle in cases:
        assert _rates(ours, steps) == pytest.approx(_rates(oracle, steps), rel=1e-12, abs=1e-15)


def test_warmup_linear_min_lr_ratio_is_the_affine_floor_of_the_linear_schedule():
    ours = _rates(WarmupLinearLR(_optimizer((1.0,)), 2, 10, min_lr_ratio=0.2), 14)
    oracle = _rates(get_linear_schedule_with_warmup(_optimizer((1.0,)), 2, 10), 14)
    expected = [f if s < 2 else 0.2 + 0.8 * f for s, f in enumerate(oracle)]
    assert ours == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_warmup_schedules_refuse_what_cannot_make_a_schedule():
    for kwargs in ({"warmup_steps": 2}, {"warmup_steps": -1, "total_steps": 5},
                   {"warmup_steps": 1, "total_steps": 5, "min_lr_ratio": 1.5}):
        with pytest.raises(ScheduleError) as error:
            WarmupCosineLR(_optimizer(), **kwargs)
        assert "\n" not in str(error.value)


def test_the_interval_follows_the_schedule_unless_given():
    sched = torch.optim.lr_scheduler
    assert scheduler_interval(WarmupCosineLR) == scheduler_interval(WarmupLinearLR) == "step"
    assert scheduler_interval(sched.OneCycleLR) == scheduler_interval(sched.CyclicLR) == "step"
    assert scheduler_interval(sched.StepLR) == scheduler_interval(sched.CosineAnnealingLR) == "epoch"
    assert scheduler_interval(sched.StepLR, "step") == "step"
    assert scheduler_interval(WarmupCosineLR, "epoch") == "epoch"


# --------------------------------------------------------------------------- modules, without a run
class _Net(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 2)


class _Grouped(_Net):
    def optimizer_parameters(self) -> list[dict]:
        return [{"params": [self.layer.weight], "weight_decay": 0.25},
                {"params": [self.layer.bias], "weight_decay": 0.0}]

    def configure_optimizers(self):
        return torch.optim.AdamW(self.optimizer_parameters(), lr=0.01)


class _TwoOptimizers(_Net):
    def configure_optimizers(self):
        return [torch.optim.SGD([self.layer.weight], lr=0.1), torch.optim.SGD([self.layer.bias], lr=0.1)]


class _Scheduled(_Net):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1)]


class _ScheduledDict(_Net):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1)}


class _OwnOptimizer(_Net):
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


STEP_LR = {"class_path": "torch.optim.lr_scheduler.StepLR", "init_args": {"step_size": 1}}
SGD = {"class_path": "torch.optim.SGD", "init_args": {"lr": 0.5, "weight_decay": 0.9}}


def test_a_schedule_alone_joins_the_modules_own_optimizer_and_groups():
    module = _Grouped()
    attach_optimizer_config(module, None, STEP_LR)
    out = module.configure_optimizers()
    assert [g["weight_decay"] for g in out["optimizer"].param_groups] == [0.25, 0.0]
    assert out["lr_scheduler"]["interval"] == "epoch"
    assert out["lr_scheduler"]["scheduler"].optimizer is out["optimizer"]


def test_an_optimizer_from_the_config_is_built_over_the_modules_groups():
    module = _Grouped()
    attach_optimizer_config(module, SGD, STEP_LR)
    optimizer = module.configure_optimizers()["optimizer"]
    assert isinstance(optimizer, torch.optim.SGD)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.25, 0.0]  # the groups' own values win
    assert [g["lr"] for g in optimizer.param_groups] == [0.5, 0.5]  # the optimizer's default fills the rest


def test_reduce_on_plateau_watches_its_monitor():
    module = _OwnOptimizer()
    plateau = {"class_path": "lightning.pytorch.cli.ReduceLROnPlateau", "init_args": {"monitor": "val/nll"}}
    attach_optimizer_config(module, None, plateau)
    config = module.configure_optimizers()["lr_scheduler"]
    assert isinstance(config["scheduler"], ReduceLROnPlateau) and config["monitor"] == "val/nll"


class _Logging(_OwnOptimizer):
    def logged_metric_names(self, stage: str) -> set[str]:
        return {f"{stage}/loss", f"{stage}/nll"}


def test_a_plateau_monitor_the_module_never_logs_stops_in_one_line():
    plateau = {"class_path": "lightning.pytorch.cli.ReduceLROnPlateau", "init_args": {"monitor": "val/rmse"}}
    with pytest.raises(OptimizerConfigError, match="it logs val/loss, val/nll") as error:
        attach_optimizer_config(_Logging(), None, plateau)
    assert "\n" not in str(error.value)
    attach_optimizer_config(_Logging(), None, {**plateau, "init_args": {"monitor": "val/nll"}})


@pytest.mark.parametrize(("module", "optimizer", "words"), [
    (_TwoOptimizers(), None, "returns 2 optimizers"),
    (_Scheduled(), None, "already returns a learning-rate scheduler"),
    (_ScheduledDict(), None, "already returns a learning-rate scheduler"),
    pytest.param(_Net(), None, "returns no optimizer",
                 marks=pytest.mark.filterwarnings("ignore:`configure_optimizers` must be implemented")),
    (_OwnOptimizer(), SGD, "has no optimizer_parameters()"),
])
def test_what_cannot_take_the_configs_schedule_stops_in_one_line(module, optimizer, words):
    with pytest.raises(OptimizerConfigError) as error:
        attach_optimizer_config(module, optimizer, STEP_LR)
    assert words in str(error.value) and "\n" not in str(error.value)


# ----------------------------------------------------------------------------- runs through the CLI
def _logged_rates(root) -> pd.DataFrame:
    """Per-step learning rates LearningRateMonitor wrote to metrics.csv (one column per group)."""
    (metrics,) = root.rglob("metrics.csv")
    frame = pd.read_csv(metrics)
    columns = [c for c in frame.columns if c.startswith("lr-")]
    return frame.dropna(subset=columns).set_index("step")[columns]


def _last_checkpoint(root) -> dict:
    (path,) = root.rglob("last.ckpt")
    return torch.load(path, weights_only=True)


def test_the_warmup_cosine_recipe_logs_the_closed_form_with_its_groups_intact(tmp_path):
    main(["fit", "-c", "tabular/tabm_churn_warmup_cosine", *SMALL, f"--trainer.default_root_dir={tmp_path}",
          "--lr_scheduler.init_args.warmup_steps=3", "--lr_scheduler.init_args.min_lr_ratio=0.1"])
    rates = _logged_rates(tmp_path)
    checkpoint = _last_checkpoint(tmp_path)
    total = checkpoint["lr_schedulers"][0]["total_steps"]
    assert total == checkpoint["global_step"] == len(rates) > 3  # filled in: the run's optimizer steps
    oracle = get_cosine_with_min_lr_schedule_with_warmup(_optimizer((0.002,)), 3, total, min_lr_rate=0.1)
    expected = _rates(oracle, total)
    assert list(rates.columns) == ["lr-AdamW/pg1", "lr-AdamW/pg2"]
    for column in rates.columns:
        assert rates[column].tolist() == pytest.approx(expected, rel=1e-6, abs=1e-12)
    groups = checkpoint["optimizer_states"][0]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.0003, 0.0]  # no decay on biases and adapters
    assert all(g["params"] for g in groups)


def test_a_schedule_alone_on_the_command_line_fills_total_steps_and_steps_per_batch(tmp_path):
    main(["fit", "-c", "tabular/lometab_churn", *SMALL, *LR_MONITOR, f"--trainer.default_root_dir={tmp_path}",
          "--lr_scheduler=torch.optim.lr_scheduler.OneCycleLR", "--lr_scheduler.max_lr=0.01"])
    rates = _logged_rates(tmp_path)
    checkpoint = _last_checkpoint(tmp_path)
    total = checkpoint["global_step"]
    assert checkpoint["lr_schedulers"][0]["total_steps"] == total == len(rates)
    oracle = torch.optim.lr_scheduler.OneCycleLR(_optimizer((0.002,)), max_lr=0.01, total_steps=total)
    expected = _rates(oracle, total)
    for column in rates.columns:
        assert rates[column].tolist() == pytest.approx(expected, rel=1e-6)
    assert [g["weight_decay"] for g in checkpoint["optimizer_states"][0]["param_groups"]] == [0.0003, 0.0]


def test_optimizer_and_schedule_from_the_command_line_keep_the_groups(tmp_path):
    main(["fit", "-c", "tabular/lometab_churn", *SMALL, *LR_MONITOR, f"--trainer.default_root_dir={tmp_path}",
          "--optimizer=torch.optim.SGD", "--optimizer.lr=0.05", "--optimizer.weight_decay=0.5",
          "--lr_scheduler=torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size=2",
          "--lr_scheduler.gamma=0.5", "--lr_scheduler_interval=step"])
    rates = _logged_rates(tmp_path)
    assert list(rates.columns) == ["lr-SGD/pg1", "lr-SGD/pg2"]
    expected = [0.05 * 0.5 ** (step // 2) for step in rates.index]
    for column in rates.columns:
        assert rates[column].tolist() == pytest.approx(expected, rel=1e-9)
    groups = _last_checkpoint(tmp_path)["optimizer_states"][0]["param_groups"]
    assert [g["weight_decay"] for g in groups] == [0.0003, 0.0]  # the module's groups, not the 0.5 default
    assert all("momentum" in g for g in groups)  # SGD's


def test_the_shipped_schedules_are_found_by_their_short_name(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "-c", "tabular/lometab_churn", "--lr_scheduler=WarmupLinearLR",
              "--lr_scheduler.warmup_steps=5", "--print_config"])
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["lr_scheduler"]["class_path"] == "ripieno.framework.methods.schedules.WarmupLinearLR"
    assert printed["lr_scheduler"]["init_args"]["warmup_steps"] == 5


class ScheduledTabular(TabularEnsembleModule):
    """A MemberModule that brings its own schedule (for the refusal below)."""

    def build_lr_scheduler(self, optimizer):
        return {"scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 1), "interval": "epoch"}


@pytest.mark.parametrize(("args", "words"), [
    (["-c", "tabular/lometab_churn", "--lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau"],
     "use lightning.pytorch.cli.ReduceLROnPlateau with init_args.monitor"),
    (["-c", "tabular/lometab_churn", f"--model={__name__}.ScheduledTabular",
      "--lr_scheduler=torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size=1"],
     "ScheduledTabular.configure_optimizers already returns a learning-rate scheduler"),
    (["-c", "mcover/perceptron_mcover", "--data.init_args.n_inputs=50",
      "--lr_scheduler=torch.optim.lr_scheduler.StepLR", "--lr_scheduler.step_size=1"],
     "optimizes manually"),
])
def test_the_command_refuses_in_one_line_before_training(args, words, tmp_path):
    small = "--data.init_args.max_rows=300" if "tabular" in args[1] else "--seed_everything=0"
    with pytest.raises(SystemExit) as stop:
        main(["fit", *args, small, f"--trainer.default_root_dir={tmp_path}",
              "--trainer.enable_progress_bar=false"])
    message = str(stop.value.code)
    assert message.startswith("ripieno: error: ") and words in message and "\n" not in message
    assert not list(tmp_path.rglob("config.yaml")) and not list(tmp_path.rglob("*.ckpt"))
