"""Diversity of ensemble members as torchmetrics ``Metric`` classes.

All three take member outputs shaped ``(B, K, ...)`` (members on axis 1, see
``ripieno.framework.members``), accumulate sums in float32 states reduced with ``sum`` across DDP ranks,
and compute under disabled autocast so that bf16 training still measures in float32.

* ``PairwiseKLDivergence``: mean over samples and ordered member pairs ``i != j`` of
  ``KL(p_i || p_j)`` between member predictive distributions.
* ``MemberDisagreement``: fraction of ordered member pairs whose argmax differs.
* ``Ambiguity``: mean squared deviation of members from the ensemble mean (regression),
  so that mean member MSE = ensemble MSE + ambiguity (Krogh & Vedelsby, 1995).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torchmetrics import Metric

InputKind = Literal["logits", "binary_logits", "probs"]


def member_log_probs(outputs: Tensor, kind: InputKind = "logits") -> Tensor:
    """Member log-probabilities ``(B, K, C)`` in float32.

    Args:
        outputs: ``(B, K, C)`` logits or probabilities; ``(B, K)`` or ``(B, K, 1)`` logits
            of the positive class for ``binary_logits``.
        kind: ``logits``, ``binary_logits`` or ``probs``.

    Returns:
        Log-probabilities, shape ``(B, K, C)`` (``C = 2`` for binary).
    """
    x = outputs.float()
    if kind == "binary_logits":
        x = x.reshape(x.shape[0], x.shape[1])
        return torch.stack([torch.nn.functional.logsigmoid(-x), torch.nn.functional.logsigmoid(x)], -1)
    if x.ndim != 3:
        raise ValueError(f"Expected member outputs (batch, members, classes), got {tuple(x.shape)}.")
    if kind == "logits":
        return torch.log_softmax(x, dim=-1)
    if kind == "probs":
        return x.clamp_min(torch.finfo(torch.float32).tiny).log()
    raise ValueError(f"Unknown input kind {kind!r}; use logits, binary_logits or probs.")


def _check_members(outputs: Tensor) -> None:
    if outputs.ndim < 2 or outputs.shape[1] < 2:
        raise ValueError(
            f"Diversity needs at least 2 members on axis 1, got shape {tuple(outputs.shape)}."
        )


class PairwiseKLDivergence(Metric):
    """Mean ``KL(p_i || p_j)`` over ordered member pairs ``i != j`` and samples.

    Uses ``sum_{i,j} KL(p_i||p_j) = K sum_i <p_i, log p_i> - <sum_i p_i, sum_j log p_j>``
    per sample (diagonal terms vanish), so the cost is ``O(K C)``, not ``O(K^2 C)``.

    Args:
        input_kind: ``logits`` (multiclass), ``binary_logits`` or ``probs``.

    Shape:
        - Input: ``outputs`` ``(B, K, C)``: batch, members (``K >= 2``), classes; ``(B, K)`` or
          ``(B, K, 1)`` positive-class logits for ``binary_logits``.
        - Output: a 0-d tensor (nats).

    Example:
        >>> metric = PairwiseKLDivergence(input_kind="probs")
        >>> metric.update(torch.tensor([[[0.5, 0.5], [0.25, 0.75]]]))  # (B=1, K=2, C=2)
        >>> metric.compute()  # (KL(p_1 || p_2) + KL(p_2 || p_1)) / 2 = log(3) / 8
        tensor(0.1373)
    """

    is_differentiable = True
    higher_is_better = None
    full_state_update = False

    def __init__(self, input_kind: InputKind = "logits", **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.input_kind = input_kind
        self.add_state("kl_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, outputs: Tensor) -> None:
        """Accumulate a batch of member outputs."""
        _check_members(outputs)
        with torch.autocast(outputs.device.type, enabled=False):
            log_p = member_log_probs(outputs, self.input_kind)
            p = log_p.exp()
            k = log_p.shape[1]
            self_term = (p * log_p).sum(dim=(1, 2))  # sum_i <p_i, log p_i>
            cross = (p.sum(1) * log_p.sum(1)).sum(-1)  # <sum_i p_i, sum_j log p_j>
            per_sample = (k * self_term - cross) / (k * (k - 1))
        self.kl_sum += per_sample.double().sum()
        self.total += per_sample.numel()

    def compute(self) -> Tensor:
        """Mean pairwise KL (nats)."""
        return (self.kl_sum / self.total).float()


class MemberDisagreement(Metric):
    """Fraction of ordered member pairs ``i != j`` whose predicted classes differ.

    With ``n_c`` members voting class ``c``, agreeing ordered pairs number
    ``sum_c n_c^2 - K``, so disagreement is ``1 - (sum_c n_c^2 - K) / (K (K - 1))``.

    Args:
        input_kind: ``logits`` (multiclass), ``binary_logits`` or ``probs``.

    Shape:
        - Input: ``outputs`` ``(B, K, C)``: batch, members (``K >= 2``), classes; ``(B, K)`` or
          ``(B, K, 1)`` positive-class logits for ``binary_logits``.
        - Output: a 0-d tensor in ``[0, 1]``.

    Example:
        >>> metric = MemberDisagreement()
        >>> metric.update(torch.tensor([[[2.0, 0.0], [1.0, 0.0], [0.0, 1.0]]]))  # votes 0, 0, 1
        >>> metric.compute()  # 1 - (2^2 + 1^2 - 3) / (3 * 2): 4 of the 6 ordered pairs disagree
        tensor(0.6667)
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, input_kind: InputKind = "logits", **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.input_kind = input_kind
        self.add_state("disagree_sum", default=torch.tensor(0.0, dtype=torch.float64),
                       dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, outputs: Tensor) -> None:
        """Accumulate a batch of member outputs."""
        _check_members(outputs)
        with torch.autocast(outputs.device.type, enabled=False):
            if self.input_kind == "binary_logits":
                votes = (outputs.float().reshape(outputs.shape[0], outputs.shape[1]) > 0).long()
                n_classes = 2
            else:
                votes = outputs.float().argmax(-1)
                n_classes = outputs.shape[-1]
            k = votes.shape[1]
            counts = torch.nn.functional.one_hot(votes, n_classes).sum(1).double()  # (B, C)
            agree = ((counts**2).sum(-1) - k) / (k * (k - 1))
        self.disagree_sum += (1.0 - agree).sum()
        self.total += agree.numel()

    def compute(self) -> Tensor:
        """Mean disagreement rate in ``[0, 1]``."""
        return (self.disagree_sum / self.total).float()


class Ambiguity(Metric):
    """Mean over samples, members and outputs of ``(f_k - f_bar)^2``.

    For regression members ``f_k`` with ensemble mean ``f_bar`` and target ``y``:
    ``mean_k (f_k - y)^2 = (f_bar - y)^2 + mean_k (f_k - f_bar)^2``.

    Shape:
        - Input: ``outputs`` ``(B, K)`` or ``(B, K, D)``: batch, members (``K >= 2``), outputs.
        - Output: a 0-d tensor (squared output units).

    Example:
        >>> metric = Ambiguity()
        >>> metric.update(torch.tensor([[1.0, 3.0], [2.0, 2.0]]))  # (B=2, K=2)
        >>> metric.compute()  # ((1^2 + 1^2) / 2 + 0) / 2
        tensor(0.5000)
    """

    is_differentiable = True
    higher_is_better = None
    full_state_update = False

    def __init__(self, **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.add_state("sq_sum", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, outputs: Tensor) -> None:
        """Accumulate a batch of member outputs ``(B, K)`` or ``(B, K, D)``."""
        _check_members(outputs)
        with torch.autocast(outputs.device.type, enabled=False):
            x = outputs.float()
            dev = (x - x.mean(1, keepdim=True)) ** 2
        self.sq_sum += dev.double().sum() / x.shape[1]
        self.total += dev.numel() // x.shape[1]

    def compute(self) -> Tensor:
        """Mean ambiguity (squared output units)."""
        return (self.sq_sum / self.total).float()
