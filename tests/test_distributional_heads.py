"""Distributional regression heads of TabularEnsembleModule (``regression_head``).

Oracles: numerical integration (scipy ``quad``) of the CRPS and the log of the mixture density
for the closed forms, a Monte Carlo estimate of the CRPS, hand-computed pinball and Gaussian
losses, synthetic data whose noise is known (heteroscedastic variance, interval coverage), and
the default head against one built with ``regression_head="point"`` (bitwise).
"""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import pytest
import torch
from scipy import integrate, stats
from torch.utils.data import DataLoader

from ripieno.framework import TabularEnsembleModule, TabularSpec
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.metrics.mixture import (
    IntervalCoverage,
    MixtureCRPS,
    MixtureNLL,
    QuantileLoss,
    mixture_crps,
    mixture_moments,
    mixture_nll,
)
from ripieno.framework.metrics.uq import gaussian_mixture_crps
from ripieno.framework.nn.distributional_heads import gaussian_nll, pinball_loss, sorted_quantiles
from ripieno.framework.uq.conformal import SplitConformal

MEANS = torch.tensor([[0.0, 1.5, -0.7], [2.0, 2.1, 5.0]])
VARIANCES = torch.tensor([[1.0, 0.25, 2.0], [0.1, 0.3, 1.5]])
TARGETS = torch.tensor([0.4, 3.3])


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models train 20-50x faster on one thread than on two shared with other processes."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _mixture_cdf(mu: np.ndarray, var: np.ndarray, x: float) -> float:
    return float(stats.norm.cdf(x, mu, np.sqrt(var)).mean())


def _quad_crps(mu: np.ndarray, var: np.ndarray, y: float) -> float:
    below = integrate.quad(lambda x: _mixture_cdf(mu, var, x) ** 2, -np.inf, y, epsabs=1e-11)[0]
    above = integrate.quad(lambda x: (1 - _mixture_cdf(mu, var, x)) ** 2, y, np.inf, epsabs=1e-11)[0]
    return below + above


# ------------------------------------------------------------------- closed forms
def test_mixture_crps_equals_numerical_integration():
    crps = mixture_crps(MEANS, VARIANCES, TARGETS)
    for i in range(len(TARGETS)):
        expected = _quad_crps(MEANS[i].double().numpy(), VARIANCES[i].double().numpy(), float(TARGETS[i]))
        assert float(crps[i]) == pytest.approx(expected, abs=1e-5)


def test_mixture_crps_equals_monte_carlo_and_the_shared_variance_form():
    g = torch.Generator().manual_seed(0)
    n = 400_000
    component = torch.randint(0, 3, (2, n), generator=g)
    sd = VARIANCES.double().sqrt().gather(1, component)
    draws = MEANS.double().gather(1, component) + sd * torch.randn(2, n, generator=g, dtype=torch.float64)
    spread = (draws[:, : n // 2] - draws[:, n // 2:]).abs().mean(1)
    monte_carlo = (draws - TARGETS.double()[:, None]).abs().mean(1) - 0.5 * spread
    assert torch.allclose(mixture_crps(MEANS, VARIANCES, TARGETS).double(), monte_carlo, atol=1e-2)
    shared = torch.tensor([0.5, 2.0])
    assert torch.allclose(mixture_crps(MEANS, shared[:, None].expand(-1, 3), TARGETS),
                          gaussian_mixture_crps(MEANS, TARGETS, shared), atol=1e-6)


def test_mixture_nll_and_moments_equal_direct_computation():
    for i in range(len(TARGETS)):
        mu, var = MEANS[i].double().numpy(), VARIANCES[i].double().numpy()
        density = stats.norm.pdf(float(TARGETS[i]), mu, np.sqrt(var)).mean()
        assert float(mixture_nll(MEANS, VARIANCES, TARGETS)[i]) == pytest.approx(-math.log(density), abs=1e-5)
        def moment(power, mu=mu, var=var):
            density = lambda x: x**power * stats.norm.pdf(x, mu, np.sqrt(var)).mean()  # noqa: E731
            return integrate.quad(density, -np.inf, np.inf)[0]

        first, second = moment(1), moment(2)
        mean, variance = mixture_moments(MEANS, VARIANCES)
        assert float(mean[i]) == pytest.approx(first, abs=1e-5)
        assert float(variance[i]) == pytest.approx(second - first**2, abs=1e-4)
    far = mixture_nll(torch.tensor([[0.0, 60.0]]), torch.tensor([[1e-2, 1e-2]]), torch.tensor([60.0]))
    assert torch.isfinite(far).all()  # logsumexp: no underflow of the far component


def test_metrics_accumulate_the_row_means():
    nll, crps = MixtureNLL(), MixtureCRPS()
    for rows in (slice(0, 1), slice(1, 2)):
        nll.update(MEANS[rows], VARIANCES[rows], TARGETS[rows])
        crps.update(MEANS[rows], VARIANCES[rows], TARGETS[rows])
    assert torch.allclose(nll.compute(), mixture_nll(MEANS, VARIANCES, TARGETS).mean())
    assert torch.allclose(crps.compute(), mixture_crps(MEANS, VARIANCES, TARGETS).mean())
    with pytest.raises(ValueError, match="rows, members"):
        nll.update(MEANS, VARIANCES[:, :2], TARGETS)


def test_pinball_loss_equals_a_hand_computation():
    levels = [0.1, 0.5, 0.9]
    quantiles, y = torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([2.5])
    # y - q = 1.5, 0.5, -0.5: 0.1 * 1.5, 0.5 * 0.5, (0.9 - 1) * -0.5
    assert torch.allclose(pinball_loss(quantiles, y, levels), torch.tensor([[0.15, 0.25, 0.05]]))
    metric = QuantileLoss(levels)
    metric.update(quantiles, y)
    assert float(metric.compute()) == pytest.approx(0.15)
    coverage = IntervalCoverage()
    coverage.update(torch.zeros(3), torch.ones(3), torch.tensor([1.0, 0.5, -0.1]))
    assert float(coverage.compute()) == pytest.approx(2 / 3)


def test_gaussian_nll_equals_torch_and_beta_weights_by_the_detached_variance():
    mean, variance, y = MEANS, VARIANCES.clone().requires_grad_(), TARGETS
    plain = gaussian_nll(mean, variance, y)
    expected = 0.5 * (math.log(2 * math.pi) + variance.log() + (y[:, None] - mean) ** 2 / variance)
    assert torch.allclose(plain, expected)
    weighted = gaussian_nll(mean, variance, y, beta=0.5)
    assert torch.allclose(weighted, expected * VARIANCES.sqrt())
    (grad,) = torch.autograd.grad(weighted.sum(), variance)
    (plain_grad,) = torch.autograd.grad(expected.sum(), variance)
    assert torch.allclose(grad, plain_grad * VARIANCES.sqrt())  # the weight has no gradient of its own


# ---------------------------------------------------------------------- the module
def _spec(**kwargs):
    return TabularSpec(task="regression", n_num_features=1, target_mean=kwargs.get("mean", 0.0),
                       target_std=kwargs.get("std", 1.0))


def _heteroscedastic(n=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 2 - 1
    noise = torch.where(x[:, 0] < 0, 0.1, 1.0)
    y = 2 * x[:, 0] + noise * torch.randn(n, generator=g)
    return {"x_num": x, "y": y}, noise


def _fit(model, batch, steps=100, lr=2e-2):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    for _ in range(steps):
        loss = model.step(batch, "train")["loss"]
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


@pytest.mark.parametrize("adapter", ["lometab", "rank1", "packed"])
def test_gaussian_head_learns_the_larger_variance_where_the_noise_is_larger(adapter):
    torch.manual_seed(0)
    batch, noise = _heteroscedastic()
    model = _fit(TabularEnsembleModule(_spec(), k=4, adapter=adapter, d_block=16, dropout=0.0,
                                       regression_head="gaussian"), batch)
    out = model.predictive_distribution(batch)
    quiet, loud = out["variance"][noise == 0.1].mean(), out["variance"][noise == 1.0].mean()
    assert float(loud / quiet) > 10  # true ratio 100
    mean, variance = mixture_moments(out["member_mean"], out["member_variance"])
    assert torch.equal(out["mean"], mean) and torch.equal(out["variance"], variance)


def test_quantile_head_covers_the_nominal_share_and_feeds_cqr():
    torch.manual_seed(0)
    batch, _ = _heteroscedastic(n=512)
    model = _fit(TabularEnsembleModule(_spec(mean=0.3, std=1.2), k=4, adapter="rank1", d_block=16,
                                       dropout=0.0, regression_head="quantile",
                                       quantile_levels=(0.95, 0.5, 0.05)), batch)
    out = model.predictive_distribution(batch)
    y = batch["y"]
    inside = ((out["lower"] <= y) & (y <= out["upper"])).float().mean()
    assert 0.85 <= float(inside) <= 0.95  # nominal 0.9
    quantiles = out["member_quantiles"]
    assert quantiles.shape == (512, 4, 3) and bool((quantiles.diff(dim=-1) >= 0).all())  # never cross
    assert torch.equal(out["member_mean"], quantiles[..., 1])  # the point prediction is the median
    # conformalised quantile regression on new rows, from the module's lower and upper bounds
    calibration, _ = _heteroscedastic(n=512, seed=1)
    test, _ = _heteroscedastic(n=512, seed=2)
    cal = model.predictive_distribution(calibration)
    conformal = SplitConformal("cqr", 0.1).calibrate((cal["lower"], cal["upper"]), calibration["y"])
    new = model.predictive_distribution(test)
    lower, upper = conformal.predict_intervals((new["lower"], new["upper"]))
    assert 0.85 <= float(((lower <= test["y"]) & (test["y"] <= upper)).float().mean()) <= 0.95


def test_losses_are_the_heads_objectives_on_standardised_targets():
    torch.manual_seed(0)
    batch, _ = _heteroscedastic(n=16)
    spec = _spec(mean=1.0, std=2.0)
    y = (batch["y"] - 1.0) / 2.0
    gaussian = TabularEnsembleModule(spec, k=3, d_block=8, regression_head="gaussian", beta_nll=0.5).eval()
    raw = gaussian(batch["x_num"])
    variance = torch.nn.functional.softplus(raw[..., 1]) + 1e-6
    expected = torch.nn.functional.gaussian_nll_loss(raw[..., 0], y[:, None].expand(-1, 3), variance,
                                                     full=True, reduction="none") * variance.detach() ** 0.5
    assert torch.allclose(gaussian.step(batch, "val")["loss"], expected.mean(), atol=1e-6)
    quantile = TabularEnsembleModule(spec, k=3, d_block=8, regression_head="quantile").eval()
    q = sorted_quantiles(quantile(batch["x_num"]))
    levels = torch.tensor([0.05, 0.5, 0.95])
    diff = y[:, None, None] - q
    expected = torch.maximum(levels * diff, (levels - 1) * diff).mean()
    assert torch.allclose(quantile.step(batch, "val")["loss"], expected, atol=1e-6)


@pytest.mark.parametrize("adapter", ["rank1", "packed", "shared", "lometab"])
def test_the_default_point_head_is_bitwise_unchanged(adapter):
    spec = TabularSpec(task="regression", n_num_features=3, target_mean=2.0, target_std=3.0,
                       bins=[[-2.0, 0.0, 1.0, 3.0], [-1.0, 1.0], [0.0, 0.5, 1.0]])
    g = torch.Generator().manual_seed(1)
    batch = {"x_num": torch.randn(12, 3, generator=g), "y": torch.randn(12, generator=g) * 3 + 2}
    outputs = []
    for kwargs in ({}, {"regression_head": "point"}):
        torch.manual_seed(0)
        model = TabularEnsembleModule(spec, k=3, d_block=16, adapter=adapter, **kwargs).eval()
        step = model.step(batch, "val")
        metrics = model.metrics["val_"]
        model.update_metrics(metrics, step)
        outputs.append((model.state_dict(), step, metrics.compute(), model.predict_step(batch, 0)))
    (sd_a, step_a, metrics_a, pred_a), (sd_b, step_b, metrics_b, pred_b) = outputs
    assert sd_a.keys() == sd_b.keys() and all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)
    assert step_a.keys() == step_b.keys() == {"member_outputs", "target", "loss"}
    assert all(torch.equal(step_a[k], step_b[k]) for k in step_a)
    assert set(metrics_a) == {"val/rmse", "val/mae", "val/r2", "val/crps"}
    assert all(torch.equal(metrics_a[k], metrics_b[k]) for k in metrics_a)
    assert pred_a.keys() == {"prediction", "member_predictions"}
    assert all(torch.equal(pred_a[k], pred_b[k]) for k in pred_a)
    # the loss is still the squared error of the standardised member outputs
    raw = model(batch["x_num"])
    expected = torch.nn.functional.mse_loss(raw[..., 0], ((batch["y"] - 2.0) / 3.0)[:, None].expand(-1, 3))
    assert torch.allclose(step_a["loss"], expected, atol=1e-6)


@pytest.mark.parametrize("adapter", ["lometab", "rank1", "additive", "packed", "shared"])
@pytest.mark.parametrize("head", ["gaussian", "quantile"])
def test_every_adapter_takes_every_head(adapter, head):
    model = TabularEnsembleModule(_spec(), k=3, d_block=8, adapter=adapter, regression_head=head).eval()
    batch, _ = _heteroscedastic(n=8)
    assert model(batch["x_num"]).shape == (8, 3, 2 if head == "gaussian" else 3)
    step = model.step(batch, "val")
    assert step["member_outputs"].shape == (8, 3, 1) and step["loss"].ndim == 0
    key = "member_variance" if head == "gaussian" else "member_quantiles"
    assert not step[key].requires_grad


@pytest.mark.parametrize("head", ["gaussian", "quantile"])
def test_fit_logs_the_heads_metrics_and_the_checkpoint_round_trips(tmp_path, head):
    torch.manual_seed(0)
    batch, _ = _heteroscedastic(n=64)
    rows = DataLoader([{"x_num": x, "y": y} for x, y in zip(batch["x_num"], batch["y"], strict=True)],
                      batch_size=32)
    model = TabularEnsembleModule(_spec(mean=0.1, std=1.3), k=3, d_block=16, regression_head=head,
                                  beta_nll=0.5 if head == "gaussian" else 0.0)
    trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(model, train_dataloaders=rows, val_dataloaders=rows)
    logged = set(trainer.callback_metrics)
    own = {"gaussian": {"val/nll", "val/ece"}, "quantile": {"val/pinball", "val/coverage"}}[head]
    assert {"val/loss", "val/rmse", "val/mae", "val/r2", "val/crps", "train/loss"} | own <= logged
    assert model.logged_metric_names("val") >= {"val/loss", "val/rmse", *own}
    model.eval()
    validation = torch.stack([model.step(r, "val")["loss"] for r in rows]).mean()
    assert float(trainer.callback_metrics["val/loss"]) == pytest.approx(float(validation.detach()), rel=1e-5)
    if head == "gaussian":  # val/crps is the mixture's closed form
        out = model.predictive_distribution(batch)
        expected = mixture_crps(out["member_mean"], out["member_variance"], batch["y"]).mean()
        assert float(trainer.callback_metrics["val/crps"]) == pytest.approx(float(expected), rel=1e-5)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    torch.load(path, weights_only=True)  # hyperparameters stay plain data
    loaded = TabularEnsembleModule.load_from_checkpoint(path, weights_only=True).eval()
    assert loaded.regression_head == head
    a, b = model.predictive_distribution(batch), loaded.predictive_distribution(batch)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    prediction = loaded.predict_step(batch, 0)
    assert prediction["member_predictions"].shape == (64, 3)
    assert torch.equal(prediction["prediction"], a["member_mean"].mean(1))
    small = loaded.select_members(2, dataloader=rows)  # rebuilt from the hyperparameters
    assert small.regression_head == head
    assert small.predictive_distribution(batch)["member_mean"].shape == (64, 2)


def test_bad_settings_fail_in_one_line_with_the_fix():
    binary = TabularSpec(task="binary", n_num_features=1, n_classes=2)
    with pytest.raises(RipienoInputError, match="needs a regression task.*regression_head='point'"):
        TabularEnsembleModule(binary, regression_head="gaussian")
    with pytest.raises(RipienoInputError, match="include 0.5"):
        TabularEnsembleModule(_spec(), regression_head="quantile", quantile_levels=(0.1, 0.9))
    with pytest.raises(RipienoInputError, match=r"beta_nll must be in \[0, 1\]"):
        TabularEnsembleModule(_spec(), regression_head="gaussian", beta_nll=2.0)
    with pytest.raises(RipienoInputError, match="regression_head must be one of"):
        TabularEnsembleModule(_spec(), regression_head="laplace")


def test_posterior_samplers_refuse_a_distributional_head():
    from ripieno.framework.errors import RipienoInputError

    model = TabularEnsembleModule(_spec(mean=0.3, std=1.2), k=2, d_block=8, regression_head="gaussian")
    with pytest.raises(RipienoInputError, match="regression_head='point'"):
        model.output_affine  # noqa: B018 - what the samplers read
    assert TabularEnsembleModule(_spec(mean=0.3, std=1.2), k=2, d_block=8).output_affine == (1.2, 0.3)


def test_mixture_calibration_error_is_the_mean_coverage_gap_of_central_intervals():
    from scipy.stats import norm

    from ripieno.framework.metrics.mixture import MixtureCalibrationError, mixture_cdf

    g = torch.Generator().manual_seed(0)
    means, variances = torch.randn(500, 3, generator=g), torch.rand(500, 3, generator=g) + 0.5
    y = torch.randn(500, generator=g) * 1.5
    pit = norm.cdf((y.double()[:, None] - means.double()) / variances.double().sqrt()).mean(1)  # scipy's CDF
    assert np.allclose(mixture_cdf(means, variances, y).numpy(), pit, atol=1e-6)
    levels = np.array([0.2, 0.5, 0.8])
    expected = np.abs((np.abs(pit - 0.5)[:, None] <= levels / 2).mean(0) - levels).mean()
    metric = MixtureCalibrationError(levels=levels.tolist())
    metric.update(means[:200], variances[:200], y[:200])
    metric.update(means[200:], variances[200:], y[200:])
    assert float(metric.compute()) == pytest.approx(expected, abs=1e-6)
    # draws from the predictive itself are calibrated: a small error; a 4x too narrow one is not
    k = torch.randint(0, 3, (20000,), generator=g)
    mu, var = torch.zeros(20000, 3), torch.ones(20000, 3)
    draws = torch.randn(20000, generator=g) + mu[torch.arange(20000), k]
    calibrated, narrow = MixtureCalibrationError(), MixtureCalibrationError()
    calibrated.update(mu, var, draws)
    narrow.update(mu, var / 16, draws)
    assert float(calibrated.compute()) < 0.01 < 0.2 < float(narrow.compute())
    with pytest.raises(ValueError, match="levels"):
        MixtureCalibrationError(levels=[1.5])
