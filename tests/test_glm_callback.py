"""LastLayerSampler on a user's module: fit after training, test metrics, predict samples."""

import inspect
from contextlib import nullcontext
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from helpers.ddp import DestroyGlooAtExit
from helpers.tiny_lightning import TinyClassifier, TinyData
from scipy.special import logsumexp, softmax

from ripieno.callbacks import LaplaceGGN, LeastSquaresLogits, SamplerEvaluation
from ripieno.callbacks.glm_sampler import LastLayerSampler
from ripieno.framework.errors import RipienoDeprecationWarning

pytestmark = pytest.mark.filterwarnings("ignore:You passed in a .val_dataloader. but have no")


def _trainer(tmp_path, callback):
    return L.Trainer(max_epochs=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[callback])


@pytest.mark.parametrize("glm", ["last_layer", "full"])
def test_classification_metrics_equal_direct_computation(tmp_path, glm):
    model, data = TinyClassifier(), TinyData()
    callback = LastLayerSampler(glm=glm, n_samples=8, posterior=LaplaceGGN(prior_precision=2.0, max_iters=50))
    trainer = _trainer(tmp_path, callback)
    trainer.fit(model, datamodule=data)
    assert callback.sampler is not None and callback.sampler.z.shape[0] == 8
    result = trainer.test(model, datamodule=data, verbose=False)[0]
    test_batch = {"x": torch.stack([r["x"] for r in data.rows[120:]]),
                  "y": torch.stack([r["y"] for r in data.rows[120:]])}
    samples = callback.sampler.predict(test_batch).numpy().astype(np.float64)  # (B, S, C)
    log_probs = np.log(softmax(samples, axis=-1))
    y = test_batch["y"].numpy()
    nll = -np.mean(logsumexp(log_probs[np.arange(len(y)), :, y], axis=1) - np.log(8))
    assert result["uq/test/nll"] == pytest.approx(nll, rel=1e-4)
    assert result["uq/test/lppd"] == pytest.approx(-nll, rel=1e-4)
    assert 0.0 <= result["uq/test/ece"] <= 1.0
    predictions = trainer.predict(model, datamodule=data)
    assert predictions[0]["posterior_samples"].shape == (20, 8, 3)


def test_regression_gaussian_nll_includes_noise(tmp_path):
    model, data = TinyClassifier(n_out=1, task="regression"), TinyData("regression")
    callback = LastLayerSampler(n_samples=6, posterior=LaplaceGGN(max_iters=50),
                                evaluation=SamplerEvaluation(noise_variance=0.25))
    trainer = _trainer(tmp_path, callback)
    trainer.fit(model, datamodule=data)
    result = trainer.test(model, datamodule=data, verbose=False)[0]
    x = torch.stack([r["x"] for r in data.rows[120:]])
    y = torch.stack([r["y"] for r in data.rows[120:]]).double()
    samples = callback.sampler.predict({"x": x, "y": y})[..., 0].double()
    mean, var = samples.mean(1), samples.var(1, unbiased=False) + 0.25
    nll = (0.5 * torch.log(2 * torch.pi * var) + (y - mean) ** 2 / (2 * var)).mean()
    assert result["uq/test/nll"] == pytest.approx(float(nll), rel=1e-4)


def test_noise_variance_is_estimated_from_training_residuals(tmp_path):
    model, data = TinyClassifier(n_out=1, task="regression"), TinyData("regression")
    callback = LastLayerSampler(n_samples=2, posterior=LaplaceGGN(max_iters=20))
    _trainer(tmp_path, callback).fit(model, datamodule=data)
    model.eval()
    with torch.no_grad():
        x = torch.stack([r["x"] for r in data.rows[:100]])
        y = torch.stack([r["y"] for r in data.rows[:100]])
        expected = float(((model(x)[:, 0] - y) ** 2).mean())
    assert callback.sampler.noise_variance == pytest.approx(expected, rel=1e-5)


def test_unknown_glm_is_rejected():
    with pytest.raises(ValueError, match="last_layer"):
        LastLayerSampler(glm="middle")


def test_mc_dropout_metrics_equal_its_own_samples_and_repeat(tmp_path):
    from ripieno.callbacks import MCDropoutSampler

    model, data = TinyClassifier(), TinyData()
    callback = MCDropoutSampler(n_samples=6, seed=1)
    trainer = _trainer(tmp_path, callback)
    trainer.fit(model, datamodule=data)
    first = trainer.test(model, datamodule=data, verbose=False)[0]
    second = trainer.test(model, datamodule=data, verbose=False)[0]
    assert first == second  # masks restart with every test run
    callback._calls = 0
    model.eval()
    samples = torch.cat([callback.sample(model, b) for b in data.test_dataloader()])
    assert samples.shape == (40, 6, 3)
    assert not torch.allclose(samples[:, 0], samples[:, 1])  # dropout really is on
    assert not model.net[2].training  # and off again afterwards
    y = torch.stack([r["y"] for r in data.rows[120:]])
    probs = torch.softmax(samples.double(), -1).mean(1)
    nll = -probs[torch.arange(40), y].log().mean()
    assert first["uq/test/nll"] == pytest.approx(float(nll), rel=1e-4)


def test_mc_dropout_without_dropout_is_an_error(tmp_path):
    from ripieno.callbacks import MCDropoutSampler

    model, data = TinyClassifier(), TinyData()
    model.net[2].p = 0.0
    trainer = _trainer(tmp_path, MCDropoutSampler(n_samples=3))
    with pytest.raises(ValueError, match="no dropout with p > 0"):
        trainer.fit(model, datamodule=data)


def test_prior_precision_grid_keeps_the_best_validation_lppd(tmp_path):
    model, data = TinyClassifier(), TinyData()
    callback = LastLayerSampler(n_samples=20,
                                posterior=LaplaceGGN(prior_precision_grid=[0.01, 1.0, 100.0], max_iters=60))
    trainer = _trainer(tmp_path, callback)
    trainer.fit(model, datamodule=data)
    scores = callback.validation_lppd
    assert set(scores) == {0.01, 1.0, 100.0}
    assert callback.chosen_prior_precision == max(scores, key=scores.get)
    assert callback.sampler.prior_precision == callback.chosen_prior_precision
    # The recorded score is the validation LPPD of the kept sampler, recomputed directly.
    x = torch.stack([r["x"] for r in data.rows[100:120]])
    y = torch.stack([r["y"] for r in data.rows[100:120]])
    probs = torch.softmax(callback.sampler.predict({"x": x, "y": y}).double(), -1).mean(1)
    assert scores[callback.chosen_prior_precision] == pytest.approx(
        float(probs[torch.arange(20), y].log().mean()), rel=1e-4)
    result = trainer.test(model, datamodule=data, verbose=False)[0]
    assert result["uq/prior_precision"] == callback.chosen_prior_precision


def _stack(rows):
    return {"x": torch.stack([r["x"] for r in rows]), "y": torch.stack([r["y"] for r in rows])}


@pytest.mark.parametrize("glm", ["last_layer", "full"])
def test_least_squares_logits_grid_keeps_the_best_validation_lppd(tmp_path, glm):
    model, data = TinyClassifier(), TinyData()
    callback = LastLayerSampler(glm=glm, n_samples=6,
                                posterior=LeastSquaresLogits(epochs=3, batch_size=16,
                                                             gamma_grid=[0.01, 0.3, 3.0],
                                                             predictive_scale_grid=[0.5, 1.0, 2.0]))
    trainer = _trainer(tmp_path, callback)
    trainer.fit(model, datamodule=data)
    sampler = callback.sampler
    assert sampler.epochs == 3 and sampler.perturb == ("weights" if glm == "last_layer" else "all")
    assert sampler.n_train == 100 and not sampler.progress  # the trainer's bar is off
    scores = callback.grid_lppd
    assert len(scores) == 9 and len(set(scores.values())) > 1
    best = max(scores, key=scores.get)
    assert (callback.chosen_gamma, callback.chosen_predictive_scale) == best == (sampler.gamma, sampler.scale)
    # The kept pair's score is the validation LPPD of its samples, recomputed directly.
    val = _stack(data.rows[100:120])
    probs = torch.softmax(sampler.predict(val).double(), -1).mean(1)
    assert scores[best] == pytest.approx(float(probs[torch.arange(20), val["y"]].log().mean()), rel=1e-4)
    result = trainer.test(model, datamodule=data, verbose=False)[0]
    assert (result["uq/gamma"], result["uq/predictive_scale"]) == pytest.approx(best)
    test = _stack(data.rows[120:])
    probs = torch.softmax(sampler.predict(test).double(), -1).mean(1)
    nll = -probs[torch.arange(40), test["y"]].log().mean()
    assert result["uq/test/nll"] == pytest.approx(float(nll), rel=1e-4)


def test_least_squares_logits_takes_the_reference_settings_and_shows_progress(tmp_path):
    full = LastLayerSampler(glm="full", posterior=LeastSquaresLogits())
    last = LastLayerSampler(posterior=LeastSquaresLogits(lr=0.05))
    assert {k: full.settings[k] for k in ("epochs", "batch_size", "lr", "momentum", "gamma")} == {
        "epochs": 10, "batch_size": 152, "lr": 1e-2, "momentum": 0.9, "gamma": 0.01}
    assert {k: last.settings[k] for k in ("epochs", "batch_size", "lr", "gamma")} == {
        "epochs": 20, "batch_size": 56, "lr": 0.05, "gamma": 1.0}
    callback = LastLayerSampler(n_samples=2, posterior=LeastSquaresLogits(epochs=1))
    trainer = L.Trainer(max_epochs=1, logger=False, enable_model_summary=False, enable_checkpointing=False,
                        default_root_dir=tmp_path, callbacks=[callback])
    trainer.fit(TinyClassifier(), datamodule=TinyData())
    assert callback.sampler.progress and callback.sampler.n_train == 100


def test_varroc_map_prediction_uses_the_networks_argmax(tmp_path):
    from ripieno.framework.metrics.uq import VarROC

    model, data = TinyClassifier(), TinyData()
    callback = LastLayerSampler(n_samples=8, posterior=LaplaceGGN(prior_precision=0.05, max_iters=50),
                                evaluation=SamplerEvaluation(varroc_prediction="map"))
    trainer = _trainer(tmp_path, callback)
    trainer.fit(model, datamodule=data)
    result = trainer.test(model, datamodule=data, verbose=False)[0]
    test = _stack(data.rows[120:])
    probs = torch.softmax(callback.sampler.predict(test), -1)
    model.eval()
    with torch.no_grad():
        map_logits = model(test["x"])
    expected = VarROC("id", input_kind="probs", prediction="map")
    expected.update(probs, test["y"], map_outputs=map_logits)
    assert result["uq/test/varroc_id"] == pytest.approx(float(expected.compute()), abs=1e-6)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"posterior": "exact"}, "posterior must be"),
    ({"posterior": {"kind": "exact"}}, "posterior.kind must be"),
    ({"posterior": LeastSquaresLogits(), "evaluation": SamplerEvaluation(likelihood="regression")},
     "use posterior='laplace_ggn'"),
    ({"posterior": LeastSquaresLogits(gamma_grid=[0.0, 1.0])}, "positive values"),
    ({"posterior": LeastSquaresLogits(momentum=1.5)}, "momentum must be"),
    ({"posterior": LeastSquaresLogits(epochs=0)}, "epochs and batch_size"),
    ({"posterior": LaplaceGGN(solver="lbfgs")}, "solver must be"),
    ({"posterior": LaplaceGGN(max_iters=0)}, "max_iters"),
    ({"glm": "full", "posterior": LaplaceGGN(selection="evidence")}, "glm='last_layer' only"),
    ({"evaluation": SamplerEvaluation(varroc_prediction="mode")}, "varroc_prediction must be"),
])
def test_bad_posterior_arguments_are_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LastLayerSampler(**kwargs)


@pytest.mark.parametrize("kwargs", [
    {"gamma": 0.1},  # the default posterior is laplace_ggn
    {"predictive_scale_grid": [1.0]},
    {"posterior": "least_squares_logits", "prior_precision_grid": [1.0]},
    {"posterior": LeastSquaresLogits(), "solver": "sgd"},
])
def test_a_flat_setting_of_the_other_posterior_is_refused_as_before_the_groups(kwargs):
    old_string = isinstance(kwargs.get("posterior"), str)
    with pytest.warns(RipienoDeprecationWarning) if old_string else nullcontext():
        with pytest.raises(ValueError, match="apply to the other posterior only; drop them"):
            LastLayerSampler(**kwargs)


def test_the_flat_arguments_of_earlier_releases_build_the_same_sampler_with_a_warning():
    with pytest.warns(RipienoDeprecationWarning, match=r"posterior=LeastSquaresLogits\(gamma_grid=\.\.\.\)"):
        old = LastLayerSampler(glm="full", posterior="least_squares_logits", gamma_grid=[0.1, 1.0], epochs=2)
    new = LastLayerSampler(glm="full", posterior=LeastSquaresLogits(gamma_grid=[0.1, 1.0], epochs=2))
    assert old.posterior == new.posterior and old.settings == new.settings
    with pytest.warns(RipienoDeprecationWarning, match=r"posterior=LaplaceGGN\(max_iters=\.\.\.\)"):
        old = LastLayerSampler(prior_precision=3.0, max_iters=7, selection="evidence")
    assert old.posterior == LaplaceGGN(prior_precision=3.0, max_iters=7, selection="evidence")
    assert (old.prior_precision, old.max_iters, old.selection) == (3.0, 7, "evidence")
    with pytest.raises(ValueError, match="given twice; keep posterior.max_iters"):
        LastLayerSampler(posterior=LaplaceGGN(max_iters=3), max_iters=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'prior'"):
        LastLayerSampler(prior=1.0)
    assert len(inspect.signature(LastLayerSampler).parameters) == 8  # 26 flat before the groups


def test_least_squares_logits_rejects_a_regression_module(tmp_path):
    callback = LastLayerSampler(n_samples=2, posterior=LeastSquaresLogits(epochs=1))
    with pytest.raises(ValueError, match="regression module"):
        _trainer(tmp_path, callback).fit(TinyClassifier(n_out=1, task="regression"),
                                         datamodule=TinyData("regression"))


def test_posterior_is_refit_when_other_weights_are_loaded(tmp_path):
    model, data = TinyClassifier(), TinyData()
    callback = LastLayerSampler(n_samples=4, posterior=LaplaceGGN(max_iters=30))
    trainer = _trainer(tmp_path, callback)
    trainer.fit(model, datamodule=data)
    first = callback.sampler
    with torch.no_grad():
        model.net[3].weight.mul_(1.5)  # as if a different checkpoint had been loaded
    trainer.test(model, datamodule=data, verbose=False)
    assert callback.sampler is not first
    assert torch.equal(callback.sampler.theta_star, callback.sampler.lin.theta_star())


def test_deep_ensemble_averages_member_probabilities(tmp_path):
    from ripieno.callbacks.deep_ensemble import DeepEnsembleSampler

    data, paths, members = TinyData(), [], []
    for seed in range(3):
        torch.manual_seed(seed)
        model = TinyClassifier()
        torch.manual_seed(seed)
        for p in model.parameters():
            torch.nn.init.normal_(p, std=0.3)
        trainer = L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path)
        trainer.fit(model, datamodule=data)
        path = tmp_path / f"member{seed}.ckpt"
        trainer.save_checkpoint(path)
        paths.append(str(path))
        members.append(model.eval())
    callback = DeepEnsembleSampler([str(p) for p in paths])
    result = _trainer(tmp_path, callback).test(TinyClassifier(), datamodule=data, verbose=False)[0]
    x = torch.stack([r["x"] for r in data.rows[120:]])
    y = torch.stack([r["y"] for r in data.rows[120:]])
    with torch.no_grad():
        probs = torch.stack([torch.softmax(m(x).double(), -1) for m in members], 1).mean(1)
    assert result["uq/test/nll"] == pytest.approx(float(-probs[torch.arange(40), y].log().mean()), rel=1e-5)
    with pytest.raises(FileNotFoundError, match="train the members first"):
        DeepEnsembleSampler([str(paths[0]), str(tmp_path / "nope.ckpt")])


def test_reliability_diagram_is_written_from_the_ece_states(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    model, data = TinyClassifier(), TinyData()
    callback = LastLayerSampler(n_samples=4, posterior=LaplaceGGN(max_iters=30))
    trainer = L.Trainer(max_epochs=2, logger=CSVLogger(tmp_path), enable_progress_bar=False,
                        enable_model_summary=False, enable_checkpointing=False, callbacks=[callback])
    trainer.fit(model, datamodule=data)
    trainer.test(model, datamodule=data, verbose=False)
    path = callback.reliability_path
    assert path is not None and path.parent == Path(trainer.log_dir)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"



@pytest.mark.slow
def test_ddp_test_equals_one_process(tmp_path):
    """Every rank fits the same posterior (training data in a fixed order); test shards sync."""
    model, data = TinyClassifier(), TinyData()
    _trainer(tmp_path, LastLayerSampler(n_samples=4,
                                        posterior=LaplaceGGN(max_iters=30))).fit(model, datamodule=data)
    single = L.Trainer(logger=False, enable_progress_bar=False, callbacks=[LastLayerSampler(n_samples=4)],
                       default_root_dir=tmp_path)
    one = single.test(model, datamodule=data, verbose=False)[0]
    ddp = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False,
                    enable_progress_bar=False, callbacks=[LastLayerSampler(n_samples=4), DestroyGlooAtExit()],
                    default_root_dir=tmp_path)
    two = ddp.test(model, datamodule=data, verbose=False)[0]
    for name in ("uq/test/nll", "uq/test/ece", "uq/test/accuracy", "uq/test/varroc_id"):
        assert two[name] == pytest.approx(one[name], rel=1e-5, abs=1e-7), name


def _prepared_callback(kind, tmp_path):
    """A fitted model and a baseline callback that already holds its posterior state."""
    from ripieno.callbacks import DeepEnsembleSampler, LaplaceSampler, SWAGSampler

    model, data = TinyClassifier(), TinyData()
    if kind == "deep_ensemble":
        paths = []
        for seed in range(2):
            torch.manual_seed(seed)
            member = TinyClassifier()
            L.Trainer(max_epochs=2, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False).fit(member, datamodule=data)
            path = tmp_path / f"member{seed}.ckpt"
            L.Trainer(logger=False).strategy.connect(member)
            torch.save({"state_dict": member.state_dict(), "pytorch-lightning_version": L.__version__}, path)
            paths.append(str(path))
        return model, data, DeepEnsembleSampler(paths)
    callback = (SWAGSampler(n_samples=4, swa_start=1) if kind == "swag"
                else LaplaceSampler(n_samples=400, seed=1))
    _trainer(tmp_path, callback).fit(model, datamodule=data)
    return model, data, callback


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "rel"), [("swag", 1e-5), ("deep_ensemble", 1e-5), ("laplace", 2e-2)])
def test_baseline_ddp_test_equals_one_process(tmp_path, kind, rel):
    """SWAG (collected moments) and deep ensembles give the same test metrics on 2 ddp_spawn
    ranks as in one process. Laplace refits on every rank (same fit: ordered training data),
    but laplace-torch draws its function-space GLM samples per batch, so sharded batches
    see other draws: equal up to Monte-Carlo error (S=400)."""
    model, data, callback = _prepared_callback(kind, tmp_path)
    single = L.Trainer(logger=False, enable_progress_bar=False, callbacks=[callback],
                       default_root_dir=tmp_path)
    one = single.test(model, datamodule=data, verbose=False)[0]
    ddp = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False,
                    enable_progress_bar=False, callbacks=[callback, DestroyGlooAtExit()],
                    default_root_dir=tmp_path)
    two = ddp.test(model, datamodule=data, verbose=False)[0]
    # 40 test points: ECE and accuracy of MC draws jump by whole points; compare NLL only there.
    names = ("uq/test/nll",) if kind == "laplace" else ("uq/test/nll", "uq/test/ece", "uq/test/accuracy",
                                                        "uq/test/varroc_id")
    for name in names:
        assert two[name] == pytest.approx(one[name], rel=rel, abs=1e-7), name


@pytest.mark.parametrize("solver", ["cg", "sgd"])
def test_glm_solve_shows_a_progress_bar_only_when_asked(tmp_path, capsys, solver):
    model, data = TinyClassifier(), TinyData()
    for shown in (True, False):
        callback = LastLayerSampler(n_samples=2, progress_bar=shown,
                                    posterior=LaplaceGGN(max_iters=3, solver=solver))
        _trainer(tmp_path, callback).fit(model, datamodule=data)
        err = capsys.readouterr().err
        assert ("GLM posterior solve" in err) == shown
