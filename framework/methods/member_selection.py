"""Member selection after training: keep the members that make the best smaller ensemble.

The ``tabm`` README notes that the best members of a trained ensemble can beat an ensemble
trained at the smaller size. Two rules, both scored on validation rows:

* ``greedy``: Caruana et al. (2004) forward selection with replacement: start empty and
  ``k`` times add the member (possibly one already chosen) whose addition gives the
  ensemble mean with the best ``metric``. A member chosen twice counts twice in the mean,
  so the result is a weighted ensemble with integer weights.
* ``topk``: the ``k`` members with the best ``metric`` on their own.

``subset_members`` then builds the smaller module: the same hyperparameters with ``k`` set
to the number of chosen members (duplicates kept, so its prediction is exactly the mean
over the chosen list) and each member-axis tensor indexed along its member axis.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ripieno.framework.errors import RipienoInputError

SelectionMethod = Literal["greedy", "topk"]
SelectionMetric = Literal["loss", "error"]
METHODS: tuple[str, ...] = ("greedy", "topk")
METRICS: tuple[str, ...] = ("loss", "error")


@dataclass(frozen=True)
class MemberSelection:
    """What ``select_members`` chose: member indices (with repeats), and the validation scores.

    Attributes:
        indices: chosen members of the trained ensemble, in the order they were added.
        method: ``greedy`` or ``topk``.
        metric: ``loss`` (NLL of the mean probability, or MSE of the mean prediction in
            the modelled units) or ``error`` (classification error rate).
        score: ``metric`` of the selected ensemble on the validation rows.
        score_all: ``metric`` of the full trained ensemble on the same rows.
    """

    indices: list[int]
    method: str
    metric: str
    score: float
    score_all: float

    def to_dict(self) -> dict[str, Any]:
        """Plain-Python form (for checkpoints and logs)."""
        return asdict(self)


def ensemble_score(member_predictions: Tensor, target: Tensor, metric: SelectionMetric = "loss") -> Tensor:
    """``metric`` of the mean over the member axis (axis 1); lower is better.

    Args:
        member_predictions: ``(N, K, C)`` probabilities, or ``(N, K)`` regression values.
        target: ``(N,)`` class indices, or regression targets in the same units.
        metric: ``loss`` or ``error``.

    Example:
        >>> probs = torch.tensor([[[0.9, 0.1], [0.2, 0.8]]])
        >>> round(ensemble_score(probs, torch.tensor([0])).item(), 4)  # -log(0.55)
        0.5978
        >>> ensemble_score(torch.tensor([[1.0, 3.0]]), torch.tensor([2.5])).item()
        0.25
    """
    mean = member_predictions.mean(1)
    if member_predictions.ndim == 2:
        if metric != "loss":
            raise ValueError(f"metric {metric!r} needs classification; use metric='loss' (MSE).")
        return F.mse_loss(mean, target.to(mean.dtype))
    if metric == "error":
        return (mean.argmax(-1) != target).to(mean.dtype).mean()
    return F.nll_loss(mean.clamp_min(torch.finfo(mean.dtype).tiny).log(), target)


def check_member_count(k: object, method: str, n_members: int | None = None) -> int:
    """``k`` as an ``int`` if ``method`` can keep ``k`` of ``n_members`` members, else a one-line error.

    ``greedy`` selects with replacement, so any ``k >= 1`` is valid; ``topk`` keeps distinct
    members, so ``1 <= k <= n_members`` (unchecked while ``n_members`` is ``None``). NumPy
    integers count as ints, ``bool`` does not.

    Raises:
        RipienoInputError: (a ``ValueError``) the bad ``k``, the valid range and the fix.

    Example:
        >>> check_member_count(12, "greedy", 8)  # members may repeat
        12
        >>> try:
        ...     check_member_count(9, "topk", 8)
        ... except ValueError as error:
        ...     print(str(error).split(";")[0])
        topk keeps distinct members: k=9 > the 8 trained members
    """
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise RipienoInputError(f"k must be an int >= 1 (the members to keep), got {k!r}"
                                f" ({type(k).__name__}).")
    k = int(k)
    topk = "at most the trained members" if n_members is None else f"1 to {n_members}, the trained members"
    if k < 1:
        raise RipienoInputError(f"k={k}: at least 1 member must be kept; give k >= 1 (greedy: any k >= 1,"
                                f" members may repeat; topk: {topk}).")
    if method == "topk" and n_members is not None and k > n_members:
        raise RipienoInputError(f"topk keeps distinct members: k={k} > the {n_members} trained members;"
                                f" give k from 1 to {n_members}, or method='greedy' (it selects with"
                                " replacement: any k >= 1).")
    return k


def choose_members(member_predictions: Tensor, target: Tensor, k: int, method: SelectionMethod = "greedy",
                   metric: SelectionMetric = "loss") -> MemberSelection:
    """Pick ``k`` members of ``member_predictions`` (``(N, K, ...)``) by ``method``.

    Ties go to the lower member index, so the choice is deterministic.

    Raises:
        RipienoInputError: a ``k`` that ``method`` cannot give (``check_member_count``).
        ValueError: an unknown ``method`` or ``metric``, or no (or mismatched) validation rows.

    Example:
        >>> probs = torch.tensor([[[0.6, 0.4], [0.1, 0.9], [0.9, 0.1]],
        ...                       [[0.6, 0.4], [0.9, 0.1], [0.1, 0.9]]])
        >>> choose_members(probs, torch.tensor([0, 0]), k=2).indices  # 1 and 2 cancel out
        [0, 0]
        >>> choose_members(probs, torch.tensor([0, 0]), k=2, method="topk").indices
        [0, 1]
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}.")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}.")
    n_members = member_predictions.shape[1]
    k = check_member_count(k, method, n_members)
    if target.shape[0] != member_predictions.shape[0] or target.shape[0] == 0:
        raise ValueError(f"{member_predictions.shape[0]} prediction rows for {target.shape[0]} targets;"
                         " selection needs the same, non-zero number of validation rows.")
    preds = member_predictions.double()
    if method == "topk":
        own = torch.stack([ensemble_score(preds[:, j:j + 1], target, metric) for j in range(n_members)])
        indices = sorted(range(n_members), key=lambda j: (own[j].item(), j))[:k]
    else:
        indices, total = [], torch.zeros_like(preds[:, 0])
        for step in range(1, k + 1):
            scores = [ensemble_score(((total + preds[:, j]) / step)[:, None], target, metric).item()
                      for j in range(n_members)]
            best = min(range(n_members), key=lambda j: (scores[j], j))
            indices.append(best)
            total = total + preds[:, best]
    return MemberSelection(
        indices=indices, method=method, metric=metric,
        score=float(ensemble_score(preds[:, indices], target, metric)),
        score_all=float(ensemble_score(preds, target, metric)),
    )


def member_axis_keys(build: Any, k: int) -> set[str]:  # noqa: ANN401
    """State-dict keys whose first axis is the member axis, found by building at ``k`` and ``k + 1``.

    Args:
        build: ``build(k)`` returns a fresh module with ``k`` members.
        k: a member count.
    """
    with torch.random.fork_rng(devices=[]):
        small, large = build(k).state_dict(), build(k + 1).state_dict()
    keys = set()
    for key, tensor in small.items():
        other = large[key].shape
        if other == tensor.shape:
            continue
        if tensor.ndim == 0 or (tensor.shape[0], other[0]) != (k, k + 1) or other[1:] != tensor.shape[1:]:
            raise ValueError(f"{key}: shape {tuple(tensor.shape)} at k={k} vs {tuple(other)} at k={k + 1};"
                             " only tensors with the member axis first can be subset.")
        keys.add(key)
    return keys


def subset_members(module: torch.nn.Module, indices: Sequence[int]) -> torch.nn.Module:
    """A new module of ``module``'s class with the members ``indices`` (repeats allowed).

    The module must be rebuilt by ``type(module)(**module.hparams)`` and take its member
    count as ``k`` (ripieno's tabular ensembles do).
    """
    hparams = dict(getattr(module, "hparams", {}))
    if "k" not in hparams:
        raise TypeError(f"{type(module).__name__} has no 'k' hyperparameter; member selection needs a"
                        " module rebuilt by type(module)(**hparams) with k members.")
    n_members = int(hparams["k"])
    bad = [i for i in indices if not 0 <= int(i) < n_members]
    if not indices or bad:
        raise ValueError(f"Member indices must be in [0, {n_members}); got {list(indices)}.")

    def build(k: int) -> torch.nn.Module:
        return type(module)(**{**hparams, "k": k})

    keys = member_axis_keys(build, n_members)
    with torch.random.fork_rng(devices=[]):
        selected = build(len(indices))
    index = torch.as_tensor(list(indices), dtype=torch.long)
    state = {key: (value.index_select(0, index.to(value.device)) if key in keys else value)
             for key, value in module.state_dict().items()}
    selected.load_state_dict(state)
    return selected.to(next(module.parameters()).device)


@torch.no_grad()
def collect_member_predictions(module: Any, batches: Iterable[dict[str, Tensor]]  # noqa: ANN401
                               ) -> tuple[Tensor, Tensor]:
    """``(member predictions (N, K, ...), targets (N,))`` of ``module`` over ``batches``, in eval mode."""
    from ripieno.framework.members import member_predictions

    device = next(module.parameters()).device
    was_training = module.training
    module.eval()
    preds, targets = [], []
    try:
        for batch in batches:
            batch = {key: value.to(device) for key, value in batch.items()}
            if "y" not in batch:
                raise ValueError("Member selection needs labelled validation rows (a 'y' in each batch).")
            preds.append(member_predictions(module.forward_members(batch), module.member_output_kind).cpu())
            targets.append(batch["y"].cpu())
    finally:
        module.train(was_training)
    if not preds:
        raise ValueError("The validation data has no batches; member selection needs validation rows.")
    return torch.cat(preds), torch.cat(targets)
