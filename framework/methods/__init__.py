"""LightningModules of ripieno's methods."""

from framework.methods.image_classifier import ImageClassifier
from framework.methods.loss_terms import LossTermsMixin
from framework.methods.tabular_ensemble import TabularEnsembleModule
from framework.methods.tabular_mlp import TabularMLP
from framework.methods.text_classifier import TextClassifier

__all__ = ["ImageClassifier", "LossTermsMixin", "TabularEnsembleModule", "TabularMLP",
           "TextClassifier"]
