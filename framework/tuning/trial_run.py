"""One trial of ``ripieno tune``: a ``ripieno fit`` of the recipe with the trial's overrides, in this process.

``TrialCLI`` is the ``ripieno`` command (``RipienoCLI``) with two additions: Optuna's Lightning
pruning callback watches the recipe's monitored metric, and the datamodule is taken from the
worker's ``DataCache`` when the trial's ``data`` section equals an earlier trial's (a table's
preprocessing is then fitted once per worker; a LOES cache is on disk anyway). Everything else,
the run folder, ``config.yaml``, the checkpoints, the ``NonFiniteGuard``, is the plain command's.

``recipe_config`` parses a command line the way ``ripieno fit --print_config`` does, without
building anything, so a search space's keys are checked against the recipe before any trial.
"""

from __future__ import annotations

import io
import json
import logging
import math
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from typing import Any

import lightning as L
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from typing_extensions import override

from ripieno.framework.messages import quiet_lightning
from ripieno.framework.runner.command import RipienoCLI, quiet_cli_notices
from ripieno.framework.runner.lightning_private import dump_config, module_type
from ripieno.framework.runner.section_instantiator import SectionInstantiator, _resolve

QUIET_TRIAL = (
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--test_after_fit=false",
)
"""Trial runs print nothing of their own: the study prints one line per finished trial."""
TRIAL_WARNINGS = (
    ".*does not have many workers.*",
    ".*GPU available but not used.*",
    ".*exists and is not empty.*",
    ".*The number of training batches.*",
)


def override_args(values: dict[str, Any]) -> list[str]:
    """``--key=value`` arguments for sampled values (JSON values read back as YAML by jsonargparse).

    Example:
        >>> override_args({"model.init_args.rank": 4, "model.init_args.adapter": "lometab"})
        ['--model.init_args.rank=4', '--model.init_args.adapter=lometab']
    """
    return [
        f"--{key}={value if isinstance(value, str) else json.dumps(value)}" for key, value in values.items()
    ]


def recipe_config(fit_args: list[str]) -> dict[str, Any]:
    """The complete ``fit`` config a command line gives, as ``--print_config`` prints it; nothing is built.

    Args:
        fit_args: the arguments after ``ripieno fit`` (``-c`` recipe files and overrides).

    Raises:
        ConfigError: a key the recipe does not accept or a value of the wrong type (one line first).
    """
    printed = io.StringIO()
    with redirect_stdout(printed), quiet_cli_notices(), quiet_lightning(logging.ERROR):
        try:
            RipienoCLI(args=["fit", *fit_args, "--print_config"])
        except SystemExit as stop:
            if stop.code not in (0, None):
                raise
    return yaml.safe_load(printed.getvalue()) or {}


@dataclass
class DataCache:
    """The datamodules a worker built, by their ``data`` section, to reuse across its trials.

    Args:
        size: how many distinct data sections to keep (the oldest is dropped first).
    """

    size: int = 2
    built: dict[str, L.LightningDataModule] = field(default_factory=dict)
    hits: int = 0

    def get(self, key: str) -> L.LightningDataModule | None:
        """The datamodule built for ``key`` (a data section's canonical JSON), if kept."""
        found = self.built.get(key)
        self.hits += found is not None
        return found

    def put(self, key: str, datamodule: L.LightningDataModule) -> None:
        """Keep ``datamodule`` for ``key``."""
        self.built[key] = datamodule
        while len(self.built) > self.size:
            self.built.pop(next(iter(self.built)))


class _CachedDataInstantiator(SectionInstantiator):
    """The ``data`` section's instantiator: the worker's datamodule again for an unchanged data section."""

    def __init__(self, cli: TrialCLI, default: type) -> None:
        super().__init__(cli, "data", default)
        self.trial_cli = cli

    def __call__(
        self,
        class_type: type,
        *args: Any,
        applied_instantiation_links: dict,  # noqa: D102
        **kwargs: Any,
    ) -> Any:  # noqa: ANN401
        cli, cache = self.trial_cli, self.trial_cli.data_cache
        dump_config(self.cli)
        class_path = (self.cli.config_dump.get("data") or {}).get("class_path")
        own = (
            cache is not None
            and cli.data_key is not None
            and _resolve(class_path, self.default) is class_type
        )
        if own and (found := cache.get(cli.data_key)) is not None and type(found) is class_type:
            return found
        built = super().__call__(
            class_type, *args, applied_instantiation_links=applied_instantiation_links, **kwargs
        )
        if own:
            cache.put(cli.data_key, built)
        return built


class TrialCLI(RipienoCLI):
    """``RipienoCLI`` for one trial: the worker's datamodule again when the data section is unchanged.

    Args:
        *args: ``RipienoCLI``'s arguments.
        data_cache: the worker's datamodules (``None``: every trial builds its own).
        **kwargs: ``RipienoCLI``'s keyword arguments (``trainer_defaults`` carries the pruning callback).
    """

    def __init__(self, *args: Any, data_cache: DataCache | None = None, **kwargs: Any) -> None:  # noqa: ANN401
        self.data_cache = data_cache
        self.data_key: str | None = None
        super().__init__(*args, **kwargs)

    @override
    def _add_instantiators(self) -> None:
        """``RipienoCLI``'s instantiators, the data section's through the worker's cache."""
        model_base, data_base = module_type(self._model_class), module_type(self._datamodule_class)
        self.parser.add_instantiator(
            SectionInstantiator(self, "model", model_base), model_base, subclasses=self.subclass_mode_model
        )
        self.parser.add_instantiator(
            _CachedDataInstantiator(self, data_base), data_base, subclasses=self.subclass_mode_data
        )

    @override
    def before_instantiate_classes(self) -> None:
        """The data section's cache key (it and the seed), then ``RipienoCLI``'s preparations."""
        if self.data_cache is not None:
            sections = self._plain_config()
            self.data_key = json.dumps(
                {"data": sections.get("data"), "seed": sections.get("seed_everything")},
                sort_keys=True,
                default=str,
            )
        super().before_instantiate_classes()


def best_score(trainer: L.Trainer, monitor: str) -> tuple[float | None, ModelCheckpoint | None]:
    """The best score of the ``ModelCheckpoint`` that monitors ``monitor`` (``None`` before any epoch)."""
    for callback in trainer.checkpoint_callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.monitor == monitor:
            score = callback.best_model_score
            return (None if score is None else float(score)), callback
    return None, None


def finite(value: float | None) -> bool:
    """Whether ``value`` is a real, finite number."""
    return value is not None and math.isfinite(value)
