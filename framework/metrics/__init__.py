"""torchmetrics Metric classes shared by every method."""

from ripieno.framework.metrics.diversity import Ambiguity, MemberDisagreement, PairwiseKLDivergence
from ripieno.framework.metrics.ood import AUGRC, AURC, OODAUROC, AUPRIn, AUPROut, FPRAtTPR
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
    "AUGRC",
    "AUPRIn",
    "AUPROut",
    "AURC",
    "Ambiguity",
    "BrierScore",
    "EnsembleCRPS",
    "ExpectedCalibrationError",
    "FPRAtTPR",
    "GaussianNLL",
    "LogPointwisePredictiveDensity",
    "MemberDisagreement",
    "OODAUROC",
    "PairwiseKLDivergence",
    "PredictiveNLL",
    "VarROC",
    "reliability_diagram",
]
