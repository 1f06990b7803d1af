"""The settings of the post-hoc sampler callbacks, checked when a callback is built.

A posterior sampler does its work after the whole training (``on_fit_end``) or in ``test``, so
a count, grid or probability that cannot work must stop the run before training starts, not
after it. Every sampler callback checks its settings in ``__init__`` with these helpers; they
raise ``SamplerSettingError``, whose message is one line naming the callback, the argument and
its value, why the value cannot work and the fix. The ``ripieno`` command prints it alone,
without a traceback; in Python it is a ``ValueError``.

Example:
    >>> check_count("SWAGSampler", "collect_every", 2, minimum=1, why="it counts epochs")
    >>> try:
    ...     check_positive("LastLayerSampler", "prior_precision", 0.0, why="it scales the prior")
    ... except SamplerSettingError as error:
    ...     print(error)
    LastLayerSampler(prior_precision=0.0): prior_precision must be a finite number > 0, as it scales the
    prior; set a positive value.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ripieno.framework.errors import RipienoInputError

#: Why a posterior predictive needs two samples or more (the sampled metrics are about their spread).
SPREAD_NEEDS_TWO = ("the predictive uncertainty is the spread of the samples (VARROC ranks points by their"
                    " variance, the Gaussian NLL and CRPS add it to the noise) and one sample has none")

#: The ``likelihood`` settings of the sampler callbacks (``auto``: from ``pl_module.task``).
LIKELIHOODS = ("auto", "regression", "classification", "binary")


class SamplerSettingError(RipienoInputError):
    """A sampler callback's argument that cannot work; the message names it, its value, why and the fix."""


def setting_error(owner: str, name: str, value: object, problem: str, fix: str) -> SamplerSettingError:
    """The one-line error ``<owner>(<name>=<value>): <problem>; <fix>.``.

    Args:
        owner: the callback's class name, e.g. ``"LastLayerSampler"``.
        name: the argument, e.g. ``"n_samples"``.
        value: the value given.
        problem: what is wrong with it and why.
        fix: what to set instead.
    """
    return SamplerSettingError(f"{owner}({name}={value!r}): {problem}; {fix.rstrip('.')}.")


def check_choice(owner: str, name: str, value: object, choices: Sequence[object]) -> None:
    """Raise unless ``value`` is one of ``choices``.

    Args:
        owner: the callback's class name.
        name: the argument.
        value: the value given.
        choices: the values that work.
    """
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise setting_error(owner, name, value, f"{name} must be one of {listed}", "pick one of them")


def check_likelihood(owner: str, likelihood: str, noise_variance: float | None,
                     choices: Sequence[str] = LIKELIHOODS) -> None:
    """Raise unless ``likelihood`` is one of ``choices`` and ``noise_variance`` is ``None`` or ``> 0``.

    Args:
        owner: the callback's class name.
        likelihood: the ``likelihood`` given.
        noise_variance: the regression noise variance given (``None``: estimated).
        choices: the likelihoods the callback supports.
    """
    check_choice(owner, "likelihood", likelihood, choices)
    if noise_variance is not None:
        check_positive(owner, "noise_variance", noise_variance, "it is the regression noise variance")


def check_count(owner: str, name: str, value: int, minimum: int, why: str, fix: str | None = None) -> None:
    """Raise unless ``value`` is an integer ``>= minimum``.

    Args:
        owner: the callback's class name.
        name: the argument.
        value: the value given.
        minimum: the smallest value that works.
        why: why smaller values cannot work.
        fix: what to set instead (default: ``set <name> >= <minimum>``).
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise setting_error(owner, name, value, f"{name} must be an integer >= {minimum}, as {why}",
                            fix or f"set {name} to {minimum} or more")


def check_n_samples(owner: str, value: int) -> None:
    """Raise unless ``n_samples >= 2`` (``SPREAD_NEEDS_TWO`` says why)."""
    check_count(owner, "n_samples", value, 2, SPREAD_NEEDS_TWO,
                "set n_samples to 2 or more (10 is the default)")


def check_positive(owner: str, name: str, value: float, why: str, allow_zero: bool = False) -> None:
    """Raise unless ``value`` is a finite number ``> 0`` (``>= 0`` with ``allow_zero``).

    Args:
        owner: the callback's class name.
        name: the argument.
        value: the value given.
        why: what the value does (why it must be positive).
        allow_zero: accept ``0`` too.
    """
    number = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not number or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise setting_error(owner, name, value, f"{name} must be a finite number {bound}, as {why}",
                            "set a non-negative value" if allow_zero else "set a positive value")


def check_fraction(owner: str, name: str, value: float, why: str) -> None:
    """Raise unless ``value`` is a number in ``[0, 1)``.

    Args:
        owner: the callback's class name.
        name: the argument.
        value: the value given.
        why: what the value does (why it must be below 1).
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        raise setting_error(owner, name, value, f"{name} must be in [0, 1), as {why}",
                            f"set {name} to a value in [0, 1)")


def check_grid(owner: str, name: str, grid: Sequence[float] | None, why: str) -> None:
    """Raise unless ``grid`` is ``None`` or a non-empty list of finite numbers ``> 0``.

    Args:
        owner: the callback's class name.
        name: the argument.
        grid: the candidate values given.
        why: what the values do (why they must be positive).
    """
    if grid is None:
        return
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in grid)
    if not grid or not numbers or min(grid) <= 0:
        raise setting_error(owner, name, grid, f"{name} needs positive values (at least one), as {why}",
                            f"list positive candidates, e.g. {name}=[0.1, 1.0, 10.0], or leave it out")
