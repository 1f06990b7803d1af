"""What a module must know about its data, passed from datamodule to module, and fitted preprocessing.

Every modality's spec derives from ``DataSpec`` (``base``), which owns the plain-Python form
(``to_dict``/``coerce``) and the split between hyperparameters and fitted state
(``hparams_dict``/``fitted_state``): ``TabularSpec``, ``TextSpec``, ``ImageSpec``,
``LayerFeatureSpec``, ``BackboneDataSpec`` and ``TeacherStudentSpec``. The tabular spec's
fitted preprocessing is ``tabular_preprocessing`` (scikit-learn state as plain Python through
``sklearn_state``).
"""

from ripieno.framework.specs.backbone import BackboneDataSpec
from ripieno.framework.specs.base import DataSpec, DataSpecError
from ripieno.framework.specs.image import ImageSpec
from ripieno.framework.specs.layer_features import LayerFeatureSpec
from ripieno.framework.specs.tabular import TabularSpec
from ripieno.framework.specs.teacher_student import TeacherStudentSpec
from ripieno.framework.specs.text import TextSpec

__all__ = ["BackboneDataSpec", "DataSpec", "DataSpecError", "ImageSpec", "LayerFeatureSpec", "TabularSpec",
           "TeacherStudentSpec", "TextSpec"]
