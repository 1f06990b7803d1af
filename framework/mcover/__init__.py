"""M-cover routing: mixing kernels, permutation banks, routed models and their baselines."""

from ripieno.framework.mcover.kernels import (
    KERNELS,
    gaussian_ring_kernel,
    make_kernel,
    ring_distance,
    sinkhorn,
    validate_kernel,
)
from ripieno.framework.mcover.permutations import (
    SAMPLERS,
    PermutationBank,
    all_permutations,
    empirical_mixing_matrix,
    exact_distribution,
    sample_permutations,
)

__all__ = [
    "KERNELS",
    "SAMPLERS",
    "PermutationBank",
    "all_permutations",
    "empirical_mixing_matrix",
    "exact_distribution",
    "gaussian_ring_kernel",
    "make_kernel",
    "ring_distance",
    "sample_permutations",
    "sinkhorn",
    "validate_kernel",
]
