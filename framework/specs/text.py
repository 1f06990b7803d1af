"""What a text model must know about its data, passed from datamodule to module.

Lives in ``framework`` (like ``ImageSpec``) so that modules can size themselves from it
without importing ``datamodules``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ripieno.framework.specs.base import DataSpec


@dataclass
class TextSpec(DataSpec):
    """What a text model must know about its data, passed from datamodule to module.

    Attributes:
        n_classes: number of classes; labels are ``0 .. n_classes - 1``.
        class_names: class labels in code order.
        max_length: most tokens per sequence (longer texts are truncated; batches may be shorter).
        vocab_size: size of the tokenizer's vocabulary, added tokens included (an
            embedding table of this many rows covers every id).
        pad_token_id: id used for padding (the end-of-text token for GPT-2-style tokenizers).
        tokenizer_dir: local Hugging Face tokenizer directory (``AutoTokenizer.from_pretrained``).
        n_train: training texts.
        n_val: validation texts.
        n_test: test texts.
        dataset: name of the source (shipped name or file path).
    """

    n_classes: int
    class_names: list[str]
    max_length: int
    vocab_size: int
    pad_token_id: int
    tokenizer_dir: str
    n_train: int
    n_val: int
    n_test: int
    dataset: str

    def __post_init__(self) -> None:
        """Check the invariants a model relies on."""
        self.class_names = [str(c) for c in self.class_names]
        if self.n_classes < 2 or len(self.class_names) != self.n_classes:
            raise ValueError(
                f"n_classes={self.n_classes} needs >= 2 classes and as many class_names"
                f" (got {len(self.class_names)})."
            )
        if self.max_length < 1:
            raise ValueError(f"max_length must be positive, got {self.max_length}.")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id={self.pad_token_id} is outside the vocabulary (size"
                             f" {self.vocab_size}).")
