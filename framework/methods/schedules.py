"""Learning-rate schedules with a linear warm-up, for recipes and Python.

``WarmupCosineLR`` and ``WarmupLinearLR`` are ``torch.optim.lr_scheduler.LambdaLR``
subclasses with the closed forms of ``transformers``' ``get_cosine_schedule_with_warmup``
(``get_cosine_with_min_lr_schedule_with_warmup`` with ``min_lr_rate``) and
``get_linear_schedule_with_warmup``: the learning rate rises linearly from 0 over
``warmup_steps``, then falls to ``min_lr_ratio`` times its peak at ``total_steps``. Each
parameter group keeps its own peak (its ``lr``), so groups with their own learning rate
(``backbone_lr``) follow the same shape.

They step once per optimizer step (``default_interval = "step"``). In a recipe, name one under
LightningCLI's top-level ``lr_scheduler:`` key; ``total_steps`` left unset is filled by the
``ripieno`` command with the run's length (``trainer.estimated_stepping_batches``):

.. code-block:: yaml

    lr_scheduler:
      class_path: ripieno.framework.methods.schedules.WarmupCosineLR
      init_args:
        warmup_steps: 100

Example:
    >>> import torch
    >>> from ripieno.framework.methods.schedules import WarmupLinearLR
    >>> optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    >>> schedule = WarmupLinearLR(optimizer, warmup_steps=2, total_steps=6)
    >>> rates = []
    >>> for _ in range(6):
    ...     rates.append(schedule.get_last_lr()[0])
    ...     optimizer.step()
    ...     schedule.step()
    >>> rates
    [0.0, 0.5, 1.0, 0.75, 0.5, 0.25]
"""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR

from ripieno.framework.errors import RipienoInputError

__all__ = ["ScheduleError", "WarmupCosineLR", "WarmupLinearLR"]


class ScheduleError(RipienoInputError):
    """A schedule's arguments cannot make a schedule (a negative warm-up, no length)."""


class _WarmupLR(LambdaLR):
    """Linear warm-up from 0 over ``warmup_steps``, then ``decay(step)`` down to ``min_lr_ratio``."""

    default_interval: ClassVar[Literal["step", "epoch"]] = "step"
    """How often Lightning steps the schedule unless the run says otherwise (``--lr_scheduler_interval``)."""

    def __init__(self, optimizer: Optimizer, warmup_steps: int, total_steps: int | None = None,
                 min_lr_ratio: float = 0.0) -> None:
        name = type(self).__name__
        if total_steps is None:
            raise ScheduleError(f"{name}: total_steps is not set; give init_args.total_steps (the ripieno"
                                " command fills it with the run's number of optimizer steps).")
        if warmup_steps < 0 or total_steps < 1:
            raise ScheduleError(f"{name}: warmup_steps={warmup_steps}, total_steps={total_steps}; use"
                                " warmup_steps >= 0 and total_steps >= 1.")
        if not 0.0 <= min_lr_ratio <= 1.0:
            raise ScheduleError(f"{name}: min_lr_ratio={min_lr_ratio} is outside [0, 1]; it is the final"
                                " learning rate as a fraction of the peak.")
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.min_lr_ratio = float(min_lr_ratio)
        super().__init__(optimizer, lr_lambda=self.factor)

    def factor(self, step: int) -> float:
        """The multiple of each group's peak learning rate after ``step`` scheduler steps."""
        if step < self.warmup_steps:
            return step / max(1, self.warmup_steps)
        return max(0.0, self.decay(step) * (1.0 - self.min_lr_ratio) + self.min_lr_ratio)

    def decay(self, step: int) -> float:
        """The decay's shape after warm-up: 1 at ``warmup_steps``, 0 at ``total_steps``."""
        raise NotImplementedError


class WarmupCosineLR(_WarmupLR):
    """Linear warm-up, then half a cosine down to ``min_lr_ratio`` times the peak learning rate.

    Equal to ``transformers.get_cosine_schedule_with_warmup(optimizer, warmup_steps, total_steps)``
    (``get_cosine_with_min_lr_schedule_with_warmup(..., min_lr_rate=min_lr_ratio)`` when
    ``min_lr_ratio > 0``).

    Args:
        optimizer: The optimizer; every parameter group's ``lr`` is its peak.
        warmup_steps: Steps of the linear rise from 0 to the peak.
        total_steps: Steps of the whole schedule; ``None`` in a recipe lets the ``ripieno``
            command fill in the run's number of optimizer steps (required from Python).
        min_lr_ratio: Final learning rate as a fraction of the peak, in ``[0, 1]``.

    Example:
        >>> import torch
        >>> optimizer = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1e-3)
        >>> schedule = WarmupCosineLR(optimizer, warmup_steps=10, total_steps=110, min_lr_ratio=0.1)
        >>> [round(schedule.factor(step), 3) for step in (0, 5, 10, 60, 110)]
        [0.0, 0.5, 1.0, 0.55, 0.1]
    """

    def decay(self, step: int) -> float:
        """``(1 + cos(pi * progress)) / 2``, progress going from 0 (end of warm-up) to 1 (``total_steps``)."""
        progress = (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * progress))


class WarmupLinearLR(_WarmupLR):
    """Linear warm-up, then a linear fall to ``min_lr_ratio`` times the peak learning rate.

    Equal to ``transformers.get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)``
    when ``min_lr_ratio`` is 0.

    Args:
        optimizer: The optimizer; every parameter group's ``lr`` is its peak.
        warmup_steps: Steps of the linear rise from 0 to the peak.
        total_steps: Steps of the whole schedule; ``None`` in a recipe lets the ``ripieno``
            command fill in the run's number of optimizer steps (required from Python).
        min_lr_ratio: Final learning rate as a fraction of the peak, in ``[0, 1]``.

    Example:
        >>> import torch
        >>> optimizer = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=1e-3)
        >>> schedule = WarmupLinearLR(optimizer, warmup_steps=10, total_steps=110)
        >>> [schedule.factor(step) for step in (0, 5, 10, 60, 110, 200)]
        [0.0, 0.5, 1.0, 0.5, 0.0, 0.0]
    """

    def decay(self, step: int) -> float:
        """``1 - progress``, and 0 from ``total_steps`` on."""
        return max(0.0, (self.total_steps - step) / max(1, self.total_steps - self.warmup_steps))
