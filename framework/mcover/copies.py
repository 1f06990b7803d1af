"""PermutationCopiesMixin: the permutation bank and the chosen copy that every M-cover module shares.

An M-cover module keeps ``M`` copies of one model, a bank of permutations that routes them
(a persistent ``bank_perms`` buffer ``(n_slots, S, M)``, so checkpoints resume with the bank
in force) and the copy its ``best_copy`` collapse rule chose on validation (a persistent
``best_copy_index`` buffer, ``-1`` before any choice). The mixin gives both modules
(``MCoverClassifier``, ``BinaryPerceptronSA``) the ``PermutationBankModel`` capability
(``ripieno.framework.members``) that ``RoutingResampler`` needs.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from ripieno.framework.mcover.kernels import make_kernel
    >>> class Copies(PermutationCopiesMixin, nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.kernel, self.sampler = make_kernel("gaussian_ring", 3, sigma=1.0), "exact"
    ...         self.init_permutation_copies(n_slots=2, bank_size=4, routing_seed=0)
    >>> module = Copies()
    >>> module.permutation_bank.perms.shape, module.chosen_copy()
    (torch.Size([2, 4, 3]), 0)
    >>> module.best_copy_index.fill_(2); module.chosen_copy()
    tensor(2)
    2
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from ripieno.framework.mcover.permutations import PermutationBank, SamplerKind


class PermutationCopiesMixin:
    """The permutation bank (``permutation_bank``, ``draw_permutation_bank``) and ``chosen_copy``.

    The host is an ``nn.Module`` with ``kernel`` (the ``M x M`` mixing kernel) and ``sampler``
    set before it calls ``init_permutation_copies``.
    """

    kernel: Tensor
    sampler: SamplerKind
    bank_perms: Tensor
    best_copy_index: Tensor
    #: what the ``best_copy`` rule's copy is called in the warning (``predictor``, ``student``).
    chosen_copy_noun: ClassVar[str] = "predictor"
    #: hand out the bank on the CPU (where a CPU-only trainer, e.g. the annealer, reads it).
    bank_on_cpu: ClassVar[bool] = False

    def init_permutation_copies(self, n_slots: int, bank_size: int, routing_seed: int) -> None:
        """Draw the first bank (seeded by ``routing_seed``) and register both buffers (persistent).

        Args:
            n_slots: routing slots (at least 1 row of the bank is kept).
            bank_size: permutations ``S`` per slot.
            routing_seed: seed of the first bank.
        """
        bank = PermutationBank.draw(self.kernel, max(n_slots, 1), bank_size,
                                    torch.Generator().manual_seed(routing_seed), self.sampler)
        self.register_buffer("bank_perms", bank.perms)  # type: ignore[attr-defined]
        # the copy chosen on validation (-1: none yet); persistent, so test after loading uses it
        self.register_buffer("best_copy_index", torch.tensor(-1, dtype=torch.long))  # type: ignore[attr-defined]

    @property
    def permutation_bank(self) -> PermutationBank:
        """The bank in force (``(n_slots, S, M)`` permutations)."""
        return PermutationBank(self.bank_perms.cpu() if self.bank_on_cpu else self.bank_perms)

    def draw_permutation_bank(self, generator: torch.Generator) -> None:
        """Draw a new bank from this module's kernel with ``generator`` and install it."""
        n_slots, size = self.bank_perms.shape[:2]
        bank = PermutationBank.draw(self.kernel, n_slots, size, generator, self.sampler)
        self.bank_perms.copy_(bank.perms.to(self.bank_perms.device))
        self.on_permutation_bank_drawn(bank)

    def on_permutation_bank_drawn(self, bank: PermutationBank) -> None:
        """Called after ``draw_permutation_bank`` installed ``bank`` (a module holding a copy updates it)."""

    def chosen_copy(self) -> int:
        """The ``best_copy`` rule's copy: the one chosen on validation (copy 0, with a warning, if none)."""
        index = int(self.best_copy_index)
        if index < 0:
            rank_zero_warn(f"No validation epoch has chosen a best copy yet; the best_copy"
                           f" {self.chosen_copy_noun} is copy 0. Validate (or fit with validation) before"
                           " testing or predicting.")
            return 0
        return index

    @staticmethod
    def default_best_copy_index(checkpoint: dict[str, Any]) -> None:
        """Let checkpoints from before ``best_copy_index`` existed load with no copy chosen."""
        checkpoint.get("state_dict", {}).setdefault("best_copy_index", torch.tensor(-1, dtype=torch.long))
