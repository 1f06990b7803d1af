"""The benchmark's report: per-table results, mean ranks, wins, and published numbers beside ours.

Read from ``results.csv`` (one row per finished cell). Per data set, every model's mean ± std over
seeds of the primary metric (accuracy for classification, RMSE for regression; NLL beside), the
best in bold only where it beats the second by more than the larger of their seed spreads. Overall:
each model's mean rank ± std over the data sets (ranks of the seed means, ties averaged: the
LoMETab and TabM papers' statistic), first places, top-3 rate, win / tie / loss of LoMETab against
TabM and against the best GBDT of each data set (a win is better by more than the spread), mean
training seconds and median parameter count; and a box plot of the ranks (``ranks.png``).

Uncertainty (``uncertainty``'s scores, where the cells recorded them): per data set and model the
seed means of NLL, ECE, Brier, LAC / APS coverage and set size (classification), and of RMSE, NLL,
CRPS, the quantile score QS, coverage, width and Winkler score of the ``abs``, ``norm`` and ``cqr``
intervals (regression); each
model's mean rank per metric over the data sets where every model that has the metric has it
(``UNCERTAINTY``: lower is better for each ranked one), and a figure of coverage against set size or
width (``coverage.png``). Coverage is shown, not ranked: split conformal gives every model at least
``1 - alpha`` on exchangeable rows, so its differences between models are the test rows' sampling
noise (a binomial standard error of about ``sqrt(alpha (1 - alpha) / n)``), not quality; set size,
width and the Winkler score compare models at that coverage.

A data set whose test split is too small to rank models (fewer than ``SMALL_TEST_ROWS`` rows, or a
class with fewer than ``SMALL_CLASS_ROWS`` test rows) is shown and flagged, never ranked, never in
bold and never counted as a win, tie or loss: a single row there moves accuracy by whole points.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from scipy.stats import rankdata

from ripieno.framework.benchmark.models import GBDT_KINDS, PRIMARY
from ripieno.framework.benchmark.uncertainty import ECE_BINS
from ripieno.framework.outputs.output_files import atomic_output

PUBLISHED: dict[str, dict[str, float]] = {
    "keel_letter": {"MLP": 0.9745, "CatBoost": 0.9709, "XGBoost": 0.9643, "RealMLP": 0.9836},
    "keel_satimage": {"LightGBM": 0.9162, "XGBoost": 0.9142, "CatBoost": 0.9135, "MLP": 0.8993},
    "diamonds": {
        "TabM + PLE": 0.1302,
        "TabM": 0.1310,
        "MLP": 0.1404,
        "CatBoost": 0.1335,
        "LightGBM": 0.1359,
        "XGBoost": 0.1368,
    },
}
"""Published results on the same tables (TALENT's tuned accuracy; the TabM paper's RMSE of standardised log
price), with other splits and tuning: shown beside ours, never ranked with them."""
PUBLISHED_SOURCE = {
    "keel_letter": "TALENT, tuned, its own split (accuracy)",
    "keel_satimage": "TALENT, tuned, its own split (accuracy)",
    "diamonds": "TabM paper, tuned, 15 seeds, its split, RMSE of the standardised log price",
}


SMALL_TEST_ROWS = 50
"""Test rows below which a data set is not ranked (one row is 2 points of accuracy or more)."""
SMALL_CLASS_ROWS = 5
"""Test rows of the smallest class below which a classification data set is not ranked."""


def _too_small(group: pd.DataFrame) -> bool:
    """Whether a data set's cells had a test split too small to rank (module docstring)."""
    rows = group["test_rows"].dropna() if "test_rows" in group else pd.Series(dtype=float)
    smallest = (
        group["test_smallest_class"].dropna() if "test_smallest_class" in group else pd.Series(dtype=float)
    )
    few_rows = len(rows) > 0 and rows.min() < SMALL_TEST_ROWS
    few_of_a_class = len(smallest) > 0 and smallest.min() < SMALL_CLASS_ROWS
    return bool(few_rows or few_of_a_class)


def summary(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (data set, model): task, metric, mean, std, seeds, seconds, parameters, too small."""
    rows = []
    small = {dataset: _too_small(group) for dataset, group in results.groupby("dataset", sort=False)}
    for (dataset, model), group in results.groupby(["dataset", "model"], sort=False):
        task = group["task"].iloc[0]
        metric, mode = PRIMARY[task]
        values = group[f"test_{metric}"].astype(float)
        nll = group["test_nll"].astype(float) if "test_nll" in group and task != "regression" else None
        rows.append(
            {
                "dataset": dataset,
                "model": model,
                "kind": group["kind"].iloc[0],
                "task": task,
                "metric": metric,
                "mode": mode,
                "mean": values.mean(),
                "std": values.std(ddof=1) if len(values) > 1 else 0.0,
                "seeds": len(values),
                "nll": nll.mean() if nll is not None else math.nan,
                "seconds": group["seconds"].astype(float).mean(),
                "n_parameters": group["n_parameters"].median(),
                "too_small": small[dataset],
                "test_rows": group["test_rows"].min() if "test_rows" in group else math.nan,
            }
        )
    return pd.DataFrame(rows)


def _rankable(table: pd.DataFrame) -> pd.DataFrame:
    """The rows of data sets whose test split is large enough to rank (module docstring)."""
    return table[~table["too_small"]] if "too_small" in table else table


def ranks(table: pd.DataFrame) -> pd.DataFrame:
    """Rank of each model per data set (1 = best; ties averaged), data sets with every model only.

    Data sets too small to rank are left out.
    """
    models = list(dict.fromkeys(table["model"]))
    out = {}
    for dataset, group in _rankable(table).groupby("dataset", sort=False):
        if set(group["model"]) != set(models):
            continue
        sign = -1.0 if group["mode"].iloc[0] == "max" else 1.0
        values = group.set_index("model").loc[models, "mean"].to_numpy() * sign
        out[dataset] = rankdata(values, method="average")
    return pd.DataFrame(out, index=models).T


def compare(
    table: pd.DataFrame, model: str, other: str | None = None, *, best_gbdt: bool = False
) -> dict[str, int]:
    """Win / tie / loss of ``model`` against ``other`` (or each data set's best GBDT) over data sets.

    Data sets too small to rank count as none of the three.
    """
    counts = {"win": 0, "tie": 0, "loss": 0}
    for _, group in _rankable(table).groupby("dataset", sort=False):
        rows = group.set_index("model")
        if model not in rows.index:
            continue
        if best_gbdt:
            trees = rows[rows["kind"].isin(GBDT_KINDS)]
            if trees.empty:
                continue
            better = trees["mean"].idxmax() if rows["mode"].iloc[0] == "max" else trees["mean"].idxmin()
            opponent = rows.loc[better]
        elif other in rows.index:
            opponent = rows.loc[other]
        else:
            continue
        mine = rows.loc[model]
        gap = (mine["mean"] - opponent["mean"]) * (1 if mine["mode"] == "max" else -1)
        spread = max(float(mine["std"]), float(opponent["std"]))
        counts["win" if gap > spread else "loss" if gap < -spread else "tie"] += 1
    return counts


def overall(table: pd.DataFrame) -> pd.DataFrame:
    """Per model: mean rank ± std, first places, top-3 rate, mean seconds, median parameters."""
    rank = ranks(table)
    rows = []
    for model in rank.columns:
        column = rank[model]
        rows.append(
            {
                "model": model,
                "mean_rank": column.mean(),
                "rank_std": column.std(ddof=1) if len(column) > 1 else 0.0,
                "first": int((column <= 1.0).sum()),
                "top3": float((column <= 3.0).mean()) if len(column) else math.nan,
                "datasets": len(column),
                "seconds": table.loc[table["model"] == model, "seconds"].mean(),
                "n_parameters": table.loc[table["model"] == model, "n_parameters"].median(),
            }
        )
    return pd.DataFrame(rows).sort_values("mean_rank")


def _cell(row: pd.Series, digits: int = 4) -> str:
    text = f"{row['mean']:.{digits}f}"
    return text + (f" ± {row['std']:.{digits}f}" if row["seeds"] > 1 else "")


def per_dataset_markdown(table: pd.DataFrame) -> list[str]:
    """The per-data-set table (bold: best by more than the spread of it and the second)."""
    models = list(dict.fromkeys(table["model"]))
    lines = [
        "| data set | task | metric | " + " | ".join(models) + " |",
        "|---|---|---|" + "---|" * len(models),
    ]
    for dataset, group in table.groupby("dataset", sort=False):
        rows = group.set_index("model")
        ordered = rows.sort_values("mean", ascending=rows["mode"].iloc[0] == "min")
        bold = None
        small = bool(rows.get("too_small", pd.Series([False])).any())
        if len(ordered) > 1 and not small:
            first, second = ordered.iloc[0], ordered.iloc[1]
            if abs(first["mean"] - second["mean"]) > max(first["std"], second["std"]):
                bold = ordered.index[0]
        cells = []
        for model in models:
            if model not in rows.index:
                cells.append("")
                continue
            text = _cell(rows.loc[model])
            cells.append(f"**{text}**" if model == bold else text)
        name = f"{dataset} (too small to rank)" if small else dataset
        lines.append(
            f"| {name} | {rows['task'].iloc[0]} | {rows['metric'].iloc[0]} | " + " | ".join(cells) + " |"
        )
    return lines


def rank_figure(table: pd.DataFrame, path: Path) -> Path | None:
    """A box plot of each model's ranks over the data sets (``None`` with fewer than two data sets)."""
    rank = ranks(table)
    if len(rank) < 2:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    order = rank.mean().sort_values().index.tolist()
    figure = Figure(figsize=(1.2 + 0.9 * len(order), 3.6), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.boxplot([rank[m].to_numpy() for m in order], tick_labels=order, showmeans=True)
    axes.set_ylabel("rank per data set (1 = best)")
    axes.set_title(f"ranks over {len(rank)} data sets (triangle: mean)")
    axes.invert_yaxis()
    with atomic_output(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=110)
    return path


UNCERTAINTY: tuple[tuple[str, str, str, bool], ...] = (
    ("classification", "nll", "NLL", True),
    ("classification", "ece", "ECE", True),
    ("classification", "brier", "Brier", True),
    ("classification", "lac_coverage", "LAC coverage", False),
    ("classification", "lac_set_size", "LAC set size", True),
    ("classification", "aps_coverage", "APS coverage", False),
    ("classification", "aps_set_size", "APS set size", True),
    ("regression", "rmse", "RMSE", False),
    ("regression", "nll", "NLL", True),
    ("regression", "crps", "CRPS", True),
    ("regression", "qs", "QS", True),
    ("regression", "abs_coverage", "abs coverage", False),
    ("regression", "abs_width", "abs width", True),
    ("regression", "abs_winkler", "abs Winkler", True),
    ("regression", "norm_coverage", "norm coverage", False),
    ("regression", "norm_width", "norm width", True),
    ("regression", "norm_winkler", "norm Winkler", True),
    ("regression", "cqr_coverage", "CQR coverage", False),
    ("regression", "cqr_width", "CQR width", True),
    ("regression", "cqr_winkler", "CQR Winkler", True),
)
"""(task family, metric, label, ranked) of the uncertainty tables: a ranked metric is better lower;
coverage (and RMSE, ranked as the primary metric) is shown beside them (module docstring)."""
COVERAGE_PLOTS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "classification": (("lac", "lac_coverage", "lac_set_size"), ("aps", "aps_coverage", "aps_set_size")),
    "regression": (("abs", "abs_coverage", "abs_width"), ("norm", "norm_coverage", "norm_width"),
                   ("cqr", "cqr_coverage", "cqr_width")),
}
"""Per task family, the (method, coverage column, size column) pairs of ``coverage.png``."""


def _family(task: str) -> str:
    return "regression" if task == "regression" else "classification"


def uncertainty_means(results: pd.DataFrame) -> pd.DataFrame:
    """One row per (data set, model): family, too small, and the seed mean of each ``test_`` metric."""
    small = {dataset: _too_small(group) for dataset, group in results.groupby("dataset", sort=False)}
    metrics = list(dict.fromkeys(metric for _, metric, _, _ in UNCERTAINTY))
    rows = []
    for (dataset, model), group in results.groupby(["dataset", "model"], sort=False):
        row = {"dataset": dataset, "model": model, "family": _family(group["task"].iloc[0]),
               "too_small": small[dataset]}
        for metric in metrics:
            column = group.get(f"test_{metric}")
            row[metric] = math.nan if column is None else pd.to_numeric(column, errors="coerce").mean()
        rows.append(row)
    return pd.DataFrame(rows)


def metric_ranks(means: pd.DataFrame, family: str, metric: str) -> pd.DataFrame:
    """Ranks (1 = lowest, ties averaged) of ``metric`` per data set of ``family``, data sets x models.

    The models are those with a value of ``metric`` on some rankable data set of ``family``; only data
    sets where each of them has one are ranked.
    """
    rows = means[(means["family"] == family) & ~means["too_small"] & means[metric].notna()]
    models = list(dict.fromkeys(rows["model"]))
    out = {}
    for dataset, group in rows.groupby("dataset", sort=False):
        if set(group["model"]) == set(models):
            out[dataset] = rankdata(group.set_index("model").loc[models, metric].to_numpy(), method="average")
    return pd.DataFrame(out, index=models).T


def _number(value: float, metric: str) -> str:
    if pd.isna(value):
        return ""
    return f"{value:.3f}" if metric.endswith("coverage") else f"{value:.4g}"


def uncertainty_markdown(results: pd.DataFrame) -> list[str]:
    """The uncertainty section: per data set and model, then mean ranks per metric (module docstring)."""
    means = uncertainty_means(results)
    alpha = pd.to_numeric(results["alpha"], errors="coerce").dropna() if "alpha" in results else pd.Series()
    lines: list[str] = []
    for family in ("classification", "regression"):
        rows = means[means["family"] == family]
        shown = [(m, label, ranked) for f, m, label, ranked in UNCERTAINTY
                 if f == family and rows[m].notna().any()]
        if rows.empty or all(m in ("nll", "rmse") for m, _, _ in shown):
            continue  # cells recorded before uncertainty scores: NLL is in the per-data-set table
        lines += [f"### {family.capitalize()}", "",
                  "| data set | model | " + " | ".join(label for _, label, _ in shown) + " |",
                  "|---|---|" + "---|" * len(shown)]
        for row in rows.itertuples():
            name = f"{row.dataset} (too small to rank)" if row.too_small else row.dataset
            values = " | ".join(_number(getattr(row, m), m) for m, _, _ in shown)
            lines.append(f"| {name} | {row.model} | {values} |")
        lines.append("")
        columns: list[tuple[str, pd.Series, str]] = []  # header, value per model, its format
        for metric, label, ranked in shown:
            if ranked:
                rank = metric_ranks(means, family, metric)
                if rank.shape[1] >= 2 and len(rank):  # one model alone has nothing to rank against
                    columns.append((f"{label} rank ({len(rank)})", rank.mean(), ".2f"))
            elif metric.endswith("coverage"):
                rankable = rows[~rows["too_small"]]
                columns.append((f"{label} (mean)", rankable.groupby("model")[metric].mean(), ".3f"))
        if not columns:
            continue
        lines += [f"Mean rank per metric over the {family} data sets (1 = best, lower metric better;"
                  " in brackets: data sets ranked), and mean coverage:", "",
                  "| model | " + " | ".join(header for header, _, _ in columns) + " |",
                  "|---|" + "---|" * len(columns)]
        for model in dict.fromkeys(rows["model"]):
            cells = [format(values[model], spec) if pd.notna(values.get(model, math.nan)) else ""
                     for _, values, spec in columns]
            lines.append(f"| {model} | " + " | ".join(cells) + " |")
        lines.append("")
    if not lines:
        return []
    conformal = ""
    if len(alpha) and "calibrate_on" in results:
        on = results["calibrate_on"].dropna().iloc[0]
        used = pd.to_numeric(results["calibration_rows"], errors="coerce")
        source = "training rows carved before fitting" if on == "train" else "the validation rows"
        counts = f"{used.min():.0f}" + (f"-{used.max():.0f}" if used.max() > used.min() else "")
        conformal = (
            f" Conformal sets (LAC, APS) and intervals (abs: absolute residuals; norm: residuals over the"
            f" members' spread or the predicted standard deviation; CQR: conformalised quantile regression on"
            f" a model's outer quantiles) at {1 - alpha.iloc[0]:.0%}, calibrated on"
            f" {source} ({counts} rows per table). Coverage is shown, not ranked: split conformal gives every"
            " model the target coverage, so its differences are the test rows' sampling noise; set size,"
            " width and the Winkler score compare models at that coverage."
        )
    return [
        "## Uncertainty",
        "",
        f"Test rows. ECE: top-label, {ECE_BINS} equal-width bins; Brier: squared error summed over classes;"
        " regression NLL and CRPS (closed form) only for models with a predictive distribution, and QS"
        " (twice the mean pinball loss at the levels 0.05, 0.10, ..., 0.95, CRPS's quantile decomposition"
        f" with equal weights) for those and for quantile models.{conformal}",
        "",
        *lines,
    ]


def coverage_figure(results: pd.DataFrame, path: Path) -> Path | None:
    """Coverage against mean set size (classification) or width (regression) per model (``None``: no data).

    Small points: one data set (seed means); large: the model's mean over data sets. Widths are divided
    by the median ``abs`` width of their data set's models, so tables in other units share an axis.
    """
    means = uncertainty_means(results)
    panels = [f for f, pairs in COVERAGE_PLOTS.items()
              if any(means.loc[means["family"] == f, c].notna().any() for _, c, _ in pairs)]
    if not panels:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    models = list(dict.fromkeys(means["model"]))
    colours = {m: f"C{i % 10}" for i, m in enumerate(models)}
    markers = {"lac": "o", "aps": "s", "abs": "o", "norm": "s", "cqr": "^"}
    alpha = pd.to_numeric(results["alpha"], errors="coerce").dropna() if "alpha" in results else pd.Series()
    figure = Figure(figsize=(5.2 * len(panels), 4.0), layout="constrained")
    FigureCanvasAgg(figure)
    for i, family in enumerate(panels):
        axes = figure.add_subplot(1, len(panels), i + 1)
        rows = means[means["family"] == family].copy()
        if family == "regression":
            scale = rows.groupby("dataset")["abs_width"].transform("median")
            for _, _, size in COVERAGE_PLOTS[family]:
                rows[size] = rows[size] / scale
        for method, cover, size in COVERAGE_PLOTS[family]:
            for model, group in rows.groupby("model", sort=False):
                group = group[group[cover].notna() & group[size].notna()]
                if group.empty:
                    continue
                style = {"color": colours[model], "marker": markers[method]}
                axes.scatter(group[size], group[cover], s=14, alpha=0.35, linewidths=0, **style)
                axes.scatter(group[size].mean(), group[cover].mean(), s=70, edgecolors="black", **style)
        if len(alpha):
            axes.axhline(1 - alpha.iloc[0], color="grey", linestyle="--", linewidth=1)
        shapes = {"o": "circle", "s": "square", "^": "triangle"}
        pairs = ", ".join(f"{m}: {shapes[markers[m]]}" for m, _, _ in COVERAGE_PLOTS[family])
        axes.set_xlabel(
            "mean set size" if family == "classification" else "mean width / the data set's median abs width"
        )
        axes.set_ylabel("coverage")
        axes.set_title(f"{family}: {pairs}", fontsize=9)
    handles = [figure.axes[0].scatter([], [], color=colours[m], label=m) for m in models]
    figure.legend(handles=handles, loc="outside right upper", fontsize=8)
    with atomic_output(path, "wb") as handle:
        figure.savefig(handle, format="png", dpi=110)
    return path


CAPPED_SHARE = 0.05
"""Above this share of a model's cells ending at their cap, the report warns: its rank may measure the cap."""


def capped_markdown(results: pd.DataFrame) -> list[str]:
    """How many cells ended at their epoch / tree cap (``capped``), not by early stopping, per model.

    Example:
        >>> frame = pd.DataFrame({"model": ["a", "a", "b", "b"], "capped": [True, False, False, False],
        ...                       "iteration_cap": [50, 50, 4000, 4000]})
        >>> lines = capped_markdown(frame)
        >>> lines[2].split(";")[0]
        '1 of 4 cells (25%) ended at their epoch or tree cap, not by early stopping'
        >>> lines[2].split("per model: ")[1]
        'a 1/2 (50%, cap 50), b 0/2 (0%, cap 4000).'
        >>> lines[4].startswith("Over 5% for a:")
        True
    """
    if "capped" not in results or not results["capped"].notna().any():
        return []
    known = results[results["capped"].notna()]
    capped = known["capped"].astype(bool)
    parts, over = [], []
    for model, group in known.groupby("model", sort=False):
        hits = capped[group.index]
        caps = sorted({int(c) for c in group["iteration_cap"].dropna()})
        cap = "/".join(map(str, caps)) if caps else "?"
        parts.append(f"{model} {int(hits.sum())}/{len(hits)} ({hits.mean():.0%}, cap {cap})")
        if hits.mean() > CAPPED_SHARE:
            over.append(str(model))
    lines = ["## Budget: cells that ended at their cap", "",
             f"{int(capped.sum())} of {len(capped)} cells ({capped.mean():.0%}) ended at their epoch or tree"
             f" cap, not by early stopping; per model: {', '.join(parts)}.", ""]
    if over:
        lines += [f"Over {CAPPED_SHARE:.0%} for {', '.join(over)}: its rank may measure the cap rather than"
                  " the model (raise max_epochs / the tree cap, keep the budget with rows, seeds or sizes).",
                  ""]
    return lines


def render(
    results: pd.DataFrame,
    name: str,
    *,
    figure: Path | None = None,
    total: int | None = None,
    coverage: Path | None = None,
) -> str:
    """The report's markdown (module docstring); ``figure`` and ``coverage`` are the figures' files."""
    table = summary(results)
    lines = [f"# Benchmark {name}", ""]
    done = len(results)
    lines.append(
        f"{done} cells finished" + (f" of {total}" if total else "") + f" over {table['dataset'].nunique()}"
        f" data sets and {table['model'].nunique()} models; primary metric: accuracy (classification),"
        " RMSE of the modelled target (regression). Mean ± std over seeds; bold: best by more than the"
        " larger seed spread of it and the second."
    )
    lines += ["", "## Per data set", "", *per_dataset_markdown(table), ""]
    small = table.loc[table["too_small"], "dataset"].unique() if "too_small" in table else []
    if len(small):
        lines += [
            f"Too small to rank: {', '.join(small)}. Their test splits have fewer than {SMALL_TEST_ROWS}"
            f" rows or a class with fewer than {SMALL_CLASS_ROWS}, so one row moves the metric by more"
            " than models differ; they are shown, not ranked, and count as no win, tie or loss.",
            "",
        ]
    ranked = overall(table)
    if len(ranked):
        lines += [
            "## Overall (data sets where every model finished)",
            "",
            "| model | mean rank | first places | top-3 rate | data sets | mean fit seconds"
            " | median params |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in ranked.itertuples():
            lines.append(
                f"| {row.model} | {row.mean_rank:.2f} ± {row.rank_std:.2f} | {row.first} | {row.top3:.0%} |"
                f" {row.datasets} | {row.seconds:.1f} | {row.n_parameters:,.0f} |"
            )
        lines.append("")
    if "lometab" in set(table["model"]):
        lines += ["## LoMETab head to head", ""]
        for other in ("tabm", "tabm_mini", "mlp", "additive"):
            if other in set(table["model"]):
                c = compare(table, "lometab", other)
                lines.append(f"- vs {other}: wins {c['win']}, ties {c['tie']}, losses {c['loss']}")
        if table["kind"].isin(GBDT_KINDS).any():
            c = compare(table, "lometab", best_gbdt=True)
            lines.append(
                f"- vs each data set's best GBDT: wins {c['win']}, ties {c['tie']}, losses {c['loss']}"
            )
        lines.append("")
    published = [d for d in PUBLISHED if d in set(table["dataset"])]
    if published:
        lines += [
            "## Published numbers on the same tables (other splits and tuning: not ranked with ours)",
            "",
        ]
        for dataset in published:
            ours = table[table["dataset"] == dataset]
            mine = ", ".join(f"{r.model} {r.mean:.4f}" for r in ours.itertuples())
            theirs = ", ".join(f"{k} {v:.4f}" for k, v in PUBLISHED[dataset].items())
            lines.append(f"- {dataset}: ours {mine}; {PUBLISHED_SOURCE[dataset]}: {theirs}")
        lines.append("")
    if figure is not None:
        lines += [f"![ranks]({figure.name})", ""]
    lines += capped_markdown(results)
    uncertain = uncertainty_markdown(results)
    if uncertain:
        lines += uncertain
        if coverage is not None:
            lines += [f"![coverage against set size and width]({coverage.name})", ""]
    return "\n".join(lines)
