"""The split and loader settings every modality DataModule shares, declared once.

``TabularDataModule``, ``TextDataModule``, ``AudioDataModule``, ``ImageDataModule`` and
``BackboneImageDataModule`` each split their rows (``SplitSettings``: which splits of a ``datasets``
source to keep, the validation and test fractions, the seed) and serve them in batches
(``LoaderSettings``: training and evaluation batch sizes, loader workers). These two groups are
their ``split`` and ``loader`` arguments, as ``LayerEmbeddingDataModule`` groups its settings; each
DataModule keeps its own defaults (``DEFAULT_SPLIT``, ``DEFAULT_LOADER``), which a field left ``None``
takes (``LoaderSettings(batch_size=32)`` keeps the DataModule's evaluation batch size). In a recipe::

    data:
      class_path: ripieno.datamodules.TabularDataModule
      init_args:
        dataset: diamonds
        split: {val_size: 0.15, seed: 1}
        loader: {batch_size: 512}

and on the command line ``--data.init_args.loader.batch_size=512``. The flat arguments of earlier
releases (``batch_size: 512`` beside ``dataset``) still load from a recipe file, from a checkpoint's
hyperparameters and in Python, each with a ``RipienoDeprecationWarning`` naming its place
(``MOVED_ARGUMENTS``; removed in ripieno 0.3.0).

Example:
    >>> from ripieno.datamodules import TabularDataModule
    >>> data = TabularDataModule("diamonds", split=SplitSettings(val_size=0.15, seed=1))
    >>> data.split_settings.val_size, data.split_settings.test_size, data.loader_settings.batch_size
    (0.15, 0.2, 256)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Literal

from ripieno.framework.errors import fold_flat_arguments


@dataclass(frozen=True)
class SplitSettings:
    """How a DataModule splits its rows into training, validation and test.

    Attributes:
        policy: for a ``datasets`` source: ``official`` keeps its ``train`` / ``validation`` /
            ``test`` splits (missing ones carved from train with ``seed``), ``resplit`` pools them and
            draws all three (a message says so either way). Other sources are always carved.
        val_size: fraction of rows for validation (``None``: the DataModule's own default).
        test_size: fraction of rows for test (``None``: the DataModule's own default).
        seed: seed of the split (and of the training order, and of any preprocessing noise).
    """

    policy: Literal["official", "resplit"] = "official"
    val_size: float | None = None
    test_size: float | None = None
    seed: int = 0


@dataclass(frozen=True)
class LoaderSettings:
    """How a DataModule serves its splits.

    Attributes:
        batch_size: training batch size (``None``: the DataModule's own default).
        eval_batch_size: batch size of validation, test and predict (``None``: the DataModule's own
            default).
        num_workers: ``DataLoader`` worker processes (0: the main process).
    """

    batch_size: int | None = None
    eval_batch_size: int | None = None
    num_workers: int = 0


#: ``{flat name: "group.field"}``: where each flat argument of earlier releases lives now.
MOVED_ARGUMENTS: dict[str, str] = {
    "splits": "split.policy",
    "val_size": "split.val_size",
    "test_size": "split.test_size",
    "split_seed": "split.seed",
    "batch_size": "loader.batch_size",
    "eval_batch_size": "loader.eval_batch_size",
    "num_workers": "loader.num_workers",
}

def settings_with_moved(
    owner: str,
    given: dict[str, SplitSettings | LoaderSettings | dict[str, Any] | None],
    defaults: dict[str, SplitSettings | LoaderSettings],
    moved: dict[str, Any],
) -> dict[str, Any]:
    """The ``split`` and ``loader`` groups with the flat keyword arguments of earlier releases folded in.

    Args:
        owner: the DataModule's class name (for the messages).
        given: ``{"split": ..., "loader": ...}`` as passed: a group, a dict of its fields (a
            checkpoint's hyperparameters, a recipe read in Python) or ``None`` (the defaults).
        defaults: the DataModule's own default of each group.
        moved: the keyword arguments the DataModule did not take itself.

    Returns:
        ``{"split": SplitSettings, "loader": LoaderSettings}``.

    Raises:
        TypeError: a keyword that is neither the DataModule's nor a moved setting, as Python says for
            any unexpected keyword.
        ValueError: a setting given both flat and in its group.
    """
    unknown = [name for name in moved if name not in MOVED_ARGUMENTS]
    if unknown:
        raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
    groups: dict[str, Any] = {}
    for name, default in defaults.items():
        value = given.get(name)
        if value is None:
            value = default
        elif isinstance(value, dict):
            value = type(default)(**value)
        elif not isinstance(value, type(default)):
            raise TypeError(f"{owner}({name}=...) must be a {type(default).__name__} (or a dict of its"
                            f" fields), got {type(value).__name__}.")
        flat = {key: (MOVED_ARGUMENTS[key].split(".")[1], item) for key, item in moved.items()
                if MOVED_ARGUMENTS[key].startswith(f"{name}.")}
        value = fold_flat_arguments(owner, name, value, default, flat, stacklevel=4)
        unset = {f.name: getattr(default, f.name) for f in fields(value) if getattr(value, f.name) is None}
        groups[name] = dataclasses.replace(value, **unset)
    return groups


def plain(group: SplitSettings | LoaderSettings) -> dict[str, Any]:
    """A group as a dict of its fields: what ``hparams`` and checkpoints hold."""
    return {field.name: getattr(group, field.name) for field in fields(group)}
