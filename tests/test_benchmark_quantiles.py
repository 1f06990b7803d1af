"""``ripieno benchmark``'s quantile models and quantile score: XGBoost / LightGBM quantile objectives, CQR."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm

from ripieno.framework.benchmark.config import load_benchmark
from ripieno.framework.benchmark.models import ModelSpec, fit_and_score
from ripieno.framework.benchmark.uncertainty import (
    SCORE_LEVELS,
    ConformalSettings,
    calibration_splits,
    distribution_quantiles,
    distribution_scores,
    quantile_score,
)
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.methods.gbdt import QuantileBoosting
from ripieno.framework.specs.table_splits import TableSplits
from ripieno.framework.uq.conformal import SplitConformal

LEVELS = list(SCORE_LEVELS)


def _pinball(y: np.ndarray, q: np.ndarray, level: float) -> float:
    """The pinball loss by its definition: ``max(tau (y - q), (tau - 1) (y - q))``, averaged."""
    return float(np.maximum(level * (y - q), (level - 1) * (y - q)).mean())


def _table(n: int = 600, task: str = "regression", seed: int = 0) -> TableSplits:
    """Heteroscedastic rows: ``y = x + |x| * noise``, split 60 / 20 / 20."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"x": rng.normal(size=n), "z": rng.normal(size=n)})
    y = frame["x"].to_numpy() + (0.2 + np.abs(frame["x"].to_numpy())) * rng.normal(size=n)
    if task != "regression":
        y = (y > 0).astype(int)
    order = rng.permutation(n)
    parts = {"train": order[: int(0.6 * n)], "val": order[int(0.6 * n): int(0.8 * n)],
             "test": order[int(0.8 * n):]}
    return TableSplits(
        task=task,
        features={s: frame.iloc[r].reset_index(drop=True) for s, r in parts.items()},
        targets={s: y[r] for s, r in parts.items()},
        class_names=[] if task == "regression" else ["no", "yes"],
        name="synthetic",
    )


def test_the_quantile_score_is_twice_the_mean_pinball_loss_at_the_nineteen_levels():
    rng = np.random.default_rng(0)
    y, quantiles = rng.normal(size=40), np.sort(rng.normal(size=(40, 19)), axis=1)
    expected = 2 * np.mean([_pinball(y, quantiles[:, i], level) for i, level in enumerate(SCORE_LEVELS)])
    assert quantile_score(y, SCORE_LEVELS, quantiles) == pytest.approx(expected, rel=1e-12)
    # extra levels are ignored: the score is taken at the same 19 levels for every model
    wider = (0.01, *SCORE_LEVELS, 0.99)
    padded = np.column_stack([quantiles[:, 0] - 1, quantiles, quantiles[:, -1] + 1])
    assert quantile_score(y, wider, padded) == pytest.approx(expected, rel=1e-12)


def test_a_gaussians_and_a_mixtures_quantiles_invert_their_cdf():
    mean, sd = np.array([0.5, -2.0]), np.array([1.5, 0.2])
    assert np.allclose(distribution_quantiles(mean, sd**2, SCORE_LEVELS),
                       norm.ppf(SCORE_LEVELS, mean[:, None], sd[:, None]), atol=1e-12)
    means, sds = np.array([[-1.0, 0.5, 4.0], [0.0, 0.0, 0.1]]), np.array([[0.5, 1.0, 0.8], [1.0, 2.0, 0.5]])
    found = distribution_quantiles(means, sds**2, SCORE_LEVELS)
    cdf = norm.cdf(found[:, None, :], means[:, :, None], sds[:, :, None]).mean(1)
    assert np.allclose(cdf, np.asarray(SCORE_LEVELS)[None, :], atol=1e-9)


def test_the_quantile_score_over_a_fine_grid_is_the_closed_form_crps():
    """CRPS = 2 * integral_0^1 pinball_tau d tau: a midpoint sum over 4,000 levels is within 1e-3."""
    rng = np.random.default_rng(1)
    y = rng.normal(size=30)
    means, variances = rng.normal(size=(30, 4)), rng.uniform(0.2, 2.0, size=(30, 4))
    fine = tuple((np.arange(4000) + 0.5) / 4000)
    for mean, variance in ((means[:, 0], variances[:, 0]), (means, variances)):
        quantiles = distribution_quantiles(mean, variance, fine)
        riemann = 2 * np.mean([_pinball(y, quantiles[:, i], level) for i, level in enumerate(fine)])
        assert riemann == pytest.approx(distribution_scores(y, mean, variance)["crps"], rel=1e-3)


def test_a_gaussians_quantile_score_is_taken_at_its_own_quantiles():
    rng = np.random.default_rng(2)
    y, mean, sd = rng.normal(size=50), rng.normal(size=50), rng.uniform(0.5, 2.0, size=50)
    quantiles = norm.ppf(SCORE_LEVELS, mean[:, None], sd[:, None])
    expected = 2 * np.mean([_pinball(y, quantiles[:, i], level) for i, level in enumerate(SCORE_LEVELS)])
    scored = distribution_scores(y, mean, sd**2)
    assert scored["qs"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("kind", ["xgboost", "lightgbm"])
def test_a_quantile_gbdt_predicts_its_median_and_is_scored_by_quantiles_and_cqr(kind):
    pytest.importorskip(kind)
    data = calibration_splits(_table(), ConformalSettings())
    spec = ModelSpec(kind, kind, {"n_estimators": 60, "quantile_levels": LEVELS})
    result = fit_and_score(spec, data, 0, conformal=ConformalSettings())
    assert {"rmse", "qs", "abs_width", "cqr_coverage", "cqr_width", "cqr_winkler"} <= set(result.test)
    assert "nll" not in result.test and "crps" not in result.test and "norm_width" not in result.test
    from ripieno.framework.methods.gbdt import fit_lightgbm, fit_xgboost

    model, _, _, prepare = {"xgboost": fit_xgboost, "lightgbm": fit_lightgbm}[kind](
        data, dict(spec.params), 0)
    assert isinstance(model, QuantileBoosting)
    levels, q_test = model.predictive_quantiles(prepare(data.features["test"]))
    assert levels == SCORE_LEVELS and q_test.shape == (len(data.targets["test"]), 19)
    assert np.all(np.diff(q_test, axis=1) >= 0)  # sorted: never crossing
    y_test = data.targets["test"]
    assert result.test["rmse"] == pytest.approx(np.sqrt(np.mean((q_test[:, 9] - y_test) ** 2)), rel=1e-9)
    assert result.test["qs"] == pytest.approx(quantile_score(y_test, levels, q_test), rel=1e-12)
    # quantile regression: on its own training rows about tau of the targets lie below the tau quantile
    _, q_train = model.predictive_quantiles(prepare(data.features["train"]))
    below = (data.targets["train"][:, None] <= q_train).mean(0)
    assert np.abs(below - np.asarray(SCORE_LEVELS)).max() < 0.12
    # CQR: SplitConformal("cqr") on the 5% and 95% quantiles of the calibration rows
    _, q_cal = model.predictive_quantiles(prepare(data.features["cal"]))
    fitted = SplitConformal("cqr", 0.1).calibrate((q_cal[:, 0], q_cal[:, -1]), data.targets["cal"])
    lower, upper = (t.numpy() for t in fitted.predict_intervals((q_test[:, 0], q_test[:, -1])))
    covered = ((y_test >= lower) & (y_test <= upper)).mean()
    assert result.test["cqr_coverage"] == pytest.approx(covered)
    assert result.test["cqr_width"] == pytest.approx((upper - lower).mean(), rel=1e-9)


def test_quantile_levels_on_a_classification_table_stop_the_cell_in_one_line():
    pytest.importorskip("xgboost")
    data = _table(task="binary")
    with pytest.raises(RipienoInputError, match=r"for regression tables; synthetic table is binary") as error:
        fit_and_score(ModelSpec("q", "xgboost", {"n_estimators": 5, "quantile_levels": LEVELS}), data, 0)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("model", "expected"), [
    ({"kind": "xgboost", "params": {"quantile_levels": [0.1, 0.5, 0.9]}}, "quantile_levels lacks 0.05"),
    ({"kind": "lightgbm", "params": {"quantile_levels": [*LEVELS, 1.0]}}, "strictly between 0 and 1"),
    ({"kind": "lightgbm", "params": {"quantile_levels": "0.5"}}, "must be a list of numbers in (0, 1)"),
    ({"kind": "catboost", "params": {"quantile_levels": LEVELS}}, "'quantile_levels' is not an argument"),
    ({"kind": "xgboost", "space": {"quantile_levels": {"type": "categorical", "choices": [0.5]}}},
     "not a tuned value"),
])
def test_bad_quantile_levels_are_one_line_before_any_model_trains(tiny_benchmark, model, expected):
    with pytest.raises(RipienoInputError) as stopped:  # BenchmarkConfigError, or check_params' own
        load_benchmark(tiny_benchmark(models={"q": model}))
    assert expected in str(stopped.value) and "\n" not in str(stopped.value)


def test_the_shipped_distributional_protocol_gives_every_model_a_predictive():
    config = load_benchmark("benchmarks/tabular_cpu_distributional")
    cpu = load_benchmark("benchmarks/tabular_cpu")
    from ripieno.datamodules.tabular_sources import SOURCES

    # the default protocol's regression tables, rows, seeds and calibration: only the models' heads differ
    regression = [d.name for d in cpu.datasets if SOURCES[d.name].task == "regression"]
    assert [d.name for d in config.datasets] == regression and len(regression) == 10
    assert (config.data, config.seeds, config.conformal) == (cpu.data, cpu.seeds, cpu.conformal)
    assert len(config.models) == 8
    for spec in config.models:
        if spec.kind == "ensemble":
            assert spec.params["regression_head"] == "gaussian"
        elif spec.kind == "catboost":
            assert spec.params["loss_function"] == "RMSEWithUncertainty"
        else:
            assert tuple(spec.params["quantile_levels"]) == SCORE_LEVELS
