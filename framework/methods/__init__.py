"""LightningModules of ripieno's methods."""

from ripieno.framework.methods.image_classifier import ImageClassifier
from ripieno.framework.methods.loss_terms import LossTermsMixin
from ripieno.framework.methods.member_module import MemberModule
from ripieno.framework.methods.tabular_ensemble import TabularEnsembleModule
from ripieno.framework.methods.tabular_mlp import TabularMLP
from ripieno.framework.methods.text_classifier import TextClassifier

__all__ = ["ImageClassifier", "LossTermsMixin", "MemberModule", "TabularEnsembleModule", "TabularMLP",
           "TextClassifier"]
