"""Lightning's CLI instantiator, given to each config section's own class only.

LightningCLI builds ``model`` and ``data`` inside a context that hands the section's config to
``save_hyperparameters`` (so ``hparams.yaml`` holds what the user wrote). jsonargparse applies
that instantiator to every subclass of the section's base that it builds, so a datamodule nested
in the ``data`` section (``LayerEmbeddingDataModule``'s ``source``) would save the *outer*
section as its hyperparameters. ``SectionInstantiator`` keeps Lightning's behaviour for the
class the section names and builds any other module plainly: it saves its own arguments.
"""

from __future__ import annotations

import importlib
from typing import Any

from lightning.pytorch.cli import LightningCLI

from ripieno.framework.runner.lightning_private import InstantiatorFn, dump_config


class SectionInstantiator(InstantiatorFn):
    """``_InstantiatorFn`` for the class of config section ``key``; other classes are built plainly.

    Args:
        cli: the command being built.
        key: ``model`` or ``data``.
        default: the class the section holds when its config names none (no subclass mode).

    Example:
        >>> import lightning as L
        >>> from types import SimpleNamespace
        >>> class Source(L.LightningDataModule):
        ...     def __init__(self, rows: int = 3) -> None:
        ...         super().__init__()
        ...         self.save_hyperparameters()
        >>> cli = SimpleNamespace(_dump_config=lambda: None,
        ...                       config_dump={"data": {"class_path": "my.Wrapper", "init_args": {"k": 2}}})
        >>> built = SectionInstantiator(cli, "data", L.LightningDataModule)(
        ...     Source, rows=5, applied_instantiation_links={})
        >>> dict(built.hparams)
        {'rows': 5}
    """

    def __init__(self, cli: LightningCLI, key: str, default: type) -> None:
        super().__init__(cli, key)
        self.default = default

    def __call__(
        self, class_type: type, *args: Any, applied_instantiation_links: dict, **kwargs: Any  # noqa: ANN401
    ) -> Any:  # noqa: ANN401
        """Build ``class_type``: with the section's hyperparameters if it is the section's class."""
        dump_config(self.cli)
        class_path = (self.cli.config_dump.get(self.key) or {}).get("class_path")
        if _resolve(class_path, self.default) is not class_type:
            return class_type(*args, **kwargs)
        return super().__call__(class_type, *args, applied_instantiation_links=applied_instantiation_links,
                                **kwargs)


def _resolve(class_path: str | None, default: type) -> type | None:
    """The class ``class_path`` names (``default`` when it names none; ``None`` when it does not import)."""
    if not class_path:
        return default
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return None
