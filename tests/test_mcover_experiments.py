"""The M-cover seeds experiment: sigma chosen on validation, outputs written."""

import pandas as pd

from experiments import mcover_seeds


def test_best_sigma_is_chosen_on_validation_not_test():
    rows = []
    for seed in range(3):
        rows.append({"variant": "M-cover ring sigma=0.5", "seed": seed, "val_monitor": 0.90,
                     "test/collapsed_accuracy": 0.99, "test/accuracy": 0.99, "test/copy_accuracy": 0.99,
                     "wall_time_s": 1.0})
        rows.append({"variant": "M-cover ring sigma=2", "seed": seed, "val_monitor": 0.95,
                     "test/collapsed_accuracy": 0.80, "test/accuracy": 0.80, "test/copy_accuracy": 0.80,
                     "wall_time_s": 1.0})
    table, best = mcover_seeds.summarise(pd.DataFrame(rows))
    assert best == "M-cover ring sigma=2"
    assert table[1]["variant"].endswith("(best on validation)")
    assert table[1]["collapsed_error"] == "0.2000 ± 0.0000"


def test_committee_family_runs_end_to_end(tmp_path):
    out = tmp_path / "out"
    mcover_seeds.main(["--family", "committee", "--seeds", "0", "--sigmas", "1", "--out", str(out),
                       "--override", "trainer.max_epochs=1",
                       "--override", "data.init_args.max_train_rows=300"])
    frame = pd.read_csv(out / "runs.csv")
    assert set(frame["variant"]) == {"M-cover ring sigma=1", "M=1 (plain SGD)", "independent (diagonal Q)",
                                     "replicated SGD"}
    assert (out / "summary.md").read_text().count("|") > 10
    assert (out / "test_error.png").read_bytes()[:4] == b"\x89PNG"
