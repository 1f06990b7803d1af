"""The same seed gives the same numbers whether a LOES run extracts its layer embeddings or reads
them from the cache (issue 13 item 5).

The cause was that preparation consumed the global RNG on a cache miss only: every ``DataLoader``
iterator draws its base seed from torch's global generator (also with ``shuffle=False`` and no
workers), extraction iterated each split's loader twice (``tqdm.auto`` calls ``iter`` in its
constructor and again to loop), and a first run also built its random backbone and tokenizer;
the model that the CLI builds after the datamodule's ``spec`` then started from other weights.
"""

import contextlib
import json
import logging
import random
import shutil

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils.data import DataLoader

from ripieno.framework.cli import main
from ripieno.framework.loes.extraction import extract_layer_embeddings, rng_untouched


def _rng_states() -> tuple:
    return torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()


def _assert_same_states(before: tuple, after: tuple) -> None:
    assert torch.equal(before[0], after[0])
    assert np.array_equal(before[1], after[1])
    assert before[2] == after[2]


def _run_recipe(root, name: str) -> pd.DataFrame:
    """text_gpt2_loes on 200 rows for 2 epochs; its metrics.csv (fit, then test of the best checkpoint)."""
    source = {"class_path": "ripieno.datamodules.TextDataModule",
              "init_args": {"dataset": "rotten_tomatoes", "max_length": 32, "build_tokenizer": True,
                            "split": {"seed": 0}, "max_rows": 200}}
    out = root / name
    main(["fit", "-c", "recipes/loes/text_gpt2_loes.yaml", f"--data.init_args.source={json.dumps(source)}",
          f"--data.init_args.cache.dir={root / 'cache'}", "--data.init_args.progress=false",
          "--data.init_args.selection.scores_path=null", "--trainer.max_epochs=2",
          "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
          "--tensorboard=false", f"--trainer.default_root_dir={out}"])
    (metrics,) = out.rglob("metrics.csv")
    return pd.read_csv(metrics)


def _said(caplog, words: str) -> bool:
    said = any(words in record.getMessage() for record in caplog.records)
    caplog.clear()
    return said


def test_a_recipe_gives_the_same_metrics_whether_it_extracts_or_reads_the_cache(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    first = _run_recipe(tmp_path, "first")  # builds backbone and tokenizer, extracts
    assert _said(caplog, "embeddings cached in")
    shutil.rmtree(tmp_path / "cache")
    cold = _run_recipe(tmp_path, "cold")  # extracts again with the existing backbone (the case)
    assert _said(caplog, "embeddings cached in")
    warm = _run_recipe(tmp_path, "warm")  # reads every split from the cache
    assert _said(caplog, "embeddings read from")
    assert {"val/nll", "test/nll", "test/accuracy"} <= set(first.columns)
    pd.testing.assert_frame_equal(cold, first)
    pd.testing.assert_frame_equal(warm, first)


def test_iterating_a_dataloader_draws_from_the_global_rng():
    """The mechanism: even an unshuffled, single-process DataLoader takes a base seed per iterator."""
    before = torch.get_rng_state()
    iter(DataLoader(list(range(4)), batch_size=2))
    assert not torch.equal(torch.get_rng_state(), before)


def test_extraction_iterates_its_loader_once_and_leaves_every_rng_as_it_was():
    class TwoLayers(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.shift = torch.nn.Parameter(torch.ones(()))

        def forward(self, x):
            return [x, x + self.shift]

    class CountingLoader:
        def __init__(self):
            self.iterations = 0
            self.loader = DataLoader([{"x": torch.ones(3, 2), "y": 0}] * 4, batch_size=2)

        def __len__(self):
            return len(self.loader)

        def __iter__(self):
            self.iterations += 1
            return iter(self.loader)

    loader = CountingLoader()
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    before = _rng_states()
    emb, labels = extract_layer_embeddings(TwoLayers(), loader, ["x"], "mean", progress=True)
    _assert_same_states(before, _rng_states())
    assert loader.iterations == 1
    assert emb.shape == (2, 4, 2) and torch.equal(emb[1], torch.full((4, 2), 2.0))


@pytest.mark.parametrize("fails", [False, True])
def test_rng_untouched_restores_torch_numpy_and_python(fails):
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    before = _rng_states()
    # the error inside must come out unchanged: rng_untouched restores and re-raises, never swallows
    with pytest.raises(KeyError, match="inside") if fails else contextlib.nullcontext():
        with rng_untouched():
            torch.rand(5)
            np.random.rand(5)
            random.random()
            if fails:
                raise KeyError("inside")
    _assert_same_states(before, _rng_states())
