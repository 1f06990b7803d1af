"""``ripieno benchmark``'s uncertainty scores: calibration, conformal sets and intervals, distributions."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import norm
from sklearn.metrics import brier_score_loss

from ripieno.framework.benchmark import cells
from ripieno.framework.benchmark.config import BenchmarkConfigError, load_benchmark
from ripieno.framework.benchmark.models import ModelSpec, fit_and_score, scores
from ripieno.framework.benchmark.report import (
    coverage_figure,
    metric_ranks,
    uncertainty_markdown,
    uncertainty_means,
)
from ripieno.framework.benchmark.uncertainty import (
    ConformalSettings,
    calibration_scores,
    calibration_splits,
    distribution_scores,
)
from ripieno.framework.cli.main import main
from ripieno.framework.runner.fingerprints import first_difference
from ripieno.framework.specs.table_splits import TableSplits


def _table(n: int = 300, task: str = "binary", seed: int = 0) -> TableSplits:
    """A table whose ``uid`` column names each row, split 60 / 20 / 20."""
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"uid": np.arange(n), "x": rng.normal(size=n)})
    y = (frame["x"] + 0.5 * rng.normal(size=n) > 0).astype(int).to_numpy()
    if task == "regression":
        y = frame["x"].to_numpy() + 0.3 * rng.normal(size=n)
    order = rng.permutation(n)
    cut = [int(0.6 * n), int(0.8 * n)]
    parts = {"train": order[: cut[0]], "val": order[cut[0]: cut[1]], "test": order[cut[1]:]}
    return TableSplits(
        task=task,
        features={s: frame.iloc[r].reset_index(drop=True) for s, r in parts.items()},
        targets={s: y[r] for s, r in parts.items()},
        class_names=["no", "yes"] if task != "regression" else [],
        name="synthetic",
    )


def test_ece_and_brier_match_a_hand_computation_and_scikit_learn():
    proba = np.array([[0.92, 0.05, 0.03], [0.90, 0.06, 0.04], [0.25, 0.55, 0.20], [0.40, 0.35, 0.25],
                      [0.10, 0.20, 0.70]])
    y = np.array([0, 1, 1, 2, 2])
    # confidence bins of width 1/15: 0.92 and 0.90 share bin 13 (accuracy 1/2, confidence 0.91);
    # 0.55 (right), 0.40 (wrong) and 0.70 (right) are alone in theirs
    ece = 2 / 5 * abs(0.5 - 0.91) + 1 / 5 * (1 - 0.55) + 1 / 5 * 0.40 + 1 / 5 * (1 - 0.70)
    onehot = np.eye(3)[y]
    brier = ((proba - onehot) ** 2).sum(1).mean()
    found = calibration_scores(y, proba)
    assert found["ece"] == pytest.approx(ece, abs=1e-6) and ece == pytest.approx(0.394)
    assert found["brier"] == pytest.approx(brier, abs=1e-6)
    assert found["brier"] == pytest.approx(brier_score_loss(y, proba, labels=[0, 1, 2]), abs=1e-6)
    assert {k: scores("multiclass", y, proba, 3)[k] for k in ("ece", "brier")} == pytest.approx(found)
    binary = np.array([[0.8, 0.2], [0.3, 0.7], [0.6, 0.4], [0.1, 0.9]])
    labels = np.array([0, 1, 1, 1])
    found = scores("binary", labels, binary, 2)["brier"]  # summed over both classes: twice the binary score
    assert found == pytest.approx(2 * brier_score_loss(labels, binary[:, 1]), abs=1e-6)
    assert found == pytest.approx(brier_score_loss(labels, binary[:, 1], scale_by_half=False), abs=1e-6)


def test_gaussian_nll_and_crps_match_their_closed_forms():
    rng = np.random.default_rng(0)
    y, mean, sd = rng.normal(size=50), rng.normal(size=50), rng.uniform(0.3, 2.0, size=50)
    z = (y - mean) / sd
    crps = sd * (z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z) - 1 / math.sqrt(math.pi))
    found = distribution_scores(y, mean, sd**2)
    assert found["nll"] == pytest.approx(-norm.logpdf(y, mean, sd).mean(), rel=1e-5)
    assert found["crps"] == pytest.approx(crps.mean(), rel=1e-5)


def test_a_mixture_of_member_gaussians_is_scored_as_the_mixture():
    """Oracle: the mixture's density, and its CRPS as the integral of (F(x) - 1[x >= y])^2."""
    pytest.importorskip("ripieno.framework.metrics.mixture")
    from scipy.integrate import quad

    means, sds, y = np.array([[-1.0, 0.5, 2.0]]), np.array([[0.5, 1.0, 0.8]]), np.array([0.3])

    def cdf(x: float) -> float:
        return float(norm.cdf(x, means[0], sds[0]).mean())

    crps = quad(lambda x: cdf(x) ** 2, -30, y[0])[0] + quad(lambda x: (1 - cdf(x)) ** 2, y[0], 30)[0]
    found = distribution_scores(y, means, sds**2)
    assert found["nll"] == pytest.approx(-np.log(norm.pdf(y[0], means[0], sds[0]).mean()), rel=1e-5)
    assert found["crps"] == pytest.approx(crps, rel=1e-4)


def test_calibration_rows_are_carved_from_training_rows_only_stratified_and_fixed():
    data = _table()
    carved = calibration_splits(data, ConformalSettings(calibration_size=0.1, seed=3))
    uid = {split: set(frame["uid"]) for split, frame in carved.features.items()}
    assert len(uid["cal"]) == 30  # a tenth of all 300 rows
    assert not uid["cal"] & (uid["train"] | uid["val"] | uid["test"])  # disjoint from every other split
    assert uid["cal"] | uid["train"] == set(data.features["train"]["uid"])  # taken from the training rows
    for split in ("val", "test"):
        assert carved.features[split].equals(data.features[split])
    for split in ("train", "cal"):  # each row keeps its own target
        rows = carved.features[split]["uid"].to_numpy()
        lookup = dict(zip(data.features["train"]["uid"], data.targets["train"], strict=True))
        assert [lookup[r] for r in rows] == carved.targets[split].tolist()
    share = data.targets["train"].mean()
    assert abs(carved.targets["cal"].mean() - share) <= 1 / 30 + 1e-9  # stratified: one row at most off
    again = calibration_splits(data, ConformalSettings(calibration_size=0.1, seed=3))
    assert again.features["cal"].equals(carved.features["cal"])  # the same rows for every model and seed
    assert calibration_splits(data, ConformalSettings(calibrate_on="val")) is data
    with pytest.raises(Exception, match="gives 180 of the 180 training rows"):
        calibration_splits(data, ConformalSettings(calibration_size=0.6))


def test_the_gbdt_fits_on_the_rows_left_and_stops_on_the_validation_rows(monkeypatch):
    import xgboost

    data = calibration_splits(_table(), ConformalSettings())
    seen = {}
    fit = xgboost.XGBClassifier.fit

    def spy(self, x, y, **kwargs):
        seen["train"] = set(x["uid"])
        seen["val"] = set(kwargs["eval_set"][0][0]["uid"])
        return fit(self, x, y, **kwargs)

    monkeypatch.setattr(xgboost.XGBClassifier, "fit", spy)
    spec = ModelSpec("xgb", "xgboost", {"n_estimators": 5})
    result = fit_and_score(spec, data, 0, conformal=ConformalSettings())
    assert seen["train"] == set(data.features["train"]["uid"])
    assert not seen["train"] & set(data.features["cal"]["uid"])
    assert seen["val"] == set(data.features["val"]["uid"])
    assert result.calibration_rows == 30
    assert {"lac_coverage", "lac_set_size", "aps_coverage", "aps_set_size", "ece", "brier"} <= set(
        result.test)
    on_val = fit_and_score(spec, data, 0, conformal=ConformalSettings(calibrate_on="val"))
    assert on_val.calibration_rows == len(data.targets["val"])


def test_catboost_with_rmse_with_uncertainty_scores_its_gaussian_and_others_score_none():
    data = calibration_splits(_table(task="regression"), ConformalSettings())
    gaussian = ModelSpec("cb", "catboost", {"iterations": 30, "loss_function": "RMSEWithUncertainty"})
    result = fit_and_score(gaussian, data, 0, conformal=ConformalSettings())
    assert {"rmse", "nll", "crps", "abs_coverage", "abs_width", "abs_winkler", "norm_coverage", "norm_width",
            "norm_winkler"} <= set(result.test)
    assert math.isfinite(result.test["nll"]) and result.test["crps"] > 0
    plain = fit_and_score(ModelSpec("cb", "catboost", {"iterations": 30}), data, 0,
                          conformal=ConformalSettings())
    assert "nll" not in plain.test and "crps" not in plain.test and "norm_width" not in plain.test
    assert "abs_width" in plain.test  # absolute residuals for every model


@pytest.mark.parametrize(("conformal", "expected"), [
    ({"calibrate": "val"}, "conformal has no key 'calibrate' (did you mean 'calibrate_on'?)"),
    ({"alpha": 1.5}, "conformal.alpha must be a number in (0, 1)"),
    ({"calibration_size": True}, "conformal.calibration_size must be a number in (0, 1)"),
    ({"calibrate_on": "vall"}, "calibrate_on 'vall' is not one of ['train', 'val', 'none'] (did you mean"),
    ({"seed": 1.5}, "conformal.seed must be an integer, got 1.5."),
    ("yes", "conformal must be a mapping with keys"),
])
def test_bad_conformal_settings_are_one_line(tmp_path, conformal, expected, tiny_benchmark):
    with pytest.raises(BenchmarkConfigError) as stopped:
        load_benchmark(tiny_benchmark(conformal=conformal))
    assert expected in str(stopped.value) and "\n" not in str(stopped.value)


def test_calibration_size_is_refused_among_a_data_sets_arguments(tmp_path, tiny_benchmark):
    with pytest.raises(BenchmarkConfigError, match="move it to conformal"):
        load_benchmark(tiny_benchmark(data={"max_rows": 400, "calibration_size": 0.1}))


def test_the_conformal_settings_enter_the_fingerprint_and_none_keeps_the_old_one(tmp_path, tiny_benchmark):
    tables = {"mlc_churn": {"files": {}}, "diamonds": {"files": {}}}
    cell = cells.Cell("default", "mlc_churn", "xgboost", 0)

    def fingerprint(conformal: dict | None) -> dict:
        changes = {} if conformal is None else {"conformal": conformal}
        return cells.cell_fingerprint(load_benchmark(tiny_benchmark(**changes)), cell, tables)

    default = fingerprint(None)
    assert default["conformal"] == {"alpha": 0.1, "calibration_size": 0.1, "calibrate_on": "train", "seed": 0}
    assert first_difference(default, fingerprint({"calibration_size": 0.2})) == (
        "conformal.calibration_size: 0.1 then, 0.2 now")
    assert first_difference(default, fingerprint({"alpha": 0.05})) == "conformal.alpha: 0.1 then, 0.05 now"
    assert fingerprint({"calibrate_on": "val", "calibration_size": 0.3})["conformal"] == {
        "calibrate_on": "val", "alpha": 0.1}  # the carve's settings decide nothing then
    none = fingerprint({"calibrate_on": "none"})
    assert "conformal" not in none  # a store made before conformal scores existed stays current
    assert first_difference(none, default).startswith("conformal: absent then")
    config = load_benchmark(tiny_benchmark())
    names = {cells.tuning_study_name(config, cell, fingerprint(c))
             for c in (None, {"alpha": 0.05}, {"calibrate_on": "train"})}
    assert len(names) == 1  # alpha decides no tuning trial: one study
    assert cells.tuning_study_name(config, cell, fingerprint({"calibration_size": 0.2})) not in names


@pytest.mark.parametrize("calibrate_on", ["train", "none"])
def test_a_cell_from_before_fingerprints_is_adopted_as_fitted_without_a_carve(tmp_path, calibrate_on,
                                                                            tiny_benchmark):
    import optuna

    config = load_benchmark(tiny_benchmark(conformal={"calibrate_on": calibrate_on}))
    tables = {"mlc_churn": {"files": {}}, "diamonds": {"files": {}}}
    fingerprints = {c.key: cells.cell_fingerprint(config, c, tables) for c in cells.wanted_cells(config)}
    study = optuna.create_study()
    key = "default/mlc_churn/xgboost/0"  # an older ripieno's finished cell: no fingerprint recorded
    study.add_trial(optuna.create_trial(state=optuna.trial.TrialState.COMPLETE, value=0.9,
                                        user_attrs={cells.CELL_ATTR: key, "test_accuracy": 0.9}))
    assert cells.adopt_unrecorded(study, fingerprints) == 1
    changed = cells.changed_cells(study, fingerprints)
    if calibrate_on == "none":  # as it was fitted: on every training row
        assert changed == {}
    else:  # it trained on the rows now carved for calibration: changed, not taken as current
        assert changed[key].startswith("conformal: absent then")


@pytest.mark.slow  # three commands (about 15 s); the fingerprint itself is tested above
def test_changed_conformal_settings_refuse_a_rerun_until_refit(tmp_path, tiny_benchmark):
    xgb = {"xgboost": {"kind": "xgboost", "params": {"n_estimators": 20}}}
    out = tmp_path / "out"
    main(["benchmark", "-c", str(tiny_benchmark(datasets=["mlc_churn"], models=xgb,
                                         conformal={"calibrate_on": "none"})), "--out", str(out)])
    before = pd.read_csv(out / "results.csv")
    assert "test_lac_coverage" not in before and "test_ece" in before and before["train_rows"].iloc[0] == 240
    config = tiny_benchmark(datasets=["mlc_churn"], models=xgb)
    with pytest.raises(SystemExit, match=r"first: default/mlc_churn/xgboost/0: conformal: absent then"):
        main(["benchmark", "-c", str(config), "--out", str(out)])
    main(["benchmark", "-c", str(config), "--out", str(out), "--refit_changed"])
    after = pd.read_csv(out / "results.csv")
    assert after["ripieno_refit"].str.startswith("conformal: absent then").all()
    assert (after["train_rows"] + after["calibration_rows"]).tolist() == [240]  # 40 of the 400 rows carved


def test_a_gbdt_and_an_ensemble_cell_both_record_the_new_columns(tmp_path, tiny_benchmark):
    out = tmp_path / "out"
    main(["benchmark", "-c", str(tiny_benchmark()), "--out", str(out)])
    results = pd.read_csv(out / "results.csv").set_index(["dataset", "model"])
    classification = ["test_ece", "test_brier", "test_nll", "test_lac_coverage", "test_lac_set_size",
                      "test_aps_coverage", "test_aps_set_size"]
    regression = ["test_abs_coverage", "test_abs_width", "test_abs_winkler"]
    for model in ("lometab", "xgboost"):
        assert results.loc[("mlc_churn", model), classification].notna().all()
        assert results.loc[("diamonds", model), regression].notna().all()
        assert results.loc[("diamonds", model), "test_rmse"] > 0
    assert results.loc[("diamonds", "lometab"), ["test_norm_coverage", "test_norm_width"]].notna().all()
    assert pd.isna(results.loc[("diamonds", "xgboost"), "test_norm_width"])  # no spread, no distribution
    assert "test_crps" not in results  # no model here has a predictive distribution
    assert (results["calibrate_on"] == "train").all() and (results["alpha"] == 0.1).all()
    sizes = results.loc["mlc_churn", "test_lac_set_size"]
    assert sizes.between(0, 2).all()
    report = (out / "report.md").read_text()
    assert "## Uncertainty" in report and "ECE rank (1)" in report and "coverage rank" not in report
    assert (out / "coverage.png").read_bytes()[:4] == b"\x89PNG"


def _results(rows):
    return pd.DataFrame([
        {"dataset": d, "model": m, "kind": "ensemble", "task": t, "seed": s, "test_rows": 100,
         **{f"test_{k}": v for k, v in values.items()}, "alpha": 0.1}
        for d, t, models in rows for m, values in models.items() for s in (0, 1)])


def test_uncertainty_ranks_are_lower_is_better_per_metric_and_coverage_is_shown_not_ranked(tmp_path):
    results = _results([
        ("a", "binary", {"p": {"ece": 0.1, "lac_coverage": 0.95, "lac_set_size": 1.2},
                         "q": {"ece": 0.3, "lac_coverage": 0.90, "lac_set_size": 1.1},
                         "r": {"ece": 0.2, "lac_coverage": 0.89, "lac_set_size": 1.1}}),
        ("b", "binary", {"p": {"ece": 0.2, "lac_coverage": 0.91, "lac_set_size": 1.5},
                         "q": {"ece": 0.1, "lac_coverage": 0.92, "lac_set_size": 1.4},
                         "r": {"ece": 0.3, "lac_coverage": 0.90, "lac_set_size": 1.3}}),
        ("c", "regression", {"p": {"rmse": 1.0, "abs_width": 3.0, "norm_width": 2.0},
                             "q": {"rmse": 2.0, "abs_width": 4.0, "norm_width": 1.0},
                             "r": {"rmse": 3.0, "abs_width": 5.0}}),
    ])
    means = uncertainty_means(results)
    ece = metric_ranks(means, "classification", "ece")
    assert ece.loc["a"].tolist() == [1.0, 3.0, 2.0] and ece.loc["b"].tolist() == [2.0, 1.0, 3.0]
    assert metric_ranks(means, "classification", "lac_set_size").loc["a"].tolist() == [3.0, 1.5, 1.5]
    norm = metric_ranks(means, "regression", "norm_width")  # only the models that have the metric
    assert list(norm.columns) == ["p", "q"] and norm.loc["c"].tolist() == [2.0, 1.0]
    text = "\n".join(uncertainty_markdown(results))
    assert "| p | 1.50 | 0.930 | 3.00 |" in text  # ECE rank, mean LAC coverage (not ranked), set size rank
    assert "coverage rank" not in text and "norm width rank (1)" in text
    figure = coverage_figure(results, tmp_path / "coverage.png")
    assert figure is not None and figure.read_bytes()[:4] == b"\x89PNG"
    assert not list(tmp_path.glob("*.tmp*"))  # written atomically: no temporary file left
    plain = results.drop(columns=[c for c in results if "coverage" in c or "width" in c or "size" in c])
    assert coverage_figure(plain, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()


def test_the_predictive_distribution_hook_is_used_only_where_it_gives_one():
    from ripieno.framework.benchmark.models import _distribution

    class Gaussian:
        def predictive_distribution(self, x):
            return np.zeros(len(x)), np.ones(len(x))

    class PointHead:  # its estimator class has the method, this fit has no distribution
        def predictive_distribution(self, x):
            return None

    rows = pd.DataFrame({"x": [0.0, 1.0]})
    assert _distribution(Gaussian(), "regression", rows)[1].tolist() == [1.0, 1.0]
    assert _distribution(Gaussian(), "binary", rows) is None  # classification scores its probabilities
    assert _distribution(PointHead(), "regression", rows) is None
    assert _distribution(object(), "regression", rows) is None


def test_an_ensemble_with_a_gaussian_head_is_scored_as_its_members_mixture():
    from ripieno.framework.benchmark.models import _distribution
    from ripieno.framework.methods.estimators import EnsembleRegressor

    rng = np.random.default_rng(0)
    x = pd.DataFrame({"a": rng.normal(size=120), "b": rng.normal(size=120)})
    y = x["a"].to_numpy() + 0.1 * rng.normal(size=120)
    params = {"k": 3, "d_block": 8, "n_blocks": 1, "max_epochs": 3, "random_state": 0}
    gaussian = EnsembleRegressor(**params, regression_head="gaussian").fit(x, y)
    mean, variance = _distribution(gaussian, "regression", x)
    members = gaussian.predict_distribution(x)
    assert mean.shape == (120, 3) and np.array_equal(variance, members["member_variance"])
    assert _distribution(EnsembleRegressor(**params).fit(x, y), "regression", x) is None  # a point head
