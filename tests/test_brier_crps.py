"""BrierScore and EnsembleCRPS against scikit-learn, torchmetrics and closed forms."""

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.special import softmax
from scipy.stats import norm
from sklearn.metrics import brier_score_loss
from torchmetrics.regression import ContinuousRankedProbabilityScore

from ripieno.framework.metrics.uq import BrierScore, EnsembleCRPS


def _t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


# ---------------------------------------------------------------- Brier


def test_brier_matches_sklearn_multiclass_and_hand_form():
    rng = np.random.default_rng(0)
    logits, target = rng.normal(scale=2.0, size=(50, 4, 3)), rng.integers(0, 3, size=50)
    mean = softmax(logits, axis=-1).mean(1)  # the predictive mean over 4 samples
    hand = np.mean(((mean - np.eye(3)[target]) ** 2).sum(1))
    # scikit-learn >= 1.7 keeps the multiclass score unhalved ([0, 2]) by default.
    assert brier_score_loss(target, mean) == pytest.approx(hand)
    from_logits, from_probs = BrierScore("logits"), BrierScore("probs")
    for part in (slice(0, 20), slice(20, None)):
        from_logits.update(_t(logits[part]), _t(target[part], torch.long))
        from_probs.update(_t(softmax(logits[part], axis=-1)), _t(target[part], torch.long))
    assert from_logits.compute().item() == pytest.approx(hand, rel=1e-5)
    assert from_probs.compute().item() == pytest.approx(hand, rel=1e-5)


def test_brier_two_classes_is_twice_sklearns_binary_score():
    p1 = np.array([0.2, 0.7, 0.9, 0.4])
    y = np.array([0, 1, 1, 1])
    metric = BrierScore("probs")
    metric.update(_t(np.stack([1 - p1, p1], 1)), _t(y, torch.long))  # (B, C): one prediction
    assert metric.compute().item() == pytest.approx(2 * brier_score_loss(y, p1), rel=1e-6)
    assert metric.compute().item() == pytest.approx(
        brier_score_loss(y, np.stack([1 - p1, p1], 1), scale_by_half=False), rel=1e-6)


def test_brier_perfect_and_worst_predictions():
    metric = BrierScore("probs")
    metric.update(_t([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]), _t([0, 2], torch.long))
    assert metric.compute().item() == pytest.approx(1.0)  # (0 + 2) / 2


def test_brier_shards_merge_to_one_pass():
    rng = np.random.default_rng(1)
    logits, target = _t(rng.normal(size=(30, 3, 4))), _t(rng.integers(0, 4, size=30), torch.long)
    one, a, b = BrierScore(), BrierScore(), BrierScore()
    one.update(logits, target)
    a.update(logits[:11], target[:11])
    b.update(logits[11:], target[11:])
    a.merge_state(b)
    assert a.compute().item() == pytest.approx(one.compute().item(), rel=1e-6)


@pytest.mark.parametrize("call, match", [
    (lambda: BrierScore("probs").update(torch.randn(4, 3) * 5, torch.zeros(4, dtype=torch.long)), "logits"),
    (lambda: BrierScore().update(torch.randn(4, 3), torch.full((4,), 3)), r"\[0, 2\]"),
    (lambda: BrierScore().update(torch.randn(4, 3), torch.zeros(4)), "integer"),
    (lambda: BrierScore().update(torch.randn(4), torch.zeros(4, dtype=torch.long)), "classes"),
    (lambda: BrierScore("log"), "Unknown input kind"),
])
def test_brier_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------- CRPS


def _pairwise_crps(x, y):
    """E|X - y| - E|X - X'| / 2 over the empirical distribution, by brute force over pairs."""
    m = len(x)
    first = sum(abs(xi - y) for xi in x) / m
    second = sum(abs(a - b) for a, b in itertools.product(x, x)) / m**2
    return first - second / 2


def test_crps_matches_pairs_and_torchmetrics():
    rng = np.random.default_rng(2)
    preds, y = rng.normal(size=(25, 6)), rng.normal(size=25)
    expected = np.mean([_pairwise_crps(preds[i], y[i]) for i in range(25)])
    ours = EnsembleCRPS()
    ours.update(_t(preds[:, :, None]), _t(y))  # (B, M, 1): a regression module's member outputs
    reference = ContinuousRankedProbabilityScore()
    reference.update(_t(preds), _t(y))
    assert ours.compute().shape == ()
    assert ours.compute().item() == pytest.approx(expected, rel=1e-5)
    assert ours.compute().item() == pytest.approx(reference.compute().item(), rel=1e-6)


def test_crps_of_one_member_is_absolute_error_and_multi_output_flattens():
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(10, 1)), rng.normal(size=10)
    metric = EnsembleCRPS()
    metric.update(_t(x), _t(y))
    assert metric.compute().item() == pytest.approx(np.abs(x[:, 0] - y).mean(), rel=1e-6)
    preds, target = rng.normal(size=(8, 4, 2)), rng.normal(size=(8, 2))  # (B, M, D)
    multi = EnsembleCRPS()
    multi.update(_t(preds), _t(target))
    expected = np.mean([_pairwise_crps(preds[i, :, d], target[i, d]) for i in range(8) for d in range(2)])
    assert multi.compute().item() == pytest.approx(expected, rel=1e-5)


def test_crps_of_many_gaussian_draws_approaches_the_gaussian_closed_form():
    mu, sigma, y = 0.3, 1.5, np.array([-1.0, 0.0, 2.5])
    z = (y - mu) / sigma
    closed = sigma * (z * (2 * norm.cdf(z) - 1) + 2 * norm.pdf(z) - 1 / math.sqrt(math.pi))
    draws = norm.ppf((np.arange(4000) + 0.5) / 4000, loc=mu, scale=sigma)  # a 4000-member ensemble
    metric = EnsembleCRPS()
    metric.update(_t(np.tile(draws, (3, 1))), _t(y))
    assert metric.compute().item() == pytest.approx(closed.mean(), rel=2e-3)
    # The mixture form with one member is that closed form exactly.
    one = EnsembleCRPS()
    one.update(_t(np.full((3, 1), mu)), _t(y), noise_var=sigma**2)
    assert one.compute().item() == pytest.approx(closed.mean(), rel=1e-5)


def test_crps_gaussian_mixture_matches_monte_carlo_and_tends_to_the_ensemble():
    rng = np.random.default_rng(4)
    mu, y, noise = rng.normal(size=(4, 3)), rng.normal(size=4), 0.4
    metric = EnsembleCRPS()
    metric.update(_t(mu), _t(y), noise_var=noise)
    # Monte Carlo: many draws from each row's mixture, scored by the empirical CRPS.
    n = 3000
    comp = rng.integers(0, 3, size=(4, n))
    draws = np.take_along_axis(mu, comp, 1) + math.sqrt(noise) * rng.normal(size=(4, n))
    mc = ContinuousRankedProbabilityScore()
    mc.update(_t(draws), _t(y))
    assert metric.compute().item() == pytest.approx(mc.compute().item(), rel=3e-2)
    small, ensemble = EnsembleCRPS(), EnsembleCRPS()
    small.update(_t(mu), _t(y), noise_var=1e-10)
    ensemble.update(_t(mu), _t(y))
    assert small.compute().item() == pytest.approx(ensemble.compute().item(), abs=1e-4)


@pytest.mark.parametrize("call, match", [
    (lambda: EnsembleCRPS().update(torch.randn(4, 3, 2), torch.randn(4)), r"\(4, 'members'\)"),
    (lambda: EnsembleCRPS().update(torch.randn(4), torch.randn(4)), "members"),
    (lambda: EnsembleCRPS().update(torch.randn(4, 3), torch.randn(4), noise_var=-1.0), "positive"),
])
def test_crps_bad_inputs(call, match):
    with pytest.raises(ValueError, match=match):
        call()
