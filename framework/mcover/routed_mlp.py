"""M copies of an MLP (or a committee machine) trained through permutation routing.

Copies sit on axis 1 (``(B, M, ...)``, the members axis of ``ripieno.framework.members``). Layer ``l`` of
copy ``a`` uses its own weights ``W_a^l`` and reads its input activations from other
copies: the incoming coordinates are split into ``n_blocks`` contiguous blocks and block
``j`` is read from copy ``rho_{l,j}(a)``. The first layer reads the data, which every
copy shares, so routing starts at the second layer; a network with ``L`` linear layers
has ``(L - 1) * n_blocks`` routing slots, slot ``(l - 1) * n_blocks + j``.

``routing`` arguments of ``forward``:

* ``None``: no routing (each copy is its own network).
* a long tensor ``(n_slots, M)``: **exact routing** by one sampled permutation per slot
  (one gather per layer; backprop scatters each destination's gradient to its source).
* a float tensor ``(n_slots, M, M)``: the **block-message approximation**. Per block,
  the source contributions (the block's activations of every copy) are computed within
  each copy, then mixed across copies with the bank's empirical mixing matrix
  ``P[a, b] = mean_s 1[rho_s(a) = b]``: copy ``a`` reads ``sum_b P[a, b] x_b`` on the
  block. This is the mean over the bank's routes of the layer's input, so one forward
  pass replaces ``S`` routed passes and nothing is stored per path. With a diagonal
  kernel both forms are the identity.

Collapse (``collapse``): the copies become one network of the base architecture whose
weights are the copies' mean. Mixing trains each layer of a copy to work on other
copies' activations, which keeps the copies aligned (no hidden-unit permutation
between them) so that the mean is meaningful; the copy average
(mean of the copies' own predictive probabilities) is reported beside it.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Activation = Literal["relu", "tanh"]
Head = Literal["linear", "committee"]


def block_index(width: int, n_blocks: int) -> Tensor:
    """Block of each of ``width`` coordinates: ``n_blocks`` contiguous, near-equal blocks."""
    if not 1 <= n_blocks <= width:
        raise ValueError(f"n_blocks must be between 1 and the layer width {width}, got {n_blocks}.")
    return torch.cat([torch.full((len(part),), j, dtype=torch.long)
                      for j, part in enumerate(torch.arange(width).tensor_split(n_blocks))])


def route(x: Tensor, routing: Tensor, blocks: Tensor) -> Tensor:
    """Copy ``a``'s routed input from activations ``x``, copies first: ``(M, B, D)``.

    Args:
        x: activations of every copy, ``(M, B, D)``.
        routing: ``(n_blocks, M)`` permutations (exact) or ``(n_blocks, M, M)`` mixing
            matrices (block-message) for this layer's slots.
        blocks: ``(D,)`` block of each coordinate (``block_index``).
    """
    if routing.dtype == torch.long:
        source = routing[blocks].T  # (M, D): source copy of destination a at coordinate i
        return x.gather(0, source.unsqueeze(1).expand(-1, x.shape[1], -1))
    mixing = routing.to(x.dtype)
    n_blocks, width = mixing.shape[0], x.shape[-1]
    if width % n_blocks == 0:  # equal blocks: one batched matmul over (block, copy)
        per_block = x.unflatten(-1, (n_blocks, width // n_blocks))
        return torch.einsum("jab,bnjd->anjd", mixing, per_block).flatten(-2)
    return torch.cat([torch.einsum("ab,bnd->and", mixing[j], part)
                      for j, part in enumerate(x.tensor_split(n_blocks, dim=-1))], dim=-1)


class CommitteeReadout(nn.Module):
    """Fixed committee output: class ``c``'s score is the sum of its ``K`` hidden units.

    Hidden units are laid out class-major (``c * K + k``). The network is a soft
    committee machine (``tanh`` units, trained by SGD on cross-entropy of the scores);
    ``vote`` gives the hard committee's majority decision ``argmax_c sum_k sign(h_ck)``.

    Args:
        n_classes: number of classes ``C``.
        committee_size: hidden units per class ``K``.

    Shape:
        - Input: ``(*, C * K)`` hidden units, class-major (e.g. ``(B, M, C * K)``: batch, copies, units).
        - Output: ``(*, C)``.

    Example:
        >>> readout = CommitteeReadout(n_classes=2, committee_size=3)
        >>> readout(torch.tensor([[1.0, 2.0, 3.0, 0.5, 0.5, -1.0]]))  # 1 + 2 + 3, 0.5 + 0.5 - 1
        tensor([[6., 0.]])
        >>> readout.vote(torch.tensor([[1.0, 2.0, -3.0, -0.5, -0.5, 1.0]]))  # votes 1 + 1 - 1, -1 - 1 + 1
        tensor([[ 1., -1.]])
    """

    def __init__(self, n_classes: int, committee_size: int) -> None:
        super().__init__()
        self.n_classes, self.committee_size = n_classes, committee_size

    def forward(self, hidden: Tensor) -> Tensor:
        """Scores ``(..., C)`` from activations ``(..., C * K)``."""
        return hidden.unflatten(-1, (self.n_classes, self.committee_size)).sum(-1)

    def vote(self, pre_activation: Tensor) -> Tensor:
        """Majority-vote counts ``(..., C)`` from pre-activations ``(..., C * K)``."""
        return self.forward(torch.sign(pre_activation))


class RoutedMLP(nn.Module):
    """``M`` copies of an MLP (or soft committee machine) with permutation routing.

    Args:
        in_features: input width (flattened).
        hidden: hidden widths (``committee``: exactly one, ``n_classes * committee_size``
            when left empty).
        out_features: number of outputs (classes).
        m: number of copies ``M``.
        n_blocks: blocks of incoming coordinates per routed layer.
        activation: ``relu`` or ``tanh`` (``committee`` always uses ``tanh``).
        head: ``linear`` (a trainable last layer) or ``committee`` (fixed readout).
        committee_size: hidden units per class for ``committee``.
        init: ``independent`` (each copy its own ``nn.Linear`` draw) or ``identical``.

    Shape:
        - Input: ``(B, *)``, flattened to ``(B, in_features)``; ``routing`` ``None``, ``(n_slots, M)``
          permutations (``int64``) or ``(n_slots, M, M)`` mixing matrices (module docstring).
        - Output: ``(B, M, out_features)``: batch, copies (members), outputs; with ``return_hidden``
          (``committee``) the hidden pre-activations ``(B, M, out_features * committee_size)``.

    Example:
        >>> net = RoutedMLP(in_features=6, hidden=[8], out_features=3, m=4, n_blocks=2)
        >>> x = torch.randn(5, 6)
        >>> net(x).shape
        torch.Size([5, 4, 3])
        >>> net.n_slots  # one routed layer, two blocks
        2
        >>> identity = torch.arange(4).expand(net.n_slots, 4)  # every copy reads its own block
        >>> torch.equal(net(x, identity), net(x))
        True
    """

    def __init__(self, in_features: int, hidden: list[int], out_features: int, m: int, n_blocks: int = 1,
                 activation: Activation = "relu", head: Head = "linear", committee_size: int = 5,
                 init: Literal["independent", "identical"] = "independent") -> None:
        super().__init__()
        if m < 1:
            raise ValueError(f"m (copies) must be >= 1, got {m}.")
        if head not in ("linear", "committee"):
            raise ValueError(f"head must be 'linear' or 'committee', got {head!r}.")
        if activation not in ("relu", "tanh"):
            raise ValueError(f"activation must be 'relu' or 'tanh', got {activation!r}.")
        if head == "committee":
            width = out_features * committee_size
            if hidden and list(hidden) != [width]:
                raise ValueError(f"A committee machine has one hidden layer of n_classes * committee_size ="
                                 f" {width} units; got hidden={hidden} (leave it empty).")
            widths = [in_features, width]
            activation = "tanh"
        else:
            widths = [in_features, *hidden, out_features]
        self.m, self.n_blocks, self.head_kind, self.activation = m, n_blocks, head, activation
        self.widths = widths
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        for d_in, d_out in zip(widths[:-1], widths[1:], strict=True):
            self.weights.append(nn.Parameter(torch.empty(m, d_in, d_out)))  # (M, in, out): x @ W
            self.biases.append(nn.Parameter(torch.empty(m, d_out)))
        self.readout = CommitteeReadout(out_features, committee_size) if head == "committee" else None
        for layer, d_in in enumerate(widths[1:-1] if head == "linear" else []):
            self.register_buffer(f"blocks_{layer + 1}", block_index(d_in, n_blocks), persistent=False)
        if head == "committee":
            self.register_buffer("blocks_1", block_index(widths[1], n_blocks), persistent=False)
        self.reset_parameters(init)

    @property
    def n_layers(self) -> int:
        """Number of trainable linear layers."""
        return len(self.weights)

    @property
    def n_slots(self) -> int:
        """Routing slots: ``n_blocks`` per routed layer.

        Every layer after the first is routed; for a committee machine, the readout.
        """
        routed = self.n_layers if self.head_kind == "committee" else self.n_layers - 1
        return routed * self.n_blocks

    @torch.no_grad()
    def reset_parameters(self, init: str = "independent") -> None:
        """Each copy like a fresh ``nn.Linear``, or all copies equal to copy 0."""
        for w, b in zip(self.weights, self.biases, strict=True):
            for a in range(self.m):
                layer = nn.Linear(w.shape[1], w.shape[2])
                w[a].copy_(layer.weight.T)
                b[a].copy_(layer.bias)
            if init == "identical":
                w.copy_(w[:1].expand_as(w))
                b.copy_(b[:1].expand_as(b))
            elif init != "independent":
                raise ValueError(f"init must be 'independent' or 'identical', got {init!r}.")

    def _act(self, h: Tensor) -> Tensor:
        return torch.relu(h) if self.activation == "relu" else torch.tanh(h)

    def _slots(self, routing: Tensor | None, layer: int) -> Tensor | None:
        """This routed layer's ``n_blocks`` slots of ``routing`` (``layer >= 1``)."""
        if routing is None:
            return None
        if routing.shape[0] != self.n_slots or routing.shape[1] != self.m:
            raise ValueError(f"routing has shape {tuple(routing.shape)}; this network needs"
                             f" ({self.n_slots}, {self.m}) permutations or ({self.n_slots}, {self.m},"
                             f" {self.m}) mixing matrices.")
        start = (layer - 1) * self.n_blocks
        return routing[start : start + self.n_blocks]

    def forward(self, x: Tensor, routing: Tensor | None = None, return_hidden: bool = False) -> Tensor:
        """Outputs of every copy ``(B, M, out)`` for inputs ``(B, ...)`` (flattened).

        ``return_hidden`` (committee only) returns each copy's own hidden pre-activations
        ``(B, M, C * K)`` (unrouted) instead, for majority votes.
        """
        # Copies first inside, (M, B, D), weights (M, in, out): each layer is one batched
        # matmul with no transposes, so the weight gradients come out contiguous (a
        # transposed layout costs a full copy per layer in backward; bench/mcover_step.py).
        h = torch.baddbmm(self.biases[0][:, None], x.flatten(1).expand(self.m, -1, -1), self.weights[0])
        for layer in range(1, self.n_layers):
            slots = self._slots(routing, layer)
            inp = self._act(h)
            if slots is not None:
                inp = route(inp, slots, getattr(self, f"blocks_{layer}"))
            h = torch.baddbmm(self.biases[layer][:, None], inp, self.weights[layer])
        if self.readout is None or return_hidden:
            return h.transpose(0, 1)
        units = torch.tanh(h)
        slots = self._slots(routing, self.n_layers)
        if slots is not None:
            units = route(units, slots, self.blocks_1)  # the readout reads hidden units across copies
        return self.readout(units).transpose(0, 1)

    def copy_network(self, a: int) -> nn.Sequential:
        """Copy ``a`` alone as a plain network of the base architecture (a detached copy)."""
        return self._base_network([w[a] for w in self.weights], [b[a] for b in self.biases])

    def collapse(self) -> nn.Sequential:
        """The collapsed predictor: the base architecture with the copies' mean weights."""
        return self._base_network([w.mean(0) for w in self.weights], [b.mean(0) for b in self.biases])

    @torch.no_grad()
    def _base_network(self, weights: list[Tensor], biases: list[Tensor]) -> nn.Sequential:
        layers: list[nn.Module] = [nn.Flatten()]
        for i, (w, b) in enumerate(zip(weights, biases, strict=True)):
            linear = nn.Linear(w.shape[0], w.shape[1]).to(w.device, w.dtype)
            linear.weight.copy_(w.T)
            linear.bias.copy_(b)
            layers.append(linear)
            if i < len(weights) - 1 or self.readout is not None:
                layers.append(nn.ReLU() if self.activation == "relu" else nn.Tanh())
        if self.readout is not None:
            layers.append(CommitteeReadout(self.readout.n_classes, self.readout.committee_size))
        return nn.Sequential(*layers)

    def copy_parameters(self) -> list[Tensor]:
        """Every parameter, copies on axis 0 (what replica couplings act on).

        Weights first (``(M, in, out)``, layer by layer), then biases (``(M, out)``).
        """
        return [*self.weights, *self.biases]


def copy_cross_entropy(logits: Tensor, target: Tensor, row_weight: Tensor | None = None) -> Tensor:
    """Sum over copies of each copy's mean cross-entropy.

    A sum, not a mean, so that each copy receives exactly the gradient it would get if
    trained alone: with a diagonal kernel, M-cover training is M independent trainings.
    ``row_weight`` (0/1 per row) takes each copy's mean over the rows of weight 1 only.
    """
    m = logits.shape[1]
    if row_weight is None:
        return F.cross_entropy(logits.float().flatten(0, 1), target.repeat_interleave(m)) * m
    loss = F.cross_entropy(logits.float().flatten(0, 1), target.repeat_interleave(m), reduction="none")
    return (loss.view(-1, m) * row_weight[:, None]).sum() / row_weight.sum().clamp_min(1)
