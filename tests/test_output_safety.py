"""Nothing the user named is written over, and bad inputs stop before any work (issue 20).

Every command runs through the ``ripieno`` command in-process; every input file and folder
is hashed (SHA-256 of each file, and the listing) before and after, so a command that
refuses changes nothing, and one that writes adds only its own new files.
"""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.tables import make_table

from ripieno.datamodules import TabularDataError
from ripieno.datamodules.tabular import read_table
from ripieno.framework.checkpoint_file import CheckpointFileError, read_checkpoint
from ripieno.framework.cli import main
from ripieno.framework.methods import TabularEnsembleModule

DATA = ["--data=ripieno.datamodules.TabularDataModule", "--data.init_args.dataset=null",
        "--data.init_args.target=y", "--data.init_args.categorical=[colour]", "--data.init_args.n_bins=8"]
MODEL = ["--model=ripieno.framework.methods.TabularEnsembleModule", "--model.init_args.k=4",
         "--model.init_args.d_block=16"]
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def snapshot(*roots: Path) -> dict[str, str]:
    """SHA-256 of every file under ``roots`` (files or folders), by path; folders map to ``<dir>``."""
    digests: dict[str, str] = {}
    for root in roots:
        paths = [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]
        for path in paths:
            digests[str(path)] = "<dir>" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def added(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The names of new files; fails if any file of ``before`` changed or went away."""
    changed = [p for p, digest in before.items() if after.get(p) != digest]
    assert not changed, f"inputs changed or removed: {changed}"
    return sorted(Path(p).name for p in after.keys() - before.keys())


def refusal(args: list[str]) -> str:
    """The one-line message of a command that must stop."""
    with pytest.raises(SystemExit) as stop:
        main(args)
    message = str(stop.value.code)
    assert "\n" not in message, message
    return message


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny trained tabular run (k=4, one epoch): its folder, checkpoint, config and data."""
    root = tmp_path_factory.mktemp("run")
    data = root / "train.csv"
    make_table(task="binary").to_csv(data, index=False)
    main(["fit", *DATA, f"--data.init_args.path={data}", *MODEL, *QUIET, "--trainer.max_epochs=1",
          f"--trainer.default_root_dir={root / 'run'}"])
    version = root / "run" / "logs" / "version_0"
    return {"root": root, "data": data, "version": version, "config": version / "config.yaml",
            "ckpt": next((version / "checkpoints").glob("*.ckpt"))}


def test_select_members_refuses_every_output_that_would_replace_a_file(run, tmp_path):
    ckpt, config = run["ckpt"], run["config"]
    existing = tmp_path / "taken.ckpt"
    existing.write_bytes(ckpt.read_bytes())
    table = tmp_path / "notes.csv"
    table.write_text("a,b\n1,2\n")
    link = tmp_path / "hard_link.ckpt"
    os.link(ckpt, link)
    # a missing data file: a command that built the datamodule before refusing would fail on it instead
    base = ["select_members", "-c", str(config), f"--ckpt_path={ckpt}", "--k=2",
            f"--data.init_args.path={tmp_path / 'absent.csv'}"]
    before = snapshot(run["root"], tmp_path)
    cases = {
        f"--out={ckpt}": "is the checkpoint to select from (--ckpt_path)",
        f"--out={ckpt.parent / '..' / ckpt.parent.name / ckpt.name}": "is the checkpoint to select from",
        f"--out={link}": "is the checkpoint to select from",
        f"--out={config}": "is the config given with -c",
        f"--out={existing}": "exists already and --out does not replace files unless told",
        f"--out={tmp_path}": "is a folder",
    }
    for out, problem in cases.items():
        for extra in ([], ["--overwrite"]) if "exists already" not in problem else ([],):
            message = refusal([*base, out, *extra])
            assert problem in message and message.startswith("ripieno select_members: "), message
            assert out.split("=", 1)[1] in message
    message = refusal([*base, f"--out={table}", "--overwrite"])
    assert f"{table}: exists and is not a checkpoint" in message
    assert "--out too" in refusal([*base, "--overwrite"])
    assert added(before, snapshot(run["root"], tmp_path)) == []


def test_select_members_from_the_runs_config_yaml_writes_new_files_atomically(run, capsys):
    ckpt, config = run["ckpt"], run["config"]
    command = ["select_members", "-c", str(config), f"--ckpt_path={ckpt}", "--k=2"]
    before = snapshot(run["root"])
    main(command)
    first = ckpt.with_name(f"{ckpt.stem}-greedy2.ckpt")
    assert f"ripieno: checkpoint {first}" in capsys.readouterr().out
    after_first = snapshot(run["root"])
    assert added(before, after_first) == [first.name]  # nothing else: no log folder, no temporary file
    main(command)  # the default name is taken: the next free one, the first file kept
    assert added(after_first, snapshot(run["root"])) == [f"{ckpt.stem}-greedy2_1.ckpt"]
    small = TabularEnsembleModule.load_from_checkpoint(first, weights_only=True)
    assert small.hparams.k == 2 and read_checkpoint(ckpt)["hyper_parameters"]["k"] == 4
    before = snapshot(run["root"])
    main([*command[:-1], "--k=3", f"--out={first}", "--overwrite"])  # replaced, atomically, when told
    after = snapshot(run["root"])
    assert after.keys() == before.keys() and after[str(first)] != before[str(first)]
    assert TabularEnsembleModule.load_from_checkpoint(first, weights_only=True).hparams.k == 3


def test_predict_twice_keeps_the_first_predictions(run, tmp_path, capsys):
    rows = make_table(n=20, seed=3, task="binary").drop(columns="y")
    new = tmp_path / "new.csv"
    rows.to_csv(new, index=False)
    command = ["predict", "-c", str(run["config"]), f"--ckpt_path={run['ckpt']}",
               f"--data.init_args.predict_path={new}", "--trainer.logger=false",
               f"--trainer.default_root_dir={tmp_path / 'out'}",
               "--trainer.callbacks+=ripieno.callbacks.MemberPredictionWriter"]
    inputs = snapshot(run["root"], new)
    main(command)
    first = snapshot(tmp_path / "out")
    assert {"predictions.csv", "predictions.pt"} <= {Path(p).name for p in first}
    main(command)
    second = added(first, snapshot(tmp_path / "out"))
    assert second == ["config_1.yaml", "predictions_1.csv", "predictions_1.pt"]
    out = capsys.readouterr().out
    assert f"predictions written to {tmp_path / 'out' / 'predictions_1.pt'}" in out
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "out" / "predictions.csv"),
                                  pd.read_csv(tmp_path / "out" / "predictions_1.csv"))
    assert added(inputs, snapshot(run["root"], new)) == []


def _repeated_column(frame: pd.DataFrame) -> pd.DataFrame:
    """``x1`` twice: a first copy of zeros, the real values in the second (pandas would keep the zeros)."""
    values = frame.pop("x1")
    return pd.concat([pd.Series(0.0, index=frame.index, name="x1"), frame, values], axis=1)


def test_a_repeated_column_stops_fit_and_predict_naming_the_file_and_column(run, tmp_path):
    train = tmp_path / "repeated.csv"
    _repeated_column(make_table(task="binary")).to_csv(train, index=False)
    assert pd.read_csv(train).columns[-1] == "x1.1"  # what pandas alone would hand on
    before = snapshot(train)
    message = refusal(["fit", *DATA, f"--data.init_args.path={train}", *MODEL, *QUIET,
                       "--trainer.max_epochs=1", f"--trainer.default_root_dir={tmp_path / 'run'}"])
    assert f"{train}: has the column name 'x1' more than once in its header (columns 1 and 6)" in message
    assert "rename or remove the extra copies" in message
    new = tmp_path / "new_rows.csv"
    _repeated_column(make_table(n=10, task="binary").drop(columns="y")).to_csv(new, index=False)
    inputs = snapshot(run["root"], new, train)
    message = refusal(["predict", "-c", str(run["config"]), f"--ckpt_path={run['ckpt']}",
                       f"--data.init_args.predict_path={new}", "--trainer.logger=false",
                       f"--trainer.default_root_dir={tmp_path / 'out'}",
                       "--trainer.callbacks+=ripieno.callbacks.MemberPredictionWriter"])
    assert f"{new}: has the column name 'x1' more than once" in message
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]  # nothing written
    assert added({**before, **inputs}, snapshot(run["root"], new, train)) == []


@pytest.mark.parametrize("name", ["t.tsv", "t.csv.gz", "t.parquet"])
def test_a_repeated_column_is_found_in_every_table_format_from_the_raw_header(tmp_path, name):
    frame = pd.DataFrame(np.arange(12).reshape(3, 4), columns=["a", "b", "a", "b"])
    path = tmp_path / name
    if name.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_arrays([pa.array(frame.iloc[:, i]) for i in range(4)],
                                            names=list(frame.columns)), path)
    else:
        frame.to_csv(path, index=False, sep="\t" if name == "t.tsv" else ",")
    with pytest.raises(TabularDataError, match=r"repeats column names in its header: 'a' \(columns 1 and 3\),"
                                               r" 'b' \(columns 2 and 4\)"):
        read_table(path, "data.init_args.path")


def test_a_repeated_column_in_datasets_data_files_is_refused_before_datasets_reads_it(tmp_path):
    pytest.importorskip("datasets")
    from ripieno.datamodules.hf_datasets import load_hf_splits

    _repeated_column(make_table(n=20, task="binary")).to_csv(tmp_path / "part_0.csv", index=False)
    with pytest.raises(TabularDataError, match=r"part_0\.csv: has the column name 'x1' more than once"):
        load_hf_splits(tmp_path, data_files={"train": str(tmp_path / "part_*.csv")}, builder="csv",
                       error=TabularDataError)


def test_a_real_column_named_like_a_pandas_repeat_is_read(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("\ufeffa,a.1,,\n1,2,3,4\n")  # a byte-order mark, 'a.1' of its own, two unnamed columns
    assert list(read_table(path, "data.init_args.path").columns) == ["a", "a.1", "Unnamed: 2", "Unnamed: 3"]


class RunsACommand:
    """A malicious-style object: unpickling it would call ``os.system`` (it is never unpickled here)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.system, (self.command,)


def test_a_malicious_pickle_is_named_unsafe_and_nothing_runs(run, tmp_path):
    marker = tmp_path / "ran"
    evil = tmp_path / "model.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": RunsACommand(f"touch {marker}")}, evil)
    before = snapshot(run["root"], evil)
    with pytest.raises(CheckpointFileError) as error:
        read_checkpoint(evil)
    message = str(error.value)
    assert message.startswith(f"{evil}: is unsafe: its pickle would call ")
    assert "system, which runs code or commands" in message and "truncated or damaged" not in message
    assert "weights_only=False" not in message and "\n" not in message
    for command in (["select_members", "-c", str(run["config"]), f"--ckpt_path={evil}", "--k=2"],
                    ["predict", "-c", str(run["config"]), f"--ckpt_path={evil}", "--trainer.logger=false"]):
        assert f"{evil}: is unsafe" in refusal(command)
    assert not marker.exists()
    assert added(before, snapshot(run["root"], evil)) == []


@pytest.mark.parametrize("wording", [
    "Weights only load failed. ... WeightsUnpickler error: Unsupported global: GLOBAL os.system was not an"
    " allowed global by default. Please use `torch.serialization.add_safe_globals([os.system])`",
    "Weights only load failed.\n\nTrying to load unsupported GLOBAL posix.system whose module posix is"
    " blocked.",
    "Weights only load failed. WeightsUnpickler error: Unsupported global: GLOBAL eval was not an allowed"
    " global by default.",
])
def test_both_torch_wordings_of_a_refused_code_global_read_as_unsafe(tmp_path, wording):
    path = tmp_path / "a.ckpt"
    torch.save({"state_dict": {}}, path)
    with mock.patch("torch.load", side_effect=pickle.UnpicklingError(wording)), \
            pytest.raises(CheckpointFileError, match=r"a\.ckpt: is unsafe: its pickle would call"):
        read_checkpoint(path)


def test_a_refused_class_of_ones_own_keeps_the_trust_caveat(tmp_path):
    path = tmp_path / "a.ckpt"
    torch.save({"state_dict": {}}, path)
    wording = "Weights only load failed. Unsupported global: GLOBAL mypackage.Config was not an allowed"
    caveat = r"refuses \(mypackage\.Config\).*weights_only=False only if you trust where it came from"
    with mock.patch("torch.load", side_effect=pickle.UnpicklingError(wording)), \
            pytest.raises(CheckpointFileError, match=caveat):
        read_checkpoint(path)
