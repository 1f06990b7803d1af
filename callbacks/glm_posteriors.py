"""The two posteriors of ``LastLayerSampler``, each a group of the settings that apply to it alone.

``LastLayerSampler(posterior=LaplaceGGN(...))`` draws exact linearised-Laplace (GGN) samples by
randomise-then-optimise; ``LastLayerSampler(posterior=LeastSquaresLogits(...))`` runs the
LinearSampling reference sampler. Before these groups the sampler took all thirteen settings flat,
eight of which meant nothing to the posterior not chosen; now a setting cannot be given to the wrong
posterior. ``kind`` names the posterior in a YAML mapping (it is fixed per class)::

    - class_path: ripieno.callbacks.LastLayerSampler
      init_args:
        glm: full
        posterior: {kind: least_squares_logits, gamma_grid: [0.003, 0.01, 0.03]}

A recipe of earlier releases (``posterior: least_squares_logits`` with ``gamma_grid`` beside it)
still loads, each flat key moved into the group with a ``RipienoDeprecationWarning``.

Example:
    >>> from ripieno.callbacks import LastLayerSampler
    >>> sampler = LastLayerSampler(glm="last_layer", posterior=LaplaceGGN(prior_precision_grid=[0.1, 1.0]))
    >>> sampler.posterior.kind, sampler.posterior.selection
    ('laplace_ggn', 'validation')
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal


@dataclass(frozen=True)
class LaplaceGGN:
    """Exact samples of the linearised-Laplace (GGN) posterior (``ripieno.framework.uq.GLMPosteriorSampler``).

    Attributes:
        kind: ``laplace_ggn`` (names this posterior in a YAML mapping).
        prior_precision: the Gaussian prior's precision ``lambda``.
        prior_precision_grid: candidate ``lambda`` values; the best by ``selection`` is kept and logged
            as ``uq/prior_precision`` (the same random draws serve every candidate).
        selection: how a grid is scored: ``validation`` (LPPD on the validation split) or ``evidence``
            (last-layer regression only: the closed-form log marginal likelihood of the training data
            under the linearised model, prior centred at ``theta*``).
        solver: ``cg`` or ``sgd`` (see ``GLMPosteriorSampler``).
        max_iters: CG iterations or SGD epochs.
    """

    kind: Literal["laplace_ggn"] = "laplace_ggn"
    prior_precision: float = 1.0
    prior_precision_grid: list[float] | None = None
    selection: Literal["validation", "evidence"] = "validation"
    solver: Literal["cg", "sgd"] = "cg"
    max_iters: int = 100


@dataclass(frozen=True)
class LeastSquaresLogits:
    """The LinearSampling reference sampler (``ripieno.framework.uq.LeastSquaresLogitSampler``).

    Start at ``theta* + gamma eps``, fit the trained logits by SGD with momentum for a fixed number of
    epochs, and predict with ``scale * (f(x; theta*) + J(x) (theta_s - theta*))``. A setting left
    ``None`` takes the reference's value for LeNet on Fashion-MNIST for the sampler's ``glm``
    (``glm_sampler.LEAST_SQUARES_DEFAULTS``). Classification only.

    Attributes:
        kind: ``least_squares_logits`` (names this posterior in a YAML mapping).
        gamma: scale of the start draws ``theta* + gamma eps``.
        gamma_grid: candidate ``gamma`` values (validation LPPD).
        predictive_scale: the factor on the whole linearised logits before the softmax (the
            reference's ``scale_cal``; 1 keeps them as they are).
        predictive_scale_grid: candidate scales (validation LPPD; the solve runs once, since samples
            are proportional to ``gamma``, so the grid costs one pass over the validation split).
        epochs: SGD epochs over the training data.
        batch_size: SGD batch size (the training data in a fixed order, re-batched).
        lr: SGD step size.
        momentum: heavy-ball momentum.
    """

    kind: Literal["least_squares_logits"] = "least_squares_logits"
    gamma: float | None = None
    gamma_grid: list[float] | None = None
    predictive_scale: float | None = None
    predictive_scale_grid: list[float] | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    momentum: float | None = None


GLMPosterior = LaplaceGGN | LeastSquaresLogits
#: Each posterior group by its ``kind``.
POSTERIORS: dict[str, type[LaplaceGGN] | type[LeastSquaresLogits]] = {
    "laplace_ggn": LaplaceGGN,
    "least_squares_logits": LeastSquaresLogits,
}
#: ``{flat name: "posterior.<name>"}``: what a recipe file's old flat keys become when it loads;
#: ``posterior`` itself, once a string, becomes ``posterior.kind``.
POSTERIOR_MOVED_ARGUMENTS: dict[str, str] = {
    "posterior": "posterior.kind",
    **{f.name: f"posterior.{f.name}" for group in POSTERIORS.values() for f in fields(group)
       if f.name != "kind"},
}
