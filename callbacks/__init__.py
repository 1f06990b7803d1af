"""Lightning callbacks that work with ripieno's modules and with users' own."""

from callbacks.diversity_monitor import DiversityMonitor

__all__ = ["DiversityMonitor"]
