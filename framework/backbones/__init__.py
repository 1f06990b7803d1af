"""Pretrained backbones, offline: loading, model-folder checks, converters and small test models.

``loading`` loads a local Hugging Face / timm folder or TorchScript file;
``model_folder`` checks a folder before it is loaded; ``convert_*`` turn the real
weights shipped in packages (DINOv2, EfficientNet-Lite0, Whisper tiny.en) into such folders;
``small_models`` builds small random GPT-2 / DINOv2 / Wav2Vec2 folders for tests.
"""

from ripieno.framework.backbones.loading import load_pretrained_backbone, minilm_dir

__all__ = ["load_pretrained_backbone", "minilm_dir"]
