"""A data file that cannot be used ends the ``ripieno`` command with one line: file, problem, fix."""

from __future__ import annotations

import bz2
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.tables import make_table

from ripieno.datamodules import TabularDataError, TabularDataModule, TextDataError
from ripieno.datamodules.tabular import read_table
from ripieno.datamodules.text import load_table
from ripieno.framework.checkpoint_file import CheckpointFileError
from ripieno.framework.cli import main
from ripieno.framework.specs.tabular_preprocessing import TabularPreprocessor

LATIN1_ROWS = ["text,label", "a fine caf\xe9,pos", "na\xefve and dull,neg", "cr\xe8me br\xfbl\xe9e,pos"]


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _header_only(path: Path) -> None:
    path.write_text("x1,x2,count,colour,y\n")


def _blank_lines(path: Path) -> None:
    path.write_text("\n\n\n")


def _latin1(path: Path) -> None:
    path.write_bytes("\n".join(LATIN1_ROWS).encode("latin-1") + b"\n")


def _ragged(path: Path) -> None:
    path.write_text("x1,y\n1,2\n3,4,5\n")


def _random_bytes(path: Path) -> None:
    path.write_bytes(np.random.default_rng(0).integers(0, 256, 512, dtype=np.uint8).tobytes())


def _folder(path: Path) -> None:
    path.mkdir()


# name, file name, writer, problem, fix: what every message must say
CASES: dict[str, tuple[str, Callable[[Path], None], str, str]] = {
    "empty": ("empty.csv", _empty, "is empty (0 bytes)", "write the table into it again"),
    "header_only": ("header.csv", _header_only, "has a header but no rows", "add rows to it"),
    "blank_lines": ("blank.csv", _blank_lines, "has no header and no rows", "write the table into it again"),
    "latin1": ("latin1.csv", _latin1, "is not valid utf-8 text (byte 0xe9 on line 2)",
               "name its encoding with data.init_args.encoding (e.g. latin-1"),
    "ragged": ("ragged.csv", _ragged, "cannot be parsed (Error tokenizing data",
               "give every row as many fields as the header"),
    "corrupt_parquet": ("corrupt.parquet", _random_bytes, "is not a readable Parquet file",
                        "write it again (e.g. DataFrame.to_parquet)"),
    "folder": ("table.csv", _folder, "is a folder, not a table file", "at a .csv, .tsv or .parquet file"),
    "suffix": ("table.xlsx", _random_bytes, "has the unsupported suffix '.xlsx'",
               "use a .csv, .tsv or .parquet"),
}


def _bad_file(tmp_path: Path, case: str) -> tuple[Path, str, str]:
    name, write, problem, fix = CASES[case]
    path = tmp_path / "bad" / name
    path.parent.mkdir(exist_ok=True)
    write(path)
    return path, problem, fix


def _assert_one_line(error: pytest.ExceptionInfo[SystemExit], path: Path, problem: str, fix: str) -> None:
    text = str(error.value)
    assert text.startswith(f"ripieno: error: {path}: {problem}") and fix in text and "\n" not in text


QUIET = ["--trainer.max_epochs=1", "--trainer.enable_progress_bar=false", "--tensorboard=false"]


@pytest.mark.parametrize("case", list(CASES))
def test_cli_names_a_bad_training_table_and_the_fix(tmp_path, case):
    path, problem, fix = _bad_file(tmp_path, case)
    with pytest.raises(SystemExit) as error:
        main(["fit", "-c", "tabular/lometab_churn", "--data.init_args.dataset=null",
              f"--data.init_args.path={path}", "--data.init_args.target=y", *QUIET,
              f"--trainer.default_root_dir={tmp_path / 'run'}"])
    _assert_one_line(error, path, problem, fix)
    if case in ("empty", "header_only", "corrupt_parquet", "blank_lines"):
        assert "data.init_args.path" in str(error.value)


@pytest.mark.parametrize("case", ["empty", "header_only", "latin1", "corrupt_parquet", "folder"])
def test_cli_names_a_bad_predict_path_and_the_setting(tmp_path, case):
    path, problem, fix = _bad_file(tmp_path, case)
    train = tmp_path / "train.csv"
    make_table(n=120, task="binary").to_csv(train, index=False)
    with pytest.raises(SystemExit) as error:
        main(["fit", "-c", "tabular/lometab_churn", "--data.init_args.dataset=null",
              f"--data.init_args.path={train}", "--data.init_args.target=y",
              "--data.init_args.categorical=[colour]", f"--data.init_args.predict_path={path}", *QUIET,
              f"--trainer.default_root_dir={tmp_path / 'run'}"])
    _assert_one_line(error, path, problem, fix)
    if case != "latin1":  # the encoding fix names data.init_args.encoding instead
        assert "data.init_args.predict_path" in str(error.value)


@pytest.mark.parametrize("case", [c for c in CASES if c != "folder"])  # a folder is a saved datasets source
def test_cli_names_a_bad_text_table_and_the_fix(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    path, problem, fix = _bad_file(tmp_path, case)
    with pytest.raises(SystemExit) as error:
        main(["fit", "-c", "uq/ll_glm_gpt2_rotten_tomatoes", f"--data.init_args.dataset={path}", *QUIET,
              f"--trainer.default_root_dir={tmp_path / 'run'}"])
    _assert_one_line(error, path, problem, fix)


# ------------------------------------------------------------------------ read_table itself
@pytest.mark.parametrize("case", list(CASES))
def test_read_table_raises_one_line_naming_the_file(tmp_path, case):
    path, problem, fix = _bad_file(tmp_path, case)
    with pytest.raises(TabularDataError) as error:
        read_table(path, "data.init_args.path")
    text = str(error.value)
    assert text.startswith(f"{path}: {problem}") and fix in text and "\n" not in text


def test_read_table_with_the_files_encoding_reads_what_pandas_reads(tmp_path):
    path, _, _ = _bad_file(tmp_path, "latin1")
    got = read_table(path, "data.init_args.path", encoding="latin-1")
    pd.testing.assert_frame_equal(got, pd.read_csv(path, encoding="latin-1"))
    assert got["text"].iloc[0] == "a fine café"


def test_read_table_reports_the_first_undecodable_line(tmp_path):
    rows = [f"{i},word{i}" for i in range(50)]
    rows[37] = "37,gar\xe7on"
    path = tmp_path / "late.csv"
    path.write_bytes(("id,word\n" + "\n".join(rows) + "\n").encode("latin-1"))
    expected_line = 1 + 37 + 1  # header, then rows counted from 1
    with pytest.raises(TabularDataError, match=rf"byte 0xe7 on line {expected_line}\)"):
        read_table(path, "data.init_args.path")


def test_read_table_names_an_unknown_encoding(tmp_path):
    path = tmp_path / "t.csv"
    make_table(n=10).to_csv(path, index=False)
    with pytest.raises(TabularDataError, match=r"data.init_args.encoding: 'klingon' is not a known"):
        read_table(path, "data.init_args.path", encoding="klingon")


def test_read_table_reads_tsv_and_compressed_csv_as_pandas_does(tmp_path):
    frame = make_table(n=20)
    frame.to_csv(tmp_path / "t.tsv", sep="\t", index=False)
    frame.to_csv(tmp_path / "t.csv.bz2", index=False)
    tsv, compressed = tmp_path / "t.tsv", tmp_path / "t.csv.bz2"
    pd.testing.assert_frame_equal(read_table(tsv, "a"), pd.read_csv(tsv, sep="\t"))
    pd.testing.assert_frame_equal(read_table(compressed, "a"), pd.read_csv(compressed))
    (tmp_path / "broken.csv.bz2").write_bytes(bz2.compress(b"a,b\n1,2\n")[:-8])
    with pytest.raises(TabularDataError, match=r"broken.csv.bz2: cannot be read"):
        read_table(tmp_path / "broken.csv.bz2", "a")


def _latin1_table(tmp_path: Path) -> Path:
    frame = make_table(n=120, task="binary")
    frame["colour"] = frame["colour"].map({"red": "rouge", "green": "vert", "blue": "bleu clair é"})
    table = tmp_path / "t.csv"
    frame.to_csv(table, index=False, encoding="latin-1")
    return table


def test_cli_encoding_argument_trains_on_a_latin1_table(tmp_path):
    table = _latin1_table(tmp_path)
    main(["fit", "-c", "tabular/lometab_churn", "--data.init_args.dataset=null",
          f"--data.init_args.path={table}", "--data.init_args.target=y",
          "--data.init_args.categorical=[colour]", "--data.init_args.encoding=latin-1",
          "--data.init_args.n_bins=8", "--model.init_args.k=2", "--model.init_args.d_block=8", *QUIET,
          "--trainer.enable_model_summary=false", "--test_after_fit=false",
          f"--trainer.default_root_dir={tmp_path / 'run'}"])
    fitted = torch.load(next((tmp_path / "run").rglob("last.ckpt")), map_location="cpu",
                        weights_only=True)["ripieno_data_spec_fitted"]  # the spec's fitted state
    categories = TabularPreprocessor.from_state(fitted["preprocessing"]).category_names["colour"]
    assert sorted(categories) == sorted(pd.read_csv(table, encoding="latin-1")["colour"].unique())


def test_encoding_argument_reads_a_latin1_table_and_text_file(tmp_path):
    table = _latin1_table(tmp_path)
    with pytest.raises(TabularDataError, match="is not valid utf-8 text"):
        _ = TabularDataModule(dataset=None, path=str(table), target="y", categorical=["colour"]).spec
    dm = TabularDataModule(dataset=None, path=str(table), target="y", categorical=["colour"],
                           encoding="latin-1", n_bins=8)
    categories = TabularPreprocessor.from_state(dm.spec.preprocessing).category_names["colour"]
    assert sorted(categories) == sorted(pd.read_csv(table, encoding="latin-1")["colour"].unique())
    path, _, _ = _bad_file(tmp_path, "latin1")
    raw = load_table(path, "text", "label", encoding="latin-1")
    assert raw.texts == pd.read_csv(path, encoding="latin-1")["text"].tolist()
    with pytest.raises(TextDataError, match="is not valid utf-8 text"):
        load_table(path, "text", "label")


@pytest.mark.parametrize(("content", "problem"), [
    (b"", "is empty (0 bytes)"), (b"not a checkpoint at all", "is not a PyTorch checkpoint")])
def test_a_bad_preprocessing_checkpoint_is_named(tmp_path, content, problem):
    rows = tmp_path / "new.csv"
    make_table(n=10).to_csv(rows, index=False)
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(content)
    dm = TabularDataModule(dataset=None, predict_path=str(rows), preprocessing_from=str(ckpt))
    expected = re.escape(f"{ckpt}: {problem}") + ".*data.init_args.preprocessing_from"
    with pytest.raises(CheckpointFileError, match=f"^{expected}"):
        dm.predict_dataloader()
