"""Post-hoc uncertainty: linearised-network posterior samplers (LL-GLM, DNN-GLM), split conformal prediction.

``GLMPosteriorSampler`` draws exact linearised-Laplace (GGN) samples;
``LeastSquaresLogitSampler`` is the LinearSampling package's sampler (the paper's reference);
``SplitConformal`` turns any model's outputs into sets or intervals with a coverage guarantee.
"""

from ripieno.framework.uq.conformal import ConformalError, SplitConformal
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
    "ConformalError",
    "FullNetworkLinearization",
    "GLMPosteriorSampler",
    "LastLayerLinearization",
    "LeastSquaresLogitSampler",
    "SplitConformal",
    "find_last_linear",
    "last_layer_closed_form",
    "last_layer_log_evidence",
]
