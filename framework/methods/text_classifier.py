"""TextClassifier: GPT-2 with a classification head, for the uncertainty experiments.

Loads a ``GPT2Model`` from a local ``save_pretrained`` directory (the path real weights
take; nothing is downloaded), or builds a small GPT-2 from a config with random weights
when no directory is given (no GPT-2 weights ship offline). The hidden state of the last
non-padding token goes through dropout and ``head`` (an ``nn.Linear``): pooling happens
before the head, so ``LastLayerSampler`` sees one feature vector per text.
Batches are ``{"input_ids", "attention_mask", "y"}`` (``ripieno.datamodules.TextDataModule``);
the model input is the dict of the first two.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from ripieno.framework.methods.member_module import MemberModule
from ripieno.framework.text_spec import TextSpec

INPUT_KEYS = ("input_ids", "attention_mask")


class TextClassifier(MemberModule):
    """GPT-2 sequence classifier (last non-padding token -> linear head).

    Logs the ``MemberModule`` metrics (``{val,test}/accuracy``, ``/nll``, ``/ece``, ...).

    Args:
        data_spec: the data's ``TextSpec`` (or dict); linked from ``data.spec`` by the CLI.
        pretrained_dir: a local directory saved with ``save_pretrained`` (GPT-2 family), or
            ``None`` to build a small random GPT-2 from ``n_layer``/``n_head``/``n_embd``.
        n_layer: layers of the built model.
        n_head: attention heads of the built model.
        n_embd: width of the built model.
        dropout: dropout of the built model (residual, embedding and attention).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
    """

    task = "multiclass"

    def __init__(
        self,
        data_spec: TextSpec | dict[str, Any],
        pretrained_dir: str | None = None,
        n_layer: int = 2,
        n_head: int = 2,
        n_embd: int = 64,
        dropout: float = 0.1,
        lr: float = 1e-3,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__()
        spec = TextSpec.coerce(data_spec)
        data_spec = spec.to_dict()
        self.save_hyperparameters()
        self.spec = spec
        from transformers import GPT2Config, GPT2Model

        if pretrained_dir is not None:
            if not os.path.isdir(pretrained_dir):
                raise FileNotFoundError(
                    f"pretrained_dir {pretrained_dir!r} does not exist; give a folder written by"
                    " save_pretrained, or leave it unset to build a small random GPT-2."
                )
            self.backbone = GPT2Model.from_pretrained(pretrained_dir, local_files_only=True)
        else:
            config = GPT2Config(
                n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=spec.vocab_size,
                n_positions=spec.max_length, pad_token_id=spec.pad_token_id,
                resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
            )
            self.backbone = GPT2Model(config)
            rank_zero_info(f"TextClassifier: built a random GPT-2 ({n_layer} layers, width {n_embd});"
                           " no pretrained GPT-2 weights exist offline.")
        if self.backbone.config.vocab_size < spec.vocab_size:
            raise ValueError(f"The model's vocabulary ({self.backbone.config.vocab_size}) is smaller than"
                             f" the tokenizer's ({spec.vocab_size}); use the model's own tokenizer.")
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(self.backbone.config.n_embd, spec.n_classes)
        self.init_members("logits", spec.n_classes)

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        """Logits ``(B, C)`` from right-padded ``{"input_ids", "attention_mask"}``."""
        mask = inputs["attention_mask"]
        hidden = self.backbone(input_ids=inputs["input_ids"], attention_mask=mask).last_hidden_state
        last = (mask.sum(1) - 1).clamp_min(0)  # the last real token of each text
        pooled = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        return self.head(self.dropout(pooled))

    def forward_members(self, batch: dict[str, Tensor]) -> Tensor:
        """Logits as one member, ``(B, 1, C)``."""
        return self({k: batch[k] for k in INPUT_KEYS})[:, None]
