"""experiments.claims: rows from every source collected into one markdown report."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from experiments import claims
from experiments.claim_rows import ClaimRow, mean_std


def _row(verdict: str) -> ClaimRow:
    return ClaimRow(method="M", claim="a | b", data="d", reference="0.9", ours="0.8", baseline="0.7",
                    seeds="0, 1", command="python -m x", verdict=verdict)  # type: ignore[arg-type]


def test_report_collects_rows_and_names_missing_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Path, bool]] = []

    def claim_rows(out: Path, *, reduced: bool) -> list[ClaimRow]:
        calls.append((out, reduced))
        return [_row("reproduced"), _row("not reproduced")]

    fake = types.ModuleType("experiments._fake_claims")
    fake.claim_rows = claim_rows  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "experiments._fake_claims", fake)
    sources = {"fake": "experiments._fake_claims", "gone": "experiments._absent_x"}
    monkeypatch.setattr(claims, "SOURCES", sources)
    report = claims.main(["--out", str(tmp_path), "--reduced", "--only", "fake", "gone"])
    text = report.read_text()
    assert calls == [(tmp_path / "fake", True)]
    assert text.count("| M |") == 2 and "a \\| b" in text
    assert "reproduced 1, partly 0, not reproduced 1, inconclusive 0" in text
    assert "Not run (module missing): gone" in text


def test_claim_row_rejects_unknown_verdicts_and_formats_means() -> None:
    with pytest.raises(ValueError, match="verdict"):
        _row("sort of")
    assert mean_std([1.0, 2.0, 3.0]) == "2.000 ± 1.000"
    assert mean_std([0.5]) == "0.500" and mean_std([]) == "n/a"
