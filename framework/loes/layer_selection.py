"""What a LOES selector returns: the chosen layers, every candidate's scores, and the fused features."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import torch
from torch import Tensor

from ripieno.framework.loes.geometry import Residualizer, fit_residualizer
from ripieno.framework.loes.selection_inputs import LayerInput, prepare_layers
from ripieno.framework.loes.selection_policy import without_autocast

SCORE_COLUMNS = ["step", "layer", "ridge_loss", "iso", "red", "tri", "total", "selected"]


@dataclass
class LayerSelection:
    """The layers a selector chose, how every candidate scored, and the fused features.

    Attributes:
        layers: Chosen layer indices (0-based positions in the input list), in the order chosen.
        scores: One row per scored candidate. LOES, greedy ridge and best-single tables have columns
            ``step, layer, ridge_loss, iso, red, tri, total, selected``; a term that does not enter
            ``total`` at that step (Red and Tri at step 0, Tri for regression, the ridge loss and
            Tri without labels) is NaN. Exhaustive and last-layer tables have one row per evaluated
            subset, with columns ``layers`` (a tuple), ``size``, ``ridge_loss``, ``total``,
            ``selected``.
        method: Name of the selector (a key of ``SELECTORS``).
        variant: ``ripieno`` or ``reference`` (LOES; the baselines are ``ripieno``).
        task: ``classification``, ``regression`` or ``label_free``.
        fused: ``(N, sum D)`` fused calibration features: the chosen layers concatenated in chosen
            order, or, if ``orthogonal``, the centred first layer followed by each later layer's part
            orthogonal to the layers chosen before it. Built from the calibration layers when first
            read (a property): the layer pipeline needs only ``layers``, and the copy is as large as
            the chosen layers (float64 for ours).
        orthogonal: Which of the two ``fused`` holds (the default of ``transform``).
        layer_dims: Feature width of every input layer, checked by ``transform``.
    """

    layers: list[int]
    scores: pd.DataFrame = field(repr=False)
    method: str
    task: str
    orthogonal: bool
    layer_dims: list[int] = field(repr=False)
    _first_mean: Tensor = field(repr=False)
    _residualizers: list[Residualizer] | None = field(repr=False)
    _dtype: torch.dtype = field(repr=False)  # of the fused and transformed features
    variant: str = "ripieno"
    # The chosen calibration layers, kept until both the fused features and the residualizers are built.
    _calibration: list[Tensor] | None = field(default=None, repr=False)
    _fused: Tensor | None = field(default=None, repr=False)

    @property
    def fused(self) -> Tensor:
        """``(N, sum D)`` fused calibration features (see the class docstring); built on first read."""
        if self._fused is None:
            assert self._calibration is not None
            self._fused = self._fuse(self._calibration)
            if self._residualizers is not None:
                self._calibration = None
        return self._fused

    def _fitted_residualizers(self) -> list[Residualizer]:
        """The orthogonalisation maps, fitted on the calibration layers the first time they are needed."""
        if self._residualizers is None:
            assert self._calibration is not None
            chosen = [layer.to(self._dtype) for layer in self._calibration]
            self._residualizers = [fit_residualizer(chosen[j], torch.cat(chosen[:j], dim=1))
                                   for j in range(1, len(chosen))]
            if self._fused is not None:
                self._calibration = None
        return self._residualizers

    @without_autocast
    def transform(self, layers: LayerInput, orthogonal: bool | None = None) -> Tensor:
        """Fuse new data (e.g. the test split) the way ``fused`` was built from calibration data.

        Orthogonal parts reuse the calibration means and least-squares maps, so the transform is a
        fixed linear map of the new features.

        Args:
            layers: The same layers as at selection (every layer, same widths), for any ``N``.
            orthogonal: Override ``self.orthogonal``.

        Returns:
            ``(N, sum D)`` fused features, in the dtype used for selection.
        """
        views = prepare_layers(layers, self._dtype, device=self._first_mean.device, keep_narrower=True)
        dims = [v.shape[1] for v in views]
        if dims != self.layer_dims:
            raise ValueError(
                f"transform got layers of widths {dims} but the selection was made on widths "
                f"{self.layer_dims}; pass all layers of the same model, in the same order."
            )
        return self._fuse([views[i] for i in self.layers], orthogonal)

    @without_autocast
    def _fuse(self, chosen: list[Tensor], orthogonal: bool | None = None) -> Tensor:
        """The fused features from the chosen layers (validated; narrower dtypes converted), in order."""
        dtype = self._dtype
        if not (self.orthogonal if orthogonal is None else orthogonal):
            if all(layer.dtype == dtype for layer in chosen):
                return torch.cat(chosen, dim=1)
            # Converted straight into the result: no converted copy of each layer first.
            width = sum(layer.shape[1] for layer in chosen)
            return torch.cat(chosen, dim=1, out=chosen[0].new_empty(chosen[0].shape[0], width, dtype=dtype))
        chosen = [layer.to(dtype) for layer in chosen]
        parts = [chosen[0] - self._first_mean]
        for i, residualizer in enumerate(self._fitted_residualizers(), start=1):
            parts.append(residualizer(chosen[i], torch.cat(chosen[:i], dim=1)))
        return torch.cat(parts, dim=1)




def build_result(
    views: list[Tensor],
    chosen: list[int],
    scores: pd.DataFrame,
    method: str,
    task: str,
    orthogonal: bool,
    variant: str = "ripieno",
    dtype: torch.dtype | None = None,
) -> LayerSelection:
    """The selection's result; ``views`` narrower than ``dtype`` (default: theirs) are converted."""
    first = views[chosen[0]]
    dtype = dtype or first.dtype
    return LayerSelection(
        layers=list(chosen),
        scores=scores,
        method=method,
        task=task,
        variant=variant,
        orthogonal=orthogonal,
        layer_dims=[v.shape[1] for v in views],
        _first_mean=first.mean(dim=0, dtype=dtype),
        _residualizers=None,
        _dtype=dtype,
        _calibration=[views[i] for i in chosen],
    )
