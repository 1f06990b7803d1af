"""AudioDataModule on users' own folders: AutoFeatureExtractor, HF's attention-mask convention, Whisper."""

import json

import pytest
import torch
from helpers.media import write_audio_folder
from transformers import (
    Wav2Vec2Config,
    Wav2Vec2FeatureExtractor,
    Wav2Vec2Model,
    WhisperConfig,
    WhisperFeatureExtractor,
    WhisperModel,
)

from ripieno.datamodules import LayerEmbeddingDataModule, LoaderSettings, SplitSettings
from ripieno.datamodules.audio import AudioDataModule
from ripieno.datamodules.layer_embedding_config import BackboneConfig, FeatureCacheConfig, SelectionConfig
from ripieno.framework.backbones.loading import load_pretrained_backbone
from ripieno.framework.cli import main
from ripieno.framework.loes.extraction import extract_layer_embeddings

RECIPE = "recipes/loes/audio_wav2vec2_loes.yaml"


def _wav2vec2_folder(path, norm):
    """A tiny Wav2Vec2 whose extractor follows HF: masks only for feat_extract_norm='layer'."""
    config = Wav2Vec2Config(vocab_size=32, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=32, conv_dim=(16, 16), conv_stride=(5, 4), conv_kernel=(10, 8),
                            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=2,
                            feat_extract_norm=norm, do_stable_layer_norm=norm == "layer")
    torch.manual_seed(0)
    Wav2Vec2Model(config).save_pretrained(path)
    Wav2Vec2FeatureExtractor(sampling_rate=16000, do_normalize=norm == "layer",
                             return_attention_mask=norm == "layer").save_pretrained(path)
    return str(path)


def _whisper_folder(path):
    config = WhisperConfig(vocab_size=64, d_model=16, encoder_layers=2, decoder_layers=1,
                           encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                           decoder_ffn_dim=32, num_mel_bins=80, max_source_positions=1500,
                           max_target_positions=32, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           decoder_start_token_id=1, suppress_tokens=[], begin_suppress_tokens=[])
    torch.manual_seed(0)
    WhisperModel(config).save_pretrained(path)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def audio_root(tmp_path_factory):
    return write_audio_folder(tmp_path_factory.mktemp("clips") / "audio")


def _dm(root, folder):
    return AudioDataModule(dataset="folder", root=str(root), model_dir=folder,
                           split=SplitSettings(val_size=0.25, test_size=0.34),
                           loader=LoaderSettings(batch_size=4))


def test_group_norm_wav2vec2_gets_no_attention_mask_but_pools_with_it(tmp_path, audio_root):
    folder = _wav2vec2_folder(tmp_path / "base", "group")
    dm = _dm(audio_root, folder)
    assert dm.input_keys == ("input_values",) and dm.spec.input_keys == ["input_values"]
    batch = next(iter(dm.train_dataloader()))
    assert set(batch) == {"input_values", "attention_mask", "y"}  # the mask is there for pooling

    model = load_pretrained_backbone(folder).eval()
    calls = []
    model.register_forward_pre_hook(lambda m, args, kwargs: calls.append(set(kwargs)), with_kwargs=True)
    emb, _ = extract_layer_embeddings(model, [batch], dm.input_keys, pooling="mean", progress=False)
    assert "attention_mask" not in calls[0]
    with torch.no_grad():
        states = model(input_values=batch["input_values"], output_hidden_states=True).hidden_states
    frames = model._get_feature_vector_attention_mask(states[0].shape[1], batch["attention_mask"])
    w = frames[..., None].float()
    expected = torch.stack([(h * w).sum(1) / w.sum(1) for h in states])
    torch.testing.assert_close(emb, expected)


def test_layer_norm_wav2vec2_gets_the_mask(tmp_path, audio_root):
    folder = _wav2vec2_folder(tmp_path / "large", "layer")
    assert _dm(audio_root, folder).input_keys == ("input_values", "attention_mask")


def test_whisper_folder_loads_its_own_extractor_and_encoder(tmp_path, audio_root):
    folder = _whisper_folder(tmp_path / "whisper")
    dm = _dm(audio_root, folder)
    assert type(dm.feature_extractor).__name__ == "WhisperFeatureExtractor"
    assert dm.input_keys == ("input_features",)
    batch = next(iter(dm.train_dataloader()))
    assert batch["input_features"].shape == (4, 80, 3000) and batch["attention_mask"].shape == (4, 3000)
    expected = WhisperFeatureExtractor.from_pretrained(folder)(
        [dm._split("train").waveform(i) for i in range(4)], sampling_rate=16000, return_tensors="pt")
    got = dm._split("train").__getitems__([0, 1, 2, 3])
    torch.testing.assert_close(got["input_features"], expected["input_features"])
    encoder = load_pretrained_backbone(folder)
    assert type(encoder).__name__ == "WhisperEncoder"
    emb, _ = extract_layer_embeddings(encoder, [got], dm.input_keys, pooling="mean", progress=False)
    assert emb.shape == (3, 4, 16)  # embeddings + 2 encoder layers, mean over the real frames


@pytest.mark.parametrize("kind", ["wav2vec2-group", "whisper"])
def test_users_audio_folders_run_through_the_audio_loes_recipe(tmp_path, audio_root, capsys, kind):
    if kind == "whisper":
        folder = _whisper_folder(tmp_path / kind)
    else:
        folder = _wav2vec2_folder(tmp_path / kind, "group")
    source = {"class_path": "ripieno.datamodules.AudioDataModule",
              "init_args": {"dataset": "folder", "root": str(audio_root),
                            "split": {"val_size": 0.25, "test_size": 0.34},
                            "test_dataset": None}}  # merged into the recipe's source
    main(["fit", "-c", RECIPE, "--trainer.fast_dev_run=2", f"--trainer.default_root_dir={tmp_path}",
          "--trainer.logger=false", "--trainer.enable_progress_bar=false",
          "--trainer.enable_model_summary=false", f"--data.init_args.source={json.dumps(source)}",
          f"--data.init_args.backbone.dir={folder}", "--data.init_args.backbone.build=null",
          f"--data.init_args.cache.dir={tmp_path}/cache", "--data.init_args.progress=false",
          "--data.init_args.selection.scores_path=null"])
    assert "test/accuracy" in capsys.readouterr().out


def test_layer_embedding_module_passes_only_the_model_inputs(tmp_path, audio_root):
    folder = _wav2vec2_folder(tmp_path / "base", "group")
    dm = LayerEmbeddingDataModule(source=_dm(audio_root, folder), backbone=BackboneConfig(dir=folder),
                                  selection=SelectionConfig(method="all", scores_path=None),
                                  cache=FeatureCacheConfig(dir=str(tmp_path / "cache")), progress=False)
    dm.setup("fit")
    assert dm.spec.input_keys == ["input_values"]
