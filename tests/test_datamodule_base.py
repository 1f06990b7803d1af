"""What every datamodule shares: enforced abstract bases, one error type, one split helper."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.model_selection import train_test_split

from ripieno.datamodules import (
    AudioDataError,
    AudioDataModule,
    BackboneImageDataModule,
    DataModuleError,
    ImageDataError,
    ImageDataModule,
    LayerEmbeddingDataModule,
    LoaderSettings,
    MissingAudioDataError,
    MissingImageDataError,
    SplitSettings,
    TabularDataError,
    TabularDataModule,
    TeacherStudentDataModule,
    TextDataError,
    TextDataModule,
)
from ripieno.datamodules.base import BatchDataset, SplitDataModule
from ripieno.datamodules.data_settings import plain
from ripieno.datamodules.images import ImageArrayDataset
from ripieno.datamodules.layer_embedding_config import SelectionConfig
from ripieno.datamodules.layer_embeddings import LayerFeatureDataset
from ripieno.datamodules.splits import check_split_args, seeded_splits, split_rows, stratified_subset
from ripieno.datamodules.tabular import TabularTensorDataset, _split_indices
from ripieno.datamodules.teacher_student import PatternDataset
from ripieno.datamodules.text import MissingTextDataError, TokenizedTextDataset

LABELS = np.repeat(np.arange(3), [30, 20, 10])  # 60 rows, imbalanced


# ------------------------------------------------------------------- abstract bases
def test_incomplete_subclasses_fail_at_instantiation() -> None:
    class NoPrepare(SplitDataModule):
        pass

    class NoBatches(BatchDataset):
        def __len__(self) -> int:
            return 0

    with pytest.raises(TypeError, match="abstract method.*_prepare"):
        NoPrepare()
    with pytest.raises(TypeError, match="abstract method.*__getitems__"):
        NoBatches()


@pytest.mark.parametrize("make", [
    TabularDataModule, ImageDataModule, TextDataModule, AudioDataModule, BackboneImageDataModule,
    TeacherStudentDataModule,
    lambda: LayerEmbeddingDataModule(source=TextDataModule),
])
def test_every_shipped_datamodule_instantiates(make) -> None:  # noqa: ANN001
    assert isinstance(make(), SplitDataModule)


@pytest.mark.parametrize("dataset", [
    TabularTensorDataset(torch.randn(4, 2), torch.arange(4).view(4, 1), torch.arange(4)),
    ImageArrayDataset(torch.randint(0, 255, (4, 1, 2, 2), dtype=torch.uint8), torch.arange(4), 255.0),
    TokenizedTextDataset(torch.arange(8).view(4, 2), torch.ones(4, 2, dtype=torch.long), torch.arange(4),
                         ["a", "b", "c", "d"], np.arange(4)),
    PatternDataset(torch.randn(4, 3, dtype=torch.float64), torch.ones(4, dtype=torch.float64)),
    LayerFeatureDataset(torch.randn(4, 2, 3), torch.arange(4)),
])
def test_an_item_is_the_row_of_its_batch(dataset: BatchDataset) -> None:
    batch = dataset.__getitems__([1, 3])
    item = dataset[3]
    assert item.keys() == batch.keys()
    for key, value in item.items():
        torch.testing.assert_close(value, batch[key][1], rtol=0, atol=0)


# ------------------------------------------------------------------------ errors
@pytest.mark.parametrize("error", [TabularDataError, ImageDataError, MissingImageDataError, TextDataError,
                                   MissingTextDataError, AudioDataError, MissingAudioDataError])
def test_every_datamodule_error_is_a_datamodule_error(error: type[Exception]) -> None:
    assert issubclass(error, DataModuleError) and issubclass(error, ValueError)
    assert issubclass(error, FileNotFoundError) == error.__name__.startswith("Missing")


@pytest.mark.parametrize("make, error, match", [
    (lambda: TabularDataModule(dataset="iris", split=SplitSettings(val_size=1.5)).setup(), TabularDataError,
     "split.val_size must be"),
    (lambda: TabularDataModule(dataset="iris", split=SplitSettings(val_size=0.5,
                               test_size=0.5)).setup(), TabularDataError,
     "leaves no training rows"),
    (lambda: TabularDataModule(dataset="iris", max_rows=2).setup(), TabularDataError,
     "max_rows must be at least 3"),
    (lambda: ImageDataModule(dataset="digits", loader=LoaderSettings(num_workers=-1)).setup(), ImageDataError,
     "num_workers must be >= 0"),
    (lambda: TextDataModule(max_length=0, build_tokenizer=True).setup(), TextDataError,
     "max_length must be a positive integer"),
    (lambda: BackboneImageDataModule(dataset="digits",
                                     split=SplitSettings(test_size=0.0)).setup(), ImageDataError,
     "test_size must be a fraction"),
    (lambda: AudioDataModule(loader=LoaderSettings(eval_batch_size=0)).setup(), AudioDataError,
     "eval_batch_size must be a"),
    (lambda: TeacherStudentDataModule(n_inputs=0), DataModuleError, "n_inputs must be >= 1"),
    (lambda: LayerEmbeddingDataModule(source=TextDataModule, selection=SelectionConfig(method="random")),
     DataModuleError, "Unknown selection method"),
    (lambda: LayerEmbeddingDataModule(source={}), DataModuleError, "source must be a LightningDataModule"),
])
def test_bad_arguments_raise_datamodule_errors(make, error: type[Exception], match: str) -> None:  # noqa: ANN001
    with pytest.raises(error, match=match):
        make()


# ------------------------------------------------------------------------ splits
@pytest.mark.parametrize("size, n_out", [(0.2, 12), (0.25, 15), (7, 7)])
@pytest.mark.parametrize("seed", [0, 3])
def test_split_rows_is_sklearns_stratified_split(size: float | int, n_out: int, seed: int) -> None:
    rows = np.arange(len(LABELS))
    kept, held = split_rows(rows, LABELS, size, seed, arg="val_size", cap="max_rows", error=TextDataError)
    oracle = train_test_split(rows, test_size=n_out, random_state=seed, stratify=LABELS)
    np.testing.assert_array_equal(kept, np.sort(oracle[0]))
    np.testing.assert_array_equal(held, np.sort(oracle[1]))
    expected = np.bincount(LABELS) * n_out / len(rows)
    assert np.all(np.abs(np.bincount(LABELS[held], minlength=3) - expected) <= 1)


def test_split_rows_without_labels_is_a_plain_seeded_shuffle_in_drawn_order() -> None:
    rows = np.arange(100, 150)
    kept, held = split_rows(rows, None, 10, 4, arg="test_size", cap="max_rows", error=TabularDataError,
                            sort=False)
    oracle = train_test_split(rows, test_size=10, random_state=4)
    np.testing.assert_array_equal(kept, oracle[0])
    np.testing.assert_array_equal(held, oracle[1])


def test_split_rows_raises_the_callers_error() -> None:
    rows = np.arange(len(LABELS))
    with pytest.raises(ImageDataError, match="2 of 60 rows .* fewer than the 3 classes it must hold; raise"
                                             " val_size or max_train_rows"):
        split_rows(rows, LABELS, 2, 0, arg="val_size", cap="max_train_rows", error=ImageDataError)
    single = np.append(LABELS, 3)  # class 3 has one row: sklearn cannot stratify it
    with pytest.raises(AudioDataError, match="Cannot split stratified by class for test_size"):
        split_rows(np.arange(len(single)), single, 0.3, 0, arg="test_size", cap="max_train_rows",
                   error=AudioDataError)


def test_stratified_subset_keeps_class_shares_or_samples_plainly_when_nearly_whole() -> None:
    rows = np.arange(len(LABELS))
    subset = stratified_subset(rows, LABELS, 30, 0, cap="max_rows", error=TextDataError)
    assert len(subset) == 30 and np.all(np.diff(subset) > 0)
    assert np.all(np.abs(np.bincount(LABELS[subset]) - np.bincount(LABELS) / 2) <= 1)
    nearly_whole = stratified_subset(rows, LABELS, 58, 5, cap="max_rows", error=TextDataError)
    expected = np.sort(np.random.default_rng(5).choice(rows, size=58, replace=False))
    np.testing.assert_array_equal(nearly_whole, expected)


def test_seeded_splits_are_disjoint_covering_and_reproducible() -> None:
    rows = seeded_splits(LABELS, 0.25, 0.2, 1, error=ImageDataError)
    assert [len(rows[k]) for k in ("train", "val", "test")] == [36, 12, 12]
    np.testing.assert_array_equal(np.sort(np.concatenate(list(rows.values()))), np.arange(len(LABELS)))
    again = seeded_splits(LABELS, 0.25, 0.2, 1, error=ImageDataError)
    assert all(np.array_equal(rows[k], again[k]) for k in rows)
    capped = seeded_splits(LABELS, 0.25, None, 1, max_train_rows=40, error=ImageDataError)
    assert [len(capped[k]) for k in ("train", "val", "test")] == [30, 10, 0]


def test_tabular_splits_are_sklearns_two_step_split() -> None:
    train, val, test = _split_indices(len(LABELS), LABELS, 0.2, 0.25, 2)
    rest, oracle_test = train_test_split(np.arange(60), test_size=15, random_state=2, stratify=LABELS)
    oracle_train, oracle_val = train_test_split(rest, test_size=12, random_state=2, stratify=LABELS[rest])
    for got, want in ((train, oracle_train), (val, oracle_val), (test, oracle_test)):
        np.testing.assert_array_equal(got, np.sort(want))


@pytest.mark.parametrize("changes, match", [
    ({"split": {"val_size": 0.0}}, r"split.val_size must be a fraction in \(0, 1\), got 0.0"),
    ({"split": {"test_size": 1.0}}, r"split.test_size must be a fraction in \(0, 1\), got 1.0"),
    ({"split": {"policy": "random"}}, r"split.policy must be 'official' or 'resplit', got 'random'"),
    ({"loader": {"batch_size": 0}}, "loader.batch_size must be a positive integer, got 0"),
    ({"hparams": {"max_train_rows": 1}}, r"max_train_rows must be at least 2 \(or null\), got 1"),
    ({"loader": {"num_workers": -2}}, "loader.num_workers must be >= 0, got -2"),
])
def test_check_split_args_names_the_bad_argument(changes: dict, match: str) -> None:
    split = SplitSettings(val_size=0.1, test_size=0.2)
    loader = LoaderSettings(batch_size=8, eval_batch_size=8)
    hparams = {"max_train_rows": None}
    check_split_args(split, loader, hparams, ImageDataError)
    with pytest.raises(ImageDataError, match=match):
        check_split_args(SplitSettings(**{**plain(split), **changes.get("split", {})}),
                         LoaderSettings(**{**plain(loader), **changes.get("loader", {})}),
                         {**hparams, **changes.get("hparams", {})}, ImageDataError)
