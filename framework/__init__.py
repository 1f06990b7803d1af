"""ripieno's framework: torch layers, LightningModules, metrics and the CLI."""

from framework.methods.tabular_ensemble import TabularEnsembleModule
from framework.tabular_spec import TabularSpec

__all__ = ["TabularEnsembleModule", "TabularSpec"]
