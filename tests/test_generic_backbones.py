"""Hidden states of any nn.Module: forward hooks on named layers, TorchScript lists, timm CNNs."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from torch import Tensor, nn

from ripieno.framework.backbones.loading import load_pretrained_backbone
from ripieno.framework.loes.extraction import extract_layer_embeddings, hidden_states
from ripieno.framework.loes.feature_cache import cached_layer_embeddings, folder_fingerprint

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.(save|load)` is deprecated:FutureWarning")


def small_cnn() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2, padding=1),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 8)).eval()


def hook_count(model: nn.Module) -> int:
    return sum(len(m._forward_hooks) for m in model.modules())


class Intermediates(nn.Module):
    """Returns its intermediates as a list: a feature map and a vector."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4, 4)

    def forward(self, x: Tensor) -> list[Tensor]:
        fmap = torch.relu(self.conv(x))
        return [fmap, self.head(fmap.mean((2, 3)))]


class TwoInputs(nn.Module):
    """A recurrent encoder (tuple outputs) with two keyword inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(3, 6)
        self.rnn = nn.GRU(6, 6, batch_first=True)
        self.out = nn.Linear(6, 2)

    def forward(self, values: Tensor, scale: Tensor) -> Tensor:
        seq, _ = self.rnn(self.embed(values) * scale[:, None, None])
        return self.out(seq[:, -1])


def test_hooks_give_exactly_the_submodule_outputs_and_are_removed():
    model, x = small_cnn(), torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        states = hidden_states(model, {"pixel_values": x}, layer_names=["0", "2", "5"])
        h0 = model[0](x)
        h2 = model[2](model[1](h0))
        h5 = model[5](model[4](model[3](h2)))
    assert hook_count(model) == 0
    assert [tuple(s.shape) for s in states] == [(2, 64, 8), (2, 16, 8), (2, 1, 8)]
    assert torch.equal(states[0], h0.flatten(2).transpose(1, 2))  # (B, C, H, W) -> (B, H*W, C)
    assert torch.equal(states[1], h2.flatten(2).transpose(1, 2))
    assert torch.equal(states[2], h5[:, None])  # (B, D) -> (B, 1, D)
    reordered = hidden_states(model, {"pixel_values": x}, layer_names=["5", "0"])
    assert torch.equal(reordered[0], states[2]) and torch.equal(reordered[1], states[0])


def test_hooks_are_removed_on_error_and_bad_names_are_explained():
    model, x = small_cnn(), torch.randn(2, 3, 8, 8)
    with pytest.raises(ValueError, match=r"no submodule 'head'.*named_modules"):
        hidden_states(model, {"x": x}, layer_names=["0", "head"])
    assert hook_count(model) == 0
    with pytest.raises(RuntimeError):  # the forward itself fails (wrong channels)
        hidden_states(model, {"x": torch.randn(2, 4, 8, 8)}, layer_names=["0", "2"])
    assert hook_count(model) == 0
    with pytest.raises(TypeError, match="layer_names"):  # one tensor out, no names: say how to name layers
        hidden_states(model, {"x": x})


def test_tuple_outputs_take_their_first_tensor_and_several_inputs_pass_as_keywords():
    model = TwoInputs().eval()
    values, scale = torch.randn(2, 5, 3), torch.tensor([1.0, 2.0])
    with torch.no_grad():
        embed, rnn = hidden_states(model, {"scale": scale, "values": values}, layer_names=["embed", "rnn"])
        seq, _ = model.rnn(model.embed(values) * scale[:, None, None])
    assert embed.shape == (2, 5, 6) and torch.equal(rnn, seq)  # (B, T, D) as it is; GRU's tuple -> output


def test_a_torchscript_list_of_intermediates_is_the_hidden_states(tmp_path):
    eager = Intermediates().eval()
    scripted = torch.jit.script(eager)
    x = torch.randn(2, 3, 6, 6)
    with torch.no_grad():
        fmap, vector = eager(x)
        states = hidden_states(scripted, {"pixel_values": x})
    assert torch.allclose(states[0], fmap.flatten(2).transpose(1, 2)) and states[0].shape == (2, 36, 4)
    assert torch.allclose(states[1], vector[:, None])
    with pytest.raises(TypeError, match="TorchScript"):
        hidden_states(scripted, {"pixel_values": x}, layer_names=["conv"])

    path = tmp_path / "backbone.pt"
    torch.jit.save(scripted, str(path))
    loaded = load_pretrained_backbone(path)
    assert isinstance(loaded, torch.jit.ScriptModule)
    batch = {"pixel_values": x, "y": torch.tensor([0, 1])}
    emb, labels = extract_layer_embeddings(loaded, [batch], ["pixel_values"], "mean", progress=False)
    assert emb.shape == (2, 2, 4) and labels.tolist() == [0, 1]
    assert torch.allclose(emb[0], fmap.mean((2, 3)), atol=1e-6) and torch.allclose(emb[1], vector, atol=1e-6)
    with pytest.raises(ValueError, match="pooling='mean'"):  # a feature map has no first token
        extract_layer_embeddings(loaded, [batch], ["pixel_values"], "cls", progress=False)


def test_non_torchscript_files_are_refused_with_the_fix(tmp_path):
    state = tmp_path / "weights.pt"
    torch.save(small_cnn().state_dict(), state)
    with pytest.raises(ValueError, match="not a TorchScript archive.*torch.jit.save"):
        load_pretrained_backbone(state)
    other = tmp_path / "model.onnx"
    other.write_bytes(b"\0")
    with pytest.raises(ValueError, match="config.json.*TorchScript file"):
        load_pretrained_backbone(other)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained_backbone(tmp_path / "missing")


def test_a_file_fingerprint_follows_the_file(tmp_path):
    first, second = tmp_path / "a.pt", tmp_path / "b.pt"
    first.write_bytes(b"one")
    second.write_bytes(b"two!")
    assert folder_fingerprint(first) != folder_fingerprint(second) != folder_fingerprint(tmp_path / "empty")


def test_the_cache_key_follows_layer_names(tmp_path):
    model = small_cnn()
    batch = {"pixel_values": torch.randn(2, 3, 8, 8), "y": torch.tensor([0, 1])}

    def run(names):
        return cached_layer_embeddings(model, [batch], ["pixel_values"], tmp_path, "mean", progress=False,
                                       model_id="m", data_id="d", layer_names=names)

    first, second, both = run(["0"]), run(["2"]), run(["0", "2"])
    assert len({first[2], second[2], both[2]}) == 3 and not any(r[3] for r in (first, second, both))
    assert run(["0"])[3] and torch.equal(run(["0"])[0], first[0])  # the same names hit
    assert torch.equal(both[0][0], first[0][0]) and torch.equal(both[0][1], second[0][0])
    # Without layer_names the key is what it always was, so existing cache entries stay valid.
    old_key = {"model": "m", "pooling": "mean", "inputs": ["pixel_values"], "data": "d"}
    name = hashlib.sha256(json.dumps(old_key, sort_keys=True).encode()).hexdigest()[:24]
    scripted = torch.jit.script(Intermediates().eval())
    _, _, path, _ = cached_layer_embeddings(scripted, [batch], ["pixel_values"], tmp_path, "mean",
                                            progress=False, model_id="m", data_id="d")
    assert path.name == f"layers-{name}.safetensors"


def test_timm_cnn_stages_without_extra_blocks():
    import timm

    model = timm.create_model("resnet10t", pretrained=False).eval()
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        states = hidden_states(model, {"pixel_values": x})
        final = model.forward_features(x)
    assert [s.shape[2] for s in states] == [info["num_chs"] for info in model.feature_info]  # stem + 4 stages
    assert torch.allclose(states[-1], final.flatten(2).transpose(1, 2))  # the final map is not repeated


def test_hugging_face_feature_maps_become_tokens():
    from transformers import ResNetConfig, ResNetModel

    torch.manual_seed(0)
    model = ResNetModel(ResNetConfig(embedding_size=8, hidden_sizes=[8, 16], depths=[1, 1])).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        states = hidden_states(model, {"pixel_values": x})
        maps = model(x, output_hidden_states=True).hidden_states
    assert len(states) == len(maps) == 3
    for state, fmap in zip(states, maps, strict=True):
        assert torch.equal(state, fmap.flatten(2).transpose(1, 2))
