"""Seeded studies that continue: each trial draws with its own seed, derived from ``--seed`` and its number.

Optuna seeds a sampler once, when it is built. A study continued by the same command (or shared by
two workers built with the same seed) therefore replays the random draws of its first trials: the
same configurations again. ``TrialSeededSampler`` builds the wrapped sampler afresh for every trial,
seeded by ``(seed, trial number)``. Trial numbers are unique within a study, whoever runs the trial,
so no two trials share a seed; a new study with the same seed draws the same trials again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler
from optuna.trial import FrozenTrial, TrialState


def trial_seed(seed: int, number: int) -> int:
    """The seed of trial ``number`` in a study seeded ``seed`` (``numpy``'s ``SeedSequence`` of both).

    Example:
        >>> trial_seed(0, 0) == trial_seed(0, 0), trial_seed(0, 0) == trial_seed(0, 1)
        (True, False)
    """
    return int(np.random.SeedSequence([seed, number]).generate_state(1)[0])


class TrialSeededSampler(BaseSampler):
    """A sampler built anew for each trial with the seed ``trial_seed(seed, trial.number)``.

    Args:
        seed: the study's seed (``--seed``).
        build: makes the wrapped sampler from a seed, e.g. ``lambda s: optuna.samplers.TPESampler(seed=s)``.
            The wrapped sampler must keep no state between trials but its random generator (Optuna's
            TPE and random samplers read everything else from the study).

    Example:
        >>> import optuna
        >>> def draws(seed, n):
        ...     study = optuna.create_study(sampler=TrialSeededSampler(seed, optuna.samplers.RandomSampler))
        ...     study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=n)
        ...     return [t.params["x"] for t in study.trials]
        >>> draws(0, 3)[:2] == draws(0, 2)  # the same seed: the same first trials
        True
        >>> len(set(draws(0, 4)))  # every trial its own draw
        4
    """

    def __init__(self, seed: int, build: Callable[[int], BaseSampler]) -> None:
        self.seed = int(seed)
        self._build = build
        self._number: int | None = None
        self._sampler: BaseSampler = build(self.seed)

    def _for(self, trial: FrozenTrial) -> BaseSampler:
        """The sampler of ``trial`` (built on its first use)."""
        if trial.number != self._number:
            self._number = trial.number
            self._sampler = self._build(trial_seed(self.seed, trial.number))
        return self._sampler

    def infer_relative_search_space(
        self, study: optuna.Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        """The wrapped sampler's, for this trial."""
        return self._for(trial).infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        """The wrapped sampler's, for this trial."""
        return self._for(trial).sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:  # noqa: ANN401 - a value of the distribution
        """The wrapped sampler's, for this trial."""
        return self._for(trial).sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """The wrapped sampler's, for this trial (built here, with the trial's seed)."""
        self._for(trial).before_trial(study, trial)

    def after_trial(
        self,
        study: optuna.Study,
        trial: FrozenTrial,
        state: TrialState,
        values: Sequence[float] | None,
    ) -> None:
        """The wrapped sampler's, for this trial."""
        self._for(trial).after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        """Nothing to do: each trial's seed is fixed by its number (Optuna calls this for ``n_jobs``)."""
