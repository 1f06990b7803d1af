"""One target scaling and one masking rule for every method module (issue 21 item 6).

The tabular ensemble's loss goes through the base's ``step``: ``member_loss`` of the member
outputs divided by ``target_scale() ** 2`` (regression) over the rows ``scored_rows`` keeps.
"""

from __future__ import annotations

import pytest
import torch

from ripieno.framework.methods import TabularEnsembleModule, TabularMLP
from ripieno.framework.specs import TabularSpec

MEAN, STD = 2.0, 3.0


def _batch(n: int, y: torch.Tensor) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {"x_num": torch.randn(n, 3, generator=g), "x_cat": torch.randint(0, 3, (n, 1), generator=g),
            "y": y}


def _module(task: str, cls: type = TabularEnsembleModule):
    torch.manual_seed(0)
    n_classes = {"regression": None, "binary": 2, "multiclass": 3}[task]
    spec = TabularSpec(task, 3, cat_cardinalities=[4], n_classes=n_classes, target_mean=MEAN, target_std=STD,
                       bins=[[-2.0, 0.0, 2.0]] * 3)
    kwargs = {"k": 5, "d_block": 16, "dropout": 0.0} if cls is TabularEnsembleModule else {"dropout": 0.0}
    return cls(spec, **kwargs).eval()


def test_regression_loss_is_the_mean_member_squared_error_of_standardised_targets():
    model = _module("regression")
    y = torch.randn(12, generator=torch.Generator().manual_seed(2)) * STD + MEAN
    batch = _batch(12, y)
    raw = model(batch["x_num"], batch["x_cat"])[..., 0]  # (B, K): standardised member outputs
    closed_form = ((raw - ((y - MEAN) / STD)[:, None]) ** 2).mean()  # the loss before the change
    assert model.target_scale() == STD
    assert torch.allclose(model.step(batch, "train")["loss"], closed_form, rtol=1e-5, atol=1e-6)
    in_target_units = raw[..., None] * STD + MEAN  # what forward_members returns
    assert torch.allclose(model.member_loss(in_target_units, y), closed_form, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("task", "cls"), [("binary", TabularEnsembleModule),
                                           ("multiclass", TabularEnsembleModule), ("multiclass", TabularMLP)])
def test_unlabelled_rows_do_not_contribute_to_the_loss(task, cls):
    model = _module(task, cls)
    n_classes = 2 if task == "binary" else 3
    labels = torch.randint(0, n_classes, (8,), generator=torch.Generator().manual_seed(3))
    labelled = _batch(8, labels)
    mixed = _batch(12, torch.cat([labels, torch.full((4,), -1)]))
    mixed["x_num"][:8], mixed["x_cat"][:8] = labelled["x_num"], labelled["x_cat"]
    expected = model.step(labelled, "train")["loss"]
    for stage in ("train", "val"):
        assert torch.allclose(model.step(mixed, stage)["loss"], expected, atol=1e-6)
    mixed["x_num"] = mixed["x_num"].requires_grad_()
    model.step(mixed, "train")["loss"].backward()
    assert bool((mixed["x_num"].grad[8:] == 0).all()) and bool((mixed["x_num"].grad[:8] != 0).any())


def test_a_batch_without_labels_has_no_loss_in_evaluation_and_a_zero_in_training():
    model = _module("multiclass")
    batch = _batch(6, torch.full((6,), -1))
    assert "loss" not in model.step(batch, "val")
    loss = model.step(batch, "train")["loss"]
    assert float(loss.detach()) == 0.0 and loss.requires_grad


@pytest.mark.parametrize("kind, n_classes", [("logits", 3), ("binary_logits", 2)])
@pytest.mark.parametrize("labels", [[0, 1, -1, 1, -1, 0], [1, 0, 1, 1, 0, 0], [-1] * 6])
def test_the_training_loss_needs_no_host_read_and_equals_the_labelled_rows_loss(kind, n_classes, labels):
    """Training weighs rows on the device; the oracle is the member loss of the labelled rows alone."""
    from ripieno.framework.host_syncs import HostSyncCounter
    from ripieno.framework.methods.member_module import MemberModule

    module = MemberModule()
    module.init_members(kind, n_classes)
    width = 1 if kind == "binary_logits" else n_classes
    outputs = torch.randn(6, 4, width, generator=torch.Generator().manual_seed(3), requires_grad=True)
    y = torch.tensor(labels)
    with HostSyncCounter() as syncs:
        loss = module.labelled_loss(outputs, y, "train")
    assert len(syncs) == 0
    kept = y >= 0
    if kept.any():
        expected = module.member_loss(outputs[kept], y[kept])
        assert torch.allclose(loss, expected, rtol=1e-6, atol=1e-7)
        assert torch.allclose(module.labelled_loss(outputs, y, "val"), expected, rtol=1e-6, atol=1e-7)
    else:
        assert loss.item() == 0.0 and module.labelled_loss(outputs, y, "val") is None
    loss.backward()  # the graph is kept, and unlabelled rows get no gradient
    assert outputs.grad is not None and torch.all(outputs.grad[~kept] == 0)


def test_mcover_copy_loss_weighs_rows_like_the_masked_sum_over_copies():
    from ripieno.framework.mcover.routed_mlp import copy_cross_entropy

    logits = torch.randn(5, 3, 4, generator=torch.Generator().manual_seed(4))
    y = torch.tensor([2, -1, 0, 3, -1])
    kept = y >= 0
    weighted = copy_cross_entropy(logits, y.clamp_min(0), kept.float())
    assert torch.allclose(weighted, copy_cross_entropy(logits[kept], y[kept]), rtol=1e-6)
