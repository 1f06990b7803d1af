"""What a perceptron model must know about its teacher-student data (``ripieno.framework.mcover``)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from ripieno.framework.specs.base import DataSpec


@dataclass
class TeacherStudentSpec(DataSpec):
    """What a perceptron model must know about its teacher-student data.

    Attributes:
        n_inputs: ``N``.
        n_train: training patterns ``P = round(alpha N)``.
        n_val: validation patterns.
        n_test: test patterns.
        inputs: ``gaussian`` or ``binary``.
        label_noise: flip probability of the training labels.
        teacher: the teacher ``(N,)`` as a list of ``+-1`` (the generalisation error is
            computed from it in closed form).

    Example:
        >>> spec = TeacherStudentSpec(3, 6, 2, 2, "binary", 0.0, teacher=[1, -1, 1])
        >>> spec.alpha, TeacherStudentSpec.coerce(spec.to_dict()) == spec
        (2.0, True)
    """

    n_inputs: int
    n_train: int
    n_val: int
    n_test: int
    inputs: str
    label_noise: float
    teacher: list[int] = field(repr=False)

    def __post_init__(self) -> None:
        """Check the invariants the model relies on."""
        self.teacher = [int(t) for t in self.teacher]
        if len(self.teacher) != self.n_inputs or any(t not in (-1, 1) for t in self.teacher):
            raise ValueError(f"teacher must be {self.n_inputs} values in {{-1, +1}}.")

    @property
    def alpha(self) -> float:
        """``P / N``."""
        return self.n_train / self.n_inputs

    def teacher_tensor(self) -> Tensor:
        """The teacher as a float64 tensor ``(N,)``."""
        return torch.tensor(self.teacher, dtype=torch.float64)
