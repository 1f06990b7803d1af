"""Optuna studies over recipes, as a library: ``tune`` returns the study and its best configuration.

``study`` (``tune``, ``TuneOptions``, ``TuneResult`` and the steps ``ripieno tune`` composes), the
search spaces (``space``), storages (``study_storage``), workers, trial runs and their results.
Needs the ``tune`` extra (``pip install 'ripieno[tune]'``: optuna and optuna-integration); each name
is imported on first use, so ``import ripieno.framework.tuning`` imports no Optuna.

Example:
    >>> from ripieno.framework.tuning import TuneOptions
    >>> TuneOptions(n_trials=20, workers=2).startup_trials
    20
"""

from typing import TYPE_CHECKING

from ripieno.framework.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from ripieno.framework.tuning.space import SearchSpace
    from ripieno.framework.tuning.study import TuneOptions, TuneResult, tune

_EXPORTS = {
    "SearchSpace": "ripieno.framework.tuning.space",
    "TuneOptions": "ripieno.framework.tuning.study",
    "TuneResult": "ripieno.framework.tuning.study",
    "tune": "ripieno.framework.tuning.study",
}
__all__ = ["SearchSpace", "TuneOptions", "TuneResult", "tune"]
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
