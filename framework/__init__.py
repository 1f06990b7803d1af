"""ripieno's framework: torch layers, LightningModules, metrics and the CLI.

Every method module derives from ``MemberModule``; the member protocol its steps follow is
declared in ``ripieno.framework.members``.
"""

from ripieno.framework import _moved
from ripieno.framework.loes.fusion import FusionClassifier
from ripieno.framework.mcover.module import MCoverClassifier
from ripieno.framework.mcover.perceptron_module import BinaryPerceptronSA
from ripieno.framework.members import MemberModel, MemberOutputKind, PredictOutput, StepOutput
from ripieno.framework.methods.image_classifier import ImageClassifier
from ripieno.framework.methods.member_module import MemberModule
from ripieno.framework.methods.tabular_ensemble import TabularEnsembleModule
from ripieno.framework.methods.tabular_mlp import TabularMLP
from ripieno.framework.methods.text_classifier import TextClassifier
from ripieno.framework.specs.image import ImageSpec
from ripieno.framework.specs.layer_features import LayerFeatureSpec
from ripieno.framework.specs.tabular import TabularSpec
from ripieno.framework.specs.text import TextSpec

_moved.install()  # old module paths (before framework/ was grouped by role) keep importing

__all__ = [
    "BinaryPerceptronSA",
    "FusionClassifier",
    "ImageClassifier",
    "ImageSpec",
    "LayerFeatureSpec",
    "MCoverClassifier",
    "MemberModel",
    "MemberModule",
    "MemberOutputKind",
    "PredictOutput",
    "StepOutput",
    "TabularEnsembleModule",
    "TabularMLP",
    "TabularSpec",
    "TextClassifier",
    "TextSpec",
]
