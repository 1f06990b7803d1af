"""LightningDataModules for ripieno's methods."""

from datamodules.audio import AudioDataError, AudioDataModule, MissingAudioDataError
from datamodules.images import ImageDataError, ImageDataModule, MissingImageDataError
from datamodules.layer_embeddings import LayerEmbeddingDataModule
from datamodules.tabular import TabularDataError, TabularDataModule
from datamodules.tabular_sources import SOURCES
from datamodules.teacher_student import TeacherStudentDataModule
from datamodules.text import TextDataError, TextDataModule
from datamodules.vision_backbone import BackboneDataSpec, BackboneImageDataModule
from framework.image_spec import ImageSpec
from framework.text_spec import TextSpec

__all__ = [
    "AudioDataError",
    "AudioDataModule",
    "BackboneDataSpec",
    "BackboneImageDataModule",
    "SOURCES",
    "ImageDataError",
    "ImageDataModule",
    "ImageSpec",
    "LayerEmbeddingDataModule",
    "MissingAudioDataError",
    "MissingImageDataError",
    "TabularDataError",
    "TabularDataModule",
    "TeacherStudentDataModule",
    "TextDataError",
    "TextDataModule",
    "TextSpec",
]
