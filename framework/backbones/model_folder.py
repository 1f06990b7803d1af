"""One check that a folder holds a model ``from_pretrained`` can load, before it is loaded.

A Hugging Face ``save_pretrained`` folder (and a timm ``save_for_hf`` folder, which uses the
same file names) needs ``config.json`` and its weights: ``model.safetensors``,
``pytorch_model.bin``, or a sharded ``*.index.json`` with every shard it lists.
``check_model_folder`` reads only headers (the safetensors header and its size check, the
zip directory of a ``.bin``), so it is cheap for any model size, and it turns what would be a
traceback from deep inside ``transformers``, ``safetensors`` or ``timm`` into one line that
names the folder or file, what is wrong and the fix (``ripieno.framework.errors.file_problem``).
The ``ripieno`` command prints that line alone.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as root:
    ...     try:
    ...         check_model_folder(Path(root) / "bert", "save the model there")
    ...     except MissingModelFolderError as error:
    ...         print(str(error).split(": ", 1)[1])
    does not exist, so there is no config.json or weights to load; save the model there.
"""

from __future__ import annotations

import json
import zipfile
from os import PathLike
from pathlib import Path

from safetensors import SafetensorError, safe_open

from ripieno.framework.errors import RipienoInputError, file_problem

#: Weight files in the order ``transformers`` prefers them (safetensors first).
WEIGHT_FILES: tuple[str, ...] = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                                 "pytorch_model.bin.index.json")


class ModelFolderError(RipienoInputError):
    """A model folder that cannot be loaded; the message names it, the problem and the fix."""


class MissingModelFolderError(ModelFolderError, FileNotFoundError):
    """The folder, its ``config.json`` or its weights are missing."""


def check_model_folder(folder: str | PathLike[str], fix: str) -> Path:
    """``folder`` as a path, after checking that it holds a loadable model.

    Args:
        folder: the model folder, as the user named it.
        fix: what the user should do, in the words of the calling site (e.g. which setting
            to point at which kind of folder); it ends every message.

    Returns:
        The folder (``~`` expanded).

    Raises:
        MissingModelFolderError: the folder, its ``config.json``, its weights or a shard
            listed by its index are missing.
        ModelFolderError: ``config.json`` or an index is not a JSON object, or a weights file
            is truncated or corrupt.
    """
    path = Path(folder).expanduser()
    if not path.is_dir():
        problem = "is a file, not a model folder" if path.exists() else (
            "does not exist, so there is no config.json or weights to load")
        raise MissingModelFolderError(file_problem(path, problem, fix))
    config = path / "config.json"
    if not config.is_file():
        raise MissingModelFolderError(file_problem(
            path, "has no config.json, so it is not a model folder (written by save_pretrained)", fix))
    json_object(config, fix)
    weights = next((path / name for name in WEIGHT_FILES if (path / name).is_file()), None)
    if weights is None:
        raise MissingModelFolderError(file_problem(
            path, f"has config.json but no weights (none of {', '.join(WEIGHT_FILES)}); the save stopped"
            " early or only the config was copied", fix))
    for file in _shards(weights, fix) if weights.name.endswith(".index.json") else [weights]:
        _check_weights(file, fix)
    return path


def json_object(file: Path, fix: str, error: type[RipienoInputError] = ModelFolderError) -> dict:
    """The JSON object in a model folder's ``file`` (a config), or ``error`` saying why not.

    Args:
        file: the JSON file.
        fix: what the user should do; it ends the message.
        error: the error type to raise (a datamodule passes its own).
    """
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as reason:
        raise error(file_problem(file, f"is not valid JSON ({reason})", fix)) from reason
    if not isinstance(data, dict):
        raise error(file_problem(file, "does not hold a JSON object", fix))
    return data


def _shards(index: Path, fix: str) -> list[Path]:
    """The shard files a sharded checkpoint's index lists, each of which must exist."""
    weight_map = json_object(index, fix).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelFolderError(file_problem(index, "has no weight_map naming the shards", fix))
    shards = [index.parent / name for name in sorted(set(weight_map.values()))]
    missing = [shard.name for shard in shards if not shard.is_file()]
    if missing:
        raise MissingModelFolderError(file_problem(index, f"lists shards that are missing: {missing}", fix))
    return shards


def _check_weights(file: Path, fix: str) -> None:
    """Raise ``ModelFolderError`` when a weights file's header or directory cannot be read.

    A safetensors file must have a whole header whose tensors cover the file exactly (what a
    truncated or garbled file fails); a ``.bin`` must be a readable zip archive (PyTorch's
    format since 1.6; truncation loses the directory at its end).
    """
    try:
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt"):
                pass
        else:
            with zipfile.ZipFile(file):
                pass
    except (SafetensorError, zipfile.BadZipFile, OSError) as error:
        raise ModelFolderError(file_problem(file, f"is truncated or corrupt ({error})", fix)) from error
