"""LightningDataModules for ripieno's methods.

Every public name is imported on first use (``ripieno.framework.lazy_exports``): a tabular
run imports no text, image or audio module.
"""

from typing import TYPE_CHECKING

from ripieno.framework.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time each name is imported on first use
    from ripieno.datamodules.audio import AudioDataError, AudioDataModule, MissingAudioDataError
    from ripieno.datamodules.base import DataModuleError
    from ripieno.datamodules.data_settings import LoaderSettings, SplitSettings
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

_EXPORTS = {
    "AudioDataError": "ripieno.datamodules.audio",
    "AudioDataModule": "ripieno.datamodules.audio",
    "MissingAudioDataError": "ripieno.datamodules.audio",
    "DataModuleError": "ripieno.datamodules.base",
    "LoaderSettings": "ripieno.datamodules.data_settings",
    "SplitSettings": "ripieno.datamodules.data_settings",
    "ImageDataError": "ripieno.datamodules.images",
    "ImageDataModule": "ripieno.datamodules.images",
    "MissingImageDataError": "ripieno.datamodules.images",
    "BackboneConfig": "ripieno.datamodules.layer_embedding_config",
    "FeatureCacheConfig": "ripieno.datamodules.layer_embedding_config",
    "SelectionConfig": "ripieno.datamodules.layer_embedding_config",
    "LayerEmbeddingDataModule": "ripieno.datamodules.layer_embeddings",
    "TabularDataError": "ripieno.datamodules.tabular",
    "TabularDataModule": "ripieno.datamodules.tabular",
    "SOURCES": "ripieno.datamodules.tabular_sources",
    "TeacherStudentDataModule": "ripieno.datamodules.teacher_student",
    "TextDataError": "ripieno.datamodules.text",
    "TextDataModule": "ripieno.datamodules.text",
    "BackboneDataSpec": "ripieno.datamodules.vision_backbone",
    "BackboneImageDataModule": "ripieno.datamodules.vision_backbone",
    "ImageSpec": "ripieno.framework.specs.image",
    "TextSpec": "ripieno.framework.specs.text",
}
__all__ = [
    "AudioDataError",
    "AudioDataModule",
    "BackboneConfig",
    "BackboneDataSpec",
    "BackboneImageDataModule",
    "DataModuleError",
    "FeatureCacheConfig",
    "ImageDataError",
    "ImageDataModule",
    "ImageSpec",
    "LayerEmbeddingDataModule",
    "LoaderSettings",
    "MissingAudioDataError",
    "MissingImageDataError",
    "SOURCES",
    "SelectionConfig",
    "SplitSettings",
    "TabularDataError",
    "TabularDataModule",
    "TeacherStudentDataModule",
    "TextDataError",
    "TextDataModule",
    "TextSpec",
]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
