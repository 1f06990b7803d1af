"""Shared fixtures: tiny tables written to disk like a user's own data."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml
from helpers.tables import make_table

os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")
# Generated tokenizers, backbones and feature caches go to ripieno's cache folder: a fresh one per
# session (subprocesses inherit it), never the user's ~/.cache/ripieno.
# The folder is removed when this process exits (about 220 MB a run; left behind, runs filled /tmp),
# and only by this process: a forked worker that inherits the handler leaves it to its parent.
_TEST_CACHE = tempfile.mkdtemp(prefix="ripieno-test-cache-")
_TEST_CACHE_OWNER = os.getpid()
os.environ["RIPIENO_CACHE"] = _TEST_CACHE


def _remove_test_cache() -> None:
    if os.getpid() == _TEST_CACHE_OWNER:
        shutil.rmtree(_TEST_CACHE, ignore_errors=True)


atexit.register(_remove_test_cache)


@pytest.fixture
def table_csv(tmp_path):
    """Write a table and return a factory ``(task, **edits) -> path``."""

    def write(task: str = "regression", n: int = 240, name: str = "table.csv", frame=None):
        frame = make_table(n=n, task=task) if frame is None else frame
        path = tmp_path / name
        if path.suffix == ".parquet":
            frame.to_parquet(path)
        else:
            frame.to_csv(path, index=False)
        return str(path)

    return write


TINY_ENSEMBLE = {"k": 2, "n_blocks": 1, "d_block": 16, "max_epochs": 2, "patience": 2, "n_bins": 8,
                 "batch_size": 128}


@pytest.fixture
def tiny_benchmark(tmp_path):
    """A factory ``(**changes) -> Path``: a two-table, two-model benchmark file ``tmp_path/tiny.yaml``."""

    def write(**changes) -> Path:
        config = {
            "name": "tiny",
            "seeds": [0],
            "data": {"max_rows": 400, "missing": "impute"},
            "datasets": ["mlc_churn", "diamonds"],
            "common": {"ensemble": TINY_ENSEMBLE},
            "models": {"lometab": {"kind": "ensemble", "params": {"adapter": "lometab", "rank": 2}},
                       "xgboost": {"kind": "xgboost", "params": {"n_estimators": 30}}},
            **changes,
        }
        path = tmp_path / "tiny.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path

    return write
