"""ripieno's framework: torch layers, LightningModules, metrics and the CLI."""

from framework.image_spec import ImageSpec
from framework.methods.image_classifier import ImageClassifier
from framework.methods.tabular_ensemble import TabularEnsembleModule
from framework.tabular_spec import TabularSpec

__all__ = ["ImageClassifier", "ImageSpec", "TabularEnsembleModule", "TabularSpec"]
