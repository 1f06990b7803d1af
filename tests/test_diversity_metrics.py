"""Diversity metrics against direct numpy/scipy computations and exact identities."""

import itertools

import numpy as np
import pytest
import torch
from scipy.special import expit, softmax
from scipy.stats import entropy

from ripieno.framework.metrics import Ambiguity, MemberDisagreement, PairwiseKLDivergence


def _pairwise_kl_reference(probs: np.ndarray) -> float:
    """Mean over samples and ordered pairs i != j of KL(p_i || p_j), by scipy."""
    b, k, _ = probs.shape
    values = [entropy(probs[n, i], probs[n, j]) for n in range(b)
              for i, j in itertools.permutations(range(k), 2)]
    return float(np.mean(values))


def _disagreement_reference(votes: np.ndarray) -> float:
    b, k = votes.shape
    return float(np.mean([votes[n, i] != votes[n, j] for n in range(b)
                          for i, j in itertools.permutations(range(k), 2)]))


@pytest.mark.parametrize("k,c", [(2, 3), (5, 4), (7, 2)])
def test_pairwise_kl_matches_scipy(k, c):
    rng = np.random.default_rng(k * 10 + c)
    logits = rng.normal(scale=2.0, size=(13, k, c))
    metric = PairwiseKLDivergence("logits")
    # Two batches: the metric accumulates across updates.
    metric.update(torch.tensor(logits[:6], dtype=torch.float32))
    metric.update(torch.tensor(logits[6:], dtype=torch.float32))
    expected = _pairwise_kl_reference(softmax(logits, axis=-1))
    assert metric.compute().item() == pytest.approx(expected, rel=1e-4)


def test_pairwise_kl_binary_logits_and_probs_agree_with_scipy():
    rng = np.random.default_rng(1)
    logit = rng.normal(size=(20, 4, 1))
    p1 = expit(logit[..., 0])
    probs = np.stack([1 - p1, p1], axis=-1)
    expected = _pairwise_kl_reference(probs)
    binary = PairwiseKLDivergence("binary_logits")
    binary.update(torch.tensor(logit, dtype=torch.float32))
    from_probs = PairwiseKLDivergence("probs")
    from_probs.update(torch.tensor(probs, dtype=torch.float32))
    assert binary.compute().item() == pytest.approx(expected, rel=1e-4)
    assert from_probs.compute().item() == pytest.approx(expected, rel=1e-4)


def test_identical_members_have_zero_diversity():
    logits = torch.randn(8, 1, 5).expand(-1, 4, -1)
    kl, dis = PairwiseKLDivergence(), MemberDisagreement()
    kl.update(logits)
    dis.update(logits)
    assert kl.compute().item() == pytest.approx(0.0, abs=1e-6)
    assert dis.compute().item() == 0.0


@pytest.mark.parametrize("k,c", [(2, 2), (4, 3), (6, 5)])
def test_disagreement_matches_pair_count(k, c):
    rng = np.random.default_rng(k + c)
    logits = rng.normal(size=(30, k, c))
    metric = MemberDisagreement("logits")
    metric.update(torch.tensor(logits, dtype=torch.float32))
    assert metric.compute().item() == pytest.approx(_disagreement_reference(logits.argmax(-1)), abs=1e-6)


def test_binary_disagreement_uses_sign_of_logit():
    logit = torch.tensor([[[1.0], [-1.0], [2.0]], [[0.5], [0.3], [0.1]]])
    metric = MemberDisagreement("binary_logits")
    metric.update(logit)
    # Row 0: votes 1,0,1 -> 4 of 6 ordered pairs disagree; row 1: all agree.
    assert metric.compute().item() == pytest.approx((4 / 6 + 0) / 2)


def test_krogh_vedelsby_identity():
    rng = np.random.default_rng(3)
    members = rng.normal(size=(50, 6, 2))
    target = rng.normal(size=(50, 1, 2))
    ensemble = members.mean(1, keepdims=True)
    metric = Ambiguity()
    metric.update(torch.tensor(members))
    mean_member_mse = ((members - target) ** 2).mean()
    ensemble_mse = ((ensemble - target) ** 2).mean()
    assert mean_member_mse == pytest.approx(ensemble_mse + metric.compute().item(), rel=1e-5)


def test_state_merge_equals_single_pass():
    """What DDP's sum-reduction does: states of two shards add up to the full pass."""
    logits = torch.randn(40, 5, 3)
    full, a, b = PairwiseKLDivergence(), PairwiseKLDivergence(), PairwiseKLDivergence()
    full.update(logits)
    a.update(logits[:17])
    b.update(logits[17:])
    a.merge_state(b)
    assert a.compute().item() == pytest.approx(full.compute().item(), rel=1e-6)


def test_bf16_inputs_are_measured_in_float32():
    logits = torch.randn(16, 4, 3)
    ref, low = PairwiseKLDivergence(), PairwiseKLDivergence()
    ref.update(logits.bfloat16().float())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low.update(logits.bfloat16())
    assert low.compute().dtype == torch.float32
    assert low.compute().item() == pytest.approx(ref.compute().item(), rel=1e-5)


def test_single_member_is_rejected():
    with pytest.raises(ValueError, match="at least 2 members"):
        PairwiseKLDivergence().update(torch.randn(3, 1, 2))
