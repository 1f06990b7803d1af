"""``--ckpt_path`` in one object: the file named, read once, compared once, a mismatch explained.

``CheckpointRequest`` is made once per command from the parsed config. It passes the names
Lightning resolves itself (``best``, ``last``, ``hpc``, ``registry[:...]``) through untouched;
for a file it

* reads it once (``read_checkpoint``: a missing or damaged file stops with its name and the
  fix) and lends what it read to the rest of the command (``lend``): the datamodule that
  prepares new rows with the checkpoint's preprocessing and the Trainer that restores the
  weights (``LendingCheckpointIO``) get it without opening the file again;
* compares each setting once (``check_config``): the class, hyperparameters and data class
  against the parsed config before anything is built, and the linked data spec
  (``check_linked``) once the datamodule has learned it;
* explains a mismatch without writing anything: the differences, and the ways on as
  commands to copy (the checkpoint's run ``config.yaml`` when it is beside it, else the
  config's own files with the checkpoint's settings as overrides).

Example:
    >>> CheckpointRequest("last").file is None  # Lightning finds the last checkpoint itself
    True
    >>> CheckpointRequest("runs/version_0/checkpoints/last.ckpt").file.name
    'last.ckpt'
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import cached_property
from os import PathLike
from pathlib import Path
from typing import Any

import lightning as L
import yaml
from typing_extensions import override

from ripieno.framework.checkpoint_file import lending_checkpoint, lent_checkpoint, read_checkpoint
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.outputs.checkpoint_io import AtomicCheckpointIO
from ripieno.framework.runner.lightning_private import load_module_state, migrate_checkpoint
from ripieno.framework.runner.resume_check import (
    CLASS_KEY,
    IGNORED_KEYS,
    Difference,
    compare_hparams,
    same_value,
    section_hparams,
)

LIGHTNING_CKPT_NAMES = ("best", "last", "hpc", "registry")
"""``ckpt_path`` values that Lightning resolves itself rather than naming a file."""
LINKED_MODEL_ARGS = ("data_spec",)
"""Model arguments the CLI fills from the datamodule at instantiation (``add_arguments_to_parser``)."""
MAX_LINES = 40
"""Differences listed in a mismatch message; the rest are counted."""


class CheckpointMismatchError(RipienoInputError):
    """``--ckpt_path`` names a checkpoint of another model, hyperparameters or data than the config's."""


class CheckpointRequest:
    """The checkpoint a command was given (``--ckpt_path``): read once, compared once, explained.

    Args:
        path: What the option says: a file, or a name Lightning resolves (``last``, ...).
        option: The option that named it, quoted in messages.
        command: The subcommand (``fit``, ``predict`` ...), for the commands a message suggests.
        config_files: The config files of this command (``-c``), for the suggested commands.
        parses: Whether the config with these sections replaced (``{"model": {...}}``) parses;
            a suggested command that would not is left out.
        lightning_names: Whether ``best``, ``last``, ``hpc`` and ``registry[:...]`` are names
            Lightning resolves (``--ckpt_path``) rather than files.

    Example:
        >>> import tempfile, torch
        >>> file = Path(tempfile.mkdtemp()) / "a.ckpt"
        >>> torch.save({"state_dict": {}, "hyper_parameters": {"_class_path": "pkg.M", "rank": 4}}, file)
        >>> request = CheckpointRequest(file, command="fit")
        >>> request.check_config({"_class_path": "pkg.M", "rank": 4}, {})  # the same: nothing to say
        >>> try:
        ...     request.check_config({"_class_path": "pkg.M", "rank": 8}, {})
        ... except CheckpointMismatchError as error:
        ...     print(str(error).splitlines()[1])
          model.init_args.rank: checkpoint 4, config 8
    """

    def __init__(self, path: str | PathLike[str], *, option: str = "--ckpt_path", command: str = "fit",
                 config_files: tuple[str, ...] = (), parses: Callable[[dict[str, Any]], bool] | None = None,
                 lightning_names: bool = True) -> None:
        self.path = path
        self.option = option
        self.command = command
        self.config_files = config_files
        self.parses = parses
        self.lightning_names = lightning_names
        self._configured: dict[str, Mapping[str, Any]] = {}

    @property
    def file(self) -> Path | None:
        """The checkpoint file, or ``None`` for a name Lightning resolves itself."""
        text = str(self.path)
        if self.lightning_names and (text in LIGHTNING_CKPT_NAMES or text.startswith("registry:")):
            return None
        return Path(text).expanduser()

    @cached_property
    def checkpoint(self) -> dict[str, Any]:
        """The checkpoint's dictionary, read on first use and kept (``read_checkpoint``)."""
        if self.file is None:
            raise ValueError(f"{self.path!r} is resolved by Lightning, not read here")
        return read_checkpoint(self.file, option=self.option)

    @property
    def hparams(self) -> dict[str, Any]:
        """The model's saved ``hyper_parameters``."""
        return self.checkpoint.get("hyper_parameters") or {}

    @property
    def data_hparams(self) -> dict[str, Any]:
        """The datamodule's saved ``datamodule_hyper_parameters``."""
        return self.checkpoint.get("datamodule_hyper_parameters") or {}

    @contextmanager
    def lend(self) -> Iterator[None]:
        """Within the block, reading this file (``read_checkpoint``, the Trainer) gets what was read."""
        if self.file is None:
            yield
            return
        with lending_checkpoint(self.file, self.checkpoint):
            yield

    def check_config(self, model: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        """Compare the class, hyperparameters and data class with the config's, before anything is built.

        Args:
            model: The config's model section as Lightning's CLI saves it (``_class_path`` and
                the arguments); the linked arguments are compared later (``check_linked``).
            data: The same for the datamodule; only its class is compared.

        Raises:
            CheckpointMismatchError: the differences and the ways on (module docstring).
        """
        self._configured = {"model": model, "data": data}
        differences = compare_hparams(self.hparams, model, skip=LINKED_MODEL_ARGS)
        saved, configured = self.data_hparams.get(CLASS_KEY), data.get(CLASS_KEY)
        if saved and configured and saved != configured:
            differences.insert(0, Difference("data.class_path",
                                             f"data.class_path: checkpoint {saved}, config {configured}"))
        if differences:
            raise CheckpointMismatchError(self.explain(differences))

    def check_linked(self, model_hparams: Mapping[str, Any]) -> None:
        """Compare the linked arguments (the data spec) once the model is built with them.

        Raises:
            CheckpointMismatchError: as ``check_config``.
        """
        linked = set(LINKED_MODEL_ARGS)
        differences = compare_hparams({k: v for k, v in self.hparams.items() if k in linked},
                                      {k: v for k, v in model_hparams.items() if k in linked})
        if differences:
            raise CheckpointMismatchError(self.explain(differences))

    def explain(self, differences: list[Difference]) -> str:
        """The mismatch message: what differs and the ways on; writes nothing."""
        lines = [f"{self.path} holds another model than this config describes, so nothing was run."
                 f" What differs ({len(differences)}):"]
        lines += [f"  {d.line}" for d in differences[:MAX_LINES]]
        if len(differences) > MAX_LINES:
            lines.append(f"  ... and {len(differences) - MAX_LINES} more")
        if any(".data_spec." in d.line for d in differences):
            lines.append("(data_spec is what the datamodule learned from its training split: these data"
                         " settings, rows or preprocessing are not the checkpoint's.)")
        lines.append("Either")
        lines.append(f"  - train from scratch with this config: leave out {self.option};")
        way = self._own_settings(differences)
        if way is not None:
            lines.append(f"  - {way}")
        lines.append("  - or let the checkpoint's hyperparameters replace the config's (plain LightningCLI's"
                     " behaviour): add --resume_hparams checkpoint.")
        return "\n".join(lines)

    def model_section(self) -> dict[str, Any] | None:
        """The checkpoint's model as a config section, as Lightning's CLI reads it (``--resume_hparams``)."""
        hparams = {k: v for k, v in self.hparams.items() if k not in IGNORED_KEYS}
        if not hparams:
            return None
        if CLASS_KEY in hparams:
            return {"class_path": hparams.pop(CLASS_KEY), "dict_kwargs": hparams}
        return hparams

    def load_module(self, cls: type[L.LightningModule]) -> L.LightningModule:
        """``cls.load_from_checkpoint`` on what was read (on the CPU), without reading the file again."""
        checkpoint = migrate_checkpoint(dict(self.checkpoint), self.file)
        checkpoint.setdefault(cls.CHECKPOINT_HYPER_PARAMS_KEY, {})
        return load_module_state(cls, checkpoint)

    def _own_settings(self, differences: list[Difference]) -> str | None:
        """How to run the checkpoint with its own settings: its run's config, else overrides (no file)."""
        file = self.file
        if file is None:
            return None
        for folder in (file.parent, file.parent.parent):
            candidate = folder / "config.yaml"
            if candidate.is_file() and _config_matches(candidate, self.hparams):
                return (f"run the checkpoint with its own config (its run's config.yaml):"
                        f" ripieno {self.command} -c {shlex.quote(str(candidate))}"
                        f" {self.option} {shlex.quote(str(self.path))}")
        sections = self._own_sections(differences)
        plain = {name: {k: v for k, v in section.items() if k != "new_class"}
                 for name, section in sections.items()}
        if not sections or (self.parses is not None and not self.parses(plain)):
            return None
        overrides = _overrides(sections)
        if overrides is None:
            return None
        if not self.config_files:
            return f"run the checkpoint with its own settings: add {overrides} to this command"
        files = " ".join(f"-c {shlex.quote(str(f))}" for f in self.config_files)
        return (f"run the checkpoint with its own settings (its hyperparameters over this config): ripieno"
                f" {self.command} {files} {overrides} {self.option} {shlex.quote(str(self.path))}")

    def _own_sections(self, differences: list[Difference]) -> dict[str, dict[str, Any]]:
        """The config sections that give the checkpoint's model and data settings, as few as needed.

        Each has its ``class_path``; ``init_args`` holds every argument for another class, else
        the differing ones (``new_class`` says which).
        """
        sections: dict[str, dict[str, Any]] = {}
        keys = {d.key for d in differences}
        model = _init_args(self.hparams)
        if CLASS_KEY in self.hparams and ("class_path" in keys or keys & model.keys()):
            new = "class_path" in keys
            chosen = model if new else {k: model[k] for k in sorted(keys & model.keys())}
            sections["model"] = {"class_path": self.hparams[CLASS_KEY], "init_args": chosen, "new_class": new}
        data = _init_args(self.data_hparams)
        configured = _init_args(self._configured.get("data") or {})
        if CLASS_KEY in self.data_hparams and "data.class_path" in keys:
            sections["data"] = {"class_path": self.data_hparams[CLASS_KEY], "init_args": data,
                                "new_class": True}
        elif CLASS_KEY in self.data_hparams:  # its own data settings (rows, preprocessing): another data spec
            changed = {k: v for k, v in data.items() if k in configured and not same_value(v, configured[k])}
            if changed:
                sections["data"] = {"class_path": self.data_hparams[CLASS_KEY], "init_args": changed,
                                    "new_class": False}
        return sections


class LendingCheckpointIO(AtomicCheckpointIO):
    """``AtomicCheckpointIO`` that restores a checkpoint the command has read already, without reading it.

    A checkpoint lent with ``CheckpointRequest.lend`` (``checkpoint_file.lending_checkpoint``)
    is handed to the Trainer as read; any other is loaded as Lightning loads it.

    Example:
        >>> import tempfile, torch
        >>> file = Path(tempfile.mkdtemp()) / "a.ckpt"
        >>> torch.save({"state_dict": {"w": torch.ones(1)}}, file)
        >>> request = CheckpointRequest(file)
        >>> with request.lend():
        ...     restored = LendingCheckpointIO().load_checkpoint(file)
        >>> restored["state_dict"] is request.checkpoint["state_dict"]  # the same tensors, not read again
        True
    """

    @override
    def load_checkpoint(self, path: str | Path, map_location: Any | None = None,  # noqa: ANN401
                        weights_only: bool | None = None) -> dict[str, Any]:
        lent = lent_checkpoint(path) if isinstance(path, str | PathLike) and "://" not in str(path) else None
        if lent is not None:
            return lent
        if map_location is None:
            return super().load_checkpoint(path, weights_only=weights_only)
        return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)


def _init_args(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Saved ``hyper_parameters`` as a section's ``init_args`` (no class, bookkeeping or linked arguments)."""
    return {k: v for k, v in hparams.items()
            if k != CLASS_KEY and k not in IGNORED_KEYS and k not in LINKED_MODEL_ARGS}


def _overrides(sections: Mapping[str, Mapping[str, Any]]) -> str | None:
    """``--model.init_args.rank=4 ...`` shell-quoted; ``None`` if a value would not read back."""
    words = []
    for section, values in sections.items():
        if values.get("new_class"):
            words.append(f"--{section}.class_path={values['class_path']}")
        for key, value in values.get("init_args", {}).items():
            text = yaml.safe_dump(value, default_flow_style=True, width=10**9).strip()
            text = text.removesuffix("\n...").removesuffix("...").strip()
            if not same_value(yaml.safe_load(text), value):
                return None
            words.append(f"--{section}.init_args.{key}={text}")
    return " ".join(shlex.quote(word) for word in words)


def _config_matches(path: Path, hparams: Mapping[str, Any]) -> bool:
    """Whether the model section of a saved config describes a checkpoint's hyperparameters."""
    try:
        model = (yaml.safe_load(path.read_text()) or {}).get("model") or {}
    except (OSError, yaml.YAMLError):
        return False
    return not compare_hparams(hparams, section_hparams(model), skip=LINKED_MODEL_ARGS)
