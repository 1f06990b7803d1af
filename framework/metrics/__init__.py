"""torchmetrics Metric classes shared by every method."""

from framework.metrics.diversity import Ambiguity, MemberDisagreement, PairwiseKLDivergence

__all__ = ["Ambiguity", "MemberDisagreement", "PairwiseKLDivergence"]
