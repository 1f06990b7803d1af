"""LL-GLM on member heads (a packed EnsembleLinear, the tabular ensembles' last layer).

Oracles: explicit autograd Jacobians of the head, the closed-form Bayesian linear
regression of each member on its own features (members independent a posteriori), and
the module's own member predictions at theta*.
"""

import lightning as L
import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

from ripieno.callbacks import LaplaceGGN, LastLayerSampler, SamplerEvaluation
from ripieno.datamodules import LoaderSettings, TabularDataModule
from ripieno.framework import TabularEnsembleModule
from ripieno.framework.nn import EnsembleLinear
from ripieno.framework.uq import GLMPosteriorSampler, LastLayerLinearization, last_layer_closed_form

K, C, D = 3, 2, 4


class MemberHeadNet(nn.Module):
    """A shared body, then K independent linear heads on member-specific features."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(3, K * D)
        self.head = EnsembleLinear(D, C, K, adapter="packed")

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)).view(-1, K, D))


def _explicit_jacobian(net, x):
    params = {n: p.detach() for n, p in net.head.named_parameters()}

    def head_out(p):
        phi = torch.tanh(net.body(x)).view(-1, K, D).detach()
        return functional_call(net.head, p, (phi,))

    jac = jacrev(head_out)(params)  # {name: (B, K, C, *shape)}
    b = x.shape[0]
    return torch.cat([jac["weight"].reshape(b * K * C, -1), jac["bias"].reshape(b * K * C, -1)], 1)


def test_member_head_jacobian_products_equal_explicit_jacobians():
    torch.manual_seed(0)
    net, x = MemberHeadNet(), torch.randn(5, 3)
    lin = LastLayerLinearization(net, lambda b: b)
    assert lin.members == K and lin.n_params == K * C * D + K * C
    phi, outputs = lin.features_and_outputs(x)
    assert phi.shape == (5, K, D) and outputs.shape == (5 * K, C)
    assert torch.allclose(outputs, net(x).reshape(-1, C))
    jac = _explicit_jacobian(net, x)  # rows ordered (row, member, class)
    v = torch.randn(6, lin.n_params)
    assert torch.allclose(lin.jvp(phi, v).reshape(6, -1), v @ jac.T, atol=1e-5)
    u = torch.randn(6, 5 * K, C)
    assert torch.allclose(lin.vjp(phi, u), u.reshape(6, -1) @ jac, atol=1e-5)


def test_member_posteriors_are_independent_closed_form_regressions():
    torch.manual_seed(1)
    net, x = MemberHeadNet(), torch.randn(40, 3)
    y = torch.randn(40)
    lam, noise, s = 2.0, 0.5, 4000
    lin = LastLayerLinearization(net, lambda b: b[0])
    sampler = GLMPosteriorSampler(lin, "regression", prior_precision=lam, noise_variance=noise,
                                  n_samples=s, center="bayes", max_iters=500, tol=1e-10)
    loader = [(x[i : i + 10], y[i : i + 10]) for i in range(0, 40, 10)]
    sampler.fit(loader, lambda b: b[1][:, None].expand(-1, C))
    theta = sampler.samples().double()  # (S, [W (K, C, D), b (K, C)])
    w = theta[:, : K * C * D].view(s, K, C, D)
    bias = theta[:, K * C * D :].view(s, K, C)
    phi = torch.tanh(net.body(x)).view(-1, K, D).detach()
    for k in range(K):
        features = torch.cat([phi[:, k], torch.ones(40, 1)], 1)
        mean, cov = last_layer_closed_form(features, y[:, None].expand(-1, C), lam, noise)
        member = torch.cat([w[:, k], bias[:, k, :, None]], -1)  # (S, C, D + 1)
        se = cov.diagonal().sqrt() / s**0.5
        assert ((member.mean(0) - mean).abs() <= 5 * se).all()
        emp_cov = torch.cov(member[:, 0].T)
        assert torch.allclose(emp_cov, cov, atol=6 * float(cov.diagonal().max()) / s**0.5)
    # Different members are uncorrelated a posteriori.
    cross = torch.corrcoef(torch.stack([w[:, 0, 0, 0], w[:, 1, 0, 0], w[:, 2, 1, 2]]))
    assert cross.triu(1).abs().max() < 5 / s**0.5


def _trainer(tmp_path, callback, epochs=3):
    return L.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[callback])


def test_tabular_ensemble_regression_samples_are_member_predictions_in_target_units(tmp_path):
    torch.manual_seed(0)
    dm = TabularDataModule("concrete", max_rows=300, loader=LoaderSettings(batch_size=64))
    model = TabularEnsembleModule(dm.spec, k=4, d_block=32, n_blocks=1, dropout=0.0)
    callback = LastLayerSampler(n_samples=3, posterior=LaplaceGGN(prior_precision=1.0),
                                evaluation=SamplerEvaluation(input_key=["x_num", "x_cat"]))
    trainer = _trainer(tmp_path, callback)
    trainer.fit(model, datamodule=dm)
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    batch = next(iter(dm.test_dataloader()))
    samples = callback.sample(model, batch)
    assert samples.shape == (len(batch["y"]), 3 * 4, 1)
    z = callback.sampler.z
    callback.sampler.z = torch.zeros_like(z)  # theta*: each (sample, member) is member k's output
    model.eval()
    with torch.no_grad():
        members = model.member_predictions(model(batch["x_num"], batch.get("x_cat")))  # (B, K)
    at_map = callback.sample(model, batch)[..., 0]
    assert torch.allclose(at_map, members.repeat(1, 3), atol=1e-3 * float(members.abs().max()))
    callback.sampler.z = z
    # Gaussian NLL of the logged metric, recomputed from the samples in target units.
    noise = callback.noise_variance
    ys, means, variances = [], [], []
    for b in dm.test_dataloader():
        s = callback.sample(model, b)[..., 0].double()
        ys.append(b["y"].double())
        means.append(s.mean(1))
        variances.append(s.var(1, unbiased=False) + noise)
    y, mean, var = torch.cat(ys), torch.cat(means), torch.cat(variances)
    nll = (0.5 * torch.log(2 * torch.pi * var) + (y - mean) ** 2 / (2 * var)).mean()
    assert result["uq/test/nll"] == pytest.approx(float(nll), rel=1e-4)


def test_tabular_ensemble_binary_posterior_keeps_the_ensemble_accuracy(tmp_path):
    torch.manual_seed(0)
    dm = TabularDataModule("mlc_churn", max_rows=400, loader=LoaderSettings(batch_size=64))
    model = TabularEnsembleModule(dm.spec, k=4, d_block=32, n_blocks=1, dropout=0.0)
    callback = LastLayerSampler(n_samples=4, posterior=LaplaceGGN(prior_precision=1e9),
                                evaluation=SamplerEvaluation(input_key=["x_num", "x_cat"]))
    trainer = _trainer(tmp_path, callback)
    trainer.fit(model, datamodule=dm)
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    # A prior this tight leaves theta*: the mean of S * K member probabilities is the ensemble.
    assert result["uq/test/accuracy"] == pytest.approx(result["test/accuracy"], abs=1e-6)
    batch = next(iter(dm.test_dataloader()))
    probs = callback.probabilities(callback.sample(model, batch)).mean(1)
    model.eval()
    with torch.no_grad():
        ensemble = model.predict_ensemble(model(batch["x_num"], batch.get("x_cat")))
    assert torch.allclose(probs, ensemble, atol=1e-4)


def test_member_heads_reject_evidence_selection(tmp_path):
    dm = TabularDataModule("concrete", max_rows=200, loader=LoaderSettings(batch_size=64))
    model = TabularEnsembleModule(dm.spec, k=2, d_block=16, n_blocks=1)
    callback = LastLayerSampler(n_samples=2,
                                posterior=LaplaceGGN(prior_precision_grid=[0.1, 1.0], selection="evidence"),
                                evaluation=SamplerEvaluation(input_key=["x_num", "x_cat"]))
    with pytest.raises(ValueError, match="member heads"):
        _trainer(tmp_path, callback, epochs=1).fit(model, datamodule=dm)


def test_shared_weight_ensemble_layer_is_not_a_last_layer():
    net = nn.Sequential(EnsembleLinear(3, 2, 4, adapter="lometab"))
    with pytest.raises(ValueError, match="share weights"):
        LastLayerLinearization(net, lambda b: b, last_layer_name="0")
