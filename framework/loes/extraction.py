"""Per-layer embeddings of a pretrained model, pooled to one vector per input per layer.

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

Extraction leaves every global RNG (torch CPU and CUDA, NumPy, Python's ``random``) as it
found it: iterating a ``DataLoader`` draws its base seed from torch's global generator
(also with ``shuffle=False``), so without this a run that extracts (a cache miss) would
initialise the model that follows from a different RNG state than a run that reads the
cache, and the same seed would give different numbers.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

Pooling = Literal["cls", "mean", "last"]
POOLINGS: tuple[str, ...] = ("cls", "mean", "last")


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


def _frame_mask(model: nn.Module, mask: Tensor | None, length: int, batch: int,
                device: torch.device | None = None) -> Tensor:
    """A ``(B, T)`` mask over the hidden states' ``T`` positions (made on ``device`` when there is none)."""
    if mask is None:
        return torch.ones(batch, length, dtype=torch.long, device=device)
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
                masks[h.shape[1]] = _frame_mask(model, batch.get("attention_mask"), h.shape[1], b, h.device)
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
