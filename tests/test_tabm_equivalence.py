"""The whole TabM and TabM-mini networks equal the ``tabm`` package's on copied weights."""

import pytest
import rtdl_num_embeddings as rne
import tabm
import torch

from ripieno.framework.nn import TabularEnsembleNet

BINS = [torch.tensor([-2.0, 0.0, 1.0, 3.0]), torch.tensor([-1.0, 1.0]), torch.tensor([0.0, 0.5, 1.0])]
MAP = {
    "num_module.linear0.weight": "num_embeddings.linear_weight",
    "num_module.linear0.bias": "num_embeddings.linear_bias",
    "num_module.linear.weight": "num_embeddings.ple_weight",
    "backbone.blocks.0.0.weight": "blocks.0.weight", "backbone.blocks.0.0.bias": "blocks.0.bias",
    "backbone.blocks.0.0.r": "blocks.0.r", "backbone.blocks.0.0.s": "blocks.0.s",
    "backbone.blocks.1.0.weight": "blocks.3.weight", "backbone.blocks.1.0.bias": "blocks.3.bias",
    "backbone.blocks.1.0.r": "blocks.3.r", "backbone.blocks.1.0.s": "blocks.3.s",
    "backbone.affine.weight": "input_scaling",
    "output.bias": "head.bias",
}


@pytest.mark.parametrize("arch,adapter_layers", [("tabm", "all"), ("tabm-mini", "mini")])
def test_network_equals_tabm(arch, adapter_layers):
    torch.manual_seed(0)
    reference = tabm.TabM.make(
        n_num_features=3, cat_cardinalities=[4, 2], d_out=3, arch_type=arch, k=4, n_blocks=2,
        d_block=16, dropout=0.0,
        num_embeddings=rne.PiecewiseLinearEmbeddings(BINS, 8, activation=False, version="B"),
    ).double()
    ours = TabularEnsembleNet(3, [4, 2], 3, k=4, adapter="rank1", adapter_layers=adapter_layers,
                              n_blocks=2, d_block=16, dropout=0.0, bins=BINS, d_embedding=8).double()
    params = dict(ours.named_parameters())
    with torch.no_grad():
        for name, value in reference.named_parameters():
            value.normal_()  # every parameter non-trivial, the PLE part included
            if name == "output.weight":
                params["head.weight"].copy_(value.transpose(1, 2))
            else:
                params[MAP[name]].copy_(value)
    x_num = torch.randn(20, 3, dtype=torch.float64) * 2
    x_cat = torch.stack([torch.randint(0, 4, (20,)), torch.randint(0, 2, (20,))], 1)
    expected = reference(x_num, x_cat)
    got = ours(x_num, x_cat)
    assert got.shape == (20, 4, 3)
    assert torch.allclose(got, expected, atol=1e-10)
