"""MCoverClassifier with its callbacks: resampling sequence, resume, DDP, replica baselines."""

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from ripieno.callbacks import DiversityMonitor, ElasticAveraging, ReplicaCoupling, RoutingResampler
from ripieno.datamodules import ImageDataModule
from ripieno.framework import MCoverClassifier
from ripieno.framework.mcover import PermutationBank, make_kernel


def _data(**kw):
    return ImageDataModule("digits", batch_size=64, max_train_rows=256, **kw)


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
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
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
        if trainer.is_global_zero:
            torch.save({"banks": banks, "weights": weights}, trainer.default_root_dir + "/banks.pt")


@pytest.mark.slow
def test_ddp_ranks_route_identically(tmp_path):
    torch.manual_seed(0)
    dm = _data()
    model = _model(dm)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=1, logger=False,
                        enable_progress_bar=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
                        callbacks=[RoutingResampler(every_n_steps=1, seed=5), _BankRecorder()])
    trainer.fit(model, datamodule=dm)
    saved = torch.load(tmp_path / "banks.pt")
    assert torch.equal(saved["banks"][0], saved["banks"][1])
    assert torch.equal(saved["weights"][0], saved["weights"][1])
