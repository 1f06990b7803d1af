"""Checkpoints written atomically in their own folder, on any filesystem.

Lightning's ``TorchCheckpointIO`` serialises a checkpoint into memory and writes it through
an fsspec transaction, which writes to ``$TMPDIR`` and then *copies* the file to its final
name when the run folder is on another filesystem (a network or scratch disk, the usual
case on clusters): a kill during the copy leaves a truncated ``last.ckpt`` where the good
one was, and a full disk leaves a truncated ``best-*.ckpt`` under its final name.
``AtomicCheckpointIO`` writes into a hidden temporary file beside the checkpoint, flushes
and syncs it, and renames it into place (``framework.output_files.atomic_output``), so a
kill or a full disk leaves the previous good file and no partial file under a checkpoint
name; a full disk ends with one line (``OutputWriteError``) instead of a long traceback.
The ``ripieno`` command installs it in every run whose Trainer has no CheckpointIO of its
own; in Python, pass ``Trainer(plugins=[AtomicCheckpointIO()])``.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp())
    >>> io = AtomicCheckpointIO()
    >>> io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, folder / "last.ckpt")
    >>> io.load_checkpoint(folder / "last.ckpt", weights_only=True)["state_dict"]["w"]
    tensor([1., 1.])
    >>> [p.name for p in folder.iterdir()]
    ['last.ckpt']
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from ripieno.framework.outputs.output_files import atomic_output


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose saves are atomic in the checkpoint's own folder (module docstring).

    Remote paths (``s3://...``) keep Lightning's own save, which their object stores make
    atomic per object.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | Path,
                        storage_options: Any | None = None) -> None:  # noqa: ANN401
        if storage_options is not None or "://" in str(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        with atomic_output(Path(path), "wb", what="the checkpoint") as file:
            torch.save(checkpoint, file)
