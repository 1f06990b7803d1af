"""Hugging Face ``datasets`` sources: saved folders and local files keep their official splits."""

import json

import pytest
import torch

from ripieno.datamodules import LoaderSettings, SplitSettings, TextDataModule
from ripieno.datamodules.hf_datasets import load_hf_splits, resolve_splits
from ripieno.datamodules.text import TextDataError

datasets = pytest.importorskip("datasets")


def _texts(n, offset=0):
    return [f"{'good' if i % 2 else 'bad'} film number {i + offset}" for i in range(n)]


@pytest.fixture(scope="module")
def tokenizer_dir():
    dm = TextDataModule(max_rows=100, build_tokenizer=True, vocab_size=300)
    dm.setup()
    return dm.spec.tokenizer_dir


def _saved(tmp_path, names):
    features = datasets.Features({"text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["neg", "pos"])})
    parts = {}
    for j, name in enumerate(names):
        texts = _texts(40, offset=100 * j)
        parts[name] = datasets.Dataset.from_dict({"text": texts, "label": [i % 2 for i in range(40)]},
                                                 features=features)
    datasets.DatasetDict(parts).save_to_disk(tmp_path / "saved")
    return str(tmp_path / "saved"), parts


def _dm(dataset, tokenizer_dir, **kwargs):
    dm = TextDataModule(dataset=dataset, tokenizer_dir=tokenizer_dir, max_length=16, **kwargs)
    dm.setup()
    return dm


def test_official_train_validation_test_are_kept(tmp_path, tokenizer_dir):
    path, parts = _saved(tmp_path, ["train", "validation", "test"])
    dm = _dm(path, tokenizer_dir)
    for ours, theirs in (("train", "train"), ("val", "validation"), ("test", "test")):
        assert dm._splits[ours].texts == parts[theirs]["text"]
    assert dm.spec.class_names == ["neg", "pos"]


def test_missing_validation_is_carved_from_train_only(tmp_path, tokenizer_dir):
    path, parts = _saved(tmp_path, ["train", "test"])
    dm = _dm(path, tokenizer_dir, split=SplitSettings(val_size=0.25))
    assert dm._splits["test"].texts == parts["test"]["text"]
    train, val = set(dm._splits["train"].texts), set(dm._splits["val"].texts)
    assert train | val == set(parts["train"]["text"]) and not train & val and len(val) == 10


def test_resplit_pools_every_split(tmp_path, tokenizer_dir):
    path, _ = _saved(tmp_path, ["train", "validation", "test"])
    dm = _dm(path, tokenizer_dir, split=SplitSettings(policy="resplit", val_size=0.1, test_size=0.2))
    assert sum(len(s) for s in dm._splits.values()) == 120 and len(dm._splits["test"]) == 24


def test_local_json_files_with_a_builder(tmp_path, tokenizer_dir):
    for name, n, offset in (("train", 30, 0), ("test", 10, 500)):
        rows = [{"review": t, "stars": "high" if i % 2 else "low"} for i, t in enumerate(_texts(n, offset))]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    files = {"train": str(tmp_path / "train.jsonl"), "test": str(tmp_path / "test.jsonl")}
    dm = _dm("reviews", tokenizer_dir, data_files=files, builder="json", text_column="review",
             label_column="stars")
    assert dm.spec.class_names == ["high", "low"]
    assert len(dm._splits["test"]) == 10 and dm._splits["test"].texts[0] == _texts(10, 500)[0]
    assert dm._splits["test"].labels.tolist() == [1 if i % 2 == 0 else 0 for i in range(10)]


def test_a_label_unseen_in_train_is_an_error(tmp_path, tokenizer_dir):
    (tmp_path / "train.csv").write_text("text,label\n" + "\n".join(f"t{i},{'a' if i % 2 else 'b'}"
                                                                   for i in range(20)))
    (tmp_path / "test.csv").write_text("text,label\nx,a\ny,c\n")
    files = {"train": str(tmp_path / "train.csv"), "test": str(tmp_path / "test.csv")}
    with pytest.raises(TextDataError, match=r"labels \['c'\] that the train split never has"):
        _dm("t", tokenizer_dir, data_files=files, builder="csv")


def test_bad_sources_name_the_fix(tmp_path):
    with pytest.raises(TextDataError, match="builder must be one of"):
        load_hf_splits("x", data_files="a.csv", builder="excel", error=TextDataError)
    with pytest.raises(TextDataError, match="do not exist"):
        load_hf_splits("x", data_files=str(tmp_path / "none.csv"), builder="csv", error=TextDataError)
    with pytest.raises(TextDataError, match="save_to_disk"):
        load_hf_splits(str(tmp_path), error=TextDataError)
    with pytest.raises(TextDataError, match="Unknown split name"):
        resolve_splits({"train": 1, "holdout": 2}, "official", "T", TextDataError)
    with pytest.raises(TextDataError, match="Two splits map to 'val'"):
        resolve_splits({"train": 1, "dev": 2, "validation": 3}, "official", "T", TextDataError)
    with pytest.raises(TextDataError, match="no train split"):
        resolve_splits({"test": 1}, "official", "T", TextDataError)


# ---------------------------------------------------------------------------------- audio
def _wav2vec2(tmp_path):
    from ripieno.framework.backbones.small_models import build_small_wav2vec2

    return str(build_small_wav2vec2(tmp_path / "w2v"))


def test_audiofolder_files_keep_their_splits_and_decode_with_soundfile(tmp_path):
    import numpy as np
    from helpers.media import write_audio_folder

    from ripieno.datamodules.audio import AudioDataModule, read_audio

    write_audio_folder(tmp_path / "clips" / "train")
    write_audio_folder(tmp_path / "clips" / "test")
    files = {"train": str(tmp_path / "clips" / "train" / "**" / "*.wav"),
             "test": str(tmp_path / "clips" / "test" / "**" / "*.wav")}
    dm = AudioDataModule(dataset="tones", data_files=files, builder="audiofolder",
                         model_dir=_wav2vec2(tmp_path), split=SplitSettings(val_size=0.25))
    dm.setup()
    assert dm.spec.class_names == ["high", "low"]
    test = dm._split("test")
    assert len(test) == 12 and all("clips/test" in str(p) for p in test.paths)
    assert {len(dm._split("train")), len(dm._split("val"))} == {9, 3}
    wave = read_audio(test.paths[0], 16000)
    # our soundfile + torchaudio path (batched resampling: equal to float rounding), not datasets'
    np.testing.assert_allclose(test.waveform(0), wave, atol=1e-6)


def test_saved_audio_dataset_with_in_memory_clips(tmp_path):
    import io

    import numpy as np
    import soundfile

    from ripieno.datamodules.audio import AudioDataModule

    rng = np.random.default_rng(0)
    rows = {"audio": [], "label": []}
    for i in range(24):
        buffer = io.BytesIO()
        soundfile.write(buffer, (0.1 * rng.standard_normal(1600 + 80 * i)).astype(np.float32), 16000,
                        format="WAV")
        rows["audio"].append({"bytes": buffer.getvalue(), "path": None})
        rows["label"].append(i % 2)
    # Saved the way users' datasets are (an Audio column that decodes), built without torchcodec.
    features = datasets.Features({"audio": datasets.Audio(), "label": datasets.ClassLabel(names=["a", "b"])})
    datasets.Dataset.from_dict(rows).cast(features).save_to_disk(tmp_path / "saved")
    dm = AudioDataModule(dataset=str(tmp_path / "saved"), model_dir=_wav2vec2(tmp_path),
                         split=SplitSettings(val_size=0.25, test_size=0.25))
    dm.setup()
    assert dm.spec.class_names == ["a", "b"] and sum(dm.split_sizes().values()) == 24
    assert len(dm._split("train").waveform(0)) >= 1600
    assert dm.input_fingerprint("train") != dm.input_fingerprint("test")


# -------------------------------------------------------------------------------- tabular
def _table(n, seed):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "colour": rng.choice(["red", "blue"], n),
                         "y": (x[:, 0] + x[:, 1] > 0).astype(int)})


def test_tabular_saved_dataset_keeps_official_test_with_class_names(tmp_path):
    from ripieno.datamodules import TabularDataModule

    parts = {}
    for name, n, seed in (("train", 120, 0), ("test", 40, 1)):
        frame = _table(n, seed)
        features = datasets.Features({"a": datasets.Value("float64"), "b": datasets.Value("float64"),
                                      "c": datasets.Value("float64"), "colour": datasets.Value("string"),
                                      "y": datasets.ClassLabel(names=["no", "yes"])})
        parts[name] = datasets.Dataset.from_pandas(frame, features=features, preserve_index=False)
    datasets.DatasetDict(parts).save_to_disk(tmp_path / "saved")
    dm = TabularDataModule(dataset=None, path=str(tmp_path / "saved"), target="y", categorical=["colour"],
                           n_bins=4, split=SplitSettings(val_size=0.25))
    dm.setup()
    assert dm.spec.class_names == ["no", "yes"] and dm.split_sizes() == {"train": 90, "val": 30, "test": 40}
    expected = torch.as_tensor(parts["test"]["y"])
    assert torch.equal(dm._split("test").y, expected)


def test_tabular_parquet_files_with_official_validation(tmp_path):
    from ripieno.datamodules import TabularDataModule

    files = {}
    for name, n, seed in (("train", 100, 0), ("validation", 30, 1), ("test", 30, 2)):
        _table(n, seed).to_parquet(tmp_path / f"{name}.parquet")
        files[name] = str(tmp_path / f"{name}.parquet")
    dm = TabularDataModule(dataset=None, data_files=files, builder="parquet", target="y",
                           categorical=["colour"], n_bins=4)
    dm.setup()
    assert dm.split_sizes() == {"train": 100, "val": 30, "test": 30}
    resplit = TabularDataModule(dataset=None, data_files=files, builder="parquet", target="y",
                                categorical=["colour"], n_bins=4, split=SplitSettings(policy="resplit",
                                val_size=0.2, test_size=0.2))
    resplit.setup()
    assert resplit.split_sizes() == {"train": 96, "val": 32, "test": 32}


# --------------------------------------------------------------------------------- images
def test_imagefolder_files_and_saved_images_keep_official_splits(tmp_path):
    from helpers.media import write_image_folder

    from ripieno.datamodules.vision_backbone import BackboneImageDataModule, ImagePreprocessor
    from ripieno.framework.backbones.small_models import build_small_dinov2

    model_dir = str(build_small_dinov2(tmp_path / "dino", image_size=28, num_layers=1, hidden_size=16,
                                       num_heads=2))
    write_image_folder(tmp_path / "imgs" / "train")
    write_image_folder(tmp_path / "imgs" / "test", per_class=3)
    files = {"train": str(tmp_path / "imgs" / "train" / "**" / "*.*g"),
             "test": str(tmp_path / "imgs" / "test" / "**" / "*.*g")}
    dm = BackboneImageDataModule(dataset="pets", data_files=files, builder="imagefolder", model_dir=model_dir,
                                 split=SplitSettings(val_size=0.25), loader=LoaderSettings(batch_size=4))
    dm.setup()
    assert dm.spec.class_names == ["cat", "dog", "eel"] and dm.split_sizes()["test"] == 9
    batch = dm._split("test").__getitems__([0, 1])
    expected = ImagePreprocessor(model_dir)([dm._split("test").image(0), dm._split("test").image(1)])
    assert torch.equal(batch["pixel_values"], expected)
    assert dm.input_fingerprint("test") != dm.input_fingerprint("train")

    train = datasets.load_dataset("imagefolder", data_files={"train": files["train"]})["train"]
    parts = {"train": train.select(range(6, 24)), "validation": train.select(range(6))}
    datasets.DatasetDict(parts).save_to_disk(tmp_path / "saved")
    saved = BackboneImageDataModule(dataset=str(tmp_path / "saved"), model_dir=model_dir,
                                    split=SplitSettings(test_size=0.25))
    saved.setup()
    assert saved.split_sizes() == {"train": 14, "val": 6, "test": 4}  # stratified per class


def test_uq_image_module_reads_an_imagefolder_with_official_test(tmp_path):
    import numpy as np
    from PIL import Image

    from ripieno.datamodules import ImageDataModule
    from ripieno.datamodules.images import ImageDataError

    rng = np.random.default_rng(0)
    for split, n in (("train", 10), ("test", 4)):
        for name in ("cat", "dog"):
            (tmp_path / "px" / split / name).mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 256, (12, 10), dtype=np.uint8)).save(
                    tmp_path / "px" / split / name / f"{i}.png")
    files = {s: str(tmp_path / "px" / s / "**" / "*.png") for s in ("train", "test")}
    dm = ImageDataModule(dataset="pixels", data_files=files, builder="imagefolder",
                         split=SplitSettings(val_size=0.25))
    dm.setup()
    assert dm.spec.image_shape == (1, 12, 10) and dm.spec.class_names == ["cat", "dog"]
    assert dm.split_sizes() == {"train": 15, "val": 5, "test": 8}
    first = sorted((tmp_path / "px" / "test" / "cat").glob("*.png"))[0]
    raw = np.asarray(Image.open(first), dtype=np.float32) / 255
    test = dm._split("test")
    assert any(torch.allclose(test.__getitems__([i])["x"][0, 0] * dm.spec.std[0] + dm.spec.mean[0],
                              torch.from_numpy(raw), atol=1e-6) for i in range(len(test)))
    Image.fromarray(np.zeros((5, 5), dtype=np.uint8)).save(tmp_path / "px" / "train" / "cat" / "odd.png")
    with pytest.raises(ImageDataError, match="does not resize"):
        ImageDataModule(dataset="pixels", data_files=files, builder="imagefolder").setup()
