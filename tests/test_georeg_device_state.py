"""GeoReg keeps its per-step work on the device (issue 24, item 3), with the same numbers as before."""

from __future__ import annotations

import pytest
import torch

from ripieno.callbacks import GeoReg
from ripieno.framework.host_syncs import HostSyncCounter
from ripieno.framework.loes.geometry_loss import (
    EpochGeometry,
    centroid_log_volume,
    centroid_log_volume_of_present_classes,
    isotropy,
)


@pytest.mark.parametrize("labels", [[0, 1, 2, 3], [1, 3], [2, 0, 2], [3], [0, 1, 2, 3, -1]])
def test_the_fixed_shape_volume_equals_the_volume_of_the_present_classes(labels):
    g = torch.Generator().manual_seed(len(labels))
    y = torch.tensor(labels).repeat(5)
    z = torch.randn(len(y), 7, generator=g)
    dense = centroid_log_volume_of_present_classes(z, y, n_classes=4)
    kept = y >= 0
    if len(torch.unique(y[kept])) < 2:
        assert dense.item() == 0.0
    else:
        assert torch.allclose(dense, centroid_log_volume(z[kept], y[kept]), rtol=1e-5, atol=1e-5)


def test_the_training_term_reads_nothing_on_the_host_and_equals_the_unique_based_term():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(24, 6, generator=g, requires_grad=True)
    y = torch.tensor([0, 2, 3] * 8)
    on_device, on_host = GeoReg(weight=0.5, n_classes=4), GeoReg(weight=0.5)
    with HostSyncCounter() as syncs:
        term = on_device._term(None, {"y": y}, {"features": z})
        on_device._collect("train", {"features": z}, {"y": y})
    assert [str(s) for s in syncs.calls] == []
    expected = on_host._term(None, {"y": y}, {"features": z})  # torch.unique, one host read
    assert torch.allclose(term, expected, rtol=1e-5, atol=1e-6)
    (grad,) = torch.autograd.grad(term, z)
    (expected_grad,) = torch.autograd.grad(expected, z)
    assert torch.allclose(grad, expected_grad, rtol=1e-4, atol=1e-6)


def test_epoch_running_sums_equal_the_measures_of_all_the_epochs_rows():
    g = torch.Generator().manual_seed(1)
    z = torch.randn(90, 5, generator=g) + torch.tensor([2.0, 0, 0, 0, 0])
    y = torch.randint(-1, 3, (90,), generator=g)
    epoch = EpochGeometry(n_classes=3)
    for start in range(0, 90, 32):
        epoch.add(z[start:start + 32], y[start:start + 32])
    values = epoch.values()
    kept = y >= 0
    assert values["isotropy"] == pytest.approx(float(isotropy(z)), rel=1e-5)
    expected_volume = float(centroid_log_volume(z[kept], y[kept]))
    assert values["centroid_log_volume"] == pytest.approx(expected_volume, rel=1e-4)
    assert EpochGeometry(n_classes=3).values() == {}
    one_class = EpochGeometry(n_classes=3)
    one_class.add(z[:10], torch.zeros(10, dtype=torch.long))
    assert set(one_class.values()) == {"isotropy"}
