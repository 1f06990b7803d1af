"""A run keeps what it writes: atomic checkpoints on any filesystem, whole logs, one-line errors.

The kill and disk-full cases put the run folder on a tmpfs of its own (a mount namespace made
with ``unshare``, as root, which CI is), so the run folder and ``$TMPDIR`` are on different
filesystems, the case where Lightning's own save (write to ``$TMPDIR``, then copy) is not atomic.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from helpers.signals import interruptible

from ripieno.framework.cli import main
from ripieno.framework.runner.run_logs import event_files, merge_event_files

SMALL = ["--data.init_args.max_rows=600", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false"]
RUN = Path("logs") / "version_0"


def _can_mount() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(not _can_mount(), reason="needs root and unshare -m (CI runs as root)")


def _in_tmpfs(folder: Path, size: str, script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a Python ``script`` with a fresh tmpfs of ``size`` mounted on ``folder`` (its own namespace)."""
    folder.mkdir(parents=True, exist_ok=True)
    code = folder.parent / "script.py"
    code.write_text(textwrap.dedent(script))
    inner = (f"mount -t tmpfs -o size={size} tmpfs {folder} && {sys.executable} {code}; rc=$?;"
             f" cp -a {folder} {folder}.after; exit $rc")  # keep what was left, past the namespace
    return subprocess.run(["unshare", "-m", "sh", "-c", inner], capture_output=True, text=True,
                          timeout=timeout, cwd=folder.parent)


def _epoch(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=True)["epoch"])


@needs_mount
def test_a_kill_while_saving_leaves_the_previous_last_checkpoint_and_no_partial_one(tmp_path):
    """SIGKILL halfway through writing the second ``last.ckpt``: the first stays whole under its name."""
    result = _in_tmpfs(tmp_path / "run", "64m", f"""
        import os, signal, torch
        from ripieno.framework.cli import main
        real_save, saves = torch.save, []
        def save(obj, f, *args, **kwargs):  # the second save of last.ckpt (epoch 1's)
            saves.append(".last.ckpt." in getattr(f, "name", ""))
            if sum(saves) == 2 and saves[-1]:
                f.write(b"PK\\x03\\x04" + b"x" * 100_000)  # half a file on disk
                f.flush(); os.fsync(f.fileno())
                os.kill(os.getpid(), signal.SIGKILL)
            return real_save(obj, f, *args, **kwargs)
        torch.save = save
        main(["fit", "-c", "tabular/lometab_churn", "--trainer.max_epochs=3",
              "--trainer.default_root_dir=run",
              *{SMALL!r}])
    """)
    assert result.returncode == -signal.SIGKILL or result.returncode == 128 + signal.SIGKILL, result.stderr
    checkpoints = tmp_path / "run.after" / RUN / "checkpoints"
    names = sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith("."))
    assert names[-1] == "last.ckpt" and all(n.startswith("best-epoch=0") for n in names[:-1])
    assert _epoch(checkpoints / "last.ckpt") == 0  # the good one from epoch 0, whole
    for name in names:
        _epoch(checkpoints / name)  # every file under a checkpoint name loads
    leftovers = [p.name for p in checkpoints.iterdir() if p.name.startswith(".")]
    assert all(p.endswith(".partial") for p in leftovers)  # the killed write, hidden, never a .ckpt


@needs_mount
def test_a_full_disk_keeps_the_previous_checkpoints_and_ends_in_one_line(tmp_path):
    """Room for two checkpoints: the third save fails, its temporary file goes, the two stay whole."""
    result = _in_tmpfs(tmp_path / "run", "3m", f"""
        from ripieno.framework.cli import main
        main(["fit", "-c", "tabular/lometab_churn", "--trainer.max_epochs=4",
              "--trainer.default_root_dir=run",
              *{SMALL!r}])
    """)
    assert result.returncode == 1
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("ripieno: error: run/logs/version_0/checkpoints/")
    assert "cannot write the checkpoint: no space left on the device" in last_line
    assert "Traceback" not in result.stderr
    checkpoints = tmp_path / "run.after" / RUN / "checkpoints"
    files = sorted(checkpoints.iterdir())
    assert [p.name for p in files] == ["best-epoch=00.ckpt", "last.ckpt"]  # no partial file at all
    assert [_epoch(p) for p in files] == [0, 0]


def test_ddp_spawn_with_test_after_fit_keeps_every_row_and_one_events_file(tmp_path, monkeypatch, capsys):
    """The fit's rows, then the test's row after the fit's last step, as in a one-process run."""
    monkeypatch.chdir(tmp_path)
    main(["fit", "-c", "tabular/lometab_churn", "--trainer.max_epochs=2", "--trainer.devices=2",
          "--trainer.strategy=ddp_spawn", "--trainer.accelerator=cpu", "--trainer.default_root_dir=run",
          *SMALL])
    out = capsys.readouterr().out
    run = tmp_path / "run" / RUN
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    val = [r for r in rows if r.get("val/nll")]
    train = [r for r in rows if r.get("train/loss_epoch")]
    test = [r for r in rows if r.get("test/nll")]
    assert [r["epoch"] for r in val] == ["0", "1"] and [r["epoch"] for r in train] == ["0", "1"]
    assert len(test) == 1 and test[0]["epoch"] == "2"  # after the fit, not epoch 0 step 0
    assert int(test[0]["step"]) == int(val[-1]["step"]) + 1
    assert f"ripieno: last       run/{RUN}/checkpoints/last.ckpt" in out
    (events,) = event_files(run)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(events))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("val/nll")] == [int(r["step"]) for r in val]
    assert [e.value for e in accumulator.Scalars("test/nll")] == pytest.approx([float(test[0]["test/nll"])])


def test_merged_events_file_holds_every_writers_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    for tag, steps in (("val/loss", range(3)), ("test/loss", [3])):
        writer = SummaryWriter(str(tmp_path))
        for step in steps:
            writer.add_scalar(tag, step / 10, step)
        writer.close()
        time.sleep(0.01)
    assert len(event_files(tmp_path)) == 2
    merged = merge_event_files(tmp_path)
    assert event_files(tmp_path) == [merged]
    accumulator = EventAccumulator(str(merged))
    accumulator.Reload()
    assert [e.step for e in accumulator.Scalars("val/loss")] == [0, 1, 2]
    assert [e.value for e in accumulator.Scalars("val/loss")] == pytest.approx([0.0, 0.1, 0.2])
    assert [(e.step, e.value) for e in accumulator.Scalars("test/loss")] == [(3, pytest.approx(0.3))]


def test_a_fresh_run_warns_of_no_deletion(tmp_path, monkeypatch, recwarn):
    monkeypatch.chdir(tmp_path)
    main(["fit", "-c", "tabular/lometab_churn", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
          "--test_after_fit=false", *SMALL])
    assert not [w for w in recwarn if "will be deleted" in str(w.message)]


@pytest.mark.parametrize("root, problem", [
    ("a_file", "a part of the path is a file, not a folder"),
    ("x" * 300, "name is longer than the file system allows"),
])
def test_an_unusable_output_folder_is_one_line_before_any_data_is_read(root, problem, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("mine")
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", "tabular/lometab_churn", f"--trainer.default_root_dir={root}", *SMALL])
    message = str(stop.value)
    assert message.startswith(f"ripieno: error: {root}/logs: cannot write the run folder: ")
    assert problem in message and "\n" not in message
    assert (tmp_path / "a_file").read_text() == "mine"


@needs_mount
def test_a_read_only_output_folder_is_one_line(tmp_path):
    result = _in_tmpfs(tmp_path / "ro", "1m,ro", """
        from ripieno.framework.cli import main
        main(["fit", "-c", "tabular/lometab_churn", "--trainer.default_root_dir=ro/run"])
    """)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "ripieno: error: ro/run/logs: cannot write the run folder: the folder is not writable (permission"
        " denied or a read-only file system); choose a folder you can write to (--trainer.default_root_dir)"
        " or fix its permissions.")


def test_max_steps_before_the_first_validation_stops_before_training(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", "tabular/lometab_churn", "--trainer.max_steps=2", *SMALL])
    # 600 rows: 60% (360) train in batches of 128 (the recipe's), so an epoch is 3 batches = 3 steps
    assert str(stop.value) == (
        "ripieno: error: trainer.max_steps=2 ends training before the first validation, which runs after 3"
        " optimizer steps (an epoch is 3 batches), so EarlyStopping (val/nll) and ModelCheckpoint (val/nll)"
        " never get their metric and no checkpoint would be kept; raise --trainer.max_steps to at least 3,"
        " or validate sooner with --trainer.val_check_interval=N (N <= 2 batches).")
    assert not list(tmp_path.rglob("*.ckpt"))
    main(["fit", "-c", "tabular/lometab_churn", "--trainer.max_steps=2", "--trainer.val_check_interval=2",
          "--test_after_fit=false", *SMALL])  # the fix it names works: validated, checkpoint kept
    assert len(list(tmp_path.rglob("best-*.ckpt"))) == 1


def test_out_of_memory_while_building_the_model_is_one_line(tmp_path):
    limit = 6 * 2**30  # the 65536-wide blocks ask for 16 GiB at once
    code = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}));"
            " from ripieno.framework.cli import main;"
            " main(['fit', '-c', 'tabular/lometab_churn', '--model.init_args.d_block=65536'])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                            timeout=300)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("ripieno: error: out of memory while building"
                           " ripieno.framework.TabularEnsembleModule (16.0 GiB asked for at once): ")
    assert "make the model or the batches smaller" in line


def test_ctrl_c_names_the_last_checkpoint_and_the_command_that_resumes(tmp_path):
    (tmp_path / "no_early_stop.yaml").write_text(textwrap.dedent("""\
        trainer:
          callbacks:
            - class_path: lightning.pytorch.callbacks.ModelCheckpoint
              init_args: {monitor: val/nll, mode: min, save_last: true, filename: "best-{epoch:02d}"}
        """))  # the run must still be training when Ctrl-C comes
    command = [sys.executable, "-m", "ripieno", "fit", "-c", "tabular/lometab_churn",
               "-c", "no_early_stop.yaml",
               "--trainer.max_epochs=500", "--test_after_fit=false",
               "--trainer.default_root_dir=run", *SMALL]
    process = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=interruptible)
    last = tmp_path / "run" / RUN / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + 240
    while not last.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    lines = err.strip().splitlines()
    assert process.returncode == 1, err[-3000:]
    assert lines[-2].startswith("ripieno: interrupted at epoch ") and lines[-2].endswith(
        f"Last checkpoint: run/{RUN}/checkpoints/last.ckpt")
    resume = lines[-1].removeprefix("ripieno: resume with: ripieno ").split()
    assert resume == ["fit", "-c", f"run/{RUN}/config.yaml",
                      "--ckpt_path", f"run/{RUN}/checkpoints/last.ckpt"]
    stopped_at = _epoch(last)
    resumed = subprocess.run([sys.executable, "-m", "ripieno", *resume,
                              "--trainer.max_epochs", str(stopped_at + 2),
                              "--test_after_fit=false", "--trainer.enable_progress_bar=false"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "run" / "logs" / "version_1" / "metrics.csv").open()))
    assert sorted({int(r["epoch"]) for r in rows if r.get("val/nll")}) == [stopped_at + 1]
