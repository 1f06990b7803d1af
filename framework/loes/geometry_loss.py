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


def centroid_log_volume_of_present_classes(z: Tensor, y: Tensor, n_classes: int, normalize: bool = True,
                                           eps: float = 1e-6) -> Tensor:
    """``centroid_log_volume`` over the classes present in the batch, without a host read.

    The same value, computed with shapes that do not depend on the labels' values, so an
    accelerator never waits for the host: the ``n_classes`` centroids come from one one-hot
    product, and the Gram matrix of the edges keeps the present classes' block and an
    identity elsewhere (``det`` of the whole is ``det`` of that block). Rows labelled below 0
    (unlabelled) are left out. With fewer than two present classes it is 0 (the term is off),
    where ``centroid_log_volume`` raises.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> z, y = torch.randn(12, 5, generator=g), torch.tensor([0, 2, 2, 0, 3, 3, 0, 2, 3, 0, 2, 3])
        >>> dense = centroid_log_volume_of_present_classes(z, y, n_classes=5)
        >>> bool(torch.allclose(dense, centroid_log_volume(z, y), atol=1e-5))
        True
        >>> float(centroid_log_volume_of_present_classes(z, torch.zeros(12, dtype=torch.long), 5))
        0.0
    """
    z = _prepare(z, normalize)
    labelled = (y >= 0).to(z.dtype)
    one_hot = torch.zeros(z.shape[0], n_classes, dtype=z.dtype, device=z.device)
    one_hot.scatter_(1, y.clamp_min(0)[:, None], labelled[:, None])
    counts = one_hot.sum(0)
    present = (counts > 0).to(z.dtype)
    centroids = (one_hot.T @ z) / counts.clamp_min(1)[:, None]  # (n_classes, d)
    return _simplex_log_volume(centroids, present, eps)


def _simplex_log_volume(centroids: Tensor, present: Tensor, eps: float) -> Tensor:
    """Log volume of the simplex of the ``present`` (0/1) rows of ``centroids``, with fixed shapes."""
    n_classes = centroids.shape[0]
    first = torch.argmax(present)  # the first present class: the simplex's base vertex
    base = centroids.index_select(0, first.reshape(1))
    others = torch.arange(n_classes, device=centroids.device) != first
    vertex = present * others.to(centroids.dtype)  # the other vertices
    edges = centroids - base  # rows of absent classes and of the base are masked out below
    gram = edges @ edges.T
    gram = vertex[:, None] * vertex[None, :] * gram + torch.diag(vertex * eps + (1 - vertex))
    return 0.5 * torch.logdet(gram) - torch.lgamma(vertex.sum() + 1)


class EpochGeometry:
    """An epoch's isotropy and centroid log volume, from running sums kept on the device.

    Adds each batch's prepared rows to ``sum z``, ``sum z z^T`` and per-class sums and counts
    (float64 accumulators), so the epoch's embeddings are never kept or copied to the host;
    ``values()`` reads the two numbers once, at the end of the epoch. The results equal
    ``isotropy`` and ``centroid_log_volume`` of all the epoch's rows at once (rows labelled
    below 0 count for the isotropy, not for the centroids).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> z, y = torch.randn(40, 6, generator=g), torch.arange(40) % 3
        >>> epoch = EpochGeometry(n_classes=3)
        >>> for rows in range(0, 40, 16):
        ...     epoch.add(z[rows:rows + 16], y[rows:rows + 16])
        >>> values = epoch.values()
        >>> round(values["isotropy"], 5) == round(float(isotropy(z)), 5)
        True
        >>> round(values["centroid_log_volume"], 4) == round(float(centroid_log_volume(z, y)), 4)
        True

    Args:
        n_classes: Number of classes (labels ``0 .. n_classes - 1``).
        normalize: L2-normalise rows first, as the loss does.
        eps: The volume's ridge, as in ``centroid_log_volume``.
    """

    def __init__(self, n_classes: int, normalize: bool = True, eps: float = 1e-6) -> None:
        self.n_classes, self.normalize, self.eps = n_classes, normalize, eps
        self.rows = 0
        self.total: Tensor | None = None
        self.outer: Tensor | None = None
        self.class_sums: Tensor | None = None
        self.class_counts: Tensor | None = None

    def add(self, z: Tensor, y: Tensor) -> None:
        """Add a batch of embeddings ``(B, ...)`` and labels ``(B,)`` (no host read)."""
        z = _prepare(z.detach(), self.normalize)
        labelled = (y >= 0).to(z.dtype)
        one_hot = torch.zeros(z.shape[0], self.n_classes, dtype=z.dtype, device=z.device)
        one_hot.scatter_(1, y.clamp_min(0)[:, None], labelled[:, None])
        parts = (z.sum(0).double(), (z.T @ z).double(), (one_hot.T @ z).double(), one_hot.sum(0).double())
        self.rows += z.shape[0]  # a shape: known on the host
        if self.total is None:
            self.total, self.outer, self.class_sums, self.class_counts = parts
            return
        sums = (self.total, self.outer, self.class_sums, self.class_counts)
        added = (a + b for a, b in zip(sums, parts, strict=True))
        self.total, self.outer, self.class_sums, self.class_counts = added

    def values(self) -> dict[str, float]:
        """``isotropy`` (with at least 2 rows) and ``centroid_log_volume`` (with 2+ classes)."""
        if self.rows < 2 or self.total is None or self.outer is None:
            return {}
        assert self.class_sums is not None and self.class_counts is not None
        centred = self.outer - torch.outer(self.total, self.total) / self.rows
        trace, frob2 = centred.diagonal().sum(), centred.square().sum()
        out = {"isotropy": float(trace**2 / (centred.shape[0] * frob2.clamp_min(1e-30)))}
        present = (self.class_counts > 0).double()
        if present.sum().item() >= 2:
            centroids = self.class_sums / self.class_counts.clamp_min(1)[:, None]
            out["centroid_log_volume"] = float(_simplex_log_volume(centroids, present, self.eps))
        return out


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
