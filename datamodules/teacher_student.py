"""TeacherStudentDataModule: patterns labelled by a random binary teacher perceptron.

The teacher ``w* in {-1, +1}^N`` and all patterns come from one seeded generator
(``ripieno.framework.mcover.perceptron.teacher_student_data``): first the teacher and the
``P = round(alpha N)`` training patterns (labels flipped with probability
``label_noise``), then the validation and test patterns, whose labels are the teacher's
own (clean), so that their error is the student's disagreement with the teacher. The
``spec`` (a ``TeacherStudentSpec``) carries the teacher, from which a model computes its
generalisation error in closed form; the ripieno CLI links it into ``model.data_spec``.

Batches are dicts ``{"x": float64 (B, N), "y": float64 (B,) in {-1, +1}}``; by default a
split is served as one batch (simulated annealing works on the whole training set).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.utils.data import DataLoader
from typing_extensions import override

from ripieno.datamodules.base import BatchDataset, DataModuleError, EpochSeededRandomSampler, SplitDataModule
from ripieno.framework.mcover.perceptron import INPUTS, Inputs, TeacherStudentSpec, teacher_student_data


class PatternDataset(BatchDataset):
    """Patterns and labels as dict batches ``{"x": (B, N), "y": (B,)}``."""

    def __init__(self, x: Tensor, y: Tensor) -> None:
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        idx = torch.as_tensor(indices)
        return {"x": self.x[idx], "y": self.y[idx]}


class TeacherStudentDataModule(SplitDataModule):
    """Teacher-student perceptron data: ``alpha N`` training patterns, clean val/test patterns.

    Args:
        n_inputs: ``N``.
        alpha: patterns per input, ``P = round(alpha N)``.
        inputs: ``gaussian`` (standard normal entries) or ``binary`` (uniform ``+-1``).
        label_noise: probability of flipping each training label, in ``[0, 0.5]``.
        n_val: validation patterns.
        n_test: test patterns.
        seed: seed of the teacher and of every pattern (and of the training order when
            ``batch_size`` is smaller than the training set).
        batch_size: training batch size; ``None`` = the whole training set as one batch.
        eval_batch_size: validation/test batch size; ``None`` = a whole split per batch.
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        n_inputs: int = 500,
        alpha: float = 1.5,
        inputs: Inputs = "gaussian",
        label_noise: float = 0.0,
        n_val: int = 1000,
        n_test: int = 2000,
        seed: int = 0,
        batch_size: int | None = None,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        if n_inputs < 1:
            raise DataModuleError(f"n_inputs must be >= 1, got {n_inputs}.")
        if alpha <= 0 or round(alpha * n_inputs) < 1:
            raise DataModuleError(f"alpha * n_inputs must round to at least one training pattern, got"
                                  f" alpha={alpha} with n_inputs={n_inputs}.")
        if inputs not in INPUTS:
            raise DataModuleError(f"inputs must be one of {INPUTS}, got {inputs!r}.")
        if not 0.0 <= label_noise <= 0.5:
            raise DataModuleError(f"label_noise is a flip probability in [0, 0.5], got {label_noise}.")
        if n_val < 1 or n_test < 1:
            raise DataModuleError(f"n_val and n_test must be >= 1, got {n_val} and {n_test}.")
        for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if value is not None and value < 1:
                raise DataModuleError(f"{name} must be >= 1 or None (a whole split per batch), got {value}.")

    def _prepare(self) -> None:
        hp = self.hparams
        n_train = round(hp.alpha * hp.n_inputs)
        generator = torch.Generator().manual_seed(hp.seed)
        x, y, teacher = teacher_student_data(hp.n_inputs, n_train, hp.inputs, hp.label_noise, generator)
        x_eval, y_eval, _ = teacher_student_data(hp.n_inputs, hp.n_val + hp.n_test, hp.inputs, 0.0, generator,
                                                 teacher=teacher)
        self._splits = {
            "train": PatternDataset(x, y),
            "val": PatternDataset(x_eval[:hp.n_val], y_eval[:hp.n_val]),
            "test": PatternDataset(x_eval[hp.n_val:], y_eval[hp.n_val:]),
        }
        self._spec = TeacherStudentSpec(n_inputs=hp.n_inputs, n_train=n_train, n_val=hp.n_val,
                                        n_test=hp.n_test, inputs=hp.inputs, label_noise=hp.label_noise,
                                        teacher=teacher.long().tolist())

    @override
    def train_dataloader(self) -> DataLoader:
        """The training set as one batch, or shuffled batches (order seeded by ``seed`` and the epoch)."""
        data = self._split("train")
        if self.hparams.batch_size is None or self.hparams.batch_size >= len(data):
            return self._loader(data, len(data))
        return self._loader(data, self.hparams.batch_size,
                            sampler=EpochSeededRandomSampler(len(data), seed=self.hparams.seed))

    @override
    def val_dataloader(self) -> DataLoader:
        """Validation batches in a fixed order."""
        return self._eval_loader("val")

    @override
    def test_dataloader(self) -> DataLoader:
        """Test batches in a fixed order."""
        return self._eval_loader("test")

    @override
    def predict_dataloader(self) -> DataLoader:
        """The test split, for ``predict``."""
        return self._eval_loader("test")

    def _eval_loader(self, name: str) -> DataLoader:
        data = self._split(name)
        return self._loader(data, self.hparams.eval_batch_size or len(data))
