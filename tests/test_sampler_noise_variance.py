"""Every posterior sampler shares one regression-noise estimate: the mean squared training residual.

Oracle: the closed form ``mean((f(x_i) - y_i)^2)`` over the training rows, computed here from the network in
eval mode; a given ``noise_variance`` is used as given. The five samplers get their settings, their
validation and the estimate from one place (``PosteriorPredictiveCallback``).
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from ripieno.callbacks import (
    DeepEnsembleSampler,
    LaplaceGGN,
    LaplaceSampler,
    LastLayerSampler,
    MCDropoutSampler,
    SWAGSampler,
)
from ripieno.callbacks.posterior_predictive import PosteriorPredictiveCallback
from ripieno.callbacks.sampler_settings import SamplerSettingError


class Regressor(L.LightningModule):
    """A regression network with dropout; ``lr=0`` keeps its weights, so every SWAG snapshot is the same."""

    task = "regression"

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Dropout(0.5), nn.Linear(8, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return nn.functional.mse_loss(self(batch["x"])[:, 0], batch["y"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


class Rows(L.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(48, 4, generator=g)
        self.y = 2 * self.x[:, 0] + 0.5 * torch.randn(48, generator=g)

    def train_dataloader(self):
        return DataLoader([{"x": x, "y": y} for x, y in zip(self.x, self.y, strict=True)], batch_size=16)


SAMPLERS = {
    "LastLayerSampler": lambda **kw: LastLayerSampler(n_samples=2, **kw, posterior=LaplaceGGN(max_iters=5)),
    "LaplaceSampler": lambda **kw: LaplaceSampler(n_samples=2, optimize_prior=False, **kw),
    "MCDropoutSampler": lambda **kw: MCDropoutSampler(n_samples=2, **kw),
    "DeepEnsembleSampler": lambda paths, **kw: DeepEnsembleSampler(paths, **kw),
    "SWAGSampler": lambda **kw: SWAGSampler(n_samples=2, swa_start=0, max_rank=0, **kw),
}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A fitted module, its data, the trainer (with its datamodule) and two member checkpoints."""
    root = tmp_path_factory.mktemp("noise")
    model, data = Regressor(), Rows()
    trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=root)
    trainer.fit(model, datamodule=data)
    paths = [str(root / f"member{i}.ckpt") for i in range(2)]
    for path in paths:
        trainer.save_checkpoint(path)
    model.eval()
    with torch.no_grad():
        closed_form = float(((model(data.x)[:, 0] - data.y) ** 2).mean())
    model.train()
    return model, data, trainer, paths, closed_form


def _prepared(name: str, fitted, tmp_path, **settings) -> PosteriorPredictiveCallback:
    model, data, trainer, paths, _ = fitted
    if name == "SWAGSampler":  # collects the (unchanged) weights during a fit, then prepares at its end
        sampler = SAMPLERS[name](**settings)
        L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                  enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[sampler]).fit(
                      model, datamodule=data)
        return sampler
    make = SAMPLERS[name]
    sampler = make(paths, **settings) if name == "DeepEnsembleSampler" else make(**settings)
    sampler.prepare(trainer, model)
    return sampler


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_the_noise_estimate_is_the_mean_squared_training_residual(name, fitted, tmp_path):
    sampler = _prepared(name, fitted, tmp_path)
    assert sampler.likelihood == "regression"  # from the module's task
    assert sampler.noise_variance == pytest.approx(fitted[-1], rel=1e-5)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_a_given_noise_variance_is_used_as_given(name, fitted, tmp_path):
    sampler = _prepared(name, fitted, tmp_path, noise_variance=0.37)
    assert sampler.noise_variance_setting == 0.37
    assert sampler.noise_variance == pytest.approx(0.37, rel=1e-5)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_every_sampler_checks_its_likelihood_settings_in_one_place(name, fitted):
    paths = fitted[3]
    make = SAMPLERS[name]
    build = (lambda **kw: make(paths, **kw)) if name == "DeepEnsembleSampler" else make
    with pytest.raises(SamplerSettingError, match=rf"^{name}\(noise_variance=-1.0\): noise_variance must be"):
        build(noise_variance=-1.0)
    with pytest.raises(SamplerSettingError, match=rf"^{name}\(likelihood='poisson'\): likelihood must be"):
        build(likelihood="poisson")
    sampler = build(likelihood="regression")
    assert (sampler.likelihood_setting, sampler.noise_variance_setting) == ("regression", None)
