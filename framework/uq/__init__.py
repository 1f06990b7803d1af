"""Post-hoc uncertainty: linearised-network posterior samplers (LL-GLM, DNN-GLM).

``GLMPosteriorSampler`` draws exact linearised-Laplace (GGN) samples;
``LeastSquaresLogitSampler`` is the LinearSampling package's sampler (the paper's reference).
"""

from ripieno.framework.uq.glm_sampler import (
    GLMPosteriorSampler,
    last_layer_closed_form,
    last_layer_log_evidence,
)
from ripieno.framework.uq.least_squares_sampler import LeastSquaresLogitSampler
from ripieno.framework.uq.linearization import (
    FullNetworkLinearization,
    LastLayerLinearization,
    find_last_linear,
)

__all__ = [
    "FullNetworkLinearization",
    "GLMPosteriorSampler",
    "LastLayerLinearization",
    "LeastSquaresLogitSampler",
    "find_last_linear",
    "last_layer_closed_form",
    "last_layer_log_evidence",
]
