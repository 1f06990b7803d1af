"""What a finished study leaves in its folder: ``trials.csv``, ``best.yaml``, figures, final seeds.

* ``trials.csv``: every trial that ran (surplus trials, which never ran, are left out): number,
  state, value, each key's value, epochs, seconds, run folder, the retried trial and why a trial
  was pruned or failed.
* ``best.yaml``: the complete config the best trial ran (recorded with the trial in the store, so
  it is the trial's own whichever command or machine ran it), with the study's own output folder
  and progress settings in place of the trial's, so ``ripieno fit -c best.yaml`` trains the best
  trial again with the same seed and reaches the same validation metric.
* ``history.png``, ``importances.png``, ``contour.png``: ``optuna.visualization.matplotlib``'s
  optimisation history, parameter importances and a contour of the two most important keys.
* ``final.csv`` (``--final_seeds S``): the best configuration trained and tested with S seeds.

Every file is written atomically; a study's own files are replaced when the study goes on.
"""

from __future__ import annotations

import logging
import math
import statistics
from pathlib import Path
from typing import Any

import optuna
import pandas as pd
import yaml
from optuna.trial import FrozenTrial, TrialState

from ripieno.framework.messages import get_logger, quiet_lightning
from ripieno.framework.outputs.output_files import atomic_output
from ripieno.framework.runner.command import quiet_cli_notices
from ripieno.framework.tuning.study_storage import ERROR_ATTR, RETRY_OF_ATTR, SURPLUS_ATTR
from ripieno.framework.tuning.trial_run import (
    QUIET_TRIAL,
    TRIAL_WARNINGS,
    TrialCLI,
    override_args,
    recipe_config,
)
from ripieno.framework.tuning.worker import (
    CONFIG_ATTR,
    EPOCHS_ATTR,
    FOLDER_ATTR,
    INTERRUPTED_ATTR,
    PRESENTATION_KEYS,
    PRUNED_ATTR,
    SPACE_ATTR,
    VALUES_ATTR,
    TuneSetup,
)

log = get_logger(__name__)

FIGURES = ("history", "importances", "contour")


def ran(study: optuna.Study) -> list[FrozenTrial]:
    """The study's trials that ran or run (surplus trials left out), by number."""
    return [t for t in study.get_trials(deepcopy=False) if not t.user_attrs.get(SURPLUS_ATTR)]


def trial_rows(study: optuna.Study, setup: TuneSetup) -> pd.DataFrame:
    """One row per trial that ran: number, state, value, the values of each key, epochs, seconds, folder."""
    rows = []
    for trial in ran(study):
        values = trial.user_attrs.get(VALUES_ATTR, {})
        row: dict[str, Any] = {
            "number": trial.number,
            "state": trial.state.name,
            setup.monitor: trial.value if trial.state == TrialState.COMPLETE else None,
        }
        row.update({key: values.get(key) for key in setup.space.params})
        row.update(
            {
                "epochs": trial.user_attrs.get(EPOCHS_ATTR),
                "seconds": round(trial.duration.total_seconds(), 3) if trial.duration else None,
                "folder": trial.user_attrs.get(FOLDER_ATTR),
                "retry_of": trial.system_attrs.get(RETRY_OF_ATTR),
                "note": trial.user_attrs.get(PRUNED_ATTR)
                or trial.user_attrs.get(ERROR_ATTR)
                or ("interrupted (Ctrl-C); another trial ran in its place"
                    if trial.user_attrs.get(INTERRUPTED_ATTR) else None)
                or ("worker died; retried" if trial.state == TrialState.FAIL else None),
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)


def write_csv(frame: pd.DataFrame, path: Path) -> Path:
    """Write ``frame`` to ``path`` atomically."""
    with atomic_output(path, "w") as handle:
        frame.to_csv(handle, index=False, lineterminator="\n")
    return path


def best_trial(study: optuna.Study) -> FrozenTrial | None:
    """The best complete trial (``None`` while none is complete)."""
    try:
        return study.best_trial
    except ValueError:
        return None


def best_config(study: optuna.Study, setup: TuneSetup, trial: FrozenTrial) -> dict[str, Any]:
    """The complete config ``trial`` ran, with the study's presentation settings (module docstring).

    A trial of an older ripieno, which recorded no config, gets the recipe with its values.
    """
    text = trial.user_attrs.get(CONFIG_ATTR)
    if not text:
        return recipe_config([*setup.fit_args, *override_args(trial.user_attrs.get(VALUES_ATTR, {}))])
    config = yaml.safe_load(text) or {}
    recorded = (study.user_attrs.get(SPACE_ATTR) or {}).get("presentation")
    presentation = recorded or setup.record()["presentation"]
    for key in PRESENTATION_KEYS:
        *parents, last = key.split(".")
        node = config
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = presentation.get(key)
    return config


def write_best_yaml(study: optuna.Study, setup: TuneSetup, trial: FrozenTrial, path: Path) -> Path:
    """``best.yaml``: the best trial's complete config with a header saying what it is."""
    config = best_config(study, setup, trial)
    header = (
        f"# Best trial {trial.number} of study {setup.study_name}: {setup.monitor} = {trial.value:.8g}"
        f" ({'min' if setup.direction == 'minimize' else 'max'}imised).\n"
        f"# Run folder of that trial: {trial.user_attrs.get(FOLDER_ATTR)}\n"
        "# ripieno fit -c best.yaml trains it again (same seed, same validation metric).\n"
    )
    with atomic_output(path, "w") as handle:
        handle.write(header + yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return path


def write_figures(study: optuna.Study, folder: Path) -> tuple[list[Path], list[str]]:
    """Optuna's matplotlib figures of the study; returns the files written and why others were not."""
    import matplotlib
    from optuna.visualization import matplotlib as plots

    written: list[Path] = []
    skipped: list[str] = []
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    names = sorted({name for t in complete for name in t.params if not name.startswith("?")})
    plan: list[tuple[str, Any]] = [("history", lambda: plots.plot_optimization_history(study))]
    if len(complete) >= 2 and len(names) >= 2:
        importances = optuna.importance.get_param_importances(study)
        top = [name for name in importances if not name.startswith("?")][:2]
        plan.append(("importances", lambda: plots.plot_param_importances(study)))
        if len(top) == 2:
            plan.append(("contour", lambda: plots.plot_contour(study, params=top)))
    else:
        skipped.append("importances and contour need 2 complete trials and 2 varied keys")
    for name, draw in plan:
        with matplotlib.rc_context({"figure.max_open_warning": 0}):
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                try:
                    axes = draw()
                except (ValueError, RuntimeError, ZeroDivisionError) as error:
                    skipped.append(f"{name}: {str(error).splitlines()[0]}")
                    continue
            figure = (axes.flat[0] if hasattr(axes, "flat") else axes).figure
            path = folder / f"{name}.png"
            with atomic_output(path, "wb") as handle:
                figure.savefig(handle, format="png", dpi=110, bbox_inches="tight")
            import matplotlib.pyplot as plt

            plt.close(figure)
            written.append(path)
    return written, skipped


def final_seeds(setup: TuneSetup, best_yaml: Path, seeds: int) -> pd.DataFrame:
    """Train and test ``best_yaml`` with ``seeds`` seeds (its own seed, then the next ones)."""
    base_seed = int((yaml.safe_load(best_yaml.read_text(encoding="utf-8")) or {}).get("seed_everything") or 0)
    rows = []
    for offset in range(seeds):
        seed = base_seed + offset
        folder = setup.study_dir / "final" / f"seed_{seed}"
        args = [
            "fit",
            "-c",
            str(best_yaml),
            f"--seed_everything={seed}",
            f"--trainer.default_root_dir={folder}",
            *QUIET_TRIAL,
        ]
        with quiet_lightning(logging.ERROR, TRIAL_WARNINGS), quiet_cli_notices():
            cli = TrialCLI(args=args)
            trainer = cli.trainer
            results = trainer.test(
                cli.model, datamodule=cli.datamodule, ckpt_path="best", verbose=False, weights_only=True
            )
        row = {"seed": seed, "folder": str(trainer.log_dir), **(results[0] if results else {})}
        rows.append(row)
        log.info(
            f"ripieno: final seed {seed}: "
            + "  ".join(f"{k}={v:.6g}" for k, v in row.items() if isinstance(v, float))
        )
    return pd.DataFrame(rows)


def summarise_final(frame: pd.DataFrame) -> list[str]:
    """``metric  mean ± std (n seeds)`` lines of the final runs' test metrics."""
    lines = []
    for column in frame.columns:
        values = [float(v) for v in frame[column] if isinstance(v, int | float) and not math.isnan(float(v))]
        if column in ("seed",) or len(values) != len(frame):
            continue
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        lines.append(f"  {column:<32} {statistics.fmean(values):.6g} ± {spread:.2g} ({len(values)} seeds)")
    return lines


def drop_checkpoints(study: optuna.Study, study_dir: Path, keep: FrozenTrial | None) -> int:
    """Delete the checkpoints of every trial but ``keep`` (``--keep_checkpoints best``); returns how many."""
    removed = 0
    trials_dir = (study_dir / "trials").resolve()
    for trial in ran(study):
        folder = trial.user_attrs.get(FOLDER_ATTR)
        if keep is not None and trial.number == keep.number or not folder or not trial.state.is_finished():
            continue
        path = Path(folder).resolve()
        if not path.is_relative_to(trials_dir):  # only the study's own trial folders
            continue
        for checkpoint in path.rglob("*.ckpt"):
            checkpoint.unlink(missing_ok=True)
            removed += 1
    return removed
