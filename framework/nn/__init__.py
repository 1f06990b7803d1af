"""Torch layers without Lightning: ensemble linear layers, embeddings, backbones."""

from ripieno.framework.nn.embeddings import (
    OneHotEncoding,
    PiecewiseLinearEmbeddings,
    PiecewiseLinearEncoding,
    compute_bins,
)
from ripieno.framework.nn.ensemble_linear import ADAPTER_INITS, ADAPTERS, EnsembleLinear, check_adapter_init
from ripieno.framework.nn.tabular_backbone import TabularEnsembleNet

__all__ = [
    "ADAPTERS",
    "ADAPTER_INITS",
    "EnsembleLinear",
    "OneHotEncoding",
    "PiecewiseLinearEmbeddings",
    "PiecewiseLinearEncoding",
    "TabularEnsembleNet",
    "check_adapter_init",
    "compute_bins",
]
