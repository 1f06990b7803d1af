"""``SplitSettings`` and ``LoaderSettings``: the five modality DataModules' shared settings as two groups.

Oracles: the grouped and the flat construction of the same DataModule give the same rows and batches;
the parser's printed config; a checkpoint written with the flat hyperparameters of earlier releases;
Python's own ``TypeError`` for a keyword a function does not take.
"""

from __future__ import annotations

import inspect
import io
import warnings

import pytest
import torch
import yaml

from ripieno.datamodules import (
    AudioDataModule,
    BackboneImageDataModule,
    ImageDataModule,
    LoaderSettings,
    SplitSettings,
    TabularDataModule,
    TextDataModule,
)
from ripieno.datamodules.data_settings import MOVED_ARGUMENTS
from ripieno.framework.cli import main
from ripieno.framework.errors import RipienoDeprecationWarning

MODULES = (TabularDataModule, TextDataModule, AudioDataModule, ImageDataModule, BackboneImageDataModule)
FLAT = tuple(MOVED_ARGUMENTS)


@pytest.mark.parametrize("cls", MODULES, ids=lambda c: c.__name__)
def test_every_modality_datamodule_takes_the_two_groups_and_none_of_the_flat_arguments(cls) -> None:
    parameters = inspect.signature(cls).parameters
    assert {"split", "loader"} <= set(parameters) and not set(FLAT) & set(parameters)
    assert cls.MOVED_ARGUMENTS == MOVED_ARGUMENTS
    module = cls()  # nothing is read before setup
    assert module.split_settings == cls.DEFAULT_SPLIT and module.loader_settings == cls.DEFAULT_LOADER
    assert None not in (module.split_settings.val_size, module.loader_settings.batch_size)
    assert module.hparams["split"] == {"policy": "official", "val_size": cls.DEFAULT_SPLIT.val_size,
                                       "test_size": cls.DEFAULT_SPLIT.test_size, "seed": 0}


def test_a_group_field_left_unset_keeps_the_datamodules_own_default() -> None:
    data = TabularDataModule(loader=LoaderSettings(batch_size=32), split=SplitSettings(seed=4))
    assert data.loader_settings == LoaderSettings(batch_size=32, eval_batch_size=2048, num_workers=0)
    assert data.split_settings == SplitSettings("official", 0.2, 0.2, 4)
    text = TextDataModule(loader=LoaderSettings(batch_size=32))
    assert text.loader_settings.eval_batch_size == 512


def test_the_flat_arguments_of_earlier_releases_give_the_same_rows_and_batches_with_a_warning() -> None:
    grouped = TabularDataModule("iris", split=SplitSettings(val_size=0.3, seed=5),
                                loader=LoaderSettings(batch_size=16))
    with pytest.warns(RipienoDeprecationWarning) as caught:
        flat = TabularDataModule("iris", val_size=0.3, split_seed=5, batch_size=16)
    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 3
    moved = "(split_seed=...) is now TabularDataModule(split=SplitSettings(seed=...))"
    assert any(moved in m for m in messages)
    assert all("removed in ripieno 0.3.0" in m for m in messages)
    assert flat.split_settings == grouped.split_settings and flat.loader_settings == grouped.loader_settings
    assert dict(flat.hparams) == dict(grouped.hparams) and "split_seed" not in flat.hparams
    assert flat.split_sizes() == grouped.split_sizes()
    for a, b in zip(flat.train_dataloader(), grouped.train_dataloader(), strict=True):
        assert all(torch.equal(a[key], b[key]) for key in a)


def test_a_setting_given_both_ways_or_unknown_is_refused() -> None:
    with pytest.raises(ValueError, match=r"given twice; keep loader.batch_size"):
        TabularDataModule(loader=LoaderSettings(batch_size=8), batch_size=16)
    with pytest.raises(TypeError, match="unexpected keyword argument 'batch'"):
        TabularDataModule(batch=8)
    with pytest.raises(TypeError, match="loader=...\\) must be a LoaderSettings"):
        TabularDataModule(loader=SplitSettings())


def test_a_checkpoint_with_the_flat_hyperparameters_of_earlier_releases_rebuilds_it(tmp_path) -> None:
    """``LightningDataModule.load_from_checkpoint`` calls the class with the saved hyperparameters."""
    old = {"dataset": "iris", "val_size": 0.3, "split_seed": 2, "batch_size": 8, "max_rows": None}
    path = tmp_path / "old.ckpt"
    torch.save({"datamodule_hyper_parameters": old, "pytorch-lightning_version": "2.6.0"}, path)
    with pytest.warns(RipienoDeprecationWarning):
        rebuilt = TabularDataModule.load_from_checkpoint(path, weights_only=True)
    assert rebuilt.split_settings == SplitSettings(val_size=0.3, test_size=0.2, seed=2)
    assert rebuilt.loader_settings.batch_size == 8
    new = tmp_path / "new.ckpt"
    saved = {"datamodule_hyper_parameters": dict(rebuilt.hparams), "pytorch-lightning_version": "2.6.0"}
    torch.save(saved, new)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RipienoDeprecationWarning)  # the groups as saved load without one
        again = TabularDataModule.load_from_checkpoint(new, weights_only=True)
    assert again.split_settings == rebuilt.split_settings and again.loader_settings == rebuilt.loader_settings


def test_a_recipe_file_with_the_flat_keys_still_loads_grouped(tmp_path, capsys) -> None:
    recipe = {"data": {"class_path": "ripieno.datamodules.TabularDataModule",
                       "init_args": {"dataset": "iris", "split_seed": 3, "batch_size": 32,
                                     "splits": "resplit"}}}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", "tabular/lometab_wine", "-c", str(path), "--print_config"])
    assert stop.value.code in (0, None)
    printed = capsys.readouterr()
    data = yaml.safe_load(io.StringIO(printed.out))["data"]["init_args"]
    assert data["split"] == {"policy": "resplit", "val_size": 0.2, "test_size": 0.2, "seed": 3}
    assert data["loader"] == {"batch_size": 32, "eval_batch_size": 2048, "num_workers": 0}
    assert not set(FLAT) & set(data)
    warned = [line for line in printed.err.splitlines() if line.startswith("ripieno: warning: ")]
    assert len(warned) == 3 and all("is now data.init_args." in w for w in warned)


def test_the_command_line_names_the_grouped_key(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", "tabular/lometab_wine", "--data.init_args.loader.batch_size=7", "--print_config"])
    assert stop.value.code in (0, None)
    printed = yaml.safe_load(io.StringIO(capsys.readouterr().out))
    assert printed["data"]["init_args"]["loader"]["batch_size"] == 7
    with pytest.raises(SystemExit) as stop:
        main(["fit", "-c", "tabular/lometab_wine", "--data.init_args.batch_size=7", "--print_config"])
    assert stop.value.code not in (0, None)
    assert "data.init_args.loader.batch_size" in str(stop.value) + capsys.readouterr().err
