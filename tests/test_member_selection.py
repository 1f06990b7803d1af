"""Member selection: the greedy / top-k rules against brute force, and exact sub-ensembles."""

from __future__ import annotations

import lightning as L
import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, mean_squared_error
from torch.utils.data import DataLoader

from ripieno.datamodules.base import collate_batch
from ripieno.datamodules.tabular import TabularTensorDataset
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.methods import TabularEnsembleModule
from ripieno.framework.methods.member_selection import choose_members, ensemble_score, subset_members
from ripieno.framework.specs.tabular import TabularSpec

SPEC = TabularSpec(task="multiclass", n_num_features=3, n_classes=3, cat_cardinalities=[4],
                   bins=[[0.0, 0.5, 1.0]] * 3)
ADAPTERS = [("lometab", "all"), ("rank1", "all"), ("rank1", "mini"), ("additive", "all"),
            ("shared", "all"), ("packed", "all")]


def _member_probs(n: int = 64, k: int = 6, c: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, k, c, generator=g, dtype=torch.float64) * 2
    target = torch.randint(0, c, (n,), generator=g)
    return torch.softmax(logits, -1), target


def test_scores_are_sklearn_log_loss_error_and_mse():
    probs, target = _member_probs()
    assert ensemble_score(probs, target).item() == pytest.approx(
        log_loss(target.numpy(), probs.mean(1).numpy(), labels=[0, 1, 2]), rel=1e-12)
    error = (probs.mean(1).argmax(-1) != target).double().mean().item()
    assert ensemble_score(probs, target, "error").item() == pytest.approx(error)
    values, y = torch.randn(20, 4, dtype=torch.float64), torch.randn(20, dtype=torch.float64)
    assert ensemble_score(values, y).item() == pytest.approx(mean_squared_error(y, values.mean(1)))


@pytest.mark.parametrize("metric", ["loss", "error"])
def test_greedy_adds_the_best_member_at_every_step_with_replacement(metric):
    probs, target = _member_probs(seed=1)
    chosen = choose_members(probs, target, k=7, metric=metric)
    assert len(chosen.indices) == 7
    for step in range(1, 8):
        before = chosen.indices[:step - 1]
        candidates = [ensemble_score(probs[:, before + [j]], target, metric).item() for j in range(6)]
        best = min(candidates)
        assert candidates[chosen.indices[step - 1]] == best
        assert chosen.indices[step - 1] == candidates.index(best)  # ties: lowest index
    assert chosen.score == pytest.approx(ensemble_score(probs[:, chosen.indices], target, metric).item())
    assert chosen.score_all == pytest.approx(ensemble_score(probs, target, metric).item())
    single = min(ensemble_score(probs[:, [j]], target, metric).item() for j in range(6))
    assert chosen.score <= single  # the first step alone reaches the best single member


def test_topk_takes_the_members_with_the_best_own_loss():
    probs, target = _member_probs(seed=2)
    own = [log_loss(target.numpy(), probs[:, j].numpy(), labels=[0, 1, 2]) for j in range(6)]
    assert choose_members(probs, target, k=3, method="topk").indices == list(np.argsort(own)[:3])


def test_bad_selection_arguments_are_errors():
    probs, target = _member_probs()
    with pytest.raises(ValueError, match="k=7 > the 6 trained members"):
        choose_members(probs, target, k=7, method="topk")
    for k, method in [(0, "greedy"), (-1, "topk"), (7, "topk"), (2.0, "greedy"), (True, "topk")]:
        with pytest.raises(RipienoInputError) as caught:
            choose_members(probs, target, k=k, method=method)
        assert str(caught.value) == K_MESSAGES[k, method]
    assert choose_members(probs, target, k=np.int64(2), method="topk").indices == \
        choose_members(probs, target, k=2, method="topk").indices
    with pytest.raises(ValueError, match="method must be one of"):
        choose_members(probs, target, k=2, method="best")
    with pytest.raises(ValueError, match="needs classification"):
        choose_members(torch.randn(5, 3), torch.randn(5), k=2, metric="error")
    with pytest.raises(ValueError, match=r"Member indices must be in \[0, 4\)"):
        subset_members(TabularEnsembleModule(SPEC, k=4, d_block=8), [0, 4])


K_MESSAGES = {
    (0, "greedy"): "k=0: at least 1 member must be kept; give k >= 1 (greedy: any k >= 1, members may repeat;"
                   " topk: 1 to 6, the trained members).",
    (-1, "topk"): "k=-1: at least 1 member must be kept; give k >= 1 (greedy: any k >= 1, members may repeat;"
                  " topk: 1 to 6, the trained members).",
    (7, "topk"): "topk keeps distinct members: k=7 > the 6 trained members; give k from 1 to 6, or"
                 " method='greedy' (it selects with replacement: any k >= 1).",
    (2.0, "greedy"): "k must be an int >= 1 (the members to keep), got 2.0 (float).",
    (True, "topk"): "k must be an int >= 1 (the members to keep), got True (bool).",
}
"""``choose_members``' message for a bad ``k`` of 6 members, by ``(k, method)``."""


def test_greedy_may_keep_more_members_than_were_trained():
    probs, target = _member_probs(k=3, seed=5)
    chosen = choose_members(probs, target, k=8)  # with replacement: integer weights over 3 members
    assert len(chosen.indices) == 8 and set(chosen.indices) <= {0, 1, 2}
    assert chosen.score == pytest.approx(ensemble_score(probs[:, chosen.indices], target).item())


def test_module_select_members_refuses_a_bad_k_with_the_same_message():
    model = TabularEnsembleModule(SPEC, k=6, d_block=8)
    g = torch.Generator().manual_seed(6)
    val = [{"x_num": torch.rand(8, 3, generator=g), "x_cat": torch.randint(0, 4, (8, 1), generator=g),
            "y": torch.randint(0, 3, (8,), generator=g)}]
    for k, method in [(0, "greedy"), (7, "topk")]:
        with pytest.raises(RipienoInputError) as caught:
            model.select_members(k, method=method, dataloader=val)
        assert str(caught.value) == K_MESSAGES[k, method]


def _inputs(n: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return torch.rand(n, 3, generator=g), torch.randint(0, 4, (n, 1), generator=g)


@pytest.mark.parametrize(("adapter", "layers"), ADAPTERS)
def test_subset_members_keeps_exactly_the_chosen_members(adapter, layers):
    L.seed_everything(0, verbose=False)
    model = TabularEnsembleModule(SPEC, k=5, d_block=8, adapter=adapter, adapter_layers=layers,
                                  share_embeddings=adapter != "packed", dropout=0.0).eval()
    x_num, x_cat = _inputs()
    with torch.no_grad():
        full = model(x_num, x_cat)
        same = subset_members(model, range(5)).eval()(x_num, x_cat)
        rng = torch.get_rng_state()
        picked = subset_members(model, [3, 1, 1]).eval()
        assert torch.equal(torch.get_rng_state(), rng)  # building the subset draws nothing
        sub = picked(x_num, x_cat)
    torch.testing.assert_close(same, full, rtol=0, atol=0)
    torch.testing.assert_close(sub, full[:, [3, 1, 1]], rtol=1e-6, atol=1e-6)
    assert picked.hparams.k == 3


def test_select_members_end_to_end_and_the_selection_is_saved(tmp_path):
    L.seed_everything(0, verbose=False)
    model = TabularEnsembleModule(SPEC, k=6, d_block=8)
    g = torch.Generator().manual_seed(4)
    x_num, x_cat = torch.rand(48, 3, generator=g), torch.randint(0, 4, (48, 1), generator=g)
    val = [{"x_num": x_num, "x_cat": x_cat, "y": torch.randint(0, 3, (48,), generator=g)}]
    small = model.select_members(3, dataloader=val)
    model.eval()
    with torch.no_grad():
        members = torch.softmax(model(x_num, x_cat), -1)
        expected = members[:, small.member_selection.indices].mean(1)
        got = small.eval().predict_step({"x_num": x_num, "x_cat": x_cat}, 0)["prediction"]
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    probs = members.double()
    assert small.member_selection == choose_members(probs, val[0]["y"], 3)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path)
    loader = DataLoader(TabularTensorDataset(x_num, x_cat, val[0]["y"]), batch_size=16,
                        collate_fn=collate_batch)
    trainer.validate(small, dataloaders=loader, verbose=False)  # attaches the model to save it
    trainer.save_checkpoint(tmp_path / "small.ckpt")
    loaded = TabularEnsembleModule.load_from_checkpoint(tmp_path / "small.ckpt", weights_only=True)
    assert loaded.member_selection == small.member_selection and loaded.hparams.k == 3
    with pytest.raises(ValueError, match="pass datamodule= or dataloader="):
        model.select_members(2)


def test_cli_select_members_writes_a_checkpoint_that_predicts_like_the_chosen_members(tmp_path, monkeypatch,
                                                                                        capsys):
    from ripieno.framework.cli import main

    monkeypatch.chdir(tmp_path)
    common = ["-c", "tabular/lometab_churn", "--data.init_args.max_rows=300", "--model.init_args.k=6",
              "--model.init_args.d_block=16", "--trainer.default_root_dir=run"]
    main(["fit", *common, "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false", "--test_after_fit=false"])
    ckpt = next((tmp_path / "run").rglob("best-*.ckpt"))
    main(["select_members", *common, f"--ckpt_path={ckpt}", "--k=3", "--out=best3.ckpt"])
    out = capsys.readouterr().out
    assert "greedy selection of 3 of 6 members" in out and "val/loss" in out
    full = TabularEnsembleModule.load_from_checkpoint(ckpt, weights_only=True).eval()
    small = TabularEnsembleModule.load_from_checkpoint("best3.ckpt", weights_only=True).eval()
    assert small.hparams.k == 3 and len(small.member_selection.indices) == 3
    x_num, x_cat = torch.randn(8, full.spec.n_num_features), torch.zeros(8, len(full.spec.cat_cardinalities),
                                                                          dtype=torch.long)
    with torch.no_grad():
        expected = full(x_num, x_cat)[:, small.member_selection.indices]
        torch.testing.assert_close(small(x_num, x_cat), expected, rtol=1e-6, atol=1e-6)
    with pytest.raises(SystemExit, match="give the run's config with -c"):
        main(["select_members", f"--ckpt_path={ckpt}", "--k=3"])


def _trained_checkpoint(path, k: int) -> None:
    """A ``k``-member checkpoint saved by a Trainer (validated on 16 rows: nothing trained)."""
    L.seed_everything(0, verbose=False)
    x_num, x_cat = _inputs()
    loader = DataLoader(TabularTensorDataset(x_num, x_cat, torch.zeros(16, dtype=torch.long)), batch_size=16,
                        collate_fn=collate_batch)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=path.parent)
    trainer.validate(TabularEnsembleModule(SPEC, k=k, d_block=8), dataloaders=loader, verbose=False)
    trainer.save_checkpoint(path)


BELOW_ONE = ("at least 1 member must be kept; give --k 1 or more (--method greedy: any k >= 1, members may"
             " repeat; --method topk: 1 to the ensemble's member count).")
TOPK = ("--method topk keeps distinct members: --k {k} > the 6 members of {ckpt}; give --k from 1 to 6, or"
        " --method greedy (it selects with replacement: any k >= 1).")
SELECT_MEMBERS_K = [
    (["--k", "0"], "--k 0: " + BELOW_ONE),
    (["--k", "-1", "--method", "topk"], "--k -1: " + BELOW_ONE),
    (["--k", "100", "--method", "topk"], TOPK.replace("{k}", "100")),
    (["--k=7", "--method=topk", "--metric=error"], TOPK.replace("{k}", "7")),
]


def _select_members_inputs(tmp_path) -> tuple[str, str, str]:
    """``(checkpoint, config, data file)``: a 6-member checkpoint, and a config whose data file is absent.

    Reading the data would end in ``<data file>: does not exist``, so a refusal that reads
    otherwise came before the data was read.
    """
    ckpt, config, absent = tmp_path / "best.ckpt", tmp_path / "config.yaml", tmp_path / "absent.csv"
    _trained_checkpoint(ckpt, k=6)
    config.write_text("model:\n  class_path: ripieno.framework.TabularEnsembleModule\n"
                      "  init_args: {k: 6, d_block: 8}\n"
                      "data:\n  class_path: ripieno.datamodules.TabularDataModule\n"
                      f"  init_args: {{dataset: null, path: {absent}, target: y}}\n")
    return str(ckpt), str(config), str(absent)


@pytest.mark.parametrize(("k_args", "message"), SELECT_MEMBERS_K, ids=["k0", "k-1", "topk100", "topk7"])
def test_cli_select_members_refuses_a_bad_k_in_one_line_before_the_data_is_read(tmp_path, k_args, message):
    from ripieno.framework.cli.main import main

    ckpt, config, _ = _select_members_inputs(tmp_path)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(SystemExit) as caught:
        main(["select_members", "-c", config, "--ckpt_path", ckpt, *k_args])
    assert caught.value.code == "ripieno select_members: " + message.format(ckpt=ckpt)
    assert sorted(tmp_path.iterdir()) == before  # no checkpoint written


def test_cli_select_members_greedy_takes_more_members_than_were_trained(tmp_path):
    from ripieno.framework.cli.main import main

    ckpt, config, absent = _select_members_inputs(tmp_path)
    before = sorted(tmp_path.iterdir())
    with pytest.raises(SystemExit) as caught:  # with replacement k=100 of 6 is valid: the data is read next
        main(["select_members", "-c", config, "--ckpt_path", ckpt, "--k", "100"])
    missing = f"{absent}: does not exist; check data.init_args.path."
    assert caught.value.code == f"ripieno select_members: {missing}"
    assert sorted(tmp_path.iterdir()) == before
