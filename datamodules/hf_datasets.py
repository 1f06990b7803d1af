"""Hugging Face ``datasets`` as a source of ripieno's datamodules: saved folders and local files.

A source is either a folder written by ``save_to_disk`` (a ``Dataset`` or a ``DatasetDict``)
or local files read by one of ``datasets``' packaged builders (``csv``, ``json``,
``parquet``, ``imagefolder``, ``audiofolder``) with ``data_files`` (a path, a list, or a
``{split: paths}`` mapping, exactly as ``load_dataset`` takes them). Nothing is downloaded:
the packaged builders read local files only.

Split names map onto ripieno's ``train`` / ``val`` / ``test`` (``validation``, ``valid``,
``dev`` and ``val`` are the validation split); ``resolve_splits`` keeps the official ones
and says which it carves from the training split, or pools every split and re-splits when
asked to (and says so).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from ripieno.datamodules.base import DataModuleError
from ripieno.datamodules.table_header import check_unique_columns, header_names
from ripieno.framework.messages import get_logger

log = get_logger(__name__)


BUILDERS: tuple[str, ...] = ("csv", "json", "parquet", "imagefolder", "audiofolder")
SPLIT_ALIASES: dict[str, str] = {"train": "train", "validation": "val", "valid": "val", "val": "val",
                                 "dev": "val", "test": "test"}
SplitPolicy = Literal["official", "resplit"]
SPLIT_POLICIES: tuple[str, ...] = ("official", "resplit")
DATASETS_INSTALL = "pip install 'ripieno[datasets]'"


def _datasets(error: type[Exception]) -> Any:  # noqa: ANN401
    try:
        import datasets
    except ImportError as err:
        raise error(f"Reading Hugging Face datasets needs the datasets package: {DATASETS_INSTALL}.") from err
    return datasets


def is_saved_dataset(path: str | Path) -> bool:
    """Whether ``path`` is a folder written by ``save_to_disk`` (a Dataset or DatasetDict)."""
    folder = Path(path).expanduser()
    return folder.is_dir() and ((folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file())


def load_hf_splits(source: str | Path, data_files: str | Sequence[str] | Mapping[str, Any] | None = None,
                   builder: str | None = None, error: type[Exception] = DataModuleError,
                   decode_audio: bool = False) -> dict[str, Any]:
    """The named splits of a saved folder or of local files, as ``{name: datasets.Dataset}``.

    Args:
        source: a ``save_to_disk`` folder (with ``data_files`` unset), or ignored when
            ``builder`` and ``data_files`` are given.
        data_files: local files for ``builder`` (``load_dataset``'s argument).
        builder: ``csv``, ``json``, ``parquet``, ``imagefolder`` or ``audiofolder``.
        error: the datamodule's error type.
        decode_audio: leave ``False``: audio columns are cast to ``Audio(decode=False)``, so
            ``datasets`` hands back paths / bytes and the caller decodes them (ripieno reads
            audio with soundfile; ``datasets``' own decoding needs torchcodec).

    Returns:
        The splits under their own names (a single saved ``Dataset`` is ``{"train": ...}``).

    Raises:
        error: the package is missing, the folder is not a saved dataset, the builder is
            unknown or the files do not exist, each naming the fix.
    """
    datasets = _datasets(error)
    if builder is not None or data_files is not None:
        if builder not in BUILDERS:
            raise error(f"builder must be one of {BUILDERS} (with data_files), got {builder!r}.")
        if data_files is None:
            raise error(f"builder {builder!r} needs data_files: a path, a list of paths or {{split: paths}}.")
        _check_files_exist(data_files, error)
        if builder in ("csv", "parquet"):
            _check_headers(data_files, builder, error)
        kwargs: dict[str, Any] = {}
        if builder == "audiofolder":
            kwargs["features"] = _audiofolder_features(datasets, _plain(data_files), error)
        try:
            loaded = datasets.load_dataset(builder, data_files=_plain(data_files), **kwargs)
        except (FileNotFoundError, ValueError) as err:
            raise error(f"datasets could not read {data_files!r} with the {builder!r} builder"
                        f" ({err}).") from err
    else:
        path = Path(source).expanduser()
        if not is_saved_dataset(path):
            raise error(f"{str(path)!r} is not a folder written by datasets' save_to_disk (no"
                        " dataset_dict.json or state.json); give data_files and a builder for raw files.")
        loaded = datasets.load_from_disk(str(path))
    parts = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
    if not decode_audio:
        for name, part in parts.items():
            for column, feature in part.features.items():
                if isinstance(feature, datasets.Audio) and feature.decode:
                    parts[name] = parts[name].cast_column(column, datasets.Audio(decode=False))
    return parts


def _audiofolder_features(datasets: Any, data_files: Any, error: type[Exception]) -> Any:  # noqa: ANN401
    """``audio`` as a plain path string and ``label`` from the parent folder names.

    ``datasets`` 5's ``Audio`` feature imports torchcodec to encode even a file path; declaring
    the column a string keeps the builder's file listing and folder labels (the same rule:
    a file's label is its parent folder's name) without it, and ripieno decodes the files.
    """
    import glob

    patterns: list[str] = []
    for value in data_files.values() if isinstance(data_files, dict) else [data_files]:
        patterns.extend([value] if isinstance(value, str) else list(value))
    files = [f for pattern in patterns for f in glob.glob(pattern, recursive=True)]
    names = sorted({Path(f).parent.name for f in files})
    if not files:
        raise error(f"data_files {data_files!r} match no audio files.")
    return datasets.Features({"audio": datasets.Value("string"), "label": datasets.ClassLabel(names=names)})


def _plain(data_files: Any) -> Any:  # noqa: ANN401
    """``data_files`` as plain str / list / dict (jsonargparse may hand back other containers)."""
    if isinstance(data_files, Mapping):
        return {str(k): _plain(v) for k, v in data_files.items()}
    if isinstance(data_files, (list, tuple)):
        return [str(v) for v in data_files]
    return str(data_files)


def _named_files(data_files: Any) -> list[str]:  # noqa: ANN401
    """Every path or glob pattern in ``data_files`` (a path, a list, or ``{split: paths}``)."""
    files: list[str] = []
    if isinstance(data_files, Mapping):
        for value in data_files.values():
            files.extend([value] if isinstance(value, (str, Path)) else list(value))
    else:
        files.extend([data_files] if isinstance(data_files, (str, Path)) else list(data_files))
    return [str(f) for f in files]


def _check_headers(data_files: Any, builder: str, error: type[Exception]) -> None:  # noqa: ANN401
    """Refuse a CSV or Parquet data file whose header repeats a column name (``table_header``).

    ``datasets``' csv builder reads with pandas, which renames a repeat (``a`` -> ``a.1``).
    """
    for pattern in _named_files(data_files):
        expanded = os.path.expanduser(pattern)
        is_glob = any(ch in pattern for ch in "*?[")
        for file in sorted(glob.glob(expanded, recursive=True)) if is_glob else [expanded]:
            if not Path(file).is_file():
                continue
            try:  # the csv builder splits on commas whatever the suffix
                names = header_names(Path(file), "parquet" if builder == "parquet" else "csv")
            except (OSError, ValueError, EOFError):
                continue  # unreadable: datasets' own error names it
            check_unique_columns(file, names, error)


def _check_files_exist(data_files: Any, error: type[Exception]) -> None:  # noqa: ANN401
    files = _named_files(data_files)
    literal = [f for f in files if not any(ch in str(f) for ch in "*?[")]  # globs are load_dataset's
    missing = [f for f in literal if not Path(f).expanduser().exists()]
    if missing:
        raise error(f"data_files {missing} do not exist (downloads are disabled); give local paths.")


def resolve_splits(parts: Mapping[str, Any], policy: SplitPolicy, owner: str,
                   error: type[Exception] = DataModuleError) -> tuple[dict[str, Any], list[str]]:
    """Map split names onto ripieno's, and say which splits must be carved from ``train``.

    Args:
        parts: ``{name: Dataset}`` as ``load_hf_splits`` returns it.
        policy: ``official`` keeps the source's splits; ``resplit`` pools them all into one
            ``train`` table that the datamodule splits with its seed.
        owner: the datamodule's name, for the message.
        error: the datamodule's error type.

    Returns:
        ``(splits, carve)``: ``splits`` maps ``train`` / ``val`` / ``test`` to Datasets, and
        ``carve`` lists the ripieno splits the datamodule must carve from ``train``.

    Raises:
        error: an unknown policy, a split name it does not know, no ``train`` split, or two
            names for one split.
    """
    if policy not in SPLIT_POLICIES:
        raise error(f"splits must be one of {SPLIT_POLICIES}, got {policy!r}.")
    unknown = [name for name in parts if name not in SPLIT_ALIASES]
    if unknown:
        raise error(f"Unknown split name(s) {unknown}; name the splits train, validation (or val, valid,"
                    " dev) and test.")
    if policy == "resplit":
        datasets = _datasets(error)
        pooled = next(iter(parts.values()))
        if len(parts) > 1:
            pooled = datasets.concatenate_datasets(list(parts.values()))
            log.info(f"{owner}: splits {list(parts)} pooled and re-split by split_seed"
                     " (splits: resplit).")
        return {"train": pooled}, ["val", "test"]
    mapped: dict[str, Any] = {}
    for name, part in parts.items():
        ours = SPLIT_ALIASES[name]
        if ours in mapped:
            names = sorted(n for n in parts if SPLIT_ALIASES[n] == ours)
            raise error(f"Two splits map to {ours!r} ({names}); keep one of them.")
        mapped[ours] = part
    if "train" not in mapped:
        raise error(f"The dataset has splits {list(parts)} but no train split.")
    carve = [name for name in ("val", "test") if name not in mapped]
    kept = [name for name in ("train", "val", "test") if name in mapped]
    log.info(f"{owner}: official splits {kept} kept"
             + (f"; {carve} carved from train by split_seed" if carve else "") + ".")
    return mapped, carve
