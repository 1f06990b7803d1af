"""LOES selection (both variants) against plain, slow oracles written out here in numpy.

The selection code scores candidates from cached Gram blocks (``gram_scorer.GramScorer``) and the
reference variant from per-layer products (``reference._SelectionProducts``) for speed; these
oracles recompute every term from the features themselves, the way the module docstrings define
it: least-squares orthogonalisation, ridge refits, eigenvalues, linear CKA, explicit class-triple
areas and, on a small ``N``, leave-one-out by refitting without each row. Seeded random features
shaped like pooled transformer layers (7 and 25 layers, a shared component, 3-4 classes); selections
must be equal and every score equal to ``rtol=1e-8`` in float64.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch

from ripieno.framework.loes import gram_scorer as gram_scorer_module
from ripieno.framework.loes import greedy as greedy_module
from ripieno.framework.loes import reference as ref
from ripieno.framework.loes import select_layers
from ripieno.framework.loes import selection as selection_module

RTOL, ATOL = 1e-8, 1e-12
COLUMNS = ["ridge_loss", "iso", "red", "tri", "total"]


def layered_features(num_layers: int, n: int, d: int, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Layers sharing a drifting component, with per-layer means and noise; and a base signal."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, d))
    layers = []
    for i in range(num_layers):
        mix = rng.normal(size=(d, d)) / math.sqrt(d)
        noise = (0.5 + i / num_layers) * rng.normal(size=(n, d))
        layers.append(0.8 * base @ mix + noise + rng.normal(size=d))
    return layers, base


# ------------------------------------------------------------------ oracle: ripieno's rule


def _ridge_parts(x: np.ndarray, y: np.ndarray, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """In-sample residual and hat diagonal (intercept included) of ridge with an unpenalised intercept."""
    xc, yc = x - x.mean(0), y - y.mean(0)
    inverse = np.linalg.inv(xc.T @ xc + lam * np.eye(x.shape[1]))
    hat = xc @ inverse @ xc.T + 1.0 / len(x)
    return yc - xc @ inverse @ xc.T @ yc, np.diag(hat)


def oracle_ridge_loss(x: np.ndarray, y: np.ndarray, lam: float, kind: str) -> float:
    residual, leverage = _ridge_parts(x, y, lam)
    if kind == "train":
        return float(np.mean(residual**2))
    return float(np.mean((residual / (1.0 - leverage)[:, None]) ** 2))


def refit_loo_loss(x: np.ndarray, y: np.ndarray, lam: float) -> float:
    """Leave-one-out MSE by refitting the ridge probe without each row in turn."""
    errors = []
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        xm, ym = x[keep].mean(0), y[keep].mean(0)
        xc, yc = x[keep] - xm, y[keep] - ym
        w = np.linalg.solve(xc.T @ xc + lam * np.eye(x.shape[1]), xc.T @ yc)
        errors.append(y[i] - ((x[i] - xm) @ w + ym))
    return float(np.mean(np.square(errors)))


def oracle_isotropy(x: np.ndarray, kind: str) -> float:
    xc = x - x.mean(0)
    eigenvalues = np.linalg.eigvalsh(xc.T @ xc / len(x))
    if kind == "participation":
        return float(eigenvalues.sum() ** 2 / (x.shape[1] * np.sum(eigenvalues**2)))
    eps = 1e-6
    eigenvalues = np.maximum(np.linalg.eigvalsh(xc.T @ xc / len(x) + eps * np.eye(x.shape[1])), eps)
    return float(eigenvalues.mean() / (eigenvalues.std() + eps))


def oracle_cka(x: np.ndarray, s: np.ndarray) -> float:
    xc, sc = x - x.mean(0), s - s.mean(0)
    return float(np.linalg.norm(sc.T @ xc) ** 2 / (np.linalg.norm(xc.T @ xc) * np.linalg.norm(sc.T @ sc)))


def oracle_triangle(features: np.ndarray, labels: np.ndarray, classes: int, scale: float) -> float:
    centroids = np.stack([features[labels == c].mean(0) for c in range(classes)]) / scale
    areas = []
    for a, b, c in itertools.combinations(range(classes), 3):
        u, v = centroids[b] - centroids[a], centroids[c] - centroids[a]
        areas.append(0.5 * math.sqrt(max(u @ u * (v @ v) - (u @ v) ** 2, 0.0)))
    return float(np.mean(areas))


def oracle_ripieno(
    layers: list[np.ndarray], y: np.ndarray | None, labels: np.ndarray | None, k: int, *, lam: float,
    alpha: float, gamma: float, eta: float, iso: str, loss: str, refit_loo: bool = False,
) -> tuple[list[int], list[dict[str, Any]]]:
    """ripieno's greedy rule, every term from the (orthogonalised) features."""
    chosen: list[int] = []
    rows: list[dict[str, Any]] = []
    nan = float("nan")
    for _ in range(k):
        target = y
        if chosen and y is not None:
            s = np.hstack([layers[i] for i in chosen])
            sc, yc = s - s.mean(0), y - y.mean(0)
            target = yc - sc @ np.linalg.solve(sc.T @ sc + lam * np.eye(s.shape[1]), sc.T @ yc)
        step = []
        for layer in (i for i in range(len(layers)) if i not in chosen):
            x = layers[layer]
            ridge = red = tri = nan
            features = x
            if chosen:
                s = np.hstack([layers[i] for i in chosen])
                xc, sc = x - x.mean(0), s - s.mean(0)
                features = xc - sc @ np.linalg.lstsq(sc, xc, rcond=None)[0]
                if np.linalg.norm(features) <= 1e-6 * np.linalg.norm(xc):
                    features = np.zeros_like(features)
                red = oracle_cka(x, s)
                if labels is not None:
                    classes = int(labels.max()) + 1
                    scale = math.sqrt(np.mean(np.sum((x - x.mean(0)) ** 2, axis=1)))
                    tri = 0.0 if classes < 3 else oracle_triangle(features, labels, classes, scale)
            if target is not None:
                ridge = refit_loo_loss(features, target, lam) if refit_loo else oracle_ridge_loss(
                    features, target, lam, loss)
            null = not features.any()
            iso_value = 0.0 if null and iso == "participation" else oracle_isotropy(features, iso)
            total = alpha * (1.0 - iso_value) + sum(
                term for term in (ridge, gamma * red, -eta * tri) if not math.isnan(term))
            step.append({"layer": layer, "ridge_loss": ridge, "iso": iso_value, "red": red, "tri": tri,
                         "total": total})
        chosen.append(min(step, key=lambda row: row["total"])["layer"])
        rows.extend(step)
    return chosen, rows


# ------------------------------------------------------------------ oracle: the public reference


def oracle_reference(
    layers: list[np.ndarray], y: np.ndarray | None, labels: np.ndarray | None, k: int, *, reg: float,
    alpha: float, gamma: float, eta: float, seed: int = 0,
) -> tuple[list[int], list[dict[str, Any]]]:
    """The reference algorithm (``reference`` module docstring), every term from the features."""
    generator = torch.Generator().manual_seed(seed)
    n = len(layers[0])

    def iso(x: np.ndarray) -> float:
        xc = x - x.mean(0)
        # the public code's compute_isotropy: eigenvalues of cov / N + 1e-6 I, clamped, mean / (std + 1e-6)
        eigenvalues = np.linalg.eigvalsh(xc.T @ xc / n + 1e-6 * np.eye(x.shape[1])).clip(min=1e-6)
        return float(eigenvalues.mean() / (eigenvalues.std() + 1e-6))

    def predict(x: np.ndarray, target: np.ndarray) -> np.ndarray:
        xc, ym = x - x.mean(0), target.mean(0)
        w = np.linalg.solve(xc.T @ xc + reg * np.eye(x.shape[1]), xc.T @ (target - ym))
        return xc @ w + ym

    isotropies = [iso(x) for x in layers]
    chosen: list[int] = []
    rows: list[dict[str, Any]] = []
    prediction = None if y is None else np.zeros_like(y)
    nan = float("nan")
    for _ in range(k):
        residual = None if y is None else y - prediction
        best: tuple[float, int, Any] | None = None
        for layer in (i for i in range(len(layers)) if i not in chosen):
            x = layers[layer]
            features = x
            if chosen:
                s = np.hstack([layers[i] for i in chosen])
                sc, xc = s - s.mean(0), x - x.mean(0)
                features = xc - sc @ np.linalg.solve(sc.T @ sc + 1e-6 * np.eye(s.shape[1]), sc.T @ xc)
            ridge = red = tri = nan
            fitted = None
            total = alpha * (1.0 - isotropies[layer])
            if residual is not None:
                fitted = predict(features, residual)
                ridge = float(np.mean((residual - fitted) ** 2))
                total += ridge
            if chosen:
                red = max(float(np.linalg.norm(x.T @ s) / (np.linalg.norm(x) * np.linalg.norm(s)))
                          for s in (layers[c] for c in chosen))
                total += gamma * red
                if labels is not None:
                    classes = int(labels.max()) + 1
                    tri = 0.0
                    if classes >= 3:
                        count = min(200, 3 * classes)
                        triplets = torch.randint(classes, (count, 3), generator=generator).numpy()
                        centroids = np.stack([features[labels == c].mean(0) for c in range(classes)])
                        u = centroids[triplets[:, 1]] - centroids[triplets[:, 0]]
                        v = centroids[triplets[:, 2]] - centroids[triplets[:, 0]]
                        det = (u * u).sum(1) * (v * v).sum(1) - (u * v).sum(1) ** 2
                        tri = float(np.mean(0.5 * np.sqrt(np.maximum(det, 0.0))))
                    total -= eta * tri
            rows.append({"layer": layer, "ridge_loss": ridge, "iso": isotropies[layer], "red": red,
                         "tri": tri, "total": total})
            if best is None or total < best[0]:
                best = (total, layer, fitted)
        assert best is not None
        chosen.append(best[1])
        if prediction is not None:
            prediction = prediction + best[2]
    return chosen, rows


# ------------------------------------------------------------------ checks


def assert_scores_match(result: Any, oracle_rows: list[dict[str, Any]]) -> None:
    table = result.scores
    assert table["layer"].tolist() == [row["layer"] for row in oracle_rows]
    for column in COLUMNS:
        expected = np.array([row[column] for row in oracle_rows], dtype=float)
        actual = table[column].to_numpy(float)
        np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL, err_msg=column)


@pytest.fixture
def no_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail if a step is scored from the features instead of the Gram blocks (the slow path)."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("selection fell back to the per-candidate path")

    monkeypatch.setattr(greedy_module, "direct_step", refuse)


@pytest.mark.parametrize("num_layers", [7, 25])
@pytest.mark.parametrize("loss", ["train", "loo"])
@pytest.mark.parametrize("task", ["classification", "regression", "label_free"])
def test_ripieno_matches_the_plain_oracle(num_layers: int, loss: str, task: str, no_fallback: None) -> None:
    layers, base = layered_features(num_layers, 300, 64, seed=num_layers)
    labels = (base[:, 0] > 0).astype(int) + (base[:, 1] > 0.5) + (base[:, 2] > 1.0)  # 4 classes
    y = {"classification": labels, "regression": base[:, :2] @ [1.0, -0.5] + 0.3 * base[:, 3],
         "label_free": None}[task]
    weights = {"lam": 0.5, "alpha": 0.3, "gamma": 0.2, "eta": 0.1}
    result = select_layers(layers, y, 3, loss=loss, **weights)
    matrix = None if y is None else (np.eye(4)[labels] if task == "classification" else y[:, None])
    classes = labels if task == "classification" else None
    chosen, rows = oracle_ripieno(layers, matrix, classes, 3, iso="participation", loss=loss, **weights)
    assert result.layers == chosen
    assert_scores_match(result, rows)


def test_ripieno_mean_std_iso_three_classes_and_a_duplicated_layer(no_fallback: None) -> None:
    """A layer that repeats the first chosen one has a null orthogonal part: zero features, as the oracle."""
    layers, _ = layered_features(7, 300, 64, seed=3)
    layers[5] = 2.0 * layers[1]
    signal = layers[1][:, :3].sum(1)
    labels = (signal > np.quantile(signal, 1 / 3)).astype(int) + (signal > np.quantile(signal, 2 / 3))
    weights = {"lam": 0.05, "alpha": 0.0, "gamma": 0.1, "eta": 0.3}
    for loss in ("train", "loo"):
        result = select_layers(layers, labels, 4, loss=loss, iso="mean_std", **weights)
        chosen, rows = oracle_ripieno(layers, np.eye(3)[labels], labels, 4, iso="mean_std", loss=loss,
                                      **weights)
        assert result.layers == chosen
        assert_scores_match(result, rows)
    first = result.layers[0]
    assert first in (1, 5)
    twin = result.scores[(result.scores.layer == 6 - first) & (result.scores.step >= 1)]
    assert not twin.empty and (twin["tri"] == 0).all() and np.allclose(twin["iso"], 1.0)  # zero features


def test_leave_one_out_equals_refitting_without_each_row(no_fallback: None) -> None:
    """On a small N the closed-form LOO loss of every candidate equals N explicit refits."""
    layers, base = layered_features(7, 48, 6, seed=11)
    y = base[:, :2] @ [1.0, 0.7] + 0.2 * np.random.default_rng(0).normal(size=48)
    weights = {"lam": 0.3, "alpha": 0.1, "gamma": 0.1, "eta": 0.0}
    result = select_layers(layers, y, 3, loss="loo", **weights)
    chosen, rows = oracle_ripieno(layers, y[:, None], None, 3, iso="participation", loss="loo",
                                  refit_loo=True, **weights)
    assert result.layers == chosen
    assert_scores_match(result, rows)


@pytest.mark.parametrize("num_layers", [7, 25])
@pytest.mark.parametrize("task", ["classification", "regression", "label_free"])
def test_reference_float64_matches_the_plain_oracle(num_layers: int, task: str) -> None:
    layers, base = layered_features(num_layers, 300, 64, seed=100 + num_layers)
    labels = (base[:, 0] > 0).astype(int) + (base[:, 1] > 0.5) + (base[:, 2] > 1.0)
    y = {"classification": labels, "regression": base[:, :2] @ [1.0, -0.5] + 0.3 * base[:, 3],
         "label_free": None}[task]
    weights = {"alpha": 1.0, "gamma": 0.5, "eta": 0.1}
    result = select_layers(layers, y, 3, variant="reference", lam=0.01, dtype=torch.float64, **weights)
    matrix = None if y is None else (np.eye(4)[labels] if task == "classification" else y[:, None])
    chosen, rows = oracle_reference(layers, matrix, labels if task == "classification" else None, 3, reg=0.01,
                                    **weights)
    assert result.layers == chosen
    assert_scores_match(result, rows)


@pytest.mark.parametrize("dim", [40, 600])
@pytest.mark.parametrize("scale", [1.0, 1e-4, 0.0])  # 1e-4: eigenvalues near the 1e-6 floor; 0: constant
def test_reference_isotropy_equals_the_eigenvalue_definition(dim: int, scale: float) -> None:
    """Iso from traces equals the public code's eigenvalue definition (both branches, at the floor too)."""
    x = 3.0 + scale * torch.from_numpy(layered_features(1, 900, dim, seed=dim)[0][0])
    xc = x - x.mean(0)
    if dim <= ref.ISO_EIGH_MAX_DIM:
        eigenvalues = torch.linalg.eigvalsh(xc.T @ xc / 900 + ref.ISO_JITTER * torch.eye(dim, dtype=x.dtype))
    else:
        eigenvalues = torch.linalg.svdvals(xc).square() / 900
    eigenvalues = eigenvalues.clamp(min=ref.ISO_JITTER)
    expected = eigenvalues.mean() / (eigenvalues.std(correction=0) + ref.ISO_JITTER)
    torch.testing.assert_close(ref.reference_isotropy(x), expected, rtol=1e-8, atol=0)


def test_selection_threads_are_opt_in_and_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """By default selection leaves torch's threads alone; opted in, it runs on one and restores them."""
    layers, base = layered_features(4, 60, 5, seed=1)
    labels = (base[:, 0] > 0).astype(int)
    before = torch.get_num_threads()
    seen: list[int] = []
    real_greedy = selection_module.greedy_steps

    def recording_greedy(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        return real_greedy(*args, **kwargs)

    monkeypatch.setattr(selection_module, "greedy_steps", recording_greedy)
    select_layers(layers, labels, 2)
    monkeypatch.setattr(selection_module, "SELECTION_THREADS", 1)
    select_layers(layers, labels, 2)
    assert seen == [before, 1]
    assert torch.get_num_threads() == before


def _count_calls(monkeypatch: pytest.MonkeyPatch, name: str) -> list[Any]:
    """Record the return value of every call of ``GramScorer.<name>``."""
    calls: list[Any] = []
    original = getattr(gram_scorer_module.GramScorer, name)

    def spy(self: Any, *args: Any) -> Any:
        calls.append(result := original(self, *args))
        return result

    monkeypatch.setattr(gram_scorer_module.GramScorer, name, spy)
    return calls


def test_well_conditioned_blocks_come_from_cholesky(
        monkeypatch: pytest.MonkeyPatch, no_fallback: None) -> None:
    """Full-rank residual Grams take the Cholesky basis (no eigendecomposition), with the oracle's scores."""
    cholesky, eigh = _count_calls(monkeypatch, "_cholesky_block"), _count_calls(monkeypatch, "_eigh_block")
    layers, base = layered_features(7, 300, 64, seed=5)
    labels = (base[:, 0] > 0).astype(int) + (base[:, 1] > 0.5)
    weights = {"lam": 0.5, "alpha": 0.3, "gamma": 0.2, "eta": 0.1}
    result = select_layers(layers, labels, 4, **weights)
    chosen, rows = oracle_ripieno(layers, np.eye(3)[labels], labels, 4, iso="participation", loss="train",
                                  **weights)
    assert result.layers == chosen
    assert_scores_match(result, rows)
    assert len(cholesky) == 3 and all(block is not None for block in cholesky) and eigh == []


@pytest.mark.parametrize("loss", ["train", "loo"])
def test_rank_deficient_block_is_declined_by_cholesky_and_taken_from_eigh(
        monkeypatch: pytest.MonkeyPatch, loss: str) -> None:
    """A chosen layer that repeats half of an earlier one has a rank-deficient residual Gram.

    Cholesky must decline it (a triangular basis would span rounding noise); the eigendecomposition
    then drops the null directions, and every score still equals the oracle's.
    """
    cholesky, eigh = _count_calls(monkeypatch, "_cholesky_block"), _count_calls(monkeypatch, "_eigh_block")
    layers, _ = layered_features(5, 300, 64, seed=9)
    rng = np.random.default_rng(1)
    layers[3] = np.concatenate([layers[1][:, :32], rng.normal(size=(300, 32))], axis=1)
    weights = {"lam": 0.5, "alpha": 0.0, "gamma": 0.0, "eta": 0.0}
    # Layers 1 and 3 together explain most of it; what is left, each other layer explains a bit of.
    y = 3 * (layers[1][:, 32:].sum(1) + layers[3][:, 32:].sum(1)) + sum(layers[i][:, i] for i in (0, 2, 4))
    result = select_layers(layers, y, 4, loss=loss, **weights)
    chosen, rows = oracle_ripieno(layers, y[:, None], None, 4, iso="participation", loss=loss, **weights)
    assert result.layers == chosen
    assert_scores_match(result, rows)
    assert sorted(chosen[:2]) == [1, 3]  # both get a block, the second one's residual is deficient
    assert None in cholesky and any(block is not None for block in eigh)


@pytest.mark.parametrize("loss", ["train", "loo"])
def test_layer_norm_outputs_take_the_deflated_cholesky_basis(
        monkeypatch: pytest.MonkeyPatch, loss: str, no_fallback: None) -> None:
    """Hidden states right after a LayerNorm obey one exact linear constraint per row.

    Every chosen layer's residual Gram then has a null direction: the plain Cholesky basis declines
    it, the deflated one removes that direction (no eigendecomposition), and every score still
    equals the oracle's, which drops it by the SVD cutoff.
    """
    calls = {name: _count_calls(monkeypatch, name)
             for name in ("_cholesky_block", "_deflated_block", "_eigh_block")}
    raw, base = layered_features(6, 300, 64, seed=11)
    rng = np.random.default_rng(2)

    def layer_norm(x: np.ndarray) -> np.ndarray:
        normalised = (x - x.mean(1, keepdims=True)) / x.std(1, keepdims=True)
        return normalised * rng.uniform(0.5, 1.5, size=x.shape[1]) + rng.normal(size=x.shape[1])

    layers = [layer_norm(x) for x in raw]
    centred = layers[0] - layers[0].mean(0)
    spectrum = np.linalg.eigvalsh(centred.T @ centred)
    assert spectrum[0] < 1e-12 * spectrum[-1] < spectrum[1]  # exactly one null direction
    labels = (base[:, 0] > 0).astype(int) + (base[:, 1] > 0.5)
    weights = {"lam": 0.5, "alpha": 0.3, "gamma": 0.2, "eta": 0.1}
    rng_state = torch.random.get_rng_state()
    result = select_layers(layers, labels, 3, loss=loss, **weights)
    assert torch.equal(torch.random.get_rng_state(), rng_state)  # its start vectors use a local generator
    chosen, rows = oracle_ripieno(layers, np.eye(3)[labels], labels, 3, iso="participation", loss=loss,
                                  **weights)
    assert result.layers == chosen
    assert_scores_match(result, rows)
    assert calls["_cholesky_block"] == [None, None] and calls["_eigh_block"] == []
    assert len(calls["_deflated_block"]) == 2 and None not in calls["_deflated_block"]
