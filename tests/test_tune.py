"""``ripieno tune``: search spaces, the study through the command, workers sharing a storage, resumption.

Oracles: exact identities. A study's ``best.yaml`` trained again reaches the best trial's logged
validation metric bit for bit; the storage holds exactly ``--n_trials`` counted trials with
distinct numbers and run folders; a worker killed with SIGKILL leaves one failed trial whose
retry (same parameters) completes the study; a real PostgreSQL server (Debian's package, started
here on a Unix socket) serves two workers. Nothing is mocked.
"""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pytest

from ripieno.framework.cli.main import main
from ripieno.framework.runner.recipes import list_recipes
from ripieno.framework.tuning.space import (
    SearchSpace,
    SearchSpaceError,
    default_space,
    find_space,
    list_spaces,
)
from ripieno.framework.tuning.study import check_space
from ripieno.framework.tuning.study_storage import counts

WINE = "tabular/lometab_wine"
SMALL_SPACE = """\
# A small LoMETab space for tests: no data keys, so a worker reuses its prepared table.
params:
  model.init_args.rank: {type: categorical, choices: [1, 4]}
  model.init_args.sigma_init: {type: float, low: 0.3, high: 3.0, log: true}
  model.init_args.lr: {type: float, low: 1.0e-3, high: 5.0e-3, log: true}
"""
FAST = ["--trainer.max_epochs=2", "--model.init_args.k=4", "--model.init_args.d_block=32"]


def _space(tmp_path: Path, text: str = SMALL_SPACE, name: str = "space.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _tune_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "ripieno", "tune", *args]


def _rows(study_dir: Path) -> list[dict[str, str]]:
    with (study_dir / "trials.csv").open() as handle:
        return list(csv.DictReader(handle))


def _logged(folder: Path, metric: str) -> list[float]:
    (metrics,) = folder.rglob("metrics.csv")
    with metrics.open() as handle:
        return [float(row[metric]) for row in csv.DictReader(handle) if row.get(metric)]


# --- search spaces ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"type": "uniform", "low": 0, "high": 1}, "unknown distribution type 'uniform'"),
        ({"type": "flaot", "low": 0, "high": 1}, "(did you mean 'float'?)"),
        ({"type": "float", "low": 2.0, "high": 1.0}, "empty range low=2.0 > high=1.0"),
        ({"type": "float", "low": 0.0, "high": 1.0, "log": True}, "log needs low > 0"),
        ({"type": "categorical", "choices": []}, "non-empty list 'choices'"),
        (
            {"type": "int", "low": 1, "high": 5, "or_zeros": True},
            "int has no field 'or_zeros' (did you mean 'or_zero'?)",
        ),
    ],
)
def test_a_bad_distribution_is_one_line_naming_the_key(spec, expected):
    with pytest.raises(SearchSpaceError) as error:
        SearchSpace.from_dict({"params": {"model.init_args.lr": spec}}, source="my_space.yaml")
    message = str(error.value)
    assert "\n" not in message and message.startswith("my_space.yaml: model.init_args.lr: ")
    assert expected in message


def test_or_zero_draws_zero_or_a_value_as_the_tabm_paper_does():
    space = SearchSpace.from_dict(
        {"params": {"wd": {"type": "float", "low": 1e-4, "high": 0.1, "log": True, "or_zero": True}}}
    )
    assert space.suggest(optuna.trial.FixedTrial({"?wd": False})) == {"wd": 0.0}
    assert space.suggest(optuna.trial.FixedTrial({"?wd": True, "wd": 0.01})) == {"wd": 0.01}
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: space.suggest(t)["wd"], n_trials=40)
    drawn = [t.value for t in study.trials]
    assert 0.0 in drawn and all(v == 0.0 or 1e-4 <= v <= 0.1 for v in drawn)


def test_every_shipped_space_suits_a_shipped_recipe_and_parses_with_it():
    recipes = [r.name for r in list_recipes()]
    spaces = list_spaces()
    assert {s.name for s in spaces} >= {
        "tabular/tabm",
        "tabular/lometab",
        "mcover/ring_kernel",
        "loes/selection",
    }
    for space in spaces:
        suited = [name for name in recipes if space.suits(name)]
        assert suited, space.name
        assert space.description
        # every categorical choice and both ends of every range, against the first recipe it suits
        config = check_space(["-c", str(next(r.path for r in list_recipes() if r.name == suited[0]))], space)
        assert config["trainer"]["callbacks"]
    assert default_space("tabular/lometab_churn").name == "tabular/lometab"
    assert default_space("tabular/tabm_mini_churn").name == "tabular/tabm"
    assert "rank" in " ".join(default_space("tabular/additive_wine").params)
    assert find_space("tabular/lometab").name == "tabular/lometab"
    with pytest.raises(SearchSpaceError, match="no shipped search space suits recipe uq/mc_dropout"):
        default_space("uq/mc_dropout_fashion_mnist")
    with pytest.raises(SearchSpaceError, match="did you mean 'tabular/lometab'"):
        find_space("tabular/lometabb")


def test_pruner_warmup_reaches_the_median_pruner():
    from ripieno.framework.cli.tune_command import build_parser
    from ripieno.framework.tuning.worker import make_pruner

    options = build_parser().parse_args(["-c", "tabular/lometab_wine", "--pruner_warmup", "7"])
    pruner = make_pruner("median", options.pruner_warmup)
    assert isinstance(pruner, optuna.pruners.MedianPruner) and pruner._n_warmup_steps == 7
    assert build_parser().parse_args(["-c", "x"]).pruner_warmup == 2


def test_recipes_lists_the_spaces_and_the_spaces_are_not_recipes(capsys):
    assert not any(r.name.startswith("spaces/") for r in list_recipes())
    main(["recipes"])
    out = capsys.readouterr().out
    assert "ripieno tune" in out and "tabular/lometab " in out


# --- the study through the command ------------------------------------------------------------------


def test_a_tiny_study_writes_its_results_and_best_yaml_reproduces_the_best_trial(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    study_dir = tmp_path / "study"
    main(
        [
            "tune",
            "-c",
            WINE,
            "--n_trials",
            "3",
            "--seed",
            "0",
            "--space",
            str(_space(tmp_path)),
            "--study_dir",
            str(study_dir),
            "--keep_checkpoints",
            "best",
            *FAST,
        ]
    )
    out = capsys.readouterr().out
    assert out.count("ripieno: trial ") == 3 and "3/3 trials finished (3 complete)" in out
    for name in ("trials.csv", "best.yaml", "history.png", "importances.png", "contour.png", "study.db"):
        assert (study_dir / name).stat().st_size > 0, name
    rows = _rows(study_dir)
    assert [r["number"] for r in rows] == ["0", "1", "2"] and {r["state"] for r in rows} == {"COMPLETE"}
    assert all(r["epochs"] == "2" and float(r["seconds"]) > 0 for r in rows)
    best = min(rows, key=lambda r: float(r["val/nll"]))
    assert _logged(Path(best["folder"]), "val/nll")[-2:] != []
    # --keep_checkpoints best: only the best trial keeps its checkpoints
    for row in rows:
        assert bool(list(Path(row["folder"]).rglob("*.ckpt"))) == (row is best)
    # best.yaml is a complete recipe: trained again from scratch, the same validation metric, exactly
    main(
        [
            "fit",
            "-c",
            str(study_dir / "best.yaml"),
            f"--trainer.default_root_dir={tmp_path / 'again'}",
            "--test_after_fit=false",
            "--trainer.enable_progress_bar=false",
        ]
    )
    assert _logged(tmp_path / "again", "val/nll") == _logged(Path(best["folder"]), "val/nll")
    assert min(_logged(tmp_path / "again", "val/nll")) == float(best["val/nll"])


def test_a_key_the_recipe_does_not_accept_stops_before_any_trial_naming_the_closest(tmp_path, capsys):
    space = _space(tmp_path, "params:\n  model.init_args.rnak: {type: categorical, choices: [1, 2]}\n")
    with pytest.raises(SystemExit) as stop:
        main(["tune", "-c", WINE, "--space", str(space), "--study_dir", str(tmp_path / "study")])
    assert str(stop.value) == (
        f"ripieno: error: search space {space}: model.init_args.rnak is not an argument"
        " of ripieno.framework.TabularEnsembleModule; did you mean model.init_args.rank?"
    )
    assert not (tmp_path / "study").exists()
    bad_type = _space(
        tmp_path, "params:\n  model.init_args.lr: {type: loguniform, low: 1, high: 2}\n", "b.yaml"
    )
    with pytest.raises(SystemExit, match=r"unknown distribution type 'loguniform'; use one of categorical"):
        main(["tune", "-c", WINE, "--space", str(bad_type), "--study_dir", str(tmp_path / "study")])


def test_a_diverging_trial_is_pruned_and_the_study_goes_on(tmp_path, capsys):
    study_dir = tmp_path / "study"
    space = _space(
        tmp_path, "params:\n  model.init_args.lr: {type: categorical, choices: [1.0e+6, 2.0e-3]}\n"
    )
    # seed 0 draws lr 0.002, then 1e6 (optuna's TPE start-up draws, fixed by the seed)
    main(
        [
            "tune",
            "-c",
            WINE,
            "--n_trials",
            "2",
            "--seed",
            "0",
            "--space",
            str(space),
            "--study_dir",
            str(study_dir),
            *FAST,
        ]
    )
    rows = _rows(study_dir)
    assert [(r["state"], r["model.init_args.lr"]) for r in rows] == [
        ("COMPLETE", "0.002"),
        ("PRUNED", "1000000.0"),
    ]
    assert "the training loss is nan" in rows[1]["note"] or "the training loss is inf" in rows[1]["note"]
    assert "2/2 trials finished (1 complete, 1 pruned)" in capsys.readouterr().out
    # the study cannot go on with another space: Optuna could not mix the two distributions of lr
    other = _space(
        tmp_path, "params:\n  model.init_args.lr: {type: float, low: 1.0e-3, high: 2.0e-3}\n", "o.yaml"
    )
    with pytest.raises(
        SystemExit, match=r"was made with another search space \(first difference: model.init_args.lr"
    ):
        main(
            [
                "tune",
                "-c",
                WINE,
                "--n_trials",
                "3",
                "--space",
                str(other),
                "--study_dir",
                str(study_dir),
                *FAST,
            ]
        )
    assert len(_rows(study_dir)) == 2


def test_trials_that_keep_failing_stop_the_worker_with_their_error(tmp_path):
    space = _space(tmp_path, "params:\n  data.init_args.n_bins: {type: int, low: 1, high: 1}\n")
    with pytest.raises(SystemExit, match=r"3 trials in a row failed, the last with: .*n_bins"):
        main(
            [
                "tune",
                "-c",
                WINE,
                "--n_trials",
                "5",
                "--space",
                str(space),
                "--study_dir",
                str(tmp_path / "s"),
                *FAST,
            ]
        )


# --- workers sharing a storage, resumption --------------------------------------------------------------


def _check_exact(storage: str, study_name: str, n_trials: int) -> list[optuna.trial.FrozenTrial]:
    trials = optuna.load_study(study_name=study_name, storage=storage).get_trials()
    counted = [t for t in trials if counts(t)]
    assert len(counted) == n_trials and all(t.state.is_finished() for t in counted)
    folders = [t.user_attrs["folder"] for t in counted]
    assert len(set(folders)) == n_trials  # no trial ran twice
    return trials


@pytest.mark.slow
def test_two_workers_on_a_journal_file_finish_exactly_the_requested_trials(tmp_path, monkeypatch, capsys):
    journal = tmp_path / "shared" / "study.log"
    args = [
        "-c",
        WINE,
        "--n_trials",
        "4",
        "--space",
        str(_space(tmp_path)),
        "--storage",
        f"journal:{journal}",
        "--study_name",
        "shared",
        "--startup_trials",
        "2",
        "--seed",
        "0",  # both commands: seeded per trial number, so they never draw the same trial
        *FAST,
    ]
    first = subprocess.Popen(
        _tune_command(*args, "--study_dir", str(tmp_path / "a")),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    monkeypatch.chdir(tmp_path)
    main(["tune", *args, "--study_dir", str(tmp_path / "b")])  # the second worker: this process
    second = capsys.readouterr().out
    out_first, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out_first
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    trials = _check_exact(storage, "shared", 4)
    assert all(t.state.is_finished() for t in trials)
    assert len({tuple(sorted(t.params.items())) for t in trials if counts(t)}) == 4
    assert "4/4 trials finished" in out_first and "4/4 trials finished" in second


@pytest.mark.slow
def test_a_study_killed_mid_trial_continues_and_retries_the_dead_trial(tmp_path, monkeypatch):
    study_dir = tmp_path / "study"
    args = [
        "-c",
        WINE,
        "--n_trials",
        "2",
        "--space",
        str(_space(tmp_path)),
        "--study_dir",
        str(study_dir),
        "--heartbeat",
        "1",
        "--seed",
        "0",
        "--trainer.max_epochs=30",
        "--model.init_args.k=4",
    ]
    killed = subprocess.Popen(
        _tune_command(*args),
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 300
    while not (study_dir / "trials" / "trial_0001" / "logs" / "version_0" / "metrics.csv").exists():
        assert killed.poll() is None and time.monotonic() < deadline, "the study ended before trial 1 ran"
        time.sleep(0.2)
    os.killpg(killed.pid, signal.SIGKILL)  # the whole command, mid-trial: no handler runs
    monkeypatch.chdir(tmp_path)
    killed.wait()
    storage = f"sqlite:///{study_dir / 'study.db'}"
    running = [
        t.number
        for t in optuna.load_study(study_name="tabular_lometab_wine", storage=storage).trials
        if t.state == optuna.trial.TrialState.RUNNING
    ]
    assert running == [1]
    time.sleep(2.5)  # twice the heartbeat: the dead trial is stale
    main(["tune", *args])  # the same command again, here in this process: it finishes the study
    trials = _check_exact(storage, "tabular_lometab_wine", 2)
    dead = trials[1]
    assert dead.state == optuna.trial.TrialState.FAIL
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == 1]
    assert retry.params == dead.params and retry.state == optuna.trial.TrialState.COMPLETE
    notes = {r["number"]: r["note"] for r in _rows(study_dir)}
    assert notes["1"] == "worker died; retried"


def _postgres_binaries() -> Path | None:
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return versions[-1].parent if versions else None


@pytest.mark.slow
@pytest.mark.skipif(_postgres_binaries() is None, reason="PostgreSQL is not installed (make installs it)")
@pytest.mark.skipif(os.geteuid() != 0, reason="starting PostgreSQL as its own user needs root here")
def test_two_workers_share_one_study_on_a_real_postgresql_server(tmp_path):
    bin_dir = _postgres_binaries()
    home = Path(tempfile.mkdtemp(prefix="ripieno-pg-", dir="/tmp"))
    shutil.chown(home, "postgres", "postgres")
    data, socket_dir = home / "data", home / "socket"

    def as_postgres(*command: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *command], check=True, capture_output=True, timeout=120
        )

    try:
        as_postgres("mkdir", str(socket_dir))
        as_postgres(str(bin_dir / "initdb"), "-D", str(data), "--auth=trust", "-U", "postgres")
        as_postgres(
            str(bin_dir / "pg_ctl"),
            "-D",
            str(data),
            "-w",
            "-l",
            str(home / "server.log"),
            "-o",
            f"-k {socket_dir} -c listen_addresses=''",
            "start",
        )
        storage = f"postgresql+psycopg2://postgres@/postgres?host={socket_dir}"
        run = subprocess.run(
            _tune_command(
                "-c",
                WINE,
                "--n_trials",
                "4",
                "--workers",
                "2",
                "--space",
                str(_space(tmp_path)),
                "--storage",
                storage,
                "--study_name",
                "pg",
                "--study_dir",
                str(tmp_path / "study"),
                "--startup_trials",
                "2",
                *FAST,
            ),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        _check_exact(storage, "pg", 4)
        assert len(_rows(tmp_path / "study")) == 4
    finally:
        subprocess.run(
            [
                "runuser",
                "-u",
                "postgres",
                "--",
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(home, ignore_errors=True)
