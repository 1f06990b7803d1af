"""Binary teacher-student perceptron annealing: exact identities, Boltzmann sampling, Lightning."""

import itertools
import math

import lightning as L
import numpy as np
import pytest
import torch

from ripieno.datamodules.teacher_student import TeacherStudentDataModule
from ripieno.framework.mcover import PermutationBank, make_kernel
from ripieno.framework.mcover.perceptron import (
    AnnealingSchedule,
    RoutedPerceptronAnnealer,
    TeacherStudentSpec,
    collapse,
    copy_generators,
    generalization_error,
    teacher_student_data,
)
from ripieno.framework.mcover.perceptron_module import BinaryPerceptronSA


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _data(n=40, alpha=1.5, seed=0, inputs="gaussian"):
    return teacher_student_data(n, int(alpha * n), inputs=inputs, generator=_gen(seed))


def _ring_bank(m, n_blocks, size, seed=1, sigma=1.0):
    return PermutationBank.draw(make_kernel("gaussian_ring", m, sigma=sigma), n_blocks, size, _gen(seed))


def _assert_consistent(annealer):
    """Incremental fields and energies equal a recomputation from the copies and the routing."""
    assert torch.allclose(annealer.fields(), annealer.fields_from_scratch(), atol=1e-9, rtol=0)
    y = torch.from_numpy(annealer._y)
    scratch = (annealer.fields_from_scratch() * y <= 0).sum(1)
    assert torch.equal(annealer.energies(), scratch)
    assert annealer.coupling() == pytest.approx(float(sum(
        annealer.weights()[a] @ annealer.weights()[b]
        for a, b in itertools.combinations(range(annealer.m), 2))))


# ------------------------------------------------------------------------- data
def test_teacher_student_data_labels_noise_and_reuse():
    x, y, teacher = teacher_student_data(30, 2000, generator=_gen(0))
    assert x.shape == (2000, 30) and y.shape == (2000,) and teacher.shape == (30,)
    assert set(y.unique().tolist()) <= {-1.0, 1.0} and set(teacher.unique().tolist()) <= {-1.0, 1.0}
    assert torch.equal(y, torch.where(x @ teacher >= 0, 1.0, -1.0).double())
    x2, y2, t2 = teacher_student_data(30, 2000, generator=_gen(0))
    assert torch.equal(x, x2) and torch.equal(y, y2) and torch.equal(teacher, t2)
    xb, yb, _ = teacher_student_data(30, 20000, inputs="binary", label_noise=0.2, generator=_gen(1),
                                     teacher=teacher)
    assert set(xb.unique().tolist()) == {-1.0, 1.0}
    clean = torch.where(xb @ teacher >= 0, 1.0, -1.0)
    assert (yb != clean).double().mean().item() == pytest.approx(0.2, abs=0.015)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"n_inputs": 0, "n_patterns": 5}, "n_inputs"),
    ({"n_inputs": 5, "n_patterns": -1}, "n_patterns"),
    ({"n_inputs": 5, "n_patterns": 5, "inputs": "uniform"}, "inputs"),
    ({"n_inputs": 5, "n_patterns": 5, "label_noise": 0.7}, "label_noise"),
    ({"n_inputs": 5, "n_patterns": 5, "teacher": torch.ones(4)}, "teacher"),
    ({"n_inputs": 3, "n_patterns": 5, "teacher": torch.tensor([1.0, 0.0, -1.0])}, "teacher"),
])
def test_teacher_student_data_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        teacher_student_data(**kwargs)


def test_generalization_error_equals_empirical_disagreement():
    n = 50
    teacher = teacher_student_data(n, 0, generator=_gen(3))[2]
    w = teacher.clone()
    w[:15] *= -1  # overlap 0.4
    x = torch.randn(400_000, n, generator=_gen(4), dtype=torch.float64)
    empirical = ((x @ w >= 0) != (x @ teacher >= 0)).double().mean().item()
    eps = generalization_error(w, teacher).item()
    assert eps == pytest.approx(math.acos(0.4) / math.pi)
    assert abs(empirical - eps) < 4 * math.sqrt(eps * (1 - eps) / 400_000)
    assert generalization_error(torch.stack([teacher, -teacher]), teacher).tolist() == [0.0, 1.0]
    with pytest.raises(ValueError, match="non-zero"):
        generalization_error(torch.zeros(n), teacher)
    with pytest.raises(ValueError, match="disagree"):
        generalization_error(torch.ones(n + 1), teacher)


def test_collapse_is_the_majority_with_ties_to_copy_zero():
    w = torch.tensor([[1.0, -1.0, 1.0, -1.0], [-1.0, 1.0, 1.0, -1.0]])
    assert collapse(w).tolist() == [1.0, -1.0, 1.0, -1.0]
    w3 = torch.tensor([[1.0, -1.0], [-1.0, -1.0], [-1.0, 1.0]])
    assert collapse(w3).tolist() == [-1.0, -1.0]


# -------------------------------------------------------------------- annealer
def test_schedule_is_geometric_and_validated():
    s = AnnealingSchedule(n_sweeps=11, beta0=0.1, beta1=10.0, gamma0=0.5, gamma_growth=0.1)
    assert s.beta(0) == pytest.approx(0.1) and s.beta(10) == pytest.approx(10.0)
    assert s.beta(5) == pytest.approx(1.0) and s.beta(50) == pytest.approx(10.0)
    assert s.gamma(3) == pytest.approx(0.5 * 1.1**3)
    assert AnnealingSchedule(gamma0=1.0, gamma_growth=1.0).gamma(5000) == math.inf
    for bad in ({"n_sweeps": 0}, {"beta0": 0.0}, {"beta1": math.inf}, {"gamma0": -1.0},
                {"resample_every": 0}):
        with pytest.raises(ValueError):
            AnnealingSchedule(**bad)


def test_incremental_fields_equal_recomputation_after_flips_and_bank_changes():
    x, y, _ = _data(n=37, alpha=2.0)
    schedule = AnnealingSchedule(n_sweeps=30, beta0=0.2, beta1=2.0, gamma0=0.05, gamma_growth=0.05,
                                 resample_every=3)
    annealer = RoutedPerceptronAnnealer(x, y, m=4, n_blocks=3, schedule=schedule, generator=_gen(5),
                                        bank=_ring_bank(4, 3, 8))
    routings = set()
    for _ in range(30):
        annealer.step_sweep()
        routings.add(tuple(annealer.routing.flatten().tolist()))
        _assert_consistent(annealer)
    assert annealer.accepted > 500 and len(routings) > 3  # many flips, the routing really changed
    annealer.set_permutation_bank(_ring_bank(4, 3, 8, seed=9))
    _assert_consistent(annealer)
    annealer.set_data(*_data(n=37, alpha=1.0, seed=1)[:2])
    _assert_consistent(annealer)


def test_routed_field_equals_an_explicitly_routed_weight_vector():
    x, y, _ = _data(n=23, alpha=1.0)
    bank = _ring_bank(3, 4, 5)
    annealer = RoutedPerceptronAnnealer(x, y, m=3, n_blocks=4, generator=_gen(0), bank=bank)
    w, rho = annealer.weights(), bank.at(0)
    assert torch.equal(annealer.routing, rho)
    blocks = np.array_split(np.arange(23), 4)  # contiguous, the first ones one longer
    for a in range(3):
        v = torch.empty(23, dtype=torch.float64)
        for j, block in enumerate(blocks):
            for i in block:
                v[i] = w[rho[j, a], i]
        assert torch.equal(annealer.routed_weights()[a], v)
        assert torch.allclose(annealer.fields()[a], x @ v / math.sqrt(23), atol=1e-12)


def test_identity_routing_without_coupling_is_m_independent_annealers():
    x, y, _ = _data(n=31, alpha=1.5)
    schedule = AnnealingSchedule(n_sweeps=40, beta0=0.3, beta1=3.0)
    diagonal = PermutationBank.draw(make_kernel("diagonal", 3), 2, 4, _gen(0))
    joint = RoutedPerceptronAnnealer(x, y, m=3, n_blocks=2, schedule=schedule, bank=diagonal,
                                     generator=[_gen(10 + a) for a in range(3)])
    joint.anneal()
    for a in range(3):
        alone = RoutedPerceptronAnnealer(x, y, m=1, schedule=schedule, generator=[_gen(10 + a)])
        alone.anneal()
        assert torch.equal(joint.weights()[a], alone.weights()[0])
        assert joint.energies()[a] == alone.energies()[0]
    # one generator seeds the copies exactly as copy_generators does
    single = RoutedPerceptronAnnealer(x, y, m=3, schedule=schedule, generator=_gen(7))
    listed = RoutedPerceptronAnnealer(x, y, m=3, schedule=schedule, generator=copy_generators(_gen(7), 3))
    single.anneal()
    listed.anneal()
    assert torch.equal(single.weights(), listed.weights())


def test_interleaved_stream_equals_per_copy_processing_without_coupling():
    x, y, _ = _data(n=29, alpha=1.5)
    schedule = AnnealingSchedule(n_sweeps=20, beta0=0.3, beta1=3.0, resample_every=2)
    runs = []
    for interleaved in (False, True):
        annealer = RoutedPerceptronAnnealer(x, y, m=4, n_blocks=3, schedule=schedule, generator=_gen(2),
                                            bank=_ring_bank(4, 3, 10))
        for _ in range(20):
            annealer.step_sweep(interleaved=interleaved)
        runs.append(annealer)
    assert torch.equal(runs[0].weights(), runs[1].weights())
    assert runs[0].accepted == runs[1].accepted


def test_lookahead_length_does_not_change_the_trajectory():
    x, y, _ = _data(n=29, alpha=1.5)
    schedule = AnnealingSchedule(n_sweeps=15, beta0=0.5, beta1=5.0, gamma0=0.1, gamma_growth=0.1)
    results = []
    for lookahead in (1, 1024):
        annealer = RoutedPerceptronAnnealer(x, y, m=3, schedule=schedule, generator=_gen(3))
        annealer.lookahead_max = lookahead
        annealer.anneal()
        results.append(annealer.weights())
    assert torch.equal(results[0], results[1])


def _boltzmann_check(annealer, n_sweeps, beta, gamma):
    """Empirical state frequencies of a fixed-temperature chain against ``exp(-beta E)``."""
    m, n = annealer.m, annealer.n
    counts = {}
    for _ in range(n_sweeps):
        annealer.step_sweep()
        key = tuple(annealer.weights().flatten().int().tolist())
        counts[key] = counts.get(key, 0) + 1
    yx = torch.from_numpy(annealer._yxT.T)  # (P, N) rows y x
    rho = annealer.routing
    source = rho[torch.from_numpy(annealer.block_of)].T  # (M, N)
    states, weights = [], []
    for bits in itertools.product((-1.0, 1.0), repeat=m * n):
        w = torch.tensor(bits, dtype=torch.float64).view(m, n)
        v = w.gather(0, source)
        errors = float((v @ yx.T <= 0).sum())
        pairs = sum(float(w[a] @ w[b]) for a, b in itertools.combinations(range(m), 2))
        states.append(tuple(int(b) for b in bits))
        weights.append(math.exp(-beta * (errors - gamma * pairs)))
    z = sum(weights)
    return 0.5 * sum(abs(counts.get(s, 0) / n_sweeps - wt / z) for s, wt in zip(states, weights, strict=True))


def test_metropolis_samples_the_boltzmann_distribution():
    """Fixed beta (and gamma, and routing): the chain's state frequencies match exp(-beta E) exactly."""
    x, y, _ = teacher_student_data(4, 7, generator=_gen(11))
    schedule = AnnealingSchedule(n_sweeps=1, beta0=0.8, beta1=0.8)
    plain = RoutedPerceptronAnnealer(x, y, m=1, schedule=schedule, generator=_gen(1))
    assert _boltzmann_check(plain, 20_000, 0.8, 0.0) < 0.03
    x, y, _ = teacher_student_data(3, 5, generator=_gen(12))
    schedule = AnnealingSchedule(n_sweeps=1, beta0=0.7, beta1=0.7, gamma0=0.4)
    swap = PermutationBank(torch.tensor([[[1, 0]], [[0, 1]]]))  # block 0 swapped, block 1 identity
    coupled = RoutedPerceptronAnnealer(x, y, m=2, n_blocks=2, schedule=schedule, generator=_gen(2), bank=swap)
    assert _boltzmann_check(coupled, 20_000, 0.7, 0.4) < 0.04


def test_state_dict_resumes_exactly():
    x, y, _ = _data(n=25, alpha=1.5)
    schedule = AnnealingSchedule(n_sweeps=20, beta0=0.3, beta1=3.0, resample_every=2)
    bank = _ring_bank(3, 2, 6)
    kw = {"m": 3, "n_blocks": 2, "schedule": schedule, "bank": bank}
    straight = RoutedPerceptronAnnealer(x, y, generator=_gen(4), **kw)
    straight.anneal()
    first = RoutedPerceptronAnnealer(x, y, generator=_gen(4), **kw)
    first.anneal(9)
    state = first.state_dict()
    resumed = RoutedPerceptronAnnealer(x, y, generator=_gen(99), **kw)
    resumed.load_state_dict(state)
    resumed.anneal()
    assert resumed.sweep == 20
    assert torch.equal(straight.weights(), resumed.weights())


def test_plain_sa_learns_the_teacher():
    """N = 200: plain SA finds the teacher at alpha = 3; replicated SA also at alpha = 2.

    With the error-counting energy, plain single-flip SA at alpha = 2 stays in glassy states
    (generalisation error about 0.12-0.3 after thousands of sweeps); see the experiment.
    """
    x, y, teacher = teacher_student_data(200, 600, generator=_gen(1))
    annealer = RoutedPerceptronAnnealer(x, y, m=1, schedule=AnnealingSchedule(1000, 0.5, 5.0),
                                        generator=_gen(2))
    annealer.anneal()
    assert annealer.summary(teacher)["gen_error_collapsed"] < 0.1
    assert annealer.energies().item() == 0


def test_replicated_sa_generalizes_at_alpha_two():
    """M = 5 coupled copies, gamma 0.1 -> 5.4 over 1000 sweeps (found the teacher for 3 of 3 pilot seeds)."""
    x, y, teacher = teacher_student_data(200, 400, generator=_gen(1))
    schedule = AnnealingSchedule(n_sweeps=1000, beta0=0.5, beta1=5.0, gamma0=0.1, gamma_growth=0.004)
    annealer = RoutedPerceptronAnnealer(x, y, m=5, schedule=schedule, generator=_gen(1))
    annealer.anneal()
    assert annealer.summary(teacher)["gen_error_collapsed"] < 0.1


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"m": 0}, "m \\(the number of copies\\)"),
    ({"n_blocks": 0}, "n_blocks"),
    ({"n_blocks": 100}, "n_blocks"),
    ({"m": 2, "generator": [torch.Generator()]}, "per-copy generators"),
    ({"m": 2, "bank": PermutationBank(torch.zeros(1, 3, 3, dtype=torch.long))}, "bank"),
    ({"m": 2, "bank": PermutationBank(torch.zeros(1, 3, 2, dtype=torch.long))}, "permutation"),
    ({"m": 2, "w0": torch.zeros(2, 10)}, "w0"),
    ({"m": 2, "w0": torch.ones(3, 10)}, "w0"),
])
def test_annealer_rejects_bad_arguments(kwargs, match):
    x, y, _ = _data(n=10, alpha=1.0)
    with pytest.raises(ValueError, match=match):
        RoutedPerceptronAnnealer(x, y, **kwargs)


def test_annealer_rejects_bad_data():
    x, y, _ = _data(n=10, alpha=1.0)
    with pytest.raises(ValueError, match="-1, \\+1"):
        RoutedPerceptronAnnealer(x, (y + 1) / 2)
    with pytest.raises(ValueError, match="shaped \\(P, N\\)"):
        RoutedPerceptronAnnealer(x[0], y)
    annealer = RoutedPerceptronAnnealer(x, y)
    with pytest.raises(ValueError, match="N=10"):
        annealer.set_data(x[:, :5], y)
    with pytest.raises(ValueError, match="to match x"):
        annealer.set_data(x, y[:-1])
    bad = x.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        annealer.set_data(bad, y)


# ------------------------------------------------------------------- Lightning
def _trainer(tmp_path, epochs=3, **kw):
    return L.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=tmp_path, deterministic=True, **kw)


def test_datamodule_splits_spec_and_errors():
    dm = TeacherStudentDataModule(n_inputs=50, alpha=2.0, n_val=30, n_test=40, label_noise=0.1, seed=3)
    assert dm.split_sizes() == {"train": 100, "val": 30, "test": 40}
    spec = dm.spec
    assert spec.n_train == 100 and spec.alpha == 2.0 and len(spec.teacher) == 50
    assert TeacherStudentSpec.coerce(spec.to_dict()) == spec
    batch = next(iter(dm.train_dataloader()))
    assert batch["x"].shape == (100, 50) and batch["y"].shape == (100,)
    x, y, teacher = teacher_student_data(50, 100, label_noise=0.1, generator=_gen(3))
    assert torch.equal(batch["x"], x) and torch.equal(batch["y"], y)
    assert torch.equal(spec.teacher_tensor(), teacher)
    test = next(iter(dm.test_dataloader()))
    assert torch.equal(test["y"], torch.where(test["x"] @ teacher >= 0, 1.0, -1.0).double())  # clean labels
    assert len(list(TeacherStudentDataModule(n_inputs=50, alpha=2.0, batch_size=30).train_dataloader())) == 4
    for bad in ({"n_inputs": 0}, {"alpha": 0.0}, {"inputs": "uniform"}, {"label_noise": 0.6}, {"n_test": 0},
                {"batch_size": 0}):
        with pytest.raises(ValueError):
            TeacherStudentDataModule(**bad)


@pytest.mark.parametrize("method", ["plain", "replicated", "mcover"])
def test_module_trains_and_logs_the_collapsed_generalization_error(method, tmp_path):
    dm = TeacherStudentDataModule(n_inputs=50, alpha=2.0, n_val=100, n_test=100)
    m = 1 if method == "plain" else 3
    model = BinaryPerceptronSA(dm.spec, method=method, m=m, n_blocks=2, bank_size=4, resample_every=2,
                               sweeps_per_step=5)
    trainer = _trainer(tmp_path)
    trainer.fit(model, datamodule=dm)
    assert int(model.sweep) == 15 and model.global_step == 3
    logged = trainer.callback_metrics
    teacher = dm.spec.teacher_tensor()
    expected = float(generalization_error(model.collapse(), teacher))
    assert float(logged["val/gen_error_collapsed"]) == pytest.approx(expected, abs=1e-6)
    copies = float(generalization_error(model.copies(), teacher).mean())
    assert float(logged["val/gen_error_copies"]) == pytest.approx(copies, abs=1e-6)
    assert float(logged["train/beta"]) == pytest.approx(model.schedule().beta(10))
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert result["test/gen_error_collapsed"] == pytest.approx(expected, abs=1e-6)
    test = next(iter(dm.test_dataloader()))
    wrong = ((test["x"] @ model.collapse() > 0).double() * 2 - 1 != test["y"]).double().mean()
    assert result["test/error_collapsed"] == pytest.approx(float(wrong), abs=1e-6)
    assert result["test/accuracy"] == pytest.approx(1 - float(wrong), abs=1e-6)
    if method == "replicated":
        assert float(logged["train/gamma"]) > 0


@pytest.mark.filterwarnings("ignore:Checkpoint directory.*exists and is not empty")
def test_module_equals_the_annealer_and_resumes_exactly(tmp_path):
    dm = TeacherStudentDataModule(n_inputs=40, alpha=1.5, n_val=20, n_test=20)
    kw = {"method": "mcover", "m": 3, "n_blocks": 2, "bank_size": 6, "resample_every": 2,
          "sweeps_per_step": 3, "n_sweeps": 12, "seed": 5, "routing_seed": 1}
    straight = BinaryPerceptronSA(dm.spec, **kw)
    _trainer(tmp_path / "a", epochs=4, enable_checkpointing=False).fit(straight, datamodule=dm)
    # the same chain by hand
    batch = next(iter(dm.train_dataloader()))
    bank = PermutationBank.draw(make_kernel("gaussian_ring", 3, sigma=0.5), 2, 6, _gen(1))
    annealer = RoutedPerceptronAnnealer(batch["x"], batch["y"], 3, 2, AnnealingSchedule(12, 0.5, 5.0,
                                        resample_every=2), generator=_gen(5), bank=bank)
    annealer.anneal(12)
    assert torch.equal(straight.copies(), annealer.weights())
    # 2 + 2 epochs through a checkpoint equal 4 straight
    first = BinaryPerceptronSA(dm.spec, **kw)
    _trainer(tmp_path / "b", epochs=2).fit(first, datamodule=dm)
    ckpt = next((tmp_path / "b").rglob("*.ckpt"))
    resumed = BinaryPerceptronSA(dm.spec, **kw)
    _trainer(tmp_path / "b", epochs=4).fit(resumed, datamodule=dm, ckpt_path=ckpt, weights_only=True)
    assert torch.equal(resumed.copies(), straight.copies())
    loaded = BinaryPerceptronSA.load_from_checkpoint(ckpt, weights_only=True)
    assert torch.equal(loaded.copies(), first.copies())


def test_module_draws_banks_for_the_routing_resampler(tmp_path):
    from ripieno.callbacks import RoutingResampler

    dm = TeacherStudentDataModule(n_inputs=30, alpha=1.0, n_val=10, n_test=10)
    model = BinaryPerceptronSA(dm.spec, method="mcover", m=4, n_blocks=3, bank_size=5, sweeps_per_step=2)
    assert model.n_copies == 4 and model.permutation_bank.perms.shape == (3, 5, 4)
    resampler = RoutingResampler(every_n_epochs=1, seed=7)
    _trainer(tmp_path, epochs=2, enable_checkpointing=False, callbacks=[resampler]).fit(model, datamodule=dm)
    g = _gen(7)
    for _ in range(2):
        expected = PermutationBank.draw(make_kernel("gaussian_ring", 4, sigma=0.5), 3, 5, g)
    assert torch.equal(model.bank_perms, expected.perms)
    assert torch.equal(model._annealer.permutation_bank.perms, expected.perms)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"method": "annealing"}, "method"),
    ({"method": "replicated", "m": 1}, "m >= 2"),
    ({"method": "plain", "kernel": "uniform"}, "method='mcover'"),
    ({"method": "plain", "gamma0": 0.1}, "replicated"),
    ({"n_blocks": 100}, "n_blocks"),
    ({"beta0": -1.0}, "beta0"),
])
def test_module_rejects_inconsistent_settings(kwargs, match):
    spec = TeacherStudentDataModule(n_inputs=20, alpha=1.0).spec
    with pytest.raises(ValueError, match=match):
        BinaryPerceptronSA(spec, **kwargs)


# --------------------------------------------------------------- collapse rules
def test_vote_generalization_error_equals_the_empirical_vote_error():
    from ripieno.framework.mcover.perceptron import vote_generalization_error, vote_labels

    g = _gen(0)
    _, _, teacher = teacher_student_data(200, 10, generator=g)
    for m in (4, 5):  # even M: ties go to the mean-weight student
        w = torch.where(torch.rand(m, 200, generator=g) < 0.8, teacher, -teacher)
        x = torch.randn(100_000, 200, generator=g, dtype=torch.float64)
        truth = torch.where(x @ teacher > 0, 1.0, -1.0).double()
        empirical = (vote_labels(x @ w.T, x @ collapse(w)) != truth).double().mean()
        assert float(vote_generalization_error(w, teacher)) == pytest.approx(float(empirical), abs=0.006)
    one = w[:1]
    assert float(vote_generalization_error(one, teacher)) == pytest.approx(
        float(generalization_error(one[0], teacher)), abs=0.006)


def test_module_scores_every_collapse_rule_and_predicts_the_chosen_one(tmp_path):
    from ripieno.framework.mcover.perceptron import vote_generalization_error, vote_labels

    dm = TeacherStudentDataModule(n_inputs=50, alpha=2.0, n_val=200, n_test=200)
    model = BinaryPerceptronSA(dm.spec, method="mcover", m=4, n_blocks=2, bank_size=4, resample_every=2,
                               sweeps_per_step=5, collapse="best_copy")
    trainer = _trainer(tmp_path, enable_checkpointing=False)
    trainer.fit(model, datamodule=dm)
    val = next(iter(dm.val_dataloader()))
    val_errors = (torch.where(model(val["x"]) > 0, 1.0, -1.0) != val["y"][:, None]).double().mean(0)
    expected = int(torch.nonzero(val_errors == val_errors.min())[0, 0])  # ties: the lower index
    assert int(model.best_copy_index) == expected
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    test, teacher, copies = next(iter(dm.test_dataloader())), dm.spec.teacher_tensor(), model.copies()
    fields = model(test["x"])
    own = (torch.where(fields > 0, 1.0, -1.0) != test["y"][:, None]).double().mean(0)
    vote = vote_labels(fields, test["x"] @ model.collapse())
    mean_weights = torch.where(test["x"] @ model.collapse() > 0, 1.0, -1.0)
    assert result["test/best_copy_index"] == expected
    assert result["test/error_best_copy"] == pytest.approx(float(own[expected]))
    assert result["test/error_copy_average"] == pytest.approx(float((vote != test["y"]).double().mean()))
    wrong = float((mean_weights != test["y"]).double().mean())
    assert result["test/error_mean_weights"] == pytest.approx(wrong)
    assert result["test/error_collapsed"] == result["test/error_best_copy"]
    gen_best = float(generalization_error(copies[expected], teacher))
    assert result["test/gen_error_best_copy"] == pytest.approx(gen_best, abs=1e-6)
    assert result["test/gen_error_collapsed"] == pytest.approx(gen_best, abs=1e-6)
    assert result["test/gen_error_mean_weights"] == pytest.approx(
        float(generalization_error(model.collapse(), teacher)), abs=1e-6)
    assert result["test/gen_error_copy_average"] == pytest.approx(
        float(vote_generalization_error(copies, teacher)), abs=1e-6)
    predicted = trainer.predict(model, dataloaders=dm.test_dataloader())[0]["prediction"]
    assert torch.equal(predicted, torch.where(fields[:, expected] > 0, 1.0, -1.0).double())
    voting = BinaryPerceptronSA(dm.spec, method="mcover", m=4, n_blocks=2, bank_size=4,
                                collapse="copy_average")
    voting.load_state_dict(model.state_dict())
    assert torch.equal(trainer.predict(voting, dataloaders=dm.test_dataloader())[0]["prediction"], vote)
