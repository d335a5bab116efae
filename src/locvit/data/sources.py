"""Dataset sources behind one small interface.

A source knows its classes and yields ``(image, label)`` pairs as uint8 RGB arrays of
shape (H, W, 3) at the requested size. The prepare step does the stratified split
and writes FFCV files; it never needs to know where images come from. A source with an
official test set (CIFAR) names it in ``fixed_test``; the prepare step then keeps it as
the test split. New sources add a class here and a name to ``SOURCES``.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
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

    @property
    def fixed_test(self) -> np.ndarray | None:
        """Indices of the dataset's official test split, or None (then the split is drawn)."""
        return None


class InMemorySource(DatasetSource):
    """A source whose ``load`` puts every image in memory: ``_images`` (N, S, S, 3), ``_labels`` (N,)."""

    _images: np.ndarray | None = None
    _labels: np.ndarray | None = None

    @property
    def labels(self) -> np.ndarray:
        assert self._labels is not None, "call load() first"
        return self._labels

    def image(self, index: int) -> np.ndarray:
        assert self._images is not None, "call load() first"
        return self._images[index]


class DigitsSource(InMemorySource):
    """scikit-learn's bundled handwritten digits: 1,797 8x8 grey images, 10 classes.

    Shipped inside scikit-learn (no download). Pixel values 0..16 are scaled to
    0..255, resized bilinearly (antialiased) to ``image_size`` and repeated over 3
    channels so every model sees ordinary RGB input.
    """

    def __init__(self):
        super().__init__("digits", 10, tuple(str(i) for i in range(10)))

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


def _resize(images: np.ndarray, size: int) -> np.ndarray:
    """(N, H, W, 3) uint8 -> (N, size, size, 3), bilinear with antialiasing; a no-op at the same size."""
    if images.shape[1] == size and images.shape[2] == size:
        return images
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    return np.ascontiguousarray(x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy())


class CifarSource(InMemorySource):
    """CIFAR-10 / CIFAR-100 (32x32 RGB; 50,000 train + 10,000 official test images).

    Read from the python-pickle release under ``<root>/cifar-10-batches-py`` or
    ``<root>/cifar-100-python`` (CIFAR-100: the 100 fine labels). With ``download`` the
    archive is fetched by torchvision's downloader first (checksum checked). The
    official test images are the test split; validation is drawn from the training images.
    """

    RELEASES = {  # name -> (folder, train files, test files, label key, meta file, names key, archive, md5)
        "cifar10": ("cifar-10-batches-py", [f"data_batch_{i}" for i in range(1, 6)], ["test_batch"], b"labels",
                    "batches.meta", b"label_names",
                    "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a"),
        "cifar100": ("cifar-100-python", ["train"], ["test"], b"fine_labels", "meta", b"fine_label_names",
                     "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85"),
    }

    def __init__(self, name: str, root: str | Path = "data", download: bool = False):
        self.release = self.RELEASES[name]
        super().__init__(name, 10 if name == "cifar10" else 100, ())
        self.root, self.download = Path(root), download
        self._num_train = 0

    @property
    def folder(self) -> Path:
        return self.root / self.release[0]

    def _read(self, file: str) -> dict:
        path = self.folder / file
        if not path.is_file():
            raise FileNotFoundError(
                f"{self.name}: {path} is missing. Set data.download: true to fetch {self.release[6]} "
                f"into {self.root}, or unpack that archive there yourself (data.root sets the folder)")
        try:
            with open(path, "rb") as fh:
                return pickle.load(fh, encoding="bytes")
        except Exception as err:
            raise ValueError(f"{self.name}: {path} is not a readable CIFAR batch ({err}); delete "
                             f"{self.folder} and prepare again with data.download: true") from err

    def load(self, image_size: int) -> None:
        folder, train_files, test_files, label_key, meta_file, names_key, url, md5 = self.release
        if self.download and not self.folder.is_dir():
            from torchvision.datasets.utils import download_and_extract_archive

            download_and_extract_archive(url, str(self.root), md5=md5)
        images, labels = [], []
        for file in train_files + test_files:
            batch = self._read(file)
            images.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
            labels.append(np.asarray(batch[label_key], dtype=np.int64))
            if file == train_files[-1]:
                self._num_train = sum(len(x) for x in labels)
        self.class_names = tuple(n.decode() for n in self._read(meta_file)[names_key])
        self._images = _resize(np.concatenate(images), image_size)  # (N, S, S, 3)
        self._labels = np.concatenate(labels)
        bad = self._labels[(self._labels < 0) | (self._labels >= self.num_classes)]
        if bad.size:
            raise ValueError(f"{self.name}: labels outside 0..{self.num_classes - 1} in {self.folder}")

    @property
    def fixed_test(self) -> np.ndarray:
        assert self._labels is not None, "call load() first"
        return np.arange(self._num_train, len(self._labels))


class ImageNetSource(DatasetSource):
    """ImageNet-1k in the usual ImageFolder layout: ``<root>/imagenet/{train,val}/<wnid>/*.JPEG``.

    Nothing is downloaded (ImageNet needs a licence): put (or link) the folder there. The
    1000 class folders, sorted by name, are the labels; ``val`` is the test split and the
    validation split is drawn from ``train``. Images are read lazily with PIL: the
    shorter side resized (bilinear, antialiased) to ``image_size``, then the centre square.
    """

    EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".webp")

    def __init__(self, root: str | Path = "data", download: bool = False):
        super().__init__("imagenet", 1000, ())
        self.folder = Path(root) / "imagenet"
        self.download = download
        self._files: list[Path] = []
        self._labels: np.ndarray | None = None
        self._num_train = 0
        self._size = 0

    def _scan(self, split: str, classes: list[str] | None) -> tuple[list[str], list[Path], list[int]]:
        top = self.folder / split
        if not top.is_dir():
            raise FileNotFoundError(f"imagenet: {top} is missing. ImageNet is not downloaded for you: place the "
                                    f"ImageFolder layout (train/ and val/, one sub-folder per class) in {self.folder}"
                                    f" (or set data.root to the folder that holds imagenet/)")
        found = sorted(d.name for d in top.iterdir() if d.is_dir())
        if classes is None and len(found) != self.num_classes:
            raise ValueError(f"imagenet: {top} has {len(found)} class folders, ImageNet-1k has {self.num_classes}")
        if classes is not None and found != classes:
            raise ValueError(f"imagenet: the class folders of {top} differ from those of train/")
        files, labels = [], []
        for label, name in enumerate(found):
            images = sorted(f for f in (top / name).iterdir() if f.suffix.lower() in self.EXTENSIONS)
            files.extend(images)
            labels.extend([label] * len(images))
        return found, files, labels

    def load(self, image_size: int) -> None:
        classes, train_files, train_labels = self._scan("train", None)
        _, val_files, val_labels = self._scan("val", classes)
        self.class_names = tuple(classes)
        self._files = train_files + val_files
        self._labels = np.asarray(train_labels + val_labels, dtype=np.int64)
        self._num_train = len(train_files)
        self._size = image_size

    @property
    def labels(self) -> np.ndarray:
        assert self._labels is not None, "call load() first"
        return self._labels

    def image(self, index: int) -> np.ndarray:
        from PIL import Image

        path = self._files[index]
        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
                w, h = img.size
                scale = self._size / min(w, h)
                img = img.resize((max(self._size, round(w * scale)), max(self._size, round(h * scale))),
                                 Image.BILINEAR, reducing_gap=None)
                left, top = (img.size[0] - self._size) // 2, (img.size[1] - self._size) // 2
                return np.asarray(img.crop((left, top, left + self._size, top + self._size)), dtype=np.uint8)
        except OSError as err:
            raise ValueError(f"imagenet: {path} is not a readable image ({err}); replace or remove it") from err

    @property
    def fixed_test(self) -> np.ndarray:
        assert self._labels is not None, "call load() first"
        return np.arange(self._num_train, len(self._labels))


SOURCES: dict[str, Callable[..., DatasetSource]] = {
    "digits": lambda root="data", download=False: DigitsSource(),
    "cifar10": lambda root="data", download=False: CifarSource("cifar10", root, download),
    "cifar100": lambda root="data", download=False: CifarSource("cifar100", root, download),
    "imagenet": lambda root="data", download=False: ImageNetSource(root, download),
}


def get_source(name: str, root: str | Path = "data", download: bool = False) -> DatasetSource:
    """The source called ``name``; ``root`` and ``download`` matter to downloadable datasets."""
    if name not in SOURCES:
        raise ValueError(f"data.source: unknown source {name!r}; allowed values: {', '.join(SOURCES)}")
    return SOURCES[name](root=root, download=download)
