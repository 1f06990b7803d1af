"""Lightning callbacks that work with ripieno's modules and with users' own."""

from callbacks.deep_ensemble import DeepEnsembleSampler
from callbacks.diversity_monitor import DiversityMonitor
from callbacks.georeg import GeoReg
from callbacks.glm_sampler import LastLayerSampler
from callbacks.laplace_baseline import LaplaceSampler
from callbacks.mc_dropout import MCDropoutSampler
from callbacks.prediction_writer import MemberPredictionWriter
from callbacks.replica_coupling import ElasticAveraging, ReplicaCoupling
from callbacks.routing_resampler import RoutingResampler
from callbacks.swag import SWAGSampler

__all__ = [
    "DeepEnsembleSampler",
    "DiversityMonitor",
    "ElasticAveraging",
    "GeoReg",
    "LaplaceSampler",
    "LastLayerSampler",
    "MCDropoutSampler",
    "MemberPredictionWriter",
    "ReplicaCoupling",
    "RoutingResampler",
    "SWAGSampler",
]
