"""LOES: choose a budget of layers of a pretrained model from their embeddings, and its baselines.

``select_layers`` runs the greedy LOES rule on per-layer features; ``SELECTORS`` holds it beside the
baselines (last layer, last-k, best single layer, greedy ridge, exhaustive search), all returning a
``LayerSelection``. ``geometry`` holds the ridge probe, orthogonalisation and the Iso, Red and Tri
scores; ``ScalarMix`` is the trainable ELMo-style mix of all layers. ``features`` pools and
caches per-layer embeddings, ``fusion`` holds the fusion head and ``FusionClassifier``,
``geometry_loss`` GeoReg's differentiable terms.
"""

from ripieno.framework.backbones.loading import load_pretrained_backbone, minilm_dir
from ripieno.framework.loes.extraction import POOLINGS, extract_layer_embeddings
from ripieno.framework.loes.feature_cache import cached_layer_embeddings
from ripieno.framework.loes.geometry import (
    Residualizer,
    RidgeFit,
    class_centroids,
    fit_residualizer,
    isotropy,
    orthogonalize,
    redundancy,
    ridge_fit,
    ridge_loss,
    triangle_score,
)
from ripieno.framework.loes.scalar_mix import ScalarMix
from ripieno.framework.loes.selection import (
    SELECTORS,
    LayerSelection,
    select_best_single,
    select_exhaustive,
    select_greedy_ridge,
    select_last_k,
    select_last_layer,
    select_layers,
)

__all__ = [
    "POOLINGS",
    "SELECTORS",
    "LayerSelection",
    "Residualizer",
    "RidgeFit",
    "ScalarMix",
    "cached_layer_embeddings",
    "extract_layer_embeddings",
    "load_pretrained_backbone",
    "minilm_dir",
    "class_centroids",
    "fit_residualizer",
    "isotropy",
    "orthogonalize",
    "redundancy",
    "ridge_fit",
    "ridge_loss",
    "select_best_single",
    "select_exhaustive",
    "select_greedy_ridge",
    "select_last_k",
    "select_last_layer",
    "select_layers",
    "triangle_score",
]
