"""Routed MLP copies against explicitly constructed routed networks, and the baselines'
exact identities (diagonal kernel == independent training)."""

import pytest
import torch
import torch.nn.functional as F

from ripieno.framework.mcover import PermutationBank, make_kernel
from ripieno.framework.mcover.routed_mlp import RoutedMLP, block_index, copy_cross_entropy

M = 4


def _explicit_forward(net, x, perms):
    """Copy by copy, block by block, with Python loops: the routed network by definition."""
    blocks = [block_index(net.widths[layer], net.n_blocks) for layer in range(len(net.widths))]
    outputs = []
    for a in range(net.m):
        h_all = [x.flatten(1) @ net.weights[0][c] + net.biases[0][c] for c in range(net.m)]
        for layer in range(1, net.n_layers):
            acts = [torch.relu(h) for h in h_all]
            new = []
            for dest in range(net.m):
                cols = []
                for i in range(net.widths[layer]):
                    j = int(blocks[layer][i])
                    src = int(perms[(layer - 1) * net.n_blocks + j, dest])
                    cols.append(acts[src][:, i])
                inp = torch.stack(cols, 1)
                new.append(inp @ net.weights[layer][dest] + net.biases[layer][dest])
            h_all = new
        outputs.append(h_all[a])
    return torch.stack(outputs, 1)


@pytest.mark.parametrize("n_blocks", [1, 3])
def test_exact_routing_and_its_gradients_equal_the_explicit_routed_network(n_blocks):
    torch.manual_seed(0)
    net = RoutedMLP(5, [6, 6], 3, m=M, n_blocks=n_blocks)
    bank = PermutationBank.draw(make_kernel("uniform", M), net.n_slots, 1, torch.Generator().manual_seed(1))
    perms = bank.at(0)
    assert not (perms == torch.arange(M)).all()  # a real routing
    x, y = torch.randn(7, 5), torch.randint(0, 3, (7,))
    out = net(x, perms)
    explicit = _explicit_forward(net, x, perms)
    assert torch.allclose(out, explicit, atol=1e-6)
    grads = torch.autograd.grad(copy_cross_entropy(out, y), list(net.parameters()))
    explicit_grads = torch.autograd.grad(copy_cross_entropy(explicit, y), list(net.parameters()))
    for g, e in zip(grads, explicit_grads, strict=True):
        assert torch.allclose(g, e, atol=1e-6)


def test_block_message_equals_the_mean_over_the_bank_of_exact_routes():
    torch.manual_seed(0)
    net = RoutedMLP(5, [8], 3, m=M, n_blocks=2)  # one routed layer: its output is linear in its input
    bank = PermutationBank.draw(make_kernel("gaussian_ring", M, sigma=1.0), net.n_slots, 16,
                                torch.Generator().manual_seed(2))
    x = torch.randn(6, 5)
    block_message = net(x, bank.mixing())
    mean_exact = torch.stack([net(x, bank.at(s)) for s in range(bank.size)]).mean(0)
    assert torch.allclose(block_message, mean_exact, atol=1e-5)


def test_diagonal_kernel_is_m_independent_trainings():
    torch.manual_seed(0)
    net = RoutedMLP(5, [8, 8], 3, m=3, n_blocks=2)
    singles = [net.copy_network(a) for a in range(3)]
    bank = PermutationBank.draw(make_kernel("diagonal", 3), net.n_slots, 4, torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    single_opts = [torch.optim.SGD(s.parameters(), lr=0.1) for s in singles]
    g = torch.Generator().manual_seed(3)
    for step in range(6):
        x, y = torch.randn(10, 5, generator=g), torch.randint(0, 3, (10,), generator=g)
        opt.zero_grad()
        copy_cross_entropy(net(x, bank.at(step)), y).backward()
        opt.step()
        for s, o in zip(singles, single_opts, strict=True):
            o.zero_grad()
            F.cross_entropy(s(x), y).backward()
            o.step()
    for a, s in enumerate(singles):
        trained = net.copy_network(a)
        for p, q in zip(trained.parameters(), s.parameters(), strict=True):
            assert torch.allclose(p, q, atol=1e-6)


def test_collapse_is_the_base_network_with_mean_weights():
    torch.manual_seed(0)
    net = RoutedMLP(5, [8], 3, m=M)
    collapsed = net.collapse()
    x = torch.randn(4, 5)
    expected = torch.relu(x @ net.weights[0].mean(0) + net.biases[0].mean(0)) @ net.weights[1].mean(0)
    assert torch.allclose(collapsed(x), expected + net.biases[1].mean(0), atol=1e-6)
    same = RoutedMLP(5, [8], 3, m=M, init="identical")
    for a in range(M):
        assert torch.allclose(same(x)[:, a], same.collapse()(x), atol=1e-6)


def test_committee_machine_readout_votes_and_collapse():
    torch.manual_seed(0)
    net = RoutedMLP(6, [], 3, m=M, head="committee", committee_size=5, n_blocks=3)
    x = torch.randn(9, 6)
    pre = net(x, return_hidden=True)  # (B, M, 15)
    assert torch.allclose(net(x), torch.tanh(pre).view(9, M, 3, 5).sum(-1), atol=1e-6)
    votes = net.readout.vote(pre)
    assert torch.equal(votes, torch.sign(pre).view(9, M, 3, 5).sum(-1))
    bank = PermutationBank.draw(make_kernel("uniform", M), net.n_slots, 1, torch.Generator().manual_seed(0))
    perms = bank.at(0)
    routed = net(x, perms)
    units = torch.tanh(pre)
    blocks = block_index(15, 3)
    for a in range(M):
        src = perms[blocks, a]
        explicit = units[:, src, torch.arange(15)].view(9, 3, 5).sum(-1)
        assert torch.allclose(routed[:, a], explicit, atol=1e-6)
    assert net.collapse()(x).shape == (9, 3)


def test_bad_configurations_name_the_fix():
    with pytest.raises(ValueError, match="n_blocks"):
        RoutedMLP(5, [4], 3, m=2, n_blocks=5)
    with pytest.raises(ValueError, match="committee"):
        RoutedMLP(5, [4], 3, m=2, head="committee", committee_size=5)
    net = RoutedMLP(5, [4], 3, m=2)
    with pytest.raises(ValueError, match="routing has shape"):
        net(torch.randn(2, 5), torch.zeros(3, 2, dtype=torch.long))
