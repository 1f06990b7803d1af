"""Sampler settings that cannot work stop a run when the callback is built, before any training.

A posterior predictive of one sample has no spread, and its metrics are about the spread:
``VarROC`` (classification) ranks points by the variance over samples and rejects ``S = 1``
at the first test batch, after the whole training; so every sampler needs ``n_samples >= 2``.
"""

import lightning as L
import pytest
import torch
from helpers.tiny_lightning import TinyClassifier, TinyData

from ripieno.callbacks import (
    DeepEnsembleSampler,
    LaplaceGGN,
    LaplaceSampler,
    LastLayerSampler,
    MCDropoutSampler,
    SWAGSampler,
    TemperatureScaling,
)
from ripieno.callbacks.sampler_settings import SamplerSettingError
from ripieno.framework.cli import main
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.metrics.uq import VarROC

pytestmark = pytest.mark.filterwarnings("ignore:You passed in a .val_dataloader. but have no")
LEAST_SQUARES = {"posterior": "least_squares_logits"}

CASES = [
    (LastLayerSampler, {"n_samples": 0}, "n_samples"),
    (LastLayerSampler, {"n_samples": 1}, "n_samples"),
    (LastLayerSampler, {"prior_precision": 0.0}, "prior_precision"),
    (LastLayerSampler, {"prior_precision_grid": []}, "prior_precision_grid"),
    (LastLayerSampler, {"prior_precision_grid": [1.0, -1.0]}, "prior_precision_grid"),
    (LastLayerSampler, {"max_iters": 0}, "max_iters"),
    (LastLayerSampler, {"noise_variance": -1.0}, "noise_variance"),
    (LastLayerSampler, {"solver": "adam"}, "solver"),
    (LastLayerSampler, {**LEAST_SQUARES, "gamma_grid": [0.0]}, "gamma_grid"),
    (LastLayerSampler, {**LEAST_SQUARES, "predictive_scale": float("inf")}, "predictive_scale"),
    (LastLayerSampler, {**LEAST_SQUARES, "momentum": 1.0}, "momentum"),
    (LastLayerSampler, {**LEAST_SQUARES, "batch_size": 0}, "batch_size"),
    (LastLayerSampler, {"temperature": float("nan")}, "temperature"),
    (LastLayerSampler, {"ood_dataloader_idx": -1}, "ood_dataloader_idx"),
    (MCDropoutSampler, {"n_samples": 1}, "n_samples"),
    (MCDropoutSampler, {"likelihood": "poisson"}, "likelihood"),
    (SWAGSampler, {"n_samples": 1}, "n_samples"),
    (SWAGSampler, {"swa_start": -1}, "swa_start"),
    (SWAGSampler, {"swa_start": 1.5}, "swa_start"),
    (SWAGSampler, {"collect_every": 0}, "collect_every"),
    (SWAGSampler, {"max_rank": 1}, "max_rank"),
    (SWAGSampler, {"scale": 0.0}, "scale"),
    (SWAGSampler, {"var_clamp": -1e-3}, "var_clamp"),
    (LaplaceSampler, {"n_samples": 1}, "n_samples"),
    (LaplaceSampler, {"prior_precision": -1.0}, "prior_precision"),
    (LaplaceSampler, {"likelihood": "binary"}, "likelihood"),
    (DeepEnsembleSampler, {"checkpoints": ["only.ckpt"]}, "checkpoints"),
    (TemperatureScaling, {"grid_size": 2}, "grid_size"),
    (TemperatureScaling, {"n_bins": 0}, "n_bins"),
    (TemperatureScaling, {"tol": 0.0}, "tol"),
    (TemperatureScaling, {"bounds": (0.0, 10.0)}, "bounds"),
]


@pytest.mark.parametrize(("cls", "kwargs", "name"), CASES,
                         ids=[f"{c.__name__}-{n}-{k[n]!r}" for c, k, n in CASES])
def test_a_bad_setting_is_one_line_naming_the_argument_its_value_and_the_fix(cls, kwargs, name):
    with pytest.raises(SamplerSettingError) as caught:
        cls(**kwargs)
    message = str(caught.value)
    assert isinstance(caught.value, RipienoInputError)  # the ripieno command prints it as one line
    assert "\n" not in message
    assert message.startswith(f"{cls.__name__}({name}={kwargs[name]!r}): ")
    assert "; " in message and message.endswith(".")  # why it cannot work; the fix.


def test_two_samples_are_enough_and_one_is_not(tmp_path):
    with pytest.raises(ValueError, match="samples >= 2"):  # why the check is n_samples >= 2
        VarROC(input_kind="probs").update(torch.full((4, 1, 3), 1 / 3), torch.zeros(4, dtype=torch.long))
    sampler = LastLayerSampler(n_samples=2, posterior=LaplaceGGN(max_iters=5))
    trainer = L.Trainer(max_epochs=1, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[sampler])
    model, data = TinyClassifier(), TinyData()
    trainer.fit(model, datamodule=data)
    result = trainer.test(model, datamodule=data, verbose=False)[0]
    assert 0.0 <= result["uq/test/varroc_id"] <= 1.0


@pytest.mark.parametrize("n_samples", [0, 1])
def test_the_command_stops_before_training_with_the_one_line_message(tmp_path, monkeypatch, n_samples):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sampler.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: ripieno.callbacks.LastLayerSampler\n"
        f"      init_args:\n        n_samples: {n_samples}\n")
    with pytest.raises(SystemExit) as caught:
        main(["fit", "-c", "uq/ll_glm_boston", "-c", "sampler.yaml", "--trainer.default_root_dir=run",
              "--trainer.max_epochs=1"])
    message = str(caught.value)
    assert message.startswith(f"ripieno: error: LastLayerSampler(n_samples={n_samples}): n_samples must be an"
                              " integer >= 2, as the predictive uncertainty is the spread of the samples")
    assert message.endswith("; set n_samples to 2 or more (10 is the default).") and "\n" not in message
    assert not [p for p in (tmp_path / "run").rglob("*") if p.is_file()]  # no checkpoint, log or config
