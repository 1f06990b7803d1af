"""ConformalPrediction in Lightning runs: calibration rows, test metrics, predict outputs, coverage.

Oracles: the calibration rows are exactly training rows of the same table without them (val and
test unchanged); the callback's logged coverage, set size, width and Winkler score equal split
conformal computed directly (``SplitConformal`` on the module's own predictions of the same
rows, itself tested equal to MAPIE); a checkpoint's thresholds give the predict outputs without the
training table, and refuse other weights; and over 200 random calibration / test splits of rows the
model never saw, the mean coverage lies within split conformal's exact bounds
``[1 - alpha, 1 - alpha + 1 / (n + 1)]`` (given the pool, a random split makes the rows exchangeable),
up to four Monte Carlo standard errors.
"""

from __future__ import annotations

import lightning as L
import pandas as pd
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from ripieno.callbacks import ConformalPrediction, MemberPredictionWriter
from ripieno.datamodules import LoaderSettings, TabularDataModule
from ripieno.framework import TabularEnsembleModule
from ripieno.framework.uq.conformal import SplitConformal, winkler_score

ALPHA = 0.1


def _data(table_csv, task: str, **kwargs) -> TabularDataModule:
    return TabularDataModule(dataset=None, path=table_csv(task, n=400), target="y", n_bins=8, **kwargs,
                             loader=LoaderSettings(batch_size=64))


def _trainer(tmp_path, callbacks, max_epochs: int = 3) -> L.Trainer:
    return L.Trainer(max_epochs=max_epochs, callbacks=callbacks, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=tmp_path, deterministic=True)


def _rows(dataset) -> set[tuple[float, ...]]:
    """The rows' raw numbers (``numeric_transform="none"``: the same values whatever the training rows)."""
    return {tuple(r) for r in dataset.x_num.tolist()}


def _members(model, loader) -> tuple[torch.Tensor, torch.Tensor]:
    model.eval()
    with torch.no_grad():
        parts = [(model.predict_step(b, i)["member_predictions"], b["y"]) for i, b in enumerate(loader)]
    return torch.cat([p[0] for p in parts]).double(), torch.cat([p[1] for p in parts])


def test_calibration_rows_come_from_the_training_rows_only(table_csv):
    plain = _data(table_csv, "multiclass", numeric_transform="none")
    held = _data(table_csv, "multiclass", numeric_transform="none", calibration_size=0.2)
    plain.setup("fit")
    held.setup("fit")
    for split in ("val", "test"):
        assert _rows(held._splits[split]) == _rows(plain._splits[split])
    train, calibration = _rows(held._splits["train"]), _rows(held._splits["calibration"])
    assert len(held._splits["calibration"]) == 80 and not train & calibration
    assert train | calibration == _rows(plain._splits["train"])
    with pytest.raises(ValueError, match="calibration_size"):
        plain.calibration_dataloader()


@pytest.mark.parametrize("task", ["multiclass", "regression"])
def test_logged_metrics_equal_split_conformal_on_the_same_rows(tmp_path, table_csv, task):
    L.seed_everything(0)
    data = _data(table_csv, task, calibration_size=0.25)
    data.setup("fit")
    model = TabularEnsembleModule(data.spec, k=4, d_block=16, n_blocks=1)
    conformal = ConformalPrediction(alpha=ALPHA)
    trainer = _trainer(tmp_path, [conformal])
    trainer.fit(model, datamodule=data)
    logged = trainer.test(model, datamodule=data, verbose=False)[0]

    cal, y_cal = _members(model, data.calibration_dataloader())
    test, y_test = _members(model, data.test_dataloader())
    if task == "regression":
        spread = cal.std(1, correction=0)
        floor = 1e-6 * float(spread.median())
        fitted = SplitConformal("normalized", ALPHA).calibrate((cal.mean(1), spread.clamp_min(floor)), y_cal)
        lower, upper = fitted.predict_intervals((test.mean(1), test.std(1, correction=0).clamp_min(floor)))
        y = y_test.double()
        covered = (lower <= y) & (y <= upper)
        assert logged["conformal/test/coverage"] == pytest.approx(float(covered.double().mean()))
        assert logged["conformal/test/width"] == pytest.approx(float((upper - lower).mean()), rel=1e-5)
        winkler = winkler_score(lower, upper, y, ALPHA)
        assert logged["conformal/test/winkler"] == pytest.approx(winkler, rel=1e-5)
    else:
        fitted = SplitConformal("lac", ALPHA).calibrate(cal.mean(1), y_cal)
        sets = fitted.predict_sets(test.mean(1))
        assert logged["conformal/test/coverage"] == pytest.approx(
            float(sets.gather(1, y_test[:, None]).double().mean()))
        assert logged["conformal/test/set_size"] == pytest.approx(float(sets.sum(1).double().mean()))
    assert conformal.conformal.qhat == pytest.approx(fitted.qhat, rel=1e-6)
    assert conformal.conformal.n_calibration == 100


@pytest.mark.parametrize("task", ["binary", "regression"])
def test_predict_from_a_checkpoint_writes_sets_or_intervals(tmp_path, table_csv, task):
    L.seed_everything(0)
    data = _data(table_csv, task, calibration_size=0.25)
    data.setup("fit")
    model = TabularEnsembleModule(data.spec, k=3, d_block=16, n_blocks=1)
    checkpoint = ModelCheckpoint(dirpath=tmp_path / "ckpt", monitor="val/loss", filename="best")
    trained = ConformalPrediction(alpha=ALPHA)
    _trainer(tmp_path, [trained, checkpoint]).fit(model, datamodule=data)
    saved = torch.load(checkpoint.best_model_path, weights_only=True)["callbacks"]
    (state,) = [v for k, v in saved.items() if k.startswith("ConformalPrediction")]
    assert state["n_calibration"] == 100 and state["thresholds"]

    rows = pd.read_csv(table_csv(task, n=400)).head(30)
    rows.to_csv(tmp_path / "new.csv", index=False)
    new = TabularDataModule(dataset=None, target="y", predict_path=str(tmp_path / "new.csv"),
                            preprocessing_from=checkpoint.best_model_path, calibration_size=0.25)
    out = tmp_path / "predictions"
    fresh = TabularEnsembleModule.load_from_checkpoint(checkpoint.best_model_path, weights_only=True)
    callbacks = [ConformalPrediction(alpha=ALPHA), MemberPredictionWriter(output_dir=str(out))]
    _trainer(tmp_path, callbacks).predict(fresh, datamodule=new, ckpt_path=checkpoint.best_model_path,
                                          weights_only=True)
    table = pd.read_csv(out / "predictions.csv")
    assert len(table) == 30
    threshold = state["thresholds"][0]
    members = fresh.predict_members(rows)
    members = members.double()
    if task == "regression":  # normalized: mean +- q * spread, the spread floored as calibrated
        spread = members.std(1, correction=0).clamp_min(state["spread_floor"])
        center = members.mean(1)
        assert table["lower"].to_numpy() == pytest.approx((center - threshold * spread).numpy(), rel=1e-5)
        assert table["upper"].to_numpy() == pytest.approx((center + threshold * spread).numpy(), rel=1e-5)
        assert (table["lower"] <= table["prediction"]).all() and (table["prediction"] <= table["upper"]).all()
    else:  # LAC: the classes whose probability is at least 1 - q
        names = [c.removeprefix("proba_") for c in table.columns if c.startswith("proba_")]
        kept = members.mean(1) >= 1 - threshold
        expected = ["|".join(n for n, k in zip(names, row, strict=True) if k) for row in kept.tolist()]
        assert table["set"].fillna("").tolist() == expected
        assert table["set_size"].tolist() == kept.sum(1).tolist()

    other = TabularEnsembleModule(data.spec, k=3, d_block=16, n_blocks=1)  # other weights, same shapes
    refused = ConformalPrediction(alpha=ALPHA)
    refused.load_state_dict(state)
    with pytest.raises(RuntimeError, match="calibrated for other weights"):
        _trainer(tmp_path, [refused]).predict(other, datamodule=new)


def test_settings_that_cannot_work_stop_before_training(tmp_path, table_csv):
    data = _data(table_csv, "regression")
    data.setup("fit")
    model = TabularEnsembleModule(data.spec, k=2, d_block=8, n_blocks=1)
    with pytest.raises(ValueError, match="calibration_size"):  # no held-out rows and no explicit val
        _trainer(tmp_path, [ConformalPrediction()]).fit(model, datamodule=data)
    with pytest.raises(ValueError, match="makes class sets"):
        aps = ConformalPrediction(method="aps", calibrate_on="val")
        _trainer(tmp_path, [aps]).fit(model, datamodule=data)
    with pytest.raises(ValueError, match="alpha"):
        ConformalPrediction(alpha=1.5)
    with pytest.raises(ValueError, match="k_reg"):
        ConformalPrediction(method="raps")


def test_mean_coverage_over_random_splits_is_within_the_exact_bounds(tmp_path, table_csv):
    L.seed_everything(0)
    data = _data(table_csv, "multiclass", calibration_size=0.3)
    data.setup("fit")
    model = TabularEnsembleModule(data.spec, k=4, d_block=16, n_blocks=1)
    _trainer(tmp_path, [ConformalPrediction(alpha=ALPHA)]).fit(model, datamodule=data)
    cal, y_cal = _members(model, data.calibration_dataloader())
    test, y_test = _members(model, data.test_dataloader())
    pool, labels = torch.cat([cal, test]), torch.cat([y_cal, y_test])  # rows the model never trained on
    n = 100
    generator = torch.Generator().manual_seed(0)
    coverages = []
    for _ in range(200):
        order = torch.randperm(len(pool), generator=generator)
        first, rest = order[:n], order[n:]
        callback = ConformalPrediction(alpha=ALPHA)
        callback.calibrate_outputs(pool[first], labels[first], "logits")
        sets = callback.conformal.predict_sets(pool[rest].mean(1))
        coverages.append(float(sets.gather(1, labels[rest][:, None]).double().mean()))
    values = torch.tensor(coverages, dtype=torch.float64)
    mean, se = float(values.mean()), float(values.std() / len(values) ** 0.5)
    assert 1 - ALPHA - 4 * se <= mean <= 1 - ALPHA + 1 / (n + 1) + 4 * se


def test_a_quantile_head_gets_conformalised_quantile_regression(tmp_path, table_csv):
    L.seed_everything(0)
    data = _data(table_csv, "regression", calibration_size=0.25)
    data.setup("fit")
    model = TabularEnsembleModule(data.spec, k=3, d_block=16, n_blocks=1, regression_head="quantile")
    conformal = ConformalPrediction(alpha=ALPHA)
    trainer = _trainer(tmp_path, [conformal])
    trainer.fit(model, datamodule=data)
    logged = trainer.test(model, datamodule=data, verbose=False)[0]
    assert conformal.conformal.method == "cqr"

    def bounds(loader):
        model.eval()
        with torch.no_grad():
            parts = [(model.predictive_distribution(b), b["y"]) for b in loader]
        return (torch.cat([p[0]["lower"] for p in parts]), torch.cat([p[0]["upper"] for p in parts]),
                torch.cat([p[1] for p in parts]).double())

    cal_low, cal_high, y_cal = bounds(data.calibration_dataloader())
    low, high, y = bounds(data.test_dataloader())
    fitted = SplitConformal("cqr", ALPHA).calibrate((cal_low, cal_high), y_cal)
    lower, upper = fitted.predict_intervals((low, high))
    assert torch.allclose(conformal.conformal.thresholds, fitted.thresholds)
    covered = ((lower <= y) & (y <= upper)).double().mean()
    assert logged["conformal/test/coverage"] == pytest.approx(float(covered))
    assert logged["conformal/test/width"] == pytest.approx(float((upper - lower).mean()), rel=1e-5)
    with pytest.raises(ValueError, match="no quantile head"):
        plain = TabularEnsembleModule(data.spec, k=2, d_block=8, n_blocks=1)
        _trainer(tmp_path, [ConformalPrediction(method="cqr")]).fit(plain, datamodule=data)
