"""PostHocCalibration: its fit is the calibrator's fit on the last validation epoch's member outputs,
its test metrics are the calibrated predictive's, its state survives a checkpoint, predict adds the
calibrated prediction, bad settings stop the run before training, and ddp ranks hold one state."""

import json

import lightning as L
import pytest
import torch
from helpers.ddp import DestroyGlooAtExit
from torch import nn
from torch.utils.data import DataLoader
from torchmetrics.functional.classification import multiclass_calibration_error

from ripieno.callbacks import PostHocCalibration, TemperatureScaling
from ripieno.framework.uq.calibrators import make_calibrator

pytestmark = pytest.mark.filterwarnings("ignore:You passed in a .val_dataloader. but have no",
                                        "ignore:You defined a .validation_step. but have no")
TINY = torch.finfo(torch.float32).tiny  # where PredictiveNLL floors a probability of 0
METHODS = [("vector", {}), ("vector", {"l2": 0.1}), ("isotonic", {})]


def _rows(n=240, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    flip = torch.rand(n, generator=g) < 0.25  # label noise: an over-confident net is miscalibrated
    y = torch.where(flip, torch.randint(0, 3, (n,), generator=g), y)
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def _loaders():
    rows = _rows()
    parts = ((0, 120), (120, 180), (180, 240))
    return [DataLoader(rows[a:b], batch_size=32, shuffle=i == 0) for i, (a, b) in enumerate(parts)]


class Members(L.LightningModule):
    """A user's module, not a MemberModule: two heads as members, returning the protocol's dict keys."""

    member_output_kind = "logits"

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 6))

    def member_logits(self, x):
        return 4.0 * self.net(x).reshape(len(x), 2, 3)  # over-confident

    def training_step(self, batch, batch_idx):
        logits = self.member_logits(batch["x"])
        return nn.functional.cross_entropy(logits.flatten(0, 1), batch["y"].repeat_interleave(2))

    def validation_step(self, batch, batch_idx):
        return {"member_outputs": self.member_logits(batch["x"]), "target": batch["y"]}

    def test_step(self, batch, batch_idx):
        return self.validation_step(batch, batch_idx)

    def predict_step(self, batch, batch_idx):
        return {"member_outputs": self.member_logits(batch["x"])}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


class Regression(Members):
    member_output_kind = "regression"


class Stored(L.LightningModule):
    """Returns each row's stored member outputs ``z`` (nothing to train): validate/test/predict only."""

    def __init__(self, kind="logits"):
        super().__init__()
        self.member_output_kind = kind

    def validation_step(self, batch, batch_idx):
        return {"member_outputs": batch["z"], "target": batch["y"]}

    def predict_step(self, batch, batch_idx):  # as MemberModule.predict_step: member probabilities only
        return {"member_predictions": torch.softmax(batch["z"], -1)}


def _stored(n=300, members=2, classes=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    z = 3.0 * torch.randn(n, members, classes, generator=g)
    y = torch.multinomial(torch.softmax(z.mean(1) / 3.0, -1), 1, generator=g)[:, 0]  # z is over-confident
    return z, y


def _trainer(tmp_path, callbacks, **kwargs):
    kwargs = {"max_epochs": 3, "logger": False, "enable_progress_bar": False, "enable_model_summary": False,
              "enable_checkpointing": False, "default_root_dir": tmp_path, **kwargs}
    return L.Trainer(callbacks=callbacks, **kwargs)


def _stack(loader, module):
    module.eval()
    with torch.no_grad():
        logits = torch.cat([module.member_logits(b["x"]) for b in loader])
    return logits, torch.cat([b["y"] for b in loader])


def _scores(p, y):
    """NLL (floored as PredictiveNLL floors it), Brier and l1 ECE of a predictive ``(n, C)``, by hand."""
    p = p.double()
    nll = float(-p[torch.arange(len(y)), y].clamp_min(TINY).log().mean())
    brier = float(((p - nn.functional.one_hot(y, p.shape[1])) ** 2).sum(1).mean())
    ece = float(multiclass_calibration_error(p.float(), y, p.shape[1], n_bins=15, norm="l1"))
    return {"nll": nll, "brier": brier, "ece": ece}


# ---------------------------------------------------------------- in a Trainer


@pytest.mark.parametrize(("method", "settings"), METHODS)
def test_fit_test_and_predict_are_the_calibrators_on_the_same_rows(tmp_path, method, settings):
    train, val, test = _loaders()
    model, calibration = Members(), PostHocCalibration(method, **settings)
    trainer = _trainer(tmp_path, [calibration])
    trainer.fit(model, train, val)
    # The fit: the calibrator's own, on the last validation epoch's member logits.
    val_logits, val_y = _stack(val, model)
    expected = make_calibrator(method, input_kind="logits", **settings).fit(val_logits, val_y)
    assert calibration.calibrator.state_dict() == expected.state_dict()
    uncalibrated = val_logits.double().softmax(-1).mean(1)
    assert calibration.nll_before == pytest.approx(_scores(uncalibrated, val_y)["nll"])
    assert calibration.nll_after == pytest.approx(_scores(expected.predict_proba(val_logits), val_y)["nll"])
    assert calibration.nll_after < calibration.nll_before
    assert trainer.callback_metrics["calibrated/val/nll"] == pytest.approx(calibration.nll_after, rel=1e-6)

    # Test: the scores of the calibrated predictive on the test rows.
    result = trainer.test(model, test, verbose=False)[0]
    test_logits, test_y = _stack(test, model)
    p = expected.predict_proba(test_logits)
    assert {k: result[f"calibrated/test/{k}"] for k in ("nll", "brier", "ece")} == pytest.approx(
        _scores(p, test_y), rel=1e-5, abs=1e-6)
    assert (tmp_path / "reliability_calibrated.png").is_file()

    # Predict: calibrated_prediction beside the module's untouched outputs.
    out = trainer.predict(model, test)
    assert torch.allclose(torch.cat([b["calibrated_prediction"] for b in out]), p.float(), atol=1e-6)
    assert torch.equal(torch.cat([b["member_outputs"] for b in out]), test_logits)


@pytest.mark.parametrize("method", ["vector", "isotonic"])
def test_the_state_round_trips_through_a_checkpoint(tmp_path, method):
    train, val, test = _loaders()
    model, calibration = Members(), PostHocCalibration(method)
    trainer = _trainer(tmp_path, [calibration], max_epochs=1)
    trainer.fit(model, train, val)
    before = trainer.test(model, test, verbose=False)[0]
    path = tmp_path / "fitted.ckpt"
    trainer.save_checkpoint(path)
    fresh = PostHocCalibration(method)
    after = _trainer(tmp_path, [fresh]).test(Members(), test, ckpt_path=str(path), verbose=False,
                                             weights_only=True)[0]
    assert fresh.state_dict() == calibration.state_dict()
    assert json.loads(json.dumps(fresh.state_dict())) == fresh.state_dict()  # plain values only
    assert after == pytest.approx(before, rel=1e-6)


# ---------------------------------------------------------------- output kinds, unlabelled rows, predict


@pytest.mark.parametrize("method", ["vector", "isotonic"])
@pytest.mark.parametrize("kind", ["binary_logits", "probs"])
def test_validate_reads_binary_logits_and_probabilities_and_skips_unlabelled_rows(tmp_path, method, kind):
    z, y = _stored(classes=2)
    s = z[..., 1:] - z[..., :1]  # (n, M, 1): the binary logit of the same predictive
    outputs, inputs = ((s, torch.cat([torch.zeros_like(s), s], -1)) if kind == "binary_logits"
                       else (z.softmax(-1), z.softmax(-1)))
    target = torch.where(torch.arange(len(y)) % 7 == 0, -1, y)  # an OOD loader's -1: skipped
    rows = [{"z": outputs[i], "y": target[i]} for i in range(len(y))]
    calibration = PostHocCalibration(method)
    _trainer(tmp_path, [calibration]).validate(Stored(kind), DataLoader(rows, batch_size=64), verbose=False)
    labelled = target >= 0
    input_kind = "probs" if kind == "probs" else "logits"
    expected = make_calibrator(method, input_kind=input_kind).fit(inputs[labelled], y[labelled])
    assert calibration.calibrator.state_dict() == expected.state_dict()
    calibrated = calibration.calibrated_probabilities(outputs)
    assert torch.allclose(calibrated, expected.predict_proba(inputs).float(), atol=1e-6)


def test_predict_from_member_probabilities_needs_a_calibrator_that_reads_them(tmp_path):
    z, y = _stored()
    loader = DataLoader([{"z": z[i], "y": y[i]} for i in range(len(y))], batch_size=100)
    isotonic = PostHocCalibration("isotonic").fit(z, y)  # fit directly: output_kind "auto" reads logits
    # Isotonic maps the member-mean probabilities: from float32 probabilities, the prediction from logits.
    expected = make_calibrator("isotonic").fit(z, y).predict_proba(z)
    out = _trainer(tmp_path, [isotonic]).predict(Stored(), loader)
    assert torch.allclose(torch.cat([b["calibrated_prediction"] for b in out]), expected.float(), atol=1e-5)
    vector = PostHocCalibration("vector").fit(z, y)  # scales logits: probabilities cannot give them back
    with pytest.warns(UserWarning, match="cannot read probabilities; predict_step returned"):
        out = _trainer(tmp_path, [vector]).predict(Stored(), loader)
    assert "calibrated_prediction" not in out[0]
    with pytest.raises(ValueError, match="give the member logits"):
        vector.calibrated_probabilities(z.softmax(-1), "probs")


# ---------------------------------------------------------------- clear errors


@pytest.mark.parametrize(("settings", "match"), [
    ({"method": "temperature"}, "TemperatureScaling for one temperature"),
    ({"method": "platt"}, "method must be 'vector' or 'isotonic'"),
    ({"l2": -1.0}, "l2 must be a finite number >= 0"),
    ({"method": "isotonic", "l2": 0.1}, "leave l2 at 0, or use method='vector'"),
    ({"n_bins": 0}, "n_bins must be an integer >= 1"),
    ({"output_kind": "regression"}, "Unknown output_kind"),
])
def test_bad_settings_raise_one_line_errors(settings, match):
    with pytest.raises(ValueError, match=match) as error:
        PostHocCalibration(**settings)
    assert "\n" not in str(error.value)


def test_a_regression_module_or_a_shared_prefix_stops_the_run_before_training(tmp_path):
    train, val, test = _loaders()
    trainer = _trainer(tmp_path, [PostHocCalibration()])
    with pytest.raises(ValueError, match="PostHocCalibration calibrates classification.*regression outputs"):
        trainer.fit(Regression(), train, val)
    assert trainer.global_step == 0
    trainer = _trainer(tmp_path, [TemperatureScaling(), PostHocCalibration("isotonic")])
    with pytest.raises(ValueError, match="'calibrated'.*TemperatureScaling.*prefix='calibrated_isotonic'"):
        trainer.fit(Members(), train, val)
    assert trainer.global_step == 0
    with pytest.raises(RuntimeError, match="no fitted vector calibrator.*ckpt_path"):
        _trainer(tmp_path, [PostHocCalibration()]).test(Members(), test, verbose=False)
    with pytest.raises(ValueError, match=r"load it into PostHocCalibration\(method='vector'\)"):
        PostHocCalibration("isotonic").load_state_dict({"method": "vector", "calibrator": None})


# ---------------------------------------------------------------- ddp


class RecordState(L.Callback):
    def __init__(self, folder):
        self.folder = str(folder)

    def on_validation_end(self, trainer, pl_module):
        calibration = next(c for c in trainer.callbacks if isinstance(c, PostHocCalibration))
        with open(f"{self.folder}/rank{trainer.global_rank}.json", "w") as f:
            json.dump(calibration.state_dict(), f)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["vector", "isotonic"])
def test_ddp_ranks_hold_one_state_fitted_on_all_rows(tmp_path, method):
    z, y = _stored(n=400, seed=2)
    rows = [{"z": z[i], "y": y[i]} for i in range(len(y))]
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", logger=False,
                        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                        callbacks=[PostHocCalibration(method), RecordState(tmp_path), DestroyGlooAtExit()])
    result = trainer.validate(Stored(), DataLoader(rows, batch_size=40), verbose=False)[0]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1]
    loaded = PostHocCalibration(method)
    loaded.load_state_dict(ranks[0])
    expected = make_calibrator(method).fit(z, y)  # every row, in another order than the gathered rows
    assert torch.allclose(loaded.calibrator.predict_proba(z), expected.predict_proba(z), atol=1e-6)
    assert result["calibrated/val/nll"] == pytest.approx(ranks[0]["nll_after"], rel=1e-6)
