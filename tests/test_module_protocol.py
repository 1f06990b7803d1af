"""The module protocol the callbacks rely on: declared in ``ripieno.framework.members``, checked in ``setup``.

Oracles: a user's module that lacks a capability a callback needs stops at ``setup``, before any training
step, with one line naming the callback, the capability and the module's class; every shipped module
satisfies what the shipped recipes pair it with (the callbacks' own ``setup`` checks, and ``isinstance``
against the runtime-checkable protocols).
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader

from ripieno.callbacks import (
    DiversityMonitor,
    ElasticAveraging,
    GeoReg,
    LastLayerSampler,
    ReplicaCoupling,
    RoutingResampler,
    SamplerEvaluation,
    TemperatureScaling,
)
from ripieno.callbacks.posterior_predictive import PosteriorPredictiveCallback
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.mcover.copies import PermutationCopiesMixin
from ripieno.framework.members import (
    CollapseParametersModel,
    CopyParametersModel,
    LossTermsModel,
    MemberModel,
    MissingCapabilityError,
    OutputAffineModel,
    PermutationBankModel,
    PredictionFrameModel,
    TaskModel,
    require_capability,
)

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


# ------------------------------------------------------------------ a user's modules
class Plain(L.LightningModule):
    """A user's classifier with none of the capabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 3)
        self.trained = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch, batch_idx):
        self.trained = True
        return nn.functional.cross_entropy(self(batch[0]), batch[1])

    def validation_step(self, batch, batch_idx):
        return {"member_outputs": self(batch[0])[:, None], "target": batch[1]}

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class WithCopies(Plain):
    """Copy-stacked parameters, but no loss-term extension point and no collapse setter."""

    def copy_parameters(self) -> list[torch.Tensor]:
        return [self.net.weight]


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 4, generator=g)
    return DataLoader(list(zip(x, (x[:, 0] > 0).long(), strict=True)), batch_size=8)


CASES = [
    (lambda: DiversityMonitor(), Plain, "MemberModel"),
    (lambda: TemperatureScaling(), Plain, "MemberModel"),
    (lambda: GeoReg(), Plain, "LossTermsModel"),
    (lambda: ReplicaCoupling(), Plain, "CopyParametersModel"),
    (lambda: ReplicaCoupling(), WithCopies, "LossTermsModel"),
    (lambda: ElasticAveraging(), Plain, "CopyParametersModel"),
    (lambda: ElasticAveraging(), WithCopies, "CollapseParametersModel"),
    (lambda: RoutingResampler(every_n_steps=1), Plain, "PermutationBankModel"),
]


@pytest.mark.parametrize(("make_callback", "module_class", "capability"), CASES,
                         ids=[f"{case[2]}-{case[1].__name__}" for case in CASES])
def test_a_module_without_a_needed_capability_stops_at_setup(tmp_path, make_callback, module_class,
                                                             capability):
    callback, module = make_callback(), module_class()
    trainer = L.Trainer(fast_dev_run=True, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, callbacks=[callback])
    with pytest.raises(MissingCapabilityError) as caught:
        trainer.fit(module, _loader(), _loader())
    message = str(caught.value)
    assert not module.trained  # stopped before the first training step
    assert "\n" not in message
    assert message.startswith(f"{type(callback).__name__} needs the {capability} capability")
    assert f"which {module_class.__name__} lacks" in message
    assert isinstance(caught.value, RipienoInputError) and isinstance(caught.value, TypeError)


def test_the_message_names_the_missing_members_and_the_fix():
    with pytest.raises(MissingCapabilityError, match=r"^RoutingResampler needs the PermutationBankModel"
                       r" capability \(draw_permutation_bank, permutation_bank\), which Plain lacks"
                       r" \(missing: draw_permutation_bank, permutation_bank\); .*PermutationCopiesMixin"):
        RoutingResampler(every_n_steps=1).setup(L.Trainer(logger=False), Plain(), "fit")


def test_a_capability_is_found_on_the_first_submodule_that_has_it():
    class Outer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = WithCopies()

    outer = Outer()
    assert require_capability("X", outer, CopyParametersModel, "fix", within=outer.modules()) is outer.inner
    with pytest.raises(MissingCapabilityError, match="X needs the CopyParametersModel capability"):
        require_capability("X", outer, CopyParametersModel, "fix")


# --------------------------------------------------------------- optional capabilities
def test_optional_capabilities_fall_back_as_documented(caplog):
    sampler = LastLayerSampler()
    plain = Plain()
    assert not isinstance(plain, TaskModel | OutputAffineModel | PredictionFrameModel)
    with caplog.at_level(logging.INFO, logger="ripieno"):
        assert sampler.resolve_likelihood(plain) == "classification"
    assert "has no task attribute" in caplog.text  # said, not silent
    assert PosteriorPredictiveCallback.output_affine(plain) == (1.0, 0.0)

    plain.task = "regression"
    plain.output_affine = (2.0, -1.0)
    assert isinstance(plain, TaskModel) and isinstance(plain, OutputAffineModel)
    assert sampler.resolve_likelihood(plain) == "regression"
    binary = LastLayerSampler(evaluation=SamplerEvaluation(likelihood="binary"))
    assert binary.resolve_likelihood(plain) == "binary"  # the setting wins
    assert PosteriorPredictiveCallback.output_affine(plain) == (2.0, -1.0)


# ------------------------------------------------------------------- shipped modules
def _tiny_models() -> dict[str, L.LightningModule]:
    from ripieno.framework import (
        FusionClassifier,
        ImageClassifier,
        MCoverClassifier,
        TabularEnsembleModule,
        TabularMLP,
    )
    from ripieno.framework.mcover.perceptron_module import BinaryPerceptronSA
    from ripieno.framework.specs.image import ImageSpec
    from ripieno.framework.specs.layer_features import LayerFeatureSpec
    from ripieno.framework.specs.tabular import TabularSpec
    from ripieno.framework.specs.teacher_student import TeacherStudentSpec

    image = ImageSpec(n_classes=3, image_shape=(1, 8, 8), class_names=["a", "b", "c"], n_train=8, n_val=4,
                      n_test=4, dataset="tiny")
    table = TabularSpec(task="binary", n_num_features=3, n_classes=2, class_names=["no", "yes"])
    layers = LayerFeatureSpec(n_classes=2, class_names=["a", "b"], n_layers=2, d_model=4,
                              selected_layers=[0, 1], selection="all", pooling="mean", backbone_dir="none")
    teacher = TeacherStudentSpec(n_inputs=6, n_train=4, n_val=2, n_test=2, inputs="binary", label_noise=0.0,
                                 teacher=[1, -1, 1, -1, 1, -1])
    return {
        "TabularEnsembleModule": TabularEnsembleModule(table, k=2, d_block=8, n_blocks=1),
        "TabularMLP": TabularMLP(table, hidden=[8]),
        "ImageClassifier": ImageClassifier(image, width=4),
        "MCoverClassifier": MCoverClassifier(image, m=3, hidden=[4], bank_size=2),
        "FusionClassifier": FusionClassifier(layers, d_proj=4),
        "BinaryPerceptronSA": BinaryPerceptronSA(teacher, m=3, n_blocks=2, bank_size=2),
    }


def _recipe_pairs() -> list[tuple[str, str, str, dict]]:
    """``(recipe, model class name, callback class path, callback init_args)`` for every ripieno callback."""
    pairs = []
    for path in sorted(RECIPES.rglob("*.yaml")):
        config = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        model = (config.get("model") or {}).get("class_path")
        for callback in (config.get("trainer") or {}).get("callbacks") or []:
            if model and callback["class_path"].startswith("ripieno.callbacks"):
                pairs.append((str(path.relative_to(RECIPES)), model.rsplit(".", 1)[1], callback["class_path"],
                              callback.get("init_args") or {}))
    return pairs


PAIRS = _recipe_pairs()
#: the callbacks whose ``setup`` requires a capability
RIPIENO_CHECKED = (DiversityMonitor, TemperatureScaling, GeoReg, ReplicaCoupling, ElasticAveraging,
                   RoutingResampler)


def test_the_recipes_pair_modules_with_callbacks_that_need_capabilities():
    kinds = {(model, path.rsplit(".", 1)[1]) for _, model, path, _ in PAIRS}
    assert ("MCoverClassifier", "RoutingResampler") in kinds
    assert ("BinaryPerceptronSA", "RoutingResampler") in kinds
    assert ("MCoverClassifier", "ElasticAveraging") in kinds and ("FusionClassifier", "GeoReg") in kinds
    assert ("TabularEnsembleModule", "DiversityMonitor") in kinds


def test_every_shipped_module_satisfies_what_its_recipes_pair_it_with(tmp_path):
    models = _tiny_models()
    checked = 0
    for recipe, model_name, class_path, init_args in PAIRS:
        module_path, name = class_path.rsplit(".", 1)
        callback = getattr(importlib.import_module(module_path), name)(**init_args)
        if model_name not in models:  # TextClassifier loads a backbone: its samplers read the class's task
            assert model_name == "TextClassifier" and not isinstance(callback, RIPIENO_CHECKED), recipe
            assert isinstance(getattr(importlib.import_module("ripieno.framework"), model_name).task, str)
            continue
        model = models[model_name]
        trainer = L.Trainer(logger=False, default_root_dir=tmp_path, callbacks=[callback])
        callback.setup(trainer, model, "fit")  # the callback's own check, as in a run
        callback.teardown(trainer, model, "fit")
        if isinstance(callback, PosteriorPredictiveCallback) and callback.likelihood_setting == "auto":
            assert isinstance(model, TaskModel), recipe
        checked += 1
    assert checked > 30


def test_the_shipped_modules_declare_their_capabilities():
    models = _tiny_models()
    for name, model in models.items():
        assert isinstance(model, MemberModel) and isinstance(model, LossTermsModel), name
    for name in ("TabularEnsembleModule", "TabularMLP"):
        assert isinstance(models[name], PredictionFrameModel), name
    assert isinstance(models["TabularEnsembleModule"], OutputAffineModel)
    for name in ("ImageClassifier", "MCoverClassifier", "FusionClassifier", "TabularMLP"):
        assert isinstance(models[name], TaskModel), name
    mcover, perceptron = models["MCoverClassifier"], models["BinaryPerceptronSA"]
    assert isinstance(mcover.net, CopyParametersModel) and isinstance(mcover, CollapseParametersModel)
    for routed in (mcover, perceptron):  # one mixin gives both the bank and the chosen copy
        assert isinstance(routed, PermutationCopiesMixin) and isinstance(routed, PermutationBankModel)
