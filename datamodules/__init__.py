"""LightningDataModules for ripieno's methods."""

from ripieno.datamodules.audio import AudioDataError, AudioDataModule, MissingAudioDataError
from ripieno.datamodules.base import DataModuleError
from ripieno.datamodules.images import ImageDataError, ImageDataModule, MissingImageDataError
from ripieno.datamodules.layer_embedding_config import BackboneConfig, FeatureCacheConfig, SelectionConfig
from ripieno.datamodules.layer_embeddings import LayerEmbeddingDataModule
from ripieno.datamodules.tabular import TabularDataError, TabularDataModule
from ripieno.datamodules.tabular_sources import SOURCES
from ripieno.datamodules.teacher_student import TeacherStudentDataModule
from ripieno.datamodules.text import TextDataError, TextDataModule
from ripieno.datamodules.vision_backbone import BackboneDataSpec, BackboneImageDataModule
from ripieno.framework.specs.image import ImageSpec
from ripieno.framework.specs.text import TextSpec

__all__ = [
    "AudioDataError",
    "AudioDataModule",
    "BackboneConfig",
    "BackboneDataSpec",
    "BackboneImageDataModule",
    "DataModuleError",
    "FeatureCacheConfig",
    "SOURCES",
    "ImageDataError",
    "ImageDataModule",
    "ImageSpec",
    "LayerEmbeddingDataModule",
    "MissingAudioDataError",
    "MissingImageDataError",
    "SelectionConfig",
    "TabularDataError",
    "TabularDataModule",
    "TeacherStudentDataModule",
    "TextDataError",
    "TextDataModule",
    "TextSpec",
]
