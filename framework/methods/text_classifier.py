"""TextClassifier: any Hugging Face text backbone with a classification head.

Loads the backbone with ``AutoModel.from_pretrained(pretrained_dir, local_files_only=True)``
from a local ``save_pretrained`` folder, so encoders (BERT, RoBERTa, MiniLM, ...) and
decoders (GPT-2, Llama-family, ...) load alike and nothing is downloaded; without a folder
it builds a small GPT-2 from a config with random weights (no GPT-2 weights ship offline).
The backbone's last hidden states are pooled to one vector per text, which goes through
dropout and ``head`` (an ``nn.Linear``): pooling happens before the head, so
``LastLayerSampler`` sees one feature vector per text.

Pooling (``pooling``):

* ``cls``: the first position (the ``[CLS]`` / ``<s>`` token of encoders);
* ``mean``: the mean over real tokens (``attention_mask == 1``), the sentence-embedding
  convention of MiniLM-style models;
* ``last``: the last real token of each text, wherever the padding is (left or right);
* ``auto`` (default): ``last`` for decoder-only models and ``cls`` for the rest, the same
  choice as Hugging Face's own ``*ForSequenceClassification`` heads (GPT-2 and Llama score
  the last non-padding token, BERT and RoBERTa the first token). A model counts as
  decoder-only when its ``model_type`` has a causal-LM class in ``transformers`` and no
  masked-LM class (BERT and RoBERTa have both and count as encoders).

Batches are ``{"input_ids", "attention_mask", "y"}`` (``ripieno.datamodules.TextDataModule``);
the model input is the dict of the first two.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor, nn
from typing_extensions import override

from ripieno.framework.backbones.model_folder import ModelFolderError, check_model_folder
from ripieno.framework.errors import RipienoInputError, file_problem
from ripieno.framework.extras import require
from ripieno.framework.messages import get_logger
from ripieno.framework.methods.member_module import MemberModule
from ripieno.framework.specs.text import TextSpec

log = get_logger(__name__)


INPUT_KEYS = ("input_ids", "attention_mask")
TextPooling = Literal["auto", "cls", "mean", "last"]
TEXT_POOLINGS: tuple[str, ...] = ("auto", "cls", "mean", "last")


class TextModelError(RipienoInputError):
    """A ``TextClassifier`` setting that cannot work with this data (one line: the setting, why, the fix)."""


def is_decoder_only(config: Any) -> bool:  # noqa: ANN401
    """Whether a Hugging Face config describes a decoder-only (causal) language model.

    Args:
        config: a ``PretrainedConfig``.

    Returns:
        ``True`` when ``config.model_type`` has a causal-LM class in ``transformers`` and
        no masked-LM class, or the config says ``is_decoder``.

    Example:
        >>> from transformers import BertConfig, GPT2Config
        >>> is_decoder_only(GPT2Config()), is_decoder_only(BertConfig())
        (True, False)
    """
    require("text", "transformers", "TextClassifier")
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    if getattr(config, "is_encoder_decoder", False):
        return False
    model_type = getattr(config, "model_type", None)
    if bool(getattr(config, "is_decoder", False)):
        return True
    causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return causal and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES


def resolve_pooling(pooling: str, config: Any) -> str:  # noqa: ANN401
    """The pooling ``auto`` stands for with this config (module docstring); others pass through.

    Raises:
        TextModelError: for an unknown pooling name (a ``ValueError``).
    """
    if pooling not in TEXT_POOLINGS:
        raise TextModelError(f"Unknown pooling {pooling!r}; choose one of {TEXT_POOLINGS}.")
    if pooling != "auto":
        return pooling
    return "last" if is_decoder_only(config) else "cls"


def pool_tokens(hidden: Tensor, mask: Tensor, pooling: str) -> Tensor:
    """Pool ``(B, T, D)`` hidden states to ``(B, D)`` with a ``(B, T)`` mask of real tokens.

    ``last`` finds the last position whose mask is 1, so left and right padding both work.

    Example:
        >>> h = torch.arange(12.0).view(1, 4, 3)
        >>> m = torch.tensor([[0, 1, 1, 0]])  # left and right padding
        >>> pool_tokens(h, m, "last").tolist(), pool_tokens(h, m, "mean").tolist()
        ([[6.0, 7.0, 8.0]], [[4.5, 5.5, 6.5]])
    """
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "mean":
        weights = mask.to(hidden.dtype).unsqueeze(-1)
        return (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)
    if pooling == "last":
        length = mask.shape[1]
        last = length - 1 - mask.flip(1).argmax(1)  # the last 1 of each row
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"Unknown pooling {pooling!r}; choose one of {TEXT_POOLINGS[1:]}.")


PRETRAINED_FIX = ("give pretrained_dir a complete folder written by a Hugging Face model's save_pretrained,"
                  " or leave it unset to build a small random GPT-2")


def load_text_backbone(pretrained_dir: str) -> nn.Module:
    """``AutoModel`` from a local ``save_pretrained`` folder, with errors that name the fix.

    The folder is checked first (``ripieno.framework.backbones.model_folder.check_model_folder``), so one
    that cannot load fails with one line naming it, the problem and the fix.

    Raises:
        MissingModelFolderError: the folder, its ``config.json`` or its weights are missing
            (a ``FileNotFoundError``).
        ModelFolderError: a corrupt ``config.json`` or weights file, or an encoder-decoder
            model (T5, BART), whose ``AutoModel`` needs decoder inputs: load its encoder with
            ``.get_encoder()`` in your own module instead.
    """
    require("text", "transformers", "TextClassifier")
    from transformers import AutoConfig, AutoModel

    check_model_folder(pretrained_dir, PRETRAINED_FIX)
    config = AutoConfig.from_pretrained(pretrained_dir, local_files_only=True)
    if getattr(config, "is_encoder_decoder", False):
        raise ModelFolderError(file_problem(
            pretrained_dir, f"holds an encoder-decoder model ({config.model_type}), and TextClassifier takes"
            " encoders or decoder-only models", "give pretrained_dir an encoder (BERT, MiniLM, ...) or a"
            " decoder-only model (GPT-2, Llama, ...)"))
    return AutoModel.from_pretrained(pretrained_dir, local_files_only=True)


class TextClassifier(MemberModule):
    """Sequence classifier: a Hugging Face backbone, pooled hidden states, a linear head.

    Logs the ``MemberModule`` metrics (``{val,test}/accuracy``, ``/nll``, ``/ece``, ...).

    Args:
        data_spec: the data's ``TextSpec`` (or dict); linked from ``data.spec`` by the CLI.
        pretrained_dir: a local directory saved with ``save_pretrained`` (any text model
            ``AutoModel`` loads: encoder or decoder-only), or ``None`` to build a small
            random GPT-2 from ``n_layer``/``n_head``/``n_embd``.
        pooling: ``auto``, ``cls``, ``mean`` or ``last`` (module docstring).
        n_layer: layers of the built model.
        n_head: attention heads of the built model.
        n_embd: width of the built model.
        dropout: dropout before the head, and of the built model (residual, embedding and
            attention).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
    """

    task = "multiclass"

    def __init__(
        self,
        data_spec: TextSpec | dict[str, Any],
        pretrained_dir: str | None = None,
        pooling: TextPooling = "auto",
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
        if pooling not in TEXT_POOLINGS:
            raise TextModelError(f"Unknown pooling {pooling!r} (model.init_args.pooling); choose one of"
                                 f" {TEXT_POOLINGS}.")
        self.save_hyperparameters()
        self.spec = spec
        if pretrained_dir is not None:
            # from_pretrained hands back eval mode and Lightning keeps the modes it finds:
            # without train() the backbone's dropout would stay off while fine-tuning.
            self.backbone = load_text_backbone(pretrained_dir).train()
        else:
            require("text", "transformers", "TextClassifier")
            from transformers import GPT2Config, GPT2Model

            config = GPT2Config(
                n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=spec.vocab_size,
                n_positions=spec.max_length, pad_token_id=spec.pad_token_id,
                resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
            )
            self.backbone = GPT2Model(config)
            log.info(f"TextClassifier: built a random GPT-2 ({n_layer} layers, width {n_embd});"
                     " no pretrained GPT-2 weights exist offline.")
        config = self.backbone.config
        if config.vocab_size < spec.vocab_size:
            raise TextModelError(file_problem(
                pretrained_dir, f"the model's vocabulary ({config.vocab_size} tokens) is smaller than the"
                f" tokenizer's ({spec.vocab_size} tokens, {spec.tokenizer_dir})", "use the model's own"
                f" tokenizer: --data.init_args.tokenizer_dir={pretrained_dir}"
                " --data.init_args.build_tokenizer=false"))
        self.pooling = resolve_pooling(pooling, config)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(config.hidden_size, spec.n_classes)
        self.init_members("logits", spec.n_classes)

    @override
    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        """Logits ``(B, C)`` from padded ``{"input_ids", "attention_mask"}``."""
        mask = inputs["attention_mask"]
        hidden = self.backbone(input_ids=inputs["input_ids"], attention_mask=mask).last_hidden_state
        return self.head(self.dropout(pool_tokens(hidden, mask, self.pooling)))

    def forward_members(self, batch: dict[str, Tensor]) -> Tensor:
        """Logits as one member, ``(B, 1, C)``."""
        return self({k: batch[k] for k in INPUT_KEYS})[:, None]
