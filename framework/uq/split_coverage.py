"""Coverage of split conformal over random calibration / test splits of held-out rows.

Given a pool of rows a model never trained on, a random split into ``n`` calibration rows and
the rest makes the rows exchangeable, so the mean test coverage over random splits lies in
``[1 - alpha, 1 - alpha + 1 / (n + 1)]`` exactly, whatever the model: a check of a conformal
pipeline that needs no distributional assumption. The upper bound needs scores without ties and
exact sets (LAC, intervals, APS / RAPS with ``include_last_label="randomized"``); MAPIE's default
APS sets (``include_last_label=True``) are conservative and meet the lower bound only. ``tests/`` and
``bench/conformal_coverage.py`` run it for ripieno's ensembles, GBDTs and Lightning modules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ripieno.framework.uq.conformal import ConformalError, SplitConformal, coverage


@dataclass(frozen=True)
class SplitCoverage:
    """The coverage of ``rounds`` random splits and split conformal's bounds for them.

    Attributes:
        mean: mean test coverage over the splits.
        standard_error: its Monte Carlo standard error (std over splits / sqrt(rounds)).
        lower: ``1 - alpha``.
        upper: ``1 - alpha + 1 / (n + 1)`` (asymmetric CQR: ``2 / (n + 1)``, one rank per side;
            Mondrian: 1, the classes' counts differ).
        rounds: the number of splits.
        n_calibration: calibration rows per split.
        mean_size: mean set size (classification) or interval width (regression).
    """

    mean: float
    standard_error: float
    lower: float
    upper: float
    rounds: int
    n_calibration: int
    mean_size: float

    def within(self, standard_errors: float = 4.0) -> bool:
        """Whether ``mean`` is within the bounds, widened by ``standard_errors`` Monte Carlo errors."""
        slack = standard_errors * self.standard_error
        return self.lower - slack <= self.mean <= self.upper + slack


def random_split_coverage(conformal: SplitConformal, outputs: Any, y: Any, *, n_calibration: int,  # noqa: ANN401
                          rounds: int = 200, seed: int = 0) -> SplitCoverage:
    """Calibrate ``conformal`` on ``rounds`` random subsets of the rows and score the rest.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> y = torch.randn(300, generator=g)
        >>> result = random_split_coverage(SplitConformal("absolute", 0.1), torch.zeros(300), y,
        ...                                n_calibration=100)
        >>> result.within(), (round(result.lower, 3), round(result.upper, 3))
        (True, (0.9, 0.91))

    Args:
        conformal: an uncalibrated ``SplitConformal`` (its method reads ``outputs`` as ``calibrate`` does).
        outputs: the model's outputs on the pool: probabilities ``(N, C)``, point predictions ``(N,)``,
            or a pair of ``(N,)`` vectors (``normalized``: prediction and spread; ``cqr``: lower and upper).
        y: the pool's classes or targets ``(N,)``.
        n_calibration: calibration rows per split (the rest are the test rows).
        rounds: the number of random splits.
        seed: seeds the splits.

    Raises:
        ConformalError: fewer than one test row, or a pool of mismatched lengths.
    """
    pair = isinstance(outputs, tuple | list)
    parts = [torch.as_tensor(o) for o in (outputs if pair else (outputs,))]
    target = torch.as_tensor(y)
    n = target.shape[0]
    if any(p.shape[0] != n for p in parts):
        raise ConformalError(f"random_split_coverage: outputs and y must have the same rows, got"
                             f" {[p.shape[0] for p in parts]} and {n}.")
    if not 0 < n_calibration < n:
        raise ConformalError(f"random_split_coverage: n_calibration={n_calibration} must leave test rows"
                             f" out of the {n}; use 0 < n_calibration < {n}.")
    generator = torch.Generator().manual_seed(seed)
    coverages, sizes = [], []
    for _ in range(rounds):
        order = torch.randperm(n, generator=generator)
        cal, test = order[:n_calibration], order[n_calibration:]

        def rows(index: torch.Tensor) -> Any:  # noqa: ANN401
            picked = [p[index] for p in parts]
            return tuple(picked) if pair else picked[0]

        fitted = conformal.calibrate(rows(cal), target[cal], generator=generator)
        if fitted.is_classification:
            sets = fitted.predict_sets(rows(test), generator=generator)
            coverages.append(coverage(sets, target[test]))
            sizes.append(float(sets.sum(1).double().mean()))
        else:
            lower, upper = fitted.predict_intervals(rows(test))
            coverages.append(coverage((lower, upper), target[test]))
            sizes.append(float((upper - lower).mean()))
    values = torch.tensor(coverages, dtype=torch.float64)
    error = float(values.std() / math.sqrt(rounds)) if rounds > 1 else math.inf
    return SplitCoverage(mean=float(values.mean()), standard_error=error, lower=1 - conformal.alpha,
                         upper=_upper_bound(conformal, n_calibration), rounds=rounds,
                         n_calibration=n_calibration, mean_size=float(torch.tensor(sizes).mean()))


def _upper_bound(conformal: SplitConformal, n: int) -> float:
    """The most a split's expected coverage can reach: one rank above the threshold per side."""
    if conformal.mondrian:  # per class, each with its own count: no marginal bound below 1 is claimed
        return 1.0
    sides = 2 if conformal.method == "cqr" and not conformal.symmetric else 1
    return min(1.0, 1 - conformal.alpha + sides / (n + 1))
