"""A tiny LightningModule and DataModule with dict batches (``{"x", "y"}``), for callback tests."""

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader


class TinyClassifier(L.LightningModule):
    """A 4-feature MLP (``hidden`` 0: one linear layer) with dropout, seeded, on ``{"x", "y"}`` batches."""

    def __init__(self, n_out=3, task="multiclass", hidden=16, batch_norm=False, lr=0.01):
        super().__init__()
        torch.manual_seed(0)
        self.task, self.lr = task, lr
        if hidden:
            norm = [nn.BatchNorm1d(hidden)] if batch_norm else []
            self.net = nn.Sequential(nn.Linear(4, hidden), *norm, nn.ReLU(), nn.Dropout(0.1),
                                     nn.Linear(hidden, n_out))
        else:
            self.net = nn.Linear(4, n_out)

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        out = self(batch["x"])
        if self.task == "regression":
            return nn.functional.mse_loss(out[:, 0], batch["y"])
        return nn.functional.cross_entropy(out, batch["y"])

    def test_step(self, batch, batch_idx):
        return None

    def predict_step(self, batch, batch_idx):
        return {"logits": self(batch["x"])}

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.lr)


class TinyData(L.LightningDataModule):
    """160 seeded rows: 100 train, 20 validation, 40 test (and predict)."""

    def __init__(self, task="multiclass"):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        x = torch.randn(160, 4, generator=g)
        y = (x[:, 0] + x[:, 1] > 0).long() + (x[:, 2] > 1).long() if task != "regression" else x[:, 0] * 2
        self.rows = [{"x": x[i], "y": y[i]} for i in range(160)]

    def train_dataloader(self):
        return DataLoader(self.rows[:100], batch_size=32, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.rows[100:120], batch_size=20)

    def test_dataloader(self):
        return DataLoader(self.rows[120:], batch_size=20)

    def predict_dataloader(self):
        return self.test_dataloader()
