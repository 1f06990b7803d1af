"""TemperatureScaling: recovers a known temperature, works in a Trainer with a user's own module,
round-trips through checkpoints, agrees across ddp ranks, and feeds the posterior samplers."""

import json

import lightning as L
import pytest
import torch
from helpers.ddp import DestroyGlooAtExit
from torch import nn
from torch.utils.data import DataLoader

from ripieno.callbacks import LastLayerSampler, SamplerEvaluation, TemperatureScaling
from ripieno.callbacks.temperature_scaling import fit_temperature, member_mean_nll

pytestmark = pytest.mark.filterwarnings("ignore:You passed in a .val_dataloader. but have no",
                                        "ignore:.*predict_step returned.*")

T0 = 2.5


def _synthetic(n=6000, c=4, seed=0):
    """True logits z, labels drawn from softmax(z): outputs z * T0 are over-confident by T0."""
    g = torch.Generator().manual_seed(seed)
    z = 2.0 * torch.randn(n, c, generator=g)
    y = torch.multinomial(torch.softmax(z, -1), 1, generator=g)[:, 0]
    return z, y


def _nll(logits, y, t=1.0):
    """Member-mean NLL by hand: -mean log mean_m softmax(z_m / t)[y]."""
    p = torch.softmax(logits.double() / t, -1).mean(1)
    return float(-p[torch.arange(len(y)), y].log().mean())


# ---------------------------------------------------------------- the fit itself


@pytest.mark.parametrize("t0", [0.5, T0])
def test_fit_recovers_a_known_temperature(t0):
    z, y = _synthetic()
    fitted = fit_temperature((z * t0)[:, None], y)
    assert fitted == pytest.approx(t0, rel=0.04)
    assert member_mean_nll((z * t0)[:, None], y, fitted) <= member_mean_nll((z * t0)[:, None], y, 1.0)
    assert member_mean_nll((z * t0)[:, None], y, fitted) == pytest.approx(_nll((z * t0)[:, None], y, fitted))


def test_fit_is_the_minimum_of_the_member_mean_nll():
    z, y = _synthetic(n=500, seed=1)
    members = z[:, None] * torch.tensor([1.5, 3.0, 4.0])[None, :, None]  # (N, 3, C)
    fitted = fit_temperature(members, y)
    best = _nll(members, y, fitted)
    for t in (fitted * 0.98, fitted * 1.02):
        assert best <= _nll(members, y, t)
    assert best <= _nll(members, y, 1.0)


def test_binary_logits_and_probabilities_read_as_logits():
    scaling = TemperatureScaling(output_kind="binary_logits")
    scaling.load_state_dict({"temperature": 2.0})
    z = torch.tensor([[[1.0], [3.0]], [[-2.0], [0.5]]])  # (B, M, 1)
    p1 = torch.sigmoid(z[..., 0] / 2.0).mean(1)
    assert torch.allclose(scaling.calibrated_probabilities(z), torch.stack([1 - p1, p1], -1), atol=1e-6)
    logits = torch.randn(5, 3, 4)
    expected = torch.softmax(logits / 2.0, -1).mean(1)
    from_probs = scaling.calibrated_probabilities(torch.softmax(logits, -1), "probs")
    assert torch.allclose(from_probs, expected, atol=1e-5)
    with pytest.raises(ValueError, match="binary_logits"):
        scaling.calibrated_probabilities(z, "logits")


# ---------------------------------------------------------------- a user's own module


class Rows(torch.utils.data.Dataset):
    def __init__(self, x, y, z=None):
        self.x, self.y, self.z = x, y, z

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        row = {"x": self.x[i], "y": self.y[i]}
        if self.z is not None:
            row["z"] = self.z[i]
        return row


class UserModule(L.LightningModule):
    """Not a MemberModule: two heads as members, returning the protocol's dict keys."""

    member_output_kind = "logits"

    def __init__(self, scale=4.0, members=2, classes=3):
        super().__init__()
        torch.manual_seed(0)
        self.scale, self.members, self.classes = scale, members, classes
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, members * classes))

    def member_logits(self, x):
        return self.scale * self.net(x).reshape(len(x), self.members, self.classes)

    def training_step(self, batch, batch_idx):
        logits = self.member_logits(batch["x"])
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch["y"].repeat_interleave(self.members))

    def validation_step(self, batch, batch_idx):
        return {"member_outputs": self.member_logits(batch["x"]), "target": batch["y"]}

    def test_step(self, batch, batch_idx):
        return {"member_outputs": self.member_logits(batch["x"]), "target": batch["y"]}

    def predict_step(self, batch, batch_idx):
        return {"member_outputs": self.member_logits(batch["x"])}

    def forward(self, x):
        return self.member_logits(x).mean(1)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


class FixedLogits(L.LightningModule):
    """Outputs the rows' own logits times T0 (nothing to train): a validate-only module."""

    member_output_kind = "logits"

    def validation_step(self, batch, batch_idx):
        return {"member_outputs": (batch["z"] * T0)[:, None], "target": batch["y"]}


def _data(n=240, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    flip = torch.rand(n, generator=g) < 0.25  # label noise: an over-confident net is miscalibrated
    y = torch.where(flip, torch.randint(0, 3, (n,), generator=g), y)
    return Rows(x, y)


def _loaders():
    rows = _data()
    parts = [torch.utils.data.Subset(rows, range(a, b)) for a, b in ((0, 120), (120, 180), (180, 240))]
    return [DataLoader(p, batch_size=32, shuffle=i == 0) for i, p in enumerate(parts)]


def _trainer(tmp_path, callbacks, **kwargs):
    kwargs = {"max_epochs": 6, "logger": False, "enable_progress_bar": False, "enable_model_summary": False,
              "enable_checkpointing": False, "default_root_dir": tmp_path, **kwargs}
    return L.Trainer(callbacks=callbacks, **kwargs)


def _stack(loader, module):
    with torch.no_grad():
        logits = torch.cat([module.member_logits(b["x"]) for b in loader])
    return logits, torch.cat([b["y"] for b in loader])


def test_trainer_with_a_user_module_fits_tests_and_predicts(tmp_path):
    train, val, test = _loaders()
    model, scaling = UserModule(), TemperatureScaling()
    trainer = _trainer(tmp_path, [scaling])
    trainer.fit(model, train, val)
    model.eval()
    val_logits, val_y = _stack(val, model)
    # The last validation epoch's outputs, the member-mean NLL, one deterministic search.
    assert scaling.temperature == pytest.approx(fit_temperature(val_logits, val_y), rel=1e-9)
    assert scaling.nll_before == pytest.approx(_nll(val_logits, val_y), rel=1e-6)
    assert scaling.nll_after == pytest.approx(_nll(val_logits, val_y, scaling.temperature), rel=1e-6)
    assert scaling.nll_after <= scaling.nll_before
    assert trainer.callback_metrics["calibrated/val/temperature"] == pytest.approx(scaling.temperature)

    result = trainer.test(model, test, verbose=False)[0]
    test_logits, test_y = _stack(test, model)
    t = scaling.temperature
    assert result["calibrated/test/temperature"] == pytest.approx(t)
    assert result["calibrated/test/nll"] == pytest.approx(_nll(test_logits, test_y, t), rel=1e-5)
    p = torch.softmax(test_logits / t, -1).mean(1)
    brier = float(((p - nn.functional.one_hot(test_y, 3)) ** 2).sum(1).mean())
    assert result["calibrated/test/brier"] == pytest.approx(brier, rel=1e-5)
    assert 0.0 <= result["calibrated/test/ece"] <= 1.0
    assert (tmp_path / "reliability_calibrated.png").is_file()  # no logger: under default_root_dir

    predictions = trainer.predict(model, test)
    out = torch.cat([b["calibrated_prediction"] for b in predictions])
    assert torch.allclose(out, p, atol=1e-6)
    # The module's own outputs are untouched.
    assert torch.equal(torch.cat([b["member_outputs"] for b in predictions]), test_logits)


def test_validate_recovers_a_known_temperature_and_state_round_trips(tmp_path):
    z, y = _synthetic(n=4000)
    rows = Rows(torch.zeros(len(y), 1), y, z)
    scaling = TemperatureScaling()
    _trainer(tmp_path, [scaling]).validate(FixedLogits(), DataLoader(rows, batch_size=500), verbose=False)
    assert scaling.temperature == pytest.approx(T0, rel=0.04)
    assert scaling.nll_after < scaling.nll_before
    restored = TemperatureScaling()
    restored.load_state_dict(scaling.state_dict())
    assert restored.temperature == scaling.temperature and restored.nll_after == scaling.nll_after


def test_checkpoint_carries_the_temperature_to_a_new_trainer(tmp_path):
    train, val, test = _loaders()
    model, scaling = UserModule(), TemperatureScaling()
    trainer = _trainer(tmp_path, [scaling], max_epochs=2)
    trainer.fit(model, train, val)
    path = tmp_path / "fitted.ckpt"
    trainer.save_checkpoint(path)
    fresh = TemperatureScaling()
    result = _trainer(tmp_path, [fresh]).test(UserModule(), test, ckpt_path=str(path), verbose=False,
                                              weights_only=True)[0]
    assert fresh.temperature == scaling.temperature
    assert result["calibrated/test/temperature"] == pytest.approx(scaling.temperature)


def test_member_module_outputs_and_predictions(tmp_path):
    """A ripieno module: member logits on validation, member probabilities in predict."""
    from ripieno.framework.methods.member_module import MemberModule

    class Members(MemberModule):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters()
            self.hparams.lr = 0.05
            self.net = nn.Linear(4, 6)
            self.init_members("logits", 3)

        def forward_members(self, batch):
            return 4.0 * self.net(batch["x"]).reshape(-1, 2, 3)

    train, val, test = _loaders()
    model, scaling = Members(), TemperatureScaling()
    trainer = _trainer(tmp_path, [scaling], max_epochs=2)
    trainer.fit(model, train, val)
    result = trainer.test(model, test, verbose=False)[0]
    assert {"test/brier", "calibrated/test/brier", "calibrated/test/nll"} <= set(result)
    model.eval()
    with torch.no_grad():
        logits = torch.cat([model.forward_members(b) for b in test])
    out = torch.cat([b["calibrated_prediction"] for b in trainer.predict(model, test)])
    assert torch.allclose(out, torch.softmax(logits / scaling.temperature, -1).mean(1), atol=1e-5)


# ---------------------------------------------------------------- clear errors


class NoTarget(UserModule):
    def validation_step(self, batch, batch_idx):
        return self.member_logits(batch["x"])


class Regression(UserModule):
    member_output_kind = "regression"


class Unlabelled(UserModule):
    member_output_kind = None


@pytest.mark.filterwarnings("ignore:You defined a .validation_step. but have no")
def test_errors_name_the_fix(tmp_path):
    train, val, test = _loaders()
    with pytest.raises(ValueError, match="'member_outputs'.*from validation_step"):
        _trainer(tmp_path, [TemperatureScaling()], max_epochs=1).fit(NoTarget(), train, val)
    with pytest.raises(ValueError, match="regression outputs"):
        _trainer(tmp_path, [TemperatureScaling()], max_epochs=1).fit(Regression(), train, val)
    with pytest.raises(ValueError, match="output_kind='logits'"):
        _trainer(tmp_path, [TemperatureScaling()], max_epochs=1).fit(Unlabelled(), train, val)
    with pytest.raises(RuntimeError, match="no validation rows"):
        _trainer(tmp_path, [TemperatureScaling()], max_epochs=1).fit(UserModule(), train)
    with pytest.raises(RuntimeError, match="no fitted temperature"):
        _trainer(tmp_path, [TemperatureScaling()]).test(UserModule(), test, verbose=False)
    with pytest.raises(ValueError, match="bounds"):
        TemperatureScaling(bounds=(2.0, 1.0))
    with pytest.raises(ValueError, match="Unknown output_kind"):
        TemperatureScaling(output_kind="regression")


# ---------------------------------------------------------------- in front of the samplers


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        return nn.functional.cross_entropy(self(batch["x"]), batch["y"])

    def validation_step(self, batch, batch_idx):
        return {"member_outputs": self(batch["x"])[:, None], "target": batch["y"]}

    def test_step(self, batch, batch_idx):
        return None

    def predict_step(self, batch, batch_idx):
        return {"logits": self(batch["x"])}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class Data(L.LightningDataModule):
    def __init__(self):
        super().__init__()
        self.train, self.val, self.test = _loaders()

    def train_dataloader(self):
        return self.train

    def val_dataloader(self):
        return self.val

    def test_dataloader(self):
        return self.test

    def predict_dataloader(self):
        return self.test


def _samples(tmp_path, model, data, sampler, *extra):
    out = _trainer(tmp_path, [*extra, sampler]).predict(model, datamodule=data)
    return torch.cat([b["posterior_samples"] for b in out])


def test_samplers_divide_their_logits_by_the_temperature(tmp_path):
    model, data = Classifier(), Data()
    _trainer(tmp_path, [], max_epochs=2).fit(model, datamodule=data)
    settings = {"n_samples": 4, "max_iters": 30, "seed": 0}
    plain = _samples(tmp_path, model, data, LastLayerSampler(**settings))
    assert torch.allclose(_samples(tmp_path, model, data, LastLayerSampler(**settings,
                                                                           evaluation=SamplerEvaluation(temperature=2.0))),
                          plain / 2.0, atol=1e-5)
    scaling = TemperatureScaling(output_kind="logits")
    scaling.load_state_dict({"temperature": 1.7})
    assert torch.allclose(_samples(tmp_path, model, data, LastLayerSampler(**settings,
                                                                           evaluation=SamplerEvaluation(temperature=scaling))),
                          plain / 1.7, atol=1e-5)
    by_callback = LastLayerSampler(**settings, evaluation=SamplerEvaluation(temperature="callback"))
    by_name = _samples(tmp_path, model, data, by_callback, scaling)
    assert torch.allclose(by_name, plain / 1.7, atol=1e-5)

    # Test metrics score softmax(z / T) of the samples.
    sampler = LastLayerSampler(**settings, evaluation=SamplerEvaluation(temperature=2.0))
    result = _trainer(tmp_path, [sampler]).test(model, datamodule=data, verbose=False)[0]
    y = torch.cat([b["y"] for b in data.test])
    assert result["uq/test/nll"] == pytest.approx(_nll(plain / 2.0, y), rel=1e-4)


def test_sampler_temperature_errors(tmp_path):
    with pytest.raises(ValueError, match="> 0"):
        LastLayerSampler(evaluation=SamplerEvaluation(temperature=0.0))
    with pytest.raises(ValueError, match="'callback'"):
        LastLayerSampler(evaluation=SamplerEvaluation(temperature="fitted"))
    unfitted = LastLayerSampler(evaluation=SamplerEvaluation(temperature=TemperatureScaling()))
    with pytest.raises(RuntimeError, match="has not fitted a temperature"):
        unfitted.current_temperature()
    regression = LastLayerSampler(evaluation=SamplerEvaluation(temperature=2.0))
    regression.likelihood = "regression"
    with pytest.raises(ValueError, match="regression likelihood"):
        regression.tempered(torch.zeros(2, 3, 1))
    with pytest.raises(ValueError, match="exactly one TemperatureScaling"):
        trainer = _trainer(tmp_path, [LastLayerSampler(evaluation=SamplerEvaluation(temperature="callback"))])
        trainer.predict(Classifier(), datamodule=Data())


# ---------------------------------------------------------------- ddp


class RecordTemperature(L.Callback):
    def __init__(self, folder):
        self.folder = str(folder)

    def on_validation_end(self, trainer, pl_module):
        scaling = next(c for c in trainer.callbacks if isinstance(c, TemperatureScaling))
        with open(f"{self.folder}/rank{trainer.global_rank}.json", "w") as f:
            json.dump(scaling.temperature, f)


@pytest.mark.slow
def test_ddp_ranks_fit_one_temperature_on_all_rows(tmp_path):
    z, y = _synthetic(n=400, seed=2)
    rows = Rows(torch.zeros(len(y), 1), y, z)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[TemperatureScaling(), RecordTemperature(tmp_path), DestroyGlooAtExit()])
    result = trainer.validate(FixedLogits(), DataLoader(rows, batch_size=40), verbose=False)[0]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    expected = fit_temperature((z * T0)[:, None], y)
    assert ranks[0] == ranks[1]
    assert ranks[0] == pytest.approx(expected, rel=1e-6)
    assert result["calibrated/val/temperature"] == pytest.approx(expected, rel=1e-6)
