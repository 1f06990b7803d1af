"""Feature encodings for tabular data: piecewise-linear numeric embeddings and one-hot.

The piecewise-linear encoding (PLE, Gorishniy et al. 2022) and its "version B"
embedding (used by TabM) follow ``rtdl_num_embeddings`` exactly on the same bins (a
test checks it). We keep our own copy because the embedding needs an optional member
axis (independent embeddings per member for deep ensembles), which that package lacks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

BinKind = Literal["quantile", "tree"]


def compute_bins(
    x: np.ndarray,
    n_bins: int,
    kind: BinKind = "quantile",
    y: np.ndarray | None = None,
    regression: bool | None = None,
    feature_names: Sequence[str] | None = None,
    tree_kwargs: dict | None = None,
) -> list[Tensor]:
    """Compute bin edges per numeric feature from training data.

    Quantile bins are the unique values among the ``n_bins + 1`` quantiles of each
    column; tree bins are the split thresholds of a decision tree with ``n_bins`` leaves
    fit to the target (plus the column's minimum and maximum), as in
    ``rtdl_num_embeddings.compute_bins``.

    Args:
        x: training features, shape ``(n, n_features)``, finite.
        n_bins: maximum number of bins per feature (``1 < n_bins < n``).
        kind: ``quantile`` (label-free) or ``tree`` (supervised).
        y: training target, required for ``tree``.
        regression: whether ``y`` is a regression target, required for ``tree``.
        feature_names: column names, used in error messages.
        tree_kwargs: extra ``DecisionTree*`` arguments for ``tree`` (e.g. ``min_samples_leaf``).

    Returns:
        One float32 tensor of increasing edges per feature.

    Raises:
        ValueError: for constant columns, non-finite values or bad ``n_bins``.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or len(x) < 2:
        raise ValueError(f"compute_bins needs a 2-D array with at least 2 rows, got {x.shape}.")
    names = list(feature_names) if feature_names is not None else [f"#{i}" for i in range(x.shape[1])]
    if not np.isfinite(x).all():
        raise ValueError("compute_bins got NaN or inf; clean the numeric features first.")
    constant = [names[i] for i in range(x.shape[1]) if np.all(x[:, i] == x[0, i])]
    if constant:
        raise ValueError(
            f"Numeric column(s) {constant} are constant on the training split, so they have no"
            " bins; drop them or set numeric_embedding to none."
        )
    if not 1 < n_bins < len(x):
        raise ValueError(f"n_bins must be in (1, {len(x)}) for {len(x)} rows, got {n_bins}.")
    if kind == "quantile":
        # float32 torch.quantile on float32 levels: the same edges as rtdl_num_embeddings.
        levels = torch.linspace(0.0, 1.0, n_bins + 1)
        qs = torch.quantile(torch.as_tensor(x, dtype=torch.float32), levels, dim=0).T
        return [q.unique() for q in qs]
    if kind != "tree":
        raise ValueError(f"Unknown bin kind {kind!r}; use 'quantile' or 'tree'.")
    if y is None or regression is None:
        raise ValueError("Tree bins need the training target y and whether it is regression.")
    from sklearn.tree import DecisionTreeClassifier, DecisionTreeRegressor

    tree_cls = DecisionTreeRegressor if regression else DecisionTreeClassifier
    bins = []
    for column in x.T:
        tree = tree_cls(max_leaf_nodes=n_bins, **(tree_kwargs or {})).fit(column[:, None], y).tree_
        split = tree.children_left != tree.children_right
        edges = [column.min(), column.max(), *tree.threshold[split].tolist()]
        bins.append(torch.as_tensor(edges, dtype=torch.float32).unique())
    return bins


class PiecewiseLinearEncoding(nn.Module):
    """Parameter-free piecewise-linear encoding of numeric features.

    A feature with edges ``e_0 < ... < e_T`` (``T`` bins) is encoded as
    ``[1, ..., 1, (x - e_t) / (e_{t+1} - e_t), 0, ..., 0]`` (the first component
    unbounded below, the last unbounded above). Features with fewer bins are padded in
    the middle so that the last component is always last (``rtdl_num_embeddings``
    layout); ``mask`` marks the real components.

    Args:
        bins: edges per feature, from ``compute_bins``.

    Shape:
        - Input: ``(B, n_features)``.
        - Output: ``(B, n_features, max_n_bins)``.

    Example:
        >>> encoding = PiecewiseLinearEncoding([torch.tensor([0.0, 1.0, 2.0]), torch.tensor([0.0, 4.0])])
        >>> encoding(torch.tensor([[0.5, 2.0]]))  # 2 bins: [0.5 / 1, 0]; 1 bin, padded: [0, 2 / 4]
        tensor([[[0.5000, 0.0000],
                 [0.0000, 0.5000]]])
    """

    def __init__(self, bins: Sequence[Tensor]) -> None:
        super().__init__()
        if len(bins) == 0:
            raise ValueError("PiecewiseLinearEncoding needs at least one feature's bins.")
        n_bins = [len(edges) - 1 for edges in bins]
        if min(n_bins) < 1 or any(bool((e.diff() <= 0).any()) for e in map(torch.as_tensor, bins)):
            raise ValueError("Each feature needs >= 2 strictly increasing bin edges.")
        max_n_bins = max(n_bins)
        weight = torch.zeros(len(bins), max_n_bins)
        bias = torch.zeros(len(bins), max_n_bins)
        mask = torch.zeros(len(bins), max_n_bins, dtype=torch.bool)
        for i, edges in enumerate(bins):
            edges = torch.as_tensor(edges, dtype=torch.float32)
            width = edges.diff()
            w, b = 1.0 / width, -edges[:-1] / width
            weight[i, -1], bias[i, -1] = w[-1], b[-1]
            weight[i, : n_bins[i] - 1], bias[i, : n_bins[i] - 1] = w[:-1], b[:-1]
            mask[i, : n_bins[i] - 1] = True
            mask[i, -1] = True
        self.register_buffer("weight", weight)
        self.register_buffer("bias", bias)
        self.register_buffer("mask", mask)
        self.register_buffer("single_bin", torch.tensor(n_bins) == 1)

    @property
    def max_n_bins(self) -> int:
        """Width of the padded encoding."""
        return self.weight.shape[1]

    def forward(self, x: Tensor) -> Tensor:
        """Encode ``(B, n_features)`` as ``(B, n_features, max_n_bins)``."""
        z = torch.addcmul(self.bias, self.weight, x[..., None])
        if z.shape[-1] == 1:
            return z
        last = z[..., -1:]
        last = torch.where(self.single_bin[:, None], last, last.clamp_min(0.0))
        return torch.cat([z[..., :1].clamp_max(1.0), z[..., 1:-1].clamp(0.0, 1.0), last], dim=-1)


class PiecewiseLinearEmbeddings(nn.Module):
    """TabM's numeric embeddings: a linear embedding plus a learned PLE correction.

    ``e_j(x) = w_j x_j + b_j + PLE(x_j) V_j`` with ``V_j`` initialised to zero, so the
    embedding starts linear and learns the piecewise part (``rtdl_num_embeddings``
    ``version="B"``, ``activation=False``). With ``k`` set, every member has its own
    parameters (deep ensembles) and the output gains a member axis.

    Args:
        bins: edges per feature, from ``compute_bins``.
        d_embedding: embedding size per feature.
        k: number of independent member copies, or ``None`` for one shared copy.

    Shape:
        - Input: ``(B, n_features)``.
        - Output: ``(B, n_features, d_embedding)``, or ``(B, K, n_features, d_embedding)``
          (batch, members, ...) when ``k=K`` is given.

    Example:
        >>> bins = [torch.tensor([0.0, 1.0, 2.0]), torch.tensor([0.0, 4.0])]
        >>> PiecewiseLinearEmbeddings(bins, d_embedding=8)(torch.rand(5, 2)).shape
        torch.Size([5, 2, 8])
        >>> PiecewiseLinearEmbeddings(bins, d_embedding=8, k=3)(torch.rand(5, 2)).shape
        torch.Size([5, 3, 2, 8])
    """

    def __init__(self, bins: Sequence[Tensor], d_embedding: int, k: int | None = None) -> None:
        super().__init__()
        if d_embedding < 1:
            raise ValueError(f"d_embedding must be positive, got {d_embedding}.")
        self.encoding = PiecewiseLinearEncoding(bins)
        self.k = k
        lead = () if k is None else (k,)
        n_features, n_bins = len(bins), self.encoding.max_n_bins
        self.linear_weight = nn.Parameter(torch.empty(*lead, n_features, d_embedding))
        self.linear_bias = nn.Parameter(torch.empty(*lead, n_features, d_embedding))
        self.ple_weight = nn.Parameter(torch.zeros(*lead, n_features, n_bins, d_embedding))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """``U(-1/sqrt(d), 1/sqrt(d))`` for the linear part, zeros for the PLE part."""
        bound = self.linear_weight.shape[-1] ** -0.5
        nn.init.uniform_(self.linear_weight, -bound, bound)
        nn.init.uniform_(self.linear_bias, -bound, bound)
        nn.init.zeros_(self.ple_weight)

    def forward(self, x: Tensor) -> Tensor:
        """Embed ``(B, n_features)`` numeric features."""
        ple = self.encoding(x)  # (B, F, T)
        if self.k is None:
            linear = x[..., None] * self.linear_weight + self.linear_bias
            return linear + torch.einsum("bft,ftd->bfd", ple, self.ple_weight)
        linear = x[:, None, :, None] * self.linear_weight + self.linear_bias
        return linear + torch.einsum("bft,kftd->bkfd", ple, self.ple_weight)


class OneHotEncoding(nn.Module):
    """One-hot encoding of integer-coded categorical features, concatenated.

    Args:
        cardinalities: number of categories per column (including any "unknown" slot).

    Shape:
        - Input: ``(B, n_cat)``, ``int64``, column ``j`` in ``[0, cardinalities[j])``.
        - Output: ``(B, sum(cardinalities))``, float32.

    Example:
        >>> encoding = OneHotEncoding([2, 3])
        >>> encoding(torch.tensor([[1, 0], [0, 2]]))
        tensor([[0., 1., 1., 0., 0.],
                [1., 0., 0., 0., 1.]])
    """

    def __init__(self, cardinalities: Sequence[int]) -> None:
        super().__init__()
        self.cardinalities = [int(c) for c in cardinalities]
        offsets = torch.tensor([0, *self.cardinalities[:-1]]).cumsum(0)
        self.register_buffer("offsets", offsets, persistent=False)

    @property
    def d_out(self) -> int:
        """Width of the encoding."""
        return sum(self.cardinalities)

    def forward(self, x: Tensor) -> Tensor:
        """Encode ``(B, n_cat)`` category codes."""
        out = x.new_zeros(x.shape[0], self.d_out, dtype=torch.float32)
        return out.scatter_(1, x + self.offsets, 1.0)
