"""Mixing kernels and permutation samplers against exact enumeration (chi-square fits)."""

import math

import pytest
import torch
from scipy.stats import chisquare

from ripieno.framework.mcover import (
    PermutationBank,
    empirical_mixing_matrix,
    exact_distribution,
    gaussian_ring_kernel,
    make_kernel,
    sample_permutations,
    sinkhorn,
)


def _counts(perms, all_perms):
    index = {tuple(p.tolist()): i for i, p in enumerate(all_perms)}
    counts = torch.zeros(len(all_perms))
    for p in perms:
        counts[index[tuple(p.tolist())]] += 1
    return counts


def test_gaussian_ring_kernel_formula():
    q = gaussian_ring_kernel(6, sigma=1.5, mu=1.0)
    for a in range(6):
        for b in range(6):
            t = (b - a - 1.0) % 6
            d = min(t, 6 - t)
            assert q[a, b] == pytest.approx(math.exp(-d * d / (2 * 1.5**2)))
    assert torch.allclose(make_kernel("gaussian_ring", 6, sigma=1e-3), torch.eye(6, dtype=torch.float64))


def test_exact_distribution_is_the_normalised_product_of_kernel_entries():
    q = torch.rand(4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 0.1
    perms, probs = exact_distribution(q)
    assert len(perms) == 24 and probs.sum().item() == pytest.approx(1.0)
    weights = torch.tensor([math.prod(q[a, p[a]].item() for a in range(4)) for p in perms],
                           dtype=torch.float64)
    assert torch.allclose(probs, weights / weights.sum())


@pytest.mark.parametrize("sampler", ["exact", "mcmc"])
@pytest.mark.parametrize("kernel", ["ring", "random"])
def test_sampler_matches_exact_distribution_chi_square(sampler, kernel):
    g = torch.Generator().manual_seed(1)
    q = (gaussian_ring_kernel(4, sigma=1.0, mu=0.5) if kernel == "ring"
         else torch.rand(4, 4, generator=g, dtype=torch.float64) + 0.05)
    perms, probs = exact_distribution(q)
    n = 20000
    draws = sample_permutations(q, n, torch.Generator().manual_seed(2), sampler=sampler, burn_in=30)
    counts = _counts(draws, perms)
    keep = probs * n >= 5  # chi-square needs expected counts >= 5; pool the rest
    observed = torch.cat([counts[keep], counts[~keep].sum()[None]])
    expected = torch.cat([probs[keep] * n, (probs[~keep] * n).sum()[None]])
    if expected[-1] < 5:
        observed, expected = observed[:-1], expected[:-1] * n / expected[:-1].sum()
    assert chisquare(observed.numpy(), expected.numpy()).pvalue > 1e-3


def test_uniform_kernel_mixing_matrix_approaches_one_over_m():
    for sampler in ("exact", "mcmc", "gumbel"):
        perms = sample_permutations(make_kernel("uniform", 5), 4000, torch.Generator().manual_seed(0),
                                    sampler=sampler)
        mixing = empirical_mixing_matrix(perms)
        assert torch.allclose(mixing, torch.full((5, 5), 0.2), atol=0.03), sampler


def test_diagonal_kernel_only_draws_the_identity():
    for sampler in ("exact", "mcmc", "gumbel"):
        perms = sample_permutations(make_kernel("diagonal", 5), 50, torch.Generator().manual_seed(0),
                                    sampler=sampler)
        assert (perms == torch.arange(5)).all(), sampler


def test_mcmc_and_gumbel_work_beyond_enumeration():
    q = make_kernel("gaussian_ring", 16, sigma=2.0)
    for sampler in ("mcmc", "gumbel"):
        perms = sample_permutations(q, 20, torch.Generator().manual_seed(0), sampler=sampler)
        assert (perms.sort(1).values == torch.arange(16)).all()  # valid permutations
    with pytest.raises(ValueError, match="too many"):
        sample_permutations(q, 2, sampler="exact")


def test_sinkhorn_is_doubly_stochastic_and_keeps_the_permutation_law():
    q = torch.rand(4, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 0.1
    p = sinkhorn(q)
    assert torch.allclose(p.sum(0), torch.ones(4, dtype=torch.float64), atol=1e-8)
    assert torch.allclose(p.sum(1), torch.ones(4, dtype=torch.float64), atol=1e-8)
    assert torch.allclose(exact_distribution(p)[1], exact_distribution(q)[1], atol=1e-12)


def test_bad_kernels_name_the_problem():
    with pytest.raises(ValueError, match="permanent"):
        make_kernel("matrix", 3, matrix=[[1, 0, 0], [1, 0, 0], [1, 0, 0]])
    with pytest.raises(ValueError, match="non-negative"):
        make_kernel("matrix", 2, matrix=[[1, -1], [0, 1]])
    with pytest.raises(ValueError, match="square"):
        make_kernel("matrix", 2, matrix=[[1, 1, 1], [0, 1, 1]])
    with pytest.raises(ValueError, match="Unknown kernel"):
        make_kernel("ring", 3)


def test_bank_shapes_mixing_and_statistics():
    bank = PermutationBank.draw(make_kernel("uniform", 4), n_slots=3, size=8,
                                generator=torch.Generator().manual_seed(0))
    assert bank.perms.shape == (3, 8, 4) and bank.at(9).shape == (3, 4)
    assert torch.equal(bank.at(9), bank.perms[:, 1])
    assert torch.allclose(bank.mixing().sum(-1), torch.ones(3, 4))
    diag = PermutationBank.draw(make_kernel("diagonal", 4), 3, 8, torch.Generator().manual_seed(0))
    assert diag.statistics()["self_fraction"] == 1.0 and diag.statistics()["mixing_entropy"] == 0.0
