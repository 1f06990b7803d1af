"""Lightning callbacks that work with ripieno's modules and with users' own."""

from ripieno.callbacks.deep_ensemble import DeepEnsembleSampler
from ripieno.callbacks.diversity_monitor import DiversityMonitor
from ripieno.callbacks.georeg import GeoReg
from ripieno.callbacks.glm_sampler import LastLayerSampler
from ripieno.callbacks.laplace_baseline import LaplaceSampler
from ripieno.callbacks.mc_dropout import MCDropoutSampler
from ripieno.callbacks.non_finite_guard import NonFiniteGuard
from ripieno.callbacks.prediction_writer import MemberPredictionWriter
from ripieno.callbacks.replica_coupling import ElasticAveraging, ReplicaCoupling
from ripieno.callbacks.routing_resampler import RoutingResampler
from ripieno.callbacks.swag import SWAGSampler
from ripieno.callbacks.temperature_scaling import TemperatureScaling

__all__ = [
    "DeepEnsembleSampler",
    "DiversityMonitor",
    "ElasticAveraging",
    "GeoReg",
    "LaplaceSampler",
    "LastLayerSampler",
    "MCDropoutSampler",
    "MemberPredictionWriter",
    "NonFiniteGuard",
    "ReplicaCoupling",
    "RoutingResampler",
    "SWAGSampler",
    "TemperatureScaling",
]
