"""torchmetrics Metric classes shared by every method."""

from ripieno.framework.metrics.diversity import Ambiguity, MemberDisagreement, PairwiseKLDivergence
from ripieno.framework.metrics.reliability import reliability_diagram
from ripieno.framework.metrics.uq import (
    BrierScore,
    EnsembleCRPS,
    ExpectedCalibrationError,
    GaussianNLL,
    LogPointwisePredictiveDensity,
    PredictiveNLL,
    VarROC,
)

__all__ = [
    "Ambiguity",
    "BrierScore",
    "EnsembleCRPS",
    "ExpectedCalibrationError",
    "GaussianNLL",
    "LogPointwisePredictiveDensity",
    "MemberDisagreement",
    "PairwiseKLDivergence",
    "PredictiveNLL",
    "VarROC",
    "reliability_diagram",
]
