"""Monitored metrics that the model will never log, caught before training.

A ``ModelCheckpoint`` or ``EarlyStopping`` that monitors a metric the model does not log
(``val/nll`` on a regression) lets a run train an epoch and then fail ("conditioned on
metric val/nll which is not available"). ``check_monitors`` compares every ``val/...``
monitor with the names the model declares (``MemberModule.logged_metric_names``) and stops
at once, naming the closest logged metric. Models that declare nothing are not checked.
"""

from __future__ import annotations

import difflib
from typing import Any

from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

from ripieno.framework.errors import RipienoInputError


def check_monitors(model: object, callbacks: list[Any]) -> None:
    """Raise unless every ``val/...`` monitor of ``callbacks`` is a metric ``model`` logs.

    Args:
        model: The LightningModule; checked if it has ``logged_metric_names(stage)``.
        callbacks: The Trainer's callbacks; their ``ModelCheckpoint`` and ``EarlyStopping``
            monitors are checked.

    Raises:
        RipienoInputError: naming each unknown monitor, its callbacks, the closest logged
            metric and every metric the model logs.
    """
    names_of = getattr(model, "logged_metric_names", None)
    if not callable(names_of):
        return
    logged = sorted(names_of("val"))
    watchers: dict[str, list[str]] = {}
    for callback in callbacks:
        monitor = getattr(callback, "monitor", None)
        if isinstance(callback, ModelCheckpoint | EarlyStopping) and isinstance(monitor, str) \
                and monitor.startswith("val/") and monitor not in logged:
            watchers.setdefault(monitor, []).append(type(callback).__name__)
    if not watchers:
        return
    kind = "regression" if getattr(model, "member_output_kind", "") == "regression" else "classification"
    problems = []
    for monitor, names in watchers.items():
        close = difflib.get_close_matches(monitor, logged, n=1, cutoff=0.0)
        verb = "monitors" if len(names) == 1 else "monitor"
        problems.append(f"{' and '.join(sorted(set(names)))} {verb} {monitor!r}"
                        + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise RipienoInputError(
        f"{'; '.join(problems)}, which {type(model).__name__} does not log on this data ({kind}); it logs"
        f" {', '.join(logged)}. Set those callbacks' init_args.monitor in the recipe to one of them, or check"
        " the data's task (data.init_args.task).")
