"""experiments.claims_glm_regression: metrics by hand, the reference sampler's fixed point, verdicts."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from torch import nn

from experiments import claims_glm_regression as glm_regression
from experiments.claim_rows import VERDICTS, ClaimRow
from ripieno.framework.uq import FullNetworkLinearization, LastLayerLinearization


def test_interval_ece_by_hand() -> None:
    # N(0, 1) predictive; |y| = 0.1, 0.5, 1.0, 2.0. Central 50% interval: |y| < 0.674 holds 2 of 4;
    # 90%: |y| < 1.645 holds 3 of 4. Gaps 0 and 0.15: mean |gap| 0.075, mean squared gap 0.01125.
    y = torch.tensor([0.1, -0.5, 1.0, -2.0])
    mean, var = torch.zeros(4), torch.ones(4)
    coverage = glm_regression.central_coverage(y, mean, var, [0.0, 0.5, 0.9, 1.0])
    assert coverage.tolist() == [0.0, 0.5, 0.75, 1.0]
    assert glm_regression.interval_ece(y, mean, var, [0.5, 0.9]) == pytest.approx(0.075)
    assert glm_regression.interval_ece(y, mean, var, [0.5, 0.9], power=2) == pytest.approx(0.01125)
    # Shift and scale leave it unchanged; the default levels are 0.05 .. 0.95.
    moved = glm_regression.interval_ece(3 * y + 1, mean + 1, 9 * var)
    assert moved == glm_regression.interval_ece(y, mean, var)
    assert glm_regression.ECE_LEVELS[0] == 0.05 and glm_regression.ECE_LEVELS[-1] == 0.95


def test_scores_nll_is_the_full_gaussian_log_density() -> None:
    y, mean, var = torch.tensor([1.0, -1.0]), torch.tensor([0.0, 0.0]), torch.tensor([1.0, 4.0])
    expected = 0.5 * (math.log(2 * math.pi) + 1.0) + 0.5 * (math.log(2 * math.pi * 4.0) + 0.25)
    out = glm_regression.scores(y, mean, var)
    assert out["nll"] == pytest.approx(expected / 2) and out["rmse"] == pytest.approx(1.0)


def test_ternary_search_finds_the_minimum_of_a_convex_function() -> None:
    found = glm_regression.ternary_search(lambda c: (c - 37.0) ** 2, 0.01, 10000.0, 100)
    assert found == pytest.approx(37, abs=0.01)


def _jacobian(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    params = dict(net.named_parameters())
    jac = torch.func.jacrev(lambda p: torch.func.functional_call(net, p, (x,)).flatten())(params)
    return torch.cat([jac[name].flatten(1) for name in params], dim=1)  # (N, P)


@pytest.mark.parametrize("glm", ["last_layer", "full"])
def test_reference_solve_converges_to_the_fitted_null_space_draw(glm: str) -> None:
    """Run to convergence, ``z = (I - P) gamma eps + J^+ (y - f)``, ``P`` the row-space projector of ``J``.

    The iteration fits the training targets from ``gamma eps``: the part of the start in the null
    space of the (sampled part of the) Jacobian stays, the rest becomes the minimum-norm fit.
    """
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 1))
    x, y = torch.randn(4, 3), torch.randn(4, 1)
    if glm == "last_layer":
        lin = LastLayerLinearization(net, lambda batch: batch)
        features, outputs = lin.features_and_outputs(x)
        jac = features.double()  # d f / d W: the sampled weights (the bias stays)
    else:
        lin = FullNetworkLinearization(net, lambda batch: batch)
        features, outputs = lin.features_and_outputs(x)
        jac = _jacobian(net, x).detach().double()
    lr = 1.0 / float(torch.linalg.eigvalsh(jac.T @ jac / 4).max())
    z = glm_regression.reference_solve(lin, [(features, outputs, y)], n_samples=3, gamma=0.5, epochs=4000,
                                       lr=lr, momentum=0.9, weights_only=glm == "last_layer", seed=7)
    eps = torch.randn(3, lin.n_params, generator=torch.Generator().manual_seed(7)).double()
    n = jac.shape[1]
    pinv = torch.linalg.pinv(jac)
    start = 0.5 * eps[:, :n]
    expected = start @ (torch.eye(n, dtype=torch.float64) - pinv @ jac).T + (pinv @ (y - outputs).double()).T
    assert torch.allclose(z[:, :n].double(), expected, atol=2e-4)
    if glm == "last_layer":
        assert torch.equal(z[:, n:], torch.zeros(3, 1))  # the bias is not sampled


def _frame(ll: dict[str, list[float]], dnn: dict[str, list[float]], tables: tuple[str, ...] = ("a", "b"),
           ours_like_reference: bool = True) -> pd.DataFrame:
    """Three seeds per (table, method); ``ll`` / ``dnn`` give per-seed values of every metric."""
    rows = []
    for table in tables:
        for sampler in ("LinearSampling", "exact GGN"):
            for method, values in ((f"LL-GLM ({sampler})", ll), (f"DNN-GLM ({sampler})", dnn)):
                if sampler == "exact GGN" and not ours_like_reference:
                    values = dnn
                for seed in range(3):
                    rows.append({"table": table, "seed": seed, "method": method,
                                 **{m: values[m][seed] for m in glm_regression.METRICS}})
        rows += [{"table": table, "seed": s, "method": "MAP", "rmse": 0.5, "nll": 1.0, "ece": 0.05}
                 for s in range(3)]
    return pd.DataFrame(rows)


SAME = {"rmse": [0.50, 0.52, 0.48], "nll": [1.00, 1.10, 0.90], "ece": [0.05, 0.06, 0.04]}


def _row(frame: pd.DataFrame, reduced: bool = False) -> ClaimRow:
    return glm_regression.claim_row(frame, glm_regression.FULL, reduced, "cmd")


def test_identical_posteriors_match_everywhere() -> None:
    row = _row(_frame(SAME, SAME))
    assert row.verdict == "reproduced" and "Ours (reproduced by the same rule)" in row.note
    assert "match: a rmse, a nll, a ece, b rmse, b nll, b ece" in row.note
    assert "LL a 0.500 / 1.000 / 0.050" in row.reference and row.seeds == "0, 1, 2"
    assert _row(_frame(SAME, SAME), reduced=True).verdict == "inconclusive"  # reduced runs never decide


def test_a_consistent_gap_beyond_the_margin_differs() -> None:
    worse_nll = {**SAME, "nll": [v + 0.5 for v in SAME["nll"]]}  # 0.5 nats on every seed: margin 0.1
    row = _row(_frame(worse_nll, SAME))
    assert row.verdict == "partly" and "differs: a nll, b nll" in row.note
    everything = {"rmse": [1.0, 1.02, 0.98], "nll": [2.0, 2.1, 1.9], "ece": [0.2, 0.21, 0.19]}
    row = _row(_frame(everything, SAME, ours_like_reference=False))
    assert row.verdict == "not reproduced" and "Ours (reproduced by the same rule)" in row.note


def test_noisy_differences_are_unresolved() -> None:
    # Paired differences -0.3, 0, +0.3: mean 0 but 2 se = 0.35 > every margin.
    noisy = {m: [v - 0.3, v, v + 0.3] for m, v in (("rmse", 0.5), ("nll", 1.0), ("ece", 0.05))}
    flat = {"rmse": [0.5] * 3, "nll": [1.0] * 3, "ece": [0.05] * 3}
    assert _row(_frame(noisy, flat)).verdict == "inconclusive"
    assert glm_regression.cell_outcome([1.0], [1.0], 0.1) == "unresolved"  # one seed: no interval
    assert glm_regression.margin_of("rmse", [0.4, 0.6]) == pytest.approx(0.025)  # 5% of DNN-GLM's mean


def test_reduced_run_writes_a_well_formed_row(tmp_path) -> None:
    """The CI setting end to end (about 5 s): one inconclusive row, every file, our NLL = the callback's."""
    rows = glm_regression.claim_rows(tmp_path, reduced=True)
    assert len(rows) == 1 and isinstance(rows[0], ClaimRow)
    row = rows[0]
    assert row.verdict in VERDICTS and row.verdict == "inconclusive" and row.method == "LL-GLM / DNN-GLM"
    assert "--reduced" in row.command and "LinearSampling" in row.reference and "exact GGN" in row.ours
    assert all([row.claim, row.data, row.baseline, row.seeds, row.note])
    frame = pd.read_csv(tmp_path / "glm_regression.csv")
    budget = glm_regression.REDUCED
    assert len(frame) == len(budget.tables) * len(budget.seeds) * len(glm_regression.METHODS)
    assert set(frame["method"]) == set(glm_regression.METHODS)
    assert frame[["rmse", "nll", "ece", "ece_paper"]].notna().all().all()
    assert frame["ece"].between(0, 1).all() and (frame["rmse"] > 0).all()
    reference = frame[frame["method"].str.endswith("(LinearSampling)")]
    assert reference["scale"].between(0.01, 10000).all() and reference["fit_mse"].notna().all()
    # Our rows' NLL is the callback's own uq/test/nll, moved from target units to standardised ones.
    ours = frame[frame["method"].str.endswith("(exact GGN)")]
    assert ours["prior_precision"].isin(budget.prior_grid).all()
    standardised = ours["logged_nll"] - ours["target_std"].map(math.log)
    assert (standardised - ours["nll"]).abs().max() < 1e-3
    for name in ("glm_regression.md", "claims.md", "settings.json"):
        assert (tmp_path / name).is_file(), name
    assert "LL-GLM matches DNN-GLM" in (tmp_path / "claims.md").read_text()
