"""``SamplerEvaluation``: the five samplers' shared settings as one group, and the old flat arguments.

Oracles: the grouped and the flat construction of the same sampler agree on every setting; the
parser's printed config; Python's own ``TypeError`` for a keyword or positional argument a function
does not take.
"""

from __future__ import annotations

import inspect
import io
import subprocess
import sys

import pytest
import yaml

from ripieno.callbacks import (
    DeepEnsembleSampler,
    LaplaceSampler,
    LastLayerSampler,
    MCDropoutSampler,
    SWAGSampler,
    TemperatureScaling,
)
from ripieno.callbacks.sampler_evaluation import EVALUATION_FIELDS, SamplerEvaluation
from ripieno.framework.cli import main
from ripieno.framework.errors import RipienoDeprecationWarning

SAMPLERS = {
    "LastLayerSampler": (LastLayerSampler, {}),
    "MCDropoutSampler": (MCDropoutSampler, {}),
    "SWAGSampler": (SWAGSampler, {}),
    "LaplaceSampler": (LaplaceSampler, {}),
    "DeepEnsembleSampler": (DeepEnsembleSampler, {"checkpoints": ["a.ckpt", "b.ckpt"]}),  # files: see below
}
SETTINGS = {"likelihood": "regression", "noise_variance": 0.5, "input_key": ["x_num", "x_cat"],
            "target_key": "label", "ood_dataloader_idx": 1, "varroc_prediction": "map", "temperature": None}


@pytest.mark.parametrize("name", SAMPLERS)
def test_the_group_sets_what_the_flat_arguments_set(name: str, tmp_path, monkeypatch) -> None:
    cls, required = SAMPLERS[name]
    monkeypatch.chdir(tmp_path)
    for checkpoint in required.get("checkpoints", []):  # the deep ensemble checks its members exist
        (tmp_path / checkpoint).write_bytes(b"")
    grouped = cls(**required, evaluation=SamplerEvaluation(**SETTINGS))
    with pytest.warns(RipienoDeprecationWarning) as caught:
        flat = cls(**required, **SETTINGS)
    assert grouped.evaluation == flat.evaluation == SamplerEvaluation(**SETTINGS)
    for attribute in ("input_key", "target_key", "ood_dataloader_idx", "varroc_prediction", "temperature"):
        assert getattr(grouped, attribute) == getattr(flat, attribute) == SETTINGS[attribute]
    assert grouped.likelihood_setting == flat.likelihood_setting == "regression"
    assert grouped.noise_variance_setting == flat.noise_variance_setting == 0.5
    assert {str(w.message).split("(", 2)[1].split("=")[0] for w in caught} == set(SETTINGS)
    assert all(f"is now {name}(evaluation=SamplerEvaluation(" in str(w.message) for w in caught)


@pytest.mark.parametrize("name", SAMPLERS)
def test_no_sampler_declares_the_evaluation_settings_itself(name: str) -> None:
    cls, _ = SAMPLERS[name]
    parameters = inspect.signature(cls).parameters
    assert not set(EVALUATION_FIELDS) & set(parameters)
    assert parameters["evaluation"].default == SamplerEvaluation()


def test_a_setting_given_both_ways_or_unknown_or_positional_is_refused() -> None:
    with pytest.raises(ValueError, match=r"MCDropoutSampler\(input_key=...\) and .* given twice"):
        MCDropoutSampler(input_key="a", evaluation=SamplerEvaluation(input_key="b"))
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_sample'"):
        MCDropoutSampler(n_sample=4)
    with pytest.raises(TypeError, match="positional"):
        MCDropoutSampler(4, "regression")  # once n_samples, likelihood: now keyword-only, not silently seed
    with pytest.raises(ValueError, match="likelihood"):  # Laplace has no single-logit likelihood
        LaplaceSampler(evaluation=SamplerEvaluation(likelihood="binary"))


def test_a_temperature_callback_in_the_group_is_the_one_used() -> None:
    scaling = TemperatureScaling()
    sampler = MCDropoutSampler(evaluation=SamplerEvaluation(temperature=scaling))
    assert sampler.temperature is scaling


def _sampler_recipe(tmp_path, init_args: dict) -> str:
    recipe = {"trainer": {"callbacks": [{"class_path": "ripieno.callbacks.MCDropoutSampler",
                                         "init_args": init_args}]}}
    path = tmp_path / "sampler.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return str(path)


def test_a_recipe_file_with_the_flat_keys_still_loads_grouped(tmp_path, capsys) -> None:
    path = _sampler_recipe(tmp_path, {"n_samples": 4, "ood_dataloader_idx": 1, "temperature": "callback"})
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", "uq/mc_dropout_fashion_mnist", "-c", path, "--print_config"])
    assert stop.value.code in (0, None)
    printed = capsys.readouterr()
    callbacks = yaml.safe_load(io.StringIO(printed.out))["trainer"]["callbacks"]
    sampler = next(c for c in callbacks if c["class_path"].endswith("MCDropoutSampler"))["init_args"]
    assert sampler["n_samples"] == 4 and "ood_dataloader_idx" not in sampler
    assert sampler["evaluation"]["ood_dataloader_idx"] == 1
    assert sampler["evaluation"]["temperature"] == "callback"
    warned = [line for line in printed.err.splitlines() if line.startswith("ripieno: warning: ")]
    assert len(warned) == 2 and all("is now trainer.callbacks[0].init_args.evaluation." in w for w in warned)


def test_the_shipped_sampler_recipes_use_the_group(tmp_path) -> None:
    command = [sys.executable, "-m", "ripieno", "fit", "-c", "uq/ll_glm_lenet_fashion_mnist_reference",
               "--print_config"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=True)
    assert "ripieno: warning" not in done.stderr
    callbacks = yaml.safe_load(done.stdout)["trainer"]["callbacks"]
    sampler = next(c for c in callbacks if c["class_path"].endswith("LastLayerSampler"))
    evaluation = sampler["init_args"]["evaluation"]
    assert (evaluation["varroc_prediction"], evaluation["ood_dataloader_idx"]) == ("map", 1)
    assert sampler["init_args"]["posterior"]["kind"] == "least_squares_logits"


def test_a_last_layer_recipe_of_earlier_releases_loads_with_its_posterior_grouped(tmp_path, capsys) -> None:
    """``posterior: least_squares_logits`` with its settings flat beside it: the group the parser builds."""
    old = {"glm": "last_layer", "n_samples": 4, "posterior": "least_squares_logits", "gamma_grid": [0.1, 1.0],
           "epochs": 2, "ood_dataloader_idx": 1}
    sampler_entry = {"class_path": "ripieno.callbacks.LastLayerSampler", "init_args": old}
    recipe = {"trainer": {"callbacks": [sampler_entry]}}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", "uq/ll_glm_fashion_mnist", "-c", str(path), "--print_config"])
    assert stop.value.code in (0, None)
    printed = capsys.readouterr()
    callbacks = yaml.safe_load(io.StringIO(printed.out))["trainer"]["callbacks"]
    sampler = next(c for c in callbacks if c["class_path"].endswith("LastLayerSampler"))["init_args"]
    posterior = sampler["posterior"]
    assert (posterior["kind"], posterior["gamma_grid"], posterior["epochs"]) == ("least_squares_logits",
                                                                                 [0.1, 1.0], 2)
    assert "gamma_grid" not in sampler and sampler["evaluation"]["ood_dataloader_idx"] == 1
    warned = [line for line in printed.err.splitlines() if line.startswith("ripieno: warning: ")]
    assert len(warned) == 4 and any("init_args.posterior is now trainer.callbacks" in w for w in warned)
    own = {k: v for k, v in sampler.items() if k not in ("posterior", "evaluation")}
    built = LastLayerSampler(**own, posterior=sampler["posterior"],
                             evaluation=SamplerEvaluation(**sampler["evaluation"]))
    assert built.settings["gamma_grid"] == [0.1, 1.0] and built.settings["epochs"] == 2
