"""Collapse rules: how M trained copies become one predictor.

* ``mean_weights``: one network of the base architecture whose weights are the copies'
  mean (or the parameters a callback installed, e.g. EASGD's centre); for binary
  perceptrons ``sign(sum_a w_a)``, the sign of the mean weights.
* ``best_copy``: the copy with the best score on the *validation* split (highest accuracy,
  ties to the lower NLL, then to the lower index), chosen at the end of every validation
  epoch and stored in the module's state, so that test and predict after loading a
  checkpoint use the copy chosen on validation for those weights; never chosen on test data.
* ``copy_average``: the ensemble of the copies, the mean of their predicted probabilities
  (binary perceptrons: the majority vote of the copies' labels).

``CopyScores`` accumulates every copy's own accuracy and NLL over an epoch (summed across
DDP ranks), from which ``best_copy_index`` chooses.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor
from torchmetrics import Metric

CollapseRule = Literal["mean_weights", "best_copy", "copy_average"]
COLLAPSE_RULES: tuple[str, ...] = get_args(CollapseRule)


def check_collapse_rule(rule: str) -> CollapseRule:
    """``rule`` if it is one of ``COLLAPSE_RULES``, else a ``ValueError`` naming them."""
    if rule not in COLLAPSE_RULES:
        raise ValueError(f"collapse must be one of {COLLAPSE_RULES}, got {rule!r}.")
    return rule  # type: ignore[return-value]


class CopyScores(Metric):
    """Every copy's own accuracy and mean NLL over the rows seen, ``(M,)`` each.

    Args:
        m: number of copies ``M``.

    Shape:
        - Input: ``correct`` ``(B, M)``: batch, copies (members), bool or 0/1; ``nll`` ``(B, M)``
          or ``None``.
        - Output: ``{"accuracy": (M,), "nll": (M,)}``, float64 (0-d for ``M = 1``; ``per_copy``
          keeps ``(M,)``).

    Example:
        >>> scores = CopyScores(m=2)
        >>> scores.update(torch.tensor([[True, False], [True, True]]), torch.tensor([[0.5, 2.0], [1.5, 1.0]]))
        >>> per_copy = scores.per_copy()
        >>> per_copy["accuracy"]  # (1 + 1) / 2, (0 + 1) / 2
        tensor([1.0000, 0.5000], dtype=torch.float64)
        >>> per_copy["nll"]  # (0.5 + 1.5) / 2, (2 + 1) / 2
        tensor([1.0000, 1.5000], dtype=torch.float64)
    """

    full_state_update = False
    correct: Tensor
    nll: Tensor
    total: Tensor

    def __init__(self, m: int) -> None:
        super().__init__()
        self.add_state("correct", torch.zeros(m, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("nll", torch.zeros(m, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, correct: Tensor, nll: Tensor | None = None) -> None:
        """Add a batch.

        Args:
            correct: ``(B, M)``: whether copy ``a`` got row ``i`` right.
            nll: ``(B, M)`` per-copy negative log-likelihoods, or ``None`` (zeros: hard
                classifiers).
        """
        self.correct += correct.to(torch.float64).sum(0)
        if nll is not None:
            self.nll += nll.detach().to(torch.float64).sum(0)
        self.total += correct.shape[0]

    def compute(self) -> dict[str, Tensor]:
        """``accuracy`` and ``nll`` of every copy, float64 (NaN before any row).

        torchmetrics squeezes one-element results, so for ``M = 1`` these are scalars;
        ``per_copy`` always gives ``(M,)``.
        """
        return {"accuracy": self.correct / self.total, "nll": self.nll / self.total}

    def per_copy(self) -> dict[str, Tensor]:
        """``compute()`` shaped ``(M,)`` for every ``M`` (synced across DDP ranks)."""
        return {name: value.reshape(-1) for name, value in self.compute().items()}


def best_copy_index(accuracy: Tensor, nll: Tensor | None = None) -> int:
    """The copy with the highest accuracy; ties to the lower NLL, then to the lower index.

    Args:
        accuracy: ``(M,)`` per-copy accuracies.
        nll: ``(M,)`` per-copy NLLs (``None``: ties go to the lower index).

    Returns:
        The chosen copy's index.
    """
    accuracy = accuracy.to(torch.float64).cpu()
    tied = accuracy == accuracy.max()
    if nll is not None:
        nll = torch.where(tied, nll.to(torch.float64).cpu(), torch.inf)
        tied = tied & (nll == nll.min())
    return int(tied.nonzero()[0, 0])
