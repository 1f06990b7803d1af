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

``reference_georeg_terms`` gives the public GeoReg code's terms instead (eigenvalue variance of
the raw covariance, log area of one random centroid triangle), for ``GeoReg(variant="reference")``.
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


def reference_georeg_terms(z: Tensor, y: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """The public GeoReg code's two terms on a batch: eigenvalue variance and log triangle area.

    * ``Var(lambda)``: the (unbiased) variance of the eigenvalues of ``cov(z) + 1e-4 I``, clamped
      at ``1e-6``, on the raw (not normalised) rows: 0 for an isotropic covariance, and it grows
      with the square of the embedding's scale;
    * ``log(A + 1e-6)``: ``A`` the area of the triangle of the centroids of three distinct classes
      of the batch drawn at random (``generator``), or 0 when the batch has fewer than 3 classes.

    The reference loss is ``0.1 * (Var(lambda) - log(A + 1e-6))``.

    Args:
        z: Embeddings ``(B, d)`` (flattened after the batch axis).
        y: Labels ``(B,)``.
        generator: CPU generator of the class draw.

    Returns:
        ``(variance, log_area)``, 0-dim float32 tensors (``log_area`` is 0 below 3 classes).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> z = torch.randn(64, 8, generator=g)
        >>> y = torch.arange(64) % 4
        >>> variance, log_area = reference_georeg_terms(z, y, g)
        >>> bool(variance > 0), log_area.shape
        (True, torch.Size([]))
    """
    z = z.float().flatten(1)
    if z.shape[0] < 2:
        raise ValueError(f"GeoReg needs at least 2 rows, got {z.shape[0]}.")
    cov = torch.cov(z.T) + 1e-4 * torch.eye(z.shape[1], dtype=z.dtype, device=z.device)
    variance = torch.linalg.eigvalsh(cov).clamp_min(1e-6).var()
    classes = torch.unique(y)
    if len(classes) < 3:
        return variance, torch.zeros((), dtype=z.dtype, device=z.device)
    picked = classes[torch.randperm(len(classes), generator=generator)[:3].to(classes.device)]
    a, b, c = (z[y == k].mean(0) for k in picked)
    u, v = b - a, c - a
    area = 0.5 * (u.square().sum() * v.square().sum() - (u * v).sum().square()).clamp_min(0).sqrt()
    return variance, torch.log(area + 1e-6)
