"""``compile: true`` on TabularEnsembleModule: the same numbers and the same checkpoints as eager.

Every comparison runs the real ``torch.compile`` (inductor) against the eager module on the same
weights and rows. A cold inductor compile of one tiny network takes 10-30 s on this 2-core CPU, so
the default adapter (``lometab``, through its autograd Function) and the recipe run always and the
other adapters are marked ``slow``; every adapter's member outputs, loss and gradients are compared
in the training-step test (dropout off), the evaluation-mode checks (inference mode, pickling)
run on ``lometab``.
"""

import copy
import pickle

import pytest
import torch
from torch._dynamo.utils import counters

from ripieno.framework import TabularEnsembleModule, TabularSpec
from ripieno.framework.cli import main

RTOL, ATOL = 1e-4, 1e-5

# (id, module arguments): every adapter of EnsembleLinear, both lometab orders and TabM-mini.
VARIANTS = [
    pytest.param({"adapter": "lometab", "compute": "materialized"}, id="lometab"),
    pytest.param({"adapter": "rank1"}, id="rank1", marks=pytest.mark.slow),
    pytest.param({"adapter": "lometab", "compute": "factored"}, id="lometab-factored",
                 marks=pytest.mark.slow),
    pytest.param({"adapter": "additive"}, id="additive", marks=pytest.mark.slow),
    pytest.param({"adapter": "shared"}, id="shared", marks=pytest.mark.slow),
    pytest.param({"adapter": "packed", "share_embeddings": False}, id="packed", marks=pytest.mark.slow),
    pytest.param({"adapter": "rank1", "adapter_layers": "mini"}, id="mini", marks=pytest.mark.slow),
]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch (no recompile limit reached by earlier tests) and counts its graphs."""
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _spec() -> TabularSpec:
    return TabularSpec(task="multiclass", n_num_features=3, cat_cardinalities=[4, 2], n_classes=3,
                       bins=[[-2.0, 0.0, 1.0, 3.0], [-1.0, 1.0], [0.0, 0.5, 1.0]])


def _batch(n: int = 32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"x_num": torch.randn(n, 3, generator=g),
            "x_cat": torch.stack([torch.randint(0, 4, (n,), generator=g),
                                  torch.randint(0, 2, (n,), generator=g)], 1),
            "y": torch.randint(0, 3, (n,), generator=g)}


def _pair(variant: dict, **kwargs) -> tuple[TabularEnsembleModule, TabularEnsembleModule]:
    """An eager module and a compiled one holding the eager one's weights (loaded by state_dict)."""
    torch.manual_seed(0)
    args = {"k": 3, "d_block": 16, "n_blocks": 2, "d_embedding": 4, "rank": 2, **variant, **kwargs}
    eager = TabularEnsembleModule(_spec(), **args)
    compiled = TabularEnsembleModule(_spec(), **args, compile=True)
    compiled.load_state_dict(eager.state_dict())
    return eager, compiled


def _compiled_graphs() -> int:
    return int(counters["stats"]["unique_graphs"])


@pytest.mark.parametrize("variant", VARIANTS[:1])  # every adapter's outputs: the training-step test
def test_compiled_outputs_equal_eager_in_evaluation(variant):
    eager, compiled = _pair(variant)
    eager.eval(), compiled.eval()
    assert compiled._compiled_net is None  # nothing is compiled before the first step
    batch = _batch()
    with torch.inference_mode():  # as the Trainer's validation, test and predict loops run
        expected, got = eager.forward_members(batch), compiled.forward_members(batch)
    assert _compiled_graphs() >= 1 and compiled._compiled_net is not None
    torch.testing.assert_close(got, expected, rtol=RTOL, atol=ATOL)
    # the compiled module's state is the eager one's: same keys, no _orig_mod, and it pickles
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert not any("_orig_mod" in key for key in compiled.state_dict())
    for clone in (pickle.loads(pickle.dumps(compiled)), copy.deepcopy(compiled)):
        assert clone._compiled_net is None and clone.compile_mode == "default"
        torch.testing.assert_close(clone.state_dict(), compiled.state_dict())


@pytest.mark.parametrize("variant", VARIANTS)
def test_compiled_training_step_equals_eager(variant):
    eager, compiled = _pair(variant, dropout=0.0)  # no dropout: the two would draw different masks
    batch = _batch()
    optimizers = []
    losses = []
    outputs = []
    for model in (eager, compiled):
        model.train()
        out = model.step(batch, "train")
        loss = out["loss"]
        outputs.append(out["member_outputs"].detach())
        loss.backward()
        losses.append(loss.detach())
        optimizer = model.configure_optimizers()
        optimizer.step()
        optimizers.append(optimizer)
    assert _compiled_graphs() >= 1
    torch.testing.assert_close(outputs[1], outputs[0], rtol=RTOL, atol=ATOL)  # every member's output
    torch.testing.assert_close(losses[1], losses[0], rtol=RTOL, atol=ATOL)
    eager_params, compiled_params = dict(eager.named_parameters()), dict(compiled.named_parameters())
    for name, param in eager_params.items():
        torch.testing.assert_close(compiled_params[name].grad, param.grad, rtol=RTOL, atol=ATOL, msg=name)
    # the compiled graph reads the updated weights (no stale copies): the next losses agree too
    with torch.no_grad():
        after = [model.step(batch, "train")["loss"] for model in (eager, compiled)]
    torch.testing.assert_close(after[1], after[0], rtol=RTOL, atol=ATOL)
    assert not torch.allclose(after[0], losses[0])  # the step moved the weights


def test_compile_false_changes_nothing():
    torch.manual_seed(0)
    model = TabularEnsembleModule(_spec(), k=3, d_block=16)
    assert model.compile_mode is None and model.hparams.compile is False
    model.eval()
    batch = _batch()
    with torch.no_grad():
        torch.testing.assert_close(model.forward_members(batch), model(batch["x_num"], batch["x_cat"]))
    assert _compiled_graphs() == 0 and model._compiled_net is None


def _fit(tmp_path, *extra: str):
    main(["fit", "-c", "tabular/lometab_churn", "--trainer.max_epochs=1", "--trainer.limit_train_batches=2",
          "--trainer.limit_val_batches=2", "--data.init_args.max_rows=600",
          "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
          "--test_after_fit=false", f"--trainer.default_root_dir={tmp_path}", *extra])
    (path,) = tmp_path.rglob("last.ckpt")
    return path


def test_recipe_trains_with_compile_and_checkpoints_like_eager(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    compiled_path = _fit(tmp_path / "compiled", "--model.init_args.compile=true")
    assert _compiled_graphs() >= 1  # the steps ran the compiled network
    eager_path = _fit(tmp_path / "eager")
    compiled_ckpt = torch.load(compiled_path, weights_only=True)
    eager_ckpt = torch.load(eager_path, weights_only=True)
    assert list(compiled_ckpt["state_dict"]) == list(eager_ckpt["state_dict"])
    assert compiled_ckpt["hyper_parameters"]["compile"] is True
    assert eager_ckpt["hyper_parameters"]["compile"] is False
    assert ({k: v for k, v in compiled_ckpt["hyper_parameters"].items() if k != "compile"}
            == {k: v for k, v in eager_ckpt["hyper_parameters"].items() if k != "compile"})
    # either checkpoint loads into either kind of module
    for path, compile_ in ((compiled_path, False), (eager_path, True)):
        model = TabularEnsembleModule.load_from_checkpoint(path, weights_only=True, compile=compile_)
        assert (model.compile_mode is not None) is compile_
        torch.testing.assert_close(model.state_dict(), torch.load(path, weights_only=True)["state_dict"])


def test_modules_of_other_shapes_do_not_share_the_recompile_limit(monkeypatch):
    """Past dynamo's recompile limit a function runs eager; each module compiles a code object of its own."""
    import functools

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))  # fast
    graphs = []
    with torch._dynamo.config.patch(recompile_limit=2):
        for width in (8, 12, 16, 20):
            model = TabularEnsembleModule(_spec(), k=2, d_block=width, adapter="rank1", compile=True).eval()
            before = counters["stats"]["unique_graphs"]
            with torch.inference_mode():
                model.forward_members(_batch(4))
            graphs.append(counters["stats"]["unique_graphs"] - before)
    assert graphs == [1, 1, 1, 1]  # a shared function would stop compiling after two shapes


def test_a_checkpoint_is_not_refused_for_its_compile_setting():
    """compile changes how the network runs, not what it is: no mismatch, also for older checkpoints."""
    from ripieno.framework.runner.resume_check import compare_hparams

    config = {"_class_path": "ripieno.framework.TabularEnsembleModule", "k": 8, "compile": False,
              "compile_mode": "default"}
    compiled = {**config, "compile": True, "compile_mode": "max-autotune"}
    older = {k: v for k, v in config.items() if not k.startswith("compile")}
    assert compare_hparams(compiled, config) == [] and compare_hparams(older, config) == []
    assert [d.key for d in compare_hparams({**compiled, "k": 4}, config)] == ["k"]  # others still count
