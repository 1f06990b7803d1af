"""LayerEmbeddingDataModule's grouped settings: checks, the CLI's forms, and the source it builds."""

from __future__ import annotations

import io
import subprocess
import sys
from functools import partial

import lightning as L
import pytest
import torch
import yaml
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel

from ripieno.datamodules import (
    DataModuleError,
    LayerEmbeddingDataModule,
    TeacherStudentDataModule,
    TextDataModule,
)
from ripieno.datamodules.layer_embedding_config import (
    MOVED_ARGUMENTS,
    BackboneConfig,
    FeatureCacheConfig,
    SelectionConfig,
)
from ripieno.datamodules.layer_embeddings import backbone_preprocessing
from ripieno.framework.cli import main
from ripieno.framework.runner.command import RipienoCLI

RECIPE = "loes/text_gpt2_loes"


def _error(args: list[str], first: bool = True) -> str:
    with pytest.raises(SystemExit) as stop:
        main(args)
    text = str(stop.value.code)
    assert text.startswith("ripieno: error: ")
    return text.splitlines()[0] if first else text


def _printed(args: list[str], capsys) -> dict:
    with pytest.raises(SystemExit) as stop:
        main([*args, "--print_config"])
    assert stop.value.code in (0, None)
    return yaml.safe_load(io.StringIO(capsys.readouterr().out))["data"]["init_args"]


@pytest.mark.parametrize("groups, match", [
    ({"backbone": BackboneConfig(dir="/models/mine", build="gpt2")},
     "backbone.dir=/models/mine and backbone.build=gpt2 are both set"),
    ({"backbone": BackboneConfig(build="gpt2", convert="whisper_tiny_en")}, "not both"),
    ({"selection": SelectionConfig(method="fixed")}, "needs selection.layers"),
    ({"selection": SelectionConfig(k=0)}, "must be >= 1"),
    ({"selection": SelectionConfig(method="last_k", variant="reference")}, "is a LOES variant"),
    ({"selection": SelectionConfig(variant="reference", ridge_loss="loo")}, "in-sample ridge loss only"),
    ({"selection": SelectionConfig(calibration="test")}, "never 'test'"),
    # the small random GPT-2 has 4 blocks: its 5 hidden states give 4 candidates (5 with hidden state 0)
    ({"backbone": BackboneConfig(build="gpt2"), "selection": SelectionConfig(k=5)},
     "k=5 exceeds the 4 candidate hidden states"),
    ({"backbone": BackboneConfig(build="gpt2"), "selection": SelectionConfig(method="fixed", layers=[5])},
     r"selection.layers \[5\] are out of range"),
])
def test_bad_settings_stop_at_construction_before_anything_is_written(groups, match, tmp_path, monkeypatch):
    monkeypatch.setenv("RIPIENO_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataModuleError, match=match):
        LayerEmbeddingDataModule(partial(TextDataModule, build_tokenizer=True), **groups)
    assert not (tmp_path / "cache").exists()


def test_k_counts_the_embedding_output_when_it_is_a_candidate() -> None:
    # 4 blocks: k=5 is refused without the embedding output (the case above) and accepted with it
    backbone = BackboneConfig(build="gpt2", include_embedding_output=True)
    dm = LayerEmbeddingDataModule(TextDataModule, backbone=backbone, selection=SelectionConfig(k=5))
    assert dm.hparams.selection["k"] == 5 and dm.hparams.backbone["include_embedding_output"] is True
    with pytest.raises(DataModuleError, match="k=5 exceeds the 4 candidate hidden states"):
        LayerEmbeddingDataModule(TextDataModule, backbone=BackboneConfig(build="gpt2"),
                                 selection=SelectionConfig(k=5))


def test_hparams_are_plain_values_a_checkpoint_loads_with_weights_only(tmp_path) -> None:
    net = torch.nn.Linear(2, 2)
    dm = LayerEmbeddingDataModule(TextDataModule, backbone=BackboneConfig(module=net, layer_names=["0"]),
                                  selection=SelectionConfig(method="last_k", k=2),
                                  cache=FeatureCacheConfig(dir="/tmp/features"))
    assert dm.hparams.backbone == {"dir": None, "build": None, "convert": None,
                                   "module": "torch.nn.modules.linear.Linear", "layer_names": ["0"],
                                   "pooling": "mean", "include_embedding_output": False, "input_keys": None}
    assert dm.hparams.selection["method"] == "last_k" and dm.hparams.cache["dir"] == "/tmp/features"
    assert "source" not in dm.hparams
    torch.save(dict(dm.hparams), tmp_path / "hp.pt")
    assert torch.load(tmp_path / "hp.pt", weights_only=True) == dict(dm.hparams)


def test_a_factory_gets_the_backbones_preprocessing_only_where_it_leaves_it_unset() -> None:
    folder = "/models/bert"
    assert backbone_preprocessing(TextDataModule, folder) == {"tokenizer_dir": folder}
    assert backbone_preprocessing(partial(TextDataModule, tokenizer_dir="/tok"), folder) == {}
    assert backbone_preprocessing(partial(TextDataModule, build_tokenizer=True), folder) == {}
    assert backbone_preprocessing(TeacherStudentDataModule, folder) == {}


class _CLI(LightningCLI):
    """Plain LightningCLI with the ripieno command's instantiators (no spec link, so nothing prepares)."""

    _add_instantiators = RipienoCLI._add_instantiators


def test_the_source_a_recipe_names_keeps_its_own_hparams() -> None:
    data = {"class_path": "ripieno.datamodules.LayerEmbeddingDataModule", "init_args": {
        "source": {"class_path": "ripieno.datamodules.TextDataModule",
                   "init_args": {"dataset": "rotten_tomatoes", "max_rows": 300}},
        "selection": {"method": "last_k", "k": 2}}}
    cli = _CLI(BoringModel, L.LightningDataModule, subclass_mode_data=True, run=False,
               args={"data": data, "trainer": {"logger": False}, "seed_everything": 0})
    dm = cli.datamodule
    assert dm.selection_config == SelectionConfig(method="last_k", k=2)
    assert dm.hparams.selection["k"] == 2 and dm.hparams["_class_path"].endswith("LayerEmbeddingDataModule")
    factory = dm._source_factory  # what jsonargparse made of class_path and init_args, not yet called
    preprocessing = backbone_preprocessing(factory, "/models/bert")
    assert preprocessing == {"tokenizer_dir": "/models/bert"}
    source = factory(**preprocessing)
    assert isinstance(source, TextDataModule)
    assert source.hparams.max_rows == 300 and source.hparams.tokenizer_dir == "/models/bert"
    assert "selection" not in source.hparams and "_class_path" not in source.hparams  # not the outer's


def test_a_flat_key_names_its_grouped_key() -> None:
    assert _error(["fit", "-c", RECIPE, "--data.init_args.k=2", "--print_config"]) == (
        "ripieno: error: ripieno.datamodules.LayerEmbeddingDataModule groups its settings:"
        " data.init_args.k is now data.init_args.selection.k (see its docstring for the grouped form).")
    assert "\n" not in _error(["fit", "-c", RECIPE, "--data.init_args.k=2", "--print_config"], first=False)


def test_an_old_flat_recipe_keeps_loading_and_warns_naming_every_moved_key(tmp_path, capsys) -> None:
    old = {"data": {"class_path": "ripieno.datamodules.LayerEmbeddingDataModule", "init_args": {
        "source": {"class_path": "ripieno.datamodules.TextDataModule",
                   "init_args": {"build_tokenizer": True}},
        "build_backbone": "gpt2", "selection": "loes", "k": 3, "cache_dir": "/tmp/c", "batch_size": 8}}}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    before = path.read_bytes()
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", str(path), "--print_config"])
    assert stop.value.code in (0, None)
    printed = capsys.readouterr()
    init = yaml.safe_load(io.StringIO(printed.out))["data"]["init_args"]
    assert init["backbone"]["build"] == "gpt2" and init["selection"]["method"] == "loes"
    assert init["selection"]["k"] == 3
    assert init["cache"]["dir"] == "/tmp/c" and init["batch_size"] == 8
    messages = [line for line in printed.err.splitlines() if line.startswith("ripieno: warning: ")]
    for flat in ("build_backbone", "selection", "k", "cache_dir"):
        moved = f"data.init_args.{flat} is now data.init_args.{MOVED_ARGUMENTS[flat]}"
        assert any(moved in m for m in messages), flat
    assert not any("batch_size" in m for m in messages)
    assert path.read_bytes() == before  # the user's file is read, never rewritten


def test_a_setting_given_flat_and_grouped_is_refused_in_one_line(tmp_path) -> None:
    both = {"data": {"class_path": "ripieno.datamodules.LayerEmbeddingDataModule", "init_args": {
        "source": {"class_path": "ripieno.datamodules.TextDataModule",
                   "init_args": {"build_tokenizer": True}},
        "k": 3, "selection": {"k": 2}}}}
    path = tmp_path / "both.yaml"
    path.write_text(yaml.safe_dump(both))
    line = _error(["fit", "-c", str(path), "--print_config"])
    assert "data.init_args.k and data.init_args.selection.k are the same setting, given twice" in line


def test_null_below_a_group_or_the_source_is_none(capsys) -> None:
    init = _printed(["fit", "-c", RECIPE, "--data.init_args.selection.scores_path=null",
                     "--data.init_args.selection.calibration_rows", "null",
                     "--data.init_args.backbone.build=null", "--data.init_args.selection.k=2",
                     "--data.init_args.source.init_args.max_rows=null"], capsys)
    assert init["selection"]["scores_path"] is None and init["selection"]["calibration_rows"] is None
    assert init["backbone"]["build"] is None and init["source"]["init_args"]["max_rows"] is None
    assert init["selection"]["k"] == 2 and init["selection"]["alpha"] == 0.1  # the recipe's others stay
    assert init["backbone"]["pooling"] == "last" and init["source"]["init_args"]["build_tokenizer"] is True


def test_the_command_prints_each_moved_key_as_one_warning_line(tmp_path) -> None:
    old = {"data": {"class_path": "ripieno.datamodules.LayerEmbeddingDataModule",
                    "init_args": {"selection": "last_k", "k": 2}}}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(old))
    command = [sys.executable, "-m", "ripieno", "fit", "-c", RECIPE, "-c", str(path), "--print_config"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, check=True)
    warned = [line for line in done.stderr.splitlines() if "is now" in line]
    assert warned == [
        f"ripieno: warning: {path}: data.init_args.{flat} is now data.init_args.{MOVED_ARGUMENTS[flat]}"
        f" (ripieno.datamodules.LayerEmbeddingDataModule); the flat key is removed in ripieno 0.3.0"
        for flat in ("selection", "k")]
    assert yaml.safe_load(done.stdout)["data"]["init_args"]["selection"]["method"] == "last_k"
