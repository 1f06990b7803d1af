"""Small tables with a learnable target, built like a user's own: numeric, count and text columns."""

import numpy as np
import pandas as pd


def make_table(n: int = 240, seed: int = 0, task: str = "regression") -> pd.DataFrame:
    """A small mixed-type table with a learnable target."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.normal(size=n), rng.uniform(-1, 1, size=n)
    colour = rng.choice(["red", "green", "blue"], size=n)
    signal = x1 + 0.5 * x2 + (colour == "red")
    frame = pd.DataFrame({"x1": x1, "x2": x2, "count": rng.integers(0, 20, size=n), "colour": colour})
    if task == "regression":
        frame["y"] = signal + 0.1 * rng.normal(size=n)
    elif task == "binary":
        frame["y"] = np.where(signal > signal.mean(), "yes", "no")
    else:
        frame["y"] = np.digitize(signal, np.quantile(signal, [1 / 3, 2 / 3])).astype(str)
        frame["y"] = "class_" + frame["y"]
    return frame
