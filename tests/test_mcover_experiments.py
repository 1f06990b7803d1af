"""The M-cover experiments: sigma chosen on validation per collapse rule, outputs written."""

import pandas as pd
import pytest

from experiments import mcover_seeds


def _row(variant, seed, val, test):
    row = {"variant": variant, "seed": seed, "test/copy_accuracy": test, "wall_time_s": 1.0}
    for rule in mcover_seeds.RULES:
        row |= {f"val/{rule}_accuracy": val[rule], f"test/{rule}_accuracy": test}
    return row


def test_best_sigma_is_chosen_on_validation_per_rule_not_on_test():
    rows = []
    for seed in range(3):
        rows.append(_row("M-cover ring sigma=0.5", seed,
                         {"mean_weights": 0.90, "best_copy": 0.97, "copy_average": 0.90}, 0.99))
        rows.append(_row("M-cover ring sigma=2", seed,
                         {"mean_weights": 0.95, "best_copy": 0.93, "copy_average": 0.95}, 0.80))
        rows.append(_row("M=1 (plain SGD)", seed, dict.fromkeys(mcover_seeds.RULES, 0.99), 0.99))
    table, best = mcover_seeds.summarise(pd.DataFrame(rows))
    assert best == {"mean_weights": "M-cover ring sigma=2", "best_copy": "M-cover ring sigma=0.5",
                    "copy_average": "M-cover ring sigma=2"}
    assert table[1]["mean_weights_error"] == "0.2000 ± 0.0000 *"
    assert table[0]["best_copy_error"].endswith(" *") and not table[0]["mean_weights_error"].endswith("*")
    assert table[2]["single_copy_error"] == "0.0100 ± 0.0000"


def test_committee_family_runs_end_to_end(tmp_path):
    out = tmp_path / "out"
    mcover_seeds.main(["--family", "committee", "--seeds", "0", "--sigmas", "1", "--out", str(out),
                       "--override", "trainer.max_epochs=1",
                       "--override", "data.init_args.max_train_rows=300"])
    frame = pd.read_csv(out / "runs.csv")
    assert set(frame["variant"]) == {"M-cover ring sigma=1", "M-cover block-message", "M=1 (plain SGD)",
                                     "independent (diagonal Q)", "replicated SGD"}
    for rule in mcover_seeds.RULES:
        assert frame[f"test/{rule}_accuracy"].between(0, 1).all()
        assert (frame[f"{rule}_epoch"] == 0).all()
    plain = frame[frame["variant"] == "M=1 (plain SGD)"].iloc[0]  # one copy: every rule is that copy
    assert plain["test/mean_weights_accuracy"] == pytest.approx(plain["test/best_copy_accuracy"])
    assert plain["test/copy_average_accuracy"] == pytest.approx(plain["test/best_copy_accuracy"])
    assert (out / "summary.md").read_text().count("|") > 10
    assert (out / "test_error.png").read_bytes()[:4] == b"\x89PNG"
    assert not list(out.rglob("*.ckpt"))  # checkpoints stay in a temporary folder


def test_claim_verdicts_follow_the_seed_spread():
    from experiments import claims_mcover

    assert claims_mcover.compare([0.10, 0.11, 0.09], [0.20, 0.21, 0.19]) == "better"
    assert claims_mcover.compare([0.20, 0.21, 0.19], [0.10, 0.11, 0.09]) == "worse"
    assert claims_mcover.compare([0.10, 0.20, 0.15], [0.12, 0.22, 0.17]) == "tie"  # within 2 SE
    assert claims_mcover.compare([0.1], [0.5]) == "tie"  # one seed says nothing
    assert claims_mcover.verdict(["better", "better"], reduced=False) == "reproduced"
    assert claims_mcover.verdict(["better", "tie", "worse"], reduced=False) == "partly"
    assert claims_mcover.verdict(["tie", "worse"], reduced=False) == "not reproduced"
    assert claims_mcover.verdict(["tie", "tie"], reduced=False) == "inconclusive"
    assert claims_mcover.verdict(["better", "better"], reduced=True) == "inconclusive"


@pytest.mark.slow
def test_claims_mcover_reduced_rows_are_well_formed(tmp_path):
    """The M-cover claims experiment in its CI setting: six rows, every rule's tables written."""
    from experiments import claims_mcover
    from experiments.claim_rows import VERDICTS, ClaimRow

    rows = claims_mcover.claim_rows(tmp_path, reduced=True)
    assert len(rows) == 6 and all(isinstance(r, ClaimRow) for r in rows)
    for row in rows:
        assert row.verdict in VERDICTS and row.verdict == "inconclusive"  # reduced: one seed
        assert row.method == "M-cover" and "--reduced" in row.command
        assert all([row.claim, row.data, row.reference, row.ours, row.baseline, row.seeds, row.note])
        for label in mcover_seeds.RULE_LABELS.values():
            assert label in row.reference and label in row.note
    assert "replicated SGD" in rows[0].baseline and "plain SGD" in rows[1].baseline
    assert "replicated SA" in rows[4].baseline and "plain SA" in rows[5].baseline
    for family in ("mlp_mnist5k", "committee_fashion_mnist"):
        frame = pd.read_csv(tmp_path / family / "runs.csv")
        assert {"M-cover ring sigma=1", "M-cover block-message", "replicated SGD", "M=1 (plain SGD)",
                "independent (diagonal Q)"} == set(frame["variant"])
        for rule in mcover_seeds.RULES:
            assert frame[f"test/{rule}_accuracy"].between(0, 1).all()
        for name in ("summary.md", "test_error.png"):
            assert (tmp_path / family / name).is_file(), name
    perceptron = pd.read_csv(tmp_path / "perceptron" / "results.csv")
    assert set(perceptron["method"]) == {"plain", "replicated", "mcover"}
    rules = ["gen_error_mean_weights", "gen_error_best_copy", "gen_error_copy_average"]
    assert ((perceptron[rules] >= 0) & (perceptron[rules] <= 1)).all().all()
    for name in ("claims.md", "settings.json", "perceptron/summary.md", "perceptron/gen_error_vs_alpha.png"):
        assert (tmp_path / name).is_file(), name
    assert "M-cover simulated annealing" in (tmp_path / "claims.md").read_text()
    assert not list(tmp_path.rglob("*.ckpt"))


def test_ring_width_counts_as_interior_away_from_both_ends():
    from experiments.claims_mcover_tuning import SIGMA_RANGE, interior

    low, high = SIGMA_RANGE
    assert interior((low * high) ** 0.5)  # the geometric middle of the range
    assert not interior(low) and not interior(high)
    assert not interior(low * (high / low) ** 0.09) and interior(low * (high / low) ** 0.11)


@pytest.mark.slow
def test_claims_mcover_tuning_reduced_tunes_and_compares_with_both_limits(tmp_path):
    """``ripieno tune`` of the ring kernel, then the best (sigma, mu) against diagonal and uniform."""
    import pandas as pd
    import yaml

    from experiments import claims_mcover_tuning

    (row,) = claims_mcover_tuning.claim_rows(tmp_path, reduced=True)
    study = tmp_path / "perceptron" / "study"
    trials = pd.read_csv(study / "trials.csv")
    assert len(trials) == 2 and (trials["state"] == "COMPLETE").all()
    best = trials.loc[trials["val/error_collapsed"].idxmin()]
    sigma = yaml.safe_load((study / "best.yaml").read_text())["model"]["init_args"]["sigma"]
    assert sigma == pytest.approx(best["model.init_args.sigma"])
    assert f"sigma={sigma:.3g}" in row.reference
    final = pd.read_csv(tmp_path / "perceptron" / "final.csv")
    variants = ["tuned ring", "diagonal (sigma -> 0)", "uniform (sigma -> inf)"]
    assert sorted(final["variant"]) == sorted(variants)
    assert final["test_error"].between(0, 1).all()
    assert row.verdict == "inconclusive"  # reduced: one seed says nothing
    assert not list((tmp_path / "perceptron" / "final").rglob("*.ckpt"))
