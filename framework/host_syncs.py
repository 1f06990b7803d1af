"""Count the calls that make the host wait for an accelerator, on any device (CPU included).

On a GPU, ``.item()``, ``bool(tensor)``, ``.cpu()``, ``torch.unique`` or a boolean-mask
index stall the host until the device has caught up; one of them per training step can cost
more than the step. ``torch.cuda.set_sync_debug_mode`` sees them only on CUDA, so a CPU-only
test suite would never notice a new one. :class:`HostSyncCounter` is a stand-in that works on
every device: a ``TorchFunctionMode`` that records each call of that kind (with the line of
code that made it), optionally only those made from given source folders, so a test can
assert that one training step of a method makes none. It counts calls that *would* wait on an
accelerator; on CPU they cost nothing, and ``.cpu()`` of a tensor that is already on the host
is counted too (write such code so that it has no reason to call it). A ``.to("cpu")`` counts
only when the code that asks for it is under ``only_from`` itself: on CPU a library's
``.to(module.device)`` looks the same, and on an accelerator it is a copy to the device.

Written here because torch has no device-independent sync detector.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

# Tensor methods and torch functions whose result the host must read (a value, a data-dependent
# shape, or a copy to host memory).
_ALWAYS = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.cpu, torch.Tensor.numpy,
    torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__index__,
    torch.Tensor.__format__, torch.Tensor.nonzero, torch.nonzero, torch.Tensor.unique, torch.unique,
    torch.unique_consecutive, torch.Tensor.masked_select, torch.masked_select, torch.Tensor.equal,
    torch.equal, torch.allclose, torch.Tensor.allclose, torch.is_nonzero, torch.argwhere,
    torch.Tensor.argwhere,
}


@dataclass(frozen=True)
class HostSync:
    """One call that waits for the device: what was called and the line that called it."""

    call: str
    where: str

    def __str__(self) -> str:
        return f"{self.call} at {self.where}"


def _is_host_copy(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:  # noqa: ANN401
    if func is not torch.Tensor.to:
        return False
    targets = [*args[1:], kwargs.get("device")]
    return any(str(t).startswith("cpu") for t in targets if isinstance(t, str | torch.device))


def _has_mask_index(func: Any, args: Sequence[Any]) -> bool:  # noqa: ANN401
    if func not in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) or len(args) < 2:
        return False
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in index)


def _needs_tensor_repeats(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:  # noqa: ANN401
    if func not in (torch.repeat_interleave, torch.Tensor.repeat_interleave):
        return False
    repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
    return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None


class HostSyncCounter(TorchFunctionMode):
    """Record every call that would make the host wait for the device, while the ``with`` block runs.

    Example:
        >>> import torch
        >>> x = torch.randn(8)
        >>> with HostSyncCounter() as syncs:
        ...     y = x * 2                      # stays on the device
        ...     positive = bool((x > 0).any())  # the host reads a value: one sync
        ...     kept = x[x > 0]                 # a boolean mask: the shape depends on values
        >>> [s.call for s in syncs.calls]
        ['Tensor.__bool__', 'Tensor.__getitem__ (boolean mask)']

    Args:
        only_from: Count only calls made (directly or through other code) from a source file
            under one of these folders, e.g. ripieno's own package folder; ``None`` counts all.
        not_from: Folders inside ``only_from`` whose frames do not count, e.g. the command
            line code that calls ``trainer.fit`` (so the Trainer's own reads are not counted).
    """

    def __init__(self, only_from: Sequence[str | Path] | None = None,
                 not_from: Sequence[str | Path] = ()) -> None:
        super().__init__()
        self.only_from = None if only_from is None else tuple(str(Path(p).resolve()) for p in only_from)
        self.not_from = tuple(str(Path(p).resolve()) for p in not_from)
        self.calls: list[HostSync] = []

    def __len__(self) -> int:
        return len(self.calls)

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),  # noqa: ANN401
                           kwargs: dict[str, Any] | None = None) -> Any:  # noqa: ANN401
        kwargs = kwargs or {}
        if func in _ALWAYS:
            self._record(_name(func))
        elif _has_mask_index(func, args):
            self._record(f"{_name(func)} (boolean mask)")
        elif _is_host_copy(func, args, kwargs):
            self._record("Tensor.to (host)", direct=True)
        elif _needs_tensor_repeats(func, args, kwargs):
            self._record(f"{_name(func)} (tensor repeats without output_size)")
        return func(*args, **kwargs)

    def _record(self, call: str, direct: bool = False) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if not f.filename.endswith("host_syncs.py")]
        if direct:  # only when the code asking for it is ours, not a library that we called
            outside_torch = [f for f in frames if f"{os.sep}torch{os.sep}" not in f.filename]
            frames = outside_torch[-1:]
        if self.only_from is not None:
            frames = [f for f in frames
                      if _under(f.filename, self.only_from) and not _under(f.filename, self.not_from)]
            if not frames:
                return
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
        self.calls.append(HostSync(call, where))


def _under(filename: str, folders: tuple[str, ...]) -> bool:
    return bool(folders) and str(Path(filename).resolve()).startswith(folders)


def _name(func: Any) -> str:  # noqa: ANN401
    if func is torch.unique:  # a boolean_dispatch wrapper named "fn"
        return "torch.unique"
    qualname = getattr(func, "__qualname__", None) or getattr(func, "__name__", str(func))
    if qualname.startswith("TensorBase."):
        qualname = "Tensor." + qualname.split(".", 1)[1]
    module = getattr(func, "__module__", None)
    plain = module in (None, "torch._tensor", "torch._C") or "." in qualname
    return qualname if plain else f"torch.{qualname}"
