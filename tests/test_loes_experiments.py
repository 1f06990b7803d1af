"""The LOES comparison's summary: geometry weights chosen on validation, not test."""

import pandas as pd

from experiments import loes_comparison


def test_best_scale_is_chosen_on_validation_nll_per_k():
    rows = []
    for seed in range(2):
        for k, scale, val, acc in [(2, 0.0, 0.45, 0.99), (2, 0.1, 0.44, 0.70), (3, 0.0, 0.40, 0.70),
                                   (3, 0.1, 0.41, 0.99)]:
            rows.append({"variant": f"LOES K={k} scale={scale:g}", "seed": seed, "val_monitor": val,
                         "test/accuracy": acc, "test/nll": 0.5, "layers": "1 2"})
    table = loes_comparison.summarise(pd.DataFrame(rows))
    marked = [row["variant"] for row in table if row["variant"].endswith("(best on validation)")]
    assert marked == ["LOES K=2 scale=0.1 (best on validation)", "LOES K=3 scale=0 (best on validation)"]


def test_weight_variants_scale_all_three_geometry_terms():
    variants = loes_comparison.loes_weight_variants([3], [0.5])
    assert variants["LOES K=3 scale=0.5"] == [
        "--data.init_args.selection.method=loes", "--data.init_args.selection.k=3",
        "--data.init_args.selection.alpha=0.5", "--data.init_args.selection.gamma=0.25",
        "--data.init_args.selection.eta=0.05"]
