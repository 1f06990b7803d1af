"""A checksummed on-disk cache of per-layer embeddings (safetensors), keyed by fingerprints.

``cached_layer_embeddings`` stores ``extract_layer_embeddings``'s result as safetensors under a
key made of the model's fingerprint (its folder's files, or its config and weights), the pooling and the
data's fingerprint (the raw inputs and their preprocessing, as the source datamodule
states them cheaply, or else the exact input tensors), so a second run with the same
model, pooling and data reads it back instead of recomputing (without running the
processor or loading the model); anything else gives a new file. Every entry stores a
SHA-256 of its tensors; an entry that cannot be read, whose checksum does not match, or
that has none (an older ripieno's) is reported with a warning naming the file and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn

from ripieno.framework.errors import file_problem
from ripieno.framework.loes.extraction import (
    LayerEmbeddings,
    Pooling,
    extract_layer_embeddings,
    rng_untouched,
)

CHECKSUM_KEY = "sha256"  # the cache entry's metadata key of its tensors' SHA-256


def model_fingerprint(model: nn.Module) -> str:
    """SHA-256 of the model's class, config and every parameter and buffer."""
    digest = hashlib.sha256(type(model).__qualname__.encode())
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "to_json_string"):
        digest.update(config.to_json_string(use_diff=False).encode())
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def data_fingerprint(loader: Iterable[dict[str, Tensor]], keys: Sequence[str]) -> str:
    """SHA-256 of the exact tensors under ``keys`` in every batch, in loader order."""
    digest = hashlib.sha256()
    for batch in loader:
        for key in keys:
            if key in batch:
                digest.update(key.encode())
                digest.update(batch[key].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def folder_fingerprint(folder: str | Path) -> str:
    """SHA-256 of a model folder's file names, sizes and modification times (cheap, no reads).

    The cache key of a backbone loaded from ``folder``: any rewritten weight or config file
    changes it, without hashing (or even loading) gigabytes of weights. A single file (a
    TorchScript backbone) is stamped the same way.
    """
    root = Path(folder).expanduser().resolve()
    if root.is_file():
        stat = root.stat()
        return hashlib.sha256(f"file\0{root.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode()).hexdigest()
    digest = hashlib.sha256(b"folder")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


@rng_untouched()
def cached_layer_embeddings(
    model: nn.Module | Callable[[], nn.Module],
    loader: Iterable[dict[str, Tensor]],
    input_keys: Sequence[str],
    cache_dir: str | Path,
    pooling: Pooling = "mean",
    label_key: str = "y",
    progress: bool = True,
    model_id: str | None = None,
    data_id: str | None = None,
    device: str | torch.device | None = None,
    *,
    layer_names: Sequence[str] | None = None,
) -> tuple[Tensor, Tensor, Path, bool]:
    """``extract_layer_embeddings`` with a safetensors cache shared by processes.

    The key is the model's id, the pooling, the input keys and the data's id. With
    ``data_id`` (a cheap fingerprint of the raw inputs and their preprocessing, e.g.
    ``TextDataModule.input_fingerprint``) a hit reads the file without iterating
    ``loader``, so the processor never runs, and with a callable ``model`` the backbone is
    not even loaded. Without it the key hashes every batch (a full pass of the processor).
    A file lock next to the entry makes concurrent processes (DDP ranks, parallel jobs)
    extract once: the first computes, the others wait and read.

    Args:
        model: the pretrained model, or a function that loads it (called on a miss only).
        loader: a loader in a fixed order (the data fingerprint follows it).
        input_keys: the model inputs in a batch.
        cache_dir: folder of the cache files.
        pooling: ``cls``, ``mean`` or ``last``.
        label_key: the labels' key.
        progress: progress bar while extracting.
        model_id: a precomputed ``model_fingerprint`` / ``folder_fingerprint`` (required
            with a callable ``model``).
        data_id: a fingerprint of the data that replaces hashing the batches.
        device: where the model runs while extracting (``None``: where it is).
        layer_names: submodules whose outputs are the layers (see ``hidden_states``); part
            of the key when set.

    A ``loader`` with a ``row_order`` attribute (the dataset row of each position it gave,
    e.g. ``LengthBucketedLoader``) has its embeddings put back in row order before they are
    stored. A miss returns exactly the tensors a later hit reads (float32, row order), and
    hit or miss, the global RNGs end as they began (``rng_untouched``), so what follows
    draws the same numbers either way.

    Each entry's metadata holds the SHA-256 of its tensors. An entry that is not readable
    safetensors (e.g. truncated), whose tensors do not match their checksum, or that has
    none (written by an older ripieno) is reported with a ``UserWarning`` naming the file and
    the problem, then extracted again and rewritten.

    Returns:
        ``(embeddings, labels (N,), path, hit)``, embeddings ``(L, N, D)`` or a list of
        ``(N, D_l)`` (layers of different widths); ``hit`` says whether the file
        already existed.
    """
    from filelock import FileLock

    if callable(model) and not isinstance(model, nn.Module) and model_id is None:
        raise ValueError("A callable model needs model_id (e.g. folder_fingerprint of its folder).")
    if model_id is None:
        model_id = model_fingerprint(model)  # type: ignore[arg-type]
    key = {"model": model_id, "pooling": pooling, "inputs": list(input_keys),
           "data": data_id or data_fingerprint(loader, [*input_keys, label_key])}
    if layer_names is not None:  # absent otherwise, so existing entries keep their keys
        key["layer_names"] = list(layer_names)
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    path = Path(cache_dir) / f"layers-{name}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_suffix(".lock"))):
        if path.is_file():
            try:
                return (*_unpack(_read_entry(path)), path, True)
            except _CorruptEntryError as error:
                warnings.warn(file_problem(path, str(error), "re-extracting the embeddings and rewriting it"),
                              stacklevel=2)
        net = model if isinstance(model, nn.Module) else model()
        if device is not None:
            net = net.to(device)
        embeddings, labels = extract_layer_embeddings(net, loader, input_keys, pooling, label_key, progress,
                                                      layer_names=layer_names)
        tensors = _entry_tensors(embeddings, labels, getattr(loader, "row_order", None))
        _write_entry(path, tensors, key)
    return (*_unpack(tensors), path, False)  # exactly what a later hit reads back


class _CorruptEntryError(Exception):
    """A cache entry that cannot be trusted; the message says why (it is then rebuilt)."""


def _payload_sha256(tensors: dict[str, Tensor]) -> str:
    """SHA-256 of the tensors' names, dtypes, shapes and bytes, in name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\n".encode())
        digest.update(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
    return digest.hexdigest()


def _entry_tensors(embeddings: LayerEmbeddings, labels: Tensor, order: Tensor | None) -> dict[str, Tensor]:
    """The tensors a cache entry stores, rows put back in dataset order when ``order`` is given.

    ``order`` is the dataset row of each extracted position (a ``LengthBucketedLoader``'s
    ``row_order``); ``None``: the rows are in order already.
    """
    if order is not None:
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))
        labels = labels[inverse]
        embeddings = (embeddings[:, inverse] if isinstance(embeddings, Tensor) else
                      [e[inverse] for e in embeddings])
    stored = ({"embeddings": embeddings.contiguous()} if isinstance(embeddings, Tensor) else
              {f"embeddings.{i}": e.contiguous() for i, e in enumerate(embeddings)})
    return {**stored, "labels": labels.contiguous()}


def _unpack(tensors: dict[str, Tensor]) -> tuple[LayerEmbeddings, Tensor]:
    """``(embeddings, labels)`` of a cache entry's tensors (a list of layers when widths differ)."""
    if "embeddings" in tensors:
        return tensors["embeddings"], tensors["labels"]
    count = sum(k.startswith("embeddings.") for k in tensors)
    return [tensors[f"embeddings.{i}"] for i in range(count)], tensors["labels"]


def _write_entry(path: Path, tensors: dict[str, Tensor], key: dict[str, Any]) -> None:
    """Write a cache entry with its key and checksum in the metadata, atomically."""
    metadata = {name: json.dumps(value) for name, value in key.items()}
    metadata[CHECKSUM_KEY] = _payload_sha256(tensors)
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    tmp.replace(path)  # atomic: a crashed run never leaves a half-written cache entry


def _read_entry(path: Path) -> dict[str, Tensor]:
    """A cache entry's tensors, checked against the checksum stored with them.

    Raises:
        _CorruptEntryError: the file is not readable safetensors (truncated, garbled
            header), has no checksum (written before entries had one), or its tensors do not
            match it (bytes changed on disk).
    """
    try:
        with safe_open(str(path), framework="pt") as entry:
            metadata = entry.metadata() or {}
            tensors = {name: entry.get_tensor(name) for name in entry.keys()}
    except SafetensorError as error:
        raise _CorruptEntryError(f"is not a readable safetensors file ({error})") from error
    stored = metadata.get(CHECKSUM_KEY)
    if stored is None:
        raise _CorruptEntryError("has no checksum (written by an older ripieno), so it is treated as stale")
    if stored != _payload_sha256(tensors):
        raise _CorruptEntryError("does not match its stored SHA-256 (its bytes changed on disk)")
    return tensors
