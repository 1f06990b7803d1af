"""What an image model must know about its data, passed from datamodule to module.

Lives in ``framework`` (like ``TabularSpec``) so that modules can size themselves from
it without importing ``datamodules``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ripieno.framework.specs.base import DataSpec


@dataclass
class ImageSpec(DataSpec):
    """What an image model must know about its data, passed from datamodule to module.

    Attributes:
        n_classes: number of classes; labels are ``0 .. n_classes - 1``.
        image_shape: ``(C, H, W)`` of every image (ID and OOD alike).
        class_names: class labels in code order.
        n_train: training images.
        n_val: validation images.
        n_test: ID test images.
        dataset: name of the ID source.
        ood_dataset: name of the OOD source, or ``None``.
        n_ood: OOD images (0 without an OOD source).
        mean: per-channel training mean in ``[0, 1]`` units when normalising, else ``None``.
        std: per-channel training standard deviation when normalising, else ``None``.
    """

    n_classes: int
    image_shape: tuple[int, int, int]
    class_names: list[str]
    n_train: int
    n_val: int
    n_test: int
    dataset: str
    ood_dataset: str | None = None
    n_ood: int = 0
    mean: list[float] | None = None
    std: list[float] | None = None

    def __post_init__(self) -> None:
        """Check the invariants a model relies on."""
        self.image_shape = tuple(int(s) for s in self.image_shape)  # type: ignore[assignment]
        if len(self.image_shape) != 3:
            raise ValueError(f"image_shape must be (C, H, W), got {self.image_shape}.")
        if self.n_classes < 2 or len(self.class_names) != self.n_classes:
            raise ValueError(
                f"n_classes={self.n_classes} needs >= 2 classes and as many class_names"
                f" (got {len(self.class_names)})."
            )

    @property
    def in_channels(self) -> int:
        """Image channels (1 for grey, 3 for RGB)."""
        return self.image_shape[0]
