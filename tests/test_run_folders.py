"""Runs never share an output folder (issue 13, item 2).

Lightning's loggers pick ``version_N`` by listing the folder, so two runs started together
could both take ``version_0`` and mix their metrics, checkpoints and config. Versions are
now claimed with ``mkdir`` and ``config.yaml`` is created exclusively.
"""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from jsonargparse import Namespace

from ripieno.framework.cli import main
from ripieno.framework.runner.run_folders import claim_logger_versions, claim_version

HERE = Path(__file__).resolve()
REPEATS = 10
FAST = ["--data.init_args.max_rows=300", "--model.init_args.k=2", "--model.init_args.d_block=16",
        "--trainer.max_epochs=1", "--trainer.limit_train_batches=1", "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        "--test_after_fit=false", "--tensorboard=false"]
LEARNING_RATES = ("0.002", "0.003")  # one per process: tells whose files are whose


def _claim_many(root: str, n: int, start: float, out: multiprocessing.Queue) -> None:
    while time.time() < start:  # all processes begin together
        pass
    out.put([claim_version(root) for _ in range(n)])


def test_processes_claiming_together_get_distinct_versions(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    start = time.time() + 0.5
    workers = [context.Process(target=_claim_many, args=(str(tmp_path), 10, start, out)) for _ in range(6)]
    for worker in workers:
        worker.start()
    claimed = [v for _ in workers for v in out.get(timeout=60)]
    for worker in workers:
        worker.join()
    assert sorted(claimed) == list(range(60))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"version_{v}" for v in range(60))


def test_versions_continue_after_the_highest(tmp_path: Path) -> None:
    (tmp_path / "version_7").mkdir()
    (tmp_path / "version_x").mkdir()
    assert claim_version(tmp_path) == 8


def test_only_file_loggers_without_a_version_are_claimed(tmp_path: Path) -> None:
    csv = Namespace(class_path="lightning.pytorch.loggers.CSVLogger",
                    init_args=Namespace(save_dir=str(tmp_path), name="logs", version=None))
    pinned = Namespace(class_path="lightning.pytorch.loggers.TensorBoardLogger",
                       init_args=Namespace(save_dir=str(tmp_path), name="tb", version=3))
    remote = Namespace(class_path="lightning.pytorch.loggers.CSVLogger",
                       init_args=Namespace(save_dir="s3://bucket/runs", name="logs", version=None))
    assert claim_logger_versions(Namespace(logger=[csv, pinned, remote])) == {tmp_path / "logs": 0}
    assert csv.init_args.version is None  # the saved config keeps naming no version


def _complete_run(folder: Path) -> str:
    """The learning rate of the one run in ``folder``, after checking every file is that run's."""
    config = yaml.safe_load((folder / "config.yaml").read_text())
    rate = str(config["model"]["init_args"]["lr"])
    metrics = pd.read_csv(folder / "metrics.csv")
    assert {"epoch", "val/nll"} <= set(metrics.columns) and set(metrics["epoch"].dropna()) == {0}
    names = sorted(p.name for p in (folder / "checkpoints").iterdir())
    assert names[-1] == "last.ckpt" and names[0].startswith("best-") and len(names) == 2
    for name in names:
        saved = torch.load(folder / "checkpoints" / name, map_location="cpu", weights_only=True)
        assert str(saved["hyper_parameters"]["lr"]) == rate
    return rate


@pytest.mark.slow
def test_two_fits_started_together_in_one_folder_end_as_two_complete_runs(tmp_path: Path) -> None:
    workers = [subprocess.Popen([sys.executable, str(HERE), str(tmp_path), str(i)], cwd=HERE.parent,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (0, 1)]
    outputs = [worker.communicate(timeout=600)[0] for worker in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    for repeat in range(REPEATS):
        logs = tmp_path / f"repeat_{repeat}" / "logs"
        folders = sorted(logs.iterdir())
        assert [f.name for f in folders] == ["version_0", "version_1"]
        assert sorted(_complete_run(f) for f in folders) == list(LEARNING_RATES)


def test_a_run_folder_with_another_runs_config_is_refused(tmp_path: Path) -> None:
    args = ["fit", "-c", "tabular/lometab_churn", f"--trainer.default_root_dir={tmp_path}", *FAST,
            "--trainer.logger=lightning.pytorch.loggers.CSVLogger", f"--trainer.logger.save_dir={tmp_path}",
            "--trainer.logger.version=0"]
    main(args)
    run = tmp_path / "lightning_logs" / "version_0"
    before = {name: (run / name).read_bytes() for name in ("config.yaml", "metrics.csv", "hparams.yaml")}
    with pytest.raises(SystemExit, match=r"config\.yaml: already exists: another run wrote its config"):
        main([*args, "--model.init_args.lr=0.5"])
    assert {name: (run / name).read_bytes() for name in before} == before  # the first run's files untouched


def test_runs_without_a_logger_take_the_next_free_config_name(tmp_path: Path) -> None:
    args = ["fit", "-c", "tabular/lometab_churn", f"--trainer.default_root_dir={tmp_path}", *FAST,
            "--trainer.logger=false"]
    main(args)
    main([*args, "--model.init_args.lr=0.5"])
    rates = [yaml.safe_load((tmp_path / name).read_text())["model"]["init_args"]["lr"]
             for name in ("config.yaml", "config_1.yaml")]
    assert rates == [0.002, 0.5]


def _fit_repeatedly(root: Path, worker: int) -> None:
    """``REPEATS`` fits, each started together with the other worker's in one shared folder."""
    for repeat in range(REPEATS):
        folder = root / f"repeat_{repeat}"
        folder.mkdir(exist_ok=True)
        (folder / f"ready_{worker}").touch()
        while not (folder / f"ready_{1 - worker}").exists():
            time.sleep(0.005)
        main(["fit", "-c", "tabular/lometab_churn", f"--trainer.default_root_dir={folder}", *FAST,
              f"--model.init_args.lr={LEARNING_RATES[worker]}"])


if __name__ == "__main__":
    _fit_repeatedly(Path(sys.argv[1]), int(sys.argv[2]))
