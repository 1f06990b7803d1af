"""GeoReg ``variant="reference"``: the public GeoReg loss, against a numpy closed form."""

from __future__ import annotations

import io
import pickle
from multiprocessing.reduction import ForkingPickler

import numpy as np
import pytest
import torch

from ripieno.callbacks import GeoReg
from ripieno.framework.loes.geometry_loss import reference_georeg_terms


def _numpy_reference(z: np.ndarray, y: np.ndarray, classes: list[int]) -> float:
    """``0.1 (Var(eig(cov + 1e-4 I) clamped at 1e-6) - log(area(centroids of classes) + 1e-6))``."""
    cov = np.cov(z.T.astype(np.float64)) + 1e-4 * np.eye(z.shape[1])
    variance = np.var(np.clip(np.linalg.eigvalsh(cov), 1e-6, None), ddof=1)
    a, b, c = (z[y == k].astype(np.float64).mean(0) for k in classes)
    u, v = b - a, c - a
    area = 0.5 * np.sqrt(max(u @ u * (v @ v) - (u @ v) ** 2, 0.0))
    return 0.1 * (variance - np.log(area + 1e-6))


def test_reference_loss_matches_the_closed_form() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(96, 6, generator=g) * 2 + torch.arange(6.0)
    y = torch.arange(96) % 5
    z[y == 2] += 3.0
    callback = GeoReg(variant="reference", seed=7)
    value = callback._term(None, {"y": y}, {"features": z})
    # The same draw as the callback's: three distinct classes of the batch from its seeded generator.
    classes = torch.unique(y)[torch.randperm(5, generator=torch.Generator().manual_seed(7))[:3]].tolist()
    assert float(value) == pytest.approx(_numpy_reference(z.numpy(), y.numpy(), classes), rel=1e-4)


def test_reference_triangle_term_is_zero_below_three_classes() -> None:
    z = torch.randn(20, 4, generator=torch.Generator().manual_seed(1))
    y = torch.arange(20) % 2
    variance, log_area = reference_georeg_terms(z, y, torch.Generator())
    assert float(log_area) == 0.0
    eig = np.clip(np.linalg.eigvalsh(np.cov(z.numpy().T.astype(np.float64)) + 1e-4 * np.eye(4)), 1e-6, None)
    assert float(variance) == pytest.approx(np.var(eig, ddof=1), rel=1e-4)


def test_reference_loss_is_differentiable_and_lowers_with_spread_centroids() -> None:
    g = torch.Generator().manual_seed(2)
    y = torch.arange(60) % 3
    base = torch.randn(60, 5, generator=g)
    means = torch.randn(3, 5, generator=g)
    collapsed = base + 0.01 * means[y]
    spread = base + 5.0 * means[y]
    low = GeoReg(variant="reference")._term(None, {"y": y}, {"features": spread.requires_grad_()})
    high = GeoReg(variant="reference")._term(None, {"y": y}, {"features": collapsed})
    low.backward()
    assert torch.isfinite(spread.grad).all()
    # With 3 classes every draw is the same triangle: the log-area term alone separates the two.
    _, log_low = reference_georeg_terms(spread.detach(), y, torch.Generator())
    _, log_high = reference_georeg_terms(collapsed, y, torch.Generator())
    assert float(log_low) > float(log_high)
    assert float(low.detach()) != float(high)


def test_reference_rejects_ripieno_options() -> None:
    for option in ({"spectral_weight": 1.0}, {"volume_weight": 0.5}, {"normalize": False}):
        with pytest.raises(ValueError, match="variant='ripieno'"):
            GeoReg(variant="reference", **option)
    with pytest.raises(ValueError, match="variant"):
        GeoReg(variant="paper")  # type: ignore[arg-type]


def test_reference_generator_state_round_trips() -> None:
    first = GeoReg(variant="reference", seed=3)
    z = torch.randn(40, 4)
    y = torch.arange(40) % 6
    first._term(None, {"y": y}, {"features": z})
    state = first.state_dict()
    second = GeoReg(variant="reference", seed=99)
    second.load_state_dict(state)
    a = first._term(None, {"y": y}, {"features": z})
    b = second._term(None, {"y": y}, {"features": z})
    assert float(a) == float(b)


def test_reference_generator_state_survives_spawn_pickling() -> None:
    # ddp_spawn sends callbacks to its workers with torch's ForkingPickler (shared-memory tensor reductions).
    first = GeoReg(variant="reference", seed=3)
    z = torch.randn(40, 4)
    y = torch.arange(40) % 6
    first._term(None, {"y": y}, {"features": z})
    buffer = io.BytesIO()
    ForkingPickler(buffer).dump(first)
    second = pickle.loads(buffer.getvalue())
    assert not any(isinstance(v, torch.Tensor) for v in first.__getstate__().values())
    batch, outputs = {"y": y}, {"features": z}
    assert float(first._term(None, batch, outputs)) == float(second._term(None, batch, outputs))
