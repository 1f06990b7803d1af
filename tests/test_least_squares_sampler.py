"""The LinearSampling reference sampler against its closed form and its own recursion."""

import pytest
import torch
from torch import nn
from torch.func import functional_call, jacrev

from ripieno.framework.uq import FullNetworkLinearization, LastLayerLinearization, LeastSquaresLogitSampler


def _net(d_in=3, hidden=5, d_out=3, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(d_in, hidden), nn.Tanh(), nn.Linear(hidden, d_out))


def _inputs(n=8, d_in=3, seed=1):
    return torch.randn(n, d_in, generator=torch.Generator().manual_seed(seed))


def _last_layer_jacobian(model, x):
    """Stacked ``(N * C, P)`` Jacobian of the outputs in ``[W.flatten(), b]``, float64."""
    with torch.no_grad():
        phi = model[:-1](x).double()
    n, d = phi.shape
    c = model[-1].out_features
    eye = torch.eye(c, dtype=torch.float64)
    weights = torch.einsum("ce,nd->nced", eye, phi).reshape(n, c, c * d)  # d f_c / d W_ed = [c = e] phi_d
    return torch.cat([weights, eye.expand(n, c, c)], dim=2).reshape(n * c, -1)


def _full_jacobian(model, x):
    params = {k: v.detach() for k, v in model.named_parameters()}
    jac = jacrev(lambda p: functional_call(model, p, (x,)))(params)
    return torch.cat([jac[k].reshape(x.shape[0] * model[-1].out_features, -1) for k in params], 1).double()


def _null_space_projection(jac, vectors):
    """``(I - P) v`` per row of ``vectors``, ``P = pinv(J) J`` the row-space projector of ``J``."""
    projector = torch.linalg.pinv(jac) @ jac
    return vectors.double() @ (torch.eye(jac.shape[1], dtype=torch.float64) - projector).T


def _lr(jac, rows, outputs):
    """A stable step: ``1 / lambda_max(J^T J / (B C))`` for one full batch."""
    return float(1.0 / torch.linalg.eigvalsh(jac.T @ jac / (rows * outputs)).max())


def test_last_layer_sample_converges_to_the_null_space_projection():
    model, x = _net(hidden=16), _inputs()
    lin = LastLayerLinearization(model, lambda b: b)
    jac = _last_layer_jacobian(model, x)
    assert torch.allclose(jac.float()[:3], _full_jacobian(model, x)[:3, -jac.shape[1]:].float(), atol=1e-6)
    assert torch.linalg.matrix_rank(jac) < jac.shape[1]  # 8 points x 3 logits, 51 parameters: a null space
    gamma = 0.7
    sampler = LeastSquaresLogitSampler(lin, n_samples=4, epochs=3000, lr=_lr(jac, 8, 3), gamma=gamma,
                                       seed=3).fit([x])
    expected = lin.theta_star().double() + gamma * _null_space_projection(jac, sampler.eps)
    assert torch.allclose(sampler.samples().double(), expected, atol=1e-4)
    # Converged samples leave the training logits where the network puts them ...
    assert (jac @ (sampler.samples().double() - lin.theta_star().double()).T).abs().max() < 1e-4
    # ... and move off them elsewhere, proportionally to gamma.
    assert sampler.history[-1] < 1e-8 < sampler.history[0]


def test_last_layer_weights_only_keeps_the_bias_and_projects_the_weights():
    model, x = _net(hidden=16), _inputs()
    lin = LastLayerLinearization(model, lambda b: b)
    jac = _last_layer_jacobian(model, x)
    n_w = lin.n_weights
    sampler = LeastSquaresLogitSampler(lin, n_samples=3, epochs=6000, lr=_lr(jac[:, :n_w], 8, 3),
                                       perturb="weights", gamma=2.0).fit([x])
    z = sampler.samples().double() - lin.theta_star().double()
    assert torch.equal(sampler.eps[:, n_w:], torch.zeros(3, lin.n_params - n_w))
    assert torch.equal(z[:, n_w:], torch.zeros(3, lin.n_params - n_w, dtype=torch.float64))
    expected = 2.0 * _null_space_projection(jac[:, :n_w], sampler.eps[:, :n_w])
    assert torch.allclose(z[:, :n_w], expected, atol=1e-4)


def test_full_network_sample_converges_to_the_null_space_projection():
    model, x = _net(d_out=2), _inputs(n=6)
    lin = FullNetworkLinearization(model, lambda b: b)
    jac = _full_jacobian(model, x)  # (12, 32)
    sampler = LeastSquaresLogitSampler(lin, n_samples=3, epochs=2000, lr=_lr(jac, 6, 2), gamma=0.05,
                                       seed=1).fit([x])
    expected = lin.theta_star().double() + 0.05 * _null_space_projection(jac, sampler.eps)
    assert torch.allclose(sampler.samples().double(), expected, atol=1e-6)


def _reference_recursion(jac_batches, theta_star, start, epochs, lr, momentum, mask=None):
    """LinearSampling's loop written out with explicit Jacobians (rows of each batch, C)."""
    theta, buf = start.clone(), None
    for epoch in range(epochs):
        for jac, rows, c in jac_batches:
            g = (jac.T @ (jac @ (theta - theta_star).T)).T / (rows * c)
            g = g if mask is None else g * mask
            buf = g if epoch == 0 else momentum * buf + g
            theta = theta - lr * buf
    return theta


@pytest.mark.parametrize("glm", ["last_layer", "full"])
def test_minibatch_solve_follows_the_reference_recursion_for_any_gamma(glm):
    model, x = _net(), _inputs(n=12)
    batches = [x[:5], x[5:10], x[10:]]  # uneven batches: B differs in the 1 / (B C) factor
    if glm == "last_layer":
        lin, jacobian = LastLayerLinearization(model, lambda b: b), _last_layer_jacobian
    else:
        lin, jacobian = FullNetworkLinearization(model, lambda b: b), _full_jacobian
    sampler = LeastSquaresLogitSampler(lin, n_samples=2, epochs=4, lr=0.5, momentum=0.8, seed=5).fit(batches)
    jac_batches = [(jacobian(model, b), b.shape[0], 3) for b in batches]
    theta_star = lin.theta_star().double()
    for gamma in (1.0, 0.01, 3.0):
        start = theta_star + gamma * sampler.eps.double()
        expected = _reference_recursion(jac_batches, theta_star, start, epochs=4, lr=0.5, momentum=0.8)
        assert torch.allclose(sampler.samples(gamma).double(), expected, atol=1e-5, rtol=1e-4), gamma


def test_predict_scales_the_whole_linearised_logits():
    model, x = _net(), _inputs()
    lin = LastLayerLinearization(model, lambda b: b)
    sampler = LeastSquaresLogitSampler(lin, n_samples=3, epochs=2, gamma=0.5, scale=1.5).fit([x])
    jac = _last_layer_jacobian(model, x)
    with torch.no_grad():
        f = model(x).double()
    deviation = (jac @ (sampler.samples(0.5).double() - lin.theta_star().double()).T).T.reshape(3, 8, 3)
    expected = (1.5 * (f + deviation)).transpose(0, 1)  # (B, S, C)
    assert torch.allclose(sampler.predict(x).double(), expected, atol=1e-5)
    map_logits = model(x).detach()[:, None].expand(8, 3, 3)
    assert torch.allclose(sampler.predict(x, gamma=0.0, scale=2.0), 2.0 * map_logits, atol=1e-6)


def test_fit_leaves_the_network_and_global_rng_alone():
    model, x = _net(), _inputs()
    model.train()
    state = torch.random.get_rng_state()
    before = [p.detach().clone() for p in model.parameters()]
    LeastSquaresLogitSampler(FullNetworkLinearization(model, lambda b: b), n_samples=2, epochs=2).fit([x])
    assert torch.equal(torch.random.get_rng_state(), state)
    assert model.training and all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"n_samples": 0}, "n_samples and epochs"),
    ({"epochs": 0}, "n_samples and epochs"),
    ({"lr": 0.0}, "lr must be > 0"),
    ({"momentum": 1.0}, "momentum in"),
    ({"gamma": -1.0}, "gamma and scale"),
    ({"scale": 0.0}, "gamma and scale"),
    ({"perturb": "bias"}, "perturb must be"),
])
def test_bad_arguments_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LeastSquaresLogitSampler(LastLayerLinearization(_net(), lambda b: b), **kwargs)


def test_weights_only_needs_a_last_layer_and_predictions_need_a_fit():
    with pytest.raises(ValueError, match="LastLayerLinearization"):
        LeastSquaresLogitSampler(FullNetworkLinearization(_net(), lambda b: b), perturb="weights")
    sampler = LeastSquaresLogitSampler(LastLayerLinearization(_net(), lambda b: b))
    with pytest.raises(RuntimeError, match="fit"):
        sampler.predict(_inputs())
