"""Member predictions as a table users read: named classes, a label, and the member spread."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd
from torch import Tensor

PROBABILITY_PREFIX = "proba_"


def prediction_table(
    member_predictions: Tensor,
    class_names: Sequence[object] | None = None,
    to_original_units: Callable[[Tensor], Tensor] | None = None,
) -> pd.DataFrame:
    """One row per input row: the ensemble prediction and how much the members disagree.

    Classification (``member_predictions`` of shape ``(B, K, C)``, probabilities):
    ``proba_<class>`` (mean member probability, summing to 1), ``prediction`` (the class of
    highest mean probability, as given in ``class_names``: an integer label stays an
    integer), ``member_std`` (population std across members of that
    class's probability) and ``disagreement`` (fraction of members whose own top class
    differs from ``prediction``). Regression (``(B, K)`` in the modelled units):
    ``prediction`` (``to_original_units`` of the member mean: for a log target the
    geometric mean of the members' predictions) and ``member_std`` (population std across
    members in original units).

    Args:
        member_predictions: ``(B, K, C)`` probabilities or ``(B, K)`` regression values.
        class_names: class labels in code order, any type (default ``"0"``, ``"1"``, ...);
            probability columns use their string form.
        to_original_units: map from modelled to original target units (regression).

    Example:
        >>> import torch
        >>> probs = torch.tensor([[[0.9, 0.1], [0.3, 0.7]]])
        >>> print(prediction_table(probs, ["no", "yes"]).to_string(index=False))
         proba_no  proba_yes prediction  member_std  disagreement
              0.6        0.4         no         0.3           0.5
        >>> print(prediction_table(torch.tensor([[1.0, 3.0]])).to_string(index=False))
         prediction  member_std
                2.0         1.0
    """
    members = member_predictions.detach().float().cpu()
    unit = to_original_units or (lambda t: t)
    if members.ndim == 2:
        return pd.DataFrame({
            "prediction": unit(members.mean(1)).numpy(),
            "member_std": unit(members).std(1, correction=0).numpy(),
        })
    if members.ndim != 3:
        raise ValueError(f"member_predictions must be (B, K, C) or (B, K), got {tuple(members.shape)}.")
    n_classes = members.shape[-1]
    labels = list(class_names) if class_names else [str(c) for c in range(n_classes)]
    names = [str(c) for c in labels]
    if len(names) != n_classes:
        raise ValueError(f"{len(names)} class names for {n_classes} classes.")
    mean = members.mean(1)
    label = mean.argmax(-1)
    chosen = members.gather(2, label[:, None, None].expand(-1, members.shape[1], 1))[..., 0]
    table = pd.DataFrame(mean.numpy(), columns=[PROBABILITY_PREFIX + n for n in names])
    table["prediction"] = [labels[i] for i in label.tolist()]
    table["member_std"] = chosen.std(1, correction=0).numpy()
    table["disagreement"] = (members.argmax(-1) != label[:, None]).float().mean(1).numpy()
    return table


def insert_ids(table: pd.DataFrame, name: str, ids: Sequence[object]) -> pd.DataFrame:
    """``table`` with the id column ``name`` first (a clash with a result column is an error)."""
    if name in table.columns:
        raise ValueError(f"The id column {name!r} clashes with a prediction column; rename it.")
    table.insert(0, name, list(ids))
    return table

