"""A benchmark file: which tables, which models, which protocol (``ripieno benchmark -c FILE``).

Shipped files live in ``recipes/benchmarks/`` (``benchmarks/tabular_cpu``); a user's file is any
YAML path. Keys::

    name: tabular_cpu                  # the study and output folder name
    protocol: default                  # default | tuned
    seeds: [0, 1, 2]                   # model seeds (the split is fixed by data.split.seed)
    data:                              # TabularDataModule arguments shared by every table
      max_rows: 5000
      split: {seed: 0}
    datasets:                          # shipped names (docs/benchmark_suite.md) or a user's table
      - keel_letter
      - {name: my_table, path: data/my.csv, target: y, categorical: [city]}
    models:
      lometab: {kind: ensemble, params: {adapter: lometab, k: 8}, space: {rank: {...}}}
      xgboost: {kind: xgboost}
    tuning: {n_trials: 20, startup_trials: 10}   # the tuned protocol's study per table and model
    common: {ensemble: {max_epochs: 30}}         # params every model of a kind gets (its own win)
    conformal: {alpha: 0.1, calibration_size: 0.1, calibrate_on: train, seed: 0}   # these defaults
    base: benchmarks/tabular_cpu                 # start from another file; keys here replace its keys

``conformal`` decides the uncertainty scores' calibration rows (``uncertainty.ConformalSettings``):
``calibrate_on: train`` carves ``calibration_size`` of the table's rows from the training rows
(stratified, ``seed``) before any model is fitted; ``val`` calibrates on the validation rows that
early stopping has seen, on purpose; ``none`` scores no conformal sets or intervals.

Every problem (an unknown key, model kind, data set or protocol, an empty list) is one line
naming it and the closest valid word, before any model trains.

A benchmark file is data, never code: ``data_class`` must name a ``LightningDataModule`` subclass
that serves ``table_splits()``; a name in Python's standard library is refused before anything is
imported, and any other is imported (as a recipe's ``class_path`` is) and checked before it is
called with the file's arguments (``datamodule_class``).
"""

from __future__ import annotations

import difflib
import importlib
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import lightning as L

from ripieno.framework.benchmark.models import (
    KINDS,
    QUANTILE_KINDS,
    QUANTILE_LEVELS,
    ModelSpec,
    check_params,
    check_quantile_levels,
)
from ripieno.framework.benchmark.uncertainty import CALIBRATE_ON, ConformalSettings
from ripieno.framework.errors import RipienoInputError
from ripieno.framework.runner.fingerprints import data_files
from ripieno.framework.runner.recipes import BENCHMARKS_FOLDER, RECIPES_DIR
from ripieno.framework.runner.recipes import list_benchmarks as _shipped
from ripieno.framework.runner.yaml_files import InvalidYamlError, YamlFileError, load_yaml
from ripieno.framework.tuning.space import SearchSpace

BENCHMARKS_DIR = RECIPES_DIR / BENCHMARKS_FOLDER
"""Shipped benchmark files (``recipes/benchmarks``; in a wheel, ``ripieno/recipes/benchmarks``)."""
PROTOCOLS: tuple[str, ...] = ("default", "tuned")
KEYS: tuple[str, ...] = (
    "name",
    "description",
    "protocol",
    "seeds",
    "data",
    "datasets",
    "models",
    "tuning",
    "common",
    "data_class",
    "conformal",
    "base",
)
DATA_CLASS = "ripieno.datamodules.TabularDataModule"
_CLASS_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")


class BenchmarkConfigError(RipienoInputError):
    """A benchmark file that cannot run; the message is one line naming the problem and the fix."""


@dataclass(frozen=True)
class DatasetEntry:
    """One table of a benchmark: a name and the datamodule arguments that load it."""

    name: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TuningSettings:
    """The tuned protocol's study per table and model.

    Attributes:
        n_trials: trials per study.
        startup_trials: TPE's random start-up trials.
        seed: the sampler's seed.
        fit_seed: the model seed every trial fits with (the final runs use ``seeds``).
    """

    n_trials: int = 20
    startup_trials: int = 10
    seed: int = 0
    fit_seed: int = 0


@dataclass(frozen=True)
class BenchmarkConfig:
    """A parsed benchmark file (module docstring)."""

    name: str
    protocol: str
    seeds: tuple[int, ...]
    datasets: tuple[DatasetEntry, ...]
    models: tuple[ModelSpec, ...]
    data: dict[str, Any] = field(default_factory=dict)
    tuning: TuningSettings = field(default_factory=TuningSettings)
    conformal: ConformalSettings = field(default_factory=ConformalSettings)
    data_class: str = DATA_CLASS
    description: str = ""
    source: str = ""

    def dataset(self, name: str) -> DatasetEntry:
        """The entry called ``name``."""
        return next(d for d in self.datasets if d.name == name)

    def model(self, name: str) -> ModelSpec:
        """The model called ``name``."""
        return next(m for m in self.models if m.name == name)


def table_identity(config: BenchmarkConfig, name: str, sources: Mapping[str, Any]) -> dict[str, Any]:
    """What identifies data set ``name``'s table: the files its arguments name, or the shipped table's source.

    Args:
        config: the benchmark.
        name: the data set.
        sources: the data class's shipped tables (``SOURCES``): one named by ``dataset`` is
            identified by the package and version that ship it.

    Returns:
        ``{"files": {path: size, mtime and SHA-256}}``, plus ``"shipped": "<package> <version>"``.
    """
    args = {**config.data, **config.dataset(name).args}
    identity: dict[str, Any] = {"files": data_files(args)}
    shipped = args.get("dataset")
    version = getattr(sources.get(shipped) if isinstance(shipped, str) else None, "version", None)
    if callable(version):
        identity["shipped"] = version()
    return identity


def grouped_data_args(args: dict[str, Any], moved: Mapping[str, str], where: str) -> dict[str, Any]:
    """A file's data arguments with the flat keys of earlier releases moved into their groups, each warned.

    ``moved`` is the data class's ``MOVED_ARGUMENTS`` (``{"split_seed": "split.seed", ...}``); a key
    given both ways is refused in one line.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     grouped_data_args({"split_seed": 1, "max_rows": 9}, {"split_seed": "split.seed"}, "b.yaml")
        {'max_rows': 9, 'split': {'seed': 1}}
    """
    import warnings

    from ripieno.framework.errors import REMOVED_IN, RipienoDeprecationWarning

    for name in [n for n in args if n in moved and "." in moved[n]]:
        group, field = moved[name].split(".", 1)
        target = args.setdefault(group, {})
        if not isinstance(target, dict) or field in target:
            raise BenchmarkConfigError(
                f"{where}: {name} and {moved[name]} are the same setting, given twice; keep {moved[name]}."
            )
        target[field] = args.pop(name)
        warnings.warn(f"{where}: {name} is now {moved[name]}; the flat key is removed in ripieno"
                      f" {REMOVED_IN}", RipienoDeprecationWarning, stacklevel=2)
    return args


def fingerprint_data_args(args: Mapping[str, Any], moved: Mapping[str, str]) -> dict[str, Any]:
    """Data arguments as a fingerprint records them: grouped settings under their earlier flat names.

    The groups changed how a file writes these settings, not what they do: a store whose cells were
    fitted with ``split_seed: 0`` is the store that ``split: {seed: 0}`` makes, and resumes as such
    (fingerprints compare as canonical JSON, so the order of keys does not matter).

    Example:
        >>> fingerprint_data_args({"split": {"seed": 0}, "max_rows": 9}, {"split_seed": "split.seed"})
        {'max_rows': 9, 'split_seed': 0}
    """
    flat = {place: name for name, place in moved.items()}
    groups = {place.split(".", 1)[0] for place in flat}
    out = {k: v for k, v in args.items() if not (k in groups and isinstance(v, dict))}
    for group in groups & set(args):
        if isinstance(args[group], dict):
            for name, value in args[group].items():
                out[flat.get(f"{group}.{name}", f"{group}.{name}")] = value
    return out


def datamodule_class(class_path: str, where: str) -> tuple[type[L.LightningDataModule], ModuleType]:
    """The ``LightningDataModule`` class with ``table_splits()`` that ``class_path`` names, and its module.

    Checked before anything is called: the name's form, then (before any import) that it is not in
    Python's standard library, then, imported, that it is such a class.

    Raises:
        BenchmarkConfigError: any other name, in one line; nothing of it was called.

    Example:
        >>> try:
        ...     datamodule_class("os.system", "bench.yaml")
        ... except BenchmarkConfigError as error:
        ...     print(str(error)[:70])
        bench.yaml: data_class 'os.system' is not a LightningDataModule with t
    """
    refused = BenchmarkConfigError(
        f"{where}: data_class {class_path!r} is not a LightningDataModule with table_splits(), so"
        f" nothing was run; name one, such as {DATA_CLASS}."
    )
    if not isinstance(class_path, str) or not _CLASS_PATH.fullmatch(class_path):
        raise refused
    module_name, _, class_name = class_path.rpartition(".")
    if module_name.split(".")[0] in sys.stdlib_module_names:
        raise refused
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise BenchmarkConfigError(
            f"{where}: data_class {class_path!r} cannot be imported ({error}); fix the name or install"
            " its package."
        ) from None
    found = getattr(module, class_name, None)
    if not (
        isinstance(found, type)
        and issubclass(found, L.LightningDataModule)
        and callable(getattr(found, "table_splits", None))
    ):
        raise refused
    return found, module


def _closest(word: str, options: list[str] | tuple[str, ...]) -> str:
    match = difflib.get_close_matches(str(word), [str(o) for o in options], n=1)
    return f" (did you mean {match[0]!r}?)" if match else f"; choose from {sorted(options)}"


def list_benchmarks() -> list[str]:
    """Names of the shipped benchmark files (``benchmarks/<name>``)."""
    return [name for name, _ in _shipped()]


def find_benchmark(name: str | Path) -> Path:
    """The file of a shipped benchmark name (``benchmarks/tabular_cpu``) or a path.

    Raises:
        BenchmarkConfigError: neither a file nor a shipped name.
    """
    path = Path(name)
    if path.is_file():
        return path
    stem = str(name).removeprefix("benchmarks/").removesuffix(".yaml")
    shipped = BENCHMARKS_DIR / f"{stem}.yaml"
    if shipped.is_file():
        return shipped
    raise BenchmarkConfigError(
        f"benchmark {str(name)!r} is neither a file nor a shipped benchmark"
        f"{_closest(f'benchmarks/{stem}', list_benchmarks())}."
    )


def load_benchmark(name: str | Path, known: tuple[str, ...] = ()) -> BenchmarkConfig:
    """Read and check a benchmark file.

    Args:
        name: a shipped benchmark's name or a YAML path.
        known: the shipped data set names (an unknown one is an error naming the closest).

    Returns:
        The parsed benchmark.

    Raises:
        BenchmarkConfigError: anything that would stop the benchmark (module docstring).
    """
    path = find_benchmark(name)
    where = f"benchmark {path}"
    raw = _read(path, where, seen=())
    protocol = str(raw.get("protocol", "default"))
    if protocol not in PROTOCOLS:
        raise BenchmarkConfigError(
            f"{where}: protocol {protocol!r} is not one of {list(PROTOCOLS)}{_closest(protocol, PROTOCOLS)}."
        )
    seeds = raw.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) for s in seeds):
        raise BenchmarkConfigError(f"{where}: seeds must be a non-empty list of integers, got {seeds!r}.")
    common = raw.get("common") or {}
    models = tuple(_model(n, spec, common, where) for n, spec in _mapping(raw, "models", where).items())
    if protocol == "tuned" and not any(m.space for m in models):
        raise BenchmarkConfigError(f"{where}: protocol tuned needs a 'space' on at least one model.")
    datasets = _datasets(raw.get("datasets"), known, where)
    data = raw.get("data") or {}
    if not isinstance(data, dict):
        raise BenchmarkConfigError(f"{where}: data must be a mapping of TabularDataModule arguments.")
    if any("calibration_size" in args for args in [data, *(d.args for d in datasets)]):
        raise BenchmarkConfigError(
            f"{where}: calibration_size is a key of conformal, not of a data set's arguments (the benchmark"
            " carves the calibration rows itself); move it to conformal: {calibration_size: ...}."
        )
    data_class = raw.get("data_class", DATA_CLASS)
    cls, _ = datamodule_class(data_class, where)
    moved = getattr(cls, "MOVED_ARGUMENTS", None) or {}
    data = grouped_data_args(dict(data), moved, f"{where}: data")
    datasets = tuple(
        DatasetEntry(d.name, grouped_data_args(dict(d.args), moved, f"{where}: data set {d.name!r}"))
        for d in datasets
    )
    conformal = _conformal(raw.get("conformal"), where)
    tuning = raw.get("tuning") or {}
    try:
        settings = TuningSettings(**tuning)
    except TypeError:
        fields = list(TuningSettings.__dataclass_fields__)
        bad = next(k for k in tuning if k not in fields)
        raise BenchmarkConfigError(
            f"{where}: tuning has no setting {bad!r}{_closest(bad, fields)}."
        ) from None
    return BenchmarkConfig(
        name=str(raw.get("name") or path.stem),
        protocol=protocol,
        seeds=tuple(seeds),
        datasets=datasets,
        models=models,
        data=dict(data),
        tuning=settings,
        conformal=conformal,
        data_class=data_class,
        description=str(raw.get("description", "")),
        source=str(path),
    )


def _read(path: Path, where: str, seen: tuple[Path, ...]) -> dict[str, Any]:
    """The file's mapping, over its ``base`` file's mapping (top-level keys replaced)."""
    try:
        raw = load_yaml(path, where)  # bounded: a YAML alias bomb is refused, not expanded
    except InvalidYamlError as error:
        at = f" (line {error.line})" if error.line is not None else ""
        raise BenchmarkConfigError(f"{where}: not valid YAML{at}: {error.problem}.") from None
    except YamlFileError as error:
        raise BenchmarkConfigError(str(error)) from None
    if not isinstance(raw, dict):
        raise BenchmarkConfigError(f"{where}: must be a YAML mapping with keys {list(KEYS)}.")
    unknown = [k for k in raw if k not in KEYS]
    if unknown:
        raise BenchmarkConfigError(f"{where}: unknown key {unknown[0]!r}{_closest(unknown[0], KEYS)}.")
    if "base" not in raw:
        return raw
    base = find_benchmark(str(raw["base"]))
    if base.resolve() in seen or base.resolve() == path.resolve():
        raise BenchmarkConfigError(f"{where}: base {raw['base']!r} leads back to itself; remove the loop.")
    merged = _read(base, f"benchmark {base}", (*seen, path.resolve()))
    merged.pop("name", None)  # a file's name is its own
    return {**merged, **{k: v for k, v in raw.items() if k != "base"}}


def _mapping(raw: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = raw.get(key)
    if not isinstance(value, dict) or not value:
        raise BenchmarkConfigError(f"{where}: {key} must be a non-empty mapping of name -> settings.")
    return value


def _model(name: str, spec: Any, common: dict[str, Any], where: str) -> ModelSpec:  # noqa: ANN401
    spec = spec or {}
    if not isinstance(spec, dict):
        raise BenchmarkConfigError(f"{where}: model {name!r} must be a mapping with 'kind'.")
    bad = [k for k in spec if k not in ("kind", "params", "space")]
    if bad:
        raise BenchmarkConfigError(
            f"{where}: model {name!r} has no key {bad[0]!r}{_closest(bad[0], ['kind', 'params', 'space'])}."
        )
    kind = str(spec.get("kind", name))
    if kind not in KINDS:
        raise BenchmarkConfigError(f"{where}: model {name!r} has kind {kind!r}{_closest(kind, KINDS)}.")
    params = {**(common.get(kind) or {}), **(spec.get("params") or {})}
    space = dict(spec.get("space") or {})
    if space:
        SearchSpace.from_dict({"params": space}, source=f"{where}: model {name!r} space")
    check_params(kind, [*params, *space], f"{where}: model {name!r}")
    if QUANTILE_LEVELS in space:
        raise BenchmarkConfigError(
            f"{where}: model {name!r}: quantile_levels are the scores' levels, not a tuned value; move it to"
            " params."
        )
    if kind in QUANTILE_KINDS and QUANTILE_LEVELS in params:
        try:
            params[QUANTILE_LEVELS] = list(check_quantile_levels(params[QUANTILE_LEVELS], f"model {name!r}"))
        except RipienoInputError as error:
            raise BenchmarkConfigError(f"{where}: {error}") from None
    if kind == "ensemble":  # the values too, as fit would check them: before any cell runs
        from ripieno.framework.methods.estimators import EnsembleClassifier, check_parameters

        try:
            check_parameters(EnsembleClassifier(**params))
        except RipienoInputError as error:
            raise BenchmarkConfigError(f"{where}: model {name!r}: {error}") from None
    return ModelSpec(name=str(name), kind=kind, params=params, space=space)


def _conformal(value: Any, where: str) -> ConformalSettings:  # noqa: ANN401
    """The ``conformal`` mapping, each key checked (defaults for the keys it leaves out)."""
    if value is None:
        return ConformalSettings()
    fields = list(ConformalSettings.__dataclass_fields__)
    if not isinstance(value, dict):
        raise BenchmarkConfigError(
            f"{where}: conformal must be a mapping with keys {fields}, got {value!r}."
        )
    bad = next((k for k in value if k not in fields), None)
    if bad is not None:
        raise BenchmarkConfigError(f"{where}: conformal has no key {bad!r}{_closest(bad, fields)}.")
    for key, meaning in (("alpha", "the miscoverage, e.g. 0.1 for 90%"),
                         ("calibration_size", "a fraction of the table's rows, e.g. 0.1")):
        number = value.get(key, 0.5)
        if isinstance(number, bool) or not isinstance(number, int | float) or not 0.0 < number < 1.0:
            raise BenchmarkConfigError(
                f"{where}: conformal.{key} must be a number in (0, 1), {meaning}; got {number!r}."
            )
    calibrate_on = value.get("calibrate_on", "train")
    if calibrate_on not in CALIBRATE_ON:
        raise BenchmarkConfigError(
            f"{where}: conformal.calibrate_on {calibrate_on!r} is not one of {list(CALIBRATE_ON)}"
            f"{_closest(str(calibrate_on), CALIBRATE_ON)}."
        )
    seed = value.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise BenchmarkConfigError(f"{where}: conformal.seed must be an integer, got {seed!r}.")
    return ConformalSettings(**{k: float(v) if k in ("alpha", "calibration_size") else v
                                for k, v in value.items()})


def _datasets(value: Any, known: tuple[str, ...], where: str) -> tuple[DatasetEntry, ...]:  # noqa: ANN401
    if not isinstance(value, list) or not value:
        raise BenchmarkConfigError(
            f"{where}: datasets must be a non-empty list (shipped names or {{name, path, target}} mappings)."
        )
    entries: list[DatasetEntry] = []
    for item in value:
        if isinstance(item, str):
            if known and item not in known:
                raise BenchmarkConfigError(
                    f"{where}: unknown data set {item!r}{_closest(item, known)}; or give"
                    " {name, path, target} for your own table."
                )
            entries.append(DatasetEntry(item, {"dataset": item}))
        elif isinstance(item, dict) and "name" in item:
            args = {k: v for k, v in item.items() if k != "name"}
            if "path" in args:
                path = Path(str(args["path"])).expanduser()
                if not path.is_file():
                    raise BenchmarkConfigError(
                        f"{where}: data set {item['name']!r}: no file {str(path)!r}; fix the path."
                    )
                args = {"dataset": None, **args}
            entries.append(DatasetEntry(str(item["name"]), args))
        else:
            raise BenchmarkConfigError(
                f"{where}: a datasets entry must be a name or a mapping with 'name', got {item!r}."
            )
    names = [e.name for e in entries]
    slashed = next((n for n in names if "/" in n or not n.strip()), None)
    if slashed is not None:
        raise BenchmarkConfigError(
            f"{where}: data set name {slashed!r} must be a non-empty name without '/'; rename it."
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise BenchmarkConfigError(f"{where}: data set {repeated[0]!r} is listed twice; list it once.")
    return tuple(entries)
