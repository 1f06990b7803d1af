"""TabularDataModule: reproducible splits, train-only preprocessing, clear input errors."""

import numpy as np
import pandas as pd
import pytest
import torch
from helpers.tables import make_table
from sklearn.preprocessing import QuantileTransformer

from ripieno.datamodules import SplitSettings, TabularDataError, TabularDataModule


def _dm(path, **kwargs):
    kwargs.setdefault("target", "y")
    kwargs.setdefault("categorical", ["colour"])
    kwargs.setdefault("n_bins", 8)
    return TabularDataModule(dataset=None, path=path, **kwargs)


def test_csv_regression_spec_and_split_sizes(table_csv):
    dm = _dm(table_csv("regression", n=200), split=SplitSettings(val_size=0.2, test_size=0.25))
    spec = dm.spec
    assert spec.task == "regression"
    assert spec.num_feature_names == ["x1", "x2", "count"]
    assert spec.cat_cardinalities == [4]  # 3 colours + the unknown slot
    assert dm.split_sizes() == {"train": 110, "val": 40, "test": 50}
    assert len(spec.bins) == 3 and all(len(b) >= 2 for b in spec.bins)


def test_split_is_reproducible_by_seed_and_changes_with_it(table_csv):
    path = table_csv("binary")
    y_a = _dm(path, split=SplitSettings(seed=1))._split("test").y
    y_b = _dm(path, split=SplitSettings(seed=1))._split("test").y
    x_c = _dm(path, split=SplitSettings(seed=2))._split("test").x_num
    assert torch.equal(y_a, y_b)
    assert not torch.equal(_dm(path, split=SplitSettings(seed=1))._split("test").x_num, x_c)


def test_numeric_preprocessing_is_fit_on_train_only(table_csv):
    frame = make_table(n=300)
    path = table_csv(frame=frame)
    dm = _dm(path, numeric_transform="standard", numeric_embedding="none")
    train = dm._split("train")
    # Standard scaling fit on train: train columns have mean 0 / std 1 exactly.
    assert torch.allclose(train.x_num.double().mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(train.x_num.double().std(0, unbiased=False), torch.ones(3, dtype=torch.float64),
                          atol=1e-5)
    # Quantile transform: equals sklearn's transformer fit on the training rows (plus tiny noise).
    dm_q = _dm(path, numeric_embedding="none")
    train_idx = _train_indices(dm_q, frame)
    x = frame[["x1", "x2", "count"]].to_numpy()
    noise = np.random.default_rng(0).normal(0.0, 1e-5, x[train_idx].shape) * x[train_idx].std(0)
    qt = QuantileTransformer(n_quantiles=10, output_distribution="normal", subsample=10**9,
                             random_state=0).fit(x[train_idx] + noise)
    expected = qt.transform(x)
    got = torch.cat([dm_q._split(s).x_num for s in ("train", "val", "test")])
    rows = np.concatenate([_split_rows(dm_q, frame, s) for s in ("train", "val", "test")])
    assert np.allclose(got.numpy(), expected[rows], atol=1e-5)


def _split_rows(dm, frame, split):
    """Recover the original row indices of a split from the (unique) target values."""
    lookup = {round(v, 5): i for i, v in enumerate(frame["y"].to_numpy())}
    return np.array([lookup[round(float(v), 5)] for v in dm._split(split).y])


def _train_indices(dm, frame):
    return np.sort(_split_rows(dm, frame, "train"))


def test_unseen_category_uses_unknown_code_and_warns(tmp_path):
    frame = make_table(n=200)
    frame.loc[frame.index[-1], "colour"] = "violet"  # one rare category
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    with pytest.warns(UserWarning, match="unseen in training"):
        dm = _dm(str(path), split=SplitSettings(seed=0))
        dm.setup()
    codes = torch.cat([dm._split(s).x_cat[:, 0] for s in ("train", "val", "test")])
    if (codes == 3).any():  # "violet" landed in val/test: it has the unknown code 3
        assert int((codes == 3).sum()) == 1


def test_parquet_multiclass(table_csv):
    pytest.importorskip("pyarrow")
    dm = _dm(table_csv("multiclass", name="t.parquet"))
    assert dm.spec.task == "multiclass" and dm.spec.n_classes == 3
    assert dm.spec.class_names == ["class_0", "class_1", "class_2"]


def test_shipped_dataset_by_name():
    dm = TabularDataModule("mlc_churn", n_bins=8, max_rows=600)
    assert dm.spec.task == "binary" and dm.spec.class_names == ["no", "yes"]
    assert "state" in dm.spec.cat_feature_names
    batch = next(iter(dm.train_dataloader()))
    assert batch["x_num"].dtype == torch.float32 and batch["x_cat"].dtype == torch.long


def test_train_order_depends_only_on_seed_and_epoch(table_csv):
    dm = _dm(table_csv())
    loader = dm.train_dataloader()
    loader.sampler.set_epoch(3)
    first = torch.cat([b["y"] for b in loader])
    torch.manual_seed(123)  # the global RNG must not matter
    loader.sampler.set_epoch(3)
    assert torch.equal(first, torch.cat([b["y"] for b in loader]))
    loader.sampler.set_epoch(4)
    assert not torch.equal(first, torch.cat([b["y"] for b in loader]))


# ----------------------------------------------------------------- bad input, one test each
def _write(tmp_path, frame, name="bad.csv"):
    path = tmp_path / name
    frame.to_csv(path, index=False)
    return str(path)


def test_error_nan_in_numeric_column(tmp_path):
    frame = make_table()
    frame.loc[5, "x2"] = np.nan
    expected = r"Missing values in the (training rows|table): \{'x2': 1\}.*missing: impute"
    with pytest.raises(TabularDataError, match=expected):
        _ = _dm(_write(tmp_path, frame)).spec


def test_error_inf_in_numeric_column(tmp_path):
    frame = make_table()
    frame.loc[7, "x1"] = np.inf
    with pytest.raises(TabularDataError, match=r"'x1' has 1 infinite value"):
        _ = _dm(_write(tmp_path, frame)).spec


def test_error_text_in_numeric_column(tmp_path):
    frame = make_table()
    frame["count"] = frame["count"].astype(object)
    frame.loc[3, "count"] = "twelve"
    with pytest.raises(TabularDataError, match=r"'count' has non-numeric .* 'twelve'.*categorical"):
        _ = _dm(_write(tmp_path, frame)).spec


def test_error_missing_target_column(table_csv):
    with pytest.raises(TabularDataError, match=r"Target column 'price' not found; the columns are"):
        _ = _dm(table_csv(), target="price").spec


def test_error_empty_split(table_csv):
    with pytest.raises(TabularDataError, match=r"Split\(s\) \['val'\] would be empty"):
        _ = _dm(table_csv(n=20), split=SplitSettings(val_size=0.01)).spec


def test_constant_column_is_dropped_with_a_warning(tmp_path):
    frame = make_table()
    frame["x2"] = 1.5
    with pytest.warns(UserWarning, match=r"Dropping constant column\(s\) \['x2'\]"):
        spec = _dm(_write(tmp_path, frame)).spec
    assert "x2" not in spec.num_feature_names and spec.n_num_features == len(spec.bins)


def test_error_binary_task_with_three_labels(table_csv):
    with pytest.raises(TabularDataError, match=r"task=binary needs exactly 2 labels.*multiclass"):
        _ = _dm(table_csv("multiclass"), task="binary").spec


def test_error_label_only_outside_training(tmp_path):
    frame = make_table(task="binary", n=200)
    # Three rows of a third label: stratification can place them all in val/test only if
    # we force it, so instead a label the model can never learn: a single-row class.
    frame.loc[0, "y"] = "maybe"
    with pytest.raises(TabularDataError, match=r"fewer than 3 rows"):
        _ = _dm(_write(tmp_path, frame), task="multiclass").spec


def test_error_text_labels_for_regression(table_csv):
    with pytest.raises(TabularDataError, match=r"Regression target 'y' has non-numeric values"):
        _ = _dm(table_csv("binary"), task="regression").spec


def test_error_missing_file(tmp_path):
    with pytest.raises(TabularDataError, match=r"nope.csv: does not exist; check data.init_args.path"):
        _ = _dm(str(tmp_path / "nope.csv")).spec


def test_error_unknown_shipped_dataset():
    with pytest.raises(TabularDataError, match=r"Unknown shipped data set 'adult'; choose one of"):
        _ = TabularDataModule("adult").spec


def test_error_log_transform_of_nonpositive_target(table_csv):
    with pytest.raises(TabularDataError, match=r"target_transform=log needs a positive target"):
        _ = _dm(table_csv(), target_transform="log").spec


def test_error_missing_categorical_value(tmp_path):
    frame = make_table()
    frame.loc[2, "colour"] = None
    expected = r"Missing values in the (training rows|table): \{'colour': 1\}"
    with pytest.raises(TabularDataError, match=expected):
        _ = _dm(_write(tmp_path, frame)).spec


def test_error_missing_target_value(tmp_path):
    frame = make_table()
    frame.loc[4, "y"] = np.nan
    with pytest.raises(TabularDataError, match=r"Target 'y' has 1 missing value"):
        _ = _dm(_write(tmp_path, frame)).spec


def test_error_unknown_categorical_column(table_csv):
    with pytest.raises(TabularDataError, match=r"categorical column\(s\) \['shade'\] not found"):
        _ = _dm(table_csv(), categorical=["shade"]).spec


def test_unseen_label_check_names_the_label():
    from ripieno.datamodules.tabular import _check_labels_seen

    y = np.array([0, 0, 1, 1, 2])
    with pytest.raises(TabularDataError, match=r"\['c'\] occur in the test split but not in training"):
        _check_labels_seen(y, np.array([0, 1, 2, 3]), {"test": np.array([4])}, ["a", "b", "c"])


def test_frame_is_not_modified(table_csv):
    path = table_csv()
    before = pd.read_csv(path)
    _ = _dm(path).spec
    pd.testing.assert_frame_equal(before, pd.read_csv(path))


def test_shipped_multiclass_tables_load_offline():
    hpc = TabularDataModule("hpc_data", n_bins=8).spec
    assert (hpc.task, hpc.class_names) == ("multiclass", ["F", "L", "M", "VF"])
    assert hpc.cat_feature_names == ["protocol", "day"] and hpc.n_num_features == 5
    expected = r"Missing values in the training rows: .*'sex'.*missing: impute"
    with pytest.raises(TabularDataError, match=expected):
        _ = TabularDataModule("penguins", n_bins=8).spec
    penguins = TabularDataModule("penguins", n_bins=8, missing="impute").spec
    assert penguins.class_names == ["Adelie", "Chinstrap", "Gentoo"]
    assert "sex__missing" in penguins.cat_feature_names and "rownames" not in penguins.num_feature_names
