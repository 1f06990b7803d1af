"""SplitDataModule: what every ripieno datamodule shares.

A datamodule prepares once (load, validate, split, fit preprocessing on the training
split), describes the result in a ``spec`` that the CLI links into the model, and serves
in-memory splits whose ``__getitems__`` returns whole batches. Preparation is lazy and
idempotent, and identical on every DDP rank (seeded); training order depends only on the
split seed and the epoch (``EpochSeededRandomSampler``), so resumed runs match.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Sampler
from typing_extensions import override

from ripieno.datamodules.data_settings import LoaderSettings, SplitSettings, plain, settings_with_moved
from ripieno.framework.errors import RipienoInputError


class DataModuleError(RipienoInputError):
    """Raised for data a datamodule cannot prepare: bad arguments, files or contents.

    Every datamodule's own error type (``TabularDataError``, ``ImageDataError``, ...)
    derives from it, so ``except DataModuleError`` catches them all. It is a
    ``RipienoInputError`` (a ``ValueError``): the ``ripieno`` command prints its one line.
    """


def collate_batch(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """Identity collate: ``__getitems__`` already returns a batch."""
    return batch


class BatchDataset(Dataset, ABC):
    """An in-memory split that builds whole batches in ``__getitems__``.

    Subclasses implement ``__len__`` and ``__getitems__`` (enforced at instantiation); a
    single item is the first row of a one-row batch, so both paths share one preprocessing.
    """

    @abstractmethod
    def __len__(self) -> int:
        """Rows in the split."""

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        batch = self.__getitems__([index])
        return {key: value[0] for key, value in batch.items()}

    @abstractmethod
    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        """The batch of rows ``indices`` as a dict of tensors."""


class EpochSeededRandomSampler(Sampler[int]):
    """Random order that depends only on ``(seed, epoch)``.

    Lightning calls ``set_epoch`` each epoch, so a resumed run draws the same order as
    an uninterrupted one (the default sampler draws from the global RNG instead).
    """

    def __init__(self, n: int, seed: int = 0) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        """Select the permutation of this epoch."""
        self.epoch = epoch

    def __iter__(self):  # noqa: ANN204
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=generator).tolist())

    def __len__(self) -> int:
        return self.n


class SplitDataModule(L.LightningDataModule, ABC):
    """Lazy, validated, seeded splits held in memory, described by ``spec``.

    Subclasses implement ``_prepare`` (enforced at instantiation; it sets ``self._spec`` and
    ``self._splits`` with at least ``train``, ``val`` and ``test``). The modality DataModules take
    the ``split`` and ``loader`` groups (``data_settings``) through ``_take_settings``, with their own
    ``DEFAULT_SPLIT`` and ``DEFAULT_LOADER``; a subclass without the groups keeps ``split_seed``,
    ``batch_size``, ``eval_batch_size`` and ``num_workers`` in its hyperparameters, read as groups.
    """

    #: The flat arguments of earlier releases and their place in ``split`` or ``loader`` (set by the
    #: subclasses that take the groups; a recipe file's load regroups them, with a warning).
    MOVED_ARGUMENTS: ClassVar[dict[str, str]] = {}
    #: The defaults of the groups, for the subclasses that take them (``_take_settings``).
    DEFAULT_SPLIT: ClassVar[SplitSettings] = SplitSettings(val_size=0.1, test_size=0.2)
    DEFAULT_LOADER: ClassVar[LoaderSettings] = LoaderSettings(batch_size=64, eval_batch_size=512)

    def __init__(self) -> None:
        super().__init__()
        self._spec: Any = None
        self._splits: dict[str, Dataset] = {}
        self._split_settings: SplitSettings | None = None
        self._loader_settings: LoaderSettings | None = None

    def _take_settings(
        self,
        split: SplitSettings | dict[str, Any] | None,
        loader: LoaderSettings | dict[str, Any] | None,
        moved: dict[str, Any],
    ) -> None:
        """Keep the ``split`` and ``loader`` groups (flat arguments of earlier releases folded in, warned).

        ``hparams`` then hold each group as a dict of its fields, not the flat names, so a checkpoint
        rebuilds the DataModule from its groups.
        """
        defaults = {"split": self.DEFAULT_SPLIT, "loader": self.DEFAULT_LOADER}
        groups = settings_with_moved(type(self).__name__, {"split": split, "loader": loader}, defaults, moved)
        self._split_settings, self._loader_settings = groups["split"], groups["loader"]
        for name in moved:
            self.hparams.pop(name, None)
        self.hparams["split"], self.hparams["loader"] = plain(groups["split"]), plain(groups["loader"])

    @property
    def split_settings(self) -> SplitSettings:
        """How the rows are split (``SplitSettings``)."""
        if self._split_settings is not None:
            return self._split_settings
        return SplitSettings(seed=self.hparams.get("split_seed", 0))

    @property
    def loader_settings(self) -> LoaderSettings:
        """How the splits are served (``LoaderSettings``)."""
        if self._loader_settings is not None:
            return self._loader_settings
        hp = self.hparams
        return LoaderSettings(hp.get("batch_size"), hp.get("eval_batch_size"), hp.get("num_workers", 0))

    @abstractmethod
    def _prepare(self) -> None:
        """Load, validate, split and preprocess; set ``_spec`` and ``_splits``."""

    @property
    def spec(self) -> Any:  # noqa: ANN401
        """The data's spec; prepares on first use."""
        if self._spec is None:
            self._prepare()
        return self._spec

    @override
    def setup(self, stage: str | None = None) -> None:
        """Prepare the splits (idempotent; identical on every DDP rank)."""
        if self._spec is None:
            self._prepare()

    @override
    def train_dataloader(self) -> DataLoader:
        """Shuffled training batches (order seeded by ``split_seed`` and the epoch)."""
        data = self._split("train")
        sampler = EpochSeededRandomSampler(len(data), seed=self.split_settings.seed)
        return self._loader(data, self.loader_settings.batch_size, sampler=sampler)

    @override
    def val_dataloader(self) -> DataLoader:
        """Validation batches in a fixed order."""
        return self._loader(self._split("val"), self.loader_settings.eval_batch_size)

    @override
    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        """Test batches in a fixed order."""
        return self._loader(self._split("test"), self.loader_settings.eval_batch_size)

    @override
    def predict_dataloader(self) -> DataLoader:
        """The test split, for ``predict``."""
        return self._loader(self._split("test"), self.loader_settings.eval_batch_size)

    def input_fingerprint(self, split: str) -> str | None:
        """A cheap fingerprint of a split's raw inputs and preprocessing, or ``None``.

        Caches of what a model computes from the batches (``LayerEmbeddingDataModule``) key on
        it, so a hit never builds a batch. ``None`` (the default) makes them hash every batch.
        Overrides must change whenever the batches would, and must not run the processor.
        """
        return None

    def split_sizes(self) -> dict[str, int]:
        """Rows per split."""
        self.setup()
        return {name: len(data) for name, data in self._splits.items()}

    @override
    def state_dict(self) -> dict[str, Any]:
        """The compact spec (its fitted state as a digest), so a resumed run can check its data."""
        return {"spec": self.spec.hparams_dict()}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Warn when the checkpoint's data spec differs from the current one."""
        saved = state_dict.get("spec")
        current = (self.spec.hparams_dict(), self.spec.to_dict())  # what checkpoints hold now, and before
        if saved is not None and saved not in current:
            rank_zero_warn("The checkpoint was trained on differently prepared data (spec differs).")

    def _split(self, name: str) -> Any:  # noqa: ANN401
        self.setup()
        return self._splits[name]

    def _loader(self, data: Dataset, batch_size: int, sampler: Sampler | None = None) -> DataLoader:
        return DataLoader(
            data, batch_size=batch_size, sampler=sampler, collate_fn=collate_batch,
            num_workers=self.loader_settings.num_workers,
            persistent_workers=self.loader_settings.num_workers > 0,
        )
