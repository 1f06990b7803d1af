"""ImageClassifier: a plain supervised network for the uncertainty experiments.

One member (``member_outputs (B, 1, C)``); uncertainty comes post hoc from ripieno.callbacks
(``LastLayerSampler`` for LL-GLM/DNN-GLM, ``MCDropoutSampler``). The last layer is
``head`` (an ``nn.Linear``), which LL-GLM finds without configuration; dropout sits right
before it so MC-dropout has something to sample.
"""

from __future__ import annotations

from typing import Any, Literal

from torch import Tensor, nn
from typing_extensions import override

from ripieno.framework.methods.member_module import MemberModule
from ripieno.framework.specs.image import ImageSpec

Backbone = Literal["cnn", "mlp", "lenet"]


def make_backbone(kind: Backbone, image_shape: tuple[int, int, int], width: int) -> tuple[nn.Module, int]:
    """A small feature extractor and its output width.

    ``cnn``: two conv(3x3)-ReLU-maxpool stages (``width``, ``2 width`` channels) and a
    ``4 width`` linear layer (LeNet-like, for 28x28 and 8x8 inputs); ``mlp``: flatten and
    two ``4 width`` layers; ``lenet``: LeNet-5 as in the LinearSampling paper's experiments
    (28x28 inputs; conv 5x5 to 6 channels with padding 2, sigmoid, 2x2 average pool, conv
    5x5 to 16, sigmoid, pool, linear 400-120-84 with sigmoids; ``width`` is ignored).
    """
    c, h, w = image_shape
    if kind == "lenet":
        if (h, w) != (28, 28):
            raise ValueError(f"The lenet backbone is LeNet-5 for 28x28 images, got {h}x{w}; use 'cnn'.")
        lenet = [nn.Conv2d(c, 6, 5, padding=2), nn.Sigmoid(), nn.AvgPool2d(2),
                 nn.Conv2d(6, 16, 5), nn.Sigmoid(), nn.AvgPool2d(2), nn.Flatten(),
                 nn.Linear(16 * 5 * 5, 120), nn.Sigmoid(), nn.Linear(120, 84), nn.Sigmoid()]
        return nn.Sequential(*lenet), 84
    if kind == "mlp":
        layers = [nn.Flatten(), nn.Linear(c * h * w, 4 * width), nn.ReLU(),
                  nn.Linear(4 * width, 4 * width), nn.ReLU()]
        return nn.Sequential(*layers), 4 * width
    if kind != "cnn":
        raise ValueError(f"Unknown backbone {kind!r}; use 'cnn', 'mlp' or 'lenet'.")
    if min(h, w) < 4:
        raise ValueError(f"The cnn backbone needs images of at least 4x4, got {h}x{w}; use 'mlp'.")
    conv = nn.Sequential(
        nn.Conv2d(c, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
    )
    d_conv = 2 * width * (h // 4) * (w // 4)
    return nn.Sequential(conv, nn.Linear(d_conv, 4 * width), nn.ReLU()), 4 * width


class ImageClassifier(MemberModule):
    """Softmax classifier with a small CNN or MLP backbone.

    Logs ``{val,test}/accuracy``, ``/nll`` and ``/ece`` (15 bins) of the trained network
    (``MemberModule``); rows of a test dataloader whose labels are ``-1`` (OOD, see
    ``ImageDataModule``) are skipped by these metrics.

    Args:
        data_spec: the data's ``ImageSpec`` (or dict); linked from ``data.spec`` by the CLI.
        backbone: ``cnn``, ``mlp`` or ``lenet`` (LeNet-5, see ``make_backbone``).
        width: channel/width multiplier of the backbone.
        dropout: dropout before the last layer (also what MC-dropout samples).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
    """

    task = "multiclass"

    def __init__(
        self,
        data_spec: ImageSpec | dict[str, Any],
        backbone: Backbone = "cnn",
        width: int = 16,
        dropout: float = 0.1,
        lr: float = 1e-3,
        weight_decay: float = 1e-4,
    ) -> None:
        super().__init__()
        spec = ImageSpec.coerce(data_spec)
        data_spec = spec.to_dict()
        self.save_hyperparameters()
        self.spec = spec
        self.features, d = make_backbone(backbone, spec.image_shape, width)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(d, spec.n_classes)
        self.init_members("logits", spec.n_classes)

    @override
    def forward(self, x: Tensor) -> Tensor:
        """Logits ``(B, C)`` for images ``(B, C_in, H, W)``."""
        return self.head(self.dropout(self.features(x)))

    def forward_members(self, batch: dict[str, Tensor]) -> Tensor:
        """Logits as one member, ``(B, 1, C)``."""
        return self(batch["x"])[:, None]
