"""Permutations ``rho`` with ``P(rho) proportional to prod_a Q[a, rho(a)]``, and banks of them.

Samplers (``sample_permutations``):

* ``exact``: enumerate the ``M!`` permutations and draw from their normalised weights
  (``M <= 8``: 40,320 permutations).
* ``mcmc``: Metropolis chains over permutations with transposition proposals
  (swap the sources of two destinations; acceptance
  ``Q[i, rho(j)] Q[j, rho(i)] / (Q[i, rho(i)] Q[j, rho(j)])``), one independent chain per
  draw, started at the most probable permutation and run ``burn_in`` sweeps of ``M``
  proposals. Exact in the limit of long chains; for any ``M``.
* ``gumbel``: perturb-and-MAP: ``argmax_rho sum_a (log Q[a, rho(a)] + G[a, rho(a)])`` with
  i.i.d. Gumbel ``G``, solved by ``scipy.optimize.linear_sum_assignment``. Fast and
  exact for the uniform and diagonal kernels; approximate otherwise (it over-weights the
  most probable permutations).

A ``PermutationBank`` holds ``S`` permutations per routing slot (one slot per layer,
or per (layer, block)) and their empirical mixing matrices
``P[a, b] = mean_s 1[rho_s(a) = b]``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from ripieno.framework.mcover.kernels import validate_kernel

SamplerKind = Literal["exact", "mcmc", "gumbel"]
SAMPLERS: tuple[str, ...] = ("exact", "mcmc", "gumbel")
MAX_EXACT_M = 8


def all_permutations(m: int) -> Tensor:
    """All ``m!`` permutations as rows of a ``(m!, m)`` long tensor (lexicographic order)."""
    if m > MAX_EXACT_M:
        raise ValueError(f"Enumerating {m}! permutations is too many; use sampler='mcmc' or 'gumbel'.")
    return torch.tensor(list(itertools.permutations(range(m))), dtype=torch.long)


def exact_distribution(q: Tensor) -> tuple[Tensor, Tensor]:
    """``(permutations (m!, m), probabilities (m!,))`` under ``prod_a Q[a, rho(a)]``."""
    q = validate_kernel(q)
    perms = all_permutations(q.shape[0])
    weights = q[torch.arange(q.shape[0]), perms].prod(1)  # q[a, perm[:, a]] over a
    return perms, weights / weights.sum()


def _log_kernel(q: Tensor) -> Tensor:
    return torch.where(q > 0, q.log(), torch.full_like(q, -math.inf))


def _most_probable(log_q: Tensor) -> Tensor:
    from scipy.optimize import linear_sum_assignment

    finite = torch.where(torch.isfinite(log_q), log_q, torch.full_like(log_q, -1e12))
    _, cols = linear_sum_assignment(finite.numpy(), maximize=True)
    return torch.as_tensor(cols, dtype=torch.long)


def _sample_exact(q: Tensor, n: int, generator: torch.Generator) -> Tensor:
    perms, probs = exact_distribution(q)
    idx = torch.multinomial(probs, n, replacement=True, generator=generator)
    return perms[idx]


def _sample_mcmc(q: Tensor, n: int, generator: torch.Generator, burn_in: int) -> Tensor:
    m = q.shape[0]
    if m == 1:
        return torch.zeros(n, 1, dtype=torch.long)
    rho = _most_probable(_log_kernel(q)).expand(n, m).clone()
    rows = torch.arange(n)
    for _ in range(burn_in * m):
        i = torch.randint(0, m, (n,), generator=generator)
        j = (i + torch.randint(1, m, (n,), generator=generator)) % m  # j != i
        ri, rj = rho[rows, i], rho[rows, j]
        old = q[i, ri] * q[j, rj]
        new = q[i, rj] * q[j, ri]
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        accept = u * old < new  # new >= old always accepts; old == 0 cannot occur on the chain
        rho[rows[accept], i[accept]] = rj[accept]
        rho[rows[accept], j[accept]] = ri[accept]
    return rho


def _sample_gumbel(q: Tensor, n: int, generator: torch.Generator) -> Tensor:
    from scipy.optimize import linear_sum_assignment

    m = q.shape[0]
    log_q = _log_kernel(q)
    out = torch.empty(n, m, dtype=torch.long)
    for s in range(n):
        u = torch.rand(m, m, generator=generator, dtype=torch.float64).clamp_min(1e-300)
        perturbed = log_q - torch.log(-torch.log(u))
        perturbed = torch.where(torch.isfinite(perturbed), perturbed, torch.full_like(perturbed, -1e12))
        _, cols = linear_sum_assignment(perturbed.numpy(), maximize=True)
        out[s] = torch.as_tensor(cols)
    return out


def sample_permutations(q: Tensor, n: int, generator: torch.Generator | None = None,
                        sampler: SamplerKind = "exact", burn_in: int = 50) -> Tensor:
    """``n`` permutations ``(n, M)`` with ``P(rho) proportional to prod_a Q[a, rho(a)]``.

    Args:
        q: the kernel ``(M, M)``.
        n: number of draws.
        generator: a CPU generator (draws are reproducible and device-independent).
        sampler: ``exact`` (M <= 8), ``mcmc`` or ``gumbel`` (module docstring).
        burn_in: sweeps of ``M`` proposals per MCMC chain.

    Returns:
        ``rho`` with ``rho[s, a]`` = the source copy of destination ``a`` in draw ``s``.
    """
    q = validate_kernel(q)
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    if sampler == "exact":
        return _sample_exact(q, n, generator)
    if sampler == "mcmc":
        return _sample_mcmc(q, n, generator, burn_in)
    if sampler == "gumbel":
        return _sample_gumbel(q, n, generator)
    raise ValueError(f"Unknown sampler {sampler!r}; choose one of {SAMPLERS}.")


def empirical_mixing_matrix(perms: Tensor, m: int | None = None) -> Tensor:
    """``P[..., a, b] = mean_s 1[rho_s(a) = b]`` for ``perms (..., S, M)`` (float32)."""
    m = m if m is not None else perms.shape[-1]
    one_hot = torch.nn.functional.one_hot(perms, m).float()  # (..., S, M, M)
    return one_hot.mean(-3)


@dataclass
class PermutationBank:
    """``S`` permutations for each of ``n_slots`` routing slots.

    Attributes:
        perms: ``(n_slots, S, M)`` long; ``perms[l, s, a]`` is the source of copy ``a``.
    """

    perms: Tensor

    @classmethod
    def draw(cls, q: Tensor, n_slots: int, size: int, generator: torch.Generator,
             sampler: SamplerKind = "exact", burn_in: int = 50) -> PermutationBank:
        """Draw ``size`` permutations per slot, slot after slot, from ``generator``."""
        draws = sample_permutations(q, n_slots * size, generator, sampler, burn_in)
        return cls(draws.view(n_slots, size, q.shape[0]))

    @property
    def size(self) -> int:
        """``S``, the permutations per slot."""
        return self.perms.shape[1]

    def mixing(self) -> Tensor:
        """Empirical mixing matrices ``(n_slots, M, M)``."""
        return empirical_mixing_matrix(self.perms)

    def at(self, index: int) -> Tensor:
        """Permutation ``index mod S`` of every slot, ``(n_slots, M)``."""
        return self.perms[:, index % self.size]

    def statistics(self) -> dict[str, float]:
        """Mixing summaries of the bank.

        ``self_fraction``: mean of ``P[a, a]`` (1 = no mixing); ``mixing_entropy``: mean
        row entropy of ``P`` in nats (``log M`` = uniform).
        """
        p = self.mixing()
        entropy = -(p * p.clamp_min(1e-12).log()).sum(-1).mean()
        return {"self_fraction": float(p.diagonal(dim1=-2, dim2=-1).mean()),
                "mixing_entropy": float(entropy)}
