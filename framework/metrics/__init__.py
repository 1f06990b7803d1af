"""torchmetrics Metric classes shared by every method."""

from framework.metrics.diversity import Ambiguity, MemberDisagreement, PairwiseKLDivergence
from framework.metrics.reliability import reliability_diagram
from framework.metrics.uq import (
    ExpectedCalibrationError,
    GaussianNLL,
    LogPointwisePredictiveDensity,
    PredictiveNLL,
    VarROC,
)

__all__ = [
    "Ambiguity",
    "ExpectedCalibrationError",
    "GaussianNLL",
    "LogPointwisePredictiveDensity",
    "MemberDisagreement",
    "PairwiseKLDivergence",
    "PredictiveNLL",
    "VarROC",
    "reliability_diagram",
]
