"""Linear layers for K ensemble members that share (part of) one weight matrix.

Every layer maps member inputs ``(B, K, in_features)`` to member outputs
``(B, K, out_features)`` without a Python loop over members. The member weight
``W_k`` (shape ``(out, in)``, PyTorch convention) depends on the adapter:

=============  =====================================  ==========================
adapter        W_k                                    per-member parameters
=============  =====================================  ==========================
``shared``     ``W``                                  none (one bias)
``rank1``      ``W * (s_k r_k^T)``  (TabM)            ``r_k``, ``s_k``, bias
``lometab``    ``W * (1 + A_k B_k^T)``                ``A_k``, ``B_k``, bias
``additive``   ``W + A_k B_k^T``                      ``A_k``, ``B_k``, bias
``packed``     ``W_k`` independent (deep ensemble)    everything
=============  =====================================  ==========================

``A_k`` is ``(out, rank)`` and ``B_k`` is ``(in, rank)``.

Initialisation (documented because it sets the initial diversity):

* ``W`` and every bias: ``U(-1/sqrt(in), 1/sqrt(in))`` as in ``tabm``; member biases
  start identical (one draw copied to all K), so members differ only by adapters.
* ``lometab`` (``adapter_init``):

  - ``plain`` (default): entries of ``A_k`` and ``B_k`` are i.i.d. ``N(0, sigma_init^2)``,
    the LoMETab paper's draw. An entry of ``A_k B_k^T`` is a sum of ``rank`` products of
    two independent ``N(0, sigma_init^2)`` draws, so it has mean 0 and standard deviation
    ``sqrt(rank) * sigma_init**2``: the rank and ``sigma_init`` *both* set the initial
    spread of the members (the paper's two diversity controls; small ``sigma_init`` keeps
    it small whatever the rank, larger ``sigma_init`` lets the rank move it).
  - ``rank_normalized``: entries i.i.d. with std ``sqrt(sigma_init) * rank**-0.25``, so
    an entry of ``A_k B_k^T`` has standard deviation exactly ``sigma_init`` for every
    rank: ``sigma_init`` alone is the relative size of the multiplicative perturbation
    and the rank only changes its *structure*. Our variant, for sweeps where the scale
    should not move with the rank (it removes the rank axis of the initial spread by
    construction).

* ``additive`` (``adapter_init``):

  - ``plain`` (default): the same draw as ``lometab``'s ``plain`` (std of an entry of
    ``A_k B_k^T``: ``sqrt(rank) * sigma_init**2``, in absolute units): the ablation
    changes only how the adapter enters (``W + A_k B_k^T`` instead of
    ``W * (1 + A_k B_k^T)``), nothing else. Since ``W``'s entries have std
    ``1/sqrt(3 * in)``, the same ``sigma_init`` is a far larger *relative* perturbation
    than ``lometab``'s (by about ``sqrt(3 * in)``): from ``sigma_init`` of about 1 the
    members start as nearly unrelated networks (the shipped churn model at
    ``sigma_init=3`` no longer learns), so the shipped ``additive_*`` recipes use
    ``relative``.
  - ``relative``: ``lometab``'s ``rank_normalized`` draw times ``(3 * in)**-1/4`` per
    factor, so an entry of ``A_k B_k^T`` has std ``sigma_init / sqrt(3 * in)``
    (``sigma_init`` times the std of ``W``'s entries) for every rank: the relative
    perturbation of ``W`` at init matches ``lometab`` with ``rank_normalized`` and the
    same ``sigma_init``, a like-for-like comparison of the two parametrisations at one
    perturbation size.

* ``rank1``: ``r`` and ``s`` by ``rank1_init`` (``ones``, ``random-signs`` or ``normal``),
  with optional chunks as in ``tabm.LinearBatchEnsemble``.
* ``packed``: each member like ``W`` with its own draw.

``adapter_init`` is ignored by the adapters without ``A_k``, ``B_k``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor, nn

from ripieno.framework.nn.thin_products import thin_matmul

Adapter = Literal["shared", "rank1", "lometab", "additive", "packed"]
ScalingInit = Literal["ones", "random-signs", "normal"]
Compute = Literal["auto", "factored", "materialized"]
ADAPTERS: tuple[str, ...] = ("shared", "rank1", "lometab", "additive", "packed")
AdapterInit = Literal["plain", "rank_normalized", "relative"]
#: The ``adapter_init`` values each low-rank adapter accepts, its default first.
ADAPTER_INITS: dict[str, tuple[str, ...]] = {
    "lometab": ("plain", "rank_normalized"),
    "additive": ("plain", "relative"),
}
DEFAULT_ADAPTER_INIT: AdapterInit = "plain"


def check_adapter_init(adapter: str, adapter_init: str) -> None:
    """Raise ``ValueError`` unless ``adapter_init`` is defined for ``adapter``.

    Adapters without ``A_k``, ``B_k`` (``shared``, ``rank1``, ``packed``) ignore the
    option but still reject names that no adapter knows, so typos surface early.

    Args:
        adapter: one of ``ADAPTERS``.
        adapter_init: the initialisation of ``A_k``, ``B_k`` (module docstring).

    Raises:
        ValueError: naming the values allowed for ``adapter``.

    Example:
        >>> check_adapter_init("lometab", "plain")
        >>> check_adapter_init("lometab", "relative")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: adapter_init='relative' is not defined for adapter='lometab'; choose one of ...
    """
    allowed = ADAPTER_INITS.get(adapter)
    if allowed is None:
        known = tuple(dict.fromkeys(v for values in ADAPTER_INITS.values() for v in values))
        if adapter_init not in known:
            raise ValueError(f"Unknown adapter_init {adapter_init!r}; choose one of {known}.")
    elif adapter_init not in allowed:
        raise ValueError(
            f"adapter_init={adapter_init!r} is not defined for adapter={adapter!r};"
            f" choose one of {allowed}."
        )


def adapter_factor_std(adapter: str, adapter_init: str, rank: int, sigma_init: float,
                       in_features: int) -> float:
    """Standard deviation of the entries of ``A_k`` and ``B_k`` at init (module docstring).

    Args:
        adapter: ``lometab`` or ``additive``.
        adapter_init: one of ``ADAPTER_INITS[adapter]``.
        rank: the adapter rank ``r``.
        sigma_init: the init scale.
        in_features: the layer's input size (``relative`` scales to ``W``'s std).

    Returns:
        The std of both factors; an entry of ``A_k B_k^T`` then has std
        ``sqrt(rank) * std**2``.

    Example:
        >>> adapter_factor_std("lometab", "plain", 4, 0.3, 64)
        0.3
        >>> round(adapter_factor_std("lometab", "rank_normalized", 4, 0.3, 64) ** 2 * 2, 6)
        0.3
    """
    check_adapter_init(adapter, adapter_init)
    if adapter_init == "plain":
        return sigma_init
    std = math.sqrt(sigma_init) * rank**-0.25  # product std sigma_init for every rank
    if adapter_init == "relative":
        std *= (3 * in_features) ** -0.25  # each factor carries sqrt of std(W)
    return std


#: Elements of one ``(chunk, out, in)`` temporary of ``_LoMEMatmul`` on CPU (2 MiB in float32).
CPU_CHUNK_ELEMENTS = 2**19


def lometab_member_chunk(k: int, out_features: int, in_features: int, device: torch.device) -> int:
    """Members per pass of the ``materialized`` LoMETab product (``_LoMEMatmul``).

    On CPU the member weights ``W * (1 + A_k B_k^T)`` and the gradient temporaries of the
    same ``(K, out, in)`` shape are formed a few members at a time, so that each stays in
    cache between the elementwise pass that makes it and the GEMM that reads it (one
    512 x 512 member weight is 1 MiB in float32; all K=32 of them, 32 MiB, go to DRAM and
    back on every pass). ``CPU_CHUNK_ELEMENTS`` (2 MiB of float32, two such members) was
    the fastest of 1, 2, 4, 8 and 16 members per pass for one 512 x 512 layer (K=32,
    batch 256, forward and backward) on this 2-core EPYC (L2 1 MiB per core, L3 32 MiB);
    4 members were within noise of it, 16 were 13% slower. On other devices all members
    go in one pass (not measured here, no GPU was at hand: a GPU's memory bandwidth makes
    the passes cheap, and every chunk would add kernel launches).

    Args:
        k: number of members.
        out_features: rows of ``W``.
        in_features: columns of ``W``.
        device: where the product runs.

    Returns:
        A chunk size in ``[1, k]``.

    Example:
        >>> lometab_member_chunk(32, 512, 512, torch.device("cpu"))
        2
        >>> lometab_member_chunk(32, 64, 64, torch.device("cpu"))
        32
    """
    if device.type != "cpu":
        return k
    return max(1, min(k, CPU_CHUNK_ELEMENTS // (out_features * in_features)))


def _low_rank(a: Tensor, b: Tensor) -> Tensor:
    """``A_k B_k^T`` for the members in ``a`` ``(k, out, r)``, ``b`` ``(k, in, r)``.

    Rank 1 is a broadcast outer product: the same single multiplication per entry, which
    the CPU BLAS runs about 20x slower as a ``bmm`` with an inner size of 1.
    """
    if a.shape[-1] == 1:
        return a * b.transpose(1, 2)
    return torch.bmm(a, b.transpose(1, 2))


def _member_weights(w: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``W * (1 + A_k B_k^T)`` for the members in ``a``, ``b``: ``(k, out, in)``."""
    return torch.addcmul(w, _low_rank(a, b), w)


class _LoMEMatmul(torch.autograd.Function):
    """``y_k = x_k (W * (1 + A_k B_k^T))^T`` for all members, with hand-written derivatives.

    Inputs ``x`` ``(K, B, in)``, ``w`` ``(out, in)``, ``a`` ``(K, out, r)``, ``b``
    ``(K, in, r)`` and ``chunk``, the number of members formed per pass
    (``lometab_member_chunk``). Plain autograd keeps several ``(K, out, in)``
    temporaries alive and runs about twice as many memory-bound passes over them; this
    Function saves only its inputs, forms ``chunk`` member weights at a time (in
    backward too, recomputing the rank-r product ``A_k B_k^T``, which is cheap, while the
    chunk is in cache), fuses the elementwise passes, runs the thin gradient products of
    ``A_k``, ``B_k`` in the orientation the BLAS is fast at (``thin_matmul``) and skips
    the gradients autograd does not need (the first layer's input). A plain backward
    writes the gradients into preallocated tensors with in-place updates; under
    ``create_graph=True`` (double backward, ``torch.func.grad``) the same chunks run as
    differentiable out-of-place operations. It supports double backward, forward mode
    (``jvp``) and ``torch.func`` transforms.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(x: Tensor, w: Tensor, a: Tensor, b: Tensor, chunk: int) -> Tensor:
        k = x.shape[0]
        if chunk >= k:
            return torch.bmm(x, _member_weights(w, a, b).transpose(1, 2))
        if torch._C._are_functorch_transforms_active():  # vmap runs this forward on batched tensors: no out=
            return torch.cat([
                torch.bmm(x[s:s + chunk], _member_weights(w, a[s:s + chunk], b[s:s + chunk]).transpose(1, 2))
                for s in range(0, k, chunk)
            ])
        y = x.new_empty(k, x.shape[1], w.shape[0])  # each chunk's product written in place: no copy by cat
        for s in range(0, k, chunk):
            torch.bmm(x[s:s + chunk], _member_weights(w, a[s:s + chunk], b[s:s + chunk]).transpose(1, 2),
                      out=y[s:s + chunk])
        return y

    @staticmethod
    def setup_context(ctx, inputs: tuple, output: Tensor) -> None:  # noqa: ANN001
        x, w, a, b, chunk = inputs
        ctx.save_for_backward(x, w, a, b)
        ctx.save_for_forward(x, w, a, b)
        ctx.chunk = chunk

    @staticmethod
    def backward(ctx, grad_y: Tensor) -> tuple[Tensor | None, ...]:  # noqa: ANN001
        x, w, a, b = ctx.saved_tensors
        need_x, need_w, need_a, need_b, _ = ctx.needs_input_grad
        grad_y = grad_y.to(x.dtype)
        if torch.is_grad_enabled():  # create_graph=True: every operation must be differentiable
            return (*_lome_backward_differentiable(x, w, a, b, grad_y, ctx.chunk,
                                                   (need_x, need_w, need_a, need_b)), None)
        k, chunk = x.shape[0], ctx.chunk
        grad_x = torch.empty_like(x) if need_x else None
        grad_w = torch.zeros_like(w) if need_w else None
        grad_a = torch.empty_like(a) if need_a else None
        grad_b = torch.empty_like(b) if need_b else None
        for s in range(0, k, chunk):
            e = min(s + chunk, k)
            m = _low_rank(a[s:e], b[s:e])  # (c, out, in)
            if need_x:
                torch.bmm(grad_y[s:e], torch.addcmul(w, m, w), out=grad_x[s:e])
            if need_w or need_a or need_b:
                grad_member_w = torch.bmm(grad_y[s:e].transpose(1, 2), x[s:e])  # (c, out, in)
                if need_a or need_b:
                    grad_m = grad_member_w * w
                    if need_a:
                        grad_a[s:e] = thin_matmul(grad_m, b[s:e])
                    if need_b:
                        grad_b[s:e] = thin_matmul(grad_m.transpose(1, 2), a[s:e])
                if need_w:  # sum_k G_k * (1 + M_k), one fused pass per chunk
                    grad_w.add_(grad_member_w.addcmul_(grad_member_w, m).sum(0))
        return grad_x, grad_w, grad_a, grad_b, None

    @staticmethod
    def jvp(ctx, dx: Tensor, dw: Tensor, da: Tensor, db: Tensor, _: None) -> Tensor:  # noqa: ANN001
        x, w, a, b = ctx.saved_tensors
        m = _low_rank(a, b)
        d_member_w = torch.addcmul(dw, m, dw) + w * (
            torch.bmm(da, b.transpose(1, 2)) + torch.bmm(a, db.transpose(1, 2))
        )
        return torch.bmm(dx, torch.addcmul(w, m, w).transpose(1, 2)) + torch.bmm(
            x, d_member_w.transpose(1, 2)
        )


def _lome_backward_differentiable(x: Tensor, w: Tensor, a: Tensor, b: Tensor, grad_y: Tensor,
                                  chunk: int, needs: tuple[bool, bool, bool, bool]
                                  ) -> tuple[Tensor | None, ...]:
    """``_LoMEMatmul``'s backward in out-of-place operations, for ``create_graph=True``."""
    need_x, need_w, need_a, need_b = needs
    parts: dict[str, list[Tensor]] = {"x": [], "w": [], "a": [], "b": []}
    for s in range(0, x.shape[0], chunk):
        xs, ys, as_, bs = x[s:s + chunk], grad_y[s:s + chunk], a[s:s + chunk], b[s:s + chunk]
        m = _low_rank(as_, bs)
        if need_x:
            parts["x"].append(torch.bmm(ys, torch.addcmul(w, m, w)))
        if need_w or need_a or need_b:
            grad_member_w = torch.bmm(ys.transpose(1, 2), xs)
            if need_w:
                parts["w"].append(torch.addcmul(grad_member_w, grad_member_w, m).sum(0))
            grad_m = grad_member_w * w
            if need_a:
                parts["a"].append(thin_matmul(grad_m, bs))
            if need_b:
                parts["b"].append(thin_matmul(grad_m.transpose(1, 2), as_))
    return (
        torch.cat(parts["x"]) if need_x else None,
        torch.stack(parts["w"]).sum(0) if need_w else None,
        torch.cat(parts["a"]) if need_a else None,
        torch.cat(parts["b"]) if need_b else None,
    )


def _lometab_matmul(x: Tensor, w: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Run ``_LoMEMatmul`` on ``(B, K, in)`` inputs, honouring autocast by explicit casts."""
    device_type = x.device.type
    chunk = lometab_member_chunk(x.shape[1], w.shape[0], w.shape[1], x.device)
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        with torch.autocast(device_type, enabled=False):
            y = _LoMEMatmul.apply(
                x.transpose(0, 1).to(dtype), w.to(dtype), a.to(dtype), b.to(dtype), chunk
            )
    else:
        y = _LoMEMatmul.apply(x.transpose(0, 1), w, a, b, chunk)
    return y.transpose(0, 1)


def _init_rsqrt_uniform_(tensor: Tensor, d: int) -> Tensor:
    bound = d**-0.5
    return nn.init.uniform_(tensor, -bound, bound)


@torch.no_grad()
def init_scaling_(tensor: Tensor, kind: ScalingInit, chunks: list[int] | None = None) -> Tensor:
    """Initialise a ``(K, d)`` scaling tensor like ``tabm.init_scaling_``.

    Args:
        tensor: the scaling parameter, shape ``(K, d)``.
        kind: ``ones``, ``random-signs`` (+-1 with equal probability) or ``normal``.
        chunks: optional sizes summing to ``d``; all entries of one chunk of one member
            share one random value (TabM uses one chunk per input feature embedding).

    Returns:
        The tensor, initialised in place.
    """

    def draw(t: Tensor) -> Tensor:
        if kind == "ones":
            return t.fill_(1.0)
        if kind == "normal":
            return t.normal_()
        if kind == "random-signs":
            return t.bernoulli_(0.5).mul_(2).sub_(1)
        raise ValueError(f"Unknown scaling init {kind!r}; use 'ones', 'random-signs' or 'normal'.")

    if chunks is None:
        return draw(tensor)
    if sum(chunks) != tensor.shape[-1]:
        raise ValueError(f"chunks sum to {sum(chunks)}, but the scaling has {tensor.shape[-1]}.")
    start = 0
    for size in chunks:
        tensor[..., start : start + size] = draw(tensor.new_empty(*tensor.shape[:-1], 1))
        start += size
    return tensor


def _per_member_single_output(weight: Tensor, x: Tensor) -> Tensor:
    """``(K, 1, d) x (B, K, d) -> (B, K, 1)``, as ``(K, 1, d) @ (K, d, B)``.

    This order gives ``weight`` a gradient with ``weight``'s own strides. The transposed product's (and
    einsum's) has another stride in the size-1 dimension, which DDP's reducer reports ("Grad strides do
    not match bucket view strides") and copies every step.
    """
    return torch.bmm(weight, x.permute(1, 2, 0)).permute(2, 0, 1)


class EnsembleLinear(nn.Module):
    """A linear layer for K members, parametrised by one of five adapters.

    ``lometab`` has two exact evaluation orders: ``materialized`` builds the K member
    weights ``W * (1 + A_k B_k^T)`` and runs batched matmuls on them (on CPU a few
    members at a time, ``lometab_member_chunk``); ``factored`` runs
    ``rank + 1`` shared matmuls on inputs scaled by the columns of ``B_k`` and
    recombines them with ``A_k`` (never forming K weights). ``auto`` picks by shape: the
    factored form costs about ``batch * rank`` extra multiply-adds per weight entry, the
    materialised form a fixed cost for K weight copies, so factored wins for small
    ``batch * (rank + 1)`` (inference on a few rows); see ``uses_factored``.

    Args:
        in_features: input size of each member.
        out_features: output size of each member.
        k: number of members.
        adapter: ``shared``, ``rank1``, ``lometab``, ``additive`` or ``packed``.
        rank: rank ``r`` of ``A_k B_k^T`` (``lometab``/``additive``).
        sigma_init: init scale of ``A_k``, ``B_k`` (``lometab``/``additive``); what it
            means depends on ``adapter_init``.
        bias: whether the layer has biases (one per member unless ``shared``).
        rank1_init: ``(r_init, s_init)`` for ``rank1``.
        rank1_chunks: chunks for the initialisation of ``r`` (``rank1`` only).
        compute: ``auto``, ``factored`` or ``materialized`` for ``lometab``/``additive``.
        adapter_init: how ``A_k``, ``B_k`` are drawn (module docstring): ``plain`` (the
            default for both: entries ``N(0, sigma_init^2)``, so ``A_k B_k^T`` has std
            ``sqrt(rank) * sigma_init**2``, the paper's draw), ``rank_normalized``
            (``lometab``: std ``sigma_init`` for every rank) or ``relative``
            (``additive``: std ``sigma_init`` times ``W``'s std, for every rank).

    Shape:
        - Input: ``(B, K, in_features)``: batch, members (``k``), features.
        - Output: ``(B, K, out_features)``.

    Example:
        >>> layer = EnsembleLinear(6, 3, k=4, adapter="lometab", rank=2, sigma_init=0.3)
        >>> layer(torch.randn(5, 4, 6)).shape
        torch.Size([5, 4, 3])
        >>> layer.adapter_init
        'plain'
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        k: int,
        adapter: Adapter = "lometab",
        rank: int = 4,
        sigma_init: float = 0.3,
        bias: bool = True,
        rank1_init: tuple[ScalingInit, ScalingInit] = ("random-signs", "ones"),
        rank1_chunks: list[int] | None = None,
        compute: Compute = "auto",
        adapter_init: AdapterInit = DEFAULT_ADAPTER_INIT,
    ) -> None:
        super().__init__()
        if adapter not in ADAPTERS:
            raise ValueError(f"Unknown adapter {adapter!r}; choose one of {ADAPTERS}.")
        check_adapter_init(adapter, adapter_init)
        for name, value in (("in_features", in_features), ("out_features", out_features),
                            ("k", k), ("rank", rank)):
            if int(value) < 1:
                raise ValueError(f"{name} must be a positive integer, got {value}.")
        if sigma_init < 0:
            raise ValueError(f"sigma_init must be >= 0, got {sigma_init}.")
        if compute not in ("auto", "factored", "materialized"):
            raise ValueError(f"compute must be 'auto', 'factored' or 'materialized', got {compute!r}.")
        self.in_features, self.out_features, self.k = in_features, out_features, k
        self.adapter: Adapter = adapter
        self.rank, self.sigma_init, self.adapter_init = rank, sigma_init, adapter_init
        self.rank1_init, self.rank1_chunks, self.compute = rank1_init, rank1_chunks, compute

        if adapter == "packed":
            self.weight = nn.Parameter(torch.empty(k, out_features, in_features))
        else:
            self.weight = nn.Parameter(torch.empty(out_features, in_features))
        if adapter == "rank1":
            self.r = nn.Parameter(torch.empty(k, in_features))
            self.s = nn.Parameter(torch.empty(k, out_features))
        if adapter in ("lometab", "additive"):
            self.adapter_a = nn.Parameter(torch.empty(k, out_features, rank))
            self.adapter_b = nn.Parameter(torch.empty(k, in_features, rank))
        bias_shape = (out_features,) if adapter == "shared" else (k, out_features)
        self.bias = nn.Parameter(torch.empty(bias_shape)) if bias else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise every parameter as documented in the module docstring."""
        _init_rsqrt_uniform_(self.weight, self.in_features)
        if self.bias is not None:
            if self.adapter == "packed":
                _init_rsqrt_uniform_(self.bias, self.in_features)
            else:
                draw = _init_rsqrt_uniform_(self.bias.new_empty(self.out_features), self.in_features)
                self.bias.copy_(draw.expand_as(self.bias))
        if self.adapter == "rank1":
            init_scaling_(self.r, self.rank1_init[0], self.rank1_chunks)
            init_scaling_(self.s, self.rank1_init[1])
        if self.adapter in ("lometab", "additive"):
            std = adapter_factor_std(self.adapter, self.adapter_init, self.rank,
                                     self.sigma_init, self.in_features)
            nn.init.normal_(self.adapter_a, 0.0, std)
            nn.init.normal_(self.adapter_b, 0.0, std)

    def extra_repr(self) -> str:
        """Summarise the configuration for ``print(module)``."""
        text = f"{self.in_features}, {self.out_features}, k={self.k}, adapter={self.adapter}"
        if self.adapter in ("lometab", "additive"):
            text += (f", rank={self.rank}, sigma_init={self.sigma_init},"
                     f" adapter_init={self.adapter_init}, compute={self.compute}")
        return text + f", bias={self.bias is not None}"

    def effective_weight(self) -> Tensor:
        """Return the member weights ``W_k`` stacked as ``(K, out, in)``."""
        w = self.weight
        if self.adapter == "packed":
            return w
        if self.adapter == "shared":
            return w.expand(self.k, -1, -1)
        if self.adapter == "rank1":
            return w * (self.s[:, :, None] * self.r[:, None, :])
        low_rank = self.adapter_a @ self.adapter_b.transpose(1, 2)  # (K, out, in)
        return w * (1.0 + low_rank) if self.adapter == "lometab" else w + low_rank

    def effective_bias(self) -> Tensor | None:
        """Return the member biases ``(K, out)`` (or ``None`` without bias)."""
        if self.bias is None:
            return None
        return self.bias.expand(self.k, -1) if self.adapter == "shared" else self.bias

    def uses_factored(self, batch_size: int) -> bool:
        """Whether ``forward`` evaluates ``lometab`` in factored form for this batch size."""
        if self.compute != "auto":
            return self.compute == "factored"
        # Both costs scale with K*out*in: materialised ~ c1 + c2*batch, factored
        # ~ c3*batch*(rank+1); measured crossover (one layer fwd+bwd, CPU, K=32, d=512,
        # ranks 1-16, with the member-chunked _LoMEMatmul) at batch*(rank+1) of about
        # 64-72 for every rank (it was 120-130 before chunking made c1 smaller).
        return batch_size * (self.rank + 1) <= 64

    def forward(self, x: Tensor) -> Tensor:
        """Map ``(B, K, in_features)`` to ``(B, K, out_features)``."""
        if x.ndim != 3 or x.shape[1] != self.k or x.shape[2] != self.in_features:
            raise ValueError(
                f"EnsembleLinear expects input of shape (batch, {self.k}, {self.in_features}),"
                f" got {tuple(x.shape)}; expand a (batch, d) input with x[:, None].expand(-1, k, -1)."
            )
        if self.adapter == "shared":
            return nn.functional.linear(x, self.weight, self.bias)
        if self.adapter == "rank1":
            y = ((x * self.r) @ self.weight.T) * self.s
        elif self.adapter == "packed" and self.out_features == 1:
            y = _per_member_single_output(self.weight, x)
        elif self.adapter == "packed":
            y = torch.bmm(x.transpose(0, 1), self.weight.transpose(1, 2)).transpose(0, 1)
        elif self.adapter == "additive" and self.compute != "materialized":
            # W x + A_k (B_k^T x): one shared matmul plus two thin per-member products.
            proj = torch.einsum("bki,kir->bkr", x, self.adapter_b)
            low_rank = (_per_member_single_output(self.adapter_a, proj) if self.out_features == 1
                        else torch.einsum("bkr,kor->bko", proj, self.adapter_a))
            y = x @ self.weight.T + low_rank
        elif self.adapter == "lometab" and self.uses_factored(x.shape[0]):
            # W_k x = W x + sum_j a_kj * (W (b_kj * x)): rank + 1 shared matmuls.
            ones_b = self.adapter_b.new_ones(self.k, self.in_features, 1)
            ones_a = self.adapter_a.new_ones(self.k, self.out_features, 1)
            b_aug = torch.cat([ones_b, self.adapter_b], dim=2)  # (K, in, r+1)
            a_aug = torch.cat([ones_a, self.adapter_a], dim=2)  # (K, out, r+1)
            scaled = x[:, :, None, :] * b_aug.transpose(1, 2)  # (B, K, r+1, in)
            y = torch.einsum("bkro,kor->bko", scaled @ self.weight.T, a_aug)
        elif self.adapter == "lometab":
            y = _lometab_matmul(x, self.weight, self.adapter_a, self.adapter_b)
        else:
            w = self.effective_weight()
            y = torch.bmm(x.transpose(0, 1), w.transpose(1, 2)).transpose(0, 1)
        return y if self.bias is None else y + self.bias
