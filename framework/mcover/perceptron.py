r"""The binary teacher-student perceptron, annealed plainly, replicated or through M-cover routing.

Data (``teacher_student_data``): a teacher ``w* in {-1, +1}^N`` labels patterns
``x^mu`` (i.i.d. standard Gaussian or uniform ``+-1`` entries) by ``y^mu = sign(w* . x^mu)``;
labels may be flipped with probability ``label_noise``. ``alpha = P / N``. A student
``w in {-1, +1}^N`` has generalisation error ``arccos(R) / pi`` with
``R = w . w* / (|w| |w*|)`` (``generalization_error``; exact for Gaussian inputs).

Annealer (``RoutedPerceptronAnnealer``): ``M`` binary copies ``w_b`` (the *sources*,
``(M, N)``); the ``N`` coordinates are split into ``n_blocks`` contiguous blocks, and
block ``j`` of *destination* copy ``a`` is read from source copy ``rho_j(a)``, so copy
``a``'s routed weights are ``v_a[i] = w[rho_{j(i)}(a), i]`` and its field on pattern
``mu`` is ``h_a^mu = v_a . x^mu / sqrt(N)``. The energy is

    E = sum_a E_a - gamma sum_{a < b} w_a . w_b,    E_a = sum_mu Theta(-y^mu h_a^mu),

where ``Theta(0) = 1``: a pattern with ``h = 0`` (possible only for binary inputs) counts
as an error, i.e. a pattern is learned only when ``y h > 0``. Since ``rho_j`` is a
permutation, the coupling term equals ``-gamma sum_{a<b} v_a . v_b`` (each column of
``v`` holds the same values as the column of ``w``), and it is the coupling to the
centre of Baldassi et al. (2016, "robust ensembles") up to a constant:
``sum_{a<b} w_a . w_b = (|sum_a w_a|^2 - M N) / 2``.

Dynamics: single-spin-flip Metropolis at inverse temperature ``beta`` on
``exp(-beta E)`` (the coupling sits inside the energy, so it is scaled by ``beta`` too).
A proposal flips ``v_a[i]``, i.e. source ``w[rho_j(a), i]``; only ``E_a`` changes
(``Delta E_a`` counted from the stabilities ``y h_a``, kept up to date in ``O(P)`` per
accepted flip) plus the coupling ``2 gamma v_a[i] (S_i - v_a[i])`` with
``S_i = sum_b w[b, i]``. A proposal is accepted iff ``Delta E < -log(u) / beta`` with
``u ~ U[0, 1)`` (the Metropolis rule ``u < exp(-beta Delta E)``).

A sweep is ``M N`` proposals: every destination ``a`` visits its ``N`` coordinates in a
fresh random order drawn, with the ``N`` uniforms, from copy ``a``'s own generator
(``copy_generators``). The sequential proposal order is ``(t, a)``: step ``t`` proposes
coordinate ``order_a[t]`` for destinations ``a = 0 .. M-1``. With ``gamma = 0`` the
destinations never interact while the routing is fixed (each source variable feeds one
destination), so each destination's proposals are processed on their own; with
identity routing and ``gamma = 0``, copy ``a`` is therefore exactly an ``M = 1`` annealer
seeded with copy ``a``'s generator.

Speed, exactly: proposals are evaluated in look-ahead batches: ``Delta E`` of the next
``K`` proposals is computed against the current state in one vectorised operation, and
the first accepted one is applied (the ones before it are rejections that a sequential
run would make with the same uniforms). The result does not depend on ``K``.
Stabilities are recomputed from scratch only when the routing changes.

Schedules (``AnnealingSchedule``): ``beta`` goes geometrically from ``beta0`` (sweep 0)
to ``beta1`` (sweep ``n_sweeps - 1``) and stays there; ``gamma = gamma0 (1 + growth)^t``.
The permutation in force is ``bank.at(t // resample_every)``. Plain SA: ``M = 1``;
replicated SA: identity routing and ``gamma0 > 0``; M-cover SA: a bank from a
ring/uniform kernel and ``gamma0 = 0``.

Collapse: ``sign(sum_a w_a)``; a tie (even ``M``) takes copy 0's value. The copies'
majority vote ``sign(sum_a sign(w_a . x))`` (the ``copy_average`` rule of
``ripieno.framework.mcover.collapse``) has no closed-form error; ``vote_generalization_error``
estimates it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from ripieno.framework.mcover.permutations import PermutationBank
from ripieno.framework.specs.teacher_student import TeacherStudentSpec  # noqa: F401  (re-exported)

Inputs = Literal["gaussian", "binary"]
INPUTS: tuple[str, ...] = ("gaussian", "binary")
GeneratorArg = torch.Generator | Sequence[torch.Generator] | None


# ----------------------------------------------------------------------------- data
def teacher_student_data(
    n_inputs: int,
    n_patterns: int,
    inputs: Inputs = "gaussian",
    label_noise: float = 0.0,
    generator: torch.Generator | None = None,
    teacher: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Patterns labelled by a binary teacher perceptron.

    Draws, in this order from ``generator``: the teacher (unless given), the patterns,
    the label flips. ``teacher . x = 0`` (binary inputs, even ``N``) is labelled ``+1``.

    Args:
        n_inputs: ``N``.
        n_patterns: ``P`` (``0`` gives empty patterns).
        inputs: ``gaussian`` (standard normal entries) or ``binary`` (uniform ``+-1``).
        label_noise: probability of flipping each label, in ``[0, 0.5]``.
        generator: a CPU generator (default: seed 0).
        teacher: reuse this teacher ``(N,)`` in ``{-1, +1}`` (e.g. for a test set).

    Returns:
        ``x (P, N)``, ``y (P,)`` in ``{-1, +1}`` and ``teacher (N,)`` in ``{-1, +1}``, all float64.

    Raises:
        ValueError: non-positive ``n_inputs``, negative ``n_patterns``, unknown ``inputs``,
            ``label_noise`` outside ``[0, 0.5]``, or a teacher of the wrong shape or values.
    """
    if int(n_inputs) != n_inputs or n_inputs < 1:
        raise ValueError(f"n_inputs must be a positive integer, got {n_inputs}.")
    if int(n_patterns) != n_patterns or n_patterns < 0:
        raise ValueError(f"n_patterns must be a non-negative integer, got {n_patterns}.")
    if inputs not in INPUTS:
        raise ValueError(f"inputs must be one of {INPUTS}, got {inputs!r}.")
    if not 0.0 <= label_noise <= 0.5:
        raise ValueError(f"label_noise is a flip probability in [0, 0.5], got {label_noise}.")
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    n_inputs, n_patterns = int(n_inputs), int(n_patterns)
    if teacher is None:
        teacher = _random_signs(n_inputs, generator)
    else:
        teacher = _check_signs(teacher, "teacher", n_inputs)
    if inputs == "gaussian":
        x = torch.randn(n_patterns, n_inputs, generator=generator, dtype=torch.float64)
    else:
        x = _random_signs((n_patterns, n_inputs), generator)
    y = torch.where(x @ teacher >= 0, 1.0, -1.0).to(torch.float64)
    if label_noise > 0:
        flip = torch.rand(n_patterns, generator=generator, dtype=torch.float64) < label_noise
        y = torch.where(flip, -y, y)
    return x, y, teacher


def generalization_error(w: Tensor, teacher: Tensor) -> Tensor:
    """``arccos(w . w* / (|w| |w*|)) / pi``, the probability that ``w`` and ``w*`` disagree.

    Exact for inputs drawn from any spherically symmetric law (e.g. i.i.d. Gaussian):
    the two fields are jointly Gaussian with correlation ``R``. For binary ``+-1``
    inputs it is the large-``N`` limit (central limit theorem).

    Args:
        w: students ``(..., N)`` (any real weights, non-zero).
        teacher: ``(N,)``.

    Returns:
        ``(...)`` float64 errors in ``[0, 1]``.
    """
    w = torch.as_tensor(w, dtype=torch.float64)
    teacher = torch.as_tensor(teacher, dtype=torch.float64)
    if teacher.dim() != 1 or w.shape[-1] != teacher.shape[0]:
        raise ValueError(f"w (..., N) and teacher (N,) disagree: shapes {tuple(w.shape)} and"
                         f" {tuple(teacher.shape)}.")
    norms = ((w * w).sum(-1) * (teacher @ teacher)).sqrt()  # one square root: exact for +-1 vectors
    if (norms == 0).any():
        raise ValueError("generalization_error needs non-zero w and teacher (the overlap is undefined).")
    overlap = ((w @ teacher) / norms).clamp(-1.0, 1.0)
    return torch.arccos(overlap) / math.pi


def collapse(w: Tensor) -> Tensor:
    """``sign(sum_a w_a)`` of copies ``(M, N)``; a tie takes copy 0's value. Returns ``(N,)``."""
    w = torch.as_tensor(w, dtype=torch.float64)
    if w.dim() != 2 or w.shape[0] < 1:
        raise ValueError(f"collapse needs copies shaped (M, N), got {tuple(w.shape)}.")
    total = w.sum(0)
    return torch.where(total > 0, 1.0, torch.where(total < 0, -1.0, w[0])).to(torch.float64)


def vote_labels(fields: Tensor, tie_fields: Tensor) -> Tensor:
    """The copies' majority vote ``sign(sum_a sign(h_a))``; ties take ``sign(tie_fields)``.

    Args:
        fields: the copies' fields ``(B, M)``.
        tie_fields: ``(B,)`` fields that break ties (even ``M``), e.g. the collapsed student's.

    Returns:
        ``(B,)`` float64 labels in ``{-1, +1}`` (a field ``<= 0`` reads ``-1``).
    """
    votes = torch.where(fields > 0, 1.0, -1.0).to(torch.float64).sum(-1)
    ties = torch.where(tie_fields > 0, 1.0, -1.0).to(torch.float64)
    return torch.where(votes > 0, 1.0, torch.where(votes < 0, -1.0, ties)).to(torch.float64)


def vote_generalization_error(w: Tensor, teacher: Tensor, n_samples: int = 2**16, seed: int = 0) -> Tensor:
    """Generalisation error of the copies' majority vote (ties: ``collapse(w)``), estimated.

    On a Gaussian input ``x ~ N(0, I)`` the fields of the teacher, of the copies and of
    ``collapse(w)`` are jointly Gaussian with the correlation matrix of those vectors, so
    ``n_samples`` draws of that ``(M + 2)``-dimensional Gaussian (a generator seeded with
    ``seed``: the same answer every call) give the error exactly in distribution, with a
    standard error of at most ``0.5 / sqrt(n_samples)`` (0.002 by default); exact for ``M = 1``.

    Args:
        w: copies ``(M, N)``.
        teacher: ``(N,)``.
        n_samples: Gaussian draws.
        seed: seed of the draws.

    Returns:
        A float64 scalar in ``[0, 1]``.
    """
    w = torch.as_tensor(w, dtype=torch.float64)
    teacher = torch.as_tensor(teacher, dtype=torch.float64)
    if w.dim() != 2 or w.shape[-1] != teacher.shape[0]:
        raise ValueError(f"w (M, N) and teacher (N,) disagree: shapes {tuple(w.shape)} and"
                         f" {tuple(teacher.shape)}.")
    if len(w) == 1:  # one copy: its vote is its label, with a closed-form error
        return generalization_error(w[0], teacher)
    vectors = torch.cat([teacher[None], w, collapse(w)[None]])
    vectors = vectors / vectors.norm(dim=1, keepdim=True)
    values, basis = torch.linalg.eigh(vectors @ vectors.T)
    root = basis * values.clamp_min(0).sqrt()  # root @ root.T is the correlation matrix
    z = torch.randn(n_samples, len(vectors), generator=torch.Generator().manual_seed(seed),
                    dtype=torch.float64)
    fields = z @ root.T
    truth = torch.where(fields[:, 0] > 0, 1.0, -1.0).to(torch.float64)
    return (vote_labels(fields[:, 1:-1], fields[:, -1]) != truth).to(torch.float64).mean()


# ------------------------------------------------------------------------ annealing
def copy_generators(generator: torch.Generator | None, m: int) -> list[torch.Generator]:
    """``m`` per-copy generators seeded by ``m`` draws from ``generator`` (default: seed 0)."""
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    seeds = torch.randint(0, 2**62, (m,), generator=generator)
    return [torch.Generator().manual_seed(int(s)) for s in seeds]


def initial_copies(n_inputs: int, generators: Sequence[torch.Generator]) -> Tensor:
    """Random copies ``(M, N)`` in ``{-1, +1}``, copy ``a`` drawn from ``generators[a]``."""
    return torch.stack([_random_signs(n_inputs, g) for g in generators])


@dataclass
class AnnealingSchedule:
    """Inverse temperature, replica coupling and routing schedule, per sweep ``t``.

    Attributes:
        n_sweeps: length of the ``beta`` ramp (sweeps after it stay at ``beta1``).
        beta0: inverse temperature of sweep 0.
        beta1: inverse temperature of sweep ``n_sweeps - 1``.
        gamma0: replica coupling at sweep 0 (``0``: none).
        gamma_growth: ``gamma_t = gamma0 (1 + gamma_growth)^t``.
        resample_every: sweeps per permutation of the bank (``bank.at(t // resample_every)``).
    """

    n_sweeps: int = 100
    beta0: float = 0.1
    beta1: float = 5.0
    gamma0: float = 0.0
    gamma_growth: float = 0.0
    resample_every: int = 1

    def __post_init__(self) -> None:
        """Check the values."""
        if self.n_sweeps < 1:
            raise ValueError(f"n_sweeps must be >= 1, got {self.n_sweeps}.")
        if not (0 < self.beta0 < math.inf and 0 < self.beta1 < math.inf):
            raise ValueError(f"beta0 and beta1 must be finite and > 0, got {self.beta0} and {self.beta1}.")
        if self.gamma0 < 0 or self.gamma_growth < 0:
            raise ValueError(f"gamma0 and gamma_growth must be >= 0, got {self.gamma0} and"
                             f" {self.gamma_growth}.")
        if self.resample_every < 1:
            raise ValueError(f"resample_every must be >= 1 sweep, got {self.resample_every}.")

    def beta(self, sweep: int) -> float:
        """``beta0 (beta1 / beta0)^(t / (n_sweeps - 1))``, clamped to the ramp."""
        if self.n_sweeps == 1:
            return self.beta1
        frac = min(max(sweep, 0), self.n_sweeps - 1) / (self.n_sweeps - 1)
        return self.beta0 * (self.beta1 / self.beta0) ** frac

    def gamma(self, sweep: int) -> float:
        """``gamma0 (1 + gamma_growth)^t`` (``inf`` once it overflows)."""
        if self.gamma0 == 0:
            return 0.0
        try:
            return self.gamma0 * (1.0 + self.gamma_growth) ** sweep
        except OverflowError:
            return math.inf


class RoutedPerceptronAnnealer:
    """Metropolis annealing of ``M`` routed binary perceptron copies (module docstring).

    Args:
        x: training patterns ``(P, N)``.
        y: labels ``(P,)`` in ``{-1, +1}``.
        m: copies ``M``.
        n_blocks: contiguous blocks of the ``N`` coordinates (one routing slot each).
        schedule: ``beta``/``gamma``/routing schedule.
        generator: one generator (per-copy generators are seeded from it with
            ``copy_generators``) or ``M`` per-copy generators, used as they are.
        bank: permutations ``(n_blocks, S, M)``; ``None`` routes by the identity.
        w0: initial copies ``(M, N)`` in ``{-1, +1}``; default: ``initial_copies`` from the
            per-copy generators.

    Attributes:
        sweep: sweeps done so far (the schedule's ``t``).
        accepted: accepted flips so far.
        lookahead_max: longest look-ahead batch (speed only; results do not depend on it).
    """

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        m: int = 1,
        n_blocks: int = 1,
        schedule: AnnealingSchedule | None = None,
        generator: GeneratorArg = None,
        bank: PermutationBank | None = None,
        w0: Tensor | None = None,
    ) -> None:
        if int(m) != m or m < 1:
            raise ValueError(f"m (the number of copies) must be a positive integer, got {m}.")
        x = torch.as_tensor(x, dtype=torch.float64)
        if x.dim() != 2 or x.shape[1] < 1:
            raise ValueError(f"x must be patterns shaped (P, N), got {tuple(x.shape)}.")
        n = x.shape[1]
        if int(n_blocks) != n_blocks or not 1 <= n_blocks <= n:
            raise ValueError(f"n_blocks must be an integer between 1 and N={n}, got {n_blocks}.")
        self.m, self.n, self.n_blocks = int(m), n, int(n_blocks)
        self.schedule = schedule if schedule is not None else AnnealingSchedule()
        if isinstance(generator, torch.Generator) or generator is None:
            self.generators = copy_generators(generator, self.m)
        else:
            self.generators = list(generator)
            if len(self.generators) != self.m:
                raise ValueError(f"Got {len(self.generators)} per-copy generators for M={self.m} copies.")
        if w0 is None:
            w0 = initial_copies(n, self.generators)
        self._w = _check_signs(w0, "w0", (self.m, n)).numpy().copy()
        parts = np.array_split(np.arange(n), self.n_blocks)
        self.block_of = np.concatenate([np.full(len(p), j) for j, p in enumerate(parts)])
        self.sweep = 0
        self.accepted = 0
        self.lookahead_max = 64  # longest look-ahead batch (K x P floats stay in cache)
        self._bank: PermutationBank | None = None
        self._bank_index: int | None = None
        self._rho = np.tile(np.arange(self.m), (self.n_blocks, 1))  # (n_blocks, M): identity
        self._v = self._w.copy()  # routed copies v_a[i] = w[rho_{j(i)}(a), i]
        self.set_data(x, y)
        self.set_permutation_bank(bank)

    # ------------------------------------------------------------------- state
    def set_data(self, x: Tensor, y: Tensor) -> None:
        """Train on ``x (P, N)``, ``y (P,)`` from now on (stabilities recomputed)."""
        x = torch.as_tensor(x, dtype=torch.float64)
        y = torch.as_tensor(y, dtype=torch.float64)
        if x.dim() != 2 or x.shape[1] != self.n:
            raise ValueError(f"x must be (P, N={self.n}), got {tuple(x.shape)}.")
        if y.shape != (x.shape[0],):
            raise ValueError(f"y must be (P,)=({x.shape[0]},) to match x, got {tuple(y.shape)}.")
        if not torch.isfinite(x).all():
            raise ValueError("x has NaN or infinite entries; the fields would be undefined.")
        if not ((y == 1) | (y == -1)).all():
            raise ValueError("y must hold labels in {-1, +1} (map 0/1 labels with 2 y - 1).")
        self._y = y.numpy().copy()
        self._yxT = np.ascontiguousarray((y[:, None] * x).T.numpy())  # (N, P): row i is y x_i
        self._recompute()

    def set_permutation_bank(self, bank: PermutationBank | None) -> None:
        """Install ``bank`` (``perms (n_blocks, S, M)``) or the identity routing (``None``)."""
        if bank is not None:
            perms = bank.perms
            if perms.dim() != 3 or perms.shape[0] != self.n_blocks or perms.shape[2] != self.m:
                raise ValueError(f"The bank must hold perms shaped (n_blocks={self.n_blocks}, S, M={self.m}),"
                                 f" got {tuple(perms.shape)}.")
            if not (perms.sort(-1).values == torch.arange(self.m)).all():
                raise ValueError("Every row of bank.perms must be a permutation of 0 .. M-1.")
        self._bank = bank
        self._bank_index = None
        self._route(self._current_rho())

    @property
    def permutation_bank(self) -> PermutationBank | None:
        """The bank in force (``None``: identity routing)."""
        return self._bank

    @property
    def routing(self) -> Tensor:
        """The permutations in force, ``(n_blocks, M)``: ``rho_j(a)``, copy ``a``'s source on block ``j``."""
        return torch.from_numpy(self._rho.copy())

    def weights(self) -> Tensor:
        """The copies ``w (M, N)`` (sources, unrouted) as float64 ``+-1``."""
        self._w[self._source, self._cols] = self._v
        return torch.from_numpy(self._w.copy())

    def routed_weights(self) -> Tensor:
        """The routed copies ``v (M, N)``: ``v[a, i] = w[rho_{j(i)}(a), i]``."""
        return torch.from_numpy(self._v.copy())

    def fields(self) -> Tensor:
        """Routed fields ``h (M, P)`` kept up to date incrementally, scaled by ``1 / sqrt(N)``."""
        return torch.from_numpy(self._stab * self._y / math.sqrt(self.n))

    def fields_from_scratch(self) -> Tensor:
        """``h (M, P)`` recomputed from ``weights()`` and the routing (for checks)."""
        w = self.weights().numpy()
        v = w[self._source, self._cols]
        x = (self._yxT * self._y).T  # back to (P, N)
        return torch.from_numpy(np.stack([x @ v[a] for a in range(self.m)]) / math.sqrt(self.n))

    def energies(self) -> Tensor:
        """Training errors ``E_a`` of every destination copy (routed fields), ``(M,)`` long."""
        return torch.from_numpy(self._err.copy())

    def coupling(self) -> float:
        """``sum_{a<b} w_a . w_b = (|sum_a w_a|^2 - M N) / 2``."""
        return float((self._colsum @ self._colsum - self.m * self.n) / 2)

    def energy(self, sweep: int | None = None) -> float:
        """``sum_a E_a - gamma_t sum_{a<b} w_a . w_b`` at sweep ``t`` (default: the current one)."""
        gamma = self.schedule.gamma(self.sweep if sweep is None else sweep)
        return float(self._err.sum()) - (gamma * self.coupling() if gamma else 0.0)

    def collapse(self) -> Tensor:
        """The collapsed student ``sign(sum_a w_a)`` (ties: copy 0), ``(N,)``."""
        return collapse(self.weights())

    def summary(self, teacher: Tensor) -> dict[str, float]:
        """Generalisation errors of the collapsed student and of the copies, and training errors.

        Returns:
            ``gen_error_collapsed``, ``gen_error_copies`` (mean of the copies' own, unrouted,
            errors), ``train_error_routed`` (mean ``E_a / P`` of the routed copies) and
            ``train_error_collapsed``.
        """
        w, student = self.weights(), self.collapse()
        p = max(len(self._y), 1)
        collapsed_err = int((student.numpy() @ self._yxT <= 0).sum())
        return {"gen_error_collapsed": float(generalization_error(student, teacher)),
                "gen_error_copies": float(generalization_error(w, teacher).mean()),
                "train_error_routed": float(self._err.mean() / p),
                "train_error_collapsed": collapsed_err / p}

    def state_dict(self) -> dict[str, Any]:
        """Copies, sweep counter and per-copy generator states (the data and bank are not included)."""
        return {"w": self.weights(), "sweep": self.sweep, "accepted": self.accepted,
                "generators": [g.get_state() for g in self.generators]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``state_dict``'s copies, sweep counter and generator states."""
        if len(state["generators"]) != self.m:
            raise ValueError(f"The state holds {len(state['generators'])} copies' generators,"
                             f" not M={self.m}.")
        self._w = _check_signs(state["w"], "w", (self.m, self.n)).numpy().copy()
        self.sweep, self.accepted = int(state["sweep"]), int(state["accepted"])
        for g, s in zip(self.generators, state["generators"], strict=True):
            g.set_state(s)
        self._bank_index = None
        self._v = self._w[self._source, self._cols]
        self._route(self._current_rho())

    # ------------------------------------------------------------------ sweeps
    def anneal(self, n_sweeps: int | None = None) -> None:
        """Run ``n_sweeps`` sweeps (default: up to the end of the schedule's ``beta`` ramp)."""
        n_sweeps = max(self.schedule.n_sweeps - self.sweep, 0) if n_sweeps is None else n_sweeps
        for _ in range(n_sweeps):
            self.step_sweep()

    def step_sweep(self, interleaved: bool | None = None) -> None:
        """One sweep of ``M N`` proposals at the current ``beta`` and ``gamma``.

        Args:
            interleaved: process the proposal stream ``(t, a)`` as one sequence (needed
                when ``gamma > 0``). ``None`` chooses it only when ``gamma > 0``; with
                ``gamma = 0`` both ways give identical results.
        """
        t = self.sweep
        rho = self._current_rho()
        if not np.array_equal(rho, self._rho):
            self._route(rho)
        beta, gamma = self.schedule.beta(t), self.schedule.gamma(t)
        orders, thresholds = [], []
        for g in self.generators:
            orders.append(torch.randperm(self.n, generator=g).numpy())
            u = torch.rand(self.n, generator=g, dtype=torch.float64).numpy()
            with np.errstate(divide="ignore"):
                thresholds.append(-np.log(u) / beta)
        if interleaved is None:
            interleaved = gamma > 0
        if interleaved:
            self._sweep_interleaved(np.stack(orders), np.stack(thresholds), gamma)
        else:
            for a in range(self.m):
                self._sweep_copy(a, orders[a], thresholds[a])
        self.sweep += 1

    def _sweep_copy(self, a: int, order: np.ndarray, thr: np.ndarray) -> None:
        """Destination ``a``'s ``N`` proposals in ``order`` (``gamma = 0``), by look-ahead batches."""
        stab, v, yxT = self._stab[a], self._v[a], self._yxT
        err = int(self._err[a])
        pos, k, n = 0, 8, len(order)
        while pos < n:
            idx = order[pos:pos + k]
            s2 = -2.0 * v[idx]
            new = yxT[idx] * s2[:, None]
            new += stab
            delta = np.count_nonzero(new <= 0, axis=1) - err
            hits = np.flatnonzero(delta < thr[pos:pos + k])
            if hits.size == 0:
                pos += len(idx)
                k = min(2 * k, self.lookahead_max)
                continue
            f = int(hits[0])
            i = idx[f]
            stab[:] = new[f]
            err += int(delta[f])
            v[i] = -v[i]
            self._colsum[i] += s2[f]
            self.accepted += 1
            pos += f + 1
            k = min(max(8, 2 * (f + 1)), self.lookahead_max)
        self._err[a] = err

    def _sweep_interleaved(self, orders: np.ndarray, thr: np.ndarray, gamma: float) -> None:
        """All ``M N`` proposals as one stream ``(t, a)``, with the replica coupling."""
        dest = np.tile(np.arange(self.m), self.n)  # stream entry t * M + a
        coord = orders.T.reshape(-1)
        thr = thr.T.reshape(-1)
        stab, v, yxT, colsum, err = self._stab, self._v, self._yxT, self._colsum, self._err
        pos, k, total = 0, 8, len(dest)
        while pos < total:
            ds, cs = dest[pos:pos + k], coord[pos:pos + k]
            vs = v[ds, cs]
            s2 = -2.0 * vs
            new = yxT[cs] * s2[:, None]
            new += stab[ds]
            delta = (np.count_nonzero(new <= 0, axis=1) - err[ds]).astype(np.float64)
            if gamma > 0:
                c = 2.0 * vs * (colsum[cs] - vs)
                delta += np.where(c == 0, 0.0, gamma * c)  # avoids inf * 0 once gamma overflows
            hits = np.flatnonzero(delta < thr[pos:pos + k])
            if hits.size == 0:
                pos += len(ds)
                k = min(2 * k, self.lookahead_max)
                continue
            f = int(hits[0])
            a, i = int(ds[f]), int(cs[f])
            stab[a] = new[f]
            err[a] = np.count_nonzero(new[f] <= 0)
            v[a, i] = -v[a, i]
            colsum[i] += s2[f]
            self.accepted += 1
            pos += f + 1
            k = min(max(8, 2 * (f + 1)), self.lookahead_max)

    # ----------------------------------------------------------------- routing
    def _current_rho(self) -> np.ndarray:
        if self._bank is None:
            return np.tile(np.arange(self.m), (self.n_blocks, 1))
        return self._bank.at(self.sweep // self.schedule.resample_every).numpy()

    def _route(self, rho: np.ndarray) -> None:
        """Write the routed copies back to the sources, install ``rho`` and recompute stabilities."""
        if hasattr(self, "_source"):
            self._w[self._source, self._cols] = self._v
        self._rho = np.asarray(rho, dtype=np.int64).copy()
        self._source = self._rho[self.block_of].T  # (M, N): w-row read by destination a at coordinate i
        self._cols = np.broadcast_to(np.arange(self.n), (self.m, self.n))
        self._v = self._w[self._source, self._cols]
        self._recompute()

    def _recompute(self) -> None:
        """Stabilities ``y h`` (unscaled), errors and column sums from scratch, copy by copy."""
        self._stab = np.stack([self._v[a] @ self._yxT for a in range(self.m)])
        self._err = np.count_nonzero(self._stab <= 0, axis=1).astype(np.int64)
        self._colsum = self._v.sum(0)


def _random_signs(shape: int | tuple[int, ...], generator: torch.Generator) -> Tensor:
    shape = (shape,) if isinstance(shape, int) else shape
    return (2 * torch.randint(0, 2, shape, generator=generator) - 1).to(torch.float64)


def _check_signs(value: Tensor, name: str, shape: int | tuple[int, ...]) -> Tensor:
    value = torch.as_tensor(value, dtype=torch.float64).cpu()
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if tuple(value.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(value.shape)}.")
    if not ((value == 1) | (value == -1)).all():
        raise ValueError(f"{name} must hold only -1 and +1.")
    return value
