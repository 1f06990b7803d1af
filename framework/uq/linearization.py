"""Jacobian products of a network linearised around its trained weights ``theta*``.

``f_lin(x; theta) = f(x; theta*) + J(x) (theta - theta*)``. A GLM sampler only needs
``J(x) V`` and ``J(x)^T U`` for a block of S directions at once, never ``J`` itself:

* ``LastLayerLinearization`` (LL-GLM): only the last ``nn.Linear`` (weight and bias) is
  random. With penultimate features ``phi(x)``, ``J(x) [V_W, v_b] = V_W phi(x) + v_b``,
  one ``einsum`` on cached features: the ``phi (x) I`` Kronecker Jacobian is never
  formed (laplace-torch issue #138). A packed ``EnsembleLinear`` head (K members, each
  its own ``W_k, b_k``: the tabular ensembles) is linearised member by member: every
  (row, member) pair is one output block with its own features ``phi_k(x)``, so the
  posterior of the K heads is the product of K independent last-layer posteriors.
* ``FullNetworkLinearization`` (DNN-GLM): every trainable parameter, with
  ``torch.func.jvp``/``vjp`` over ``functional_call`` and ``vmap`` over the S
  directions. Attention runs on the math SDPA backend, the only one with forward-mode
  AD on CPU and CUDA.

Directions are flat float32 vectors of length ``n_params`` stacked as ``(S, n_params)``;
outputs are ``(S, B, C)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, jvp, vjp, vmap
from torch.nn.attention import SDPBackend, sdpa_kernel

from ripieno.framework.nn.ensemble_linear import EnsembleLinear

InputFn = Callable[[Any], Any]


LastLayer = nn.Linear | EnsembleLinear


def call_model(model: nn.Module, inputs: Any) -> Tensor:  # noqa: ANN401
    """``model(*inputs)`` for a tuple of inputs, else ``model(inputs)``."""
    return model(*inputs) if isinstance(inputs, tuple) else model(inputs)


def _is_last_layer(module: nn.Module) -> bool:
    packed = isinstance(module, EnsembleLinear) and module.adapter == "packed"
    return isinstance(module, nn.Linear) or packed


def find_last_linear(model: nn.Module, name: str | None = None) -> tuple[str, LastLayer]:
    """The module named ``name``, or the last linear layer registered in ``model``.

    A linear layer is an ``nn.Linear`` or a packed ``EnsembleLinear`` (independent member
    heads); an ``EnsembleLinear`` with shared or adapter weights ties its members and is
    not a last layer in this sense.

    Raises:
        ValueError: if the name is unknown, not a linear layer, or the model has none.
    """
    if name is not None:
        modules = dict(model.named_modules())
        if name not in modules:
            raise ValueError(f"No module named {name!r}; some names: {list(modules)[-8:]}.")
        if not _is_last_layer(modules[name]):
            kind = type(modules[name]).__name__
            if isinstance(modules[name], EnsembleLinear):
                kind += f" with adapter={modules[name].adapter!r} (members share weights)"
            raise ValueError(f"Module {name!r} is a {kind}, not nn.Linear or a packed EnsembleLinear.")
        return name, modules[name]
    linears = [(n, m) for n, m in model.named_modules() if _is_last_layer(m)]
    if not linears:
        raise ValueError(f"{type(model).__name__} has no nn.Linear or packed EnsembleLinear;"
                         " pass last_layer_name.")
    return linears[-1]


class LastLayerLinearization:
    """Exact linearisation in the last linear layer, from penultimate features.

    Parameters are flattened as ``[W.flatten(), b]``, the order ``named_parameters`` of an
    ``nn.Linear`` gives, so a network that is one linear layer has the same parameter
    vector under LL-GLM and DNN-GLM. For a packed ``EnsembleLinear`` head ``W`` is
    ``(K, C, D)`` and ``b`` is ``(K, C)``; outputs are then ``(B * K, C)``, row-major in
    ``(row, member)``, and ``members`` is ``K`` (``None`` for an ``nn.Linear``).

    Args:
        model: the trained network (kept frozen).
        input_fn: maps a batch to the model's input (a tuple is unpacked as arguments).
        last_layer_name: name of the last ``nn.Linear`` (default: the last one found).
    """

    def __init__(self, model: nn.Module, input_fn: InputFn, last_layer_name: str | None = None) -> None:
        self.model, self.input_fn = model, input_fn
        self.layer_name, self.layer = find_last_linear(model, last_layer_name)
        self.n_outputs, self.n_features = self.layer.out_features, self.layer.in_features
        self.members: int | None = self.layer.k if isinstance(self.layer, EnsembleLinear) else None
        self.has_bias = self.layer.bias is not None
        k = self.members or 1
        self.n_weights = k * self.n_outputs * self.n_features
        self.n_params = self.n_weights + (k * self.n_outputs if self.has_bias else 0)

    @torch.no_grad()
    def features_and_outputs(self, batch: Any) -> tuple[Tensor, Tensor]:  # noqa: ANN401
        """``(phi(x) (B, D), f(x; theta*) (B, C))`` in float32.

        Member heads: ``(phi (B, K, D), outputs (B * K, C))``.
        """
        captured: list[Tensor] = []
        handle = self.layer.register_forward_hook(lambda m, inp, out: captured.append(inp[0]))
        try:
            outputs = call_model(self.model, self.input_fn(batch))
        finally:
            handle.remove()
        if not captured:
            raise RuntimeError(f"The forward pass never called {self.layer_name!r}.")
        if self.members is not None:
            phi = captured[-1].float().flatten(0, -3)
            return phi, outputs.float().reshape(phi.shape[0] * self.members, -1)
        phi = captured[-1].float().flatten(0, -2)
        return phi, outputs.float().reshape(phi.shape[0], -1)

    def expand_target(self, target: Tensor) -> Tensor:
        """Targets per output row: repeated for each member head (``(B,) -> (B * K,)``)."""
        return target if self.members is None else target.repeat_interleave(self.members, dim=0)

    def arrange(self, predictions: Tensor) -> Tensor:
        """``(S, rows, C)`` predictions -> ``(B, S', C)``, samples on axis 1.

        Member heads give ``S' = S * K``: each (sample, member) pair is one draw of the
        ensemble's predictive, a uniform mixture over members.
        """
        if self.members is None:
            return predictions.transpose(0, 1)
        s, rows, c = predictions.shape
        per_member = predictions.view(s, rows // self.members, self.members, c)
        return per_member.permute(1, 0, 2, 3).reshape(rows // self.members, s * self.members, c)

    def theta_star(self) -> Tensor:
        """Flat ``[W.flatten(), b]`` of the trained last layer."""
        parts = [self.layer.weight.flatten()] + ([self.layer.bias.flatten()] if self.has_bias else [])
        return torch.cat(parts).detach().float()

    def jvp(self, features: Tensor, directions: Tensor) -> Tensor:
        """``J V``: ``(S, n_params)`` directions -> ``(S, B, C)`` (``(S, B * K, C)`` for members)."""
        if self.members is not None:
            k, c = self.members, self.n_outputs
            w = directions[:, : self.n_weights].view(-1, k, c, self.n_features)
            out = torch.einsum("skcd,bkd->sbkc", w, features)
            if self.has_bias:
                out = out + directions[:, None, self.n_weights :].view(-1, 1, k, c)
            return out.flatten(1, 2)
        w = directions[:, : self.n_weights].view(-1, self.n_outputs, self.n_features)
        out = torch.einsum("scd,bd->sbc", w, features)
        return out + directions[:, None, self.n_weights :] if self.has_bias else out

    def vjp(self, features: Tensor, cotangents: Tensor) -> Tensor:
        """``J^T U``: ``(S, B, C)`` (``(S, B * K, C)`` for members) -> ``(S, n_params)``."""
        if self.members is not None:
            u = cotangents.view(cotangents.shape[0], -1, self.members, self.n_outputs)
            grad_w = torch.einsum("sbkc,bkd->skcd", u, features).flatten(1)
            return torch.cat([grad_w, u.sum(1).flatten(1)], dim=1) if self.has_bias else grad_w
        grad_w = torch.einsum("sbc,bd->scd", cotangents, features).flatten(1)
        return torch.cat([grad_w, cotangents.sum(1)], dim=1) if self.has_bias else grad_w


class FullNetworkLinearization:
    """Linearisation in every trainable parameter, by ``torch.func`` Jacobian products.

    Args:
        model: the trained network (kept frozen, evaluated in eval mode by the caller).
        input_fn: maps a batch to the model's input (a tuple is unpacked as arguments).
    """

    def __init__(self, model: nn.Module, input_fn: InputFn) -> None:
        self.model, self.input_fn = model, input_fn
        self.params = {k: v.detach() for k, v in model.named_parameters() if v.requires_grad}
        if not self.params:
            raise ValueError(f"{type(model).__name__} has no trainable parameters to linearise.")
        self.buffers = {k: v.detach() for k, v in model.named_buffers()}
        self.shapes = {k: v.shape for k, v in self.params.items()}
        self.n_params = sum(v.numel() for v in self.params.values())
        self.n_outputs: int | None = None
        self.members: int | None = None  # set from a (B, K, C) output: K member heads

    def theta_star(self) -> Tensor:
        """All trainable parameters as one flat float32 vector."""
        return torch.cat([v.float().flatten() for v in self.params.values()])

    def _unflatten(self, flat: Tensor) -> dict[str, Tensor]:
        out, start = {}, 0
        for name, shape in self.shapes.items():
            size = shape.numel()
            out[name] = flat[start : start + size].view(shape).to(self.params[name].dtype)
            start += size
        return out

    def _function(self, batch: Any) -> Callable[[dict[str, Tensor]], Tensor]:  # noqa: ANN401
        inputs = self.input_fn(batch)
        args = inputs if isinstance(inputs, tuple) else (inputs,)

        def f(params: dict[str, Tensor]) -> Tensor:
            out = functional_call(self.model, (params, self.buffers), args)
            if out.dim() == 3:  # (B, K, C): one output row per (row, member)
                self.members = out.shape[1]
                return out.float().reshape(-1, out.shape[-1])
            return out.float().reshape(out.shape[0], -1)

        return f

    @torch.no_grad()
    def features_and_outputs(self, batch: Any) -> tuple[Any, Tensor]:  # noqa: ANN401
        """``(batch, f(x; theta*))``: the full network keeps the batch as its "features"."""
        outputs = self._function(batch)(self.params)
        self.n_outputs = outputs.shape[1]
        return batch, outputs

    def expand_target(self, target: Tensor) -> Tensor:
        """Targets per output row: repeated for each member (``(B,) -> (B * K,)``)."""
        return target if self.members is None else target.repeat_interleave(self.members, dim=0)

    def arrange(self, predictions: Tensor) -> Tensor:
        """``(S, rows, C)`` -> ``(B, S', C)``; members give ``S' = S * K`` (see LL-GLM)."""
        if self.members is None:
            return predictions.transpose(0, 1)
        s, rows, c = predictions.shape
        per_member = predictions.view(s, rows // self.members, self.members, c)
        return per_member.permute(1, 0, 2, 3).reshape(rows // self.members, s * self.members, c)

    def jvp(self, batch: Any, directions: Tensor) -> Tensor:  # noqa: ANN401
        """``J V``: ``(S, n_params)`` -> ``(S, B, C)`` (forward mode, vmapped over S)."""
        f = self._function(batch)

        def one(direction: Tensor) -> Tensor:
            return jvp(f, (self.params,), (self._unflatten(direction),))[1]

        with sdpa_kernel(SDPBackend.MATH):
            return vmap(one)(directions)

    def vjp(self, batch: Any, cotangents: Tensor) -> Tensor:  # noqa: ANN401
        """``J^T U``: ``(S, B, C)`` -> ``(S, n_params)`` (reverse mode, vmapped over S)."""
        with sdpa_kernel(SDPBackend.MATH):
            _, pullback = vjp(self._function(batch), self.params)
            grads = vmap(pullback)(cotangents)[0]
        return torch.cat([grads[k].float().flatten(1) for k in self.shapes], dim=1)
