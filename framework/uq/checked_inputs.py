"""Input checks shared by the conformal and calibration code: real float64 values and class labels.

Each raises the caller's one-line error type (``ConformalError``, ``CalibrationError``) naming the
function, the argument, the problem and the fix.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ripieno.framework.errors import RipienoInputError


def real_float64(values: Tensor | np.ndarray | Sequence[Any], name: str, where: str,
                 error: type[RipienoInputError]) -> Tensor:
    """``values`` as a CPU float64 tensor, refusing complex, boolean and NaN values.

    Python numbers and lists go straight to float64 (``torch.as_tensor`` would round them to float32).

    Example:
        >>> real_float64([0.1, 2], "y", "f", RipienoInputError).dtype
        torch.float64
    """
    tensor = torch.as_tensor(values) if isinstance(values, Tensor | np.ndarray) else torch.as_tensor(
        values, dtype=torch.float64)
    if tensor.is_complex() or tensor.dtype == torch.bool:
        raise error(f"{where}: {name} has dtype {tensor.dtype}; give real numbers.")
    tensor = tensor.detach().to(device="cpu", dtype=torch.float64)
    n_nan = int(torch.isnan(tensor).sum())
    if n_nan:
        raise error(f"{where}: {name} has {n_nan} NaN value(s); drop or fix those rows.")
    return tensor


def class_labels(values: Tensor | np.ndarray | Sequence[Any], n: int, num_classes: int, where: str,
                 error: type[RipienoInputError], *, name: str, rows_of: str, order: str) -> Tensor:
    """``n`` class indices in ``0..num_classes - 1`` as a long tensor.

    Args:
        values: the labels.
        n: the rows they must match.
        num_classes: the number of classes.
        where: the calling function, named in errors.
        error: the caller's error type.
        name: the labels' argument name.
        rows_of: the argument whose rows they must match.
        order: where the class order comes from (named in the fix).

    Example:
        >>> class_labels([0, 2], 2, 3, "f", RipienoInputError, name="y", rows_of="x", order="x's columns")
        tensor([0, 2])
    """
    floats = real_float64(values, name, where, error)
    if floats.ndim != 1 or floats.shape[0] != n:
        raise error(f"{where}: {name} has shape {tuple(floats.shape)} but {rows_of} has {n} rows; give one"
                    f" label per row, shape ({n},).")
    bad = (floats != floats.round()) | (floats < 0) | (floats > num_classes - 1)
    if bad.any():
        raise error(f"{where}: {name} holds {floats[bad][0].item():g}, not a class index in"
                    f" 0..{num_classes - 1}; encode the classes as integers 0..{num_classes - 1} in the order"
                    f" of {order}.")
    return floats.long()
