"""Backbone datamodules: model-input batches, the model's own preprocessing (oracle), splits, errors.

Tiny random DINOv2 / timm ViT / Wav2Vec2 folders are built into temporary directories with
``ripieno.framework.backbones.small_models``, through the same ``save_pretrained`` path real weights take.
"""

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
import torchaudio.functional as AF
from helpers.media import sine, write_audio_folder, write_image_folder
from PIL import Image

from ripieno.datamodules import LoaderSettings, SplitSettings
from ripieno.datamodules.audio import (
    AudioDataError,
    AudioDataModule,
    MissingAudioDataError,
    asterisk_digit_clips,
    read_audio,
    resample_clips,
    synthesize_words,
)
from ripieno.datamodules.vision_backbone import (
    BackboneDataSpec,
    BackboneImageDataModule,
    ImageDataError,
    MissingImageDataError,
)
from ripieno.framework.backbones.small_models import (
    build_small_dinov2,
    build_small_timm_dinov2,
    build_small_wav2vec2,
)

HAS_ESPEAK = shutil.which("espeak-ng") is not None
HAS_ASTERISK = Path("/usr/share/asterisk/sounds/en/digits/0.wav").is_file()
NEEDS_ESPEAK = pytest.mark.skipif(not HAS_ESPEAK,
                                  reason="espeak-ng is not installed (apt-get install espeak-ng)")


# ----------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def dinov2_dir(tmp_path_factory):
    return build_small_dinov2(tmp_path_factory.mktemp("dinov2"), image_size=28, num_layers=2, hidden_size=32,
                              num_heads=2)


@pytest.fixture(scope="module")
def timm_dir(tmp_path_factory):
    return build_small_timm_dinov2(tmp_path_factory.mktemp("timm"), image_size=28, depth=2, embed_dim=32)


@pytest.fixture(scope="module")
def wav2vec2_dir(tmp_path_factory):
    return build_small_wav2vec2(tmp_path_factory.mktemp("wav2vec2"))


# ------------------------------------------------------------------------------- vision
def test_shipped_digits_batches_run_dinov2(dinov2_dir):
    from transformers import AutoImageProcessor, AutoModel

    dm = BackboneImageDataModule(dataset="digits", model_dir=str(dinov2_dir), max_train_rows=100,
                                 loader=LoaderSettings(batch_size=8))
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"pixel_values", "y"} and dm.input_keys == ("pixel_values",)
    assert batch["pixel_values"].shape == (8, 3, 28, 28) and batch["pixel_values"].dtype == torch.float32
    assert batch["y"].shape == (8,) and batch["y"].dtype == torch.long

    spec = dm.spec
    assert (spec.n_classes, spec.modality, spec.input_keys) == (10, "image", ["pixel_values"])
    assert (spec.n_train, spec.n_val) == (90, 10) and spec.n_test == round(1797 * 0.2)
    assert BackboneDataSpec.coerce(spec.to_dict()) == spec

    model = AutoModel.from_pretrained(str(dinov2_dir)).eval()
    with torch.no_grad():
        out = model(**{k: batch[k] for k in dm.input_keys}, output_hidden_states=True)
    assert len(out.hidden_states) == 3 and out.hidden_states[-1].shape == (8, 1 + 4, 32)

    # Oracle: the 8x8 digit scaled to 0..255, grey repeated to RGB, through the processor itself.
    from sklearn.datasets import load_digits

    test = dm._split("test")
    rows = test.images.rows[:3]
    processor = AutoImageProcessor.from_pretrained(str(dinov2_dir))
    grey = np.round(load_digits().images[rows] * 255 / 16).astype(np.uint8)
    images = [Image.fromarray(np.repeat(g[..., None], 3, axis=2)) for g in grey]
    expected = processor(images=images, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(test.__getitems__([0, 1, 2])["pixel_values"], expected)
    assert torch.equal(test[1]["y"], torch.as_tensor(load_digits().target[rows[1]]))


def test_folder_with_timm_processor_matches_timm_transform(tmp_path, timm_dir):
    import timm
    from timm.data import create_transform, resolve_model_data_config

    root = write_image_folder(tmp_path / "images")
    dm = BackboneImageDataModule(root=str(root), model_dir=str(timm_dir), split=SplitSettings(val_size=0.25,
                                 test_size=0.25), loader=LoaderSettings(batch_size=4))
    assert dm.preprocessor.kind == "timm" and dm.spec.class_names == ["cat", "dog", "eel"]
    val = dm._split("val")
    batch = next(iter(dm.val_dataloader()))
    model = timm.create_model(f"local-dir:{timm_dir}", pretrained=True).eval()
    transform = create_transform(**resolve_model_data_config(model), is_training=False)
    paths = val.images.paths[: len(batch["y"])]
    expected = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths])
    torch.testing.assert_close(batch["pixel_values"], expected)
    with torch.no_grad():
        assert model.forward_features(batch["pixel_values"]).shape == (len(batch["y"]), 1 + 4, 32)


def test_folder_splits_are_seeded_stratified_and_disjoint(tmp_path, dinov2_dir):
    root = write_image_folder(tmp_path / "images", per_class=10)

    def splits(seed):
        dm = BackboneImageDataModule(root=str(root), model_dir=str(dinov2_dir),
                                     split=SplitSettings(val_size=0.2, test_size=0.3, seed=seed))
        dm.setup()
        return {name: [str(p) for p in dm._split(name).images.paths] for name in ("train", "val", "test")}

    first, again, other = splits(0), splits(0), splits(1)
    assert first == again and first != other
    sets = [set(v) for v in first.values()]
    assert sum(map(len, sets)) == 30 == len(set().union(*sets))
    assert [len(first[k]) for k in ("train", "val", "test")] == [17, 4, 9]
    assert {Path(p).parent.name for p in first["test"]} == {"cat", "dog", "eel"}


def test_image_errors_are_clear(tmp_path, dinov2_dir, wav2vec2_dir):
    root = write_image_folder(tmp_path / "images")
    with pytest.raises(MissingImageDataError, match="small_models dinov2"):
        BackboneImageDataModule(dataset="digits").setup()
    with pytest.raises(MissingImageDataError, match="does not exist"):
        BackboneImageDataModule(dataset="digits", model_dir=str(tmp_path / "nope")).setup()
    with pytest.raises(ImageDataError, match="not an image processor"):
        BackboneImageDataModule(dataset="digits", model_dir=str(wav2vec2_dir)).setup()
    with pytest.raises(ImageDataError, match="Unknown image data set 'cifar11'"):
        BackboneImageDataModule(dataset="cifar11", model_dir=str(dinov2_dir)).setup()
    with pytest.raises(ImageDataError, match="Set data.dataset"):
        BackboneImageDataModule(model_dir=str(dinov2_dir)).setup()

    (root / "fox").mkdir()
    (root / "fox" / "readme.md").write_text("no images")
    with pytest.raises(ImageDataError, match=r"\['fox'\] .* hold no images"):
        BackboneImageDataModule(root=str(root), model_dir=str(dinov2_dir)).setup()
    (root / "fox" / "broken.png").write_bytes(b"\x89PNG not really")
    with pytest.raises(ImageDataError, match="1 unreadable image.*broken.png"):
        BackboneImageDataModule(root=str(root), model_dir=str(dinov2_dir)).setup()


# -------------------------------------------------------------------------------- audio
def test_resampling_uses_torchaudio_and_keeps_the_frequency(tmp_path):
    path = tmp_path / "tone.wav"
    tone = sine(440.0, 22050, 1.0)
    soundfile.write(path, np.stack([tone, tone], axis=1), 22050)  # stereo -> mono mean
    wave = read_audio(path, 16000)
    assert wave.dtype == np.float32 and len(wave) == 16000
    spectrum = np.abs(np.fft.rfft(wave))
    assert np.argmax(spectrum) * 16000 / len(wave) == pytest.approx(440.0, abs=1.0)
    decoded = torch.from_numpy(soundfile.read(path, dtype="float32")[0].mean(axis=1))
    torch.testing.assert_close(torch.from_numpy(wave), AF.resample(decoded, 22050, 16000))

    rng = np.random.default_rng(0)
    clips = [rng.standard_normal(n).astype(np.float32) for n in (800, 1733, 5000, 999)]
    for got, clip in zip(resample_clips(clips, 8000, 16000, max_batch_samples=4000), clips, strict=True):
        torch.testing.assert_close(torch.from_numpy(got), AF.resample(torch.from_numpy(clip), 8000, 16000),
                                   atol=1e-6, rtol=1e-5)
    assert len(read_audio(path, 16000, max_seconds=0.25)) == 4000


def test_audio_folder_batches_match_feature_extractor_and_run_wav2vec2(tmp_path, wav2vec2_dir):
    from transformers import AutoModel, Wav2Vec2FeatureExtractor

    root = write_audio_folder(tmp_path / "audio")
    dm = AudioDataModule(dataset="folder", root=str(root), model_dir=str(wav2vec2_dir),
                         split=SplitSettings(val_size=0.25, test_size=0.34),
                         loader=LoaderSettings(batch_size=4))
    spec = dm.spec
    assert (spec.class_names, spec.sampling_rate, spec.modality) == (["high", "low"], 16000, "audio")
    assert (spec.n_train, spec.n_val, spec.n_test) == (6, 2, 4)
    assert dm.input_keys == ("input_values", "attention_mask") and spec.input_keys == list(dm.input_keys)

    train = dm._split("train")
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_values", "attention_mask", "y"}
    assert batch["input_values"].dtype == torch.float32 and batch["attention_mask"].dtype == torch.long
    assert batch["y"].dtype == torch.long and batch["input_values"].shape == batch["attention_mask"].shape

    # Oracle: each clip decoded and resampled independently, then the feature extractor itself.
    extractor = Wav2Vec2FeatureExtractor.from_pretrained(str(wav2vec2_dir))
    rows = [0, 3, 5]
    waves = []
    for i in rows:
        data, rate = soundfile.read(train.paths[i], dtype="float32", always_2d=True)
        waves.append(AF.resample(torch.from_numpy(data.mean(axis=1)), rate, 16000).numpy())
    expected = extractor(waves, sampling_rate=16000, padding=True, return_attention_mask=True,
                         return_tensors="pt")
    got = train.__getitems__(rows)
    torch.testing.assert_close(got["input_values"], expected["input_values"], atol=1e-5, rtol=1e-4)
    assert torch.equal(got["attention_mask"], expected["attention_mask"].long())
    assert got["attention_mask"].sum(1).tolist() == [len(w) for w in waves]

    model = AutoModel.from_pretrained(str(wav2vec2_dir)).eval()
    with torch.no_grad():
        out = model(**{k: batch[k] for k in dm.input_keys}, output_hidden_states=True)
    frames = int(model._get_feat_extract_output_lengths(batch["input_values"].shape[1]))
    assert len(out.hidden_states) == 3 and out.hidden_states[0].shape == (len(batch["y"]), frames, 32)

    paths = {name: {str(p) for p in dm._split(name).paths} for name in ("train", "val", "test")}
    assert sum(map(len, paths.values())) == 12 == len(set().union(*paths.values()))
    again = AudioDataModule(root=str(root), model_dir=str(wav2vec2_dir), dataset=None,
                            split=SplitSettings(val_size=0.25, test_size=0.34))
    assert {name: {str(p) for p in again._split(name).paths} for name in paths} == paths


def test_audio_errors_are_clear(tmp_path, wav2vec2_dir, dinov2_dir, monkeypatch):
    root = write_audio_folder(tmp_path / "audio")
    with pytest.raises(MissingAudioDataError, match="small_models wav2vec2"):
        AudioDataModule(dataset="folder", root=str(root)).setup()
    with pytest.raises(AudioDataError, match="not an audio feature extractor"):
        AudioDataModule(dataset="folder", root=str(root), model_dir=str(dinov2_dir)).setup()
    with pytest.raises(AudioDataError, match="Unknown audio data set 'librispeech'"):
        AudioDataModule(dataset="librispeech", model_dir=str(wav2vec2_dir)).setup()
    with pytest.raises(AudioDataError, match="neither one of"):
        AudioDataModule(test_dataset="asterisk", model_dir=str(wav2vec2_dir)).setup()

    (root / "mid").mkdir()
    with pytest.raises(AudioDataError, match=r"\['mid'\] .* hold no audio"):
        AudioDataModule(dataset="folder", root=str(root), model_dir=str(wav2vec2_dir)).setup()
    (root / "mid" / "bad.wav").write_bytes(b"RIFF nonsense")
    with pytest.raises(AudioDataError, match="1 unreadable audio file.*bad.wav"):
        AudioDataModule(dataset="folder", root=str(root), model_dir=str(wav2vec2_dir)).setup()

    with pytest.raises(MissingAudioDataError, match="apt-get install asterisk-core-sounds-en-wav"):
        asterisk_digit_clips(root=tmp_path)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(MissingAudioDataError, match="apt-get install espeak-ng"):
        AudioDataModule(model_dir=str(wav2vec2_dir), cache_dir=str(tmp_path / "cache")).setup()


@NEEDS_ESPEAK
def test_spoken_digits_synthesised_and_cached(tmp_path, wav2vec2_dir):
    cache = tmp_path / "cache"
    kwargs = dict(model_dir=str(wav2vec2_dir), cache_dir=str(cache), words=["one", "two"],
                  voices=["en-us+m1", "en-us+f2"], speeds=[120, 180], pitches=[50], test_size=0.25,
                  val_size=0.34, batch_size=4)
    dm = AudioDataModule(dataset="spoken_digits", **kwargs)
    spec = dm.spec
    assert spec.class_names == ["one", "two"] and (spec.n_train, spec.n_val, spec.n_test) == (4, 2, 2)
    files = sorted(cache.rglob("*.wav"))
    assert len(files) == 8 and all(soundfile.info(f).samplerate == 22050 for f in files)
    durations = [len(w) / 16000 for w in dm._split("train").waveforms]
    assert all(0.2 < d < 2.0 for d in durations)
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_values"].shape[0] == 4 and batch["attention_mask"].sum() > 0

    stamps = [f.stat().st_mtime_ns for f in files]
    AudioDataModule(dataset="spoken_digits", **kwargs).setup()  # reuses the cache
    assert [f.stat().st_mtime_ns for f in sorted(cache.rglob("*.wav"))] == stamps
    with pytest.raises(AudioDataError, match="Unknown espeak-ng voice variant"):
        synthesize_words(cache, words=["one"], voices=["en-us+nobody"], speeds=[150], pitches=[50])


@NEEDS_ESPEAK
@pytest.mark.skipif(not HAS_ASTERISK, reason="apt-get install asterisk-core-sounds-en-wav")
def test_asterisk_digits_as_real_test_set(tmp_path, wav2vec2_dir):
    clips = asterisk_digit_clips()
    assert len(clips) == 12 and {word for _, word in clips} == {"zero", "one", "two", "three", "four", "five",
                                                                "six", "seven", "eight", "nine"}
    dm = AudioDataModule(dataset="spoken_digits", test_dataset="asterisk_digits", model_dir=str(wav2vec2_dir),
                         cache_dir=str(tmp_path), words=["one", "two"], voices=["en-us+m3"],
                         speeds=[120, 150, 180], pitches=[40, 60], split=SplitSettings(val_size=0.34))
    with pytest.warns(UserWarning, match="dropped 10 clip"):
        spec = dm.spec
    assert (spec.n_train + spec.n_val, spec.n_test) == (12, 2)
    test = dm._split("test")
    assert test.labels.tolist() == [0, 1] and [p.name for p in test.paths] == ["1.wav", "2.wav"]
    assert len(test.waveform(0)) == math.ceil(soundfile.info(test.paths[0]).frames * 16000 / 8000)
    with pytest.raises(AudioDataError, match="test_dataset: asterisk_digits"):
        AudioDataModule(dataset="asterisk_digits", model_dir=str(wav2vec2_dir)).setup()
