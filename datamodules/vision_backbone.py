"""BackboneImageDataModule: images preprocessed by a pretrained backbone's own processor.

Feeds per-layer feature extraction (LOES, GeoReg) and fine-tuning of a vision backbone
(DINOv2, a ViT): batches are dicts holding exactly the model's inputs plus labels,
``{"pixel_values": float (B, 3, H, W), "y": long (B,)}``, so a Hugging Face model runs
as ``model(**{k: batch[k] for k in dm.input_keys}, output_hidden_states=True)``.

Preprocessing is the model's own, read from ``model_dir`` (nothing is downloaded):

* a Hugging Face ``save_pretrained`` folder with ``preprocessor_config.json``
  (``AutoImageProcessor.from_pretrained``: resize, crop, rescale, normalise);
* a timm folder (``timm.models.save_for_hf``: ``config.json`` with ``pretrained_cfg``),
  through ``timm.data.resolve_data_config`` and ``create_transform``.

``ripieno.framework.backbones.small_models`` writes small random folders of both kinds.

Images come from the shipped sets of ``ripieno.datamodules.images`` (``fashion_mnist``,
``mnist_5k``, ``digits``, or any of its ``SOURCES`` with a local root), grey images
turned to RGB, or from an image folder ``root/<class>/**/*.png|jpg|...`` read with PIL.
Images stay compact (``uint8`` arrays or file paths) and are preprocessed a batch at a
time, so even full Fashion-MNIST at 224 pixels fits in memory. Splits are stratified
and seeded by ``split.seed``, as in ``ImageDataModule``. Every file is opened and checked
when the data is prepared, so unreadable images fail before any model runs.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from ripieno.datamodules.base import BatchDataset, DataModuleError, SplitDataModule
from ripieno.datamodules.data_settings import MOVED_ARGUMENTS, LoaderSettings, SplitSettings
from ripieno.datamodules.hf_datasets import is_saved_dataset, load_hf_splits, resolve_splits
from ripieno.datamodules.images import SOURCES as IMAGE_SOURCES
from ripieno.datamodules.images import ImageDataError, MissingImageDataError, load_source
from ripieno.datamodules.splits import check_split_args, official_split_rows, seeded_splits
from ripieno.framework.backbones.model_folder import json_object
from ripieno.framework.extras import require
from ripieno.framework.specs.backbone import BackboneDataSpec  # noqa: F401  (re-exported)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp")
FOLDER = "folder"
BUILD_HINT = ("build a small random one with"
              " `python -m ripieno.framework.backbones.small_models {kind} <dir>` (tests,"
              " plumbing), or save real weights on a machine with internet:"
              " `AutoModel.from_pretrained(name).save_pretrained(dir)` and the same for its {processor}")


# ------------------------------------------------------------------------------- spec
# --------------------------------------------------------------------- preprocessing
class ImagePreprocessor:
    """A backbone's own image preprocessing: RGB PIL images -> ``float32 (B, 3, H, W)``.

    Args:
        model_dir: a Hugging Face folder with ``preprocessor_config.json`` or a timm folder
            whose ``config.json`` holds ``pretrained_cfg``.

    Attributes:
        kind: ``hf`` or ``timm``.
        processor: the Hugging Face image processor (``None`` for timm).
        transform: the timm eval transform (``None`` for Hugging Face).
    """

    def __init__(self, model_dir: str | Path | None) -> None:
        path = resolve_model_dir(model_dir, "dinov2", "AutoImageProcessor")
        self.model_dir = str(path)
        self.processor: Any = None
        self.transform: Callable[[Image.Image], Tensor] | None = None
        timm_cfg = _timm_pretrained_cfg(path)
        if (path / "preprocessor_config.json").is_file():
            require("vision", "transformers", "BackboneImageDataModule")
            from transformers import AutoImageProcessor

            json_object(path / "preprocessor_config.json",  # a broken file: its name, not transformers' trace
                        BUILD_HINT.format(kind="dinov2", processor="AutoImageProcessor"), ImageDataError)
            try:
                self.processor = AutoImageProcessor.from_pretrained(str(path), local_files_only=True)
            except (OSError, ValueError, KeyError) as err:
                reason = str(err).split(". ")[0]  # transformers appends a very long list of model types
                raise ImageDataError(f"{str(path / 'preprocessor_config.json')!r} is not an image processor"
                                     f" config ({reason}); is model_dir an audio or text model?") from err
            self.kind = "hf"
        elif timm_cfg is not None:
            require("vision", "timm", "BackboneImageDataModule")
            from timm.data import create_transform, resolve_data_config

            self.transform = create_transform(**resolve_data_config({}, pretrained_cfg=timm_cfg),
                                              is_training=False)
            self.kind = "timm"
        else:
            raise MissingImageDataError(
                f"{str(path)!r} holds no image preprocessing: expected preprocessor_config.json (Hugging"
                " Face save_pretrained of the model's image processor) or a timm config.json with"
                f" pretrained_cfg; {BUILD_HINT.format(kind='dinov2', processor='AutoImageProcessor')}.")

    def config_string(self) -> str:
        """The preprocessing's settings as text (the processor's JSON, or timm's transform)."""
        if self.kind == "hf":
            return str(self.processor.to_json_string())
        return repr(self.transform)

    def __call__(self, images: Sequence[Image.Image]) -> Tensor:
        """Preprocess a batch of RGB images."""
        if self.kind == "hf":
            return self.processor(images=list(images), return_tensors="pt")["pixel_values"].float()
        return torch.stack([self.transform(image) for image in images]).float()


def load_image_preprocessor(model_dir: str | Path | None) -> ImagePreprocessor:
    """The image preprocessing saved in ``model_dir`` (Hugging Face or timm), loaded offline."""
    return ImagePreprocessor(model_dir)


def check_source_choice(dataset: str | None, root: str | None, names: list[str], kind: str, layout: str,
                        error: type[DataModuleError]) -> None:
    """Check that ``dataset`` is one of ``names``, or ``folder`` (or ``None``) with a ``root``.

    Args:
        dataset: the chosen source.
        root: the folder of a ``folder`` source.
        names: the shipped sources.
        kind: ``image`` or ``audio``, for messages.
        layout: the folder layout, for messages (e.g. ``root/<class>/*.wav``).
        error: the datamodule's error type.
    """
    if dataset in (None, FOLDER):
        if root is None:
            raise error(f"Set data.dataset to one of {names} or data.root to an {kind} folder {layout}.")
    elif dataset not in names:
        raise error(f"Unknown {kind} data set {dataset!r}; choose one of {names}, or '{FOLDER}' with"
                    " data.root.")


def resolve_model_dir(model_dir: str | Path | None, kind: str, processor: str,
                      error: type[Exception] = MissingImageDataError) -> Path:
    """``model_dir`` as an existing folder, or ``error`` saying how to build or save one."""
    hint = BUILD_HINT.format(kind=kind, processor=processor)
    if model_dir is None:
        raise error(f"Set data.model_dir to a local folder holding the backbone and its preprocessing;"
                    f" {hint}.")
    path = Path(model_dir).expanduser()
    if not path.is_dir():
        raise error(f"model_dir {str(path)!r} does not exist (downloads are disabled); {hint}.")
    return path


def _timm_pretrained_cfg(path: Path) -> dict[str, Any] | None:
    config = path / "config.json"
    if not config.is_file():
        return None
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    cfg = data.get("pretrained_cfg") if isinstance(data, dict) and "architecture" in data else None
    return cfg if isinstance(cfg, dict) else None


# ---------------------------------------------------------------------------- images
class ArrayImages:
    """Rows of a ``uint8 (N, C, H, W)`` array as RGB PIL images (grey repeated to 3 channels)."""

    def __init__(self, array: np.ndarray, rows: np.ndarray, max_value: int = 255) -> None:
        if array.ndim != 4 or array.shape[1] not in (1, 3):
            raise ImageDataError(f"Expected uint8 images (N, 1 or 3, H, W), got shape {array.shape}.")
        self.array, self.rows, self.max_value = array, np.asarray(rows, dtype=np.int64), max_value

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> Image.Image:
        image = self.array[self.rows[index]]
        if self.max_value != 255:
            image = np.round(image.astype(np.float32) * (255.0 / self.max_value)).astype(np.uint8)
        if image.shape[0] == 1:
            image = np.repeat(image, 3, axis=0)
        return Image.fromarray(np.ascontiguousarray(image.transpose(1, 2, 0)))


class FileImages:
    """Image files as RGB PIL images (any PIL mode converted)."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.paths = list(paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> Image.Image:
        path = self.paths[index]
        try:
            with Image.open(path) as image:
                return image.convert("RGB")
        except (OSError, ValueError) as err:
            raise ImageDataError(f"Cannot read image {str(path)!r} ({err}); replace or remove it.") from err


class DatasetImages:
    """The image column of a ``datasets.Dataset`` as RGB PIL images, decoded on access.

    The column is read with ``Image(decode=False)`` (a path or the encoded bytes per row),
    so nothing is decoded until a batch needs it, and ``stamps`` fingerprints the rows
    cheaply (file stamps, or a hash of the bytes).
    """

    def __init__(self, values: list[dict[str, Any]]) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int) -> Image.Image:
        value = self.values[index]
        source: Any = io.BytesIO(value["bytes"]) if value.get("bytes") is not None else value.get("path")
        try:
            with Image.open(source) as image:
                return image.convert("RGB")
        except (OSError, ValueError, AttributeError) as err:
            raise ImageDataError(f"Cannot read image {index} ({value.get('path')!r}: {err}); replace or"
                                 " remove it.") from err

    def stamps(self) -> list[str]:
        """A cheap fingerprint of each row (file stamp, or SHA-256 of the encoded bytes)."""
        from ripieno.datamodules.fingerprints import file_stamps

        return [hashlib.sha256(v["bytes"]).hexdigest() if v.get("bytes") is not None
                else file_stamps([v["path"]])[0] for v in self.values]


@dataclass
class ImageFolder:
    """An image folder's files, integer labels and class names (sorted folder names)."""

    paths: list[Path]
    labels: np.ndarray
    class_names: list[str]


def scan_image_folder(root: str | Path) -> ImageFolder:
    """List ``root/<class>/**/*`` images and check that every one opens.

    Raises:
        MissingImageDataError: ``root`` does not exist.
        ImageDataError: fewer than two class folders, class folders without images, or
            files that PIL cannot read (all listed in one message).
    """
    root = Path(root).expanduser()
    layout = f"{str(root)}/<class>/*{'|'.join(IMAGE_SUFFIXES)}"
    if not root.is_dir():
        raise MissingImageDataError(f"Image folder {str(root)!r} does not exist; expected {layout}.")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise ImageDataError(f"Image folder {str(root)!r} has {len(classes)} class folder(s) {classes};"
                             f" a classifier needs at least two: {layout}.")
    paths: list[Path] = []
    labels: list[int] = []
    empty = []
    for label, name in enumerate(classes):
        files = sorted(p for p in (root / name).rglob("*")
                       if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES and not p.name.startswith("."))
        if not files:
            empty.append(name)
        paths += files
        labels += [label] * len(files)
    if empty:
        raise ImageDataError(f"Class folder(s) {empty} under {str(root)!r} hold no images"
                             f" ({', '.join(IMAGE_SUFFIXES)}); add images or remove the folders.")
    bad = []
    for path in paths:
        try:
            with Image.open(path) as image:
                image.verify()
        except Exception as err:  # PIL raises many exception types for broken files
            bad.append(f"{path} ({type(err).__name__}: {err})")
    if bad:
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise ImageDataError(f"{len(bad)} unreadable image(s) under {str(root)!r}: {shown}. Replace or"
                             " remove them.")
    return ImageFolder(paths=paths, labels=np.asarray(labels, dtype=np.int64), class_names=classes)


# ---------------------------------------------------------------------------- dataset
class BackboneImageDataset(BatchDataset):
    """Images as dict batches ``{"pixel_values": float (B, 3, H, W), "y": long (B,)}``.

    Each batch is preprocessed by the backbone's processor in ``__getitems__``.
    """

    def __init__(self, images: ArrayImages | FileImages | DatasetImages, labels: Tensor,
                 preprocess: ImagePreprocessor) -> None:
        if len(images) != len(labels):
            raise ImageDataError(f"{len(images)} images but {len(labels)} labels.")
        self.images, self.labels, self.preprocess = images, labels, preprocess

    def __len__(self) -> int:
        return len(self.labels)

    def image(self, index: int) -> Image.Image:
        """The RGB image at ``index``, before preprocessing."""
        return self.images[index]

    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        pixels = self.preprocess([self.images[i] for i in indices])
        return {"pixel_values": pixels, "y": self.labels[torch.as_tensor(indices)]}


# ------------------------------------------------------------------------ datamodule
DEFAULT_SPLIT = SplitSettings(val_size=0.1, test_size=0.2)
DEFAULT_LOADER = LoaderSettings(batch_size=32, eval_batch_size=64)


class BackboneImageDataModule(SplitDataModule):
    """Train/val/test images preprocessed by a vision backbone's own processor.

    Batches are ``{"pixel_values": float (B, 3, H, W), "y": long (B,)}``; ``input_keys``
    is ``("pixel_values",)``. ``spec`` is a ``BackboneDataSpec``.

    Splits: sources with an official test split (``fashion_mnist``, torchvision roots)
    keep it; the others (``mnist_5k``, ``digits``, image folders) first lose ``split.test_size``
    of their rows to a stratified test split. ``max_train_rows`` caps the rest (train +
    validation, stratified), of which ``split.val_size`` is validation. All seeded by
    ``split.seed``.

    Args:
        dataset: a source of ``ripieno.datamodules.images.SOURCES`` (``fashion_mnist``,
            ``mnist_5k``, ``digits``, ...), or ``folder`` (or ``None`` with ``root``) for
            an image folder.
        root: the image folder ``root/<class>/*.png|jpg`` for ``folder``; for a named
            source, its files' folder as in ``ImageDataModule``.
        model_dir: local folder of the backbone with its image preprocessing (Hugging
            Face ``save_pretrained`` with ``preprocessor_config.json``, or timm
            ``save_for_hf``); ``ripieno.framework.backbones.small_models`` builds random ones.
        data_files: local images for ``datasets.load_dataset("imagefolder", data_files=...)``
            (labels from parent folder names); ``dataset`` may instead be a ``save_to_disk``
            folder with an ``Image`` column. Images are decoded by PIL when a batch needs them.
        builder: ``imagefolder`` (with ``data_files``).
        image_column: the ``Image`` column of a ``datasets`` source.
        label_column: the label column of a ``datasets`` source (``ClassLabel`` or strings).
        split: how the rows are split (``SplitSettings``: ``policy``, ``official`` or ``resplit``
            for a ``datasets`` source; ``val_size``; ``test_size``; ``seed``, which also seeds the
            training order); default ``SplitSettings(val_size=0.1, test_size=0.2)``.
        loader: how the splits are served (``LoaderSettings``: ``batch_size``, ``eval_batch_size``
            of validation, test and predict, ``num_workers``); default ``LoaderSettings(batch_size=32,
            eval_batch_size=64)``.
        max_train_rows: optional cap on the training pool (train + validation).
        **moved: the flat arguments of earlier releases (``batch_size=``, ``split_seed=``, ...): each
            still works, with a ``RipienoDeprecationWarning`` naming its place in ``split`` or
            ``loader``.
    """

    input_keys: tuple[str, ...] = ("pixel_values",)

    #: This DataModule's defaults of the shared groups (``data_settings``).
    DEFAULT_SPLIT: ClassVar[SplitSettings] = DEFAULT_SPLIT
    DEFAULT_LOADER: ClassVar[LoaderSettings] = DEFAULT_LOADER
    #: The flat arguments of earlier releases and their place in ``split`` or ``loader``.
    MOVED_ARGUMENTS: ClassVar[dict[str, str]] = MOVED_ARGUMENTS

    def __init__(
        self,
        dataset: str | None = None,
        root: str | None = None,
        model_dir: str | None = None,
        data_files: str | list[str] | dict[str, Any] | None = None,
        builder: Literal["imagefolder"] | None = None,
        image_column: str = "image",
        label_column: str = "label",
        max_train_rows: int | None = None,
        split: SplitSettings = DEFAULT_SPLIT,
        loader: LoaderSettings = DEFAULT_LOADER,
        **moved: Any,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self._take_settings(split, loader, moved)
        self._preprocessor: ImagePreprocessor | None = None

    @property
    def spec(self) -> BackboneDataSpec:
        """The data's spec; prepares (loads, checks, splits) on first use."""
        return super().spec

    @property
    def preprocessor(self) -> ImagePreprocessor:
        """The backbone's image preprocessing, loaded from ``model_dir``."""
        if self._preprocessor is None:
            self._preprocessor = ImagePreprocessor(self.hparams.model_dir)
        return self._preprocessor

    def input_fingerprint(self, split: str) -> str:
        """The split's images (file stamps, or the raw array rows) and the processor's config."""
        from ripieno.datamodules.fingerprints import Fingerprint, file_stamps

        data = self._split(split)
        images, fingerprint = data.images, Fingerprint("image")
        if isinstance(images, FileImages):
            fingerprint.add(file_stamps(images.paths))
        elif isinstance(images, DatasetImages):
            fingerprint.add(images.stamps())
        else:
            fingerprint.add(images.array[images.rows]).add(images.max_value)
        return fingerprint.add(data.labels.numpy()).add(self.preprocessor.config_string()).hexdigest()

    def _is_hf_source(self) -> bool:
        hp = self.hparams
        return hp.data_files is not None or (hp.dataset not in (*IMAGE_SOURCES, FOLDER, None)
                                             and is_saved_dataset(hp.dataset))

    def _hf_parts(self) -> tuple[dict[str, tuple[DatasetImages, np.ndarray]], list[str], list[str]]:
        """A ``datasets`` source: ``({split: (images, labels)}, class_names, splits to carve)``."""
        hp = self.hparams
        parts = load_hf_splits(hp.dataset, hp.data_files, hp.builder, error=ImageDataError)
        policy = self.split_settings.policy
        mapped, carve = resolve_splits(parts, policy, "BackboneImageDataModule", ImageDataError)
        import datasets

        out: dict[str, tuple[DatasetImages, np.ndarray]] = {}
        feature = mapped["train"].features.get(hp.label_column)
        names = list(getattr(feature, "names", None) or [])
        if not names:
            names = sorted({str(v) for v in mapped["train"][hp.label_column]})
        for split, part in mapped.items():
            missing = [c for c in (hp.image_column, hp.label_column) if c not in part.column_names]
            if missing:
                raise ImageDataError(f"The {split} split has no column(s) {missing} (columns:"
                                     f" {part.column_names}); set data.image_column and data.label_column.")
            part = part.cast_column(hp.image_column, datasets.Image(decode=False))
            raw = part[hp.label_column]
            labels = [names[int(v)] if getattr(feature, "names", None) else str(v) for v in raw]
            unseen = sorted(set(labels) - set(names))
            if unseen:
                raise ImageDataError(f"The {split} split has labels {unseen} that the train split never has.")
            index = {c: i for i, c in enumerate(names)}
            out[split] = (DatasetImages(list(part[hp.image_column])),
                          np.asarray([index[c] for c in labels], dtype=np.int64))
        return out, names, carve

    def _check_args(self) -> None:
        hp = self.hparams
        check_split_args(self.split_settings, self.loader_settings, hp, ImageDataError)
        if not self._is_hf_source():
            check_source_choice(hp.dataset, hp.root, sorted(IMAGE_SOURCES), "image",
                                "root/<class>/*.png|jpg.", ImageDataError)

    def _prepare(self) -> None:
        hp = self.hparams
        self._check_args()
        preprocess = self.preprocessor
        cut = self.split_settings
        seed = cut.seed
        if self._is_hf_source():
            hf_parts, class_names, _ = self._hf_parts()
            name = str(hp.dataset)
            values = [v for split in hf_parts for v in hf_parts[split][0].values]
            all_y = np.concatenate([hf_parts[split][1] for split in hf_parts])
            offsets = np.cumsum([0, *(len(hf_parts[split][1]) for split in hf_parts)])
            official = {split: np.arange(offsets[i], offsets[i + 1]) for i, split in enumerate(hf_parts)}
            rows = official_split_rows(all_y, official, cut.val_size, cut.test_size, seed, hp.max_train_rows,
                                       error=ImageDataError)
            parts = {split: (DatasetImages([values[i] for i in r]), all_y[r]) for split, r in rows.items()}
        elif hp.dataset in (None, FOLDER):
            folder = scan_image_folder(hp.root)
            rows = seeded_splits(folder.labels, cut.val_size, cut.test_size, seed, hp.max_train_rows,
                                 error=ImageDataError)
            class_names, name = folder.class_names, str(Path(hp.root).expanduser())
            parts = {split: (FileImages([folder.paths[i] for i in r]), folder.labels[r])
                     for split, r in rows.items()}
        else:
            raw = load_source(hp.dataset, hp.root)
            official_test = raw.test_x is not None
            rows = seeded_splits(raw.train_y, cut.val_size, None if official_test else cut.test_size, seed,
                                 hp.max_train_rows, error=ImageDataError)
            class_names, name = list(raw.class_names), hp.dataset
            parts = {split: (ArrayImages(raw.train_x, r, raw.max_value), raw.train_y[r])
                     for split, r in rows.items()}
            if official_test:
                test_rows = np.arange(len(raw.test_y))
                parts["test"] = (ArrayImages(raw.test_x, test_rows, raw.max_value), raw.test_y)
        self._splits = {split: BackboneImageDataset(images, torch.as_tensor(np.array(y, dtype=np.int64)),
                                                    preprocess)
                        for split, (images, y) in parts.items()}
        self._spec = BackboneDataSpec(
            n_classes=len(class_names), class_names=class_names, n_train=len(self._splits["train"]),
            n_val=len(self._splits["val"]), n_test=len(self._splits["test"]), dataset=name,
            input_keys=list(self.input_keys), model_dir=preprocess.model_dir, modality="image",
        )
