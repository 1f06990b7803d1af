"""What a fusion head must know about its layer features, passed from datamodule to module."""

from __future__ import annotations

from dataclasses import dataclass, field

from ripieno.framework.specs.base import DataSpec


@dataclass
class LayerFeatureSpec(DataSpec):
    """The selected layers of a backbone and the classification task on top of them.

    Attributes:
        n_classes: number of classes; labels are ``0 .. n_classes - 1``.
        class_names: class labels in code order.
        n_layers: hidden states of the backbone (embeddings + blocks).
        d_model: width of the hidden states (the widest, when they differ).
        selected_layers: chosen hidden-state indices, in selection order.
        selection: the rule that chose them (``loes``, ``last``, ``best_single``, ...).
        pooling: ``cls``, ``mean`` or ``last``.
        backbone_dir: local directory of the backbone.
        input_keys: the backbone's input tensors in a raw batch.
        finetune_backbone: whether batches carry backbone inputs (fine-tuning) instead of
            cached features.
        n_train: training rows.
        n_val: validation rows.
        n_test: test rows.
        dataset: name of the data source.
        layer_dims: widths of the selected layers, in selection order, when the backbone's
            layers differ in width (a CNN's stages; batches zero-pad them to ``d_model``);
            empty when every layer is ``d_model`` wide.
        layer_names: the submodules whose outputs are the layers (forward hooks), or empty
            for the backbone's own hidden states.
    """

    n_classes: int
    class_names: list[str]
    n_layers: int
    d_model: int
    selected_layers: list[int]
    selection: str
    pooling: str
    backbone_dir: str
    input_keys: list[str] = field(default_factory=list)
    finetune_backbone: bool = False
    n_train: int = 0
    n_val: int = 0
    n_test: int = 0
    dataset: str = ""
    layer_dims: list[int] = field(default_factory=list)
    layer_names: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        """Check the invariants a head relies on."""
        self.selected_layers = [int(i) for i in self.selected_layers]
        if self.n_classes < 2 or len(self.class_names) != self.n_classes:
            raise ValueError(f"n_classes={self.n_classes} needs >= 2 classes and as many class_names"
                             f" (got {len(self.class_names)}).")
        if not self.selected_layers or not all(0 <= i < self.n_layers for i in self.selected_layers):
            raise ValueError(f"selected_layers {self.selected_layers} must be non-empty indices below"
                             f" n_layers={self.n_layers}.")
        self.layer_dims = [int(d) for d in self.layer_dims]
        if self.layer_dims and (len(self.layer_dims) != len(self.selected_layers)
                                or not all(0 < d <= self.d_model for d in self.layer_dims)):
            raise ValueError(f"layer_dims {self.layer_dims} must give one width <= d_model={self.d_model}"
                             f" per selected layer ({len(self.selected_layers)}).")
