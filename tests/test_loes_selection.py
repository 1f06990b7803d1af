"""LOES layer selection: closed-form oracles (sklearn Ridge, Heron, leave-one-out) and planted layers."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

from ripieno.framework.loes import (
    SELECTORS,
    ScalarMix,
    fit_residualizer,
    isotropy,
    orthogonalize,
    redundancy,
    ridge_fit,
    ridge_loss,
    select_exhaustive,
    select_greedy_ridge,
    select_last_k,
    select_last_layer,
    select_layers,
    triangle_score,
)


def t64(a: np.ndarray) -> torch.Tensor:
    return torch.as_tensor(a, dtype=torch.float64)


def planted_layers(n: int = 400, d: int = 16, num_layers: int = 8, seed: int = 0):
    """Eight layers of Gaussian noise; the target lives on feature 0 of layer 2 and feature 3 of layer 5."""
    rng = np.random.default_rng(seed)
    layers = [rng.normal(size=(n, d)) for _ in range(num_layers)]
    signal_a, signal_b = layers[2][:, 0], layers[5][:, 3]
    return layers, signal_a, signal_b, rng


# ---------------------------------------------------------------- ridge probe


@pytest.mark.parametrize(("n", "d", "t"), [(60, 8, 3), (60, 8, 0), (30, 80, 2)])
def test_ridge_matches_sklearn(n, d, t):
    rng = np.random.default_rng(1)
    x = rng.normal(size=(n, d)) * rng.uniform(0.1, 3.0, size=d) + rng.normal(size=d)
    y = rng.normal(size=(n, t)) if t else rng.normal(size=n)
    y = y + 5.0
    lam = 0.7
    fit = ridge_fit(t64(x), t64(y), lam)
    reference = Ridge(alpha=lam, fit_intercept=True).fit(x, y)
    coef = fit.coef.numpy() if t else fit.coef.numpy()[:, 0]
    intercept = fit.intercept.numpy() if t else fit.intercept.numpy()[0]
    prediction = fit.predict(t64(x)).numpy().reshape(reference.predict(x).shape)
    np.testing.assert_allclose(coef, reference.coef_.T, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(intercept, reference.intercept_, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(prediction, reference.predict(x), rtol=1e-7, atol=1e-9)
    train = float(ridge_loss(t64(x), t64(y), lam))
    assert train == pytest.approx(np.mean((reference.predict(x) - y) ** 2), rel=1e-9)


def test_ridge_loo_loss_matches_refitting():
    rng = np.random.default_rng(2)
    n, d, lam = 25, 6, 0.3
    x, y = rng.normal(size=(n, d)), rng.normal(size=(n, 2))
    errors = []
    for i in range(n):
        keep = np.arange(n) != i
        model = Ridge(alpha=lam).fit(x[keep], y[keep])
        errors.append((model.predict(x[i : i + 1]) - y[i]) ** 2)
    loo = float(ridge_loss(t64(x), t64(y), lam, kind="loo"))
    assert loo == pytest.approx(float(np.mean(errors)), rel=1e-9)


# ---------------------------------------------------------------- orthogonalisation


def test_orthogonalised_candidate_is_orthogonal_to_selected_span():
    rng = np.random.default_rng(3)
    n = 200
    selected = rng.normal(size=(n, 10)) + 3.0
    selected[:, 9] = selected[:, 0] + selected[:, 1]  # rank-deficient span
    candidate = selected[:, :4] @ rng.normal(size=(4, 6)) + rng.normal(size=(n, 6)) + 1.0
    residual = orthogonalize(t64(candidate), t64(selected)).numpy()
    centred = selected - selected.mean(0)
    relative = np.linalg.norm(centred.T @ residual) / (np.linalg.norm(centred) * np.linalg.norm(residual))
    assert relative <= 1e-6
    # It is the least-squares residual: what remains of the independent noise part.
    np.testing.assert_allclose(residual.mean(0), 0.0, atol=1e-10)
    candidate_c = candidate - candidate.mean(0)
    lstsq = candidate_c - centred @ np.linalg.lstsq(centred, candidate_c, rcond=None)[0]
    np.testing.assert_allclose(residual, lstsq, atol=1e-9)
    # The fitted map reproduces it (and can be applied to new data).
    mapped = fit_residualizer(t64(candidate), t64(selected))(t64(candidate), t64(selected)).numpy()
    np.testing.assert_allclose(mapped, residual, atol=1e-9)


def test_candidate_inside_span_orthogonalises_to_zero():
    rng = np.random.default_rng(4)
    selected = rng.normal(size=(50, 5))
    inside = selected @ rng.normal(size=(5, 3))
    assert torch.count_nonzero(orthogonalize(t64(inside), t64(selected))) == 0


# ---------------------------------------------------------------- Iso, Red, Tri


def test_isotropy_is_one_for_isotropic_and_one_over_d_for_rank_one():
    rng = np.random.default_rng(5)
    d = 8
    isotropic = rng.normal(size=(20_000, d))
    assert float(isotropy(t64(isotropic))) == pytest.approx(1.0, abs=0.01)
    rank_one = rng.normal(size=(500, 1)) @ rng.normal(size=(1, d)) + 2.0
    assert float(isotropy(t64(rank_one))) == pytest.approx(1.0 / d, rel=1e-9)
    anisotropic = isotropic * np.linspace(0.1, 3.0, d)
    assert 1.0 / d < float(isotropy(t64(anisotropic))) < 0.9
    assert float(isotropy(torch.ones(10, d, dtype=torch.float64))) == 0.0
    # The public code's mean/std of eigenvalues is not bounded by 1.
    assert float(isotropy(t64(isotropic), kind="mean_std")) > 10.0


def test_redundancy_is_linear_cka_in_unit_interval():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(3000, 6))
    rotation = np.linalg.qr(rng.normal(size=(6, 6)))[0]
    assert float(redundancy(t64(x), t64(2.0 * x @ rotation + 1.0))) == pytest.approx(1.0, rel=1e-9)
    assert float(redundancy(t64(x), t64(rng.normal(size=(3000, 4))))) < 0.01
    y = x[:, :3] + rng.normal(size=(3000, 3))
    xc, yc = x - x.mean(0), y - y.mean(0)
    cka = np.linalg.norm(yc.T @ xc) ** 2 / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(yc.T @ yc))
    assert float(redundancy(t64(x), t64(y))) == pytest.approx(cka, rel=1e-9)
    # Gram-matrix path (N smaller than the widths) gives the same value.
    small_x, small_y = x[:10], y[:10] @ rng.normal(size=(3, 20))
    sx, sy = small_x - small_x.mean(0), small_y - small_y.mean(0)
    expected = np.linalg.norm(sy.T @ sx) ** 2 / (np.linalg.norm(sx.T @ sx) * np.linalg.norm(sy.T @ sy))
    assert float(redundancy(t64(small_x), t64(small_y))) == pytest.approx(expected, rel=1e-9)


def heron(p, q, r) -> float:
    a, b, c = np.linalg.norm(q - r), np.linalg.norm(p - r), np.linalg.norm(p - q)
    s = (a + b + c) / 2
    return math.sqrt(max(s * (s - a) * (s - b) * (s - c), 0.0))


@pytest.mark.parametrize("dim", [2, 3])
def test_triangle_score_equals_explicit_triangle_areas(dim):
    rng = np.random.default_rng(7)
    num_classes, n = 5, 300
    labels = np.arange(n) % num_classes
    x = rng.normal(size=(n, dim)) + 3.0 * rng.normal(size=(num_classes, dim))[labels]
    centroids = np.stack([x[labels == c].mean(0) for c in range(num_classes)])
    triples = list(itertools.combinations(range(num_classes), 3))
    areas = [heron(*centroids[list(t)]) for t in triples]
    if dim == 3:
        cross = [0.5 * np.linalg.norm(np.cross(centroids[b] - centroids[a], centroids[c] - centroids[a]))
                 for a, b, c in triples]
        np.testing.assert_allclose(areas, cross, rtol=1e-9)
    raw = float(triangle_score(t64(x), torch.as_tensor(labels), scale=1.0))
    assert raw == pytest.approx(np.mean(areas), rel=1e-9)
    # Default scale: centroids in units of sqrt(trace of the population covariance), so areas / s^2.
    s2 = np.trace(np.cov(x.T, bias=True))
    scaled = float(triangle_score(t64(x), torch.as_tensor(labels)))
    assert scaled == pytest.approx(np.mean(areas) / s2, rel=1e-9)
    assert float(triangle_score(t64(x), torch.as_tensor(labels % 2))) == 0.0  # fewer than 3 classes


def test_triangle_score_samples_distinct_triples_reproducibly():
    rng = np.random.default_rng(8)
    labels = torch.arange(600) % 30
    x = t64(rng.normal(size=(600, 4)) + 2.0 * rng.normal(size=(30, 4))[labels.numpy()])
    first = triangle_score(x, labels, max_triples=500, seed=1)
    assert float(first) == float(triangle_score(x, labels, max_triples=500, seed=1))
    exact = triangle_score(x, labels, max_triples=10_000)  # all 4060 triples
    assert float(first) == pytest.approx(float(exact), rel=0.1)


# ---------------------------------------------------------------- selection on planted layers


def test_loes_finds_both_planted_layers_regression():
    layers, a, b, rng = planted_layers()
    y = a + b + 0.1 * rng.normal(size=a.shape)
    result = select_layers(layers, y, k=2)
    assert set(result.layers) == {2, 5}
    assert result.task == "regression"
    assert set(select_exhaustive(layers, y, k=2).layers) == {2, 5}
    assert set(select_exhaustive(layers, y, k=2, loss="loo").layers) == {2, 5}
    assert set(select_layers(layers, y, k=2, loss="loo", iso="mean_std", alpha=0.0).layers) == {2, 5}
    table = result.scores
    assert len(table) == 8 + 7 and table["selected"].sum() == 2
    step1 = table[table.step == 1]
    losses = step1.set_index("selected")["ridge_loss"]
    assert losses[True] < 0.5 * losses[False].min()
    assert table[["iso", "red"]].stack().dropna().between(0, 1).all()
    assert table.loc[table.step == 0, "red"].isna().all() and table["tri"].isna().all()
    assert result.fused.shape == (400, 32)


def test_loes_finds_both_planted_layers_classification():
    layers, a, b, _ = planted_layers(n=600)
    labels = (a > 0).astype(int) + 2 * (b > 0)  # four classes
    result = select_layers(layers, labels, k=2)
    assert result.task == "classification" and set(result.layers) == {2, 5}
    assert set(select_exhaustive(layers, labels, k=2).layers) == {2, 5}
    tri = result.scores.loc[result.scores.step == 1, "tri"]
    assert tri.notna().all() and (tri >= 0).all()


def greedy_ridge_direct(layers, y, k, lam):
    """Greedy ridge selection written out with sklearn and numpy least squares."""
    chosen, losses = [], []
    for _ in range(k):
        if chosen:
            s = np.hstack([layers[i] for i in chosen])
            target = y - Ridge(alpha=lam).fit(s, y).predict(s)
            sc = s - s.mean(0)
        best = None
        for layer, x in enumerate(layers):
            if layer in chosen:
                continue
            if chosen:
                xc = x - x.mean(0)
                features = xc - sc @ np.linalg.lstsq(sc, xc, rcond=None)[0]
            else:
                features, target = x, y
            loss = np.mean((Ridge(alpha=lam).fit(features, target).predict(features) - target) ** 2)
            if best is None or loss < best[1]:
                best = (layer, loss)
        chosen.append(best[0])
        losses.append(best[1])
    return chosen, losses


def test_greedy_ridge_baseline_matches_direct_implementation():
    rng = np.random.default_rng(9)
    n, d = 150, 5
    base = rng.normal(size=(n, 4))
    layers = [base @ rng.normal(size=(4, d)) * 0.3 + rng.normal(size=(n, d)) for _ in range(6)]
    y = np.stack([layers[1][:, 0] + 0.5 * layers[4][:, 2], layers[3][:, 1] - base[:, 0]], 1)
    y = y + 0.3 * rng.normal(size=y.shape)
    lam = 0.5
    result = select_greedy_ridge(layers, y, k=3, lam=lam)
    chosen, losses = greedy_ridge_direct(layers, y, 3, lam)
    assert result.layers == chosen
    picked = result.scores[result.scores.selected].sort_values("step")
    np.testing.assert_allclose(picked["ridge_loss"], losses, rtol=1e-7)
    np.testing.assert_allclose(picked["total"], losses, rtol=1e-7)
    assert result.method == "greedy_ridge"


def test_label_free_and_fixed_baselines_share_the_result_api():
    layers, a, b, _ = planted_layers(n=120)
    layers[6] = layers[6] * np.linspace(0.01, 1.0, 16)  # strongly anisotropic layer is avoided
    free = select_layers(layers, None, k=3)
    assert free.task == "label_free" and len(set(free.layers)) == 3 and 6 not in free.layers
    assert free.scores["ridge_loss"].isna().all()
    assert select_last_layer(layers).layers == [7]
    assert select_last_k(layers, a, k=3).layers == [5, 6, 7]
    for name, selector in SELECTORS.items():
        result = selector(layers, a + b, k=2)
        assert result.method == name and 1 <= len(result.layers) <= 2


def test_transform_reuses_calibration_maps():
    layers, a, b, rng = planted_layers(n=300)
    y = a + b
    result = select_layers(layers, y, k=3, orthogonal=True)
    fused = result.fused.numpy()
    blocks = np.split(fused, 3, axis=1)
    for i, j in itertools.combinations(range(3), 2):
        scale = np.linalg.norm(blocks[i]) * np.linalg.norm(blocks[j])
        assert np.abs(blocks[i].T @ blocks[j]).max() < 1e-8 * scale
    np.testing.assert_allclose(result.transform(layers).numpy(), fused, atol=1e-10)
    concat = result.transform([layer[:7] for layer in layers], orthogonal=False).numpy()
    np.testing.assert_allclose(concat, np.hstack([layers[i][:7] for i in result.layers]))
    with pytest.raises(ValueError, match="widths"):
        result.transform(layers[:-1])


@pytest.mark.parametrize("variant", ["ripieno", "reference"])
@pytest.mark.parametrize("transform_first", [False, True])
def test_fused_is_built_when_first_read_and_equals_the_transform(variant, transform_first):
    """Oracle: the transform of the calibration layers themselves, and their plain concatenation."""
    layers, a, b, _ = planted_layers(n=200)
    layers = [torch.from_numpy(layer).float() for layer in layers]
    result = select_layers(layers, a + b, k=3, variant=variant, orthogonal=True)
    assert result._fused is None  # nothing fused while selecting
    if transform_first:  # the residualizers fitted first must not take the calibration away
        result.transform(layers)
    fused = result.fused
    assert result.fused is fused  # built once
    torch.testing.assert_close(fused, result.transform(layers), rtol=0, atol=0)
    concat = torch.cat([layers[i] for i in result.layers], dim=1).to(fused.dtype)
    torch.testing.assert_close(result.transform(layers, orthogonal=False), concat, rtol=0, atol=0)
    assert result._calibration is None  # released once both are built


@pytest.mark.parametrize("orthogonal", [False, True])
def test_float32_layers_select_and_fuse_as_their_float64_conversion(orthogonal):
    """Narrower layers are converted where they are read; oracle: the same run on float64 copies."""
    layers, a, b, _ = planted_layers(n=300)
    narrow = [torch.from_numpy(layer).float() for layer in layers]
    wide = [layer.double() for layer in narrow]
    y = a + b
    result = select_layers(narrow, y, k=3, orthogonal=orthogonal)
    expected = select_layers(wide, y, k=3, orthogonal=orthogonal)
    assert result.layers == expected.layers and result.fused.dtype == torch.float64
    np.testing.assert_allclose(result.scores["total"], expected.scores["total"], rtol=1e-12)
    torch.testing.assert_close(result.fused, expected.fused, rtol=1e-12, atol=1e-12)
    test = [layer[:11] for layer in narrow]
    torch.testing.assert_close(result.transform(test), expected.transform([t.double() for t in test]),
                               rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- input errors


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda ls, y: ([ls[0][:-1], *ls[1:]], y, {}), "samples but layer 0"),
        (lambda ls, y: ([np.where(np.eye(*ls[0].shape) > 0, np.nan, ls[0]), *ls[1:]], y, {}), "NaN or inf"),
        (lambda ls, y: (ls, y, {"k": 9}), "exceeds the 8 layers"),
        (lambda ls, y: (ls, (y > 0).astype(int) + 1, {}), "0..C-1"),
        (lambda ls, y: (ls, y[:-1], {}), "rows but the layers"),
        (lambda ls, y: (ls, y, {"lam": 0.0}), "lam"),
        (lambda ls, y: (ls, y, {"task": "label_free"}), "no targets"),
        (lambda ls, y: ([ls[0][:, 0], *ls[1:]], y, {}), "each layer must be"),
    ],
)
def test_bad_inputs_name_problem_and_fix(edit, match):
    layers, a, b, _ = planted_layers(n=40, d=4)
    args_layers, y, kwargs = edit(layers, a + b)
    with pytest.raises(ValueError, match=match):
        select_layers(args_layers, y, **{"k": 2, **kwargs})


def test_baselines_refuse_what_they_cannot_do():
    layers, a, _, _ = planted_layers(n=40, d=4)
    with pytest.raises(ValueError, match="needs targets y"):
        select_greedy_ridge(layers, None, k=2)
    with pytest.raises(ValueError, match="max_subsets"):
        select_exhaustive(layers, a, k=4, max_subsets=100)


# ---------------------------------------------------------------- ScalarMix


def test_scalar_mix_weights_and_equal_logit_mean():
    torch.manual_seed(0)
    layers = [torch.randn(4, 3, 5) for _ in range(6)]
    mix = ScalarMix(6, initial_logits=torch.randn(6).tolist())
    assert float(mix.weights.detach().sum()) == pytest.approx(1.0, abs=1e-6)
    assert (mix.weights > 0).all()
    equal = ScalarMix(6, initial_gamma=2.5)
    expected = 2.5 * torch.stack(layers).mean(0)
    torch.testing.assert_close(equal(layers), expected)
    torch.testing.assert_close(equal(torch.stack(layers)), expected)
    equal(layers).sum().backward()
    assert equal.scalar_parameters.grad is not None and equal.gamma.grad is not None
    with pytest.raises(ValueError, match="built for 6 layers"):
        equal(layers[:5])
