"""ripieno's framework: torch layers, LightningModules, metrics and the CLI.

Every method module derives from ``MemberModule``; the member protocol its steps follow is
declared in ``ripieno.framework.members``.

Every public name is imported on first use (``lazy_exports``): importing the package, or a
module of it, imports no method it does not use.
"""

from typing import TYPE_CHECKING

from ripieno.framework import _moved
from ripieno.framework.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time each name is imported on first use
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

_EXPORTS = {
    "FusionClassifier": "ripieno.framework.loes.fusion",
    "MCoverClassifier": "ripieno.framework.mcover.module",
    "BinaryPerceptronSA": "ripieno.framework.mcover.perceptron_module",
    "MemberModel": "ripieno.framework.members",
    "MemberOutputKind": "ripieno.framework.members",
    "PredictOutput": "ripieno.framework.members",
    "StepOutput": "ripieno.framework.members",
    "ImageClassifier": "ripieno.framework.methods.image_classifier",
    "MemberModule": "ripieno.framework.methods.member_module",
    "TabularEnsembleModule": "ripieno.framework.methods.tabular_ensemble",
    "TabularMLP": "ripieno.framework.methods.tabular_mlp",
    "TextClassifier": "ripieno.framework.methods.text_classifier",
    "ImageSpec": "ripieno.framework.specs.image",
    "LayerFeatureSpec": "ripieno.framework.specs.layer_features",
    "TabularSpec": "ripieno.framework.specs.tabular",
    "TextSpec": "ripieno.framework.specs.text",
}
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
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

_moved.install()  # old module paths (before framework/ was grouped by role) keep importing
