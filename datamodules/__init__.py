"""LightningDataModules for ripieno's methods."""

from datamodules.tabular import TabularDataError, TabularDataModule
from datamodules.tabular_sources import SOURCES

__all__ = ["SOURCES", "TabularDataError", "TabularDataModule"]
