"""Save and restore random-number-generator states with a checkpoint.

Lightning restores weights, optimisers, loops and callbacks on resume, but not the
global RNGs, so dropout after a resume would draw different masks than an
uninterrupted run. Modules mix this in to make ``--ckpt_path`` resumes exact.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

RNG_KEY = "ripieno_rng_states"


class RNGStateMixin:
    """Adds the torch, CUDA, NumPy and Python RNG states to checkpoints."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Store the current RNG states."""
        checkpoint[RNG_KEY] = {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": _numpy_state_to_plain(np.random.get_state()),
            "python": random.getstate(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the RNG states saved by ``on_save_checkpoint`` (if any)."""
        states = checkpoint.get(RNG_KEY)
        if states is None:
            return
        torch.set_rng_state(states["torch"])
        if states["cuda"] and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(states["cuda"])
        name, keys, pos, has_gauss, cached = states["numpy"]
        np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
        random.setstate(states["python"])


def _numpy_state_to_plain(state: tuple) -> tuple:
    """NumPy's state with its key array as a tensor (loadable with ``weights_only=True``)."""
    name, keys, pos, has_gauss, cached = state
    return (str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss),
            float(cached))
