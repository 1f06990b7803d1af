"""LightningDataModules for ripieno's methods."""

from datamodules.images import ImageDataError, ImageDataModule, MissingImageDataError
from datamodules.layer_embeddings import LayerEmbeddingDataModule
from datamodules.tabular import TabularDataError, TabularDataModule
from datamodules.tabular_sources import SOURCES
from datamodules.text import TextDataError, TextDataModule
from framework.image_spec import ImageSpec
from framework.text_spec import TextSpec

__all__ = [
    "SOURCES",
    "ImageDataError",
    "ImageDataModule",
    "ImageSpec",
    "LayerEmbeddingDataModule",
    "MissingImageDataError",
    "TabularDataError",
    "TabularDataModule",
    "TextDataError",
    "TextDataModule",
    "TextSpec",
]
