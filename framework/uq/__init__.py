"""Post-hoc uncertainty: linearised-network posterior samplers (LL-GLM, DNN-GLM)."""

from ripieno.framework.uq.glm_sampler import (
    GLMPosteriorSampler,
    last_layer_closed_form,
    last_layer_log_evidence,
)
from ripieno.framework.uq.linearization import (
    FullNetworkLinearization,
    LastLayerLinearization,
    find_last_linear,
)

__all__ = [
    "FullNetworkLinearization",
    "GLMPosteriorSampler",
    "LastLayerLinearization",
    "find_last_linear",
    "last_layer_closed_form",
    "last_layer_log_evidence",
]
