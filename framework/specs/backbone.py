"""What a backbone-based module must know about its data, passed from datamodule to module.

Shared by the vision and audio backbone datamodules (``ripieno.datamodules.vision_backbone``
re-exports it); lives in ``framework`` so modules size themselves without importing
``datamodules``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ripieno.framework.specs.base import DataSpec, DataSpecError


@dataclass
class BackboneDataSpec(DataSpec):
    """Classes, split sizes and model inputs of a backbone data set.

    Attributes:
        n_classes: number of classes; labels are ``0 .. n_classes - 1``.
        class_names: class labels in code order.
        n_train: training rows.
        n_val: validation rows.
        n_test: test rows.
        dataset: name of the source (shipped name or folder path).
        input_keys: the model's input tensors in every batch (``y`` excluded).
        model_dir: local folder of the backbone and its preprocessing config.
        modality: ``image`` or ``audio``.
        sampling_rate: audio samples per second fed to the model (``None`` for images).

    Example:
        >>> spec = BackboneDataSpec(2, ["cat", "dog"], 8, 2, 2, "pets", input_keys=["pixel_values"])
        >>> BackboneDataSpec.coerce(spec.to_dict()) == spec
        True
    """

    n_classes: int
    class_names: list[str]
    n_train: int
    n_val: int
    n_test: int
    dataset: str
    input_keys: list[str] = field(default_factory=list)
    model_dir: str = ""
    modality: str = "image"
    sampling_rate: int | None = None

    def __post_init__(self) -> None:
        """Check the invariants a model relies on."""
        self.class_names = [str(c) for c in self.class_names]
        self.input_keys = [str(k) for k in self.input_keys]
        if self.n_classes < 2 or len(self.class_names) != self.n_classes:
            raise DataSpecError(f"n_classes={self.n_classes} needs >= 2 classes and as many class_names"
                                f" (got {len(self.class_names)}).")
        if not self.input_keys or "y" in self.input_keys:
            raise DataSpecError(f"input_keys must name the model inputs (not 'y'), got {self.input_keys}.")
        if self.modality not in ("image", "audio"):
            raise DataSpecError(f"modality must be 'image' or 'audio', got {self.modality!r}.")
