"""One row of the side-by-side reproduction report (``docs/results/claims.md``).

Every experiment that checks a seed paper's claim exposes::

    def claim_rows(out: Path, *, reduced: bool) -> list[ClaimRow]

which runs the experiment (``reduced``: a setting small enough for CI, e.g. one seed, few
epochs, subsampled data; otherwise the full setting the report's committed numbers come from),
writes its tables under ``out`` and returns one :class:`ClaimRow` per claim it tests.
``experiments.claims`` collects the rows of every experiment into the report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Verdict = Literal["reproduced", "partly", "not reproduced", "inconclusive"]
VERDICTS: tuple[str, ...] = ("reproduced", "partly", "not reproduced", "inconclusive")


@dataclass(frozen=True)
class ClaimRow:
    """A paper claim, measured with the paper's reference variant, our variant and a baseline.

    Attributes:
        method: ``LoMETab``, ``LOES``, ``GeoReg``, ``LL-GLM / DNN-GLM`` or ``M-cover``.
        claim: The paper's claim, in one sentence.
        data: The data set(s) and model it was measured on.
        reference: The reference (paper-faithful) variant's result, with its unit, e.g.
            ``"acc 0.912 ± 0.004"``.
        ours: Our variant's result on the same data and seeds.
        baseline: The baseline the claim is made against, and its result.
        seeds: The seeds, e.g. ``"0, 1, 2"``.
        command: The shell command that reproduces the row (run from the repository root).
        verdict: ``reproduced``, ``partly``, ``not reproduced`` or ``inconclusive`` (e.g. the
            differences are within the seed spread, or the reduced setting is too small to say).
        note: What the verdict rests on, in one or two sentences.
    """

    method: str
    claim: str
    data: str
    reference: str
    ours: str
    baseline: str
    seeds: str
    command: str
    verdict: Verdict
    note: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}.")


def mean_std(values: list[float], digits: int = 3) -> str:
    """``"m ± s"`` of ``values`` (sample std; just ``"m"`` for one value).

    Args:
        values: The per-seed results.
        digits: Decimals shown.

    Returns:
        The formatted text.
    """
    import statistics

    if not values:
        return "n/a"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f}"
