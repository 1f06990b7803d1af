"""The tabular ensemble network: feature embeddings, an ensemble MLP and member heads.

One class covers LoMETab, TabM, TabM-mini, the additive ablation, a plain MLP
(``k=1``, ``adapter="shared"``) and a deep ensemble (``adapter="packed"`` with
per-member embeddings): only the adapter of each hidden layer changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from ripieno.framework.nn.embeddings import OneHotEncoding, PiecewiseLinearEmbeddings
from ripieno.framework.nn.ensemble_linear import (
    ADAPTERS,
    DEFAULT_ADAPTER_INIT,
    Adapter,
    AdapterInit,
    Compute,
    EnsembleLinear,
    ScalingInit,
    check_adapter_init,
    init_scaling_,
)

AdapterLayers = Literal["all", "first", "mini"]


class TabularEnsembleNet(nn.Module):
    """K-member MLP over numeric and categorical features.

    Numeric features go through piecewise-linear embeddings when ``bins`` is given
    (otherwise they enter as they are); categorical codes are one-hot encoded. The
    flattened features are shared by all members (TabM's ``EnsembleView``), pass
    ``n_blocks`` x (EnsembleLinear -> ReLU -> Dropout) and a per-member linear head.

    Args:
        n_num_features: number of numeric columns.
        cat_cardinalities: categories per categorical column.
        d_out: outputs per member (classes, 1 for binary or regression).
        k: number of members.
        adapter: adapter of the hidden layers (see ``EnsembleLinear``).
        adapter_layers: ``all`` hidden layers, or the ``first`` only (TabM-mini style:
            later layers are shared).
        n_blocks: number of hidden layers.
        d_block: width of the hidden layers.
        dropout: dropout after each hidden layer.
        rank: adapter rank (``lometab``/``additive``).
        sigma_init: adapter init scale (``lometab``/``additive``).
        bins: bin edges per numeric feature for piecewise-linear embeddings, or ``None``.
        d_embedding: numeric embedding size when ``bins`` is given.
        share_embeddings: one embedding for all members (``False``: one per member, as
            a deep ensemble needs).
        rank1_init: initialisation of the first layer's ``r`` (TabM: ``normal`` with
            embeddings, ``random-signs`` without); later ``r``, ``s`` start at ones.
        compute: evaluation order for ``lometab`` (``auto``/``factored``/``materialized``).
        adapter_init: draw of ``A_k``, ``B_k`` (``lometab``/``additive``, see
            ``EnsembleLinear``): ``plain`` (default, the paper's: ``A_k B_k^T`` entries have
            std ``sqrt(rank) * sigma_init**2``), ``rank_normalized`` (``lometab``: std
            ``sigma_init`` for every rank) or ``relative`` (``additive``: ``sigma_init``
            times ``W``'s std).

    Shape:
        - Input: ``x_num`` ``(B, n_num_features)`` (float) and ``x_cat`` ``(B, n_cat)`` (``int64``
          codes); either may be ``None`` when the table has no such column.
        - Output: ``(B, K, d_out)``: batch, members (``k``), outputs.

    Example:
        >>> net = TabularEnsembleNet(3, [4], d_out=2, k=5, d_block=8, adapter_init="rank_normalized")
        >>> net(torch.randn(7, 3), torch.zeros(7, 1, dtype=torch.long)).shape
        torch.Size([7, 5, 2])
    """

    def __init__(
        self,
        n_num_features: int,
        cat_cardinalities: Sequence[int],
        d_out: int,
        k: int = 8,
        adapter: Adapter = "lometab",
        adapter_layers: AdapterLayers = "all",
        n_blocks: int = 2,
        d_block: int = 256,
        dropout: float = 0.1,
        rank: int = 4,
        sigma_init: float = 0.3,
        bins: Sequence[Tensor] | None = None,
        d_embedding: int = 16,
        share_embeddings: bool = True,
        rank1_init: ScalingInit = "normal",
        compute: Compute = "auto",
        adapter_init: AdapterInit = DEFAULT_ADAPTER_INIT,
    ) -> None:
        super().__init__()
        if adapter not in ADAPTERS:
            raise ValueError(f"Unknown adapter {adapter!r}; choose one of {ADAPTERS}.")
        check_adapter_init(adapter, adapter_init)  # also when no layer ends up adapted (mini)
        if adapter_layers not in ("all", "first", "mini"):
            raise ValueError(f"adapter_layers must be 'all', 'first' or 'mini', got {adapter_layers!r}.")
        if n_num_features + len(cat_cardinalities) == 0:
            raise ValueError("The network needs at least one numeric or categorical feature.")
        if n_blocks < 1:
            raise ValueError(f"n_blocks must be >= 1, got {n_blocks}.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}.")
        self.k = k
        self.num_embeddings: PiecewiseLinearEmbeddings | None = None
        if bins is not None and n_num_features > 0:
            if len(bins) != n_num_features:
                raise ValueError(f"Got bins for {len(bins)} features but {n_num_features} numeric.")
            self.num_embeddings = PiecewiseLinearEmbeddings(
                bins, d_embedding, k=None if share_embeddings else k
            )
            d_num, chunks = n_num_features * d_embedding, [d_embedding] * n_num_features
        else:
            d_num, chunks = n_num_features, [1] * n_num_features
        self.cat_encoding = OneHotEncoding(cat_cardinalities) if cat_cardinalities else None
        d_cat = self.cat_encoding.d_out if self.cat_encoding is not None else 0
        chunks = chunks + list(cat_cardinalities)

        layers: list[nn.Module] = []
        d_in = d_num + d_cat
        self.input_scaling: nn.Parameter | None = None
        if adapter_layers == "mini":
            self.input_scaling = nn.Parameter(torch.empty(k, d_in))
            init_scaling_(self.input_scaling, rank1_init, chunks)
        for i in range(n_blocks):
            if adapter_layers == "mini":
                layer_adapter: Adapter = "shared"
            else:
                layer_adapter = adapter if (adapter_layers == "all" or i == 0) else "shared"
            first_init: ScalingInit = rank1_init if i == 0 else "ones"
            layers += [
                EnsembleLinear(
                    d_in, d_block, k, adapter=layer_adapter, rank=rank, sigma_init=sigma_init,
                    rank1_init=(first_init, "ones"), rank1_chunks=chunks if i == 0 else None,
                    compute=compute, adapter_init=adapter_init,
                ),
                nn.ReLU(),
                nn.Dropout(dropout),
            ]
            d_in = d_block
        self.blocks = nn.Sequential(*layers)
        self.head = EnsembleLinear(d_block, d_out, k, adapter="packed")

    def forward(self, x_num: Tensor | None, x_cat: Tensor | None) -> Tensor:
        """Return member outputs ``(B, k, d_out)``."""
        parts: list[Tensor] = []
        if x_num is not None and x_num.shape[-1] > 0:
            if self.num_embeddings is None:
                parts.append(x_num[:, None, :].expand(-1, self.k, -1))
            else:
                emb = self.num_embeddings(x_num)  # (B, F, d) or (B, k, F, d)
                emb = emb.flatten(-2)
                parts.append(emb if emb.ndim == 3 else emb[:, None, :].expand(-1, self.k, -1))
        if self.cat_encoding is not None and x_cat is not None:
            parts.append(self.cat_encoding(x_cat)[:, None, :].expand(-1, self.k, -1))
        x = torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]
        if self.input_scaling is not None:
            x = x * self.input_scaling
        return self.head(self.blocks(x))
