"""``fit``, ``test`` and ``predict`` under the ``ddp`` launcher that multi-GPU users get (gloo on CPU).

``--trainer.strategy=ddp`` starts rank 1 by running the same command again in a subprocess, unlike
``ddp_spawn``: every code path runs in two independent processes, and anything that rank 0 does
alone must not wait for rank 1 (``test_rank_zero_blocks.py``). Oracles: exact identities. The run
ends with exit 0, both ranks started, one summary and one run folder; the test metrics under ddp
equal those of one process on the same checkpoint (torchmetrics reduces over ranks, and wine's 36
test rows split evenly); the two ranks' prediction tables together are the one-process table, row
for row.
"""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

WINE = "tabular/lometab_wine"
DDP = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu"]
ONE = ["--trainer.strategy=auto", "--trainer.devices=1", "--trainer.accelerator=cpu"]
SMALL = ["--trainer.max_epochs=2", "--model.init_args.k=4", "--model.init_args.d_block=32",
         "--trainer.enable_progress_bar=false"]


def _ripieno(folder: Path, *args: str) -> str:
    """Run ``ripieno`` as a user does; its whole output (stdout and stderr), after checking exit 0."""
    result = subprocess.run([sys.executable, "-m", "ripieno", *args], cwd=folder, capture_output=True,
                            text=True, timeout=900)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Traceback" not in output, output
    return output


def _test_row(folder: Path) -> dict[str, float]:
    (metrics,) = folder.rglob("metrics.csv")
    (row,) = [r for r in csv.DictReader(metrics.open()) if r.get("test/nll")]
    return {k: float(v) for k, v in row.items() if k.startswith("test/") and v}


@pytest.mark.slow
def test_fit_test_and_predict_under_the_ddp_launcher_finish_with_one_summary(tmp_path):
    out = _ripieno(tmp_path, "fit", "-c", WINE, *DDP, *SMALL, "--trainer.default_root_dir=run")
    assert "GLOBAL_RANK: 0" in out and "GLOBAL_RANK: 1" in out  # two processes, as on two GPUs
    assert out.count("ripieno: test metrics of best checkpoint") == 1
    assert sorted(p.name for p in (tmp_path / "run" / "logs").iterdir()) == ["version_0"]
    run = tmp_path / "run" / "logs" / "version_0"
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [r["epoch"] for r in rows if r.get("val/nll")] == ["0", "1"]
    best = re.search(r"ripieno: checkpoint (\S+)", out).group(1)

    config = str(run / "config.yaml")
    _ripieno(tmp_path, "test", "-c", config, "--ckpt_path", best, *DDP, "--trainer.default_root_dir=t_ddp")
    _ripieno(tmp_path, "test", "-c", config, "--ckpt_path", best, *ONE, "--trainer.default_root_dir=t_one")
    ddp, one = _test_row(tmp_path / "t_ddp"), _test_row(tmp_path / "t_one")
    assert ddp.keys() == one.keys() and ddp == pytest.approx(one, rel=1e-5)

    _ripieno(tmp_path, "predict", "-c", config, "--ckpt_path", best, *DDP, "--trainer.default_root_dir=p_ddp")
    _ripieno(tmp_path, "predict", "-c", config, "--ckpt_path", best, *ONE, "--trainer.default_root_dir=p_one")
    ranks = sorted((tmp_path / "p_ddp").rglob("predictions_rank*.csv"))
    assert [p.name for p in ranks] == ["predictions_rank0.csv", "predictions_rank1.csv"]
    (single,) = (tmp_path / "p_one").rglob("predictions.csv")
    one_table = pd.read_csv(single)
    key = one_table.columns[0]  # the rows' ids
    both = pd.concat([pd.read_csv(p) for p in ranks]).sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(both, one_table.sort_values(key).reset_index(drop=True), rtol=1e-5)


SPACE = """\
params:
  model.init_args.rank: {type: categorical, choices: [1, 2, 4]}
  model.init_args.lr: {type: float, low: 1.0e-3, high: 5.0e-3, log: true}
"""


@pytest.mark.slow
def test_tune_runs_one_trial_per_process_group_under_the_ddp_launcher(tmp_path):
    """Each trial's fit runs on two ranks and ends with them; the study runs once, with one summary."""
    (tmp_path / "space.yaml").write_text(SPACE)
    out = _ripieno(tmp_path, "tune", "-c", WINE, "--space", "space.yaml", "--n_trials", "2", "--seed", "0",
                   "--study_dir", "study", *DDP, *SMALL)
    assert "ripieno: study tabular_lometab_wine: 2/2 trials finished (2 complete)" in out
    assert out.count("ripieno: best.yaml") == 1 and out.count("GLOBAL_RANK: 1") == 2  # a rank 1 per trial
    rows = list(csv.DictReader((tmp_path / "study" / "trials.csv").open()))
    assert [r["state"] for r in rows] == ["COMPLETE", "COMPLETE"]
    for row in rows:  # each trial: one run folder, both epochs validated
        (metrics,) = (tmp_path / row["folder"]).rglob("metrics.csv")
        assert [r["epoch"] for r in csv.DictReader(metrics.open()) if r.get("val/nll")] == ["0", "1"]
    assert not (tmp_path / "runs").exists()  # no rank started a study or a run of its own


@pytest.mark.slow
def test_loes_extraction_and_selection_under_the_ddp_launcher_run_once(tmp_path):
    """The layer embeddings are extracted and selected once, both ranks train on them, one summary."""
    source = {"class_path": "ripieno.datamodules.TextDataModule",
              "init_args": {"dataset": "rotten_tomatoes", "max_length": 64, "build_tokenizer": True,
                            "split_seed": 0, "max_rows": 200}}
    out = _ripieno(tmp_path, "fit", "-c", "loes/text_gpt2_loes", *DDP, "--trainer.max_epochs=2",
                   f"--data.init_args.source={json.dumps(source)}", "--data.init_args.progress=false",
                   "--trainer.enable_progress_bar=false")
    assert "GLOBAL_RANK: 0" in out and "GLOBAL_RANK: 1" in out
    assert out.count("LayerEmbeddingDataModule: loes chose hidden states") == 1
    assert out.count("ripieno: test metrics of best checkpoint") == 1
    run = tmp_path / "runs" / "loes" / "text_gpt2_loes" / "logs"
    assert [p.name for p in run.iterdir()] == ["version_0"]
    assert [p.name for p in (run / "version_0").glob("selection_scores*.csv")] == ["selection_scores.csv"]


@pytest.mark.slow
def test_conformal_sets_and_intervals_under_the_ddp_launcher_equal_one_process(tmp_path, table_csv):
    """Every rank calibrates on all calibration rows and keeps rank 0's thresholds: test coverage and
    the predicted intervals equal one process's (240 rows: 48 test rows split evenly over 2 ranks)."""
    table = table_csv("regression", n=240)
    data = [f"--data.init_args.path={table}", "--data.init_args.target=y"]
    out = _ripieno(tmp_path, "fit", "-c", "tabular/lometab_csv", *DDP, *SMALL, *data,
                   "--trainer.default_root_dir=run")
    assert "GLOBAL_RANK: 1" in out and out.count("ripieno: test metrics of best checkpoint") == 1
    best = re.search(r"ripieno: checkpoint (\S+)", out).group(1)
    config = str(next((tmp_path / "run").rglob("config.yaml")))
    for name, flags in (("t_ddp", DDP), ("t_one", ONE)):
        _ripieno(tmp_path, "test", "-c", config, "--ckpt_path", best, *flags,
                 f"--trainer.default_root_dir={name}")
    rows = {}
    for name in ("t_ddp", "t_one"):
        (metrics,) = (tmp_path / name).rglob("metrics.csv")
        (row,) = [r for r in csv.DictReader(metrics.open()) if r.get("conformal/test/coverage")]
        rows[name] = {k: float(v) for k, v in row.items() if k.startswith("conformal/test/") and v}
    assert set(rows["t_one"]) == {"conformal/test/coverage", "conformal/test/width", "conformal/test/winkler"}
    assert rows["t_ddp"] == pytest.approx(rows["t_one"], rel=1e-5)

    new = tmp_path / "new.csv"
    pd.read_csv(table).head(21).drop(columns=["y"]).to_csv(new, index=False)  # odd: uneven shards
    for name, flags in (("p_ddp", DDP), ("p_one", ONE)):
        _ripieno(tmp_path, "predict", "-c", config, "--ckpt_path", best, *flags,
                 f"--data.init_args.predict_path={new}", f"--trainer.default_root_dir={name}")
    (single,) = (tmp_path / "p_one").rglob("predictions.csv")
    one_table = pd.read_csv(single)
    both = pd.concat([pd.read_csv(p) for p in sorted((tmp_path / "p_ddp").rglob("predictions_rank*.csv"))])
    both = both.drop_duplicates("row").sort_values("row").reset_index(drop=True)  # padding repeats a row
    assert {"lower", "upper"} <= set(one_table.columns) and len(one_table) == 21
    pd.testing.assert_frame_equal(both, one_table.sort_values("row").reset_index(drop=True), rtol=1e-5)
