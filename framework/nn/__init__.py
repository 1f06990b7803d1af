"""Torch layers without Lightning: ensemble linear layers, embeddings, backbones."""

from ripieno.framework.nn.embeddings import (
    OneHotEncoding,
    PiecewiseLinearEmbeddings,
    PiecewiseLinearEncoding,
    compute_bins,
)
from ripieno.framework.nn.ensemble_linear import ADAPTERS, EnsembleLinear
from ripieno.framework.nn.tabular_backbone import TabularEnsembleNet

__all__ = [
    "ADAPTERS",
    "EnsembleLinear",
    "OneHotEncoding",
    "PiecewiseLinearEmbeddings",
    "PiecewiseLinearEncoding",
    "TabularEnsembleNet",
    "compute_bins",
]
