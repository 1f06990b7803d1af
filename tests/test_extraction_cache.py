"""The layer-embedding cache: cheap keys, hits that skip the processor and the model, one extraction
across processes, length-bucketed extraction in row order, corrupt entries reported and rebuilt."""

import os
import re
import shutil
import warnings
from functools import partial

import pytest
import torch
import torch.multiprocessing as mp
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import BertConfig, BertModel

import ripieno.datamodules.layer_embeddings as layer_embeddings
import ripieno.datamodules.text as text_module
from ripieno.datamodules import LayerEmbeddingDataModule, LoaderSettings, TextDataModule
from ripieno.datamodules.layer_embedding_config import BackboneConfig, FeatureCacheConfig, SelectionConfig
from ripieno.framework.backbones.loading import load_pretrained_backbone
from ripieno.framework.loes.extraction import extract_layer_embeddings
from ripieno.framework.loes.feature_cache import CHECKSUM_KEY, cached_layer_embeddings


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    dm = TextDataModule(max_rows=120, build_tokenizer=True, vocab_size=300, max_length=24)
    dm.setup()
    shutil.copytree(dm.spec.tokenizer_dir, root / "tok")  # built in ripieno's cache; a copy of the user's
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=dm.spec.vocab_size, hidden_size=16, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=32, max_position_embeddings=80,
                         pad_token_id=dm.spec.pad_token_id)).save_pretrained(root / "bert")
    return root


def _module(folders, cache, bucket_by_length=True):
    source = TextDataModule(max_rows=120, tokenizer_dir=str(folders / "tok"), max_length=64,
                            loader=LoaderSettings(eval_batch_size=16))
    return LayerEmbeddingDataModule(
        source=source, backbone=BackboneConfig(dir=str(folders / "bert")),
        selection=SelectionConfig(method="all"),
        cache=FeatureCacheConfig(dir=str(cache), device="cpu", bucket_by_length=bucket_by_length),
        progress=False, eval_batch_size=16)


class _Counter:
    def __init__(self, real):
        self.real, self.calls = real, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


def test_a_hit_runs_neither_the_tokenizer_nor_the_model(folders, tmp_path, monkeypatch):
    tokenize = _Counter(text_module.tokenize)
    load = _Counter(layer_embeddings.load_pretrained_backbone)
    monkeypatch.setattr(text_module, "tokenize", tokenize)
    monkeypatch.setattr(layer_embeddings, "load_pretrained_backbone", load)
    first = _module(folders, tmp_path)
    first.setup()
    assert tokenize.calls == 3 and load.calls == 1  # one tokenisation per split, one model
    second = _module(folders, tmp_path)
    second.setup()
    assert tokenize.calls == 3 and load.calls == 1  # the hit touched neither
    for split in ("train", "val", "test"):
        assert torch.equal(second._splits[split].layers, first._splits[split].layers)


def test_the_key_follows_the_inputs_and_the_processor(folders, tmp_path):
    dm = _module(folders, tmp_path)
    dm.setup()
    source = dm.source
    base = source.input_fingerprint("train")
    assert base != source.input_fingerprint("val")
    other = TextDataModule(max_rows=120, tokenizer_dir=str(folders / "tok"), max_length=16)
    assert base == _module(folders, tmp_path).source.input_fingerprint("train")
    assert other.input_fingerprint("train") != base  # truncation changes the batches


def test_length_bucketed_extraction_equals_plain_order(folders, tmp_path):
    bucketed = _module(folders, tmp_path / "a", bucket_by_length=True)
    plain = _module(folders, tmp_path / "b", bucket_by_length=False)
    bucketed.setup()
    plain.setup()
    loader = bucketed._source_loaders()["train"]
    first = next(iter(loader))["input_ids"].shape[1]
    order = loader.row_order
    assert not torch.equal(order, torch.arange(len(order)))
    assert first < 64  # the shortest texts come first and pad to their own length
    for split in ("train", "val", "test"):
        torch.testing.assert_close(bucketed._splits[split].layers, plain._splits[split].layers,
                                   rtol=1e-4, atol=1e-5)
        assert torch.equal(bucketed._splits[split].labels, plain._splits[split].labels)


def _extract_in_process(rank, cache, folder, batches, marker):
    def load():
        with open(marker, "a") as handle:
            handle.write(f"{rank}\n")
        return BertModel.from_pretrained(folder)

    emb, _, _, hit = cached_layer_embeddings(load, batches, ["input_ids", "attention_mask"], cache,
                                             model_id="bert", data_id="same-data", progress=False)
    torch.save({"emb": emb, "hit": hit}, os.path.join(cache, f"out{rank}.pt"))


def test_two_processes_extract_once_and_read_the_same(folders, tmp_path):
    batches = [{"input_ids": torch.randint(0, 100, (4, 7)), "y": torch.arange(4),
                "attention_mask": torch.ones(4, 7, dtype=torch.long)}]
    marker = tmp_path / "loaded.txt"
    mp.start_processes(_extract_in_process, args=(str(tmp_path), str(folders / "bert"), batches, str(marker)),
                       nprocs=2, start_method="spawn")
    assert len(marker.read_text().split()) == 1  # one process loaded and ran the backbone
    outs = [torch.load(tmp_path / f"out{r}.pt", weights_only=True) for r in (0, 1)]
    assert sorted(o["hit"] for o in outs) == [False, True]
    assert torch.equal(outs[0]["emb"], outs[1]["emb"])
    model = BertModel.from_pretrained(str(folders / "bert"))
    expected, _ = extract_layer_embeddings(model, batches, ["input_ids", "attention_mask"], progress=False)
    torch.testing.assert_close(outs[0]["emb"], expected)


def test_a_callable_model_needs_an_id(tmp_path):
    with pytest.raises(ValueError, match="model_id"):
        cached_layer_embeddings(lambda: None, [], ["x"], tmp_path, data_id="d")


def test_cli_extraction_bar_follows_the_trainers():
    from jsonargparse import Namespace

    from ripieno.framework.runner.command import _data_progress_follows_trainer

    for enabled, expected in ((False, False), (True, True), (None, True)):
        config = Namespace(data=Namespace(init_args=Namespace(progress=None)),
                           trainer=Namespace(enable_progress_bar=enabled))
        _data_progress_follows_trainer(config)
        assert config.data.init_args.progress is expected
    kept = Namespace(data=Namespace(init_args=Namespace(progress=True)),
                     trainer=Namespace(enable_progress_bar=False))
    _data_progress_follows_trainer(kept)
    assert kept.data.init_args.progress is True  # an explicit choice wins


def test_prepare_data_extracts_on_global_rank_zero_only(folders, tmp_path, monkeypatch):
    load = _Counter(layer_embeddings.load_pretrained_backbone)
    monkeypatch.setattr(layer_embeddings, "load_pretrained_backbone", load)
    dm = _module(folders, tmp_path)
    assert dm.prepare_data_per_node is False  # Lightning calls prepare_data on global rank 0 only
    dm.prepare_data()
    assert load.calls == 1 and len(list(tmp_path.glob("layers-*.safetensors"))) == 3  # one per split
    other_rank = _module(folders, tmp_path)
    other_rank.setup()
    assert load.calls == 1  # the other ranks read what rank 0 wrote
    assert torch.equal(other_rank._splits["train"].layers, dm._splits["train"].layers)


def _drop_checksum(path):
    with safe_open(str(path), framework="pt") as entry:
        metadata = {k: v for k, v in entry.metadata().items() if k != CHECKSUM_KEY}
        tensors = {name: entry.get_tensor(name) for name in entry.keys()}
    save_file(tensors, str(path), metadata=metadata)  # an entry as ripieno wrote it before checksums


def _flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # the last tensor's last byte: the file still parses
    path.write_bytes(bytes(data))


CORRUPTIONS = {
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
                  "is not a readable safetensors file (Error while deserializing header: incomplete"),
    "garbled_header": (lambda p: p.write_bytes(b"\xff" * 8 + p.read_bytes()[8:]),
                       "is not a readable safetensors file (Error while deserializing header"),
    "flipped_byte": (_flip_last_byte, "does not match its stored SHA-256"),
    "no_checksum": (_drop_checksum, "has no checksum (written by an older ripieno)"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_a_corrupt_entry_is_reported_and_rebuilt_exactly(folders, tmp_path, case):
    corrupt, problem = CORRUPTIONS[case]
    model = BertModel.from_pretrained(str(folders / "bert"))
    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(5, 200, (4, 9), generator=g), "y": torch.arange(4),
                "attention_mask": torch.ones(4, 9, dtype=torch.long)} for _ in range(2)]
    keys = ["input_ids", "attention_mask"]
    expected, labels = extract_layer_embeddings(model, batches, keys, progress=False)

    def cached():
        return cached_layer_embeddings(model, batches, keys, tmp_path, model_id="bert", data_id="d",
                                       progress=False)

    _, _, path, hit = cached()
    assert not hit
    corrupt(path)
    with pytest.warns(UserWarning, match=re.escape(f"{path}: {problem}")) as warned:
        emb, rebuilt_labels, _, hit = cached()
    assert len(warned) == 1 and "re-extracting the embeddings and rewriting it" in str(warned[0].message)
    assert not hit and torch.equal(emb, expected) and torch.equal(rebuilt_labels, labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the rewritten entry reads back cleanly
        emb, again_labels, _, hit = cached()
    assert hit and torch.equal(emb, expected) and torch.equal(again_labels, labels)
    assert not list(tmp_path.glob("*.tmp"))  # written through a temporary file, renamed into place


def test_a_miss_returns_exactly_what_a_hit_reads(folders, tmp_path):
    """Same dtype, same row order, same bits: length-bucketed extraction put back in row order."""
    first = _module(folders, tmp_path)
    loaders = first._source_loaders()
    first.setup()
    keys = ["input_ids", "attention_mask"]
    load = partial(load_pretrained_backbone, folders / "bert")
    for split in ("train", "test"):
        cached = partial(cached_layer_embeddings, load, loaders[split], keys, tmp_path / "direct",
                         model_id="bert", data_id=first.source.input_fingerprint(split), progress=False)
        emb, labels, _, hit = cached()
        read, read_labels, _, read_hit = cached()
        assert (hit, read_hit) == (False, True)
        assert emb.dtype == read.dtype == torch.float32 and labels.dtype == read_labels.dtype
        assert torch.equal(emb, read) and torch.equal(labels, read_labels)
        assert torch.equal(labels, first.source._splits[split].labels)  # dataset row order
