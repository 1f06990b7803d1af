"""Reliability diagrams go to the active logger: TensorBoard's add_figure, a logger's image API,
else a PNG in the logger's folder or, without a logger, in the trainer's default_root_dir."""

from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, Logger, TensorBoardLogger
from torch import nn
from torch.utils.data import DataLoader

from ripieno.callbacks.posterior_predictive import PosteriorPredictiveCallback
from ripieno.callbacks.temperature_scaling import TemperatureScaling

PNG = b"\x89PNG\r\n\x1a\n"


class Network(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 3)

    def forward(self, x):
        return self.net(x)

    def test_step(self, batch, batch_idx):
        return {"member_outputs": self(batch["x"])[:, None], "target": batch["y"]}


class Identity(PosteriorPredictiveCallback):
    """The network itself as S = 2 identical samples: enough to exercise the base class."""

    def prepare(self, trainer, pl_module):
        self.likelihood = "classification"

    def sample(self, pl_module, batch):
        return pl_module(batch["x"])[:, None].expand(-1, 2, -1)


def _test_loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 4, generator=g)
    y = torch.randint(0, 3, (60,), generator=g)
    return DataLoader([{"x": x[i], "y": y[i]} for i in range(60)], batch_size=20)


def _test(tmp_path, logger, callbacks):
    trainer = L.Trainer(logger=logger, enable_progress_bar=False, enable_model_summary=False,
                        default_root_dir=tmp_path, callbacks=callbacks)
    return trainer, trainer.test(Network(), _test_loader(), verbose=False)[0]


def _scaling():
    scaling = TemperatureScaling(output_kind="logits")
    scaling.load_state_dict({"temperature": 1.5})
    return scaling


def test_tensorboard_gets_image_events(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path, name="tb")
    callback = Identity()
    _test(tmp_path, logger, [callback, _scaling()])
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    tags = events.Tags()["images"]
    assert {"uq/test/reliability/Identity", "calibrated/test/reliability"} <= set(tags)
    image = events.Images("uq/test/reliability/Identity")[0]
    assert image.encoded_image_string[:8] == PNG and image.width > 100
    assert callback.reliability_path is None  # the logger showed it: no PNG besides
    assert not list(Path(tmp_path).rglob("*.png"))


class ImageLogger(Logger):
    """A logger with the WandbLogger image API, recording its calls."""

    def __init__(self):
        super().__init__()
        self.images = []

    @property
    def name(self):
        return "images"

    @property
    def version(self):
        return 0

    def log_metrics(self, metrics, step=None):
        pass

    def log_hyperparams(self, params, *args, **kwargs):
        pass

    def log_image(self, key, images, step=None, **kwargs):
        self.images.append((key, images, step))


def test_a_logger_with_log_image_gets_rgb_arrays(tmp_path):
    logger = ImageLogger()
    _test(tmp_path, logger, [Identity()])
    [(key, images, step)] = logger.images
    assert key == "uq/test/reliability/Identity" and step == 0
    assert images[0].dtype == np.uint8 and images[0].ndim == 3 and images[0].shape[-1] == 3


def test_csv_logger_gets_a_png_in_its_log_dir(tmp_path):
    logger = CSVLogger(tmp_path, name="csv")
    callback = Identity()
    _test(tmp_path, logger, [callback, _scaling()])
    assert callback.reliability_path == Path(logger.log_dir) / "reliability_Identity.png"
    assert callback.reliability_path.read_bytes()[:8] == PNG
    assert (Path(logger.log_dir) / "reliability_calibrated.png").read_bytes()[:8] == PNG


def test_no_logger_writes_the_png_under_default_root_dir(tmp_path):
    callback = Identity()
    _, result = _test(tmp_path, False, [callback])
    assert callback.reliability_path == tmp_path / "reliability_Identity.png"
    assert callback.reliability_path.read_bytes()[:8] == PNG
    assert {"uq/test/brier", "uq/test/nll", "uq/test/ece"} <= set(result)


@pytest.mark.parametrize("temperature", [None, 2.0])
def test_base_class_brier_is_of_the_tempered_predictive(tmp_path, temperature):
    _, result = _test(tmp_path, False, [Identity(temperature=temperature)])
    loader, net = _test_loader(), Network()
    with torch.no_grad():
        logits = torch.cat([net(b["x"]) for b in loader]) / (temperature or 1.0)
    y = torch.cat([b["y"] for b in loader])
    brier = float(((torch.softmax(logits, -1) - nn.functional.one_hot(y, 3)) ** 2).sum(1).mean())
    assert result["uq/test/brier"] == pytest.approx(brier, rel=1e-5)
