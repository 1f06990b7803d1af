"""AudioDataModule: spoken-word clips preprocessed by the backbone's own feature extractor.

Feeds per-layer feature extraction (LOES, GeoReg) and fine-tuning of an audio backbone
(wav2vec2, HuBERT, WavLM, Whisper's encoder, ...): batches are dicts holding the model's
inputs as its ``AutoFeatureExtractor`` names them (``input_values: float (B, T)`` with
``T`` the longest clip of the batch for wav2vec2-style models, ``input_features`` for
Whisper), ``attention_mask`` and ``y``, so a Hugging Face model runs as
``model(**{k: batch[k] for k in dm.input_keys}, output_hidden_states=True)`` and pooling
can respect the mask (which is in the batch even when the model is not given it).

Sources, all offline:

* ``spoken_digits``: the words zero .. nine synthesised with ``espeak-ng`` (Debian
  package) in several voices, speeds and pitches at setup, cached as wav files under
  ``cache_dir`` (default ``spoken_digits`` in ripieno's cache, ``RIPIENO_CACHE``), one folder per espeak-ng
  version; the ``words``, ``voices``, ``speeds`` and ``pitches`` arguments choose them.
* ``asterisk_digits``: the real recordings of one speaker (8 kHz) in the Debian package
  ``asterisk-core-sounds-en-wav`` under ``/usr/share/asterisk/sounds/en``: ``digits/0`` ..
  ``digits/9`` plus ``digits/oh`` (zero) and ``phonetic/9_p`` ("niner"), 12 clips. Too few
  to split, so they serve as ``test_dataset`` of a model trained on ``spoken_digits``
  (synthetic voices in training, a real voice in testing).
* ``folder`` (or ``dataset: null`` with ``root``): ``root/<class>/**/*.wav|flac|ogg``.

Each clip is decoded with ``soundfile``, averaged to mono, resampled with
``torchaudio.functional.resample`` to the feature extractor's rate (16 kHz for
wav2vec2) and kept in memory; ``AutoFeatureExtractor.from_pretrained(model_dir)`` (the
class the folder names) pads, masks and normalises a batch at a time. Everything that can be wrong (missing
program or package, unknown name or voice, unreadable or empty files, too few clips) is
checked when the data is prepared.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from ripieno.datamodules.base import BatchDataset, DataModuleError, SplitDataModule
from ripieno.datamodules.data_settings import MOVED_ARGUMENTS, LoaderSettings, SplitSettings
from ripieno.datamodules.hf_datasets import is_saved_dataset, load_hf_splits, resolve_splits
from ripieno.datamodules.splits import check_split_args, official_split_rows, seeded_splits
from ripieno.datamodules.vision_backbone import (
    BUILD_HINT,
    FOLDER,
    BackboneDataSpec,
    check_source_choice,
    resolve_model_dir,
)
from ripieno.framework.backbones.model_folder import json_object
from ripieno.framework.extras import require
from ripieno.framework.outputs.output_files import cache_dir as ripieno_cache_dir

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DEFAULT_VOICES = ("en-us+m1", "en-us+m3", "en-us+m5", "en-us+m7", "en-us+f1", "en-us+f2", "en-us+f3",
                  "en-us+f4")
DEFAULT_SPEEDS = (120, 150, 180)
DEFAULT_PITCHES = (35, 50, 65)
ESPEAK_INSTALL = "apt-get install espeak-ng"
ASTERISK_INSTALL = "apt-get install asterisk-core-sounds-en-wav"
ASTERISK_ROOTS = ("/usr/share/asterisk/sounds/en", "/usr/share/asterisk/sounds/en_US_f_Allison")
ASTERISK_DIGIT_CLIPS = {**{f"digits/{d}.wav": word for d, word in enumerate(DIGIT_WORDS)},
                        "digits/oh.wav": "zero", "phonetic/9_p.wav": "nine"}
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg")
SHIPPED = ("spoken_digits", "asterisk_digits")


class AudioDataError(DataModuleError):
    """Raised for audio data that a model cannot train or be evaluated on."""


class MissingAudioDataError(AudioDataError, FileNotFoundError):
    """Raised when a program, package, folder or model directory is missing (downloads are disabled)."""


# ------------------------------------------------------------------------- decoding
@dataclass(frozen=True)
class InMemoryClip:
    """An encoded audio file held in memory (a ``datasets`` ``Audio`` value without a path)."""

    name: str
    data: bytes

    def __str__(self) -> str:
        return self.name


def read_mono(path: str | Path | InMemoryClip) -> tuple[np.ndarray, int]:
    """Decode a file (or an in-memory clip) with ``soundfile`` to mono ``float32`` and its rate.

    Channels are averaged.

    Raises:
        AudioDataError: the file cannot be decoded or holds no samples.
    """
    import io

    require("audio", "soundfile", "Reading audio files")
    import soundfile

    source: Any = io.BytesIO(path.data) if isinstance(path, InMemoryClip) else str(path)
    try:
        data, rate = soundfile.read(source, dtype="float32", always_2d=True)
    except (OSError, RuntimeError, ValueError) as err:  # soundfile.LibsndfileError is a RuntimeError
        raise AudioDataError(f"Cannot decode audio {str(path)!r} ({err}); replace or remove it.") from err
    if data.shape[0] == 0:
        raise AudioDataError(f"Audio file {str(path)!r} holds no samples; replace or remove it.")
    return np.ascontiguousarray(data.mean(axis=1), dtype=np.float32), int(rate)


def resample_clips(waves: Sequence[np.ndarray], orig_freq: int, new_freq: int,
                   max_batch_samples: int = 1 << 22) -> list[np.ndarray]:
    """Resample 1-D clips with ``torchaudio.functional.resample``, several at a time.

    Clips of similar length are zero-padded into one batch and each output is cut to
    ``ceil(len * new_freq / orig_freq)`` samples: the same values as resampling each clip
    alone (torchaudio pads with zeros too), without recomputing the sinc kernel per clip.
    """
    require("audio", "torchaudio", "Resampling audio")
    import torchaudio.functional as AF

    if orig_freq == new_freq:
        return [np.asarray(w, dtype=np.float32) for w in waves]
    out: list[np.ndarray | None] = [None] * len(waves)
    order = sorted(range(len(waves)), key=lambda i: len(waves[i]))
    start = 0
    while start < len(order):
        stop = start + 1
        while stop < len(order) and (stop - start + 1) * len(waves[order[stop]]) <= max_batch_samples:
            stop += 1
        chunk = order[start:stop]
        batch = torch.zeros(len(chunk), len(waves[chunk[-1]]))
        for row, i in enumerate(chunk):
            batch[row, : len(waves[i])] = torch.from_numpy(np.asarray(waves[i], dtype=np.float32))
        resampled = AF.resample(batch, orig_freq=orig_freq, new_freq=new_freq)
        for row, i in enumerate(chunk):
            out[i] = resampled[row, : math.ceil(len(waves[i]) * new_freq / orig_freq)].numpy().copy()
        start = stop
    return out  # type: ignore[return-value]


def read_audio_files(paths: Sequence[str | Path | InMemoryClip], sampling_rate: int,
                     max_seconds: float | None = None) -> list[np.ndarray]:
    """Decode files to mono ``float32`` clips at ``sampling_rate`` (``soundfile`` + torchaudio).

    ``max_seconds`` keeps only the start of long clips (cut after resampling).

    Raises:
        AudioDataError: some files cannot be decoded or are empty (all listed in one message).
    """
    decoded: list[tuple[np.ndarray, int]] = []
    bad = []
    for path in paths:
        try:
            decoded.append(read_mono(path))
        except AudioDataError as err:
            bad.append(str(err))
    if bad:
        shown = " ".join(bad[:5]) + (f" And {len(bad) - 5} more." if len(bad) > 5 else "")
        raise AudioDataError(f"{len(bad)} unreadable audio file(s): {shown}")
    clips: list[np.ndarray] = [np.empty(0, dtype=np.float32)] * len(decoded)
    for rate in sorted({r for _, r in decoded}):
        rows = [i for i, (_, r) in enumerate(decoded) if r == rate]
        resampled = resample_clips([decoded[i][0] for i in rows], rate, sampling_rate)
        for i, wave in zip(rows, resampled, strict=True):
            clips[i] = wave
    if max_seconds is not None:
        keep = max(1, round(max_seconds * sampling_rate))
        clips = [c[:keep] for c in clips]
    return clips


def read_audio(path: str | Path, sampling_rate: int, max_seconds: float | None = None) -> np.ndarray:
    """Decode one file to a mono ``float32`` clip at ``sampling_rate`` (see ``read_audio_files``)."""
    return read_audio_files([path], sampling_rate, max_seconds)[0]


# -------------------------------------------------------------------------- sources
def _espeak() -> str:
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise MissingAudioDataError(
            "spoken_digits is synthesised with espeak-ng, which is not installed; install it with"
            f" `{ESPEAK_INSTALL}` (as root; `make` does it when run as root).")
    return exe


@lru_cache(maxsize=4)
def _espeak_version(exe: str) -> str:
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"(\d+(?:\.\d+)+)", out)
    return match.group(1) if match else "unknown"


@lru_cache(maxsize=4)
def _espeak_variants(exe: str) -> frozenset[str]:
    out = subprocess.run([exe, "--voices=variant"], capture_output=True, text=True, check=False).stdout
    return frozenset(re.findall(r"!v/(\S+)", out))


def _slug(text: str) -> str:
    return re.sub(r"[^\w-]+", "_", text).strip("_") or "_"


def synthesize_words(
    cache_dir: str | Path,
    words: Sequence[str] = DIGIT_WORDS,
    voices: Sequence[str] = DEFAULT_VOICES,
    speeds: Sequence[int] = DEFAULT_SPEEDS,
    pitches: Sequence[int] = DEFAULT_PITCHES,
) -> list[tuple[Path, str]]:
    """Speak every word in every voice, speed and pitch with espeak-ng; cache the wav files.

    Files already in the cache are reused; new ones are written atomically, so parallel
    processes (DDP ranks) can share a cache.

    Args:
        cache_dir: cache root; files go to ``<cache_dir>/espeak-ng-<version>/<word>/``.
        words: the words (class names) to speak.
        voices: espeak-ng voices ``language[+variant]``, e.g. ``en-us+f2``.
        speeds: words per minute (80 .. 450).
        pitches: pitch adjustments (0 .. 99).

    Returns:
        ``(path, word)`` for every clip, in the order words x voices x speeds x pitches.
    """
    exe = _espeak()
    if not (words and voices and speeds and pitches):
        raise AudioDataError("words, voices, speeds and pitches must each hold at least one value.")
    if any(not isinstance(w, str) or not w.strip() for w in words):
        raise AudioDataError(f"words must be non-empty strings, got {list(words)}.")
    variants = _espeak_variants(exe)
    unknown = [v for v in voices if "+" in v and v.split("+", 1)[1] not in variants]
    if unknown:
        raise AudioDataError(f"Unknown espeak-ng voice variant(s) in {unknown}; list them with"
                             " `espeak-ng --voices=variant` (e.g. m1..m7, f1..f4).")
    bad = [s for s in speeds if not 80 <= int(s) <= 450] + [p for p in pitches if not 0 <= int(p) <= 99]
    if bad:
        raise AudioDataError(f"espeak-ng speeds must be in 80..450 words/minute and pitches in 0..99;"
                             f" got {bad}.")
    folder = Path(cache_dir).expanduser() / f"espeak-ng-{_espeak_version(exe)}"
    jobs = [(folder / _slug(w) / f"{_slug(v)}_s{int(s)}_p{int(p)}.wav", w, v, int(s), int(p))
            for w in words for v in voices for s in speeds for p in pitches]
    todo = [job for job in jobs if not job[0].is_file()]

    def speak(job: tuple[Path, str, str, int, int]) -> None:
        path, word, voice, speed, pitch = job
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp.wav")
        run = subprocess.run([exe, "-v", voice, "-s", str(speed), "-p", str(pitch), "-w", str(tmp), word],
                             capture_output=True, text=True, check=False)
        if run.returncode != 0 or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            raise AudioDataError(f"espeak-ng failed to speak {word!r} with voice {voice!r}"
                                 f" ({run.stderr.strip() or f'exit code {run.returncode}'}); list voices"
                                 " with `espeak-ng --voices`.")
        os.replace(tmp, path)

    if todo:
        with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
            list(pool.map(speak, todo))
    return [(job[0], job[1]) for job in jobs]


def asterisk_digit_clips(root: str | Path | None = None) -> list[tuple[Path, str]]:
    """The spoken digits of the Asterisk English prompts: ``(path, word)``, 12 clips.

    Args:
        root: the prompts folder (with ``digits/`` and ``phonetic/``); by default the
            Debian package's ``/usr/share/asterisk/sounds/en``.
    """
    roots = [Path(root).expanduser()] if root is not None else [Path(r) for r in ASTERISK_ROOTS]
    folder = next((r for r in roots if (r / "digits" / "0.wav").is_file()), None)
    if folder is None:
        where = " or ".join(repr(str(r)) for r in roots)
        raise MissingAudioDataError(
            f"The asterisk digit clips (digits/0.wav .. digits/9.wav) are not under {where}; install them"
            f" with `{ASTERISK_INSTALL}` (as root; `make` does it when run as root) or set data.root to a"
            " copy of /usr/share/asterisk/sounds/en.")
    clips = [(folder / rel, word) for rel, word in ASTERISK_DIGIT_CLIPS.items() if (folder / rel).is_file()]
    missing = sorted(set(DIGIT_WORDS) - {word for _, word in clips})
    if missing:
        raise MissingAudioDataError(f"Asterisk clips for {missing} are missing under {str(folder)!r};"
                                    f" reinstall with `{ASTERISK_INSTALL}`.")
    return clips


def scan_audio_folder(root: str | Path) -> tuple[list[tuple[Path, str]], list[str]]:
    """``(path, class)`` for every ``root/<class>/**/*.wav|flac|ogg`` and the sorted class names.

    Raises:
        MissingAudioDataError: ``root`` does not exist.
        AudioDataError: fewer than two class folders, or class folders without audio files.
    """
    root = Path(root).expanduser()
    layout = f"{str(root)}/<class>/*{'|'.join(AUDIO_SUFFIXES)}"
    if not root.is_dir():
        raise MissingAudioDataError(f"Audio folder {str(root)!r} does not exist; expected {layout}.")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise AudioDataError(f"Audio folder {str(root)!r} has {len(classes)} class folder(s) {classes}; a"
                             f" classifier needs at least two: {layout}.")
    clips, empty = [], []
    for name in classes:
        files = sorted(p for p in (root / name).rglob("*")
                       if p.is_file() and p.suffix.lower() in AUDIO_SUFFIXES and not p.name.startswith("."))
        empty += [] if files else [name]
        clips += [(path, name) for path in files]
    if empty:
        raise AudioDataError(f"Class folder(s) {empty} under {str(root)!r} hold no audio files"
                             f" ({', '.join(AUDIO_SUFFIXES)}); add clips or remove the folders.")
    return clips, classes


# --------------------------------------------------------------------------- dataset
class AudioClipDataset(BatchDataset):
    """Clips as dict batches: the feature extractor's model inputs, ``attention_mask`` and ``y``.

    The inputs are named by the extractor's ``model_input_names`` (``input_values`` ``float
    (B, T)`` for wav2vec2-style extractors, ``input_features`` for Whisper's log-mel
    spectrogram, ...), ``attention_mask`` is ``long`` over the same positions and ``y``
    ``long (B,)``. The mask is always in the batch (pooling needs it); whether the model
    receives it is ``model_input_keys``'s business. ``waveforms`` are mono ``float32``
    arrays at ``sampling_rate``; the extractor pads each batch to its longest clip (or to
    its own fixed length, e.g. Whisper's 30 s), masks the padding and normalises.
    """

    def __init__(self, waveforms: list[np.ndarray], labels: Tensor, extractor: Any,  # noqa: ANN401
                 sampling_rate: int, paths: list[Path]) -> None:
        if not len(waveforms) == len(labels) == len(paths):
            raise AudioDataError(f"{len(waveforms)} clips, {len(labels)} labels and {len(paths)} paths"
                                 " differ.")
        self.waveforms, self.labels, self.extractor = waveforms, labels, extractor
        self.sampling_rate, self.paths = sampling_rate, paths

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def lengths(self) -> Tensor:
        """Samples of each clip (what a batch pads to its longest of)."""
        return torch.as_tensor([len(w) for w in self.waveforms])

    def waveform(self, index: int) -> np.ndarray:
        """The clip at ``index`` (mono, at ``sampling_rate``), before feature extraction."""
        return self.waveforms[index]

    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        features = self.extractor([self.waveforms[i] for i in indices], sampling_rate=self.sampling_rate,
                                  padding=_extractor_padding(self.extractor), return_attention_mask=True,
                                  return_tensors="pt")
        batch = {name: features[name].float() for name in model_input_keys(self.extractor, mask=False)}
        batch["attention_mask"] = features["attention_mask"].long()
        batch["y"] = self.labels[torch.as_tensor(indices)]
        return batch


def _extractor_padding(extractor: Any) -> str:  # noqa: ANN401
    """``longest`` for extractors that take it; Whisper's pads every clip to its 30 s window."""
    return "max_length" if type(extractor).__name__ == "WhisperFeatureExtractor" else "longest"


def model_input_keys(extractor: Any, mask: bool = True) -> tuple[str, ...]:  # noqa: ANN401
    """The batch keys a model receives, as its feature extractor says (Hugging Face convention).

    ``model_input_names`` lists them; ``attention_mask`` is kept only when the extractor's
    ``return_attention_mask`` is true: wav2vec2-base and other ``feat_extract_norm="group"``
    models are run without a mask (their padding is zeros), the layer-norm variants with it.

    Args:
        extractor: a Hugging Face feature extractor.
        mask: include ``attention_mask`` when the extractor passes it to the model.

    Example:
        >>> from transformers import Wav2Vec2FeatureExtractor
        >>> model_input_keys(Wav2Vec2FeatureExtractor(return_attention_mask=False))
        ('input_values',)
        >>> model_input_keys(Wav2Vec2FeatureExtractor(return_attention_mask=True))
        ('input_values', 'attention_mask')
    """
    names = tuple(getattr(extractor, "model_input_names", None) or ("input_values",))
    wants_mask = mask and bool(getattr(extractor, "return_attention_mask", False))
    inputs = tuple(n for n in names if n != "attention_mask")
    return (*inputs, "attention_mask") if wants_mask else inputs


def load_feature_extractor(model_dir: str | Path | None) -> Any:  # noqa: ANN401
    """``AutoFeatureExtractor.from_pretrained(model_dir)``, offline, with clear errors.

    The folder's ``preprocessor_config.json`` names the class (``Wav2Vec2FeatureExtractor``,
    ``WhisperFeatureExtractor``, ``ASTFeatureExtractor``, ...), so a Whisper or AST folder
    gets its own extractor and its own input names.
    """
    path = resolve_model_dir(model_dir, "wav2vec2", "AutoFeatureExtractor", MissingAudioDataError)
    config = path / "preprocessor_config.json"
    hint = BUILD_HINT.format(kind="wav2vec2", processor="AutoFeatureExtractor")
    if not config.is_file():
        raise MissingAudioDataError(f"{str(path)!r} has no preprocessor_config.json (the model's feature"
                                    f" extractor); {hint}.")
    if "sampling_rate" not in json_object(config, hint, AudioDataError):
        raise AudioDataError(f"{str(config)!r} is not an audio feature extractor config (no sampling_rate);"
                             " is model_dir a vision or text model?")
    require("audio", "transformers", "AudioDataModule")
    from transformers import AutoFeatureExtractor

    return AutoFeatureExtractor.from_pretrained(str(path), local_files_only=True)


# ------------------------------------------------------------------------ datamodule
DEFAULT_SPLIT = SplitSettings(val_size=0.1, test_size=0.2)
DEFAULT_LOADER = LoaderSettings(batch_size=32, eval_batch_size=64)


class AudioDataModule(SplitDataModule):
    """Train/val/test spoken-word clips preprocessed by an audio backbone's feature extractor.

    Batches hold the feature extractor's inputs (``input_values: float (B, T)`` for
    wav2vec2-style models, ``input_features`` for Whisper), ``attention_mask: long`` and
    ``y: long (B,)``; ``input_keys`` are the keys the model receives
    (``model_input_keys``: no ``attention_mask`` for extractors that say
    ``return_attention_mask: false``, as wav2vec2-base's does). ``spec`` is a
    ``BackboneDataSpec`` (``modality="audio"``, ``sampling_rate`` set).

    Splits: ``split.test_size`` of the clips go to a stratified test split (unless
    ``test_dataset`` is set: then all its clips are the test split), ``max_train_rows``
    caps the rest and ``split.val_size`` of it is validation; all seeded by ``split.seed``.

    Args:
        dataset: ``spoken_digits``, ``asterisk_digits`` or ``folder`` (or ``None`` with ``root``).
        root: the audio folder ``root/<class>/*.wav`` for ``folder``; a copy of the asterisk
            prompts for ``asterisk_digits``; unused for ``spoken_digits``.
        model_dir: local folder of the backbone with its ``preprocessor_config.json``
            (``ripieno.framework.backbones.small_models.build_small_wav2vec2`` builds a random one).
        test_dataset: optional test source replacing the carved test split: a shipped
            name (e.g. ``asterisk_digits`` with ``dataset: spoken_digits``) or an audio
            folder path; its clips are labelled by class name, those of unknown classes
            dropped.
        cache_dir: where ``spoken_digits`` keeps its wav files (default
            ``spoken_digits`` in ripieno's cache folder, ``RIPIENO_CACHE``).
        words: words of ``spoken_digits`` (default zero .. nine); the class names.
        voices: espeak-ng voices of ``spoken_digits`` (default 8 en-us variants).
        speeds: espeak-ng speeds in words per minute (default 120, 150, 180).
        pitches: espeak-ng pitches (default 35, 50, 65).
        max_seconds: keep only the first ``max_seconds`` of each clip (``None``: all).
        data_files: local audio files for ``datasets.load_dataset("audiofolder", data_files=...)``
            (a path or glob, a list, or ``{split: paths}``; audiofolder labels clips by their
            parent folder). ``dataset`` may instead be a ``save_to_disk`` folder with an
            ``Audio`` column. Either way clips are decoded by ``read_audio_files``
            (soundfile), never by ``datasets`` (which needs torchcodec).
        builder: ``audiofolder`` (with ``data_files``).
        audio_column: the ``Audio`` column of a ``datasets`` source.
        label_column: the label column of a ``datasets`` source (``ClassLabel`` or strings).
        split: how the rows are split (``SplitSettings``: ``policy``, ``official`` or ``resplit``
            for a ``datasets`` source; ``val_size``; ``test_size``; ``seed``, which also seeds the
            training order); default ``SplitSettings(val_size=0.1, test_size=0.2)``.
        loader: how the splits are served (``LoaderSettings``: ``batch_size``, ``eval_batch_size``
            of validation, test and predict, ``num_workers``); default ``LoaderSettings(batch_size=32,
            eval_batch_size=64)``.
        max_train_rows: optional cap on the training pool (train + validation).
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
        dataset: str | None = "spoken_digits",
        root: str | None = None,
        model_dir: str | None = None,
        test_dataset: str | None = None,
        cache_dir: str | None = None,
        words: list[str] | None = None,
        voices: list[str] | None = None,
        speeds: list[int] | None = None,
        pitches: list[int] | None = None,
        max_seconds: float | None = None,
        data_files: str | list[str] | dict[str, Any] | None = None,
        builder: Literal["audiofolder"] | None = None,
        audio_column: str = "audio",
        label_column: str = "label",
        max_train_rows: int | None = None,
        split: SplitSettings = DEFAULT_SPLIT,
        loader: LoaderSettings = DEFAULT_LOADER,
        **moved: Any,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self._take_settings(split, loader, moved)
        self._extractor: Any = None

    @property
    def spec(self) -> BackboneDataSpec:
        """The data's spec; prepares (synthesises or reads, decodes, splits) on first use."""
        return super().spec

    @property
    def feature_extractor(self) -> Any:  # noqa: ANN401
        """The backbone's ``Wav2Vec2FeatureExtractor``, loaded from ``model_dir``."""
        if self._extractor is None:
            self._extractor = load_feature_extractor(self.hparams.model_dir)
        return self._extractor

    def input_fingerprint(self, split: str) -> str:
        """The split's clip files (path, size, mtime), labels, decoding and extractor settings."""
        from ripieno.datamodules.fingerprints import Fingerprint, file_stamps

        data = self._split(split)
        sources = [hashlib.sha256(p.data).hexdigest() if isinstance(p, InMemoryClip) else file_stamps([p])[0]
                   for p in data.paths]
        return (Fingerprint("audio").add(sources).add(data.labels.numpy())
                .add({"max_seconds": self.hparams.max_seconds, "sampling_rate": data.sampling_rate,
                      "inputs": list(self.input_keys)})
                .add(self.feature_extractor.to_json_string()).hexdigest())

    @property
    def input_keys(self) -> tuple[str, ...]:
        """The batch keys the backbone receives (``model_input_keys`` of its extractor)."""
        return model_input_keys(self.feature_extractor)

    @property
    def sampling_rate(self) -> int:
        """Samples per second the backbone expects (clips are resampled to it)."""
        return int(self.feature_extractor.sampling_rate)

    def _is_hf_source(self) -> bool:
        hp = self.hparams
        return hp.data_files is not None or (hp.dataset not in (*SHIPPED, FOLDER, None)
                                             and is_saved_dataset(hp.dataset))

    def _check_args(self) -> None:
        hp = self.hparams
        check_split_args(self.split_settings, self.loader_settings, hp, AudioDataError)
        if not self._is_hf_source():
            check_source_choice(hp.dataset, hp.root, list(SHIPPED), "audio", "root/<class>/*.wav.",
                                AudioDataError)
        test = hp.test_dataset
        if test is not None and test not in SHIPPED and not Path(test).expanduser().is_dir():
            raise AudioDataError(f"test_dataset {test!r} is neither one of {list(SHIPPED)} nor an existing"
                                 " audio folder root/<class>/*.wav.")
        if test is not None and test == hp.dataset:
            raise AudioDataError(f"test_dataset must differ from dataset (both {test!r}).")
        if hp.max_seconds is not None and hp.max_seconds <= 0:
            raise AudioDataError(f"max_seconds must be positive (or null), got {hp.max_seconds}.")

    def _clips(self, name: str | None, root: str | None) -> tuple[list[tuple[Path, str]], list[str]]:
        hp = self.hparams
        if name == "spoken_digits":
            words = list(dict.fromkeys(hp.words or DIGIT_WORDS))
            cache = hp.cache_dir or ripieno_cache_dir("spoken_digits")
            clips = synthesize_words(cache, words, hp.voices or DEFAULT_VOICES, hp.speeds or DEFAULT_SPEEDS,
                                     hp.pitches or DEFAULT_PITCHES)
            return clips, words
        if name == "asterisk_digits":
            return asterisk_digit_clips(root), list(DIGIT_WORDS)
        return scan_audio_folder(root)

    def _hf_clips(self) -> tuple[list[tuple[Path | InMemoryClip, str]], list[str],
                                 dict[str, np.ndarray] | None]:
        """Clips of a ``datasets`` source: ``(clips, class_names, official rows or None)``."""
        hp = self.hparams
        parts = load_hf_splits(hp.dataset, hp.data_files, hp.builder, error=AudioDataError)
        mapped, carve = resolve_splits(parts, self.split_settings.policy, "AudioDataModule", AudioDataError)
        order = [name for name in ("train", "val", "test") if name in mapped]
        for name in order:
            missing = [c for c in (hp.audio_column, hp.label_column) if c not in mapped[name].column_names]
            if missing:
                raise AudioDataError(f"The {name} split has no column(s) {missing} (columns:"
                                     f" {mapped[name].column_names}); set data.audio_column and"
                                     " data.label_column.")
        feature = mapped["train"].features[hp.label_column]
        names = list(getattr(feature, "names", None) or [])
        if not names:
            names = sorted({str(v) for v in mapped["train"][hp.label_column]})
        clips: list[tuple[Path | InMemoryClip, str]] = []
        counts = []
        for name in order:
            labels = mapped[name][hp.label_column]
            as_names = [names[int(v)] if getattr(feature, "names", None) else str(v) for v in labels]
            unseen = sorted(set(as_names) - set(names))
            if unseen:
                raise AudioDataError(f"The {name} split has labels {unseen} that the train split never has.")
            for i, (value, label) in enumerate(zip(mapped[name][hp.audio_column], as_names, strict=True)):
                if isinstance(value, str):  # audiofolder: a path (see hf_datasets._audiofolder_features)
                    path, data = value, None
                else:
                    path, data = value.get("path"), value.get("bytes")
                if data is None and path and Path(path).is_file():
                    clips.append((Path(path), label))
                elif data is not None:
                    clips.append((InMemoryClip(path or f"{name}[{i}]", data), label))
                else:
                    raise AudioDataError(f"Row {i} of the {name} split has neither audio bytes nor a"
                                         f" readable file ({path!r}).")
            counts.append(len(labels))
        if carve == ["val", "test"] and len(mapped) == 1:
            return clips, names, None
        offsets = np.cumsum([0, *counts])
        return clips, names, {name: np.arange(offsets[i], offsets[i + 1]) for i, name in enumerate(order)}

    def _decode(self, clips: list[tuple[Path | InMemoryClip, str]]) -> list[np.ndarray]:
        return read_audio_files([path for path, _ in clips], self.sampling_rate, self.hparams.max_seconds)

    def _prepare(self) -> None:
        hp = self.hparams
        self._check_args()
        extractor, rate = self.feature_extractor, self.sampling_rate
        official = None
        if self._is_hf_source():
            name = "datasets"
            clips, class_names, official = self._hf_clips()
        else:
            name = hp.dataset if hp.dataset in SHIPPED else FOLDER
            clips, class_names = self._clips(name, hp.root)
        if len(class_names) < 2:
            raise AudioDataError(f"{hp.dataset!r} has {len(class_names)} class(es) {class_names}; a"
                                 " classifier needs at least two (e.g. more words).")
        index = {c: i for i, c in enumerate(class_names)}
        labels = np.asarray([index[c] for _, c in clips], dtype=np.int64)
        waves = self._decode(clips)
        try:
            cut = self.split_settings
            test_size = None if hp.test_dataset else cut.test_size
            if official is not None:
                rows = official_split_rows(labels, official, cut.val_size, test_size, cut.seed,
                                           hp.max_train_rows, error=AudioDataError)
            else:
                rows = seeded_splits(labels, cut.val_size, test_size, cut.seed, hp.max_train_rows,
                                     error=AudioDataError)
        except AudioDataError as err:
            if name != "asterisk_digits":
                raise
            raise AudioDataError(
                f"asterisk_digits holds {len(clips)} real clips, one or two per digit: too few to split"
                f" ({err}) Use it as the test set of synthetic speech instead: dataset: spoken_digits,"
                " test_dataset: asterisk_digits.") from err
        parts = {split: ([waves[i] for i in r], labels[r], [clips[i][0] for i in r])
                 for split, r in rows.items()}
        if hp.test_dataset is not None:
            test_name = hp.test_dataset if hp.test_dataset in SHIPPED else FOLDER
            test_root = hp.test_dataset if test_name == FOLDER else None
            test_clips, _ = self._clips(test_name, test_root)
            kept = [(p, c) for p, c in test_clips if c in index]
            if not kept:
                raise AudioDataError(f"test_dataset {hp.test_dataset!r} has no clips of the classes"
                                     f" {class_names}.")
            if len(kept) < len(test_clips):
                dropped = sorted({c for _, c in test_clips if c not in index})
                rank_zero_warn(f"test_dataset {hp.test_dataset!r}: dropped {len(test_clips) - len(kept)}"
                               f" clip(s) of classes {dropped} that {hp.dataset!r} does not have.")
            parts["test"] = (self._decode(kept), np.asarray([index[c] for _, c in kept], dtype=np.int64),
                             [p for p, _ in kept])
        self._splits = {split: AudioClipDataset(w, torch.as_tensor(y), extractor, rate, p)
                        for split, (w, y, p) in parts.items()}
        self._spec = BackboneDataSpec(
            n_classes=len(class_names), class_names=class_names, n_train=len(self._splits["train"]),
            n_val=len(self._splits["val"]), n_test=len(self._splits["test"]),
            dataset=str(Path(hp.root).expanduser()) if name == FOLDER else str(hp.dataset),
            input_keys=list(self.input_keys), model_dir=str(Path(hp.model_dir).expanduser()),
            modality="audio", sampling_rate=rate,
        )
