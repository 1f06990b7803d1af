"""Nothing is written into what the user named as input (issue 20 item 1, cases 1, 2, 7, 8, 9).

Tokenizers, random and converted backbones and feature caches go to ripieno's cache folder,
score tables into the run folder. Every command below runs with the user's folders hashed
(every file's SHA-256 and the listing) before and after, and nothing may change. Generated
folders are built once (a lock, a staging folder, a marker written last); a half-built one in
the cache is rebuilt, and a folder outside the cache is never replaced.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from transformers import BertConfig, BertModel, BertTokenizerFast

from ripieno.datamodules import TextDataModule
from ripieno.datamodules.text import TextDataError, bpe_tokenizer_record, cached_bpe_tokenizer
from ripieno.framework.backbones.small_models import (
    SMALL_BACKBONE_SETTINGS,
    build_small_wav2vec2,
    cached_small_backbone,
    small_backbone_record,
)
from ripieno.framework.cli import main
from ripieno.framework.outputs.generated_folders import MARKER, build_once, generated_dir, publish_once

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a film is good bad movie great plot and".split(),
         *"abcdefghijklmnopqrstuvwxyz"]
LL_GLM = "uq/ll_glm_gpt2_rotten_tomatoes"
LOES = "loes/text_gpt2_loes"
QUICK = ["--trainer.max_epochs=1", "--trainer.limit_train_batches=2", "--trainer.enable_progress_bar=false",
         "--trainer.enable_model_summary=false", "--tensorboard=false"]


def snapshot(*roots: Path) -> dict[str, str]:
    """Every file's SHA-256 and every folder's listing under ``roots`` (a file is hashed itself)."""
    state: dict[str, str] = {}
    for root in roots:
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        state[f"{root}/"] = "\n".join(sorted(p.name for p in root.iterdir())) if root.is_dir() else "file"
        for path in paths:
            if path.is_dir():
                state[f"{path}/"] = "\n".join(sorted(p.name for p in path.iterdir()))
            else:
                state[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return state


def one_line_error(args: list[str], *inputs: Path) -> str:
    """Run the command, which must stop with one line, and check it changed none of ``inputs``."""
    before = snapshot(*inputs)
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert snapshot(*inputs) == before
    text = str(stop.value.code)
    assert text.startswith("ripieno: error: ") and "\n" not in text, text
    return text


def run(args: list[str], *inputs: Path) -> None:
    """Run the command and check it changed none of ``inputs``."""
    before = snapshot(*inputs)
    main(args)
    assert snapshot(*inputs) == before


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's tiny BERT folder (model and tokenizer written by save_pretrained)."""
    folder = tmp_path_factory.mktemp("user") / "bert"
    folder.mkdir()
    (folder / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt")).save_pretrained(folder)
    BertModel(BertConfig(vocab_size=len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(folder)
    return folder


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh, empty ripieno cache folder for this test."""
    folder = tmp_path / "cache"
    monkeypatch.setenv("RIPIENO_CACHE", str(folder))
    return folder


def generated(cache: Path) -> list[str]:
    """The generated folders in the cache (tokenizers and backbones)."""
    return sorted(p.relative_to(cache).as_posix() for kind in ("tokenizers", "backbones")
                  for p in (cache / kind).glob("[!.]*"))


def loes_args(root: Path, *extra: str, **source: object) -> list[str]:
    init = {"dataset": "rotten_tomatoes", "max_length": 32, "build_tokenizer": True, "max_rows": 120} | source
    spec = {"class_path": "ripieno.datamodules.TextDataModule", "init_args": init}
    return ["fit", "-c", LOES, f"--data.init_args.source={json.dumps(spec)}",
            "--data.init_args.progress=false", f"--trainer.default_root_dir={root}", *QUICK, *extra]


# ------------------------------------------------------------------ case 1: a user's tokenizer folder
def test_a_users_tokenizer_folder_is_only_read(bert: Path, tmp_path: Path, cache: Path) -> None:
    base = ["fit", "-c", LL_GLM, "--data.init_args.max_rows=120", f"--trainer.default_root_dir={tmp_path}",
            *QUICK]
    text = one_line_error([*base, f"--model.init_args.pretrained_dir={bert}",
                           f"--data.init_args.tokenizer_dir={bert}"], bert)
    assert "tokenizer_dir=" in text and "build_tokenizer=true" in text
    assert "--data.init_args.build_tokenizer=false" in text
    assert not cache.exists() or not generated(cache)  # refused before any data was read
    # the built tokenizer goes to the cache; the model's vocabulary check is one line naming the fix
    text = one_line_error([*base, f"--model.init_args.pretrained_dir={bert}"], bert)
    assert f"{bert}: the model's vocabulary ({len(WORDS)} tokens) is smaller than the tokenizer's" in text
    assert f"--data.init_args.tokenizer_dir={bert} --data.init_args.build_tokenizer=false" in text
    assert [p.split("-")[0] for p in generated(cache)] == ["tokenizers/rotten_tomatoes"]
    # the folder's own tokenizer, read only
    run([*base, f"--model.init_args.pretrained_dir={bert}", f"--data.init_args.tokenizer_dir={bert}",
         "--data.init_args.build_tokenizer=false", "--trainer.logger=false", "--test_after_fit=false"], bert)


def test_text_datamodule_refuses_both_tokenizer_settings_in_python(bert: Path) -> None:
    with pytest.raises(TextDataError, match=r"^tokenizer_dir=.* and build_tokenizer=true are both set"):
        TextDataModule(tokenizer_dir=str(bert), build_tokenizer=True)


def test_a_built_tokenizer_is_reused_and_keyed_by_its_texts(cache: Path) -> None:
    first = TextDataModule(max_rows=120, build_tokenizer=True, vocab_size=300)
    again = TextDataModule(max_rows=120, build_tokenizer=True, vocab_size=300)
    other = TextDataModule(max_rows=150, build_tokenizer=True, vocab_size=300)
    folder = Path(first.spec.tokenizer_dir)
    assert folder.parent == cache / "tokenizers" and (folder / MARKER).is_file()
    stamp = (folder / "tokenizer.json").stat().st_mtime_ns
    assert Path(again.spec.tokenizer_dir) == folder
    assert (folder / "tokenizer.json").stat().st_mtime_ns == stamp  # reused, not trained again
    assert Path(other.spec.tokenizer_dir) != folder
    assert json.loads((folder / MARKER).read_text())["texts_sha256"] == bpe_tokenizer_record(
        first._splits["train"].texts, 300)["texts_sha256"]


# ------------------------------------------------- cases 2 and 9: a user's backbone folder, bad settings
def test_a_users_backbone_folder_is_never_written(bert: Path, tmp_path: Path, cache: Path) -> None:
    mine = tmp_path / "mymodel"
    mine.mkdir()
    (mine / "model.safetensors").write_bytes((bert / "model.safetensors").read_bytes())
    text = one_line_error(loes_args(tmp_path / "run", f"--data.init_args.backbone.dir={mine}",
                                    "--data.init_args.selection.k=99"), mine)
    assert f"backbone.dir={mine} and backbone.build=gpt2 are both set" in text
    assert "--data.init_args.backbone.build=null" in text
    text = one_line_error(loes_args(tmp_path / "run", f"--data.init_args.backbone.dir={mine}",
                                    "--data.init_args.backbone.build=null"), mine)
    assert text.startswith(f"ripieno: error: {mine}: has no config.json")
    assert not cache.exists() or not generated(cache)  # checked before the tokenizer was built


@pytest.mark.parametrize("bad", ["k", "source"])
def test_bad_settings_stop_before_anything_is_generated(bad: str, tmp_path: Path, cache: Path) -> None:
    if bad == "k":
        args = loes_args(tmp_path / "run", "--data.init_args.selection.k=99")
        expected = "k=99 exceeds the 4 candidate hidden states"
    else:
        spec = {"class_path": "ripieno.framework.TextClassifier", "init_args": {}}
        args = [*loes_args(tmp_path / "run"), f"--data.init_args.source={json.dumps(spec)}"]
        expected = "is not a LightningDataModule"
    assert expected in one_line_error(args)
    assert not cache.exists() or not generated(cache)


# ------------------------------------------------------------------- case 7: the score table
def test_scores_go_into_the_run_folder_and_never_replace_a_file(tmp_path: Path, cache: Path) -> None:
    root = tmp_path / "run"
    run(loes_args(root, "--test_after_fit=false"))
    (first,) = root.rglob("selection_scores.csv")
    assert first.parent.name == "version_0" and first.parent.parent.name == "logs"
    assert {"step", "layer", "hidden_state"} <= set(pd.read_csv(first).columns)
    absolute = tmp_path / "mine.csv"
    absolute.write_text("the user's own file\n")
    quick = ["--trainer.fast_dev_run=1", "--test_after_fit=false"]
    run(loes_args(root, *quick), first, absolute)  # no logger: into default_root_dir
    run(loes_args(root, *quick), first, absolute, root / "selection_scores.csv")  # the same table: kept
    run(loes_args(root, *quick, "--data.init_args.selection.k=2"), first, absolute,
        root / "selection_scores.csv")
    assert len(pd.read_csv(root / "selection_scores_1.csv")) < len(pd.read_csv(root / "selection_scores.csv"))
    run(loes_args(root, "--trainer.fast_dev_run=1", "--test_after_fit=false",
                  f"--data.init_args.selection.scores_path={absolute}"), first, absolute,
        root / "selection_scores.csv")
    assert (tmp_path / "mine_1.csv").is_file()
    run(loes_args(root, "--trainer.fast_dev_run=1", "--data.init_args.selection.scores_path=null"), first)
    assert len(list(root.rglob("selection_scores*.csv"))) == 3


# ------------------------------------------------- case 8: half-built folders, kills, concurrency
def test_a_half_built_backbone_in_the_cache_is_rebuilt(tmp_path: Path, cache: Path) -> None:
    target = generated_dir("backbones", "random-gpt2", small_backbone_record("gpt2"))
    target.mkdir(parents=True)
    (target / "config.json").write_text('{"model_type": "gpt2", "n_layer": 4}')  # weights never written
    staging = target.with_name(f".{target.name}.tmp-deadbeef")
    staging.mkdir()
    (staging / "model.safetensors").write_bytes(b"partial")
    run(loes_args(tmp_path / "run", "--trainer.fast_dev_run=1", "--test_after_fit=false"))
    assert (target / MARKER).is_file() and (target / "model.safetensors").stat().st_size > 1000
    assert not staging.exists()


def test_a_half_built_tokenizer_in_the_cache_is_rebuilt(cache: Path) -> None:
    texts = ["a good film", "a bad film", "good acting", "bad plot"] * 10
    target = generated_dir("tokenizers", "reviews", bpe_tokenizer_record(texts, 300))
    target.mkdir(parents=True)
    (target / "tokenizer.json").write_text("{")  # cut short
    folder, built = cached_bpe_tokenizer(texts, 300, "reviews")
    assert built and folder == target.resolve() and (folder / MARKER).is_file()
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["type"] == "BPE"


# Forked children share this process's imports (a spawned Python spends seconds importing torch).
FORK = multiprocessing.get_context("fork")


def _killed_build(flag: str) -> None:
    """Build the small Wav2Vec2 and stop, lock held and staging folder full, until killed."""
    torch.set_num_threads(1)
    record = small_backbone_record("wav2vec2")

    def write(folder: Path) -> None:
        build_small_wav2vec2(folder, **SMALL_BACKBONE_SETTINGS["wav2vec2"], announce=False)
        Path(flag).touch()
        time.sleep(60)

    build_once(generated_dir("backbones", "random-wav2vec2", record), record, write)


def test_a_build_killed_by_sigkill_is_rebuilt_by_the_next_run(tmp_path: Path, cache: Path) -> None:
    flag = tmp_path / "written"
    child = FORK.Process(target=_killed_build, args=(str(flag),))
    child.start()
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert child.is_alive() and time.monotonic() < deadline, "the build did not start"
            time.sleep(0.02)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    target = generated_dir("backbones", "random-wav2vec2", small_backbone_record("wav2vec2"))
    assert not target.exists() and list(target.parent.glob(f".{target.name}.tmp-*"))  # a half-built staging
    folder, built = cached_small_backbone("wav2vec2")
    assert built and (folder / MARKER).is_file() and not list(target.parent.glob(f".{target.name}.tmp-*"))


def _race(barrier: Any, results: Any) -> None:  # noqa: ANN401
    """Build the same tokenizer and backbone as the other process, starting at the same moment."""
    torch.set_num_threads(1)
    barrier.wait(timeout=60)
    results.put(("tokenizer", cached_bpe_tokenizer(["a good film", "a bad film", "good acting"] * 30, 300,
                                                   "race")[1]))
    results.put(("backbone", cached_small_backbone("wav2vec2")[1]))


def test_two_processes_build_the_same_tokenizer_and_backbone_once(cache: Path) -> None:
    barrier, results = FORK.Barrier(2), FORK.Queue()
    children = [FORK.Process(target=_race, args=(barrier, results)) for _ in range(2)]
    for child in children:
        child.start()
    built = sorted(results.get(timeout=120) for _ in range(4))
    for child in children:
        child.join(timeout=60)
    assert [child.exitcode for child in children] == [0, 0]
    assert built == [("backbone", False), ("backbone", True), ("tokenizer", False), ("tokenizer", True)]
    assert len(generated(cache)) == 2 and not list(cache.rglob(".*.tmp-*"))


def test_a_folder_outside_the_cache_is_never_replaced(tmp_path: Path, cache: Path) -> None:
    folder = tmp_path / "models" / "converted"
    folder.mkdir(parents=True)
    (folder / "weights.bin").write_bytes(b"the user's")
    before = snapshot(folder)
    with pytest.raises(FileExistsError, match="files ripieno did not generate"):
        publish_once(folder, {"weights": "abc"}, lambda staging: None)
    assert snapshot(folder) == before
    empty = tmp_path / "models" / "empty"
    empty.mkdir()
    assert build_once(empty, {"weights": "abc"}, lambda staging: None)[1]  # an empty folder is filled
