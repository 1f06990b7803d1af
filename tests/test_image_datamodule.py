"""ImageDataModule: shipped and on-disk sources, seeded stratified splits, OOD pairing, errors."""

import gzip
import pickle
import struct
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch

from ripieno.datamodules import LoaderSettings, SplitSettings
from ripieno.datamodules.images import (
    FASHION_MNIST_DEBIAN_ROOT,
    ImageDataError,
    ImageDataModule,
    ImageSpec,
    MissingImageDataError,
    load_source,
)

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


# ----------------------------------------------------------------------------- helpers
def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_fashion_raw(root: Path, n_train: int = 40, n_test: int = 10) -> dict[str, np.ndarray]:
    """A tiny torchvision FashionMNIST root: ``root/FashionMNIST/raw`` with plain IDX files."""
    raw = root / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(1)
    arrays = {
        "train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
        "train-labels-idx1-ubyte": np.arange(n_train) % 10,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
        "t10k-labels-idx1-ubyte": np.arange(n_test) % 10,
    }
    for name, array in arrays.items():
        write_idx(raw / name, array)
    return arrays


def write_cifar10(root: Path, n: int = 10, bad_label: bool = False) -> dict[str, dict]:
    """Standard python-pickle layout with 2 of the 5 training batches."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(2)
    batches = {}
    for name in ("data_batch_1", "data_batch_2", "test_batch"):
        labels = [int(i % 10) for i in range(n)]
        if bad_label and name == "data_batch_2":
            labels[0] = 10
        batches[name] = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), "labels": labels,
                         "batch_label": name}
        (folder / name).write_bytes(pickle.dumps(batches[name]))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": CIFAR10_NAMES, "num_vis": 3072}))
    return batches


def write_cifar100(root: Path, n_train: int = 200, n_test: int = 30) -> None:
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(3)
    for name, n in (("train", n_train), ("test", n_test)):
        entry = {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 "fine_labels": [i % 100 for i in range(n)], "coarse_labels": [i % 20 for i in range(n)]}
        (folder / name).write_bytes(pickle.dumps(entry))
    (folder / "meta").write_bytes(pickle.dumps({"fine_label_names": [f"c{i}" for i in range(100)]}))


def all_batches(loader) -> dict[str, torch.Tensor]:
    batches = list(loader)
    return {key: torch.cat([b[key] for b in batches]) for key in batches[0]}


# ------------------------------------------------------------------ packaged sources
@pytest.mark.parametrize(("name", "shape", "total"),
                         [("digits", (1, 8, 8), 1797), ("mnist_5k", (1, 28, 28), 5000)])
def test_packaged_sources_shapes_and_classes(name, shape, total):
    dm = ImageDataModule(dataset=name, loader=LoaderSettings(batch_size=32))
    spec = dm.spec
    assert spec.image_shape == shape and spec.in_channels == 1
    assert spec.n_classes == 10 and spec.class_names == [str(d) for d in range(10)]
    assert spec.n_train + spec.n_val + spec.n_test == total
    assert dm.split_sizes() == {"train": spec.n_train, "val": spec.n_val, "test": spec.n_test}
    batch = next(iter(dm.train_dataloader()))
    assert batch["x"].shape == (32, *shape) and batch["x"].dtype == torch.float32
    assert batch["y"].dtype == torch.long and set(batch["y"].tolist()) <= set(range(10))
    assert not isinstance(dm.test_dataloader(), list)


def test_splits_are_stratified_and_seeded():
    dm = ImageDataModule(dataset="mnist_5k", split=SplitSettings(val_size=0.1, test_size=0.2, seed=1))
    # 500 per class: 100 to test, then 40 of the remaining 400 to validation.
    assert np.bincount(dm._split("test").labels.numpy()).tolist() == [100] * 10
    assert np.bincount(dm._split("val").labels.numpy()).tolist() == [40] * 10
    assert np.bincount(dm._split("train").labels.numpy()).tolist() == [360] * 10
    again = ImageDataModule(dataset="mnist_5k", split=SplitSettings(val_size=0.1, test_size=0.2, seed=1))
    other = ImageDataModule(dataset="mnist_5k", split=SplitSettings(val_size=0.1, test_size=0.2, seed=2))
    for split in ("train", "val", "test"):
        assert torch.equal(dm._split(split).images, again._split(split).images)
        assert not torch.equal(dm._split(split).images, other._split(split).images)


def test_max_train_rows_is_a_stratified_subset_of_the_training_pool():
    dm = ImageDataModule(dataset="mnist_5k", max_train_rows=200, split=SplitSettings(val_size=0.2))
    assert dm.spec.n_train + dm.spec.n_val == 200 and dm.spec.n_test == 1000
    assert np.bincount(dm._split("train").labels.numpy()).tolist() == [16] * 10
    with pytest.raises(ImageDataError, match="fewer than the 10 classes"):
        ImageDataModule(dataset="mnist_5k", max_train_rows=30, split=SplitSettings(val_size=0.1)).setup()


def test_normalize_uses_training_statistics_only():
    dm = ImageDataModule(dataset="digits", normalize=True, split=SplitSettings(val_size=0.3))
    train = dm._split("train").images.numpy() / 16.0
    val_images = dm._split("val").images.numpy() / 16.0
    mean, std = train.mean(), train.std()
    assert dm.spec.mean == pytest.approx([mean], rel=1e-6) and dm.spec.std == pytest.approx([std], rel=1e-6)
    pooled = np.concatenate([train, val_images])
    assert abs(pooled.mean() - mean) > 1e-4  # the statistics really exclude validation rows
    val = all_batches(dm.val_dataloader())
    assert np.allclose(val["x"].numpy(), (val_images - mean) / std, atol=1e-5)
    raw = ImageDataModule(dataset="digits", normalize=False, split=SplitSettings(val_size=0.3))
    assert raw.spec.mean is None
    x = all_batches(raw.val_dataloader())["x"]
    assert np.allclose(x.numpy(), val_images, atol=1e-7) and x.min() >= 0 and x.max() <= 1


def test_train_order_depends_on_seed_and_epoch_only():
    dm = ImageDataModule(dataset="digits", loader=LoaderSettings(batch_size=64))
    loader = dm.train_dataloader()
    first = next(iter(loader))["y"]
    assert torch.equal(first, next(iter(dm.train_dataloader()))["y"])
    loader.sampler.set_epoch(1)
    assert not torch.equal(first, next(iter(loader))["y"])


def test_spec_round_trips_as_plain_dict():
    spec = ImageDataModule(dataset="digits").spec
    plain = spec.to_dict()
    assert plain["image_shape"] == [1, 8, 8] and isinstance(plain["mean"], list)
    assert ImageSpec.coerce(plain) == spec


# ---------------------------------------------------------------------- Fashion-MNIST
def test_fashion_mnist_reads_the_debian_idx_files():
    root = Path(FASHION_MNIST_DEBIAN_ROOT)
    if not root.is_dir():
        pytest.skip(f"{root} is absent: run `apt-get install dataset-fashion-mnist` to run this test")
    with gzip.open(root / "train-images-idx3-ubyte.gz") as f:
        train_images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(root / "train-labels-idx1-ubyte.gz") as f:
        train_labels = np.frombuffer(f.read(), np.uint8, offset=8)
    with gzip.open(root / "t10k-images-idx3-ubyte.gz") as f:
        test_images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(root / "t10k-labels-idx1-ubyte.gz") as f:
        test_labels = np.frombuffer(f.read(), np.uint8, offset=8)
    raw = load_source("fashion_mnist")
    assert raw.train_x.shape == (60000, 1, 28, 28) and raw.test_x.shape == (10000, 1, 28, 28)
    assert np.array_equal(raw.train_x[:5, 0], train_images[:5])
    assert np.array_equal(raw.train_y[:5], train_labels[:5])

    dm = ImageDataModule(dataset="fashion_mnist", normalize=False, loader=LoaderSettings(eval_batch_size=5))
    assert dm.spec.n_classes == 10 and dm.spec.class_names[0] == "T-shirt/top"
    assert (dm.spec.n_train, dm.spec.n_val, dm.spec.n_test) == (54000, 6000, 10000)
    batch = next(iter(dm.test_dataloader()))  # the official test split, in file order
    assert np.array_equal((batch["x"][:, 0] * 255).round().numpy().astype(np.uint8), test_images[:5])
    assert batch["y"].tolist() == test_labels[:5].tolist()


def test_fashion_mnist_from_a_torchvision_root(tmp_path):
    arrays = write_fashion_raw(tmp_path)
    for name in ("fashion_mnist", "fashion_mnist_torchvision"):
        dm = ImageDataModule(dataset=name, root=str(tmp_path), normalize=False,
                             split=SplitSettings(val_size=0.25))
        assert (dm.spec.n_train, dm.spec.n_val, dm.spec.n_test) == (30, 10, 10)
        test = all_batches(dm.test_dataloader())
        assert torch.equal((test["x"][:, 0] * 255).round().to(torch.uint8),
                           torch.from_numpy(arrays["t10k-images-idx3-ubyte"].astype(np.uint8)))
        assert test["y"].tolist() == arrays["t10k-labels-idx1-ubyte"].tolist()


# -------------------------------------------------------------------------------- CIFAR
def test_cifar10_pickle_layout_loads_through_torchvision(tmp_path):
    batches = write_cifar10(tmp_path)
    dm = ImageDataModule(dataset="cifar10", root=str(tmp_path), normalize=False,
                         split=SplitSettings(val_size=0.5), loader=LoaderSettings(batch_size=4))
    with pytest.warns(UserWarning, match="found 2 of the 5 standard training batches"):
        spec = dm.spec
    assert spec.image_shape == (3, 32, 32) and spec.class_names == CIFAR10_NAMES
    assert (spec.n_train, spec.n_val, spec.n_test) == (10, 10, 10)
    assert next(iter(dm.train_dataloader()))["x"].shape == (4, 3, 32, 32)
    test = all_batches(dm.test_dataloader())
    expected = batches["test_batch"]["data"].reshape(-1, 3, 32, 32)  # rows are R, G, B planes
    assert np.array_equal((test["x"] * 255).round().numpy().astype(np.uint8), expected)
    assert test["y"].tolist() == batches["test_batch"]["labels"]


def test_cifar10_with_cifar100_as_ood(tmp_path):
    write_cifar10(tmp_path)
    write_cifar100(tmp_path)
    with pytest.warns(UserWarning, match="2 of the 5"):
        dm = ImageDataModule(dataset="cifar10", root=str(tmp_path), ood_dataset="cifar100",
                             ood_root=str(tmp_path), split=SplitSettings(val_size=0.5))
        assert dm.spec.ood_dataset == "cifar100" and dm.spec.n_ood == 30
    ood = all_batches(dm.ood_dataloader())
    assert ood["x"].shape == (30, 3, 32, 32) and (ood["y"] == -1).all()
    assert load_source("cifar100", tmp_path).class_names[:2] == ["c0", "c1"]


def test_labels_out_of_range_are_rejected(tmp_path):
    write_cifar10(tmp_path, bad_label=True)
    with (pytest.warns(UserWarning, match="2 of the 5"),
          pytest.raises(ImageDataError, match=r"outside 0\.\.9")):
        ImageDataModule(dataset="cifar10", root=str(tmp_path)).setup()


# ---------------------------------------------------------------------------------- OOD
def test_ood_pairing_fashion_mnist_with_mnist_5k():
    if not Path(FASHION_MNIST_DEBIAN_ROOT).is_dir():
        pytest.skip(f"{FASHION_MNIST_DEBIAN_ROOT} is absent: run `apt-get install dataset-fashion-mnist`")
    dm = ImageDataModule(dataset="fashion_mnist", ood_dataset="mnist_5k", max_train_rows=1000,
                         loader=LoaderSettings(eval_batch_size=500))
    assert dm.spec.n_ood == 5000 and dm.spec.n_train + dm.spec.n_val == 1000
    loaders = dm.test_dataloader()
    assert isinstance(loaders, list) and len(loaders) == 2
    ood = next(iter(dm.ood_dataloader()))
    assert ood["x"].shape == (500, *dm.spec.image_shape) and (ood["y"] == -1).all()
    # OOD images are normalised with the ID training statistics.
    mean, std = dm.spec.mean[0], dm.spec.std[0]
    mnist = load_source("mnist_5k").train_x[:500] / 255.0
    assert np.allclose(ood["x"].numpy(), (mnist - mean) / std, atol=1e-5)


def test_lightning_test_loop_runs_id_and_ood_with_dataloader_idx(tmp_path):
    write_fashion_raw(tmp_path)

    class Probe(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(784, 10)
            self.seen = {}

        def test_step(self, batch, batch_idx, dataloader_idx=0):
            self.seen.setdefault(dataloader_idx, []).append(batch["y"])
            return self.layer(batch["x"].flatten(1)).sum()

    dm = ImageDataModule(dataset="mnist_5k", ood_dataset="fashion_mnist", ood_root=str(tmp_path),
                         loader=LoaderSettings(eval_batch_size=64))
    model = Probe()
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_test_batches=2)
    trainer.test(model, datamodule=dm)
    assert sorted(model.seen) == [0, 1]
    assert (torch.cat(model.seen[0]) >= 0).all() and (torch.cat(model.seen[1]) == -1).all()


def test_ood_with_a_different_image_shape_is_rejected():
    with pytest.raises(ImageDataError, match=r"shape \(1, 28, 28\).*\(1, 8, 8\).*same size and channels"):
        ImageDataModule(dataset="digits", ood_dataset="mnist_5k").setup()


# ------------------------------------------------------------------------------- errors
def test_missing_fashion_mnist_folder_names_the_apt_package(tmp_path):
    with pytest.raises(MissingImageDataError, match="apt-get install dataset-fashion-mnist"):
        ImageDataModule(dataset="fashion_mnist", root=str(tmp_path / "absent")).setup()
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingImageDataError, match=r"missing.*apt-get install dataset-fashion-mnist"):
        ImageDataModule(dataset="fashion_mnist", root=str(tmp_path / "empty")).setup()


@pytest.mark.parametrize(("name", "layout"), [
    ("cifar10", "cifar-10-batches-py"), ("cifar100", "cifar-100-python"), ("mnist", "MNIST/raw"),
])
def test_missing_torchvision_roots_name_the_layout(tmp_path, name, layout):
    with pytest.raises(MissingImageDataError, match=f"set data.root.*{layout}.*downloads are disabled"):
        ImageDataModule(dataset=name).setup()
    with pytest.raises(FileNotFoundError, match=f"not found under.*{layout}"):
        ImageDataModule(dataset=name, root=str(tmp_path)).setup()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dataset": "imagenet"}, "Unknown image data set dataset='imagenet'"),
    ({"dataset": "digits", "ood_dataset": "svhn"}, "Unknown image data set ood_dataset='svhn'"),
    ({"dataset": "digits", "ood_dataset": "digits"}, "must differ"),
    ({"dataset": "digits", "val_size": 0.0}, r"val_size must be a fraction in \(0, 1\)"),
    ({"dataset": "digits", "val_size": 1.5}, r"val_size must be a fraction in \(0, 1\)"),
    ({"dataset": "digits", "test_size": 1.0}, r"test_size must be a fraction"),
    ({"dataset": "digits", "batch_size": 0}, "batch_size must be a positive integer"),
])
def test_invalid_arguments_fail_before_training(kwargs, message):
    with pytest.raises(ImageDataError, match=message):
        ImageDataModule(**kwargs).setup()
