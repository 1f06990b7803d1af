"""Small image and audio folders written like a user's own (class-per-folder layouts, mixed formats)."""

from pathlib import Path

import numpy as np
import soundfile
from PIL import Image


def write_image_folder(root: Path, per_class: int = 8) -> Path:
    """Three classes of small PNG/JPG images in mixed modes (grey, RGB, palette)."""
    rng = np.random.default_rng(0)
    for c, name in enumerate(["cat", "dog", "eel"]):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(per_class):
            size = (20 + i, 24)
            if i % 3 == 0:
                image = Image.fromarray(rng.integers(0, 256, size, dtype=np.uint8))  # grey "L"
            else:
                image = Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8) // (c + 1))
            image.save(folder / f"{i}.{'jpg' if i % 4 == 1 else 'png'}")
        (folder / "notes.txt").write_text("ignored")
    return root


def sine(freq: float, rate: int, seconds: float, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(round(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def write_audio_folder(root: Path) -> Path:
    """Two classes (low / high tone) of short wav clips at mixed rates, lengths and channels."""
    rates = [8000, 16000, 22050]
    for c, (name, freq) in enumerate([("high", 1200.0), ("low", 300.0)]):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(6):
            rate = rates[i % 3]
            clip = sine(freq * (1 + 0.05 * i), rate, 0.3 + 0.05 * i + 0.02 * c)
            if i == 5:
                clip = np.stack([clip, 0.5 * clip], axis=1)  # stereo
            soundfile.write(folder / f"{i}.wav", clip, rate)
    return root
