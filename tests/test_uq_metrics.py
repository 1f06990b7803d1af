"""UQ metrics against numpy/scipy/sklearn/torch oracles and exact identities."""

import math

import numpy as np
import pytest
import torch
from scipy.special import logsumexp, softmax
from scipy.stats import norm
from sklearn.metrics import roc_auc_score
from torchmetrics.functional.classification import multiclass_calibration_error

from ripieno.framework.metrics.reliability import reliability_diagram
from ripieno.framework.metrics.uq import (
    ExpectedCalibrationError,
    GaussianNLL,
    LogPointwisePredictiveDensity,
    PredictiveNLL,
    VarROC,
)


def _logits(b=40, s=5, c=4, seed=0, scale=2.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=scale, size=(b, s, c))
    target = rng.integers(0, c, size=b)
    return logits, target


def _t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


# ---------------------------------------------------------------- ECE


def test_ece_matches_torchmetrics_on_mean_probabilities():
    logits, target = _logits(b=60, s=4, c=3)
    probs = softmax(logits, axis=-1)
    expected = multiclass_calibration_error(_t(probs.mean(1)), _t(target, torch.long), num_classes=3,
                                            n_bins=15, norm="l1")
    from_probs = ExpectedCalibrationError(num_classes=3)
    from_logits = ExpectedCalibrationError(num_classes=3, input_kind="logits")
    for part in (slice(0, 25), slice(25, None)):
        from_probs.update(_t(probs[part]), _t(target[part], torch.long))
        from_logits.update(_t(logits[part]), _t(target[part], torch.long))
    assert from_probs.compute().item() == pytest.approx(expected.item(), abs=1e-6)
    assert from_logits.compute().item() == pytest.approx(expected.item(), abs=1e-6)


def test_ece_hand_computed_15_bins():
    # Top-label confidences 0.9, 0.9, 0.55, 0.35 (bins 13, 13, 8, 5); correct: 1, 0, 1, 0.
    probs = _t([[0.9, 0.1, 0.0], [0.9, 0.05, 0.05], [0.45, 0.55, 0.0], [0.35, 0.33, 0.32]])
    target = _t([0, 1, 1, 2], torch.long)
    expected = (2 * abs(0.5 - 0.9) + abs(1 - 0.55) + abs(0 - 0.35)) / 4
    metric = ExpectedCalibrationError(num_classes=3)
    metric.update(probs, target)  # (B, C): a single prediction
    assert metric.compute().item() == pytest.approx(expected, abs=1e-6)


# ---------------------------------------------------------------- NLL / LPPD classification


def test_predictive_nll_matches_numpy_and_inputs_agree():
    logits, target = _logits()
    probs = softmax(logits, axis=-1)  # float64
    expected = -np.mean(np.log(probs.mean(1)[np.arange(len(target)), target]))
    from_logits = PredictiveNLL("logits")
    from_probs = PredictiveNLL("probs")
    from_logits.update(_t(logits), _t(target, torch.long))
    from_probs.update(_t(probs), _t(target, torch.long))
    assert from_logits.compute().item() == pytest.approx(expected, rel=1e-5)
    assert from_probs.compute().item() == pytest.approx(expected, rel=1e-5)


def test_predictive_nll_single_prediction_is_cross_entropy():
    logits, target = _logits(s=1)
    metric = PredictiveNLL()
    metric.update(_t(logits[:, 0]), _t(target, torch.long))
    expected = torch.nn.functional.cross_entropy(_t(logits[:, 0], torch.float64), _t(target, torch.long))
    assert metric.compute().item() == pytest.approx(expected.item(), rel=1e-5)


def test_lppd_classification_is_minus_nll():
    logits, target = _logits(seed=3)
    lppd, nll = LogPointwisePredictiveDensity("classification"), PredictiveNLL()
    lppd.update(_t(logits), _t(target, torch.long))
    nll.update(_t(logits), _t(target, torch.long))
    assert lppd.compute().item() == pytest.approx(-nll.compute().item(), rel=1e-6)


# ---------------------------------------------------------------- regression


@pytest.mark.parametrize("per_point", [False, True])
def test_lppd_regression_matches_scipy(per_point):
    rng = np.random.default_rng(4)
    b, s = 30, 6
    mu = rng.normal(size=(b, s))
    y = rng.normal(size=b)
    sigma2 = rng.uniform(0.2, 2.0, size=b) if per_point else 0.7
    scale = np.sqrt(np.broadcast_to(sigma2, (b,)))[:, None]
    expected = np.mean(logsumexp(norm.logpdf(y[:, None], loc=mu, scale=scale), axis=1) - np.log(s))
    metric = LogPointwisePredictiveDensity("regression")
    noise = _t(sigma2) if per_point else sigma2
    metric.update(_t(mu), _t(y), noise_var=noise)
    assert metric.compute().item() == pytest.approx(expected, rel=1e-5)


def test_gaussian_nll_matches_formula_and_torch_full_loss():
    rng = np.random.default_rng(5)
    mean, var, y = rng.normal(size=25), rng.uniform(0.1, 3.0, size=25), rng.normal(size=25)
    expected = np.mean(0.5 * np.log(2 * np.pi * var) + (y - mean) ** 2 / (2 * var))
    torch_loss = torch.nn.GaussianNLLLoss(full=True)(_t(mean), _t(y), _t(var)).item()
    metric = GaussianNLL()
    metric.update(_t(mean), _t(y), _t(var))
    assert metric.compute().item() == pytest.approx(expected, rel=1e-5)
    assert metric.compute().item() == pytest.approx(torch_loss, rel=1e-5)


def test_gaussian_nll_samples_equal_explicit_moments():
    rng = np.random.default_rng(6)
    mu, y, noise = rng.normal(size=(20, 7)), rng.normal(size=20), rng.uniform(0.1, 1.0, size=20)
    samples, explicit = GaussianNLL(), GaussianNLL()
    samples.update(_t(mu), _t(y), _t(noise))
    explicit.update(_t(mu.mean(1)), _t(y), _t(mu.var(1) + noise))  # numpy var: ddof=0
    assert samples.compute().item() == pytest.approx(explicit.compute().item(), rel=1e-5)


def test_regression_lppd_with_one_sample_is_minus_gaussian_nll():
    rng = np.random.default_rng(7)
    mu, y = rng.normal(size=(15, 2)), rng.normal(size=(15, 2))  # multi-output (B, D)
    lppd, nll = LogPointwisePredictiveDensity("regression"), GaussianNLL()
    lppd.update(_t(mu), _t(y), noise_var=0.3)
    nll.update(_t(mu), _t(y), 0.3)
    assert lppd.compute().item() == pytest.approx(-nll.compute().item(), rel=1e-6)


# ---------------------------------------------------------------- VarROC


def _varroc_data(seed=8, b=50, s=6, c=4):
    logits, target = _logits(b=b, s=s, c=c, seed=seed, scale=1.5)
    probs = softmax(logits, axis=-1).astype(np.float32).astype(np.float64)
    predicted = probs.mean(1).argmax(-1)
    score = probs[np.arange(b), :, predicted].var(1)  # ddof=0
    correct = predicted == target
    assert 5 < correct.sum() < b - 5  # both kinds of ID point are present
    return logits, target, score, correct


def test_varroc_id_matches_sklearn():
    logits, target, score, correct = _varroc_data()
    metric = VarROC("id")
    metric.update(_t(logits[:20]), _t(target[:20], torch.long))
    metric.update(_t(logits[20:]), _t(target[20:], torch.long))
    expected = roc_auc_score(~correct, score)  # misclassified are positives
    assert metric.compute().item() == pytest.approx(expected, abs=1e-6)


def test_varroc_sum_score_matches_sklearn():
    logits, target, _, correct = _varroc_data()
    probs = softmax(logits, axis=-1).astype(np.float32).astype(np.float64)
    metric = VarROC("id", input_kind="probs", score="sum")
    metric.update(_t(probs), _t(target, torch.long))
    assert metric.compute().item() == pytest.approx(roc_auc_score(~correct, probs.var(1).sum(-1)), abs=1e-6)


def test_varroc_ood_matches_sklearn_and_ignores_misclassified():
    logits, target, score, correct = _varroc_data()
    ood_logits, _, ood_score, _ = _varroc_data(seed=9, b=30)
    labels = np.r_[np.zeros(correct.sum()), np.ones(len(ood_score))]
    expected = roc_auc_score(labels, np.r_[score[correct], ood_score])

    def run(id_logits):
        metric = VarROC("ood")
        metric.update(_t(id_logits), _t(target, torch.long))  # is_ood=False
        metric.update(_t(ood_logits), is_ood=True)  # no target needed
        return metric.compute().item()

    assert run(logits) == pytest.approx(expected, abs=1e-6)
    # Make one misclassified ID point maximally uncertain: the OOD result must not move.
    changed = logits.copy()
    wrong = int(np.flatnonzero(~correct)[0])
    k = (target[wrong] + 1) % changed.shape[2]
    changed[wrong] = 0.0
    changed[wrong, ::2, k] = 8.0  # half the samples sure of class k, half uniform
    assert torch.softmax(_t(changed[wrong]), -1).mean(0).argmax().item() != target[wrong]
    assert run(changed) == pytest.approx(expected, abs=1e-6)


def test_varroc_mixed_batch_with_mask_equals_separate_batches():
    logits, target, _, _ = _varroc_data()
    ood_logits, _, _, _ = _varroc_data(seed=9, b=30)
    mixed, separate = VarROC("ood"), VarROC("ood")
    both = np.concatenate([logits, ood_logits])
    mask = torch.arange(len(both)) >= len(logits)
    full_target = torch.cat([_t(target, torch.long), torch.full((len(ood_logits),), -1)])
    mixed.update(_t(both), full_target, is_ood=mask)
    separate.update(_t(logits), _t(target, torch.long))
    separate.update(_t(ood_logits), is_ood=True)
    assert mixed.compute().item() == pytest.approx(separate.compute().item(), abs=1e-7)


def test_varroc_map_prediction_scores_the_networks_class():
    """prediction='map': the MAP argmax picks the correct/wrong split and the scored class."""
    logits, target, _, _ = _varroc_data()
    ood_logits, _, _, _ = _varroc_data(seed=9, b=30)
    map_logits = logits[:, 0] + np.random.default_rng(3).normal(0.0, 2.0, logits[:, 0].shape)
    ood_map = ood_logits[:, 0]
    probs = softmax(logits, axis=-1).astype(np.float32).astype(np.float64)
    ood_probs = softmax(ood_logits, axis=-1).astype(np.float32).astype(np.float64)
    predicted, ood_predicted = map_logits.argmax(-1), ood_map.argmax(-1)
    assert (predicted != probs.mean(1).argmax(-1)).sum() >= 5  # the two choices really differ
    score = probs[np.arange(len(predicted)), :, predicted].var(1)
    ood_score = ood_probs[np.arange(len(ood_predicted)), :, ood_predicted].var(1)
    correct = predicted == target
    for mode, expected in [
        ("id", roc_auc_score(~correct, score)),
        ("ood", roc_auc_score(np.r_[np.zeros(correct.sum()), np.ones(30)], np.r_[score[correct], ood_score])),
    ]:
        metric = VarROC(mode, prediction="map")
        metric.update(_t(logits), _t(target, torch.long), map_outputs=_t(map_logits))
        metric.update(_t(ood_logits), is_ood=True, map_outputs=_t(softmax(ood_map, axis=-1)))  # probs alike
        assert metric.compute().item() == pytest.approx(expected, abs=1e-6), mode
    ignored = VarROC("id")  # predictive_mean ignores map_outputs
    ignored.update(_t(logits), _t(target, torch.long), map_outputs=_t(map_logits))
    plain = VarROC("id")
    plain.update(_t(logits), _t(target, torch.long))
    assert ignored.compute().item() == plain.compute().item()


def test_varroc_degenerate_returns_nan_with_warning():
    logits, target, _, correct = _varroc_data()
    metric = VarROC("id")
    metric.update(_t(logits[correct]), _t(target[correct], torch.long))  # no misclassified point
    with pytest.warns(UserWarning, match="Returning nan"):
        assert math.isnan(metric.compute().item())


# ---------------------------------------------------------------- DDP-style reduction


def _shard_pair(make, feed):
    """One pass versus two shards reduced by merge_state (what DDP's sum/cat reduction does)."""
    one, a, b = make(), make(), make()
    feed(one, slice(None))
    feed(a, slice(0, 17))
    feed(b, slice(17, None))
    a.merge_state(b)
    return one.compute().item(), a.compute().item()


@pytest.mark.parametrize("name", ["ece", "nll", "lppd", "gauss", "varroc"])
def test_two_shards_merge_to_one_pass(name):
    logits, target, _, _ = _varroc_data()
    lt, tt = _t(logits), _t(target, torch.long)
    mu, y = lt[..., 0], lt[:, 0, 1]
    makers = {
        "ece": (lambda: ExpectedCalibrationError(4, input_kind="logits"),
                lambda m, i: m.update(lt[i], tt[i])),
        "nll": (PredictiveNLL, lambda m, i: m.update(lt[i], tt[i])),
        "lppd": (lambda: LogPointwisePredictiveDensity("regression"),
                 lambda m, i: m.update(mu[i], y[i], noise_var=0.5)),
        "gauss": (GaussianNLL, lambda m, i: m.update(mu[i], y[i], 0.5)),
        "varroc": (VarROC, lambda m, i: m.update(lt[i], tt[i])),
    }
    one, merged = _shard_pair(*makers[name])
    assert merged == pytest.approx(one, rel=1e-6)


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize("call, match", [
    (lambda: PredictiveNLL().update(torch.randn(4), torch.zeros(4, dtype=torch.long)),
     r"\(batch, samples, classes\)"),
    (lambda: PredictiveNLL().update(torch.randn(4, 3, 2), torch.zeros(5, dtype=torch.long)), r"\(batch,\)"),
    (lambda: PredictiveNLL().update(torch.randn(4, 3, 2), torch.zeros(4)), "integer"),
    (lambda: PredictiveNLL().update(torch.randn(4, 3, 2), torch.full((4,), 2)), r"\[0, 1\]"),
    (lambda: PredictiveNLL("probs").update(torch.randn(4, 3, 2) * 5, torch.zeros(4, dtype=torch.long)),
     "logits"),
    (lambda: ExpectedCalibrationError(3).update(torch.rand(4, 2, 5), torch.zeros(4, dtype=torch.long)),
     "3 classes"),
    (lambda: GaussianNLL().update(torch.randn(4, 3, 2), torch.randn(4), 1.0), r"\(4, 'samples'\)"),
    (lambda: GaussianNLL().update(torch.randn(4), torch.randn(4), torch.ones(3)), "broadcastable"),
    (lambda: GaussianNLL().update(torch.randn(4), torch.randn(4), -1.0), "positive"),
    (lambda: LogPointwisePredictiveDensity("regression").update(torch.randn(4, 3), torch.randn(4)),
     "noise_var"),
    (lambda: VarROC().update(torch.randn(4, 3), torch.zeros(4, dtype=torch.long)), "samples >= 2"),
    (lambda: VarROC().update(torch.randn(4, 3, 2)), "target is required"),
    (lambda: VarROC(mode="both"), "Unknown mode"),
    (lambda: VarROC(prediction="mode"), "Unknown prediction"),
    (lambda: VarROC(prediction="map").update(torch.randn(4, 3, 2), torch.zeros(4, dtype=torch.long)),
     "needs map_outputs"),
    (lambda: VarROC(prediction="map").update(torch.randn(4, 3, 2), torch.zeros(4, dtype=torch.long),
                                             map_outputs=torch.randn(4, 3)), r"shaped \(4, 2\)"),
])
def test_bad_inputs_raise_helpful_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ---------------------------------------------------------------- plot


def test_reliability_diagram_writes_png(tmp_path):
    logits, target = _logits(b=80, s=3, c=3)
    probs = torch.softmax(_t(logits), -1)
    out = reliability_diagram(probs, _t(target, torch.long), tmp_path / "sub" / "rel.png", title="toy")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="logits"):
        reliability_diagram(_t(logits) * 10, _t(target, torch.long), tmp_path / "x.png")
