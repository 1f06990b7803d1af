"""LL-GLM and DNN-GLM samplers against closed forms and explicit Jacobians."""

import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

from ripieno.framework.uq import (
    FullNetworkLinearization,
    GLMPosteriorSampler,
    LastLayerLinearization,
    last_layer_closed_form,
    last_layer_log_evidence,
)


def _net(d_in=3, hidden=6, d_out=2, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, d_out))


def _data(n=40, d_in=3, d_out=2, seed=1, classes=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=g)
    y = torch.randint(0, classes, (n,), generator=g) if classes else torch.randn(n, d_out, generator=g)
    return [(x[i : i + 10], y[i : i + 10]) for i in range(0, n, 10)], x, y


def _features(model, x):
    with torch.no_grad():
        phi = model[:-1](x)
    return torch.cat([phi, torch.ones(len(x), 1)], 1)


def _to_row_layout(samples, c, d):
    """[W.flatten(), b] -> per-output rows [W_c | b_c] of the closed form."""
    w = samples[:, : c * d].view(-1, c, d)
    b = samples[:, c * d :].view(-1, c, 1)
    return torch.cat([w, b], 2)


def test_last_layer_bayes_samples_match_closed_form():
    model, (loader, x, y) = _net(), _data()
    lam, noise, s = 2.0, 0.5, 4000
    sampler = GLMPosteriorSampler(LastLayerLinearization(model, lambda b: b[0]), "regression",
                                  prior_precision=lam, noise_variance=noise, n_samples=s,
                                  center="bayes", solver="cg", tol=1e-10, max_iters=100)
    samples = _to_row_layout(sampler.fit(loader, lambda b: b[1]).samples().double(), 2, 6)
    mean, cov = last_layer_closed_form(_features(model, x), y, lam, noise)
    std_err = cov.diagonal().sqrt() / s**0.5
    assert ((samples.mean(0) - mean).abs() <= 4.5 * std_err).all()
    for c in range(2):
        empirical = torch.cov(samples[:, c].T)
        assert torch.linalg.matrix_norm(empirical - cov) / torch.linalg.matrix_norm(cov) < 0.08


def test_cg_solves_the_linear_system_exactly():
    model, (loader, x, _) = _net(), _data()
    lin = LastLayerLinearization(model, lambda b: b[0])
    sampler = GLMPosteriorSampler(lin, "regression", prior_precision=1.5, noise_variance=0.3,
                                  n_samples=3, tol=1e-12, max_iters=100)
    sampler.fit(loader, lambda b: b[1])
    phi = _features(model, x)
    h_block = phi.T @ phi / 0.3 + 1.5 * torch.eye(7)
    # z reshaped per output row satisfies H z = b: check via the Hessian-vector product.
    hz = sampler._hvp(sampler.z)
    rows = _to_row_layout(sampler.z.double(), 2, 6)
    explicit = torch.einsum("de,sce->scd", h_block.double(), rows)
    assert torch.allclose(_to_row_layout(hz.double(), 2, 6), explicit, atol=1e-4)
    assert sampler.cg_iterations <= 2 * 7 * 2


def test_classification_samples_have_ggn_covariance():
    model, (loader, x, _) = _net(d_out=3), _data(classes=3)
    lam, s = 1.0, 4000
    lin = LastLayerLinearization(model, lambda b: b[0])
    sampler = GLMPosteriorSampler(lin, "classification", prior_precision=lam, n_samples=s,
                                  tol=1e-10, max_iters=200).fit(loader, lambda b: b[1])
    with torch.no_grad():
        p = torch.softmax(model(x), -1).double()
    phi = torch.cat([model[:-1](x).detach(), torch.ones(len(x), 1)], 1).double()
    # Explicit J_i for the [W.flatten(), b] layout: d out_c / d W_{c,d} = phi_d, d out_c / d b_c = 1.
    c, d = 3, 6
    h = lam * torch.eye(c * d + c, dtype=torch.float64)
    for i in range(len(x)):
        j = torch.zeros(c, c * d + c, dtype=torch.float64)
        for k in range(c):
            j[k, k * d : (k + 1) * d] = phi[i, :d]
            j[k, c * d + k] = 1.0
        lam_i = torch.diag(p[i]) - torch.outer(p[i], p[i])
        h += j.T @ lam_i @ j
    cov = torch.linalg.inv(h)
    z = sampler.z.double()
    assert (z.mean(0).abs() <= 4.5 * (cov.diagonal() / s).sqrt()).all()
    assert torch.linalg.matrix_norm(torch.cov(z.T) - cov) / torch.linalg.matrix_norm(cov) < 0.08


def test_full_network_on_a_linear_model_equals_last_layer():
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    loader, x, _ = _data(d_in=4, classes=3)
    kwargs = dict(prior_precision=0.7, n_samples=5, tol=1e-10, max_iters=100, seed=3)
    ll = GLMPosteriorSampler(LastLayerLinearization(model, lambda b: b[0]), "classification", **kwargs)
    full = GLMPosteriorSampler(FullNetworkLinearization(model, lambda b: b[0]), "classification", **kwargs)
    ll.fit(loader, lambda b: b[1])
    full.fit(loader, lambda b: b[1])
    assert torch.allclose(ll.z, full.z, atol=1e-5)
    assert torch.allclose(ll.predict((x, None)), full.predict((x, None)), atol=1e-5)


def test_jvp_vjp_equal_explicit_jacobian():
    model = _net(d_in=3, hidden=5, d_out=2)
    lin = FullNetworkLinearization(model, lambda b: b)
    x = torch.randn(7, 3)
    params = {k: v.detach() for k, v in model.named_parameters()}
    jac = jacrev(lambda p: functional_call(model, p, (x,)))(params)
    j = torch.cat([jac[k].reshape(7, 2, -1) for k in params], dim=2)  # (B, C, P)
    v = torch.randn(4, lin.n_params)
    u = torch.randn(4, 7, 2)
    assert torch.allclose(lin.jvp(x, v), torch.einsum("bcp,sp->sbc", j, v), atol=1e-5)
    assert torch.allclose(lin.vjp(x, u), torch.einsum("bcp,sbc->sp", j, u), atol=1e-5)


def test_map_center_regression_has_laplace_covariance_and_zero_mean():
    model, (loader, x, _) = _net(), _data()
    s = 3000
    sampler = GLMPosteriorSampler(LastLayerLinearization(model, lambda b: b[0]), "regression",
                                  prior_precision=1.0, noise_variance=0.2, n_samples=s,
                                  tol=1e-10, max_iters=100).fit(loader, lambda b: b[1])
    phi = _features(model, x).double()
    cov = torch.linalg.inv(phi.T @ phi / 0.2 + torch.eye(7, dtype=torch.float64))
    rows = _to_row_layout(sampler.z.double(), 2, 6)
    assert (rows.mean(0).abs() <= 4.5 * (cov.diagonal() / s).sqrt()).all()
    assert torch.linalg.matrix_norm(torch.cov(rows[:, 0].T) - cov) / torch.linalg.matrix_norm(cov) < 0.08


def test_sgd_solver_approaches_the_cg_solution():
    model, (loader, _, _) = _net(), _data()
    common = dict(prior_precision=5.0, noise_variance=1.0, n_samples=2, seed=7)
    lin = LastLayerLinearization(model, lambda b: b[0])
    exact = GLMPosteriorSampler(lin, "regression", tol=1e-10, **common).fit(loader, lambda b: b[1])
    sgd = GLMPosteriorSampler(lin, "regression", solver="sgd", lr=2e-3, max_iters=400, **common)
    sgd.fit(loader, lambda b: b[1])
    assert torch.linalg.norm(sgd.z - exact.z) / torch.linalg.norm(exact.z) < 0.05


def test_log_evidence_equals_gaussian_marginal():
    g = torch.Generator().manual_seed(0)
    phi = torch.cat([torch.randn(15, 3, generator=g), torch.ones(15, 1)], 1).double()
    y = torch.randn(15, 2, generator=g).double()
    lam, noise = 0.8, 0.4
    marginal = torch.distributions.MultivariateNormal(
        torch.zeros(15, dtype=torch.float64), noise * torch.eye(15, dtype=torch.float64) + phi @ phi.T / lam)
    expected = sum(marginal.log_prob(y[:, c]) for c in range(2))
    assert last_layer_log_evidence(phi, y, lam, noise) == pytest.approx(float(expected), rel=1e-9)


def test_bad_arguments_are_rejected():
    lin = LastLayerLinearization(_net(), lambda b: b[0])
    with pytest.raises(ValueError, match="regression only"):
        GLMPosteriorSampler(lin, "classification", center="bayes")
    with pytest.raises(ValueError, match="not nn.Linear"):
        LastLayerLinearization(_net(), lambda b: b[0], last_layer_name="1")
