"""Lightning callbacks that work with ripieno's modules and with users' own.

Every public name is imported on first use (``ripieno.framework.lazy_exports``).
"""

from typing import TYPE_CHECKING

from ripieno.framework.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time each name is imported on first use
    from ripieno.callbacks.conformal_prediction import ConformalPrediction
    from ripieno.callbacks.deep_ensemble import DeepEnsembleSampler
    from ripieno.callbacks.diversity_monitor import DiversityMonitor
    from ripieno.callbacks.georeg import GeoReg
    from ripieno.callbacks.glm_posteriors import LaplaceGGN, LeastSquaresLogits
    from ripieno.callbacks.glm_sampler import LastLayerSampler
    from ripieno.callbacks.laplace_baseline import LaplaceSampler
    from ripieno.callbacks.mc_dropout import MCDropoutSampler
    from ripieno.callbacks.non_finite_guard import NonFiniteGuard
    from ripieno.callbacks.post_hoc_calibration import PostHocCalibration
    from ripieno.callbacks.prediction_writer import MemberPredictionWriter
    from ripieno.callbacks.replica_coupling import ElasticAveraging, ReplicaCoupling
    from ripieno.callbacks.routing_resampler import RoutingResampler
    from ripieno.callbacks.sampler_evaluation import SamplerEvaluation
    from ripieno.callbacks.swag import SWAGSampler
    from ripieno.callbacks.temperature_scaling import TemperatureScaling

_EXPORTS = {
    "ConformalPrediction": "ripieno.callbacks.conformal_prediction",
    "DeepEnsembleSampler": "ripieno.callbacks.deep_ensemble",
    "DiversityMonitor": "ripieno.callbacks.diversity_monitor",
    "GeoReg": "ripieno.callbacks.georeg",
    "LastLayerSampler": "ripieno.callbacks.glm_sampler",
    "LaplaceGGN": "ripieno.callbacks.glm_posteriors",
    "LeastSquaresLogits": "ripieno.callbacks.glm_posteriors",
    "LaplaceSampler": "ripieno.callbacks.laplace_baseline",
    "MCDropoutSampler": "ripieno.callbacks.mc_dropout",
    "NonFiniteGuard": "ripieno.callbacks.non_finite_guard",
    "PostHocCalibration": "ripieno.callbacks.post_hoc_calibration",
    "MemberPredictionWriter": "ripieno.callbacks.prediction_writer",
    "ElasticAveraging": "ripieno.callbacks.replica_coupling",
    "ReplicaCoupling": "ripieno.callbacks.replica_coupling",
    "RoutingResampler": "ripieno.callbacks.routing_resampler",
    "SamplerEvaluation": "ripieno.callbacks.sampler_evaluation",
    "SWAGSampler": "ripieno.callbacks.swag",
    "TemperatureScaling": "ripieno.callbacks.temperature_scaling",
}
__all__ = [
    "ConformalPrediction",
    "DeepEnsembleSampler",
    "DiversityMonitor",
    "ElasticAveraging",
    "GeoReg",
    "LaplaceGGN",
    "LaplaceSampler",
    "LastLayerSampler",
    "LeastSquaresLogits",
    "MCDropoutSampler",
    "MemberPredictionWriter",
    "NonFiniteGuard",
    "PostHocCalibration",
    "ReplicaCoupling",
    "RoutingResampler",
    "SWAGSampler",
    "SamplerEvaluation",
    "TemperatureScaling",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
