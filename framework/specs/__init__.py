"""What a module must know about its data, passed from datamodule to module, and fitted preprocessing.

Each modality's spec (``TabularSpec``, ``TextSpec``, ``ImageSpec``, ``LayerFeatureSpec``) is a
dataclass; the tabular spec's fitted preprocessing is ``tabular_preprocessing`` (scikit-learn
state as plain Python through ``sklearn_state``).
"""

from ripieno.framework.specs.image import ImageSpec
from ripieno.framework.specs.layer_features import LayerFeatureSpec
from ripieno.framework.specs.tabular import TabularSpec
from ripieno.framework.specs.text import TextSpec

__all__ = ["ImageSpec", "LayerFeatureSpec", "TabularSpec", "TextSpec"]
