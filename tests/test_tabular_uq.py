"""TabularMLP with LL-GLM for regression: units, loss identity, Gaussian NLL."""

import lightning as L
import pytest
import torch

from ripieno.callbacks import LaplaceGGN, LastLayerSampler, SamplerEvaluation
from ripieno.datamodules import LoaderSettings, TabularDataModule
from ripieno.framework import TabularMLP


def test_loss_is_the_standardised_squared_error():
    dm = TabularDataModule("concrete", numeric_embedding="none", max_rows=300)
    model = TabularMLP(dm.spec, hidden=[16])
    out, y = torch.randn(20, 1) * 10 + 30, torch.randn(20) * 10 + 30
    m, s = dm.spec.target_mean, dm.spec.target_std
    standardised = torch.nn.functional.mse_loss((out[:, 0] - m) / s, (y - m) / s)
    assert torch.allclose(model.member_loss(out[:, None], y), standardised, rtol=1e-5)


def test_ll_glm_regression_metrics_and_units(tmp_path):
    dm = TabularDataModule("concrete", numeric_embedding="none", max_rows=400,
                           loader=LoaderSettings(batch_size=64))
    model = TabularMLP(dm.spec, hidden=[32, 32])
    callback = LastLayerSampler(n_samples=8, posterior=LaplaceGGN(prior_precision=1.0),
                                evaluation=SamplerEvaluation(input_key=["x_num", "x_cat"]))
    trainer = L.Trainer(max_epochs=20, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[callback])
    trainer.fit(model, datamodule=dm)
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    batch = next(iter(dm.test_dataloader()))
    samples = callback.sampler.predict(batch)[..., 0].double()  # (B, S) in MPa
    y = batch["y"].double()
    noise = callback.sampler.noise_variance
    mean, var = samples.mean(1), samples.var(1, unbiased=False) + noise
    nll = (0.5 * torch.log(2 * torch.pi * var) + (y - mean) ** 2 / (2 * var)).mean()
    assert result["uq/test/nll"] == pytest.approx(float(nll), rel=1e-4)
    model.eval()
    with torch.no_grad():
        direct = model(batch)[:, 0]
    z = callback.sampler.z
    callback.sampler.z = torch.zeros_like(z)  # the linearisation at theta* is the network itself
    assert torch.allclose(callback.sampler.predict(batch)[:, 0, 0], direct, atol=1e-4)
    callback.sampler.z = z
    assert result["test/rmse"] < dm.spec.target_std  # it learned something, in target units


def test_evidence_selection_picks_the_closed_form_maximiser(tmp_path):
    from ripieno.framework.uq import last_layer_log_evidence

    dm = TabularDataModule("concrete", numeric_embedding="none", max_rows=300,
                           loader=LoaderSettings(batch_size=64))
    model = TabularMLP(dm.spec, hidden=[16])
    grid = [0.001, 0.1, 10.0, 1000.0]
    callback = LastLayerSampler(n_samples=2,
                                posterior=LaplaceGGN(prior_precision_grid=grid, selection="evidence"),
                                evaluation=SamplerEvaluation(noise_variance=25.0,
                                                             input_key=["x_num", "x_cat"]))
    trainer = L.Trainer(max_epochs=5, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[callback])
    trainer.fit(model, datamodule=dm)
    model.eval()
    rows = dm._split("train")
    with torch.no_grad():
        phi = model.body(rows.x_num)  # concrete has no categorical columns
        residual = rows.y[:, None] - model.head(phi)
    features = torch.cat([phi, torch.ones(len(phi), 1)], 1)
    expected = {lam: last_layer_log_evidence(features, residual, lam, 25.0) for lam in grid}
    assert callback.log_evidence == pytest.approx(expected, rel=1e-6)
    assert callback.chosen_prior_precision == max(expected, key=expected.get)
    with pytest.raises(ValueError, match="glm='last_layer' only"):
        LastLayerSampler(glm="full", posterior=LaplaceGGN(selection="evidence"))
