"""Small *random* backbones saved like real weights, for tests and default recipes.

No GPT-2, DINOv2 or wav2vec2 weights exist offline here (see ``DATA.md``), so tests and recipes
build tiny models from configs with random weights and write them, with the model's
own preprocessing config, to a local directory through ``save_pretrained``: the very
path that real weights take (``AutoModel.from_pretrained(dir)``,
``AutoImageProcessor.from_pretrained(dir)``, ``Wav2Vec2FeatureExtractor.from_pretrained(dir)``,
``timm.create_model("local-dir:" + dir, pretrained=True)``). Nothing is downloaded:
processors are built from constructor arguments that copy the real models' settings.

Their features carry no pretrained knowledge; every builder says so when it runs.
``cached_small_backbone(kind)`` builds the small models of ``SMALL_BACKBONE_SETTINGS`` (what
``LayerEmbeddingDataModule(build_backbone=...)`` uses) once into ripieno's cache folder, in a
folder named after the kind, its settings and its seed
(``ripieno.framework.outputs.generated_folders``).

Command line::

    python -m ripieno.framework.backbones.small_models dinov2 models/dinov2-random
    python -m ripieno.framework.backbones.small_models wav2vec2 models/wav2vec2-random
    python -m ripieno.framework.backbones.small_models timm_dinov2 models/timm-dinov2-random
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ripieno.framework.extras import require
from ripieno.framework.messages import command_output, get_logger
from ripieno.framework.outputs.generated_folders import build_once, generated_dir

log = get_logger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
BICUBIC = 3  # PIL.Image.BICUBIC, as in DINOv2's own processor


def _announce(kind: str, target: Path, details: str, announce: bool = True) -> None:
    if not announce:
        return
    log.info(f"ripieno: wrote a small RANDOM {kind} ({details}) to {target}; its weights are untrained, so"
             " its features carry no pretrained knowledge (use it for tests and plumbing, not for results).")


def build_small_dinov2(
    target_dir: str | Path,
    image_size: int = 56,
    patch_size: int = 14,
    hidden_size: int = 64,
    num_layers: int = 4,
    num_heads: int = 4,
    seed: int = 0,
    announce: bool = True,
) -> Path:
    """Write a small random ``Dinov2Model`` and its ``BitImageProcessor`` to ``target_dir``.

    The processor copies DINOv2's own recipe scaled to ``image_size``: resize the
    shortest edge to ``image_size * 256 / 224`` (bicubic), centre-crop ``image_size``,
    rescale to ``[0, 1]`` and normalise with the ImageNet mean and std.

    Args:
        target_dir: folder to write (created; existing files are overwritten).
        image_size: crop size in pixels, a multiple of ``patch_size``.
        patch_size: ViT patch size (14 like DINOv2).
        hidden_size: width of every hidden state.
        num_layers: transformer blocks (the model returns ``num_layers + 1`` hidden states).
        num_heads: attention heads; must divide ``hidden_size``.
        seed: seed of the random weights (the global RNG is left untouched).
        announce: print where the model went and that it is random.

    Returns:
        The folder, loadable with ``AutoModel`` / ``AutoImageProcessor.from_pretrained``.
    """
    require("vision", "transformers", "A small DINOv2")
    from transformers import BitImageProcessor, Dinov2Config, Dinov2Model

    if image_size % patch_size:
        raise ValueError(f"image_size={image_size} must be a multiple of patch_size={patch_size}.")
    target = Path(target_dir).expanduser()
    config = Dinov2Config(image_size=image_size, patch_size=patch_size, hidden_size=hidden_size,
                          num_hidden_layers=num_layers, num_attention_heads=num_heads,
                          intermediate_size=4 * hidden_size)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Dinov2Model(config).eval()
    processor = BitImageProcessor(
        do_resize=True, size={"shortest_edge": round(image_size * 256 / 224)}, resample=BICUBIC,
        do_center_crop=True, crop_size={"height": image_size, "width": image_size},
        do_rescale=True, rescale_factor=1 / 255, do_normalize=True,
        image_mean=list(IMAGENET_MEAN), image_std=list(IMAGENET_STD), do_convert_rgb=True,
    )
    model.save_pretrained(target)
    processor.save_pretrained(target)
    _announce("DINOv2", target, f"{num_layers} layers, hidden {hidden_size}, {image_size}x{image_size} input",
              announce)
    return target


def build_small_wav2vec2(
    target_dir: str | Path,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 2,
    sampling_rate: int = 16_000,
    seed: int = 0,
    announce: bool = True,
) -> Path:
    """Write a small random ``Wav2Vec2Model`` and its ``Wav2Vec2FeatureExtractor`` to ``target_dir``.

    The convolutional front end has four layers of strides ``5, 4, 4, 4`` (320 samples
    per frame, 50 frames a second at 16 kHz, like wav2vec2) and layer norm
    (``feat_extract_norm="layer"``, the variant trained with attention masks, like
    ``wav2vec2-large-lv60``); the feature extractor normalises each clip to zero mean and
    unit variance and returns an attention mask.

    Args:
        target_dir: folder to write (created; existing files are overwritten).
        hidden_size: width of every hidden state.
        num_layers: transformer layers (the model returns ``num_layers + 1`` hidden states).
        num_heads: attention heads; must divide ``hidden_size``.
        sampling_rate: the rate the feature extractor expects (audio is resampled to it).
        seed: seed of the random weights (the global RNG is left untouched).
        announce: print where the model went and that it is random.

    Returns:
        The folder, loadable with ``AutoModel`` / ``Wav2Vec2FeatureExtractor.from_pretrained``.
    """
    require("audio", "transformers", "A small Wav2Vec2")
    from transformers import Wav2Vec2Config, Wav2Vec2FeatureExtractor, Wav2Vec2Model

    target = Path(target_dir).expanduser()
    config = Wav2Vec2Config(
        vocab_size=32, hidden_size=hidden_size, num_hidden_layers=num_layers, num_attention_heads=num_heads,
        intermediate_size=4 * hidden_size, conv_dim=(32, 32, 32, 32), conv_stride=(5, 4, 4, 4),
        conv_kernel=(10, 8, 8, 8), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=2,
        feat_extract_norm="layer", do_stable_layer_norm=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Wav2Vec2Model(config).eval()
    extractor = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=sampling_rate, padding_value=0.0,
                                         do_normalize=True, return_attention_mask=True)
    model.save_pretrained(target)
    extractor.save_pretrained(target)
    _announce("Wav2Vec2", target, f"{num_layers} layers, hidden {hidden_size}, {sampling_rate} Hz input",
              announce)
    return target


def build_small_timm_dinov2(
    target_dir: str | Path,
    image_size: int = 56,
    depth: int = 2,
    embed_dim: int = 64,
    num_heads: int = 2,
    seed: int = 0,
    announce: bool = True,
) -> Path:
    """Write a small random timm ``vit_small_patch14_dinov2`` (``pretrained=False``) to ``target_dir``.

    Saved with ``timm.models.save_for_hf``: ``config.json`` holds the architecture, the
    model arguments and the ``pretrained_cfg`` whose data config (input size,
    interpolation, crop, mean, std) is the model's preprocessing.

    Args:
        target_dir: folder to write (created; existing files are overwritten).
        image_size: input size in pixels, a multiple of 14.
        depth: transformer blocks.
        embed_dim: width of every hidden state.
        num_heads: attention heads; must divide ``embed_dim``.
        seed: seed of the random weights (the global RNG is left untouched).
        announce: print where the model went and that it is random.

    Returns:
        The folder, loadable with ``timm.create_model("local-dir:" + folder, pretrained=True)``.
    """
    require("vision", "timm", "A small timm DINOv2")
    import timm
    from timm.models import save_for_hf

    target = Path(target_dir).expanduser()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = timm.create_model("vit_small_patch14_dinov2", pretrained=False, img_size=image_size,
                                  depth=depth, embed_dim=embed_dim, num_heads=num_heads, num_classes=0).eval()
    target.mkdir(parents=True, exist_ok=True)
    save_for_hf(model, str(target), safe_serialization=True)
    _announce("timm DINOv2 ViT", target, f"{depth} blocks, width {embed_dim}, {image_size}px input", announce)
    return target


def build_small_gpt2(
    target_dir: str | Path,
    n_layer: int = 4,
    n_embd: int = 64,
    n_head: int = 4,
    vocab_size: int = 50257,
    seed: int = 0,
    announce: bool = True,
) -> Path:
    """Write a small random ``GPT2Model`` (GPT-2's vocabulary size, no tokenizer) to ``target_dir``.

    Args:
        target_dir: folder to write (created; existing files are overwritten).
        n_layer: transformer blocks (the model returns ``n_layer + 1`` hidden states).
        n_embd: width of every hidden state.
        n_head: attention heads; must divide ``n_embd``.
        vocab_size: token embeddings (50257 like GPT-2, so any tokenizer up to that size fits).
        seed: seed of the random weights (the global RNG is left untouched).
        announce: print where the model went and that it is random.

    Returns:
        The folder, loadable with ``AutoModel.from_pretrained``.
    """
    require("text", "transformers", "A small GPT-2")
    from transformers import GPT2Config, GPT2Model

    target = Path(target_dir).expanduser()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=vocab_size)
        model = GPT2Model(config).eval()
    model.save_pretrained(target)
    _announce("GPT-2", target, f"{n_layer} layers, width {n_embd}", announce)
    return target


BUILDERS: dict[str, Callable[..., Path]] = {
    "gpt2": build_small_gpt2,
    "dinov2": build_small_dinov2,
    "wav2vec2": build_small_wav2vec2,
    "timm_dinov2": build_small_timm_dinov2,
}


#: The small random backbones ``LayerEmbeddingDataModule(build_backbone=...)`` builds, with their settings.
SMALL_BACKBONE_SETTINGS: dict[str, dict[str, Any]] = {
    "gpt2": {"n_layer": 4, "n_embd": 64, "n_head": 4, "vocab_size": 50257},
    "dinov2": {"image_size": 56, "patch_size": 14, "hidden_size": 64, "num_layers": 4, "num_heads": 4},
    "wav2vec2": {"hidden_size": 32, "num_layers": 2, "num_heads": 2, "sampling_rate": 16_000},
}


def small_backbone_record(kind: str, seed: int = 0) -> dict[str, Any]:
    """What determines the small random backbone ``kind``: its builder, settings and seed.

    Example:
        >>> small_backbone_record("gpt2")["settings"]["n_layer"]
        4
    """
    return {"generated": "small random backbone", "kind": kind, "builder": BUILDERS[kind].__name__,
            "settings": dict(SMALL_BACKBONE_SETTINGS[kind]), "seed": seed, "format": 1}


def small_backbone_hidden_states(kind: str) -> int:
    """How many hidden states (embeddings + one per layer) the small backbone ``kind`` returns.

    Example:
        >>> small_backbone_hidden_states("gpt2"), small_backbone_hidden_states("wav2vec2")
        (5, 3)
    """
    settings = SMALL_BACKBONE_SETTINGS[kind]
    return int(settings.get("n_layer", settings.get("num_layers", 0))) + 1


def cached_small_backbone(kind: str, seed: int = 0) -> tuple[Path, bool]:
    """The small random backbone ``kind`` in ripieno's cache folder, built there once.

    The folder is named after ``small_backbone_record(kind, seed)`` and built like every
    generated folder (``ripieno.framework.outputs.generated_folders.build_once``): under a lock, in a
    staging folder, marker last; a folder there without a finished marker is rebuilt.

    Returns:
        ``(folder, built)``: the folder and whether this call built it.

    Example:
        >>> import os, tempfile
        >>> from unittest import mock
        >>> with mock.patch.dict(os.environ, {"RIPIENO_CACHE": tempfile.mkdtemp()}):
        ...     folder, built = cached_small_backbone("wav2vec2")
        ...     again = cached_small_backbone("wav2vec2")
        >>> built, again == (folder, False), (folder / "config.json").is_file()
        (True, True, True)
    """
    if kind not in SMALL_BACKBONE_SETTINGS:
        raise ValueError(f"Unknown small backbone {kind!r}; choose one of {sorted(SMALL_BACKBONE_SETTINGS)}.")
    record = small_backbone_record(kind, seed)
    builder, settings = BUILDERS[kind], SMALL_BACKBONE_SETTINGS[kind]

    def write(folder: Path) -> None:
        builder(folder, **settings, seed=seed, announce=False)

    return build_once(generated_dir("backbones", f"random-{kind}", record), record, write)


def main(argv: list[str] | None = None) -> None:
    """Command line: ``python -m ripieno.framework.backbones.small_models KIND DIR`` (see ``BUILDERS``)."""
    parser = argparse.ArgumentParser(description="Write a small random backbone to a local folder.")
    parser.add_argument("kind", choices=sorted(BUILDERS))
    parser.add_argument("target_dir")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with command_output():
        BUILDERS[args.kind](args.target_dir, seed=args.seed)


if __name__ == "__main__":
    main()
