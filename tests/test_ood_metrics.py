"""OOD scores, detection and selective-prediction metrics against closed forms and scikit-learn.

Oracles: numpy on hand-made member outputs (scores), ``sklearn.metrics`` ``roc_curve`` /
``roc_auc_score`` / ``average_precision_score`` on seeded data with ties (detection), and risk
coverage values computed by hand or from identities derived in the comments (selective prediction).
"""

from __future__ import annotations

import ast
import itertools
import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score, roc_curve
from torchmetrics.utilities import dim_zero_cat

from ripieno.framework.errors import RipienoInputError
from ripieno.framework.metrics.ood import (
    AUGRC,
    AURC,
    OODAUROC,
    AUPRIn,
    AUPROut,
    FPRAtTPR,
    OODInputError,
    augrc,
    aupr_in,
    aupr_out,
    aurc,
    energy_score,
    fpr_at_tpr,
    max_softmax_uncertainty,
    member_disagreement,
    member_variance,
    mutual_information,
    ood_auroc,
    predictive_entropy,
    risk_at_coverage,
    risk_coverage_curve,
)

ROOT = Path(__file__).resolve().parents[1]

# Two rows, two members, three classes.
PROBS = np.array([
    [[0.7, 0.2, 0.1], [0.5, 0.3, 0.2]],  # both members vote 0; mean (0.6, 0.25, 0.15)
    [[0.1, 0.8, 0.1], [0.6, 0.1, 0.3]],  # votes 1 and 0; mean (0.35, 0.45, 0.2) votes 1
])


def _entropy(p: np.ndarray) -> np.ndarray:
    return -(p * np.log(p)).sum(-1)


def _t(x: np.ndarray, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.tensor(x, dtype=dtype)


# ------------------------------------------------------------------------------------------------ scores
def test_scores_match_closed_forms_on_a_hand_made_example():
    probs = _t(PROBS)
    mean = PROBS.mean(1)
    np.testing.assert_allclose(max_softmax_uncertainty(probs).numpy(), [0.4, 0.55], atol=1e-12)
    np.testing.assert_allclose(predictive_entropy(probs).numpy(), _entropy(mean), atol=1e-12)
    np.testing.assert_allclose(mutual_information(probs).numpy(),
                               _entropy(mean) - _entropy(PROBS).mean(1), atol=1e-12)
    np.testing.assert_allclose(member_disagreement(probs).numpy(), [0.0, 0.5], atol=0)
    np.testing.assert_allclose(member_variance(probs).numpy(), PROBS.var(1).mean(-1), atol=1e-12)
    # row 0, class 0: members 0.7 and 0.5 around 0.6: variance 0.01; classes 1, 2: 0.0025 each
    assert member_variance(probs)[0].item() == pytest.approx((0.01 + 0.0025 + 0.0025) / 3, abs=1e-12)


def test_scores_keep_float32_and_match_in_float32():
    probs = _t(PROBS, torch.float32)
    for score in (max_softmax_uncertainty, predictive_entropy, mutual_information, member_disagreement,
                  member_variance):
        out = score(probs)
        assert out.dtype == torch.float32 and out.shape == (2,)
        np.testing.assert_allclose(out.numpy(), score(_t(PROBS)).numpy(), atol=1e-6)


def test_energy_score_is_liu_energy_of_the_mean_logit_higher_for_ood():
    logits = np.array([[[2.0, 0.0, -1.0], [4.0, 1.0, 0.0]], [[0.3, 0.1, 0.2], [0.1, 0.2, 0.3]]])
    mean = logits.mean(1)
    expected = -np.log(np.exp(mean).sum(-1))  # E(x) = -T log sum_c exp(f_c / T), T = 1
    np.testing.assert_allclose(energy_score(_t(logits)).numpy(), expected, atol=1e-12)
    expected_t2 = -2.0 * np.log(np.exp(mean / 2.0).sum(-1))
    np.testing.assert_allclose(energy_score(_t(logits), temperature=2.0).numpy(), expected_t2, atol=1e-12)
    # Not the mean of member energies (logsumexp is convex, so that one is larger in magnitude).
    member_energy = -np.log(np.exp(logits).sum(-1)).mean(1)
    assert not np.allclose(expected, member_energy)
    # The confident row (large logit margin) has the lower energy: higher = more OOD.
    scores = energy_score(_t(logits))
    assert scores[0] < scores[1]


def test_one_member_has_no_epistemic_spread():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4), size=(6, 1))
    t = _t(probs)
    assert torch.equal(mutual_information(t), torch.zeros(6, dtype=torch.float64))
    assert torch.equal(member_disagreement(t), torch.zeros(6, dtype=torch.float64))
    assert torch.equal(member_variance(t), torch.zeros(6, dtype=torch.float64))
    np.testing.assert_allclose(max_softmax_uncertainty(t).numpy(), 1 - probs[:, 0].max(-1), atol=1e-12)
    np.testing.assert_allclose(predictive_entropy(t).numpy(), _entropy(probs[:, 0]), atol=1e-12)


def test_one_hot_members_give_finite_entropy():
    probs = _t(np.array([[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]))
    assert predictive_entropy(probs).item() == pytest.approx(math.log(2), abs=1e-12)
    assert mutual_information(probs).item() == pytest.approx(math.log(2), abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mutual_information_identity(seed):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.full(5, 0.5), size=(40, 4))
    t = _t(probs)
    mi = mutual_information(t).numpy()
    expected = _entropy(probs.mean(1)) - _entropy(probs).mean(1)
    np.testing.assert_allclose(mi, expected, atol=1e-12)
    assert (mi >= 0).all() and (expected >= -1e-12).all()  # Jensen: entropy is concave
    # H(pbar) = MI + mean_m H(p_m): total = epistemic + aleatoric
    np.testing.assert_allclose(predictive_entropy(t).numpy(), mi + _entropy(probs).mean(1), atol=1e-12)
    agree = _t(np.repeat(probs[:, :1], 4, axis=1))  # every member the same distribution
    np.testing.assert_allclose(mutual_information(agree).numpy(), 0.0, atol=1e-12)


def test_member_variance_of_regression_predictions_is_ddof_zero():
    rng = np.random.default_rng(3)
    preds = rng.normal(size=(7, 5))
    np.testing.assert_allclose(member_variance(_t(preds)).numpy(), preds.var(1, ddof=0), atol=1e-12)
    assert member_variance(torch.tensor([[1.0, 3.0]])).item() == 1.0


# --------------------------------------------------------------------------------------------- detection
def _detection_data(seed: int, n: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Scores with many ties (one decimal) and both labels present."""
    rng = np.random.default_rng(seed)
    labels = (rng.random(n) < 0.3).astype(np.int64)
    labels[:2] = [0, 1]
    scores = np.round(rng.normal(size=n) + labels, 1)
    assert len(np.unique(scores)) < n  # ties present
    return scores, labels


def _fpr_oracle(scores: np.ndarray, labels: np.ndarray, target: float) -> float:
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    return float(fpr[tpr >= target].min())


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("target", [0.95, 0.8, 0.5, 1.0, 0.3])
def test_fpr_at_tpr_matches_sklearn_roc_curve(seed, target):
    scores, labels = _detection_data(seed)
    got = fpr_at_tpr(_t(scores), torch.tensor(labels), tpr=target)
    assert got.item() == pytest.approx(_fpr_oracle(scores, labels, target), abs=1e-7)


def test_fpr_at_tpr_uses_every_roc_point_not_sklearns_dropped_curve():
    # Three tie groups, each one OOD and one ID row: ROC points (0, 0), (1/3, 1/3), (2/3, 2/3), (1, 1).
    # (2/3, 2/3) is collinear with its neighbours, so roc_curve's default drop_intermediate=True drops it
    # and the same rule would then give 1 instead of 2/3. (Without ties no dropped point changes the rule.)
    scores, labels = np.array([3.0, 3.0, 2.0, 2.0, 1.0, 1.0]), np.array([1, 0, 1, 0, 1, 0])
    assert fpr_at_tpr(_t(scores), torch.tensor(labels), tpr=0.5).item() == pytest.approx(2 / 3)
    assert _fpr_oracle(scores, labels, 0.5) == pytest.approx(2 / 3)
    fpr, tpr, _ = roc_curve(labels, scores)  # drop_intermediate=True
    assert fpr[tpr >= 0.5].min() == 1.0


def test_fpr_at_tpr_compares_tpr_exactly_at_the_target():
    # 20 OOD rows: TPR 19/20 is the float64 0.95 (float32 would round it below 0.95).
    labels = np.array([1] * 20 + [0] * 20)
    scores = np.concatenate([np.arange(40, 21, -1.0), [0.0], np.arange(21, 1, -1.0)])
    # OOD rows 40..22 (19 of them), then ID 21..2, the last OOD row at 0: TPR 0.95 before any ID row.
    assert fpr_at_tpr(_t(scores), torch.tensor(labels), tpr=0.95).item() == 0.0
    assert _fpr_oracle(scores, labels, 0.95) == 0.0
    assert fpr_at_tpr(_t(scores), torch.tensor(labels), tpr=1.0).item() == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_auroc_and_aupr_match_sklearn_with_ties(seed):
    scores, labels = _detection_data(seed)
    s, y = _t(scores), torch.tensor(labels)
    assert ood_auroc(s, y).item() == pytest.approx(roc_auc_score(labels, scores), abs=1e-6)
    assert aupr_out(s, y).item() == pytest.approx(average_precision_score(labels, scores), abs=1e-6)
    assert aupr_in(s, y).item() == pytest.approx(average_precision_score(1 - labels, -scores), abs=1e-6)


def test_large_scores_are_not_squashed_into_ties():
    # torchmetrics applies a sigmoid to scores outside [0, 1]; in float32 sigmoid(20) == sigmoid(30) == 1.
    scores = np.array([20.0, 25.0, 30.0, 35.0, -40.0, -45.0])
    labels = np.array([0, 1, 0, 1, 0, 1])
    s, y = torch.tensor(scores, dtype=torch.float32), torch.tensor(labels)
    assert ood_auroc(s, y).item() == pytest.approx(roc_auc_score(labels, scores), abs=1e-6)
    assert aupr_out(s, y).item() == pytest.approx(average_precision_score(labels, scores), abs=1e-6)
    assert aupr_in(s, y).item() == pytest.approx(average_precision_score(1 - labels, -scores), abs=1e-6)


def test_bool_and_float_labels_are_accepted():
    scores, labels = _detection_data(7, n=50)
    expected = roc_auc_score(labels, scores)
    for y in (torch.tensor(labels).bool(), torch.tensor(labels, dtype=torch.float32)):
        assert ood_auroc(_t(scores), y).item() == pytest.approx(expected, abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_detection_metric_classes_equal_the_functions_after_batches(seed):
    scores, labels = _detection_data(seed)
    pairs = [(FPRAtTPR(), fpr_at_tpr), (FPRAtTPR(tpr=0.8), lambda s, y: fpr_at_tpr(s, y, 0.8)),
             (OODAUROC(), ood_auroc), (AUPROut(), aupr_out), (AUPRIn(), aupr_in)]
    for metric, function in pairs:
        for batch in np.split(np.arange(len(scores)), [37, 150]):
            metric.update(torch.tensor(scores[batch], dtype=torch.float32), torch.tensor(labels[batch]))
        expected = function(torch.tensor(scores, dtype=torch.float32), torch.tensor(labels))
        assert metric.compute().item() == expected.item()
        metric.reset()
        metric.update(torch.tensor([1.0, 0.0]), torch.tensor([1, 0]))
        assert metric.compute().item() == (0.0 if isinstance(metric, FPRAtTPR) else 1.0)


def test_metric_flags_follow_torchmetrics_conventions():
    for cls, better in ((FPRAtTPR, False), (OODAUROC, True), (AUPROut, True), (AUPRIn, True), (AURC, False),
                        (AUGRC, False)):
        assert cls.higher_is_better is better and cls.full_state_update is False
        assert cls.is_differentiable is False
        reductions = cls()._reductions  # every state is gathered across ranks by concatenation
        assert len(reductions) == 2 and all(fx is dim_zero_cat for fx in reductions.values())


# ------------------------------------------------------------------------------------ selective prediction
def test_risk_coverage_on_a_five_row_example_by_hand():
    uncertainty = torch.tensor([0.3, 0.1, 0.5, 0.2, 0.4])
    loss = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0])
    # Sorted by uncertainty: losses 0, 0, 1, 0, 1; cumulative 0, 0, 1, 1, 2.
    coverage, risk = risk_coverage_curve(uncertainty, loss)
    np.testing.assert_allclose(coverage.numpy(), [0.2, 0.4, 0.6, 0.8, 1.0], atol=1e-7)
    np.testing.assert_allclose(risk.numpy(), [0, 0, 1 / 3, 1 / 4, 2 / 5], atol=1e-7)
    # AURC = (0 + 0 + 1/3 + 1/4 + 2/5) / 5 = 59/300; AUGRC, trapezoids of L / n from (0, 0):
    # (0 + 0 + 1/2 + 1 + 3/2) / 5 / 5 = 3/25.
    assert aurc(uncertainty, loss).item() == pytest.approx(float(Fraction(59, 300)), abs=1e-7)
    assert augrc(uncertainty, loss).item() == pytest.approx(0.12, abs=1e-7)
    assert risk_at_coverage(uncertainty, loss, 0.6).item() == pytest.approx(1 / 3, abs=1e-7)
    assert risk_at_coverage(uncertainty, loss, 0.5).item() == pytest.approx(1 / 3, abs=1e-7)  # k = 3
    assert risk_at_coverage(uncertainty, loss, 0.4).item() == 0.0
    assert risk_at_coverage(uncertainty, loss, 1.0).item() == pytest.approx(0.4, abs=1e-7)


def test_tied_uncertainties_share_their_group_mean_loss():
    uncertainty = torch.tensor([0.1, 0.2, 0.2, 0.2, 0.3])
    loss = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0])
    # The tie group {0.2} holds loss 1 over 3 rows: cumulative 0, 1/3, 2/3, 1, 2.
    _, risk = risk_coverage_curve(uncertainty, loss)
    np.testing.assert_allclose(risk.numpy(), [0, 1 / 6, 2 / 9, 1 / 4, 2 / 5], atol=1e-7)
    # The same losses in any order inside the group give the same curve.
    _, again = risk_coverage_curve(uncertainty, torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0]))
    assert torch.equal(risk, again)


def _all_orders(loss: np.ndarray, metric) -> list[float]:  # noqa: ANN001
    """The metric under every strict ranking of the rows (uncertainty = rank)."""
    return [metric(torch.tensor(np.array(p), dtype=torch.float64), _t(loss)).item()
            for p in itertools.permutations(range(len(loss)))]


def test_aurc_of_the_best_ranking_has_the_closed_form_and_is_the_minimum():
    n, e = 5, 2
    loss = np.array([1.0, 0.0, 1.0, 0.0, 0.0])
    # Best ranking: the n - e correct rows first; risk (k - (n - e)) / k after them.
    best = sum(max(0, k - (n - e)) / k for k in range(1, n + 1)) / n
    assert best == pytest.approx((1 / 4 + 2 / 5) / 5)  # = 0.13
    harmonic = sum(1 / k for k in range(n - e + 1, n + 1))  # H_n - H_{n-e}
    assert best == pytest.approx((e - (n - e) * harmonic) / n)
    errors_last = _t(loss + np.arange(n) * 1e-3)  # every error less certain than every correct row
    assert aurc(errors_last, _t(loss)).item() == pytest.approx(best, abs=1e-7)
    assert min(_all_orders(loss, aurc)) == pytest.approx(best, abs=1e-7)


def test_uninformative_ranking_gives_the_expectation_over_random_orders():
    n, e = 5, 2
    loss = np.array([1.0, 0.0, 1.0, 0.0, 0.0])
    tied = torch.zeros(n, dtype=torch.float64)  # every row tied: the expectation over all orders
    # E[L(k)] = k e / n, so AURC = e / n and AUGRC = (1/n^2) sum_k (2k - 1) e / (2n) = e / (2 n).
    assert aurc(tied, _t(loss)).item() == pytest.approx(e / n, abs=1e-7)
    assert augrc(tied, _t(loss)).item() == pytest.approx(e / (2 * n), abs=1e-7)
    assert np.mean(_all_orders(loss, aurc)) == pytest.approx(e / n, abs=1e-7)
    assert np.mean(_all_orders(loss, augrc)) == pytest.approx(e / (2 * n), abs=1e-7)
    # The best AUGRC: errors at positions n - e + 1..n, L(k) = max(0, k - (n - e)): e^2 / (2 n^2).
    assert min(_all_orders(loss, augrc)) == pytest.approx(e**2 / (2 * n**2), abs=1e-7)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_augrc_identity_with_the_failure_auroc(seed):
    # For 0/1 losses: sum_k L(k) = sum over errors of (n - position + 1) = e n - e (e - 1) / 2 - X, with X
    # the (error, correct) pairs ranked right (correct more certain), so that with r = e / n and
    # A = X / (e (n - e)) the failure AUROC, the trapezoids (which take L(n) / (2 n^2) = r / (2 n) off the
    # sum over k) give AUGRC = r - r^2 / 2 - r (1 - r) A. Tie groups give the expectation over orders, where
    # X counts tied pairs half: sklearn's AUROC with ties.
    rng = np.random.default_rng(seed)
    n = 120
    errors = (rng.random(n) < 0.25).astype(np.float64)
    errors[:2] = [0.0, 1.0]
    uncertainty = np.round(rng.normal(size=n) + errors, 1)
    r = errors.mean()
    a = roc_auc_score(errors, uncertainty)
    expected = r - r**2 / 2 - r * (1 - r) * a
    assert augrc(_t(uncertainty), _t(errors)).item() == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize("seed", [0, 1])
def test_augrc_is_traub_et_als_trapezoid_from_the_origin(seed):
    # Traub et al.'s code: the trapezoid under the generalized risk over the group ends, from (0, 0).
    rng = np.random.default_rng(seed)
    n = 60
    loss = rng.exponential(size=n)
    uncertainty = np.round(rng.normal(size=n), 1)
    order = np.argsort(uncertainty, kind="stable")
    u, cum = uncertainty[order], np.cumsum(loss[order])
    ends = np.r_[np.flatnonzero(u[1:] != u[:-1]), n - 1]
    coverage = np.r_[0.0, (ends + 1) / n]
    generalized = np.r_[0.0, cum[ends] / n]
    trapezoid = float(np.sum(np.diff(coverage) * (generalized[1:] + generalized[:-1]) / 2))
    got = augrc(_t(uncertainty), _t(loss)).item()
    assert got == pytest.approx(trapezoid, abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_selective_metrics_match_a_direct_numpy_computation_without_ties(seed):
    rng = np.random.default_rng(seed)
    n = 50
    loss, uncertainty = rng.exponential(size=n), rng.normal(size=n)
    cum = np.cumsum(loss[np.argsort(uncertainty)])
    k = np.arange(1, n + 1)
    coverage, risk = risk_coverage_curve(_t(uncertainty), _t(loss))
    np.testing.assert_allclose(coverage.numpy(), k / n, rtol=1e-6)
    np.testing.assert_allclose(risk.numpy(), cum / k, rtol=1e-6)
    assert aurc(_t(uncertainty), _t(loss)).item() == pytest.approx(np.mean(cum / k), rel=1e-6)
    trapezoids = (np.r_[0.0, cum[:-1]] + cum) / 2 / n
    assert augrc(_t(uncertainty), _t(loss)).item() == pytest.approx(np.mean(trapezoids), rel=1e-6)
    assert risk_at_coverage(_t(uncertainty), _t(loss), 0.7).item() == pytest.approx(cum[34] / 35, rel=1e-6)


def test_risk_at_coverage_picks_the_smallest_k_reaching_the_coverage_despite_rounding():
    loss = torch.tensor([0.0] * 7 + [1.0] * 18)
    uncertainty = torch.arange(25.0)
    assert 0.28 * 25 > 7  # float rounding: a plain ceil would take k = 8
    assert risk_at_coverage(uncertainty, loss, 0.28).item() == 0.0
    assert risk_at_coverage(uncertainty, loss, 0.29).item() == pytest.approx(1 / 8)
    assert risk_at_coverage(uncertainty, loss, 0.01).item() == 0.0  # at least one row


@pytest.mark.parametrize("seed", [0, 1])
def test_selective_metric_classes_equal_the_functions_after_batches(seed):
    rng = np.random.default_rng(seed)
    uncertainty = np.round(rng.normal(size=90), 1)
    loss = (rng.random(90) < 0.3).astype(np.float64)
    for metric, function in ((AURC(), aurc), (AUGRC(), augrc)):
        for batch in np.split(np.arange(90), [10, 55]):
            metric.update(torch.tensor(uncertainty[batch], dtype=torch.float32),
                          torch.tensor(loss[batch], dtype=torch.float32))
        u32, loss32 = torch.tensor(uncertainty, dtype=torch.float32), torch.tensor(loss, dtype=torch.float32)
        expected = function(u32, loss32)
        assert metric.compute().item() == expected.item()


# ----------------------------------------------------------------------------------------------- bad input
_GOOD = torch.tensor([[[0.5, 0.5], [0.2, 0.8]], [[1.0, 0.0], [0.0, 1.0]]])
_NAN = _GOOD.clone()
_NAN[0, 0, 0] = float("nan")
_UNNORMALISED = _GOOD.clone()
_UNNORMALISED[1, 0] = torch.tensor([1.0, 0.2])
_SCORES = torch.tensor([0.3, 0.2, 0.1])

SHAPE = "expected shape (n, members, classes) with members >= 1 and classes >= 2"
NOT_FINITE = "values are NaN or infinite; drop or fix those rows first."
BOTH = "needs OOD and in-distribution rows, so add"

BAD_INPUTS = {
    "two-d probs": (
        lambda: predictive_entropy(torch.full((4, 3), 1 / 3)),
        f"probs: {SHAPE}, got (4, 3); for a single model add the members axis: probs.unsqueeze(1)."),
    "one class": (
        lambda: max_softmax_uncertainty(torch.ones(4, 2, 1)),
        f"probs: {SHAPE}, got (4, 2, 1); reshape probs to (n, members, classes)."),
    "no members": (
        lambda: mutual_information(torch.ones(4, 0, 3)),
        f"probs: {SHAPE}, got (4, 0, 3); reshape probs to (n, members, classes)."),
    "integer probs": (
        lambda: member_disagreement(torch.ones(2, 2, 2, dtype=torch.long)),
        "probs: expected a floating-point tensor, got torch.int64; pass probs.float()."),
    "nan probs": (lambda: mutual_information(_NAN), f"probs: 1 of 8 {NOT_FINITE}"),
    "logits as probs": (
        lambda: predictive_entropy(torch.tensor([[[-1.0, 2.0]]])),
        "probs: probabilities must lie in [0, 1], got values in [-1, 2]; "
        "pass softmax probabilities (or logits to energy_score)."),
    "rows not summing to 1": (
        lambda: member_variance(_UNNORMALISED),
        "preds: each (row, member) must sum to 1 within 0.0001, but 1 of 4 do (worst sums to 1.2); "
        "normalise over the last axis (softmax of the logits)."),
    "inf logits": (
        lambda: energy_score(torch.tensor([[[float("inf"), 0.0]]])), f"logits: 1 of 2 {NOT_FINITE}"),
    "temperature": (
        lambda: energy_score(torch.zeros(1, 1, 2), temperature=0.0),
        "temperature: must be positive and finite, got 0.0; pass e.g. 1.0 (Liu et al. 2020)."),
    "regression variance shape": (
        lambda: member_variance(torch.zeros(2, 2, 2, 2)),
        "preds: expected regression predictions (n, members) or probabilities (n, members, classes), "
        "got shape (2, 2, 2, 2); put the members on axis 1."),
    "scores shape": (
        lambda: ood_auroc(torch.zeros(3, 1), torch.tensor([0, 1, 0])),
        "scores: expected a 1-d tensor (one score per row), got shape (3, 1); "
        "pass one score per row, e.g. max_softmax_uncertainty(probs)."),
    "labels shape": (
        lambda: aupr_out(_SCORES, torch.tensor([0, 1])),
        "labels: expected shape (3,) like the scores, got (2,); "
        "pass one label per score (1 = OOD, 0 = in-distribution)."),
    "labels range": (
        lambda: fpr_at_tpr(_SCORES, torch.tensor([0, 2, 1])),
        "labels: values must be 0 (in-distribution) or 1 (OOD), found 2; "
        "map the labels to 0/1 with 1 = OOD."),
    "nan scores": (
        lambda: aupr_in(torch.tensor([0.1, float("nan"), 0.2]), torch.tensor([0, 1, 0])),
        f"scores: 1 of 3 {NOT_FINITE}"),
    "no OOD rows": (
        lambda: fpr_at_tpr(_SCORES, torch.tensor([0, 0, 0])),
        f"labels: none of the 3 rows is OOD (1); fpr_at_tpr {BOTH} OOD rows."),
    "no ID rows": (
        lambda: ood_auroc(_SCORES, torch.tensor([1, 1, 1])),
        f"labels: all 3 rows are OOD (1); ood_auroc {BOTH} in-distribution (0) rows."),
    "tpr": (
        lambda: fpr_at_tpr(_SCORES, torch.tensor([0, 1, 0]), tpr=0.0),
        "tpr: must lie in (0, 1], got 0.0; pass e.g. 0.95 for FPR95."),
    "tpr in the class": (
        lambda: FPRAtTPR(tpr=95), "tpr: must lie in (0, 1], got 95; pass e.g. 0.95 for FPR95."),
    "bool loss": (
        lambda: aurc(_SCORES, torch.tensor([True, False, True])),
        "loss: got a bool tensor, which could mean errors or correctness; "
        "pass float losses, e.g. (~correct).float() or (pred != target).float()."),
    "loss shape": (
        lambda: augrc(_SCORES, torch.zeros(3, 1)),
        "loss: expected shape (3,) like the uncertainty, got (3, 1); "
        "pass one loss per row (e.g. 1.0 for a misclassified row, 0.0 otherwise)."),
    "uncertainty shape": (
        lambda: risk_coverage_curve(torch.zeros(3, 2), torch.zeros(3, 2)),
        "uncertainty: expected a 1-d tensor (one score per row, higher = less certain), got shape (3, 2); "
        "pass one score per row, e.g. max_softmax_uncertainty(probs)."),
    "no rows": (lambda: aurc(torch.zeros(0), torch.zeros(0)), "uncertainty: no rows; pass at least one row."),
    "nan loss": (
        lambda: augrc(_SCORES, torch.tensor([0.0, float("nan"), 1.0])), f"loss: 1 of 3 {NOT_FINITE}"),
    "coverage": (
        lambda: risk_at_coverage(_SCORES, torch.zeros(3), 1.5),
        "coverage: must lie in (0, 1], got 1.5; pass e.g. 0.8 to accept the 80% most certain rows."),
    "compute before update": (
        lambda: AURC().compute(),
        "AURC: no rows were accumulated; call update() with uncertainty and loss before compute()."),
    "detection compute before update": (
        lambda: OODAUROC().compute(),
        "OODAUROC: no rows were accumulated; call update() with scores and labels before compute()."),
}


def _no_id_rows_in_the_class() -> None:
    metric = AUPROut()
    metric.update(_SCORES, torch.tensor([1, 1, 1]))
    metric.compute()


BAD_INPUTS["no ID rows in the class"] = (
    _no_id_rows_in_the_class,
    f"labels: all 3 rows are OOD (1); aupr_out {BOTH} in-distribution (0) rows.")


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric")
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gives_one_line_naming_the_problem_and_fix(case):
    call, message = BAD_INPUTS[case]
    with pytest.raises(OODInputError) as caught:
        call()
    assert str(caught.value) == message
    assert isinstance(caught.value, RipienoInputError) and isinstance(caught.value, ValueError)
    assert "\n" not in message and message.endswith(".")


def test_validate_args_false_skips_the_value_checks():
    assert torch.isnan(predictive_entropy(_NAN, validate_args=False)[0])
    with pytest.raises(OODInputError):  # shapes are always checked
        predictive_entropy(torch.ones(4, 3), validate_args=False)


# ------------------------------------------------------------------------------------------------ imports
def test_the_module_imports_torch_and_torchmetrics_only():
    tree = ast.parse((ROOT / "framework" / "metrics" / "ood.py").read_text(encoding="utf-8"))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            roots.add(node.module.split(".")[0])
    assert roots == {"__future__", "math", "torch", "torchmetrics", "ripieno"}
    code = ("import sys, ripieno.framework.metrics.ood; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
