"""Numeric and categorical encodings against rtdl_num_embeddings and closed forms."""

import numpy as np
import pytest
import rtdl_num_embeddings as rne
import torch
import torch.nn.functional as F

from ripieno.framework.nn.embeddings import (
    OneHotEncoding,
    PiecewiseLinearEmbeddings,
    PiecewiseLinearEncoding,
    compute_bins,
)

# rtdl warns (by design) about the single-bin features these tests include on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:The .*-th feature has just two bin edges:UserWarning")


def table(n=300, seed=0):
    """float32-representable columns with and without ties (ties shrink the quantile edges)."""
    rng = np.random.default_rng(seed)
    return np.stack([
        rng.normal(size=n),
        rng.integers(0, 5, size=n),  # heavy ties: duplicated quantiles are dropped
        np.round(rng.exponential(size=n), 1),  # skewed, some ties
        rng.integers(0, 2, size=n),  # binary: a single bin
    ], 1).astype(np.float32)


def assert_same_bins(ours, ref):
    assert len(ours) == len(ref)
    for got, want in zip(ours, ref, strict=True):
        assert got.dtype == torch.float32
        assert torch.equal(got, want.to(torch.float32)), (got, want)


# ---------------------------------------------------------------------------------------------
# 1. compute_bins == rtdl_num_embeddings.compute_bins
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n_bins", [2, 3, 7, 16, 48])  # 48: the TabM default
def test_quantile_bins_equal_rtdl(n_bins):
    x = table()
    ours = compute_bins(x, n_bins)
    ref = rne.compute_bins(torch.as_tensor(x), n_bins)
    assert_same_bins(ours, ref)  # bit for bit, as the implementation promises
    if n_bins >= 16:
        assert len(ours[1]) < 10  # 5 distinct values: ties really collapsed some edges


def test_tree_bins_regression_equal_rtdl():
    x = table()
    rng = np.random.default_rng(1)
    y = (np.sin(2 * x[:, 0]) + x[:, 1] * 0.5 + x[:, 2] + 0.1 * rng.normal(size=len(x))).astype(np.float32)
    kwargs = {"min_samples_leaf": 8}
    ours = compute_bins(x, 10, kind="tree", y=y, regression=True, tree_kwargs=kwargs)
    ref = rne.compute_bins(torch.as_tensor(x), 10, tree_kwargs=kwargs, y=torch.as_tensor(y), regression=True)
    assert_same_bins(ours, ref)
    assert len(ours[0]) > 3  # the tree split the informative column


def test_tree_bins_classification_equal_rtdl():
    x = table(seed=2)
    y = (x[:, 0] + 0.3 * x[:, 2] > 0.2).astype(np.int64) + (x[:, 1] > 2)
    kwargs = {"min_samples_leaf": 5, "random_state": 0}
    ours = compute_bins(x, 6, kind="tree", y=y, regression=False, tree_kwargs=kwargs)
    ref = rne.compute_bins(torch.as_tensor(x), 6, tree_kwargs=kwargs, y=torch.as_tensor(y), regression=False)
    assert_same_bins(ours, ref)


def test_tree_bins_need_target():
    with pytest.raises(ValueError, match="target"):
        compute_bins(table(), 4, kind="tree")
    with pytest.raises(ValueError, match="kind"):
        compute_bins(table(), 4, kind="uniform")


# ---------------------------------------------------------------------------------------------
# 2. PiecewiseLinearEncoding == rtdl
# ---------------------------------------------------------------------------------------------
BINS = [
    torch.tensor([-2.0, -0.5, 0.0, 1.0, 3.0]),  # 4 bins
    torch.tensor([-1.0, 1.0]),  # a single bin
    torch.tensor([0.0, 0.25, 1.0]),  # 2 bins
    torch.tensor([-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 4.0]),  # 6 bins (the widest)
]


def ple_inputs(n=40):
    torch.manual_seed(0)
    x = torch.randn(n, len(BINS)) * 3  # many values outside every bin range
    x[0] = torch.tensor([-10.0, -10.0, -10.0, -10.0])
    x[1] = torch.tensor([10.0, 10.0, 10.0, 10.0])
    x[2] = torch.stack([b[0] for b in BINS])  # the edges themselves
    x[3] = torch.stack([b[-1] for b in BINS])
    return x


def test_ple_equals_rtdl_after_removing_padding():
    enc = PiecewiseLinearEncoding(BINS)
    ref = rne.PiecewiseLinearEncoding(BINS)
    x = ple_inputs()
    z = enc(x)
    assert z.shape == (len(x), len(BINS), 6)
    assert enc.mask.sum().item() == sum(len(b) - 1 for b in BINS)
    torch.testing.assert_close(z[:, enc.mask], ref(x), rtol=0, atol=0)
    assert torch.equal(z[:, ~enc.mask], torch.zeros_like(z[:, ~enc.mask]))  # padding stays zero
    # and the padded layout is rtdl's internal one
    torch.testing.assert_close(z, ref.impl(x), rtol=0, atol=0)
    assert torch.equal(enc.mask, ref.impl.mask)


def test_ple_equal_bin_counts_equals_rtdl():
    bins = [torch.tensor([0.0, 1.0, 2.0]), torch.tensor([-1.0, 0.0, 5.0])]
    x = ple_inputs()[:, :2]
    enc = PiecewiseLinearEncoding(bins)
    assert bool(enc.mask.all())
    torch.testing.assert_close(enc(x).flatten(-2), rne.PiecewiseLinearEncoding(bins)(x), rtol=0, atol=0)


def test_ple_closed_form():
    enc = PiecewiseLinearEncoding([torch.tensor([0.0, 1.0, 3.0, 4.0]), torch.tensor([0.0, 2.0])])
    x = torch.tensor([[-1.0, -1.0], [0.5, 1.0], [2.0, 3.0], [5.0, 4.0]])
    want = torch.tensor([
        [[-1.0, 0.0, 0.0], [0.0, 0.0, -0.5]],  # first component unbounded below; single bin: min-max
        [[0.5, 0.0, 0.0], [0.0, 0.0, 0.5]],
        [[1.0, 0.5, 0.0], [0.0, 0.0, 1.5]],
        [[1.0, 1.0, 2.0], [0.0, 0.0, 2.0]],  # last component unbounded above
    ])
    torch.testing.assert_close(enc(x), want, rtol=0, atol=1e-7)


def test_ple_rejects_bad_bins():
    with pytest.raises(ValueError):
        PiecewiseLinearEncoding([torch.tensor([0.0, 1.0]), torch.tensor([2.0, 1.0])])
    with pytest.raises(ValueError):
        PiecewiseLinearEncoding([torch.tensor([0.0])])
    with pytest.raises(ValueError):
        PiecewiseLinearEncoding([])


# ---------------------------------------------------------------------------------------------
# 3. PiecewiseLinearEmbeddings == rtdl version B
# ---------------------------------------------------------------------------------------------
def copy_from_rtdl(ours, ref):
    with torch.no_grad():
        ours.linear_weight.copy_(ref.linear0.weight)
        ours.linear_bias.copy_(ref.linear0.bias)
        ours.ple_weight.copy_(ref.linear.weight)


def test_ple_embeddings_equal_rtdl_version_b():
    torch.manual_seed(0)
    ref = rne.PiecewiseLinearEmbeddings(BINS, 3, activation=False, version="B").double()
    assert sorted(n for n, _ in ref.named_parameters()) == ["linear.weight", "linear0.bias", "linear0.weight"]
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_()  # the PLE part starts at zero; make it non-trivial
    ours = PiecewiseLinearEmbeddings(BINS, 3).double()
    copy_from_rtdl(ours, ref)
    x = ple_inputs().double()
    y = ours(x)
    assert y.shape == (len(x), len(BINS), 3)
    torch.testing.assert_close(y, ref(x), rtol=1e-12, atol=1e-12)


def test_ple_embeddings_start_linear_like_rtdl():
    torch.manual_seed(0)
    ours = PiecewiseLinearEmbeddings(BINS, 3)
    assert torch.equal(ours.ple_weight, torch.zeros_like(ours.ple_weight))
    x = ple_inputs()
    torch.testing.assert_close(ours(x), x[..., None] * ours.linear_weight + ours.linear_bias)
    assert ours.linear_weight.abs().max() <= 3**-0.5


def test_ple_embeddings_members_equal_single_modules():
    torch.manual_seed(0)
    ours = PiecewiseLinearEmbeddings(BINS, 3, k=3).double()
    with torch.no_grad():
        for p in ours.parameters():
            p.normal_()
    assert ours.ple_weight.shape == (3, len(BINS), 6, 3)
    x = ple_inputs().double()
    y = ours(x)
    assert y.shape == (len(x), 3, len(BINS), 3)
    for j in range(3):
        single = PiecewiseLinearEmbeddings(BINS, 3).double()
        with torch.no_grad():
            single.linear_weight.copy_(ours.linear_weight[j])
            single.linear_bias.copy_(ours.linear_bias[j])
            single.ple_weight.copy_(ours.ple_weight[j])
        torch.testing.assert_close(y[:, j], single(x), rtol=1e-12, atol=1e-12)
        # and each member is rtdl's version-B embedding with that member's parameters
        ref = rne.PiecewiseLinearEmbeddings(BINS, 3, activation=False, version="B").double()
        with torch.no_grad():
            ref.linear0.weight.copy_(ours.linear_weight[j])
            ref.linear0.bias.copy_(ours.linear_bias[j])
            ref.linear.weight.copy_(ours.ple_weight[j])
        torch.testing.assert_close(y[:, j], ref(x), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# 4. OneHotEncoding
# ---------------------------------------------------------------------------------------------
def test_one_hot_equals_functional_one_hot():
    torch.manual_seed(0)
    cards = [3, 1, 5, 2]
    enc = OneHotEncoding(cards)
    assert enc.d_out == 11
    x = torch.stack([torch.randint(0, c, (50,)) for c in cards], 1)
    want = torch.cat([F.one_hot(x[:, j], c) for j, c in enumerate(cards)], 1).float()
    out = enc(x)
    assert out.dtype == torch.float32
    assert torch.equal(out, want)


# ---------------------------------------------------------------------------------------------
# 5. compute_bins errors
# ---------------------------------------------------------------------------------------------
def test_compute_bins_names_constant_column():
    x = table()
    x[:, 2] = 4.0
    with pytest.raises(ValueError, match="'income'"):
        compute_bins(x, 4, feature_names=["age", "n_kids", "income", "owner"])
    with pytest.raises(ValueError, match="#2"):  # without names: the column index
        compute_bins(x, 4)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_compute_bins_rejects_non_finite(bad):
    x = table()
    x[5, 0] = bad
    with pytest.raises(ValueError, match="NaN"):
        compute_bins(x, 4)


def test_compute_bins_rejects_bad_n_bins():
    x = table(n=20)
    for n_bins in (1, 20):
        with pytest.raises(ValueError, match="n_bins"):
            compute_bins(x, n_bins)


def test_compute_bins_rejects_non_2d_input():
    with pytest.raises(ValueError, match="2-D"):
        compute_bins(np.arange(10.0), 4)
