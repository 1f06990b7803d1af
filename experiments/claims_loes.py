r"""LOES layer selection and GeoReg, the seed paper's claims side by side with its reference code.

Every run is a shipped recipe through ``experiments.loes_comparison`` (``ripieno fit``:
frozen MiniLM, mean-pooled hidden states 1-6 cached once, the selected layers fused by a
trained head, best checkpoint on validation NLL tested once). Selection sees only the
training split's calibration rows (2,000 seeded rows, as the recipes).

* Selection, on Rotten Tomatoes (binary: LOES's triangle term is zero there) and on BBC
  News (5 topics, the multiclass text task that ships offline), for K = 1..4: LOES against
  the last layer, last-K concatenation, the learned scalar mix of all layers, greedy ridge
  (forward selection without the geometry terms) and exhaustive search (ridge LOO over the
  subsets of at most K layers).
* GeoReg on BBC News: no GeoReg (weight 0: measured only), our GeoReg and the reference
  GeoReg (weight 0.1 each), on LOES-reference and on LOES-ripieno layers (K = 3).

Variants. *Reference*: ``select_layers(variant="reference")`` with the reference code's
defaults (alpha 1, gamma 0.5, eta 0.1, ridge 1e-3, in-sample ridge loss;
``loes_comparison.REFERENCE_LOES``) and ``GeoReg(variant="reference")``. *Ours*: the
recipes' LOES (``variant="ripieno"``, alpha 0.1, gamma 0.05, eta 0.01, ridge 1, LOO) and
our GeoReg. The baselines are the same for both.

Verdicts: per dataset and K, the method is "better" when its mean test error
(1 - accuracy) is lower than the baseline's by more than two standard errors of the
difference (``experiments.claim_rows.compare``); the row's verdict rests on the reference
variant (the paper's algorithm) and the note gives ours. "Close to exhaustive search" holds
where LOES is not worse. Isotropy is GeoReg's logged test isotropy of the fused embedding
(ours: ``georeg/test/isotropy``), higher is better.

Outputs under ``out``: ``<dataset>/selection_runs.csv`` and ``selection_summary.md``,
``bbc_news_georeg/<selection>/georeg_runs.csv`` and ``georeg_summary.md``, ``claims.md``
and ``settings.json``. ``--from_csv`` rebuilds the rows from those CSVs without training.

``--encoders`` runs the selection study on the real vision and speech encoders instead
(EfficientNet-Lite0 ImageNet weights on MNIST 5k, the Whisper tiny.en encoder on spoken
digits with the real asterisk voice as test set; K = 1..3; the scalar mix is skipped on
EfficientNet, whose layers differ in width) into ``docs/results/claims/loes_encoders``.

Example (about 40 minutes on two cores; the first run also extracts the embeddings)::

    python -m experiments.claims_loes --out docs/results/claims/loes
    python -m experiments.claims_loes --encoders  # about 25 minutes, extraction included
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from experiments import loes_comparison
from experiments.claim_rows import ClaimRow, Verdict, by_outcome, compare, mean_std, verdict
from experiments.runs import results_dir, shown_path

#: dataset -> (selection recipe, description).
DATASETS: dict[str, tuple[str, str]] = {
    "rotten_tomatoes": ("loes/text_minilm_loes", "Rotten Tomatoes (binary)"),
    "bbc_news": ("loes/text_minilm_loes_bbc_news", "BBC News (5 topics)"),
    "mnist_5k": ("loes/vision_efficientnet_lite0_loes", "MNIST 5k digits (10 classes, resized to 224 px)"),
    "spoken_digits": ("loes/audio_whisper_tiny_en_loes",
                      "espeak-ng spoken digits, tested on the real asterisk recordings (10 words)"),
}
SHORT = {"rotten_tomatoes": "RT", "bbc_news": "BBC", "mnist_5k": "MNIST", "spoken_digits": "Digits"}
#: dataset -> the frozen encoder and its candidate layers.
ENCODERS = {
    "rotten_tomatoes": "frozen MiniLM (all-MiniLM-L6-v2, mean-pooled hidden states 1-6)",
    "bbc_news": "frozen MiniLM (all-MiniLM-L6-v2, mean-pooled hidden states 1-6)",
    "mnist_5k": ("frozen EfficientNet-Lite0 (ImageNet; global-average-pooled stages 1-7 and head, widths"
                 " 16-1280)"),
    "spoken_digits": "frozen Whisper tiny.en encoder (mean-pooled hidden states 1-4 over the audio frames)",
}
#: the text datasets of the main study (MiniLM); the real vision and speech encoders run with --encoders.
TEXT_DATASETS = ("rotten_tomatoes", "bbc_news")
ENCODER_DATASETS = ("mnist_5k", "spoken_digits")
#: variants a dataset cannot run: the scalar mix needs layers of one width (EfficientNet's differ).
SKIP: dict[str, tuple[str, ...]] = {"mnist_5k": ("scalar mix (all layers)",)}
GEOREG_RECIPE = "loes/text_minilm_georeg_bbc_news"
GEOREG_WEIGHT = 0.1
#: Layer selection of the GeoReg runs -> extra overrides (the recipe's own LOES is ours).
GEOREG_SELECTIONS: dict[str, tuple[str, ...]] = {"loes_reference": loes_comparison.REFERENCE_LOES,
                                                 "loes_ripieno": ()}
NO_GEOREG = "no GeoReg (weight 0, measured)"


@dataclasses.dataclass(frozen=True)
class Budget:
    """What one run trains.

    Attributes:
        seeds: the seeds of every variant.
        ks: the layer budgets.
        overrides: extra CLI overrides per dataset (and ``georeg`` for the GeoReg runs).
        datasets: the selection study's datasets.
        georeg: whether the GeoReg study runs too (BBC News, MiniLM).
    """

    seeds: tuple[int, ...]
    ks: tuple[int, ...]
    overrides: dict[str, tuple[str, ...]]
    datasets: tuple[str, ...] = TEXT_DATASETS
    georeg: bool = True


FULL = Budget(seeds=(0, 1, 2), ks=(1, 2, 3, 4), overrides={})
#: the real vision and speech encoders (``--encoders``): 8 and 4 candidate layers, K = 1..3.
ENCODERS_FULL = Budget(seeds=(0, 1, 2), ks=(1, 2, 3), overrides={}, datasets=ENCODER_DATASETS, georeg=False)
#: the CI setting of the encoders: a few hundred images / clips, one seed, K=2, 2 epochs. The validation
#: split must hold every class (10 digits): 12 of 120 images, and 10 of 50 clips at val_size 0.2.
ENCODERS_REDUCED = Budget(seeds=(0,), ks=(2,), datasets=ENCODER_DATASETS, georeg=False, overrides={
    "mnist_5k": ("data.init_args.source.init_args.max_train_rows=120",
                 "data.init_args.source.init_args.split.test_size=0.02", "trainer.max_epochs=2"),
    "spoken_digits": ("data.init_args.source.init_args.max_train_rows=50",
                      "data.init_args.source.init_args.split.val_size=0.2", "trainer.max_epochs=2")})
_SMALL_BBC = ("data.init_args.source.init_args.max_rows=150", "data.init_args.source.init_args.max_length=64",
              "trainer.max_epochs=2")
REDUCED = Budget(seeds=(0,), ks=(2,), overrides={
    "rotten_tomatoes": ("data.init_args.source.init_args.max_rows=200", "trainer.max_epochs=2"),
    "bbc_news": _SMALL_BBC, "georeg": _SMALL_BBC})


def _override_args(overrides: Sequence[str]) -> list[str]:
    return [f"--override={o.removeprefix('--')}" for o in overrides]


# ------------------------------------------------------------------------- runs
def run_selection(dataset: str, budget: Budget, out: Path) -> pd.DataFrame:
    """Every selection variant of ``loes_comparison`` on one dataset; rows of ``selection_runs.csv``."""
    recipe = DATASETS[dataset][0]
    skips = [arg for label in SKIP.get(dataset, ()) for arg in ("--skip", label)]
    return loes_comparison.main([
        "--mode", "selection", "--recipe", recipe, "--ks", *map(str, budget.ks),
        "--seeds", *map(str, budget.seeds), "--out", str(out / dataset),
        *_override_args(budget.overrides.get(dataset, ())), *skips])


def run_georeg(selection: str, budget: Budget, out: Path) -> pd.DataFrame:
    """No GeoReg, our GeoReg and the reference GeoReg on one layer selection (BBC News)."""
    return loes_comparison.main([
        "--mode", "georeg", "--recipe", GEOREG_RECIPE, "--weights", str(GEOREG_WEIGHT),
        "--georeg_forms", "ripieno", "reference", "--seeds", *map(str, budget.seeds),
        "--out", str(out / "bbc_news_georeg" / selection),
        *_override_args([*GEOREG_SELECTIONS[selection], *budget.overrides.get("georeg", ())])])


# ------------------------------------------------------------------- claim rows
def _values(frame: pd.DataFrame, variant: str, column: str = "test/accuracy") -> list[float]:
    return frame.loc[frame["variant"] == variant, column].astype(float).tolist()


def _errors(frame: pd.DataFrame, variant: str) -> list[float]:
    return [1.0 - a for a in _values(frame, variant)]


def _loes(kind: str, k: int) -> str:
    return f"LOES reference K={k}" if kind == "reference" else f"LOES K={k}"


def _accuracy_text(frames: dict[str, pd.DataFrame], name: str, ks: Sequence[int]) -> str:
    """``"RT: K=1 0.768 ± 0.004, ...; BBC: ..."`` (``name`` may hold ``{k}``)."""
    parts = []
    for dataset, frame in frames.items():
        if not (frame["variant"] == name.format(k=ks[0])).any():
            parts.append(f"{SHORT[dataset]}: n/a")
            continue
        if "{k}" in name:
            cells = ", ".join(f"K={k} {mean_std(_values(frame, name.format(k=k)))}" for k in ks)
        else:
            cells = mean_std(_values(frame, name))
        parts.append(f"{SHORT[dataset]}: {cells}")
    return "test accuracy " + "; ".join(parts)


def _layers(frames: dict[str, pd.DataFrame], kind: str, ks: Sequence[int]) -> str:
    parts = []
    for dataset, frame in frames.items():
        picked = [frame.loc[frame["variant"] == _loes(kind, k), "layers"] for k in ks]
        parts.append(f"{SHORT[dataset]} " + ", ".join(
            f"K={k} [{p.iloc[0]}]" + ("" if p.nunique() == 1 else " (varies by seed)")
            for k, p in zip(ks, picked, strict=True)))
    return "; ".join(parts)


def _not_worse_verdict(outcomes: Sequence[str], reduced: bool) -> Verdict:
    if reduced:
        return "inconclusive"
    if "worse" not in outcomes:
        return "reproduced"
    return "partly" if any(o != "worse" for o in outcomes) else "not reproduced"


#: baseline label in ``selection_runs.csv`` (``{k}``: at the same budget) -> (short name, claim).
SELECTION_CLAIMS: dict[str, tuple[str, str]] = {
    "last layer": ("last layer", "Fusing the layers LOES selects beats the last layer alone."),
    "last-k concat K={k}": ("last-K concat", "LOES beats concatenating the last K layers at the same"
                                             " budget K."),
    "scalar mix (all layers)": ("scalar mix", "LOES's K layers beat a learned scalar mix of all layers."),
    "greedy ridge K={k}": ("greedy ridge", "LOES's geometry terms help: it beats ridge-only greedy"
                                           " forward selection at the same K."),
    "exhaustive K={k}": ("exhaustive", "LOES comes close to exhaustive subset search at the same K"
                                       " (not worse)."),
}


def selection_rows(frames: dict[str, pd.DataFrame], budget: Budget, reduced: bool,
                   command: str) -> list[ClaimRow]:
    """One row per baseline of :data:`SELECTION_CLAIMS`, over every dataset and K."""
    seeds = ", ".join(map(str, budget.seeds))
    encoders = {ENCODERS[d] for d in frames}
    data = ("; ".join(f"{ENCODERS[d]} on {DATASETS[d][1]}" for d in frames) if len(encoders) > 1 else
            f"{next(iter(encoders))} on " + " and ".join(DATASETS[d][1] for d in frames))
    data += (f"; fusion head, best validation-NLL checkpoint; K={','.join(map(str, budget.ks))}"
            + (" (reduced: " + "; ".join(" ".join(budget.overrides.get(d, ())) for d in frames) + ")"
               if reduced else ""))
    rows = []
    for baseline, (short, claim) in SELECTION_CLAIMS.items():
        outcomes: dict[str, dict[str, str]] = {"reference": {}, "ripieno": {}}
        for kind, named in outcomes.items():
            for dataset, frame in frames.items():
                if baseline in SKIP.get(dataset, ()):
                    continue
                for k in budget.ks:
                    named[f"{SHORT[dataset]} K={k}"] = compare(_errors(frame, _loes(kind, k)),
                                                               _errors(frame, baseline.format(k=k)))
        decide = _not_worse_verdict if short == "exhaustive" else verdict
        note = (f"Reference (the public LOES code's algorithm and defaults)"
                f" {by_outcome(outcomes['reference'])}."
                f" Ours (variant ripieno, the recipes' weights) {by_outcome(outcomes['ripieno'])}."
                " 'Better' = test error lower by > 2 SE (Welch).")
        if short == "last layer":
            note += (" Layers chosen (hidden-state indices), reference:"
                     f" {_layers(frames, 'reference', budget.ks)};"
                     f" ours: {_layers(frames, 'ripieno', budget.ks)}.")
        if short == "exhaustive":
            note += " Exhaustive search scores every subset of at most K layers by ridge LOO."
        rows.append(ClaimRow(
            method="LOES", claim=claim, data=data,
            reference=_accuracy_text(frames, "LOES reference K={k}", budget.ks),
            ours=_accuracy_text(frames, "LOES K={k}", budget.ks),
            baseline=f"{short}: {_accuracy_text(frames, baseline, budget.ks)}", seeds=seeds,
            command=command, verdict=decide(list(outcomes["reference"].values()), reduced), note=note))
    return rows


def georeg_rows(frames: dict[str, pd.DataFrame], budget: Budget, reduced: bool,
                command: str) -> list[ClaimRow]:
    """GeoReg vs no GeoReg on BBC News: test accuracy, and the fused embedding's test isotropy."""
    seeds = ", ".join(map(str, budget.seeds))
    reference_form = f"GeoReg reference weight={GEOREG_WEIGHT:g}"
    ours_form = f"GeoReg weight={GEOREG_WEIGHT:g}"
    data = ("frozen MiniLM features of BBC News (5 topics), LOES K=3 layers (reference and ours), fusion head"
            + (f" (reduced: {' '.join(budget.overrides.get('georeg', ()))})" if reduced else ""))
    measures = {"test/accuracy": ("test accuracy", lambda v: [1.0 - x for x in v],
                                  "GeoReg improves test accuracy over the same training without it"
                                  " (multiclass task)."),
                "georeg/test/isotropy": ("test isotropy", lambda v: [-x for x in v],
                                         "GeoReg makes the fused embedding more isotropic than training"
                                         " without it.")}
    rows = []
    for column, (unit, as_error, claim) in measures.items():
        def cell(selection: str, form: str, column: str = column) -> list[float]:
            return _values(frames[selection], form, column)

        outcomes, cross = {}, {}
        for selection in GEOREG_SELECTIONS:
            base = as_error(cell(selection, NO_GEOREG))
            for form, name in ((reference_form, "reference GeoReg"), (ours_form, "our GeoReg")):
                outcome = compare(as_error(cell(selection, form)), base)
                key = f"{name} on {selection.replace('_', ' ')} layers"
                matched = (form == reference_form) == (selection == "loes_reference")
                (outcomes if matched else cross)[key] = outcome
        reference_key = "reference GeoReg on loes reference layers"
        text = {s: {f: mean_std(cell(s, f)) for f in (NO_GEOREG, reference_form, ours_form)}
                for s in GEOREG_SELECTIONS}
        rows.append(ClaimRow(
            method="GeoReg", claim=claim, data=data,
            reference=f"{unit} {text['loes_reference'][reference_form]} (reference GeoReg, LOES reference"
                      " layers)",
            ours=f"{unit} {text['loes_ripieno'][ours_form]} (our GeoReg, LOES ripieno layers)",
            baseline=(f"no GeoReg: {unit} {text['loes_reference'][NO_GEOREG]} (LOES reference layers),"
                      f" {text['loes_ripieno'][NO_GEOREG]} (LOES ripieno layers)"),
            seeds=seeds, command=command, verdict=verdict([outcomes[reference_key]], reduced),
            note=(f"{by_outcome(outcomes)}; crossed: {by_outcome(cross)} (reference GeoReg on our layers"
                  f" {text['loes_ripieno'][reference_form]}, ours on the reference's"
                  f" {text['loes_reference'][ours_form]}). Weight {GEOREG_WEIGHT:g} for both; 'better' ="
                  " > 2 SE (Welch).")))
    return rows


def write_report(selection: dict[str, pd.DataFrame], georeg: dict[str, pd.DataFrame], out: Path, *,
                 budget: Budget, reduced: bool, command: str, seconds: dict[str, float]) -> list[ClaimRow]:
    """The claim rows, ``claims.md`` and ``settings.json`` from the runs of both studies."""
    claims = [*selection_rows(selection, budget, reduced, command),
              *(georeg_rows(georeg, budget, reduced, command) if georeg else [])]
    frame = pd.DataFrame([dataclasses.asdict(c) for c in claims])
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(str(v).replace("|", "/") for v in row) + " |"
              for row in frame.itertuples(index=False)]
    (out / "claims.md").write_text("\n".join(lines) + "\n")
    settings = {"budget": dataclasses.asdict(budget), "reduced": reduced, "seconds": seconds,
                "command": command}
    (out / "settings.json").write_text(json.dumps(settings, indent=2) + "\n")
    return claims


def claim_rows(out: Path, *, reduced: bool, from_csv: bool = False, encoders: bool = False) -> list[ClaimRow]:
    """Run the selection and GeoReg studies, write their tables under ``out``, return the rows.

    Args:
        out: output folder (created).
        reduced: the CI setting (``REDUCED``: one seed, K=2, 150-200 rows, 2 epochs; about two
            minutes; every verdict ``inconclusive``) instead of ``FULL`` (3 seeds, K=1..4).
        from_csv: rebuild the rows from the CSVs an earlier run left under ``out`` (no training).
        encoders: the real vision and speech encoders (``ENCODERS_FULL``: EfficientNet-Lite0 on
            MNIST 5k, Whisper tiny.en on spoken digits; selection rows only) instead of MiniLM.

    Returns:
        Seven rows: LOES against five baselines, GeoReg on test accuracy and on isotropy.
    """
    if encoders:
        budget = ENCODERS_REDUCED if reduced else ENCODERS_FULL
    else:
        budget = REDUCED if reduced else FULL
    out.mkdir(parents=True, exist_ok=True)
    command = ("python -m experiments.claims_loes" + (" --reduced" if reduced else "")
               + (" --encoders" if encoders else "") + f" --out {shown_path(out)}")
    seconds: dict[str, float] = {}
    selection, georeg = {}, {}
    for dataset in budget.datasets:
        begin = time.perf_counter()
        selection[dataset] = (pd.read_csv(out / dataset / "selection_runs.csv") if from_csv
                              else run_selection(dataset, budget, out))
        seconds[dataset] = round(time.perf_counter() - begin, 1)
    for name in GEOREG_SELECTIONS if budget.georeg else ():
        begin = time.perf_counter()
        georeg[name] = (pd.read_csv(out / "bbc_news_georeg" / name / "georeg_runs.csv") if from_csv
                        else run_georeg(name, budget, out))
        seconds[f"georeg_{name}"] = round(time.perf_counter() - begin, 1)
    if from_csv and (out / "settings.json").is_file():
        seconds = json.loads((out / "settings.json").read_text()).get("seconds", seconds)
    return write_report(selection, georeg, out, budget=budget, reduced=reduced, command=command,
                        seconds=seconds)


def main(argv: list[str] | None = None) -> None:
    """Run ``claim_rows`` from the command line and print the rows.

    Args:
        argv: ``[--reduced] [--out DIR] [--from_csv]`` (``None``: ``sys.argv[1:]``).
    """
    parser = argparse.ArgumentParser(prog="python -m experiments.claims_loes",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--reduced", action="store_true", help="the CI setting (about two minutes)")
    parser.add_argument("--out", type=Path, default=results_dir("claims/loes"))
    parser.add_argument("--from_csv", action="store_true",
                        help="rebuild claims.md from the CSVs of an earlier run under --out (no training)")
    parser.add_argument("--encoders", action="store_true",
                        help="the real vision and speech encoders (EfficientNet-Lite0, Whisper tiny.en)"
                             " instead of MiniLM; default --out docs/results/claims/loes_encoders")
    args = parser.parse_args(argv)
    if args.encoders and args.out == results_dir("claims/loes"):
        args.out = results_dir("claims/loes_encoders")
    for row in claim_rows(args.out, reduced=args.reduced, from_csv=args.from_csv, encoders=args.encoders):
        print(f"claims_loes: {row.verdict}: {row.claim} | {row.reference} | {row.ours} | {row.baseline}")


if __name__ == "__main__":
    main()
