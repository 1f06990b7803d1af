"""A model folder that cannot be loaded stops the run before any training with one line naming the
folder (or file), what is wrong and the fix (issue 13 item 6): missing folder, no config.json, no
weights, truncated or garbled weights, a sharded index missing a shard, a broken JSON config."""

import json
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import GPT2Config, GPT2Model

from ripieno.datamodules.audio import AudioDataError, load_feature_extractor
from ripieno.datamodules.images import ImageDataError
from ripieno.datamodules.vision_backbone import load_image_preprocessor
from ripieno.framework.backbones.loading import BACKBONE_FIX, load_pretrained_backbone
from ripieno.framework.backbones.model_folder import (
    MissingModelFolderError,
    ModelFolderError,
    check_model_folder,
)
from ripieno.framework.cli import main
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.methods.text_classifier import PRETRAINED_FIX, TextClassifier
from ripieno.framework.specs.text import TextSpec

FIX = "save the model there again"
VOCAB = 300


def _gpt2(folder: Path, **save: str) -> Path:
    torch.manual_seed(0)
    GPT2Model(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=64)).save_pretrained(
        folder, **save)
    return folder


def _gpt2_bin(folder: Path) -> Path:
    """A folder with the older ``pytorch_model.bin`` (transformers 5 writes safetensors only)."""
    _gpt2(folder)
    weights = folder / "model.safetensors"
    torch.save(load_file(weights), folder / "pytorch_model.bin")
    weights.unlink()
    return folder


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _no_weights(folder: Path) -> tuple[Path, str]:
    (folder / "model.safetensors").unlink()
    return folder, "has config.json but no weights (none of model.safetensors"


def _truncated_weights(folder: Path) -> tuple[Path, str]:
    _truncate(folder / "model.safetensors")
    return folder / "model.safetensors", "is truncated or corrupt (Error while deserializing header: incompl"


def _garbled_weights(folder: Path) -> tuple[Path, str]:
    weights = folder / "model.safetensors"
    weights.write_bytes(b"\xff" * 8 + weights.read_bytes()[8:])
    return weights, "is truncated or corrupt (Error while deserializing header"


def _no_config(folder: Path) -> tuple[Path, str]:
    (folder / "config.json").unlink()
    return folder, "has no config.json, so it is not a model folder"


def _bad_config(folder: Path) -> tuple[Path, str]:
    (folder / "config.json").write_text('{"model_type": "gpt2", ')
    return folder / "config.json", "is not valid JSON (Expecting property name"


def _missing(folder: Path) -> tuple[Path, str]:
    for file in folder.iterdir():
        file.unlink()
    folder.rmdir()
    return folder, "does not exist, so there is no config.json or weights to load"


BREAKAGES = {"no_weights": _no_weights, "truncated_weights": _truncated_weights,
             "garbled_weights": _garbled_weights, "no_config": _no_config, "bad_config": _bad_config,
             "missing": _missing}
MISSING = ("no_weights", "no_config", "missing")  # FileNotFoundError as well


@pytest.mark.parametrize("case", list(BREAKAGES))
def test_check_names_the_folder_the_problem_and_the_fix(tmp_path, case):
    named, problem = BREAKAGES[case](_gpt2(tmp_path / "gpt2"))
    with pytest.raises(ModelFolderError) as error:
        check_model_folder(tmp_path / "gpt2", FIX)
    assert str(error.value).startswith(f"{named}: {problem}") and str(error.value).endswith(f"; {FIX}.")
    assert "\n" not in str(error.value) and isinstance(error.value, RipienoInputError)
    assert isinstance(error.value, FileNotFoundError) == (case in MISSING)


@pytest.mark.parametrize("case", list(BREAKAGES))
def test_both_loading_sites_check_the_folder_first(tmp_path, case):
    named, problem = BREAKAGES[case](_gpt2(tmp_path / "gpt2"))
    spec = TextSpec(n_classes=2, class_names=["a", "b"], max_length=64, vocab_size=VOCAB, pad_token_id=0,
                    tokenizer_dir=str(tmp_path), n_train=8, n_val=2, n_test=2, dataset="none")
    for load, fix in ((lambda: load_pretrained_backbone(tmp_path / "gpt2"), BACKBONE_FIX),
                      (lambda: TextClassifier(spec, pretrained_dir=str(tmp_path / "gpt2")), PRETRAINED_FIX)):
        with pytest.raises(ModelFolderError) as error:
            load()
        assert str(error.value).startswith(f"{named}: {problem}") and str(error.value).endswith(f"; {fix}.")


def test_complete_folders_pass_safetensors_bin_and_sharded(tmp_path):
    assert check_model_folder(_gpt2(tmp_path / "safe"), FIX) == tmp_path / "safe"
    bin_folder = check_model_folder(_gpt2_bin(tmp_path / "bin"), FIX)
    assert isinstance(load_pretrained_backbone(bin_folder), GPT2Model)
    sharded = _gpt2(tmp_path / "sharded", max_shard_size="20KB")
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and not (sharded / "model.safetensors").exists()
    check_model_folder(sharded, FIX)
    assert isinstance(load_pretrained_backbone(sharded), GPT2Model)
    (sharded / shards[-1]).unlink()
    missing = f"model.safetensors.index.json: lists shards that are missing: ['{shards[-1]}']"
    with pytest.raises(MissingModelFolderError, match=re.escape(missing)):
        check_model_folder(sharded, FIX)


def test_a_truncated_pytorch_bin_is_named(tmp_path):
    folder = _gpt2_bin(tmp_path / "bin")
    _truncate(folder / "pytorch_model.bin")
    with pytest.raises(ModelFolderError, match="pytorch_model.bin: is truncated or corrupt"):
        check_model_folder(folder, FIX)


def test_processor_configs_that_are_not_json_are_named(tmp_path):
    from ripieno.framework.backbones.small_models import build_small_dinov2, build_small_wav2vec2

    for build, load, error in ((build_small_wav2vec2, load_feature_extractor, AudioDataError),
                               (build_small_dinov2, load_image_preprocessor, ImageDataError)):
        folder = build(tmp_path / build.__name__)
        config = folder / "preprocessor_config.json"
        config.write_bytes(b"\xff" + config.read_bytes()[1:])
        with pytest.raises(error, match=f"^{re.escape(str(config))}: is not valid JSON"):
            load(folder)


def _loes_args(root: Path, backbone: Path) -> list[str]:
    source = {"class_path": "ripieno.datamodules.TextDataModule",
              "init_args": {"dataset": "rotten_tomatoes", "max_length": 32, "build_tokenizer": True,
                            "vocab_size": VOCAB, "max_rows": 120}}
    return ["fit", "-c", "recipes/loes/text_gpt2_loes.yaml", f"--data.init_args.source={json.dumps(source)}",
            f"--data.init_args.backbone.dir={backbone}", "--data.init_args.backbone.build=null",
            f"--data.init_args.cache.dir={root / 'cache'}", "--data.init_args.progress=false",
            "--data.init_args.selection.scores_path=null", "--tensorboard=false",
            f"--trainer.default_root_dir={root / 'run'}"]


@pytest.mark.parametrize("case", ["no_weights", "truncated_weights"])
def test_the_cli_stops_with_one_line_before_training(tmp_path, case):
    named, problem = BREAKAGES[case](_gpt2(tmp_path / "gpt2"))
    with pytest.raises(SystemExit) as error:
        main(_loes_args(tmp_path, tmp_path / "gpt2"))
    text = str(error.value)
    assert text.startswith(f"ripieno: error: {named}: {problem}") and "\n" not in text
    assert text.endswith(f"; {BACKBONE_FIX}.")
    assert not (tmp_path / "run").exists() or not list((tmp_path / "run").rglob("*.ckpt"))  # nothing trained
