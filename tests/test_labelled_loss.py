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
