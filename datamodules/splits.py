"""Seeded row splits and the split arguments that every datamodule validates.

``split_rows`` cuts rows in two with scikit-learn's ``train_test_split``: stratified by
label when labels are given, a plain seeded shuffle otherwise, so a seed always gives
the same rows. ``stratified_subset`` caps the rows, ``seeded_splits`` composes the
train/val/test splits of the image and audio datamodules, and ``check_split_args``
validates the arguments they share. Errors are raised as the caller's
``DataModuleError`` subclass, so each datamodule keeps its own error type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sklearn.model_selection import train_test_split

from ripieno.datamodules.base import DataModuleError
from ripieno.datamodules.data_settings import LoaderSettings, SplitSettings


def check_split_args(
    split: SplitSettings,
    loader: LoaderSettings,
    hparams: Mapping[str, Any],
    error: type[DataModuleError],
    positive: Sequence[str] = (),
    cap: str = "max_train_rows",
    min_rows: int = 2,
) -> None:
    """Validate the split and loader settings and the row cap of a datamodule.

    Args:
        split: its ``split`` group.
        loader: its ``loader`` group.
        hparams: the datamodule's hyperparameters, with ``cap`` and every name in ``positive``.
        error: the datamodule's error type.
        positive: its own integers that must be at least 1 (e.g. ``max_length``).
        cap: the optional row cap (``None`` = every row).
        min_rows: the smallest row cap the datamodule can split.

    Raises:
        error: a size is not a fraction in (0, 1), a batch size or ``positive`` value is below 1,
            the cap is below ``min_rows``, ``num_workers`` is negative or the policy is unknown.
    """
    if split.policy not in ("official", "resplit"):
        raise error(f"split.policy must be 'official' or 'resplit', got {split.policy!r}.")
    for key in ("val_size", "test_size"):
        value = getattr(split, key)
        if not 0.0 < value < 1.0:
            raise error(f"split.{key} must be a fraction in (0, 1), got {value}.")
    for key in ("batch_size", "eval_batch_size"):
        value = getattr(loader, key)
        if value < 1:
            raise error(f"loader.{key} must be a positive integer, got {value}.")
    for key in positive:
        if hparams[key] < 1:
            raise error(f"{key} must be a positive integer, got {hparams[key]}.")
    if hparams[cap] is not None and hparams[cap] < min_rows:
        raise error(f"{cap} must be at least {min_rows} (or null), got {hparams[cap]}.")
    if loader.num_workers < 0:
        raise error(f"loader.num_workers must be >= 0, got {loader.num_workers}.")


def split_rows(
    rows: np.ndarray,
    labels: np.ndarray | None,
    size: float | int,
    seed: int,
    *,
    arg: str,
    cap: str,
    error: type[DataModuleError],
    sort: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Split ``rows`` into ``(kept, held_out)`` with ``train_test_split(random_state=seed)``.

    Args:
        rows: the row indices to split.
        labels: the labels of all rows, indexed by ``rows``: each class keeps its share
            on both sides; ``None`` for a plain seeded shuffle split.
        size: rows held out, a fraction of ``rows`` (rounded) or a count.
        seed: the split's seed.
        arg: the argument that set ``size``, named in errors.
        cap: the row-cap argument, named in errors as the other fix.
        error: the caller's error type.
        sort: return each side sorted, else in the order ``train_test_split`` draws.

    Raises:
        error: a stratified side would hold fewer rows than there are classes, or the
            split is impossible (e.g. a class with a single row).
    """
    n_out = int(size) if isinstance(size, int | np.integer) else round(len(rows) * size)
    stratify = None if labels is None else labels[rows]
    if stratify is not None:
        n_classes = len(np.unique(stratify))
        if min(n_out, len(rows) - n_out) < n_classes:
            raise error(
                f"{arg} leaves {n_out} of {len(rows)} rows on one side of a stratified split, fewer than"
                f" the {n_classes} classes it must hold; raise {arg} or {cap}."
            )
    try:
        kept, held = train_test_split(rows, test_size=n_out, random_state=seed, stratify=stratify)
    except ValueError as err:
        how = "stratified by class " if stratify is not None else ""
        raise error(f"Cannot split {how}for {arg}: {err}") from err
    return (np.sort(kept), np.sort(held)) if sort else (kept, held)


def stratified_subset(rows: np.ndarray, labels: np.ndarray, n: int, seed: int, *, cap: str,
                      error: type[DataModuleError]) -> np.ndarray:
    """``n`` of ``rows``, sorted: stratified by label, or drawn plainly when almost all are kept.

    When fewer rows are dropped than there are classes, the dropped rows cannot hold
    every class, so the subset is a plain seeded sample (it is nearly whole anyway).
    """
    n_classes = len(np.unique(labels[rows]))
    if len(rows) - n < n_classes:
        return np.sort(np.random.default_rng(seed).choice(rows, size=n, replace=False))
    return split_rows(rows, labels, len(rows) - n, seed, arg=cap, cap=cap, error=error)[0]


def seeded_splits(
    labels: np.ndarray,
    val_size: float,
    test_size: float | None,
    seed: int,
    max_train_rows: int | None = None,
    *,
    error: type[DataModuleError],
) -> dict[str, np.ndarray]:
    """Stratified, seeded ``train`` / ``val`` / ``test`` row indices of ``labels``.

    ``test_size`` of the rows go to ``test`` first (none when ``test_size`` is ``None``,
    for sources with their own test set); ``max_train_rows`` then caps the rest (a
    stratified subset), of which ``val_size`` go to ``val``. The same seed gives the same
    splits, and the three are disjoint and sorted.
    """
    return official_split_rows(labels, {"train": np.arange(len(labels))}, val_size, test_size, seed,
                               max_train_rows, error=error)


def official_split_rows(
    labels: np.ndarray,
    official: dict[str, np.ndarray],
    val_size: float,
    test_size: float | None,
    seed: int,
    max_train_rows: int | None = None,
    *,
    error: type[DataModuleError],
) -> dict[str, np.ndarray]:
    """A source's own ``train`` / ``val`` / ``test`` rows, the missing ones carved from train.

    ``official`` holds the rows of the splits the source has (``train`` at least). A missing
    ``test`` takes ``test_size`` of the training rows (none when ``test_size`` is ``None``,
    for a test set given elsewhere); ``max_train_rows`` then caps the training pool; a
    missing ``val`` takes ``val_size`` of it. Stratified and seeded as ``seeded_splits``.
    """
    cap = "max_train_rows"
    pool = np.asarray(official["train"])
    test = official.get("test")
    if test is None:
        test = np.empty(0, dtype=np.int64)
        if test_size is not None:
            pool, test = split_rows(pool, labels, test_size, seed, arg="test_size", cap=cap, error=error)
    if max_train_rows is not None and max_train_rows < len(pool):
        pool = stratified_subset(pool, labels, max_train_rows, seed, cap=cap, error=error)
    val = official.get("val")
    if val is None:
        pool, val = split_rows(pool, labels, val_size, seed, arg="val_size", cap=cap, error=error)
    return {"train": np.sort(pool), "val": np.sort(np.asarray(val)), "test": np.sort(np.asarray(test))}
