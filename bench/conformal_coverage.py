"""Split conformal's coverage on shipped tables: ripieno's ensembles beside LightGBM and XGBoost.

Each model trains once on half of a table (a seeded permutation); the other half, rows it never saw,
is split ``--rounds`` times at random into ``n`` calibration rows and test rows. Printed per table,
model and score: the mean test coverage of the ``1 - alpha`` sets / intervals with its Monte Carlo
standard error, the exact bounds ``[1 - alpha, 1 - alpha + 1 / (n + 1)]``, whether the mean is
within them (four standard errors), and the mean set size or interval width (smaller is better at
equal coverage). ``tests/test_conformal_coverage.py`` runs a fixed-seed subset.

    OMP_NUM_THREADS=1 python bench/conformal_coverage.py [--rounds 1000] [--alpha 0.1]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
import torch

from ripieno.datamodules.tabular_sources import SOURCES
from ripieno.framework.methods.estimators import EnsembleClassifier, EnsembleRegressor
from ripieno.framework.uq.conformal import SplitConformal
from ripieno.framework.uq.split_coverage import random_split_coverage

TABLES = ["wine", "penguins", "breast_cancer", "diabetes", "concrete", "boston"]
MODELS = ["lometab", "tabm", "lightgbm", "xgboost"]


def _model(name: str, task: str, seed: int):  # noqa: ANN202 - an estimator
    if name in ("lometab", "tabm"):
        cls = EnsembleRegressor if task == "regression" else EnsembleClassifier
        adapter = "lometab" if name == "lometab" else "rank1"
        return cls(adapter=adapter, k=8, d_block=64, n_blocks=2, max_epochs=40, random_state=seed)
    if name == "lightgbm":
        import lightgbm

        cls = lightgbm.LGBMRegressor if task == "regression" else lightgbm.LGBMClassifier
        return cls(n_estimators=200, random_state=seed, verbose=-1)
    import xgboost

    cls = xgboost.XGBRegressor if task == "regression" else xgboost.XGBClassifier
    return cls(n_estimators=200, random_state=seed, enable_categorical=True)


def _frame(name: str):  # noqa: ANN202 - (features, target)
    source = SOURCES[name]
    frame = source.load().drop(columns=source.drop, errors="ignore").dropna(subset=[source.target])
    y = frame.pop(source.target)
    for column in source.categorical:
        if column in frame:
            frame[column] = frame[column].astype("category")
    if source.target_transform == "log":
        y = np.log(y)
    return frame, y.to_numpy(), source.task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--alpha", type=float, default=0.1)
    parser.add_argument("--tables", nargs="+", default=TABLES)
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    header = f"{'table':<14}{'model':<10}{'score':<11}{'coverage':>16}{'bounds':>17}  within"
    print(f"{header}  {'size/width':>10}")
    for table in args.tables:
        x, y, task = _frame(table)
        order = np.random.default_rng(args.seed).permutation(len(x))
        train, pool = order[: len(x) // 2], order[len(x) // 2:]
        for name in args.models:
            model = _model(name, task, args.seed)
            if task == "regression":
                model.fit(x.iloc[train], y[train])
                target = torch.as_tensor(y[pool], dtype=torch.float64)
                point = np.asarray(model.predict(x.iloc[pool]), dtype=np.float64)
                scored = {"absolute": torch.as_tensor(point)}
                if hasattr(model, "predict_members"):
                    members = torch.as_tensor(model.predict_members(x.iloc[pool]))
                    scored["normalized"] = (members.mean(1), members.std(1, correction=0).clamp_min(1e-9))
            else:
                codes = np.unique(y, return_inverse=True)[1]
                model.fit(x.iloc[train], codes[train])
                target = torch.as_tensor(codes[pool])
                probs = torch.as_tensor(np.asarray(model.predict_proba(x.iloc[pool]), dtype=np.float64))
                scored = {"lac": probs, "aps": probs}
            for method, outputs in scored.items():
                extra = {"include_last_label": "randomized"} if method == "aps" else {}
                result = random_split_coverage(SplitConformal(method, args.alpha, **extra), outputs,
                                               target, n_calibration=len(pool) // 2, rounds=args.rounds,
                                               seed=args.seed)
                print(f"{table:<14}{name:<10}{method:<11}{result.mean:>9.4f} ± {result.standard_error:.4f}"
                      f"   [{result.lower:.3f}, {result.upper:.3f}]  {'yes' if result.within() else 'NO ':>6}"
                      f"  {result.mean_size:>10.4g}", flush=True)


if __name__ == "__main__":
    main()
