"""SWAGSampler and LaplaceSampler on a user's module, against independent oracles."""

import sys

import lightning as L
import pytest
import torch
from helpers.tiny_lightning import TinyClassifier
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader

from ripieno.callbacks.laplace_baseline import LaplaceSampler
from ripieno.callbacks.swag import SWAGSampler


class TinyModel(TinyClassifier):
    """The shared tiny classifier at a larger learning rate (these samplers' oracles were set with it)."""

    def __init__(self, n_out=3, task="multiclass", hidden=16, batch_norm=False):
        super().__init__(n_out, task, hidden, batch_norm, lr=0.05)


class TinyData(L.LightningDataModule):
    def __init__(self, task="multiclass"):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(160, 4, generator=g)
        if task == "regression":
            y = x[:, 0] * 2 + 0.3 * torch.randn(160, generator=g)
        else:
            y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long()
        self.rows = [{"x": x[i], "y": y[i]} for i in range(160)]

    def train_dataloader(self):
        return DataLoader(self.rows[:120], batch_size=32, shuffle=True)

    def test_dataloader(self):
        return DataLoader(self.rows[120:], batch_size=20)

    def predict_dataloader(self):
        return self.test_dataloader()

    def tensors(self, part="test"):
        rows = self.rows[120:] if part == "test" else self.rows[:120]
        return torch.stack([r["x"] for r in rows]), torch.stack([r["y"] for r in rows])


class Recorder(Callback):
    """Independent record of the flat trainable parameters at every training epoch end."""

    def __init__(self):
        self.snapshots = {}

    def on_train_epoch_end(self, trainer, pl_module):
        flat = torch.cat([p.detach().flatten() for p in pl_module.parameters() if p.requires_grad])
        self.snapshots[trainer.current_epoch] = flat.double().clone()


def _trainer(tmp_path, callbacks, max_epochs=3, **kwargs):
    kwargs.setdefault("enable_checkpointing", False)
    return L.Trainer(max_epochs=max_epochs, logger=False, enable_progress_bar=False,
                     enable_model_summary=False, default_root_dir=tmp_path, callbacks=callbacks,
                     **kwargs)


def _predictive_nll(probs, y):
    """NLL of the S-sample mixture, probs (B, S, C)."""
    p = probs.double().mean(1)
    return float(-p[torch.arange(len(y)), y].log().mean())


def _within_mc_error(samples, mean, cov, n_se=5.0):
    """Empirical mean/covariance of samples (S, P) match (mean, cov) within n_se standard errors."""
    s = samples.shape[0]
    emp_mean, emp_cov = samples.mean(0), torch.cov(samples.T)
    var = cov.diagonal()
    se_mean = (var / s).sqrt()
    se_cov = ((var[:, None] * var[None, :] + cov**2) / s).sqrt()
    assert ((emp_mean - mean).abs() <= n_se * se_mean + 1e-12).all()
    assert ((emp_cov - cov).abs() <= n_se * se_cov + 1e-12).all()


# ------------------------------------------------------------------------ SWAG
@pytest.mark.parametrize(("swa_start", "collect_every", "epochs"),
                         [(2, 1, [2, 3, 4, 5]), (0.5, 1, [3, 4, 5]), (1, 2, [1, 3, 5])])
def test_swag_moments_equal_snapshot_statistics(tmp_path, swa_start, collect_every, epochs):
    model, data, recorder = TinyModel(), TinyData(), Recorder()
    swag = SWAGSampler(n_samples=4, swa_start=swa_start, collect_every=collect_every, max_rank=3)
    _trainer(tmp_path, [recorder, swag], max_epochs=6).fit(model, datamodule=data)
    snaps = torch.stack([recorder.snapshots[e] for e in epochs])  # (n, P), float64
    assert swag.n_models == len(epochs)
    torch.testing.assert_close(swag.mean, snaps.mean(0), rtol=1e-10, atol=1e-12)
    population_var = snaps.var(0, unbiased=False).clamp(min=swag.var_clamp)
    torch.testing.assert_close(swag.variance, population_var, rtol=1e-6, atol=1e-12)
    # deviations: theta_i minus the running mean that includes theta_i; the last max_rank kept
    expected = torch.stack([snaps[i] - snaps[: i + 1].mean(0) for i in range(len(epochs))])[-3:]
    torch.testing.assert_close(swag.deviations, expected.float(), rtol=1e-5, atol=1e-6)


def test_swag_samples_have_the_swag_covariance_and_drive_the_forward(tmp_path):
    model, data, recorder = TinyModel(hidden=0), TinyData(), Recorder()
    swag = SWAGSampler(n_samples=4000, swa_start=2, max_rank=20, scale=0.5, seed=3)
    _trainer(tmp_path, [recorder, swag], max_epochs=8).fit(model, datamodule=data)
    k = swag.deviations.shape[0]
    assert k == swag.n_models == 6
    dev = swag.deviations.double()
    cov = 0.5 * (torch.diag(swag.variance) / 2 + dev.T @ dev / (2 * (k - 1)))
    draws = swag.sample_parameters().double()
    assert draws.shape == (4000, 15)
    _within_mc_error(draws, swag.mean, cov)
    # the forward of sample s is the linear model at theta_s, and the weights are untouched
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    x, _ = data.tensors()
    out = swag.sample(model, {"x": x[:5], "y": None})
    assert out.shape == (5, 4000, 3) and model.training
    for s in (0, 1, 3999):
        w, b = draws[s, :12].view(3, 4), draws[s, 12:]
        torch.testing.assert_close(out[:, s].double(), x[:5].double() @ w.T + b, rtol=1e-5, atol=1e-5)
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])


def test_swag_test_metrics_equal_its_own_samples(tmp_path):
    model, data = TinyModel(), TinyData()
    swag = SWAGSampler(n_samples=5, swa_start=1)
    trainer = _trainer(tmp_path, [swag], max_epochs=4)
    trainer.fit(model, datamodule=data)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    first = trainer.test(model, datamodule=data, verbose=False)[0]
    second = trainer.test(model, datamodule=data, verbose=False)[0]
    assert first == second
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])
    x, y = data.tensors()
    model.eval()
    samples = swag.sample(model, {"x": x, "y": y})
    assert samples.shape == (40, 5, 3)
    assert not torch.allclose(samples[:, 0], samples[:, 1])
    assert first["uq/test/nll"] == pytest.approx(_predictive_nll(torch.softmax(samples, -1), y), rel=1e-4)
    predictions = trainer.predict(model, datamodule=data)
    torch.testing.assert_close(predictions[0]["posterior_samples"], samples[:20])


def test_swag_regression_noise_is_estimated_at_the_swa_mean(tmp_path):
    model, data = TinyModel(n_out=1, task="regression"), TinyData("regression")
    swag = SWAGSampler(n_samples=3, swa_start=1)
    _trainer(tmp_path, [swag], max_epochs=3).fit(model, datamodule=data)
    x, y = data.tensors("train")
    mean = swag.mean.float()
    net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
    torch.nn.utils.vector_to_parameters(mean, net.parameters())
    with torch.no_grad():
        expected = float(((net(x)[:, 0] - y) ** 2).mean())
    assert swag.likelihood == "regression"
    assert swag.noise_variance == pytest.approx(expected, rel=1e-5)


@pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`")
def test_swag_state_dict_round_trip_and_checkpoint_resume(tmp_path):
    data, recorder = TinyData(), Recorder()
    model = TinyModel()
    swag = SWAGSampler(n_samples=3, swa_start=2, max_rank=3)
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_last=True, save_on_train_epoch_end=True)
    _trainer(tmp_path, [recorder, swag, ckpt], max_epochs=4, enable_checkpointing=True).fit(
        model, datamodule=data)
    assert swag.n_models == 2
    # in-memory round trip: same moments, same samples
    copy = SWAGSampler(n_samples=3, swa_start=2, max_rank=3)
    copy.load_state_dict(swag.state_dict())
    assert copy.n_models == 2
    assert torch.equal(copy.mean, swag.mean) and torch.equal(copy.sq_mean, swag.sq_mean)
    assert torch.equal(copy.deviations, swag.deviations)
    copy.prepare(None, model)
    torch.testing.assert_close(copy.sample(model, {"x": data.tensors()[0]}),
                               swag.sample(model, {"x": data.tensors()[0]}))
    # resume from the checkpoint: collection continues where it stopped
    resumed, later = SWAGSampler(n_samples=3, swa_start=2, max_rank=3), Recorder()
    _trainer(tmp_path, [later, resumed], max_epochs=6).fit(
        TinyModel(), datamodule=data, ckpt_path=str(tmp_path / "ckpt" / "last.ckpt"), weights_only=True)
    snaps = torch.stack([recorder.snapshots[2], recorder.snapshots[3],
                         later.snapshots[4], later.snapshots[5]])
    assert resumed.n_models == 4
    torch.testing.assert_close(resumed.mean, snaps.mean(0), rtol=1e-10, atol=1e-12)
    expected = torch.stack([snaps[i] - snaps[: i + 1].mean(0) for i in range(4)])[-3:]
    torch.testing.assert_close(resumed.deviations, expected.float(), rtol=1e-5, atol=1e-6)


def test_swag_needs_two_models(tmp_path):
    trainer = _trainer(tmp_path, [SWAGSampler(swa_start=2)], max_epochs=3)
    with pytest.raises(RuntimeError, match="at least 2 collected models, got 1.*swa_start=2"):
        trainer.fit(TinyModel(), datamodule=TinyData())


def test_swag_rejects_batch_norm_and_bad_arguments(tmp_path):
    trainer = _trainer(tmp_path, [SWAGSampler(swa_start=0)], max_epochs=2)
    with pytest.raises(ValueError, match="batch-norm"):
        trainer.fit(TinyModel(batch_norm=True), datamodule=TinyData())
    with pytest.raises(ValueError, match="max_rank"):
        SWAGSampler(max_rank=1)
    with pytest.raises(ValueError, match="fraction"):
        SWAGSampler(swa_start=1.0)
    with pytest.raises(TypeError, match="swa_start"):
        SWAGSampler(swa_start=True)


# --------------------------------------------------------------------- Laplace
def _generator(callback, calls):
    return torch.Generator().manual_seed(callback.seed * 1_000_003 + calls)


@pytest.mark.parametrize(("subset", "structure"), [("last_layer", "kron"), ("last_layer", "full"),
                                                   ("all", "kron")])
def test_laplace_metrics_equal_laplace_predictive_samples(tmp_path, subset, structure):
    pytest.importorskip("laplace")
    model, data = TinyModel(), TinyData()
    callback = LaplaceSampler(subset_of_weights=subset, hessian_structure=structure, n_samples=8, seed=2)
    trainer = _trainer(tmp_path, [callback])
    trainer.fit(model, datamodule=data)
    assert callback.fitted_prior_precision is not None and (callback.fitted_prior_precision > 0).all()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    result = trainer.test(model, datamodule=data, verbose=False)[0]
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name])
    x, y = data.tensors()
    model.eval()  # subset 'all' runs the live module, which trainer.test left in train mode
    probs = torch.cat([callback.la.predictive_samples(x[i:i + 20], pred_type="glm", n_samples=8,
                                                      generator=_generator(callback, i // 20 + 1))
                       for i in (0, 20)], dim=1).permute(1, 0, 2)  # (B, S, C)
    assert result["uq/test/nll"] == pytest.approx(_predictive_nll(probs, y), rel=1e-4)
    assert result["uq/test/lppd"] == pytest.approx(-_predictive_nll(probs, y), rel=1e-4)
    predictions = trainer.predict(model, datamodule=data)
    samples = predictions[0]["posterior_samples"]
    assert samples.shape == (20, 8, 3)
    torch.testing.assert_close(torch.softmax(samples, -1), probs[:20], rtol=1e-5, atol=1e-6)


def _last_layer_parts(model, x):
    model.eval()
    with torch.no_grad():
        phi = model.net[:-1](x).double()
        return phi, model.net[-1].weight.double(), model.net[-1].bias.double()


def _jacobians(phi, n_out):
    """Last-layer Jacobians (N, C, C*D + C) for parameters [W.flatten(), b]."""
    eye = torch.eye(n_out, dtype=phi.dtype)
    return torch.stack([torch.cat([torch.kron(eye, p[None, :]), eye], dim=1) for p in phi])


def test_laplace_full_last_layer_covariance_and_predictive_match_closed_form(tmp_path):
    pytest.importorskip("laplace")
    model, data = TinyModel(), TinyData()
    callback = LaplaceSampler(hessian_structure="full", n_samples=4000, seed=5)
    _trainer(tmp_path, [callback]).fit(model, datamodule=data)
    x_train, _ = data.tensors("train")
    phi, w, b = _last_layer_parts(model, x_train)
    js = _jacobians(phi, 3)
    p = torch.softmax(phi @ w.T + b, -1)
    lam = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]
    ggn = torch.einsum("nci,ncd,ndj->ij", js, lam, js)
    prior = float(callback.fitted_prior_precision)
    sigma = torch.linalg.inv(ggn + prior * torch.eye(ggn.shape[0], dtype=torch.float64))
    la = callback.la
    torch.testing.assert_close(la.mean.double(), torch.cat([w.flatten(), b]))
    torch.testing.assert_close(la.posterior_covariance.double(), sigma, rtol=1e-3,
                               atol=1e-4 * float(sigma.abs().max()))
    # the sampled log-probabilities are those of f ~ N(f_mu, J Sigma J^T): compare logit differences
    x_test, _ = data.tensors()
    phi_t, _, _ = _last_layer_parts(model, x_test[:4])
    j_t = _jacobians(phi_t, 3)
    f_mu, f_cov = phi_t @ w.T + b, j_t @ sigma @ j_t.transpose(1, 2)
    callback._calls = 0
    log_probs = callback.sample(model, {"x": x_test[:4]}).double()  # (4, 4000, 3)
    diff = torch.tensor([[-1.0, 1.0, 0.0], [-1.0, 0.0, 1.0]], dtype=torch.float64)
    for i in range(4):
        _within_mc_error(log_probs[i] @ diff.T, diff @ f_mu[i], diff @ f_cov[i] @ diff.T)


def test_laplace_regression_matches_closed_form_glm_predictive(tmp_path):
    pytest.importorskip("laplace")
    model, data = TinyModel(n_out=1, task="regression"), TinyData("regression")
    callback = LaplaceSampler(hessian_structure="full", n_samples=4000, prior_precision=2.0,
                              optimize_prior=False, noise_variance=0.25)
    trainer = _trainer(tmp_path, [callback])
    trainer.fit(model, datamodule=data)
    assert callback.noise_variance == pytest.approx(0.25)
    assert float(callback.la.sigma_noise) == pytest.approx(0.5)
    x_train, _ = data.tensors("train")
    phi, w, b = _last_layer_parts(model, x_train)
    feats = torch.cat([phi, torch.ones(len(phi), 1, dtype=phi.dtype)], 1)
    sigma = torch.linalg.inv(feats.T @ feats / 0.25 + 2.0 * torch.eye(feats.shape[1], dtype=phi.dtype))
    x_test, y_test = data.tensors()
    phi_t, _, _ = _last_layer_parts(model, x_test[:20])
    feats_t = torch.cat([phi_t, torch.ones(20, 1, dtype=phi.dtype)], 1)
    f_mu, f_var = (phi_t @ w.T + b)[:, 0], torch.einsum("bi,ij,bj->b", feats_t, sigma, feats_t)
    result = trainer.test(model, datamodule=data, verbose=False)[0]
    callback._calls = 0
    samples = callback.sample(model, {"x": x_test[:20]})[..., 0].double()  # (20, 4000)
    assert samples.shape == (20, 4000)
    se = (f_var / 4000).sqrt()
    assert ((samples.mean(1) - f_mu).abs() <= 5 * se).all()
    torch.testing.assert_close(samples.var(1), f_var, rtol=0.15, atol=1e-8)
    # logged Gaussian NLL: first test batch's samples are these; add the second batch
    second = callback.sample(model, {"x": x_test[20:]})[..., 0].double()
    both = torch.cat([samples, second])
    mean, var = both.mean(1), both.var(1, unbiased=False) + 0.25
    nll = (0.5 * torch.log(2 * torch.pi * var) + (y_test.double() - mean) ** 2 / (2 * var)).mean()
    assert result["uq/test/nll"] == pytest.approx(float(nll), rel=1e-4)


@pytest.mark.parametrize("subset", ["last_layer", "all"])
def test_laplace_refits_when_the_weights_changed(tmp_path, subset):
    pytest.importorskip("laplace")
    model, data = TinyModel(), TinyData()
    callback = LaplaceSampler(subset_of_weights=subset, n_samples=2, optimize_prior=False)
    trainer = _trainer(tmp_path, [callback], max_epochs=1)
    trainer.fit(model, datamodule=data)
    fitted = callback.la
    trainer.test(model, datamodule=data, verbose=False)
    assert callback.la is fitted and not callback.is_stale(model)
    with torch.no_grad():
        model.net[0].weight.add_(0.1)  # e.g. another checkpoint was loaded
    assert callback.is_stale(model)
    trainer.test(model, datamodule=data, verbose=False)
    assert callback.la is not fitted and not callback.is_stale(model)


def test_laplace_rejects_binary_logits():
    pytest.importorskip("laplace")
    with pytest.raises(ValueError, match="binary"):
        LaplaceSampler().prepare(None, TinyModel(n_out=1, task="binary"))


def test_laplace_missing_dependency_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "laplace", None)
    with pytest.raises(ImportError, match="pip install 'laplace-torch==0.3'"):
        LaplaceSampler().prepare(None, TinyModel())


def test_laplace_fit_progress_bars_follow_the_setting(tmp_path, monkeypatch):
    pytest.importorskip("laplace")
    import laplace.baselaplace as base

    seen = []
    original = base.ParametricLaplace.fit

    def spy(self, train_loader, override=True, progress_bar=False):
        seen.append(progress_bar)
        return original(self, train_loader, override=override, progress_bar=progress_bar)

    monkeypatch.setattr(base.ParametricLaplace, "fit", spy)
    for shown in (True, False, None):  # None: the trainer's bar (off in _trainer)
        callback = LaplaceSampler(n_samples=2, optimize_prior=False, progress_bar=shown)
        _trainer(tmp_path, [callback], max_epochs=1).fit(TinyModel(), datamodule=TinyData())
    assert seen == [True, False, False]
