"""Dataset sources behind one small interface.

A source knows its classes and yields ``(image, label)`` pairs as uint8 RGB arrays of
shape (H, W, 3) at the requested size. The prepare step does the stratified split
and writes FFCV files; it never needs to know where images come from. Later sources
(CIFAR-10/100, ImageFolder/ImageNet) add a class here and a name to ``SOURCES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class DatasetSource:
    """Base interface: ``labels`` for the split, ``image(i)`` for the writer."""

    name: str
    num_classes: int
    class_names: tuple[str, ...]

    def load(self, image_size: int) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def labels(self) -> np.ndarray:  # (N,) int64
        raise NotImplementedError

    def image(self, index: int) -> np.ndarray:  # (H, W, 3) uint8
        raise NotImplementedError


class DigitsSource(DatasetSource):
    """scikit-learn's bundled handwritten digits: 1,797 8x8 grey images, 10 classes.

    Shipped inside scikit-learn (no download). Pixel values 0..16 are scaled to
    0..255, resized bilinearly (antialiased) to ``image_size`` and repeated over 3
    channels so every model sees ordinary RGB input.
    """

    def __init__(self):
        super().__init__("digits", 10, tuple(str(i) for i in range(10)))
        self._images: np.ndarray | None = None
        self._labels: np.ndarray | None = None

    def load(self, image_size: int) -> None:
        import torch
        import torch.nn.functional as F
        from sklearn.datasets import load_digits

        bunch = load_digits()
        grey = torch.from_numpy(bunch.images.astype(np.float32) * (255.0 / 16.0))[:, None]  # (N, 1, 8, 8)
        big = F.interpolate(grey, size=(image_size, image_size), mode="bilinear", align_corners=False, antialias=True)
        big = big.round().clamp(0, 255).to(torch.uint8).repeat(1, 3, 1, 1)  # (N, 3, S, S)
        self._images = np.ascontiguousarray(big.permute(0, 2, 3, 1).numpy())  # (N, S, S, 3)
        self._labels = bunch.target.astype(np.int64)

    @property
    def labels(self) -> np.ndarray:
        assert self._labels is not None, "call load() first"
        return self._labels

    def image(self, index: int) -> np.ndarray:
        assert self._images is not None, "call load() first"
        return self._images[index]


SOURCES: dict[str, Callable[[], DatasetSource]] = {"digits": DigitsSource}


def get_source(name: str) -> DatasetSource:
    if name not in SOURCES:
        raise ValueError(f"data.source: unknown source {name!r}; allowed values: {', '.join(SOURCES)}")
    return SOURCES[name]()
