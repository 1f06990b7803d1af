"""Shared plumbing of the experiments: runs built from recipes, and their metrics.

An experiment trains many variants of one recipe. Each variant is built exactly as
``ripieno fit -c RECIPE --key=value ...`` would build it (``RipienoCLI`` with
``run=False``), so data links, seeds and validation behave as in a normal run, with
changes that make repeated in-process runs clean and comparable:

* no checkpoints, no early stopping (every variant trains ``max_epochs``; the best
  epoch by validation loss is read from the recorded validations instead), no logger,
  progress bar or model summary, no sanity check;
* a ``DiversityMonitor`` (added when the recipe has none) and a
  :class:`ValidationRecorder` that keeps every validation's metrics.

Recipes are found as ``ripieno fit -c`` finds them (a shipped name such as
``tabular/lometab_churn`` or a path, see :func:`ripieno.framework.runner.recipes.find_recipe`), the
command line is handed to ``RipienoCLI`` through its ``args`` parameter (``sys.argv`` is never
touched), and default outputs go under the repository's ``docs/results`` whatever the current
folder is. Importing this module changes nothing in the process (environment, warnings,
threads); notices are silenced only while a run is built or inside :func:`quiet_lightning`.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import lightning as L
import yaml
from lightning.pytorch.callbacks import Callback

from ripieno.callbacks.diversity_monitor import DiversityMonitor
from ripieno.framework.messages import quiet_lightning as framework_quiet_lightning
from ripieno.framework.outputs.output_files import atomic_output
from ripieno.framework.runner.command import RipienoCLI, quiet_cli_notices
from ripieno.framework.runner.recipes import RecipeNotFoundError, find_recipe

TaskFamily = Literal["classification", "regression"]

#: Diversity metrics that DiversityMonitor logs under ``diversity/val/``, per task family.
DIVERSITY_METRICS: dict[TaskFamily, tuple[str, ...]] = {
    "classification": ("pairwise_kl", "disagreement"),
    "regression": ("ambiguity",),
}
#: Validation task metrics (logged as ``val/<name>``) recorded per task family.
TASK_METRICS: dict[TaskFamily, tuple[str, ...]] = {
    "classification": ("accuracy", "nll"),
    "regression": ("rmse",),
}
#: Validation metric (minimised) that picks the best epoch of a run, per task family.
SELECTION_METRIC: dict[TaskFamily, str] = {"classification": "nll", "regression": "rmse"}
#: Callbacks dropped from recipes: they need checkpoints or would stop runs unevenly.
DROPPED_CALLBACKS = ("ModelCheckpoint", "EarlyStopping")

RESULTS_DIR = Path(__file__).resolve().parents[1] / "docs" / "results"
"""The repository's ``docs/results``: default home of every experiment's outputs."""

_NOISY_WARNINGS = (
    ".*does not have many workers.*",
    ".*isinstance.treespec, LeafSpec.*",
    ".*GPU available but not used.*",
)


# ----------------------------------------------------------------------- recipes
def results_dir(name: str) -> Path:
    """Default output folder of an experiment: ``docs/results/<name>`` in the repository.

    Args:
        name: the experiment's folder under ``docs/results``.

    Returns:
        An absolute path, the same from any current folder.
    """
    return RESULTS_DIR / name


def shown_path(path: Path) -> str:
    """``path`` as a command line in a report shows it: relative to the repository when inside it.

    Args:
        path: An output folder.

    Returns:
        The path relative to the repository root (so the command reruns on any checkout), else as given.
    """
    try:
        return str(Path(path).resolve().relative_to(RESULTS_DIR.parents[1]))
    except ValueError:
        return str(path)


def resolve_recipe(parser: argparse.ArgumentParser, recipe: str | Path) -> Path:
    """The file of a ``--recipe`` value (shipped name or path); ``parser.error`` if none.

    Args:
        parser: the experiment's parser (reports the error and exits).
        recipe: a shipped recipe's name (``tabular/lometab_churn``) or a path to a YAML file.

    Returns:
        The recipe file.
    """
    try:
        return find_recipe(recipe)
    except RecipeNotFoundError as error:
        parser.error(str(error))


def prepare_recipe(recipe: str | Path) -> str:
    """Read a recipe and return it as YAML text ready for repeated in-process runs.

    Callbacks named in :data:`DROPPED_CALLBACKS` are removed and a
    ``ripieno.callbacks.DiversityMonitor`` is appended when the recipe has none; everything
    else is kept as written.

    Args:
        recipe: a shipped recipe's name or the path of a recipe (a LightningCLI config file).

    Returns:
        The edited config as YAML text (``RipienoCLI`` accepts it for ``--config``).

    Raises:
        RecipeNotFoundError: if the recipe is neither a file nor a shipped recipe.
        ValueError: if the recipe is not a YAML mapping.
    """
    path = find_recipe(recipe)
    config = yaml.safe_load(path.read_text())
    if not isinstance(config, dict):
        raise ValueError(f"Recipe {str(path)!r} is not a YAML mapping.")
    trainer = config.setdefault("trainer", {}) or {}
    config["trainer"] = trainer
    callbacks = trainer.get("callbacks") or []
    if isinstance(callbacks, dict):
        callbacks = [callbacks]
    kept = [c for c in callbacks if _callback_name(c) not in DROPPED_CALLBACKS]
    if not any(_callback_name(c) == "DiversityMonitor" for c in kept):
        kept.append({"class_path": "ripieno.callbacks.DiversityMonitor"})
    trainer["callbacks"] = kept
    return yaml.safe_dump(config, sort_keys=False)


def _callback_name(entry: Any) -> str:  # noqa: ANN401
    """Class name of a callback entry of a config (``class_path`` or a bare string)."""
    class_path = entry.get("class_path", "") if isinstance(entry, dict) else str(entry)
    return str(class_path).rsplit(".", 1)[-1]


def add_run_arguments(parser: argparse.ArgumentParser, *, default_recipe: str, default_out: Path) -> None:
    """Add the options every experiment shares: recipe, epochs, seed, output, overrides.

    Args:
        parser: the experiment's parser.
        default_recipe: default ``--recipe`` (a shipped recipe's name).
        default_out: default output folder (see :func:`results_dir`).
    """
    parser.add_argument("--recipe", default=default_recipe,
                        help="shipped recipe name (as listed by `ripieno recipes`) or path to a "
                        "recipe YAML (a LoMETab/additive one)")
    parser.add_argument("--max_epochs", type=int, default=None,
                        help="training epochs per run; None = the recipe's")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed_everything for every run; None = the recipe's")
    parser.add_argument("--out", type=Path, default=default_out,
                        help="output folder for the CSV and PNGs")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="extra RipienoCLI override for every run, repeatable, e.g. "
                        "--override data.init_args.max_rows=600 (a leading -- is optional; "
                        "write --override=--key=value if you keep it)")


def check_run_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Reject option values that cannot run (``parser.error`` exits with a message).

    Also replaces ``args.recipe`` by its file (see :func:`resolve_recipe`).
    """
    if args.max_epochs is not None and args.max_epochs < 1:
        parser.error("--max_epochs must be >= 1")
    args.recipe = resolve_recipe(parser, args.recipe)


def normalize_overrides(overrides: Sequence[str] | None) -> list[str]:
    """CLI overrides with a leading ``--`` (``data.init_args.max_rows=600`` also works).

    Args:
        overrides: ``--key=value`` or ``key=value`` strings, or ``None``.

    Returns:
        The overrides, each starting with ``--``.
    """
    return [o if o.startswith("-") else f"--{o}" for o in (overrides or [])]


def run_overrides(
    *, max_epochs: int | None, root_dir: str | Path, seed: int | None = None
) -> list[str]:
    """Overrides that every experiment run gets (see the module docstring).

    Args:
        max_epochs: training epochs, or ``None`` for the recipe's.
        root_dir: ``trainer.default_root_dir`` (nothing is written there by default).
        seed: ``seed_everything`` value, or ``None`` for the recipe's.

    Returns:
        ``--key=value`` strings for ``RipienoCLI``.
    """
    args = [
        f"--trainer.default_root_dir={root_dir}",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.num_sanity_val_steps=0",
    ]
    if max_epochs is not None:
        args.append(f"--trainer.max_epochs={max_epochs}")
    if seed is not None:
        args.append(f"--seed_everything={seed}")
    return args


# -------------------------------------------------------------------------- runs
def make_cli(args: Sequence[str]) -> RipienoCLI:
    """Build (not run) ``RipienoCLI`` from a whole command line, as ``ripieno fit`` would.

    The command line goes through ``args``; ``sys.argv`` (the experiment's own) is left
    alone. jsonargparse's deprecation notices (unless ``JSONARGPARSE_DEPRECATION_WARNINGS``
    is set) and Lightning's notice about ``args`` next to a non-empty ``sys.argv`` are
    silenced for this call only.

    Args:
        args: ``--config FILE_OR_YAML`` and ``--key=value`` overrides (no subcommand).

    Returns:
        The CLI, with its ``model``, ``datamodule`` and ``trainer`` instantiated.
    """
    with quiet_cli_notices():
        return RipienoCLI(args=list(args), run=False, save_config_callback=None)


class ValidationRecorder(Callback):
    """Keep the validation metrics of every validation run, fit-time or standalone.

    Reads ``trainer.callback_metrics`` at ``on_validation_end``, after Lightning has
    reduced the epoch's metrics, so each row holds that validation's values.

    Attributes:
        rows: one dict per validation: ``epoch`` (training epochs completed when it ran:
            0 before ``fit``), ``step`` (optimizer steps) and every ``val/*`` and
            ``diversity/val/*`` metric as a float.
    """

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, float]] = []

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """Record the metrics of the validation that just ended (not sanity checks)."""
        if trainer.sanity_checking:
            return
        fitting = trainer.state.fn == "fit"
        row: dict[str, float] = {
            "epoch": trainer.current_epoch + 1 if fitting else trainer.current_epoch,
            "step": trainer.global_step,
        }
        for name, value in sorted(trainer.callback_metrics.items()):
            if name.startswith(("val/", "diversity/val/")):
                row[name] = float(value)
        self.rows.append(row)


@dataclass
class Run:
    """One instantiated run of a recipe: model, data, trainer and its recorders."""

    model: L.LightningModule
    datamodule: L.LightningDataModule
    trainer: L.Trainer
    recorder: ValidationRecorder
    monitor: DiversityMonitor
    args: list[str] = field(default_factory=list)

    @property
    def task_family(self) -> TaskFamily:
        """``regression`` or ``classification``, from the module's member output kind."""
        kind = getattr(self.model, "member_output_kind", None)
        if kind is None:
            kind = "regression" if getattr(self.model, "task", "") == "regression" else "logits"
        return "regression" if kind == "regression" else "classification"

    @property
    def n_parameters(self) -> int:
        """Number of model parameters (shared weights, adapters, embeddings, heads)."""
        return sum(p.numel() for p in self.model.parameters())

    def validate(self) -> dict[str, float]:
        """Validate the current weights and return that validation's recorded metrics."""
        self.trainer.validate(self.model, datamodule=self.datamodule, verbose=False)
        return dict(self.recorder.rows[-1])

    def fit(self) -> None:
        """Train for the configured number of epochs."""
        self.trainer.fit(self.model, datamodule=self.datamodule)


def build_run(config_text: str, overrides: Sequence[str]) -> Run:
    """Instantiate a run from prepared recipe text plus overrides, without running it.

    Args:
        config_text: YAML from :func:`prepare_recipe`.
        overrides: ``--key=value`` strings applied after the recipe (later wins);
            usually :func:`run_overrides` followed by experiment- and user-given ones.

    Returns:
        The run, with a :class:`ValidationRecorder` attached to its trainer.

    Raises:
        ValueError: if the configured callbacks include no ``DiversityMonitor``.
    """
    cli = make_cli(["--config", config_text, *overrides])
    monitor = next((c for c in cli.trainer.callbacks if isinstance(c, DiversityMonitor)), None)
    if monitor is None:
        raise ValueError("The run has no DiversityMonitor callback; keep one in trainer.callbacks.")
    recorder = ValidationRecorder()
    cli.trainer.callbacks.append(recorder)
    return Run(cli.model, cli.datamodule, cli.trainer, recorder, monitor, list(overrides))


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence Lightning's per-run info messages and known harmless warnings."""
    with framework_quiet_lightning(logging.WARNING, messages=_NOISY_WARNINGS):
        yield


# ------------------------------------------------------------------------ output
def metric_columns(family: TaskFamily) -> tuple[list[str], list[str]]:
    """Column names of the diversity and task metrics of a task family.

    Args:
        family: ``classification`` or ``regression``.

    Returns:
        ``(diversity, task)`` column names, e.g. ``["pairwise_kl", "disagreement"]`` and
        ``["val_accuracy", "val_nll"]``.
    """
    return list(DIVERSITY_METRICS[family]), [f"val_{m}" for m in TASK_METRICS[family]]


def pick_metrics(metrics: dict[str, float], family: TaskFamily) -> dict[str, float]:
    """The diversity and task metrics of ``family`` from a recorded validation row.

    Args:
        metrics: a :class:`ValidationRecorder` row.
        family: ``classification`` or ``regression``.

    Returns:
        ``{"pairwise_kl": ..., "val_accuracy": ...}`` (column names of
        :func:`metric_columns`).

    Raises:
        KeyError: if a metric was not logged (e.g. the monitor did not run).
    """
    out: dict[str, float] = {}
    for name in DIVERSITY_METRICS[family]:
        out[name] = _require(metrics, f"diversity/val/{name}")
    for name in TASK_METRICS[family]:
        out[f"val_{name}"] = _require(metrics, f"val/{name}")
    return out


def best_epoch_row(rows: Sequence[dict[str, float]], family: TaskFamily) -> dict[str, float]:
    """The fit-time validation row with the lowest selection metric (early-stopping view).

    Args:
        rows: :class:`ValidationRecorder` rows (``epoch`` 0 is the pre-fit validation).
        family: ``classification`` (lowest ``val/nll``) or ``regression`` (lowest ``val/rmse``).

    Returns:
        That row.

    Raises:
        ValueError: if no fit-time validation was recorded.
    """
    key = f"val/{SELECTION_METRIC[family]}"
    fitted = [r for r in rows if r["epoch"] >= 1 and key in r]
    if not fitted:
        raise ValueError(f"No fit-time validation with {key!r} was recorded.")
    return min(fitted, key=lambda r: r[key])


def _require(metrics: dict[str, float], key: str) -> float:
    if key not in metrics:
        raise KeyError(f"Metric {key!r} was not logged; logged: {sorted(metrics)}.")
    return metrics[key]


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (a temporary file beside it, then a rename).

    Args:
        path: the file (its folder is created).
        text: the whole content.

    Returns:
        ``path``.
    """
    with atomic_output(path, "w") as handle:
        handle.write(text)
    return Path(path)


def write_csv(path: str | Path, rows: Sequence[dict[str, Any]]) -> Path:
    """Write rows (dicts with the same keys, in column order) as a CSV file.

    Args:
        path: output file; parent folders are created.
        rows: the rows; the first row's keys are the header.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)
    return path


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A compact fixed-width text table of selected columns.

    Args:
        rows: dict rows.
        columns: keys to show, in order.

    Returns:
        The table as text (header line, rule, one line per row).
    """
    def cell(value: Any) -> str:  # noqa: ANN401
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    cells = [[cell(row[c]) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)
