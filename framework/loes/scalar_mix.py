"""``ScalarMix``: the ELMo learned scalar mix of all layers, a trainable baseline to layer selection."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


class ScalarMix(nn.Module):
    """``gamma * sum_l softmax(s)_l * h_l`` over ``L`` same-shaped layer tensors (Peters et al., 2018).

    As AllenNLP's ``ScalarMix`` without its optional layer norm: ``L`` logits ``s`` (initialised to
    zero, i.e. equal weights) and one scalar ``gamma`` (initialised to 1) are parameters; the layer
    weights ``softmax(s)`` are positive and sum to 1.

    Args:
        num_layers: Number of layers ``L`` to mix.
        initial_logits: Starting logits ``s`` (``L`` values); zeros by default.
        initial_gamma: Starting ``gamma``.
        trainable: Whether ``s`` and ``gamma`` receive gradients.

    Shape:
        - Input: ``L`` tensors of one shape ``(*)`` (e.g. ``(B, D)`` pooled layer embeddings), or one
          tensor ``(L, *)`` with the layers on axis 0.
        - Output: ``(*)``, the shape of one layer.

    Example:
        >>> mix = ScalarMix(2, initial_gamma=2.0)
        >>> out = mix([torch.zeros(4, 3), torch.ones(4, 3)])  # L=2 layers of (B=4, D=3)
        >>> out.shape
        torch.Size([4, 3])
        >>> out[0].tolist()  # 2 * (0 / 2 + 1 / 2)
        [1.0, 1.0, 1.0]
    """

    def __init__(
        self,
        num_layers: int,
        initial_logits: Sequence[float] | None = None,
        initial_gamma: float = 1.0,
        trainable: bool = True,
    ) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"ScalarMix needs at least one layer, got num_layers={num_layers}.")
        logits = torch.zeros(num_layers)
        if initial_logits is not None:
            logits = torch.as_tensor(initial_logits, dtype=torch.float32)
        if logits.shape != (num_layers,):
            raise ValueError(
                f"initial_logits has {logits.numel()} values but num_layers={num_layers}; give one per layer."
            )
        self.num_layers = num_layers
        self.scalar_parameters = nn.Parameter(logits.clone(), requires_grad=trainable)
        self.gamma = nn.Parameter(torch.tensor(float(initial_gamma)), requires_grad=trainable)

    @property
    def weights(self) -> Tensor:
        """The layer weights ``softmax(s)``, shape ``(L,)``, summing to 1."""
        return torch.softmax(self.scalar_parameters, dim=0)

    def forward(self, layers: Sequence[Tensor] | Tensor) -> Tensor:
        """Mix the layers.

        Args:
            layers: ``L`` tensors of one shape, or one tensor with the layers on axis 0.

        Returns:
            ``gamma * sum_l w_l * layers[l]``, the shape of one layer.
        """
        stacked = layers if isinstance(layers, Tensor) else torch.stack(list(layers))
        if stacked.shape[0] != self.num_layers:
            raise ValueError(f"ScalarMix was built for {self.num_layers} layers but got {stacked.shape[0]}.")
        weights = self.weights.to(stacked.dtype)
        return self.gamma.to(stacked.dtype) * torch.tensordot(weights, stacked, dims=([0], [0]))
