"""TabularEnsembleModule: the ensemble reductions, the optimiser groups, the extension
point and checkpoints, each against a direct computation."""

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from ripieno.datamodules import LoaderSettings, TabularDataModule
from ripieno.framework import TabularEnsembleModule, TabularSpec


def _spec(task="multiclass", n_classes=3):
    return TabularSpec(task=task, n_num_features=3, cat_cardinalities=[4, 2],
                       n_classes=None if task == "regression" else n_classes,
                       bins=[[-2.0, 0.0, 1.0, 3.0], [-1.0, 1.0], [0.0, 0.5, 1.0]],
                       target_mean=2.0, target_std=3.0)


def _batch(task="multiclass", n=10, n_classes=3):
    g = torch.Generator().manual_seed(0)
    y = (torch.randn(n, generator=g) * 3 + 2 if task == "regression"
         else torch.randint(0, n_classes, (n,), generator=g))
    return {"x_num": torch.randn(n, 3, generator=g),
            "x_cat": torch.stack([torch.randint(0, 4, (n,), generator=g),
                                  torch.randint(0, 2, (n,), generator=g)], 1), "y": y}


@pytest.mark.parametrize("task", ["multiclass", "binary", "regression"])
def test_training_loss_is_mean_of_member_losses(task):
    torch.manual_seed(0)
    n_classes = 2 if task == "binary" else 3
    model = TabularEnsembleModule(_spec(task, n_classes), k=5, d_block=16, dropout=0.0)
    batch = _batch(task, n_classes=n_classes)
    raw = model(batch["x_num"], batch["x_cat"])
    per_member = []
    for k in range(5):
        if task == "multiclass":
            per_member.append(F.cross_entropy(raw[:, k], batch["y"]))
        elif task == "binary":
            per_member.append(F.binary_cross_entropy_with_logits(raw[:, k, 0], batch["y"].float()))
        else:
            per_member.append(F.mse_loss(raw[:, k, 0], (batch["y"] - 2.0) / 3.0))
    expected = torch.stack(per_member).mean()
    # member_loss reads the protocol's member outputs (regression: target units, the loss divided
    # by target_scale() ** 2), which is the loss of the raw standardised outputs.
    assert torch.allclose(model.member_loss(model.forward_members(batch), batch["y"]), expected, atol=1e-6)


def test_prediction_is_mean_of_member_probabilities():
    model = TabularEnsembleModule(_spec(), k=4, d_block=16)
    raw = torch.randn(6, 4, 3)
    expected = torch.softmax(raw, -1).mean(1)
    assert torch.allclose(model.predict_ensemble(raw), expected)
    # Not the softmax of the mean logit (a different, wrong reduction).
    assert not torch.allclose(model.predict_ensemble(raw), torch.softmax(raw.mean(1), -1))


def test_binary_prediction_and_regression_units():
    binary = TabularEnsembleModule(_spec("binary", 2), k=3, d_block=8)
    raw = torch.randn(5, 3, 1)
    p1 = torch.sigmoid(raw[..., 0]).mean(1)
    assert torch.allclose(binary.predict_ensemble(raw), torch.stack([1 - p1, p1], -1))
    spec = _spec("regression")
    spec.target_transform = "log"
    reg = TabularEnsembleModule(spec, k=3, d_block=8)
    raw = torch.randn(5, 3, 1)
    mean = (raw[..., 0] * 3.0 + 2.0).mean(1)
    assert torch.allclose(reg.predict_ensemble(raw), mean)
    reg.eval()  # dropout off, as in Trainer.predict
    batch = _batch("regression", n=5)
    out = reg.predict_step(batch, 0)
    assert out["member_predictions"].shape == (5, 3)
    direct = reg.predict_ensemble(reg(batch["x_num"], batch["x_cat"]))
    assert torch.allclose(out["prediction"], direct.exp())


def test_weight_decay_only_on_weight_matrices():
    model = TabularEnsembleModule(_spec(), k=3, d_block=8, adapter="lometab", weight_decay=0.1)
    decay, no_decay = model.configure_optimizers().param_groups
    decay_ids = {id(p) for p in decay["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    for pid, name in names.items():
        expect_decay = name.endswith(".weight") and "num_embeddings" not in name
        assert (pid in decay_ids) == expect_decay, name
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_registered_loss_term_is_added_to_training_loss():
    torch.manual_seed(0)
    model = TabularEnsembleModule(_spec(), k=2, d_block=8, dropout=0.0)
    model.log = lambda *a, **k: None  # no trainer attached
    batch = _batch()
    plain = model.training_step(batch, 0)["loss"]
    model.register_loss_term("l2_outputs", lambda m, b, out: out["member_outputs"].square().mean())
    with_term = model.training_step(batch, 0)
    raw = model(batch["x_num"], batch["x_cat"])
    assert torch.allclose(with_term["loss"], plain + raw.square().mean(), atol=1e-6)
    with pytest.raises(ValueError, match="already registered"):
        model.register_loss_term("l2_outputs", lambda m, b, out: torch.zeros(()))
    model.remove_loss_term("l2_outputs")
    assert torch.allclose(model.training_step(batch, 0)["loss"], plain)


def test_checkpoint_loads_with_weights_only(tmp_path):
    dm = TabularDataModule("mlc_churn", max_rows=400, n_bins=6, loader=LoaderSettings(batch_size=64))
    model = TabularEnsembleModule(dm.spec, k=3, d_block=16)
    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=1, logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    trainer.fit(model, datamodule=dm)
    path = tmp_path / "m.ckpt"
    trainer.save_checkpoint(path)
    torch.load(path, weights_only=True)  # hyperparameters are plain data
    loaded = TabularEnsembleModule.load_from_checkpoint(path, weights_only=True)
    batch = next(iter(dm.val_dataloader()))
    model.eval()
    loaded.eval()
    assert torch.equal(model(batch["x_num"], batch["x_cat"]), loaded(batch["x_num"], batch["x_cat"]))
    assert loaded.spec == dm.spec


def test_spec_type_error_names_the_fix():
    with pytest.raises(TypeError, match="datamodule.spec"):
        TabularEnsembleModule(data_spec=[1, 2])


def test_validate_before_fit_then_fit(tmp_path):
    """A standalone validate (inference mode) must not leave metric states that break fit."""
    dm = TabularDataModule("mlc_churn", max_rows=400, n_bins=6, loader=LoaderSettings(batch_size=64))
    model = TabularEnsembleModule(dm.spec, k=3, d_block=16)
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False,
                        default_root_dir=tmp_path)
    before = trainer.validate(model, datamodule=dm, verbose=False)[0]
    trainer.fit(model, datamodule=dm)
    after = trainer.validate(model, datamodule=dm, verbose=False)[0]
    assert set(before) == set(after) and after["val/nll"] != before["val/nll"]


def test_adapter_init_defaults_to_plain_and_reaches_every_adapted_layer():
    from ripieno.framework.nn import EnsembleLinear

    model = TabularEnsembleModule(_spec(), k=3, d_block=8, adapter="lometab")
    assert model.hparams.adapter_init == "plain"
    model = TabularEnsembleModule(_spec(), k=3, d_block=8, adapter="lometab", adapter_init="rank_normalized")
    adapted = [m for m in model.net.blocks if isinstance(m, EnsembleLinear)]
    assert adapted and {m.adapter_init for m in adapted} == {"rank_normalized"}
    assert model.hparams.adapter_init == "rank_normalized"  # saved for load_from_checkpoint
    model = TabularEnsembleModule(_spec(), k=3, d_block=8, adapter="additive", adapter_init="relative")
    assert {m.adapter_init for m in model.net.blocks if isinstance(m, EnsembleLinear)} == {"relative"}


@pytest.mark.parametrize(("adapter", "bad", "allowed"), [
    ("lometab", "relative", "'plain', 'rank_normalized'"),
    ("additive", "rank_normalized", "'plain', 'relative'"),
])
def test_bad_adapter_init_fails_with_the_allowed_values(adapter, bad, allowed):
    with pytest.raises(ValueError, match=allowed):
        TabularEnsembleModule(_spec(), k=3, d_block=8, adapter=adapter, adapter_init=bad)
