"""MCoverClassifier with its callbacks: resampling sequence, resume, DDP, replica baselines."""

import lightning as L
import pytest
import torch
from helpers.ddp import DestroyGlooAtExit
from lightning.pytorch.callbacks import ModelCheckpoint

from ripieno.callbacks import DiversityMonitor, ElasticAveraging, ReplicaCoupling, RoutingResampler
from ripieno.datamodules import ImageDataModule, LoaderSettings
from ripieno.framework import MCoverClassifier
from ripieno.framework.mcover import PermutationBank, make_kernel


def _data(**kw):
    return ImageDataModule("digits", max_train_rows=256, **kw, loader=LoaderSettings(batch_size=64))


def _model(dm, **kw):
    kw = {"m": 4, "hidden": [16], "kernel": "gaussian_ring", "sigma": 1.0, "bank_size": 4, "lr": 0.05} | kw
    return MCoverClassifier(dm.spec, **kw)


def _trainer(tmp_path, callbacks, epochs=2, **kw):
    return L.Trainer(max_epochs=epochs, logger=False, enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=tmp_path, callbacks=callbacks, deterministic=True, **kw)


def test_resampler_installs_the_banks_its_generator_draws(tmp_path):
    torch.manual_seed(0)
    dm = _data()
    model = _model(dm)
    resampler = RoutingResampler(every_n_steps=3, seed=7)
    _trainer(tmp_path, [resampler], epochs=1, enable_checkpointing=False).fit(model, datamodule=dm)
    steps = model.global_step
    g = torch.Generator().manual_seed(7)
    expected = None
    for _ in range(len(range(0, steps, 3))):
        expected = PermutationBank.draw(make_kernel("gaussian_ring", 4, sigma=1.0), model.net.n_slots, 4, g)
    assert resampler.draws == len(range(0, steps, 3))
    assert torch.equal(model.bank_perms, expected.perms)


def test_metrics_are_the_copy_average_and_the_collapsed_network(tmp_path):
    torch.manual_seed(0)
    dm = _data()
    model = _model(dm)
    trainer = _trainer(tmp_path, [RoutingResampler(every_n_steps=1), DiversityMonitor()], epochs=8,
                       enable_checkpointing=False)
    trainer.fit(model, datamodule=dm)
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    xs, ys = zip(*[(b["x"], b["y"]) for b in dm.test_dataloader()], strict=True)
    x, y = torch.cat(xs), torch.cat(ys)
    model.eval()
    with torch.no_grad():
        copies = torch.softmax(model(x), -1)
        collapsed = model.net.collapse()(x)
    assert result["test/accuracy"] == pytest.approx(float((copies.mean(1).argmax(-1) == y).float().mean()))
    collapsed_accuracy = float((collapsed.argmax(-1) == y).float().mean())
    assert result["test/collapsed_accuracy"] == pytest.approx(collapsed_accuracy)
    per_copy = (copies.argmax(-1) == y[:, None]).float().mean()
    assert result["test/copy_accuracy"] == pytest.approx(float(per_copy), abs=1e-6)
    assert "diversity/test/pairwise_kl" in result
    assert result["test/accuracy"] > 0.5  # it learns (chance is 0.1)


def _fit(tmp_path, epochs, ckpt_path=None):
    torch.manual_seed(0)
    dm = _data()
    model = _model(dm, routing="exact")
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = _trainer(tmp_path, [RoutingResampler(every_n_steps=2, seed=3), checkpoint], epochs=epochs)
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path, weights_only=True)
    return model, checkpoint


def test_resume_continues_the_same_routing_sequence(tmp_path):
    straight, _ = _fit(tmp_path / "straight", 4)
    _, first = _fit(tmp_path / "first", 2)
    resumed, _ = _fit(tmp_path / "resumed", 4, ckpt_path=first.last_model_path)
    assert torch.equal(resumed.bank_perms, straight.bank_perms)
    for p, q in zip(resumed.parameters(), straight.parameters(), strict=True):
        assert torch.equal(p, q)


def test_replica_coupling_term_is_the_squared_distance_to_the_mean(tmp_path):
    dm = _data()
    model = _model(dm)
    coupling = ReplicaCoupling(gamma0=0.5, growth=0.1, gamma_max=100.0)
    coupling.setup(None, model, "fit")
    value = model._loss_term_registry()["replica_coupling"](model, None, {})
    expected = sum(((p - p.mean(0)) ** 2).sum() for p in model.net.copy_parameters()) * 0.25
    assert torch.allclose(value, expected)
    assert coupling.gamma(10) == pytest.approx(0.5 * 1.1**10)


def test_strong_replica_coupling_pulls_copies_together(tmp_path):
    def spread(model):
        return sum(float(((p.detach() - p.detach().mean(0)) ** 2).sum()) for p in model.net.copy_parameters())

    torch.manual_seed(0)
    dm = _data()
    free, coupled = _model(dm, kernel="diagonal"), _model(dm, kernel="diagonal")
    coupled.load_state_dict(free.state_dict())
    _trainer(tmp_path, [], enable_checkpointing=False).fit(free, datamodule=dm)
    _trainer(tmp_path, [ReplicaCoupling(gamma0=1.0, growth=0.0)], enable_checkpointing=False).fit(
        coupled, datamodule=dm)
    assert spread(coupled) < 0.1 * spread(free)


def test_elastic_averaging_update_and_centre_collapse(tmp_path):
    torch.manual_seed(0)
    dm = _data()
    model = _model(dm)
    easgd = ElasticAveraging(alpha=0.1)
    trainer = _trainer(tmp_path, [easgd], epochs=1, enable_checkpointing=False)
    easgd.on_fit_start(trainer, model)
    before = [p.detach().clone() for p in model.net.copy_parameters()]
    centre = [c.clone() for c in easgd.centre]
    easgd.on_train_batch_end(trainer, model, None, None, 0)
    for p, b, c, c_new in zip(model.net.copy_parameters(), before, centre, easgd.centre, strict=True):
        assert torch.allclose(p, b - 0.1 * (b - c))
        assert torch.allclose(c_new, c + 0.1 * (b - c).sum(0))
    x = torch.randn(3, 1, 8, 8)
    expected = model.net._base_network(easgd.centre[:2], easgd.centre[2:])(x)
    assert torch.allclose(model.collapsed_network()(x), expected)


def test_committee_machine_trains_and_votes(tmp_path):
    torch.manual_seed(0)
    dm = _data()
    model = _model(dm, head="committee", hidden=[], committee_size=3, n_blocks=2, routing="block_message")
    trainer = _trainer(tmp_path, [RoutingResampler(every_n_epochs=1)], enable_checkpointing=False)
    trainer.fit(model, datamodule=dm)
    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    assert 0.3 < result["test/vote_accuracy"] <= 1.0


def test_resampler_without_a_routed_module_is_an_error(tmp_path):
    from ripieno.framework import ImageClassifier

    dm = _data()
    with pytest.raises(TypeError, match="draw_permutation_bank"):
        _trainer(tmp_path, [RoutingResampler(every_n_steps=1)], epochs=1).fit(ImageClassifier(dm.spec),
                                                                              datamodule=dm)
    with pytest.raises(ValueError, match="exactly one"):
        RoutingResampler()


class _BankRecorder(L.Callback):
    def on_train_end(self, trainer, pl_module):
        banks = trainer.strategy.all_gather(pl_module.bank_perms)
        weights = trainer.strategy.all_gather(pl_module.net.weights[0].detach())
        best = trainer.strategy.all_gather(pl_module.best_copy_index)
        if trainer.is_global_zero:
            saved = {"banks": banks, "weights": weights, "best": best}
            torch.save(saved, trainer.default_root_dir + "/banks.pt")


@pytest.mark.slow
def test_ddp_ranks_route_identically(tmp_path):
    torch.manual_seed(0)
    dm = _data()
    model = _model(dm)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=1, logger=False,
                        enable_progress_bar=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
                        callbacks=[RoutingResampler(every_n_steps=1, seed=5), _BankRecorder(),
                                   DestroyGlooAtExit()])
    trainer.fit(model, datamodule=dm)
    saved = torch.load(tmp_path / "banks.pt", weights_only=True)
    assert torch.equal(saved["banks"][0], saved["banks"][1])
    assert torch.equal(saved["weights"][0], saved["weights"][1])
    assert saved["best"][0] == saved["best"][1] >= 0  # the best copy is chosen on the synced scores


# ------------------------------------------------------------------ collapse rules
def _split(loader):
    xs, ys = zip(*[(b["x"], b["y"]) for b in loader], strict=True)
    return torch.cat(xs), torch.cat(ys)


def _mean_weight_mlp(model):
    """The oracle of the mean_weights rule: a plain MLP built from the copies' averaged weights."""
    w = [p.detach().mean(0) for p in model.net.weights]
    b = [p.detach().mean(0) for p in model.net.biases]
    layers = [torch.nn.Flatten()]
    for i, (wi, bi) in enumerate(zip(w, b, strict=True)):
        linear = torch.nn.Linear(*wi.shape)
        with torch.no_grad():
            linear.weight.copy_(wi.T)
            linear.bias.copy_(bi)
        layers += [linear] + ([torch.nn.ReLU()] if i < len(w) - 1 else [])
    return torch.nn.Sequential(*layers)


class _BestCopyAtTrainStart(L.Callback):
    def on_train_start(self, trainer, pl_module):
        self.index = int(pl_module.best_copy_index)  # after the sanity check


def test_every_collapse_rule_equals_its_direct_computation(tmp_path):
    torch.manual_seed(0)
    dm = _data()
    model = _model(dm, collapse="best_copy")
    probe = _BestCopyAtTrainStart()
    trainer = _trainer(tmp_path, [RoutingResampler(every_n_steps=1), probe], epochs=3,
                       enable_checkpointing=False, num_sanity_val_steps=1)
    trainer.fit(model, datamodule=dm)
    assert probe.index == -1  # the sanity check chooses nothing
    model.eval()
    with torch.no_grad():
        x_val, y_val = _split(dm.val_dataloader())
        val_logits = model(x_val)
        val_acc = (val_logits.argmax(-1) == y_val[:, None]).float().mean(0)
        val_nll = torch.stack([torch.nn.functional.cross_entropy(val_logits[:, a], y_val)
                               for a in range(model.n_copies)])
    best = [a for a in range(model.n_copies) if val_acc[a] == val_acc.max()]
    expected = min(best, key=lambda a: float(val_nll[a]))  # ties: the lower NLL
    assert int(model.best_copy_index) == expected
    assert float(trainer.callback_metrics["val/best_copy_accuracy"]) == pytest.approx(float(val_acc.max()))
    assert float(trainer.callback_metrics["val/best_copy_nll"]) == pytest.approx(float(val_nll[expected]),
                                                                                  rel=1e-5)

    result = trainer.test(model, datamodule=dm, verbose=False)[0]
    x, y = _split(dm.test_dataloader())
    with torch.no_grad():
        probs = torch.softmax(model(x), -1)
        average = probs.mean(1)
        mean_weights = _mean_weight_mlp(model)(x)
    copy_acc = (probs.argmax(-1) == y[:, None]).float().mean(0)
    assert result["test/best_copy_index"] == expected  # chosen on validation, not on test
    assert result["test/best_copy_accuracy"] == pytest.approx(float(copy_acc[expected]))
    rows = range(len(y))
    nll = float(-probs[rows, expected, y].log().mean())
    assert result["test/best_copy_nll"] == pytest.approx(nll, rel=1e-5)
    accuracy = float((average.argmax(-1) == y).float().mean())
    assert result["test/copy_average_accuracy"] == pytest.approx(accuracy)
    assert result["test/copy_average_nll"] == pytest.approx(float(-average[range(len(y)), y].log().mean()),
                                                            rel=1e-5)
    assert result["test/accuracy"] == result["test/copy_average_accuracy"]  # the old names stay
    assert result["test/mean_weights_accuracy"] == pytest.approx(
        float((mean_weights.argmax(-1) == y).float().mean()))
    assert result["test/collapsed_accuracy"] == result["test/best_copy_accuracy"]
    assert result["test/collapsed_nll"] == result["test/best_copy_nll"]
    predicted = trainer.predict(model, dataloaders=dm.test_dataloader())
    assert torch.allclose(torch.cat([p["collapsed"] for p in predicted]), probs[:, expected], atol=1e-6)
    assert torch.allclose(torch.cat([p["prediction"] for p in predicted]), average, atol=1e-6)

    for rule, name in (("mean_weights", "mean_weights"), ("copy_average", "copy_average")):
        other = _model(dm, collapse=rule)
        other.load_state_dict(model.state_dict())
        again = trainer.test(other, datamodule=dm, verbose=False)[0]
        assert again["test/collapsed_accuracy"] == pytest.approx(result[f"test/{name}_accuracy"])
        assert again["test/collapsed_nll"] == pytest.approx(result[f"test/{name}_nll"])
        predicted = trainer.predict(other, dataloaders=dm.test_dataloader())
        predicted = torch.cat([p["collapsed"] for p in predicted])
        direct = torch.softmax(mean_weights, -1) if rule == "mean_weights" else average
        assert torch.allclose(predicted, direct, atol=1e-5)


def test_best_copy_round_trips_through_a_checkpoint(tmp_path):
    torch.manual_seed(0)
    dm = _data()
    model = _model(dm, collapse="best_copy")
    checkpoint = ModelCheckpoint(dirpath=tmp_path, monitor="val/collapsed_accuracy", mode="max", save_top_k=1)
    trainer = _trainer(tmp_path, [checkpoint], epochs=3)
    trainer.fit(model, datamodule=dm)
    saved = torch.load(checkpoint.best_model_path, weights_only=True)
    index = int(saved["state_dict"]["best_copy_index"])
    assert 0 <= index < model.n_copies
    model.best_copy_index.fill_((index + 1) % model.n_copies)  # test must take the checkpoint's copy
    result = trainer.test(model, datamodule=dm, ckpt_path=checkpoint.best_model_path, verbose=False,
                          weights_only=True)[0]
    assert result["test/best_copy_index"] == index
    loaded = MCoverClassifier.load_from_checkpoint(checkpoint.best_model_path, weights_only=True)
    assert int(loaded.best_copy_index) == index and loaded.collapse_rule == "best_copy"
    del saved["state_dict"]["best_copy_index"]  # a checkpoint from before the collapse rules
    torch.save(saved, tmp_path / "old.ckpt")
    old = MCoverClassifier.load_from_checkpoint(tmp_path / "old.ckpt", weights_only=True)
    assert int(old.best_copy_index) == -1


def test_testing_an_easgd_checkpoint_uses_its_centre(tmp_path):
    torch.manual_seed(0)
    dm = _data()
    model = _model(dm)
    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, every_n_epochs=1)
    trainer = _trainer(tmp_path, [ElasticAveraging(alpha=0.1), checkpoint], epochs=2)
    trainer.fit(model, datamodule=dm)
    first = sorted(tmp_path.glob("epoch=0*.ckpt"))[0]
    state = torch.load(first, weights_only=True)
    centre = next(v["centre"] for k, v in state["callbacks"].items() if "ElasticAveraging" in k)
    result = trainer.test(model, datamodule=dm, ckpt_path=first, verbose=False, weights_only=True)[0]
    x, y = _split(dm.test_dataloader())
    with torch.no_grad():
        logits = model.net._base_network(centre[:2], centre[2:])(x)
    accuracy = float((logits.argmax(-1) == y).float().mean())
    assert result["test/mean_weights_accuracy"] == pytest.approx(accuracy)


def test_copy_scores_and_best_copy_ties():
    from ripieno.framework.mcover.collapse import CopyScores, best_copy_index, check_collapse_rule

    assert best_copy_index(torch.tensor([0.5, 0.9, 0.9]), torch.tensor([0.1, 0.4, 0.3])) == 2
    assert best_copy_index(torch.tensor([0.9, 0.9, 0.5]), torch.tensor([0.3, 0.3, 0.1])) == 0
    assert best_copy_index(torch.tensor([0.2, 0.7, 0.7])) == 1
    scores = CopyScores(1)
    scores.update(torch.tensor([[True], [False], [True], [True]]), torch.tensor([[1.0], [2.0], [3.0], [4.0]]))
    per_copy = scores.per_copy()
    assert per_copy["accuracy"].shape == (1,) and float(per_copy["accuracy"][0]) == 0.75
    assert float(per_copy["nll"][0]) == 2.5
    with pytest.raises(ValueError, match="collapse must be one of"):
        check_collapse_rule("median")
    with pytest.raises(ValueError, match="collapse must be one of"):
        MCoverClassifier(_data().spec, collapse="vote")
