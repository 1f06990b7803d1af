"""Tune studies and benchmark stores never run the wrong thing, and never write into a user's files.

Oracles: exact identities. A file a user gave (a folder of their own files, a log, a database) has
the same SHA-256 after a refused command; a file that names code (``os.system``) leaves no trace of
running (the file it would create does not exist); a continued seeded study has as many distinct
configurations as trials; a refused continuation names the exact key that changed, its old and its
new value; a cell fitted again reports the new model's size. Everything goes through the
``ripieno`` command, as a user types it.
"""

from __future__ import annotations

import csv
import hashlib
import multiprocessing
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from helpers.signals import interruptible
from sklearn.datasets import load_breast_cancer, load_wine

from ripieno.framework.benchmark.report import compare, ranks, render, summary
from ripieno.framework.cli.main import main
from ripieno.framework.tuning.study_storage import counts

WINE = "tabular/lometab_wine"
FAST = ["--trainer.max_epochs=2", "--model.init_args.k=4", "--model.init_args.d_block=32"]
SPACE = """\
params:
  model.init_args.rank: {type: categorical, choices: [1, 2, 4]}
  model.init_args.sigma_init: {type: float, low: 0.3, high: 3.0, log: true}
  model.init_args.lr: {type: float, low: 1.0e-3, high: 5.0e-3, log: true}
"""


def _hashes(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def _space(folder: Path) -> Path:
    path = folder / "space.yaml"
    path.write_text(SPACE)
    return path


def _one_line(stop: pytest.ExceptionInfo[SystemExit]) -> str:
    message = str(stop.value)
    assert message.startswith("ripieno: error: ") and "\n" not in message, message
    return message


def _benchmark_file(folder: Path, **changes: object) -> Path:
    config = {
        "name": "safety",
        "seeds": [0],
        "data": {},
        "datasets": [{"name": "cancer", "path": "cancer.csv", "target": "target"}],
        "models": {"xgboost": {"kind": "xgboost", "params": {"n_estimators": 30}}},
        **changes,
    }
    path = folder / "bench.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _write_cancer(folder: Path, rows: int | None = None) -> None:
    load_breast_cancer(as_frame=True).frame.iloc[:rows].to_csv(folder / "cancer.csv", index=False)


# --- a file is data, never code ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data_class", "why"),
    [
        ("os.system", "is not a LightningDataModule with table_splits()"),
        ("builtins.exec", "is not a LightningDataModule with table_splits()"),
        ("subprocess.run", "is not a LightningDataModule with table_splits()"),
        ("shutil.rmtree", "is not a LightningDataModule with table_splits()"),
        ("os.system; touch pwned", "is not a LightningDataModule with table_splits()"),
        ("ripieno.framework.cli.main.main", "is not a LightningDataModule with table_splits()"),
        ("lightning.pytorch.LightningDataModule", "is not a LightningDataModule with table_splits()"),
        ("no_such_package_here.Table", "cannot be imported"),
    ],
)
def test_a_benchmark_file_runs_none_of_the_code_it_names(tmp_path, monkeypatch, data_class, why):
    monkeypatch.chdir(tmp_path)
    config = _benchmark_file(
        tmp_path, data_class=data_class, datasets=[{"name": "t", "command": "touch pwned"}]
    )
    with pytest.raises(SystemExit) as stop:
        main(["benchmark", "-c", str(config), "--out", "out"])
    assert f"data_class {data_class!r} {why}" in _one_line(stop)
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "section",
    [
        {"model": {"class_path": "os.system", "init_args": {"command": "touch pwned"}}},
        {"data": {"class_path": "subprocess.Popen", "init_args": {"args": ["touch", "pwned"]}}},
        {"trainer": {"callbacks": [{"class_path": "os.system", "init_args": {"command": "touch pwned"}}]}},
    ],
    ids=["model", "data", "callback"],
)
def test_a_recipe_runs_none_of_the_code_it_names(tmp_path, monkeypatch, section):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(section))
    with pytest.raises(SystemExit):
        main(["fit", "-c", WINE, "-c", "bad.yaml", "--trainer.default_root_dir=out"])
    assert not (tmp_path / "pwned").exists()


def test_a_search_space_runs_none_of_the_code_it_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(
        "params:\n"
        "  model.class_path: {type: categorical, choices: [os.system]}\n"
        "  model.init_args.command: {type: categorical, choices: [touch pwned]}\n"
    )
    with pytest.raises(SystemExit) as stop:
        main(["tune", "-c", WINE, "--space", "space.yaml", "--study_dir", "study"])
    assert "search space space.yaml" in _one_line(stop)
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "study").exists()


# --- folders and stores that are not ripieno's ------------------------------------------------------------


def test_a_study_folder_of_the_users_files_is_refused_and_left_as_it_was(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "best.yaml").write_text("my: own\n")
    (mine / "trials.csv").write_text("a,b\n1,2\n")
    (mine / "history.png").write_bytes(b"\x89PNG mine")
    before = _hashes(mine)
    with pytest.raises(SystemExit) as stop:
        main(["tune", "-c", WINE, "--space", str(_space(tmp_path)), "--study_dir", "mine"])
    assert _one_line(stop) == (
        "ripieno: error: --study_dir mine holds files ripieno did not write (no ripieno_store.json);"
        " name an empty or new folder, so that none of them is replaced."
    )
    assert _hashes(mine) == before


def test_a_benchmark_folder_of_the_users_files_is_refused_with_a_storage_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write_cancer(tmp_path)
    config = _benchmark_file(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "report.md").write_text("my report\n")
    before = _hashes(tmp_path / "out")
    with pytest.raises(SystemExit, match=r"--out out holds files ripieno did not write"):
        main(["benchmark", "-c", str(config), "--out", "out", "--storage", "shared.log"])
    assert _hashes(tmp_path / "out") == before and not (tmp_path / "shared.log").exists()


def _users_database(path: Path) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE users (name TEXT)")
        connection.execute("INSERT INTO users VALUES ('ada')")


@pytest.mark.parametrize("command", ["tune", "benchmark"])
@pytest.mark.parametrize(
    ("name", "make", "why"),
    [
        ("app.log", lambda p: p.write_text("2026-12-07 started\n"), "exists and is not an Optuna journal"),
        ("app.db", _users_database, "exists and is an SQLite database with other tables (users)"),
        ("notes.db", lambda p: p.write_text("hello\n"), "exists and is not an SQLite file"),
        ("folder.log", lambda p: p.mkdir(), "is a folder"),
    ],
    ids=["log", "sqlite", "text", "folder"],
)
def test_a_storage_that_is_not_a_store_is_refused_before_a_byte_is_written(
    tmp_path, monkeypatch, command, name, make, why
):
    monkeypatch.chdir(tmp_path)
    make(tmp_path / name)
    if command == "tune":
        args = ["tune", "-c", WINE, "--space", str(_space(tmp_path)), "--study_dir", "study"]
    else:
        _write_cancer(tmp_path)
        args = ["benchmark", "-c", str(_benchmark_file(tmp_path)), "--out", "study"]
    before = _hashes(tmp_path)
    storage = name if name.endswith(".log") else f"sqlite:///{name}"
    with pytest.raises(SystemExit) as stop:
        main([*args, "--storage", storage])
    assert f"--storage {name} {why}" in _one_line(stop)
    assert _hashes(tmp_path) == before and not (tmp_path / "study").exists()


def test_a_folder_option_naming_a_file_is_blamed_on_that_option(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write_cancer(tmp_path)
    (tmp_path / "taken").write_text("a file\n")
    with pytest.raises(SystemExit) as stop:
        main(["tune", "-c", WINE, "--space", str(_space(tmp_path)), "--study_dir", "taken"])
    assert _one_line(stop) == (
        "ripieno: error: --study_dir taken is a file, not a folder; name a new or empty folder."
    )
    with pytest.raises(SystemExit) as stop:
        main(["benchmark", "-c", str(_benchmark_file(tmp_path)), "--out", "taken"])
    assert _one_line(stop) == (
        "ripieno: error: --out taken is a file, not a folder; name a new or empty folder."
    )
    assert (tmp_path / "taken").read_text() == "a file\n"


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--pruner_warmup", "-5", "--pruner_warmup must be at least 0, got -5."),
        ("--n_trials", "0", "--n_trials must be at least 1, got 0."),
        ("--startup_trials", "-1", "--startup_trials must be at least 0, got -1."),
        ("--final_seeds", "-2", "--final_seeds must be at least 0, got -2."),
        ("--timeout", "0", "--timeout must be a positive number of seconds, got 0."),
    ],
)
def test_a_tune_option_out_of_range_is_one_line_before_anything(
    tmp_path, monkeypatch, option, value, expected
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        main(["tune", "-c", WINE, option, value])
    assert _one_line(stop) == f"ripieno: error: {expected}"
    assert list(tmp_path.iterdir()) == []


def test_store_creation_by_commands_started_together_works_for_each(tmp_path):
    from ripieno.framework.tuning.study_storage import open_storage

    context = multiprocessing.get_context("fork")
    for attempt in range(3):  # without the retry, at least one of three rounds failed in 4 of 5 tries
        url = f"sqlite:///{tmp_path / f'new_{attempt}.db'}"
        barrier, results = context.Barrier(4), context.Queue()
        processes = [
            context.Process(target=_open_after, args=(open_storage, url, barrier, results)) for _ in range(4)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join()
        assert sorted(results.get() for _ in processes) == ["ok"] * 4
        assert optuna.create_study(study_name="s", storage=url, load_if_exists=True).trials == []


def _open_after(open_storage, url, barrier, results) -> None:  # noqa: ANN001
    barrier.wait()
    try:
        open_storage(url, 30)
        results.put("ok")
    except BaseException as error:  # noqa: BLE001 - reported to the test
        results.put(repr(error))


# --- a study remembers what made it -------------------------------------------------------------------


def _rows(study_dir: Path) -> list[dict[str, str]]:
    with (study_dir / "trials.csv").open() as handle:
        return list(csv.DictReader(handle))


def test_a_continued_study_draws_new_trials_and_refuses_another_recipe_overrides_data_or_name(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    load_wine(as_frame=True).frame.to_csv("wine.csv", index=False)
    own_table = [
        "--data.init_args.dataset=null", "--data.init_args.path=wine.csv", "--data.init_args.target=target"
    ]
    common = ["--space", str(_space(tmp_path)), "--study_dir", "study", "--seed", "0", *own_table]
    main(["tune", "-c", WINE, *common, "--n_trials", "2", *FAST])
    main(["tune", "-c", WINE, *common, "--n_trials", "4", *FAST])  # the README's rerun: it continues
    rows = _rows(tmp_path / "study")
    assert [r["state"] for r in rows] == ["COMPLETE"] * 4
    keys = ("model.init_args.rank", "model.init_args.sigma_init", "model.init_args.lr")
    assert len({tuple(r[k] for k in keys) for r in rows}) == 4  # seed 0 continued: no trial repeated
    kept = _hashes(tmp_path / "study")
    refusals = [
        (["tune", "-c", "tabular/additive_wine", *common, "--n_trials", "5", *FAST],
         "--study_dir study holds tune 'tabular_lometab_wine', not tune 'tabular_additive_wine'"),
        (["tune", "-c", "tabular/additive_wine", *common, "--study_name", "tabular_lometab_wine", *FAST],
         "another recipe or other overrides (first difference: model.init_args.adapter: 'lometab' then,"
         " 'additive' now)"),
        (["tune", "-c", WINE, *common, "--n_trials", "5", *FAST[1:], "--trainer.max_epochs=3"],
         "another recipe or other overrides (first difference: trainer.max_epochs: 2 then, 3 now)"),
        (["tune", "-c", WINE, *common, "--n_trials", "5", *FAST, "--study_name", "second"],
         "--study_dir study holds tune 'tabular_lometab_wine', not tune 'second'; one folder holds"),
    ]
    for args, expected in refusals:
        with pytest.raises(SystemExit) as stop:
            main(args)
        assert expected in _one_line(stop)
    frame = pd.read_csv("wine.csv")
    frame.loc[0, "alcohol"] += 1.0
    frame.to_csv("wine.csv", index=False)
    with pytest.raises(SystemExit) as stop:
        main(["tune", "-c", WINE, *common, "--n_trials", "5", *FAST])
    assert "other data (first difference: wine.csv: its content changed" in _one_line(stop)
    assert _hashes(tmp_path / "study") == kept  # nothing of the study was rewritten by a refused command


def test_a_study_name_with_separators_stays_inside_the_tune_folder_and_final_seeds_rerun_best_yaml(
    tmp_path, monkeypatch
):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    space = str(_space(tmp_path))
    main(["tune", "-c", WINE, "--space", space, "--study_name", "../../x", "--n_trials", "1",
          "--final_seeds", "2", *FAST])
    folder = work / "runs" / "tune" / "_.._x"
    assert (folder / "study.db").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["space.yaml", "work"]
    assert optuna.get_all_study_names(f"sqlite:///{folder / 'study.db'}") == ["../../x"]
    final = pd.read_csv(folder / "final.csv")
    assert final["seed"].tolist() == [0, 1] and final["test/accuracy"].between(0, 1).all()
    (trial,) = _rows(folder)  # final seed 0 is best.yaml again: the trial's validation curve, exactly
    assert _logged(folder / "final" / "seed_0", "val/nll") == _logged(Path(trial["folder"]), "val/nll")


def _logged(folder: Path, metric: str) -> list[float]:
    (metrics,) = folder.rglob("metrics.csv")
    with metrics.open() as handle:
        return [float(row[metric]) for row in csv.DictReader(handle) if row.get(metric)]


# --- a benchmark cell remembers what made it ---------------------------------------------------------------


def test_a_benchmark_rerun_with_changed_params_or_table_is_refused_or_refitted(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _write_cancer(tmp_path)
    models = {"xgboost": {"kind": "xgboost", "params": {"n_estimators": 30}},
              "deep": {"kind": "xgboost", "params": {"n_estimators": 30, "max_depth": 8}}}
    config = _benchmark_file(tmp_path, models=models)
    main(["benchmark", "-c", str(config), "--out", "out", "--models", "xgboost"])
    assert "1 data sets x 1 models x 1 seeds = 1 cells" in capsys.readouterr().out  # --models picked one
    first = pd.read_csv("out/results.csv")
    kept = _hashes(tmp_path / "out")
    models["xgboost"]["params"]["max_depth"] = 2
    config = _benchmark_file(tmp_path, models=models)
    with pytest.raises(SystemExit) as stop:
        main(["benchmark", "-c", str(config), "--out", "out", "--models", "xgboost"])
    assert _one_line(stop) == (
        "ripieno: error: 1 finished cells of out were fitted from other inputs (first:"
        " default/cancer/xgboost/0: model.params.max_depth: absent then, 2 now); run with --refit_changed"
        " to fit them again, or give another --out for a new benchmark."
    )
    assert _hashes(tmp_path / "out") == kept
    main(["benchmark", "-c", str(config), "--out", "out", "--models", "xgboost", "--refit_changed"])
    again = pd.read_csv("out/results.csv")
    assert len(again) == 1 and again["n_parameters"].iloc[0] < first["n_parameters"].iloc[0]  # depth 2
    assert again["ripieno_refit"].iloc[0] == "model.params.max_depth: absent then, 2 now"
    assert "1 cells were fitted again because their inputs changed" in Path("out/report.md").read_text()
    _write_cancer(tmp_path, rows=500)
    with pytest.raises(SystemExit) as stop:
        main(["benchmark", "-c", str(config), "--out", "out", "--models", "xgboost"])
    assert "data.table.files.cancer.csv: its content changed" in _one_line(stop)


def test_a_test_split_too_small_to_rank_is_flagged_and_never_a_win():
    rows = []
    for dataset, test_rows, smallest in (("big", 400, 150), ("tiny", 12, 5), ("rare", 300, 3)):
        for model, kind, accuracy in (("lometab", "ensemble", 0.95), ("xgboost", "xgboost", 0.80)):
            rows.append({"dataset": dataset, "model": model, "kind": kind, "task": "binary", "seed": 0,
                         "test_accuracy": accuracy, "test_nll": 0.2, "seconds": 1.0, "n_parameters": 10,
                         "test_rows": test_rows, "test_smallest_class": smallest})
    results = pd.DataFrame(rows)
    table = summary(results)
    assert list(ranks(table).index) == ["big"]
    assert compare(table, "lometab", "xgboost") == {"win": 1, "tie": 0, "loss": 0}
    text = render(results, "small")
    assert "| tiny (too small to rank) | binary | accuracy | 0.9500 | 0.8000 |" in text
    assert "| rare (too small to rank) |" in text and "Too small to rank: tiny, rare." in text
    assert "| big | binary | accuracy | **0.9500** | 0.8000 |" in text


# --- Ctrl-C and dead parents (subprocesses, as a user's terminal runs them) ---------------------------------


def _command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ripieno", *args]


def _wait_for(predicate, what: str, limit: float = 300.0) -> None:  # noqa: ANN001
    """Poll ``predicate`` until it holds (a liveness bound, not a measured time)."""
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"waited {limit:g} s for {what}"
        time.sleep(0.5)


def _states(storage: str) -> list[str]:
    try:
        names = optuna.get_all_study_names(storage)
        return [t.state.name for n in names for t in optuna.load_study(study_name=n, storage=storage).trials]
    except Exception:  # noqa: BLE001 - the store is being created
        return []


@pytest.mark.slow
def test_ctrl_c_during_a_benchmark_cell_keeps_the_store_writes_the_report_and_the_same_command_continues(
    tmp_path,
):
    _write_cancer(tmp_path)
    slow = {"adapter": "rank1", "k": 4, "d_block": 32, "n_blocks": 1, "max_epochs": 300, "patience": 300,
            "batch_size": 32}  # some seconds per cell: Ctrl-C lands inside a fit
    config = _benchmark_file(tmp_path, seeds=[0, 1], models={"tabm": {"kind": "ensemble", "params": slow}})
    args = _command("benchmark", "-c", str(config), "--out", "out")
    storage = f"sqlite:///{tmp_path / 'out' / 'benchmark.db'}"
    process = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, preexec_fn=interruptible)
    _wait_for(lambda: "RUNNING" in _states(storage), "a running cell")
    time.sleep(3.0)  # inside the fit
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 1, output
    assert "ripieno: interrupted (Ctrl-C): 0/2 cells finished and are kept in" in output
    assert f"ripieno: continue with: ripieno benchmark -c {config} --out out" in output
    assert "Traceback" not in output
    assert (tmp_path / "out" / "results.csv").is_file()  # rewritten from the store
    assert "RUNNING" not in _states(storage)  # the interrupted cell is failed, to run again
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    assert len(results) == 2 and (results["state"] == "COMPLETE").all()


@pytest.mark.slow
def test_ctrl_c_during_a_tune_trial_writes_trials_csv_and_the_same_command_finishes_the_study(tmp_path):
    space = _space(tmp_path)
    args = _command("tune", "-c", WINE, "--space", str(space), "--study_dir", "study", "--n_trials", "2",
                    "--seed", "0", "--trainer.max_epochs=300", "--model.init_args.k=4",
                    "--model.init_args.d_block=32")
    storage = f"sqlite:///{tmp_path / 'study' / 'study.db'}"
    process = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, preexec_fn=interruptible)
    _wait_for(lambda: "RUNNING" in _states(storage), "a running trial")
    time.sleep(3.0)
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 1, output
    assert "ripieno: interrupted (Ctrl-C): the 0 finished trials are kept in" in output, output
    assert f"ripieno: continue with: ripieno tune -c {WINE} --space {space} --study_dir study" in output
    assert "Traceback" not in output
    rows = _rows(tmp_path / "study")
    assert [(r["state"], r["note"]) for r in rows] == [
        ("FAIL", "interrupted (Ctrl-C); another trial ran in its place")
    ]
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    assert [r["state"] for r in _rows(tmp_path / "study")] == ["FAIL", "COMPLETE", "COMPLETE"]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.slow
def test_tune_workers_stop_when_their_parent_is_killed(tmp_path):
    args = _command("tune", "-c", WINE, "--space", str(_space(tmp_path)), "--study_dir", "study",
                    "--n_trials", "4", "--workers", "2", "--trainer.max_epochs=300", "--model.init_args.k=4",
                    "--model.init_args.d_block=32")
    storage = f"sqlite:///{tmp_path / 'study' / 'study.db'}"
    process = subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _wait_for(lambda: _states(storage).count("RUNNING") == 2, "two running trials")
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True,
                                                text=True).stdout.split()]
    assert len(children) >= 2
    process.kill()
    process.wait()
    _wait_for(lambda: not any(_alive(pid) for pid in children), "the workers to stop", limit=180)
    assert "RUNNING" not in _states(storage)  # each worker failed its trial on the way out
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stdout + again.stderr
    trials = optuna.load_study(study_name="tabular_lometab_wine", storage=storage).trials
    assert sum(counts(t) for t in trials) == 4 and all(t.state.is_finished() for t in trials)
