"""GeoReg's differentiable geometry terms on a batch of embeddings (float32).

* ``isotropy(z)``: ``Iso = tr(C)^2 / (d * ||C||_F^2)`` of the covariance ``C`` of the
  rows of ``z`` (the participation ratio of its eigenvalues over ``d``): 1 when every
  direction has the same variance, ``1/d`` for rank 1, always in ``(0, 1]``. Computed
  from the ``B x B`` Gram matrix (no eigendecomposition), so it is cheap and smooth. With
  ``B <= d`` its maximum is ``(B - 1) / d``.
* ``spectral_imbalance(z) = 1 - isotropy(z)``.
* ``centroid_log_volume(z, y)``: log of the ``(k-1)``-volume of the simplex spanned by the
  ``k`` class centroids present in the batch,
  ``log V = 1/2 log det(E^T E) - log (k-1)!`` with ``E`` the edges ``mu_c - mu_0``
  (for two classes, the log distance of the centroids). GeoReg minimises ``-log V``
  (collapsed centroids have ``V -> 0``).

Rows are L2-normalised first (``normalize=True``) so that neither term can be gamed by
scaling the embedding.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def _prepare(z: Tensor, normalize: bool) -> Tensor:
    z = z.float().flatten(1)
    return F.normalize(z, dim=1) if normalize else z


def isotropy(z: Tensor, normalize: bool = True) -> Tensor:
    """``tr(C)^2 / (d ||C||_F^2)`` of the rows' covariance, in ``(0, 1]``."""
    z = _prepare(z, normalize)
    if z.shape[0] < 2:
        raise ValueError(f"Isotropy needs at least 2 rows, got {z.shape[0]}.")
    zc = z - z.mean(0, keepdim=True)
    gram = zc @ zc.T  # B x B: tr(C) and ||C||_F share the nonzero spectrum of Zc^T Zc
    trace = gram.diagonal().sum()
    frob2 = (gram * gram).sum()
    return trace**2 / (z.shape[1] * frob2.clamp_min(1e-30))


def spectral_imbalance(z: Tensor, normalize: bool = True) -> Tensor:
    """``1 - isotropy(z)``: 0 for an isotropic covariance."""
    return 1.0 - isotropy(z, normalize)


def centroid_log_volume(z: Tensor, y: Tensor, normalize: bool = True, eps: float = 1e-6) -> Tensor:
    """Log volume of the simplex of the class centroids present in the batch.

    Raises:
        ValueError: fewer than two classes in the batch.
    """
    z = _prepare(z, normalize)
    classes = torch.unique(y)
    if len(classes) < 2:
        raise ValueError("The centroid volume needs at least two classes in the batch.")
    centroids = torch.stack([z[y == c].mean(0) for c in classes])
    edges = (centroids[1:] - centroids[:1]).T  # d x (k-1)
    gram = edges.T @ edges
    k1 = len(classes) - 1
    eye = torch.eye(k1, device=z.device, dtype=z.dtype)
    return 0.5 * torch.logdet(gram + eps * eye) - math.lgamma(k1 + 1)
