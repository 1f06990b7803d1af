"""EnsembleLinear and TabularEnsembleNet against tabm, closed forms and explicit per-member loops."""

import math

import pytest
import tabm
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, jvp, vmap

from ripieno.framework.nn import thin_products
from ripieno.framework.nn.ensemble_linear import (
    ADAPTERS,
    CPU_CHUNK_ELEMENTS,
    EnsembleLinear,
    _LoMEMatmul,
    init_scaling_,
    lometab_member_chunk,
)
from ripieno.framework.nn.tabular_backbone import TabularEnsembleNet

D = torch.float64
PARAM_NAMES = ("weight", "adapter_a", "adapter_b", "bias")


def randomise_(module, scale=1.0):
    """Give every parameter a non-trivial value (biases differ per member, adapters are large)."""
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, scale)
    return module


def lowrank_layer(adapter, compute, k=3, d_in=5, d_out=4, rank=2):
    return randomise_(EnsembleLinear(d_in, d_out, k, adapter=adapter, rank=rank, compute=compute).double())


def explicit(adapter, x, w, a, b, bias):
    """The definition, one member at a time (the loop exists only here, in the test)."""
    ys = []
    for k in range(x.shape[1]):
        low_rank = a[k] @ b[k].T
        w_k = w * (1.0 + low_rank) if adapter == "lometab" else w + low_rank
        ys.append(x[:, k] @ w_k.T + bias[k])
    return torch.stack(ys, 1)


def grads(y, inputs, grad_y):
    return torch.autograd.grad(y, inputs, grad_y)


# ---------------------------------------------------------------------------------------------
# 1. rank1 == tabm.LinearBatchEnsemble
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bias", [True, False])
def test_rank1_equals_tabm_linear_batch_ensemble(bias):
    torch.manual_seed(0)
    ref = tabm.LinearBatchEnsemble(5, 4, bias=bias, k=3, scaling_init="normal").double()
    ours = EnsembleLinear(5, 4, 3, adapter="rank1", bias=bias).double()
    randomise_(ref)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            getattr(ours, name).copy_(p)
    x = torch.randn(6, 3, 5, dtype=D, requires_grad=True)
    y_ref, y = ref(x), ours(x)
    assert y.shape == (6, 3, 4)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    grad_y = torch.randn_like(y)
    names = [n for n, _ in ref.named_parameters()]
    g_ref = grads(y_ref, [x, *[getattr(ref, n) for n in names]], grad_y)
    g = grads(y, [x, *[getattr(ours, n) for n in names]], grad_y)
    for got, want in zip(g, g_ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# 2. init_scaling_ == tabm.init_scaling_
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["normal", "random-signs"])
@pytest.mark.parametrize("chunks", [None, [2, 3, 4]])
def test_init_scaling_draws_like_tabm(kind, chunks):
    # Same RNG consumption as tabm.init_scaling_: with the same seed the draws are identical.
    torch.manual_seed(3)
    ours = init_scaling_(torch.empty(6, 9), kind, chunks)
    torch.manual_seed(3)
    ref = tabm.init_scaling_(torch.empty(6, 9), kind, chunks)
    assert torch.equal(ours, ref)


def test_init_scaling_ones_and_signs():
    assert torch.equal(init_scaling_(torch.empty(3, 7), "ones"), torch.ones(3, 7))
    assert torch.equal(tabm.init_scaling_(torch.empty(3, 7), "ones"), torch.ones(3, 7))
    torch.manual_seed(0)
    signs = init_scaling_(torch.empty(50, 40), "random-signs")
    assert set(signs.unique().tolist()) == {-1.0, 1.0}
    assert abs(signs.mean().item()) < 0.05  # equal probability: sd of the mean is 1/sqrt(2000)


@pytest.mark.parametrize("kind", ["normal", "random-signs"])
def test_init_scaling_chunks_structure(kind):
    torch.manual_seed(1)
    chunks = [1, 3, 2, 4]
    ours = init_scaling_(torch.empty(8, 10), kind, chunks)
    for t in (ours, tabm.init_scaling_(torch.empty(8, 10), kind, chunks)):
        start = 0
        firsts = []
        for size in chunks:
            block = t[:, start : start + size]
            assert torch.equal(block, block[:, :1].expand_as(block))  # one value per member and chunk
            firsts.append(block[:, 0])
            start += size
        # different members / chunks get different draws
        distinct = set(torch.stack(firsts).unique().tolist())
        if kind == "random-signs":
            assert distinct == {-1.0, 1.0}
        else:
            assert len(distinct) == 8 * len(chunks)
    with pytest.raises(ValueError):
        init_scaling_(torch.empty(2, 5), "normal", [2, 2])


def test_rank1_layer_first_scaling_uses_chunks():
    torch.manual_seed(0)
    layer = EnsembleLinear(6, 3, 4, adapter="rank1", rank1_init=("random-signs", "ones"), rank1_chunks=[2, 4])
    r = layer.r.detach()
    assert torch.equal(r[:, :2], r[:, :1].expand(-1, 2))
    assert torch.equal(r[:, 2:], r[:, 2:3].expand(-1, 4))
    assert set(r.unique().tolist()) <= {-1.0, 1.0}
    assert torch.equal(layer.s.detach(), torch.ones(4, 3))


# ---------------------------------------------------------------------------------------------
# 3. lometab == explicit per-member computation (every evaluation order)
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("adapter", ["lometab", "additive"])
@pytest.mark.parametrize("compute,batch", [("factored", 6), ("materialized", 6), ("auto", 6), ("auto", 64)])
def test_lowrank_adapters_equal_explicit_forward_and_grads(adapter, compute, batch):
    torch.manual_seed(0)
    layer = lowrank_layer(adapter, compute)
    if adapter == "lometab" and compute == "auto":
        assert layer.uses_factored(batch) == (batch * 3 <= 128)
    x = torch.randn(batch, 3, 5, dtype=D, requires_grad=True)
    params = [getattr(layer, n) for n in PARAM_NAMES]
    y = layer(x)
    y_ref = explicit(adapter, x, *params)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    grad_y = torch.randn_like(y)
    for got, want in zip(grads(y, [x, *params], grad_y), grads(y_ref, [x, *params], grad_y), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-11)


def test_lometab_auto_switches_evaluation_order():
    layer = EnsembleLinear(5, 4, 3, adapter="lometab", rank=3)
    assert layer.uses_factored(16) and not layer.uses_factored(17)
    assert EnsembleLinear(5, 4, 3, compute="factored").uses_factored(10_000)
    assert not EnsembleLinear(5, 4, 3, compute="materialized").uses_factored(1)


def lome_inputs(k=3, b=3, d_in=4, d_out=3, rank=2, chunk=3):
    torch.manual_seed(0)
    shapes = [(k, b, d_in), (d_out, d_in), (k, d_out, rank), (k, d_in, rank)]
    return (*(torch.randn(*s, dtype=D, requires_grad=True) for s in shapes), chunk)


def lome_reference(x, w, a, b, chunk=None):
    return torch.bmm(x, (w * (1.0 + a @ b.transpose(1, 2))).transpose(1, 2))


# chunk 1 and 2 of K=3 members: one member per pass, and a last pass shorter than the others.
CHUNKS = [1, 2, 3]


@pytest.mark.parametrize("chunk", CHUNKS)
def test_lome_matmul_forward_and_gradcheck(chunk):
    inputs = lome_inputs(chunk=chunk)
    torch.testing.assert_close(_LoMEMatmul.apply(*inputs), lome_reference(*inputs), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(_LoMEMatmul.apply, inputs)


@pytest.mark.parametrize("rank", [1, 2])  # rank 1 forms A_k B_k^T as a broadcast product
@pytest.mark.parametrize("chunk", CHUNKS)
@pytest.mark.parametrize("create_graph", [False, True])
def test_lome_matmul_grads_equal_autograd_of_definition(chunk, create_graph, rank):
    # Both backward paths (in-place for a plain backward, out of place under create_graph),
    # every subset of needed inputs (the first layer needs no input gradient).
    inputs = lome_inputs(chunk=chunk, rank=rank)
    tensors = inputs[:4]
    grad_y = torch.randn(3, 3, 3, dtype=D)
    expected = torch.autograd.grad(lome_reference(*tensors), tensors, grad_y)
    for wanted in ([0, 1, 2, 3], [1, 2, 3], [0], [2]):
        got = torch.autograd.grad(_LoMEMatmul.apply(*inputs), [tensors[i] for i in wanted], grad_y,
                                  create_graph=create_graph)
        for i, g in zip(wanted, got, strict=True):
            torch.testing.assert_close(g, expected[i], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("plain", [False, True])
def test_lome_matmul_grads_in_both_thin_orientations(monkeypatch, plain):
    """Whichever orientation ``plain_is_faster`` picks for the thin products, the gradients are exact."""
    monkeypatch.setattr(thin_products, "plain_is_faster", lambda a, columns: plain)
    inputs = lome_inputs(chunk=2, rank=2)
    tensors = inputs[:4]
    grad_y = torch.randn(3, 3, 3, dtype=D)
    expected = torch.autograd.grad(lome_reference(*tensors), tensors, grad_y)
    for create_graph in (False, True):
        got = torch.autograd.grad(_LoMEMatmul.apply(*inputs), tensors, grad_y, create_graph=create_graph)
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g, e, rtol=1e-12, atol=1e-12)


def test_thin_orientation_is_timed_per_key_without_drawing_random_numbers(monkeypatch):
    monkeypatch.setattr(thin_products, "_CHOICES", {})
    timed = []
    original = thin_products._time_key
    monkeypatch.setattr(thin_products, "_time_key",
                        lambda a, columns: timed.append(a.shape) or original(a, columns))
    g = torch.zeros(2, 16, 8)
    state = torch.get_rng_state()
    first = thin_products.plain_is_faster(g, 4)
    assert thin_products.plain_is_faster(g, 4) is first and len(timed) == 1  # both orientations, once
    thin_products.plain_is_faster(torch.zeros(2, 16, 8, dtype=torch.float64), 4)  # another dtype
    thin_products.plain_is_faster(torch.zeros(2, 8, 16).mT, 4)  # another layout
    assert len(timed) == 3 and len(thin_products._CHOICES) == 3
    assert torch.equal(torch.get_rng_state(), state)
    for a, b in ((torch.randn(2, 8, 16).mT, torch.randn(2, 8, 3)), (torch.randn(30, 7).T, torch.randn(30, 2)),
                 (torch.randn(30, 7), torch.randn(7, 200))):  # batched, 2-D, and a wide b (not timed)
        for plain in (False, True):
            monkeypatch.setattr(thin_products, "plain_is_faster", lambda a, columns, p=plain: p)
            torch.testing.assert_close(thin_products.thin_matmul(a, b), a @ b)
    assert len(timed) == 3


def test_a_key_is_timed_again_and_switches_only_past_the_margin(monkeypatch):
    """Hysteresis: one noisy timing never flips the choice; a clear win by the margin does."""
    monkeypatch.setattr(thin_products, "_CHOICES", {})
    margin = thin_products.PLAIN_MARGIN
    ratios = iter([1.0,  # first timing: on par, so the transposed form (the first choice) stays
                   1 / margin * 1.05,  # use 16: plain faster, but not by the margin: no switch
                   1 / margin * 0.9,  # use 256: plain faster by more than the margin: switch
                   margin * 0.95])  # use 4096: transposed faster, within the margin: plain stays
    timings = []
    monkeypatch.setattr(thin_products, "_time_key", lambda a, columns: timings.append(1) or next(ratios))
    a = torch.zeros(3, 8, 8)
    choices = [thin_products.plain_is_faster(a, 2) for _ in range(5000)]
    assert len(timings) == 1 + len(thin_products.RETIME_AT)  # the first use and the three re-timings
    assert choices[:256] == [False] * 256 and choices[256:] == [True] * (5000 - 256)  # the 257th use switched
    assert thin_products._CHOICES[((3, 8, 8), False, 2, torch.float32)].ratios == pytest.approx(
        (1.0, 1 / margin * 1.05, 1 / margin * 0.9, margin * 0.95))


def test_a_slow_spell_in_one_round_does_not_decide(monkeypatch):
    """Paired rounds: a preemption that slows one call moves one round's ratio, not the median."""
    spans = iter([5.0, 1.0,  # round 0: plain then swapped
                  1.0, 5.0,  # round 1: swapped then plain
                  5.0, 40.0,  # round 2: the swapped call was preempted
                  1.0, 5.0, 5.0, 1.0])
    monkeypatch.setattr(thin_products, "_seconds", lambda fn: next(spans))
    assert thin_products.paired_ratio(lambda: None, lambda: None, rounds=5) == 5.0  # plain 5x slower


def test_lome_matmul_gradcheck_forward_mode():
    inputs = lome_inputs(chunk=2)
    assert torch.autograd.gradcheck(
        _LoMEMatmul.apply, inputs, check_forward_ad=True, check_backward_ad=False,
        check_undefined_grad=False, check_batched_grad=False,
    )


@pytest.mark.parametrize(("chunk", "rank"), [(1, 2), (2, 2), (3, 2), (2, 1)])
def test_lome_matmul_double_backward(chunk, rank):
    # Double backward (gradient penalties, autograd.grad(create_graph=True) twice).
    assert torch.autograd.gradgradcheck(_LoMEMatmul.apply, lome_inputs(chunk=chunk, rank=rank))


def test_lometab_member_chunk_fits_the_cpu_budget():
    cpu = torch.device("cpu")
    assert lometab_member_chunk(32, 512, 512, cpu) == CPU_CHUNK_ELEMENTS // (512 * 512)
    assert lometab_member_chunk(32, 4096, 4096, cpu) == 1  # one member over budget: still 1
    assert lometab_member_chunk(5, 8, 8, cpu) == 5  # never more than K
    assert lometab_member_chunk(32, 512, 512, torch.device("meta")) == 32  # accelerators: one pass


def test_lometab_layer_with_chunked_members_equals_explicit(monkeypatch):
    # A budget of two member weights: K=5 runs in passes of 2, 2, 1 inside a whole layer.
    import ripieno.framework.nn.ensemble_linear as el

    monkeypatch.setattr(el, "CPU_CHUNK_ELEMENTS", 2 * 4 * 5)
    assert el.lometab_member_chunk(5, 4, 5, torch.device("cpu")) == 2
    torch.manual_seed(0)
    layer = lowrank_layer("lometab", "materialized", k=5)
    x = torch.randn(6, 5, 5, dtype=D, requires_grad=True)
    params = [x, *(getattr(layer, n) for n in PARAM_NAMES)]
    grad_y = torch.randn(6, 5, 4, dtype=D)
    y = layer(x)
    y_ref = explicit("lometab", *params)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    for g, g_ref in zip(grads(y, params, grad_y), grads(y_ref, params, grad_y), strict=True):
        torch.testing.assert_close(g, g_ref, rtol=1e-12, atol=1e-12)


def test_lometab_jvp_equals_explicit():
    torch.manual_seed(0)
    layer = lowrank_layer("lometab", "materialized")
    params = {n: p.detach() for n, p in layer.named_parameters()}
    x = torch.randn(6, 3, 5, dtype=D)
    primals = (x, *[params[n] for n in PARAM_NAMES])
    tangents = tuple(torch.randn_like(p) for p in primals)

    def ours(x, w, a, b, bias):
        return functional_call(layer, {"weight": w, "adapter_a": a, "adapter_b": b, "bias": bias}, (x,))

    out, tangent_out = jvp(ours, primals, tangents)
    out_ref, tangent_ref = jvp(lambda *args: explicit("lometab", *args), primals, tangents)
    torch.testing.assert_close(out, out_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(tangent_out, tangent_ref, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("compute", ["factored", "materialized"])
def test_lometab_vmap_over_stacked_parameters(compute):
    torch.manual_seed(0)
    layer = lowrank_layer("lometab", compute)
    params = {n: p.detach() for n, p in layer.named_parameters()}
    stacked = {n: torch.stack([p, p + 0.1 * torch.randn_like(p)]) for n, p in params.items()}
    x = torch.randn(6, 3, 5, dtype=D)
    out = vmap(lambda p: functional_call(layer, p, (x,)))(stacked)
    assert out.shape == (2, 6, 3, 4)
    for i in range(2):
        want = explicit("lometab", x, *[stacked[n][i] for n in PARAM_NAMES])
        torch.testing.assert_close(out[i], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("compute", ["factored", "materialized"])
def test_lometab_vmap_over_shared_weight_only(compute):
    # vmap over W alone (adapters unbatched), e.g. a sweep over perturbed shared weights.
    torch.manual_seed(0)
    layer = lowrank_layer("lometab", compute)
    params = {n: p.detach() for n, p in layer.named_parameters()}
    weights = torch.stack([params["weight"], torch.randn_like(params["weight"])])
    x = torch.randn(6, 3, 5, dtype=D)
    out = vmap(lambda w: functional_call(layer, {**params, "weight": w}, (x,)))(weights)
    for i in range(2):
        want = explicit("lometab", x, weights[i], params["adapter_a"], params["adapter_b"], params["bias"])
        torch.testing.assert_close(out[i], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("compute", ["factored", "materialized"])
def test_lometab_per_sample_grads_with_vmap(compute):
    torch.manual_seed(0)
    layer = lowrank_layer("lometab", compute)
    params = {n: p.detach() for n, p in layer.named_parameters()}
    x = torch.randn(4, 3, 5, dtype=D)

    def loss(p, xi):
        return functional_call(layer, p, (xi[None],)).pow(2).sum()

    per_sample = vmap(torch.func.grad(loss), in_dims=(None, 0))(params, x)
    for i in range(4):
        leaves = [params[n].clone().requires_grad_() for n in PARAM_NAMES]
        want = torch.autograd.grad(explicit("lometab", x[i : i + 1], *leaves).pow(2).sum(), leaves)
        for n, g in zip(PARAM_NAMES, want, strict=True):
            torch.testing.assert_close(per_sample[n][i], g, rtol=1e-11, atol=1e-11)


# ---------------------------------------------------------------------------------------------
# 4. rank >= 2 lometab contains every rank-1 (TabM) mask
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rank", [2, 3])
@pytest.mark.parametrize("compute", ["factored", "materialized"])
def test_lometab_expresses_rank1(rank, compute):
    torch.manual_seed(0)
    k, d_in, d_out = 3, 5, 4
    rank1 = randomise_(EnsembleLinear(d_in, d_out, k, adapter="rank1").double())
    lome = EnsembleLinear(d_in, d_out, k, adapter="lometab", rank=rank, compute=compute).double()
    with torch.no_grad():
        lome.weight.copy_(rank1.weight)
        lome.bias.copy_(rank1.bias)
        lome.adapter_a.zero_()
        lome.adapter_b.zero_()
        # 1 + A_k B_k^T = 1 + s_k r_k^T - 1 1^T = s_k r_k^T
        lome.adapter_a[:, :, 0] = rank1.s
        lome.adapter_a[:, :, 1] = -1.0
        lome.adapter_b[:, :, 0] = rank1.r
        lome.adapter_b[:, :, 1] = 1.0
    x = torch.randn(7, k, d_in, dtype=D)
    torch.testing.assert_close(lome(x), rank1(x), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lome.effective_weight(), rank1.effective_weight(), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# 5. lometab with A = 0 is the shared MLP layer
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compute", ["factored", "materialized", "auto"])
def test_lometab_with_zero_adapter_equals_shared(compute):
    torch.manual_seed(0)
    shared = randomise_(EnsembleLinear(5, 4, 3, adapter="shared").double())
    lome = lowrank_layer("lometab", compute)
    with torch.no_grad():
        lome.weight.copy_(shared.weight)
        lome.bias.copy_(shared.bias.expand(3, -1))
        lome.adapter_a.zero_()  # B stays random: A = 0 alone makes A B^T vanish
    x = torch.randn(6, 3, 5, dtype=D)
    torch.testing.assert_close(lome(x), shared(x), rtol=1e-12, atol=1e-12)
    # shared itself: all members see the same F.linear
    torch.testing.assert_close(shared(x), F.linear(x, shared.weight, shared.bias), rtol=0, atol=0)


def test_sigma_zero_lometab_starts_as_shared_layer():
    torch.manual_seed(0)
    lome = EnsembleLinear(5, 4, 3, adapter="lometab", sigma_init=0.0).double()
    x = torch.randn(2, 3, 5, dtype=D)
    torch.testing.assert_close(lome(x), F.linear(x, lome.weight, lome.bias[0]), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# 7. packed / shared
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("d_out", [4, 1])  # one output: the per-member head of a regression or binary task
def test_packed_equals_independent_linears(d_out):
    torch.manual_seed(0)
    layer = randomise_(EnsembleLinear(5, d_out, 3, adapter="packed").double())
    assert layer.weight.shape == (3, d_out, 5) and layer.bias.shape == (3, d_out)
    x = torch.randn(6, 3, 5, dtype=D, requires_grad=True)
    want = torch.stack([F.linear(x[:, k], layer.weight[k], layer.bias[k]) for k in range(3)], 1)
    got = layer(x)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    grad_y = torch.randn_like(want)
    got_grads = torch.autograd.grad(got, (x, layer.weight, layer.bias), grad_y)
    want_grads = torch.autograd.grad(want, (x, layer.weight, layer.bias), grad_y)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("adapter", ADAPTERS)
@pytest.mark.parametrize("d_out", [4, 1])
def test_every_gradient_has_its_parameters_strides(adapter, d_out):
    """DDP's reducer compares each gradient's strides with its parameter's, size-1 dimensions too; a
    mismatch warns "Grad strides do not match bucket view strides" and costs a copy every step."""
    layer = EnsembleLinear(5, d_out, 3, adapter=adapter, rank=2)
    for batch in (2, 64):  # lometab: the factored and the materialised forms
        layer.zero_grad(set_to_none=True)
        layer(torch.randn(batch, 3, 5)).square().sum().backward()
        for name, p in layer.named_parameters():
            assert p.grad is not None and p.grad.stride() == p.stride(), (name, batch)


@pytest.mark.parametrize("adapter", ["shared", "packed", "lometab"])
def test_no_bias(adapter):
    torch.manual_seed(0)
    layer = randomise_(EnsembleLinear(5, 4, 3, adapter=adapter, bias=False).double())
    assert layer.bias is None and layer.effective_bias() is None
    x = torch.randn(6, 3, 5, dtype=D)
    want = torch.einsum("bki,koi->bko", x, layer.effective_weight())
    torch.testing.assert_close(layer(x), want, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# 8. effective_weight
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("adapter", ADAPTERS)
def test_effective_weight_matches_member_weights(adapter):
    torch.manual_seed(0)
    k = 3
    layer = randomise_(EnsembleLinear(5, 4, k, adapter=adapter, rank=2).double())
    p = dict(layer.named_parameters())
    members = []
    for j in range(k):
        if adapter == "shared":
            members.append(p["weight"])
        elif adapter == "packed":
            members.append(p["weight"][j])
        elif adapter == "rank1":
            members.append(p["weight"] * torch.outer(p["s"][j], p["r"][j]))
        elif adapter == "lometab":
            members.append(p["weight"] * (1 + p["adapter_a"][j] @ p["adapter_b"][j].T))
        else:
            members.append(p["weight"] + p["adapter_a"][j] @ p["adapter_b"][j].T)
    want = torch.stack(members)
    w = layer.effective_weight()
    assert w.shape == (k, 4, 5)
    torch.testing.assert_close(w, want, rtol=1e-12, atol=1e-12)
    # and the forward pass uses exactly these member weights and biases
    x = torch.randn(6, k, 5, dtype=D)
    bias = layer.effective_bias()
    ref = torch.stack([F.linear(x[:, j], want[j], bias[j]) for j in range(k)], 1)
    torch.testing.assert_close(layer(x), ref, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# 9. initialisation statistics (module docstring)
# ---------------------------------------------------------------------------------------------
def low_rank_std_tolerance(rank, k, d_out, d_in, z=4.0):
    """Relative tolerance of the sample std of the K x d_out x d_in entries of A_k B_k^T.

    With i.i.d. N(0, s^2) factors, an entry M = a.b (r terms) has E M^2 = r s^4 and
    Var M^2 = (2r^2 + 6r) s^8; two entries sharing a row of A (or of B) have
    Cov(M^2, M'^2) = 2r s^8 and are otherwise independent (members are independent). So the
    mean of the N = K d_out d_in squares has relative variance
    (2 + 6/r + 2 (d_in + d_out - 2) / r) / N, and the std (its square root) half that relative
    error: z standard errors of the std are z/2 * sqrt(that).
    """
    n = k * d_out * d_in
    return z / 2 * math.sqrt((2 + 6 / rank + 2 * (d_in + d_out - 2) / rank) / n)


def low_rank_of(layer):
    with torch.no_grad():
        return layer.adapter_a @ layer.adapter_b.transpose(1, 2)


def assert_low_rank_std(layer, expected):
    low_rank = low_rank_of(layer)
    k, d_out, d_in = low_rank.shape
    tol = low_rank_std_tolerance(layer.rank, k, d_out, d_in)
    assert low_rank.std().item() == pytest.approx(expected, rel=tol)
    # entries are uncorrelated with mean 0: the sample mean has std expected / sqrt(N)
    assert abs(low_rank.mean().item()) < 4 * expected / math.sqrt(low_rank.numel())


def test_std_tolerance_is_calibrated():
    """The derived tolerance covers the spread of the std over many draws, and is not loose."""
    torch.manual_seed(0)
    rank, k, d_out, d_in = 2, 2, 24, 32
    stds = torch.tensor([low_rank_of(EnsembleLinear(d_in, d_out, k, rank=rank, sigma_init=1.0)).std().item()
                         for _ in range(400)])
    predicted = low_rank_std_tolerance(rank, k, d_out, d_in, z=1.0)  # one standard error, relative
    assert stds.std().item() / stds.mean().item() == pytest.approx(predicted, rel=0.2)


@pytest.mark.parametrize("rank", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("sigma", [0.1, 0.3, 1.0, 3.0])
def test_lometab_plain_init_std_is_sqrt_rank_sigma_squared(rank, sigma):
    torch.manual_seed(rank)
    layer = EnsembleLinear(256, 192, 8, adapter="lometab", rank=rank, sigma_init=sigma)
    assert layer.adapter_init == "plain"  # the default: the paper's draw
    for factor in (layer.adapter_a, layer.adapter_b):  # i.i.d. entries: std error 1/sqrt(2n)
        assert factor.std().item() == pytest.approx(sigma, rel=4 / math.sqrt(2 * factor.numel()))
    assert_low_rank_std(layer, math.sqrt(rank) * sigma**2)


@pytest.mark.parametrize("rank", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("sigma", [0.3, 3.0])
def test_lometab_rank_normalized_init_std_is_sigma_for_every_rank(rank, sigma):
    torch.manual_seed(rank)
    layer = EnsembleLinear(512, 512, 8, adapter="lometab", rank=rank, sigma_init=sigma,
                           adapter_init="rank_normalized")
    assert_low_rank_std(layer, sigma)
    # the shared weight is tabm's U(-1/sqrt(in), 1/sqrt(in))
    assert layer.weight.abs().max().item() <= 512**-0.5
    assert layer.weight.std().item() == pytest.approx((3 * 512) ** -0.5, rel=0.02)


@pytest.mark.parametrize("rank", [1, 4, 16])
def test_additive_plain_is_the_lometab_plain_draw(rank):
    sigma = 0.3
    layers = {}
    for adapter in ("lometab", "additive"):
        torch.manual_seed(0)
        layers[adapter] = EnsembleLinear(256, 128, 8, adapter=adapter, rank=rank, sigma_init=sigma)
    assert layers["additive"].adapter_init == "plain"
    for name in ("weight", "adapter_a", "adapter_b", "bias"):
        assert torch.equal(getattr(layers["additive"], name), getattr(layers["lometab"], name)), name
    assert_low_rank_std(layers["additive"], math.sqrt(rank) * sigma**2)


@pytest.mark.parametrize("rank", [1, 4, 16])
def test_additive_relative_matches_relative_size_of_rank_normalized_lometab(rank):
    torch.manual_seed(0)
    sigma, d_in = 0.3, 512
    layer = EnsembleLinear(d_in, 256, 8, adapter="additive", rank=rank, sigma_init=sigma,
                           adapter_init="relative")
    assert_low_rank_std(layer, sigma / math.sqrt(3 * d_in))
    tol = low_rank_std_tolerance(rank, 8, 256, d_in) + 0.01  # + sampling error of std(W)
    assert low_rank_of(layer).std().item() / layer.weight.std().item() == pytest.approx(sigma, rel=tol)


@pytest.mark.parametrize(("adapter", "bad", "allowed"), [
    ("lometab", "relative", "'plain', 'rank_normalized'"),
    ("additive", "rank_normalized", "'plain', 'relative'"),
    ("lometab", "normal", "'plain', 'rank_normalized'"),
    ("rank1", "normal", "'plain', 'rank_normalized', 'relative'"),
])
def test_bad_adapter_init_names_the_allowed_values(adapter, bad, allowed):
    with pytest.raises(ValueError, match=f"adapter_init.*{bad}.*{allowed}"):
        EnsembleLinear(5, 4, 3, adapter=adapter, adapter_init=bad)


def test_adapter_init_is_ignored_without_low_rank_factors():
    for adapter in ("shared", "rank1", "packed"):
        torch.manual_seed(0)
        ignored = EnsembleLinear(5, 4, 3, adapter=adapter, adapter_init="relative")
        torch.manual_seed(0)
        default = EnsembleLinear(5, 4, 3, adapter=adapter)
        for (name, p), q in zip(ignored.named_parameters(), default.parameters(), strict=True):
            assert torch.equal(p, q), (adapter, name)


def test_backbone_threads_and_checks_adapter_init():
    net = TabularEnsembleNet(3, [4], d_out=2, k=4, d_block=8, n_blocks=2, adapter="additive",
                             adapter_init="relative", rank=2)
    layers = [m for m in net.blocks if isinstance(m, EnsembleLinear)]
    assert [m.adapter_init for m in layers] == ["relative", "relative"]
    assert "adapter_init=relative" in repr(layers[0])
    assert TabularEnsembleNet(3, [4], d_out=2, k=4, d_block=8).blocks[0].adapter_init == "plain"
    # checked even when no layer ends up with low-rank factors (TabM-mini's shared MLP)
    with pytest.raises(ValueError, match="'plain', 'rank_normalized'"):
        TabularEnsembleNet(3, [4], d_out=2, k=4, d_block=8, adapter_layers="mini",
                           adapter_init="relative")


@pytest.mark.parametrize("adapter", ["rank1", "lometab", "additive"])
def test_member_biases_start_identical(adapter):
    torch.manual_seed(0)
    layer = EnsembleLinear(16, 8, 5, adapter=adapter)
    bias = layer.bias.detach()
    assert torch.equal(bias, bias[:1].expand_as(bias))
    assert bias.abs().max() <= 16**-0.5 and bias.std() > 0


def test_packed_members_get_their_own_draws():
    torch.manual_seed(0)
    layer = EnsembleLinear(16, 8, 3, adapter="packed")
    assert not torch.equal(layer.weight[0], layer.weight[1])
    assert not torch.equal(layer.bias[0], layer.bias[1])


# ---------------------------------------------------------------------------------------------
# 10. bad inputs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(6, 5), (6, 2, 5), (6, 3, 4), (1, 6, 3, 5)])
def test_wrong_input_shape_names_expected_shape(shape):
    layer = EnsembleLinear(5, 4, 3)
    with pytest.raises(ValueError, match=r"\(batch, 3, 5\)"):
        layer(torch.randn(*shape))


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="lowrank"):
        EnsembleLinear(5, 4, 3, adapter="lowrank")
    with pytest.raises(ValueError, match="rank"):
        EnsembleLinear(5, 4, 3, rank=0)
    with pytest.raises(ValueError, match="compute"):
        EnsembleLinear(5, 4, 3, compute="fast")
    with pytest.raises(ValueError, match="sigma_init"):
        EnsembleLinear(5, 4, 3, sigma_init=-0.1)


# ---------------------------------------------------------------------------------------------
# 11. autocast (bf16) on the custom Function path
# ---------------------------------------------------------------------------------------------
def test_lometab_materialized_under_bf16_autocast():
    torch.manual_seed(0)
    layer = EnsembleLinear(16, 8, 3, adapter="lometab", rank=2, compute="materialized")
    x = torch.randn(64, 3, 16)  # batch*(rank+1) > 128 would also select this path under auto
    params = [getattr(layer, n) for n in PARAM_NAMES]
    y32 = layer(x)
    g32 = torch.autograd.grad(y32.sum(), params)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y16 = layer(x)
    # the matmul ran in bf16: not bit-equal to fp32, but close at bf16 precision
    assert not torch.equal(y16.float(), y32)
    torch.testing.assert_close(y16.float(), y32, rtol=3e-2, atol=3e-2)
    g16 = torch.autograd.grad(y16.float().sum(), params)
    for p, g, g_ref in zip(params, g16, g32, strict=True):
        assert g.dtype == torch.float32 == p.dtype
        torch.testing.assert_close(g, g_ref, rtol=5e-2, atol=5e-2 * g_ref.abs().max().item())


# ---------------------------------------------------------------------------------------------
# 12. TabularEnsembleNet
# ---------------------------------------------------------------------------------------------
BINS = [torch.tensor([-2.0, 0.0, 1.0, 3.0]), torch.tensor([-1.0, 1.0]), torch.tensor([0.0, 0.5, 1.0])]


def net_inputs(n=5):
    torch.manual_seed(1)
    x_num = torch.randn(n, 3, dtype=D) * 2
    x_cat = torch.stack([torch.randint(0, 4, (n,)), torch.randint(0, 2, (n,))], 1)
    return x_num, x_cat


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_net_output_shape(adapter):
    torch.manual_seed(0)
    net = TabularEnsembleNet(3, [4, 2], 2, k=4, adapter=adapter, n_blocks=2, d_block=8, bins=BINS,
                             d_embedding=4).double()
    assert net(*net_inputs()).shape == (5, 4, 2)


def test_net_adapter_layers_first():
    net = TabularEnsembleNet(3, [4], 2, k=4, adapter="lometab", adapter_layers="first", n_blocks=3,
                             d_block=8)
    linears = [m for m in net.blocks if isinstance(m, EnsembleLinear)]
    assert [m.adapter for m in linears] == ["lometab", "shared", "shared"]
    assert net.head.adapter == "packed"
    net_all = TabularEnsembleNet(3, [4], 2, k=4, adapter="lometab", n_blocks=3, d_block=8)
    assert [m.adapter for m in net_all.blocks if isinstance(m, EnsembleLinear)] == ["lometab"] * 3


def test_deep_ensemble_members_are_independent():
    torch.manual_seed(0)
    net = TabularEnsembleNet(3, [4, 2], 2, k=3, adapter="packed", n_blocks=2, d_block=8, dropout=0.0,
                             bins=BINS, d_embedding=4, share_embeddings=False).double().eval()
    member_params = list(net.parameters())
    assert all(p.shape[0] == 3 for p in member_params)  # every parameter has a member axis
    with torch.no_grad():
        for p in member_params:
            p.normal_(0, 0.5)
            p[1] = p[0]
    x = net_inputs()
    y = net(*x)
    torch.testing.assert_close(y[:, 1], y[:, 0], rtol=0, atol=0)
    assert not torch.allclose(y[:, 2], y[:, 0])
    for name, p in net.named_parameters():  # member 0's embedding, hidden layers and head, one at a time
        with torch.no_grad():
            p[0] += 1.0
        y_new = net(*x)
        torch.testing.assert_close(y_new[:, 1:], y[:, 1:], rtol=0, atol=0, msg=name)
        assert not torch.allclose(y_new[:, 0], y[:, 0]), name
        with torch.no_grad():
            p[0] -= 1.0


def test_k1_shared_is_a_plain_mlp():
    torch.manual_seed(0)
    net = TabularEnsembleNet(3, [4, 2], 2, k=1, adapter="shared", n_blocks=2, d_block=8, dropout=0.0).double()
    randomise_(net)
    mlp = nn.Sequential(nn.Linear(9, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).double()
    with torch.no_grad():
        mlp[0].weight.copy_(net.blocks[0].weight)
        mlp[0].bias.copy_(net.blocks[0].bias)
        mlp[2].weight.copy_(net.blocks[3].weight)
        mlp[2].bias.copy_(net.blocks[3].bias)
        mlp[4].weight.copy_(net.head.weight[0])
        mlp[4].bias.copy_(net.head.bias[0])
    x_num, x_cat = net_inputs()
    features = torch.cat([x_num, F.one_hot(x_cat[:, 0], 4), F.one_hot(x_cat[:, 1], 2)], 1).double()
    y = net(x_num, x_cat)
    assert y.shape == (5, 1, 2)
    torch.testing.assert_close(y[:, 0], mlp(features), rtol=1e-12, atol=1e-12)


def test_lometab_jvp_in_input_only_matches_finite_differences():
    """Forward mode with tangents on the input alone (parameters carry none)."""
    torch.manual_seed(0)
    layer = EnsembleLinear(5, 4, 3, adapter="lometab", rank=2, compute="materialized").double()
    x = torch.randn(64, 3, 5, dtype=torch.float64)
    tangent = torch.randn_like(x)
    _, jvp_out = torch.func.jvp(layer, (x,), (tangent,))
    eps = 1e-6
    finite = (layer(x + eps * tangent) - layer(x - eps * tangent)) / (2 * eps)
    assert torch.allclose(jvp_out, finite, atol=1e-7)


def test_first_layer_input_gradient_is_skipped_but_parameters_are_exact():
    torch.manual_seed(0)
    layer = EnsembleLinear(6, 5, 4, adapter="lometab", rank=3, compute="materialized").double()
    x = torch.randn(40, 4, 6, dtype=torch.float64)  # raw features: no grad needed
    grads = torch.autograd.grad(layer(x).square().sum(), list(layer.parameters()))
    w_k = layer.weight * (1 + layer.adapter_a @ layer.adapter_b.transpose(1, 2))
    explicit = torch.einsum("bki,koi->bko", x, w_k) + layer.bias
    expected = torch.autograd.grad(explicit.square().sum(), list(layer.parameters()))
    for got, want in zip(grads, expected, strict=True):
        assert torch.allclose(got, want, atol=1e-10)
