"""ripieno's framework: torch layers, LightningModules, metrics and the CLI."""

from framework.image_spec import ImageSpec
from framework.loes.fusion import FusionClassifier
from framework.loes.spec import LayerFeatureSpec
from framework.mcover.module import MCoverClassifier
from framework.mcover.perceptron_module import BinaryPerceptronSA
from framework.methods.image_classifier import ImageClassifier
from framework.methods.tabular_ensemble import TabularEnsembleModule
from framework.methods.tabular_mlp import TabularMLP
from framework.methods.text_classifier import TextClassifier
from framework.tabular_spec import TabularSpec
from framework.text_spec import TextSpec

__all__ = [
    "BinaryPerceptronSA",
    "FusionClassifier",
    "ImageClassifier",
    "ImageSpec",
    "LayerFeatureSpec",
    "MCoverClassifier",
    "TabularEnsembleModule",
    "TabularMLP",
    "TabularSpec",
    "TextClassifier",
    "TextSpec",
]
