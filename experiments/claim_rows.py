"""One row of the side-by-side reproduction report (``docs/results/claims.md``).

Every experiment that checks a seed paper's claim exposes::

    def claim_rows(out: Path, *, reduced: bool) -> list[ClaimRow]

which runs the experiment (``reduced``: a setting small enough for CI, e.g. one seed, few
epochs, subsampled data; otherwise the full setting the report's committed numbers come from),
writes its tables under ``out`` and returns one :class:`ClaimRow` per claim it tests.
``experiments.claims`` collects the rows of every experiment into the report.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
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
    if not values:
        return "n/a"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def compare(ours: Sequence[float], baseline: Sequence[float]) -> str:
    """``better``, ``worse`` or ``tie`` of per-seed errors (lower is better); ``tie`` with one seed.

    Better / worse: the means differ by more than two standard errors of the difference
    (Welch, ``sqrt(s1^2/n1 + s2^2/n2)``). Pass ``1 - accuracy`` or ``-score`` for metrics
    where higher is better.

    Args:
        ours: the method's per-seed errors.
        baseline: the baseline's per-seed errors.

    Returns:
        ``"better"``, ``"worse"`` or ``"tie"``.

    Example:
        >>> compare([0.10, 0.11, 0.09], [0.20, 0.21, 0.19])
        'better'
    """
    if len(ours) < 2 or len(baseline) < 2:
        return "tie"
    diff = statistics.fmean(baseline) - statistics.fmean(ours)
    se = math.sqrt(statistics.variance(ours) / len(ours) + statistics.variance(baseline) / len(baseline))
    if abs(diff) <= 2 * se or diff == 0:
        return "tie"
    return "better" if diff > 0 else "worse"


def verdict(outcomes: Sequence[str], reduced: bool) -> Verdict:
    """A row's verdict from its outcomes (each ``better``, ``worse`` or ``tie``).

    *reproduced* when every outcome is better, *partly* when some are, *not reproduced* when
    none is and some are worse, *inconclusive* when all are ties or the run was ``reduced``.

    Args:
        outcomes: one outcome per comparison the claim covers.
        reduced: whether the run was the reduced (CI) setting.

    Returns:
        The verdict.
    """
    if reduced or all(o == "tie" for o in outcomes):
        return "inconclusive"
    if all(o == "better" for o in outcomes):
        return "reproduced"
    return "partly" if "better" in outcomes else "not reproduced"


def by_outcome(outcomes: dict[str, str]) -> str:
    """``"holds for: ...; opposite for: ...; within the seed spread: ..."`` of named outcomes.

    Args:
        outcomes: ``name -> better | worse | tie``.

    Returns:
        The text, the groups in that order, empty groups left out.
    """
    parts = []
    texts = {"better": "holds for", "worse": "opposite for", "tie": "within the seed spread"}
    for outcome, text in texts.items():
        names = [name for name, o in outcomes.items() if o == outcome]
        if names:
            parts.append(f"{text}: {', '.join(names)}")
    return "; ".join(parts)


def claims_table(rows: Sequence[ClaimRow]) -> str:
    """The markdown table an experiment writes as its ``claims.md`` (read by ``claims --collect``).

    >>> text = claims_table([ClaimRow("M", "c", "d", "r", "o", "b", "0", "cmd", "inconclusive")])
    >>> text.splitlines()[2]
    '| M | c | d | r | o | b | 0 | cmd | inconclusive |  |'
    """
    fields = [f.name for f in dataclasses.fields(ClaimRow)]
    lines = ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
    lines += ["| " + " | ".join(str(getattr(row, f)).replace("|", "/") for f in fields) + " |"
              for row in rows]
    return "\n".join(lines) + "\n"
