"""Dataset sources behind one small interface: classes, and ``(image, label)`` as uint8 RGB (H, W, 3).

The prepare step splits and writes FFCV files without knowing where images come from; a source with an
official test set (CIFAR, an image folder's ``val/``) names it in ``fixed_test``. A new source is a class
here and a name in ``SOURCES``. ``image(i)`` is a square of ``image_size``; a ``variable_size`` source also
gives ``image(i, crop=False)``, the whole image with its longer side capped at ``max_resolution`` (stored so
for training when ``data.max_resolution`` is set, for random-resized crops).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tarfile
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np

from locvit.errors import InputError, MissingFileError, allowed
from locvit.io import atomic_path


class DatasetSource:
    """Base interface: ``labels`` for the split, ``image(i)`` for the writer."""

    variable_size = False  # True: images have their own shapes; image(i, crop=False) is the whole image

    def __init__(self, name: str, num_classes: int | None, class_names: tuple[str, ...] = ()):
        self.name, self.num_classes, self.class_names = name, num_classes, class_names

    def load(self, image_size: int, max_resolution: int | None = None) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    @property
    def labels(self) -> np.ndarray:  # (N,) int64
        raise NotImplementedError

    def image(self, index: int, crop: bool = True) -> np.ndarray:  # (H, W, 3) uint8
        raise NotImplementedError

    def fingerprint(self, index: int) -> bytes:
        """What the content hash of a split covers for this image: by default its pixels."""
        return np.ascontiguousarray(self.image(index)).tobytes()

    @property
    def fixed_test(self) -> np.ndarray | None:
        """Indices of the dataset's official test split, or None (then the split is drawn)."""
        return None

    def known_labels(self) -> tuple[np.ndarray, np.ndarray | None] | None:
        """The labels and the official test split's indices as ``load`` will give them, known without
        the images (so ``locvit validate`` can check the split's sizes), or None where only the files tell."""
        return None

    def fetch(self) -> str:
        """Download what ``load`` reads and nothing else (``locvit fetch``); what was done, in a line."""
        return f"{self.name}: nothing to download"


class InMemorySource(DatasetSource):
    """A source whose ``load`` puts every image in memory: ``_images`` (N, S, S, 3), ``_labels`` (N,)."""

    _images: np.ndarray | None = None
    _labels: np.ndarray | None = None

    @property
    def labels(self) -> np.ndarray:
        assert self._labels is not None, "call load() first"
        return self._labels

    def image(self, index: int, crop: bool = True) -> np.ndarray:
        assert self._images is not None, "call load() first"
        return self._images[index]  # already square: crop changes nothing


class DigitsSource(InMemorySource):
    """scikit-learn's bundled handwritten digits: 1,797 8x8 grey images, 10 classes.

    Shipped inside scikit-learn (no download). Pixel values 0..16 are scaled to
    0..255, resized bilinearly (antialiased) to ``image_size`` and repeated over 3
    channels so every model sees ordinary RGB input.
    """

    def __init__(self):
        super().__init__("digits", 10, tuple(str(i) for i in range(10)))

    def known_labels(self) -> tuple[np.ndarray, None] | None:
        try:
            from sklearn.datasets import load_digits
        except ImportError:  # a node without scikit-learn (the GPU node): prepare cannot run there either
            return None
        return load_digits().target.astype(np.int64), None  # the bundled labels: no image decoded

    def load(self, image_size: int, max_resolution: int | None = None) -> None:
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


# The published MD5 of each release archive, looked up by file name (torchvision's values,
# torchvision/datasets/cifar.py). A property of the published file, not a study setting, so
# no config key overrides it; tests that build their own archive replace the entry.
ARCHIVE_MD5 = {
    "cifar-10-python.tar.gz": "c58f30108f718f92721af3b95e74349a",
    "cifar-100-python.tar.gz": "eb9058c3a382ffc7106e4002c42a8d85",
}


def md5_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class CifarSource(InMemorySource):
    """CIFAR-10 / CIFAR-100 (32x32 RGB; 50,000 train + 10,000 official test images).

    From the python-pickle release's folder under ``root`` (CIFAR-100: fine labels), else its archive, whose MD5
    must be ``ARCHIVE_MD5``'s before it is unpacked (into a temporary folder renamed into place). ``download``
    fetches a missing or corrupt archive. The official test images are the test split.
    """

    RELEASES = {  # name -> (folder, train files, test files, label key, meta file, names key, url)
        "cifar10": (
            "cifar-10-batches-py",
            [f"data_batch_{i}" for i in range(1, 6)],
            ["test_batch"],
            b"labels",
            "batches.meta",
            b"label_names",
            "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        ),
        "cifar100": (
            "cifar-100-python",
            ["train"],
            ["test"],
            b"fine_labels",
            "meta",
            b"fine_label_names",
            "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        ),
    }

    def __init__(self, name: str, root: str | Path = "data", download: bool = False):
        self.release = self.RELEASES[name]
        super().__init__(name, 10 if name == "cifar10" else 100, ())
        self.root, self.download = Path(root), download
        self._num_train = 0

    @property
    def folder(self) -> Path:
        return self.root / self.release[0]

    @property
    def url(self) -> str:
        return self.release[6]

    @property
    def archive(self) -> Path:
        return self.root / self.url.rsplit("/", 1)[1]

    def _how_to_get(self) -> str:
        return (
            f"Run `locvit fetch` (where there is a network) or set data.download: true to fetch {self.url} into "
            f"{self.root}, or download that archive there yourself (data.root sets the folder)"
        )

    def _read(self, file: str) -> dict:
        path = self.folder / file
        if not path.is_file():
            raise MissingFileError(f"{self.name}: {path} is missing. {self._how_to_get()}")
        try:
            with open(path, "rb") as fh:
                return pickle.load(fh, encoding="bytes")
        except Exception as err:
            raise InputError(
                f"{self.name}: {path} is not a readable CIFAR batch ({err}); delete "
                f"{self.folder} and prepare again with data.download: true"
            ) from err

    def _archive_problem(self) -> str | None:
        """None when the archive is there with the published MD5, else what is wrong with it."""
        if not self.archive.is_file():
            return "missing"
        expected, got = ARCHIVE_MD5[self.archive.name], md5_file(self.archive)
        return None if got == expected else f"has MD5 {got}, the published archive's is {expected}"

    def _download(self) -> None:
        """Fetch the archive under a temporary name, check its MD5, then give it its name: a download cut
        short or another file never sits where ``load`` looks."""
        from torchvision.datasets.utils import download_url

        with atomic_path(self.archive) as tmp:
            tmp.unlink()  # download_url keeps a file that is already there
            try:
                download_url(self.url, str(self.root), tmp.name)
            except OSError as err:  # urllib's URLError included
                raise InputError(
                    f"{self.name}: could not download {self.url} ({err}). A compute node is often offline: "
                    f"run `locvit fetch` where there is a network (the login node), or download the archive "
                    f"into {self.root} yourself"
                ) from err
            expected, got = ARCHIVE_MD5[self.archive.name], md5_file(tmp)
            if got != expected:
                raise InputError(
                    f"{self.name}: the download of {self.url} has MD5 {got}, the published archive's is "
                    f"{expected}: it was cut short or is another file; nothing was kept, try again"
                )

    def fetch(self) -> str:
        """Download the archive into ``root`` unless it (with the published MD5) or its folder is there."""
        if self.folder.is_dir():
            return f"{self.name}: {self.folder} is there; nothing to download"
        if self._archive_problem() is None:
            return f"{self.name}: {self.archive} is there with the published MD5; nothing to download"
        self._download()
        return f"{self.name}: downloaded {self.url} to {self.archive} (MD5 checked); prepare unpacks it"

    def _ensure_folder(self) -> None:
        """Unpack the archive (fetched first with ``download``) unless the folder is already there."""
        if self.folder.is_dir():
            return
        problem = self._archive_problem()
        if problem and self.download:
            self._download()
            problem = None
        if problem == "missing":
            raise MissingFileError(
                f"{self.name}: neither the folder {self.folder} nor the archive {self.archive} "
                f"is there. {self._how_to_get()}"
            )
        if problem:
            raise InputError(
                f"{self.name}: {self.archive} {problem}: it is truncated, corrupt or another file. "
                f"Delete it; then set data.download: true to fetch {self.url} again, or download it "
                f"yourself"
            )
        self._extract()

    def _extract(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.release[0]}.", suffix=".tmp", dir=self.root))
        try:
            try:
                with tarfile.open(self.archive, "r:gz") as tar:
                    tar.extractall(tmp, filter="data")  # refuses absolute paths, links out of tmp
            except (tarfile.TarError, EOFError, zlib.error, OSError) as err:
                raise InputError(
                    f"{self.name}: {self.archive} could not be unpacked ({err}); delete it and fetch "
                    f"{self.url} again (data.download: true)"
                ) from err
            unpacked = tmp / self.release[0]
            if not unpacked.is_dir():
                raise InputError(
                    f"{self.name}: {self.archive} does not hold the folder {self.release[0]}/; it is not "
                    f"the published archive ({self.url})"
                )
            try:
                os.rename(unpacked, self.folder)  # atomic on one file system
            except OSError:
                if not self.folder.is_dir():  # else another job unpacked it first: use theirs
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    #: The published release's sizes: (training, test) images, every class equally often in each.
    SIZES = (50_000, 10_000)

    def known_labels(self) -> tuple[np.ndarray, np.ndarray]:
        """Balanced labels in the release's sizes, the test split after the training ones. The files' order
        differs: the split's sizes, which the checks read, depend only on the counts (per class to within
        an image)."""
        train, test = self.SIZES
        labels = np.concatenate([np.arange(train) % self.num_classes, np.arange(test) % self.num_classes])
        return labels.astype(np.int64), np.arange(train, train + test)

    def load(self, image_size: int, max_resolution: int | None = None) -> None:
        _, train_files, test_files, label_key, meta_file, names_key, _ = self.release
        self._ensure_folder()
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
            raise InputError(f"{self.name}: labels outside 0..{self.num_classes - 1} in {self.folder}")

    @property
    def fixed_test(self) -> np.ndarray:
        assert self._labels is not None, "call load() first"
        return np.arange(self._num_train, len(self._labels))


class ImageFolderSource(DatasetSource):
    """Images in class folders: ``<folder>/train/<class>/*.jpg``, optionally ``<folder>/val/<class>/``.

    Labels: ``train``'s class folders sorted (torchvision's rule). ``val``, when there, is the test split (its
    classes among train's). The square view resizes the shorter side (bilinear, antialiased) and takes the
    centre. ``num_classes``: a count to check, or None.
    """

    EXTENSIONS = (".jpeg", ".jpg", ".png", ".bmp", ".webp")
    variable_size = True

    def __init__(
        self, name: str, folder: str | Path, num_classes: int | None = None, val_required: bool = False, hint: str = ""
    ):
        self.folder = Path(folder)
        self._counted, self._val_required = num_classes is None, val_required
        self._hint = hint or (
            "Put the images there as train/<class>/*.jpg (and optionally val/<class>/*.jpg), "
            "or set data.root to the folder that holds train/"
        )
        super().__init__(name, num_classes, ())
        self._files: list[Path] = []
        self._labels: np.ndarray | None = None
        self._num_train = 0
        self._size, self._max_resolution = 0, None

    @property
    def num_classes(self) -> int:
        if self._num_classes is None:  # counted on first use: get_source stays cheap
            self._num_classes = len(self._class_folders(self.folder / "train"))
        return self._num_classes

    @num_classes.setter
    def num_classes(self, value: int | None) -> None:
        self._num_classes = value

    def _class_folders(self, top: Path) -> list[str]:
        if not top.is_dir():
            raise MissingFileError(f"{self.name}: {top} is missing. {self._hint}")
        found = sorted(d.name for d in top.iterdir() if d.is_dir())
        if not found:
            raise InputError(
                f"{self.name}: {top} has no class folders; it should hold one sub-folder of images per class"
            )
        return found

    def _scan(self, split: str, classes: list[str] | None) -> tuple[list[str], list[Path], list[int]]:
        top = self.folder / split
        found = self._class_folders(top)
        if classes is None:
            if not self._counted and len(found) != self.num_classes:
                raise InputError(
                    f"{self.name}: {top} has {len(found)} class folders; {self.name} has {self.num_classes}"
                )
            classes = found
        else:
            unknown = [c for c in found if c not in classes]
            if unknown:
                raise InputError(
                    f"{self.name}: {top / unknown[0]} is a class folder that {self.folder / 'train'} "
                    f"does not have ({len(unknown)} such folder(s))"
                )
        files, labels, label_of = [], [], {c: i for i, c in enumerate(classes)}
        for name in found:
            images = sorted(f for f in (top / name).iterdir() if f.is_file() and f.suffix.lower() in self.EXTENSIONS)
            if not images:
                raise InputError(
                    f"{self.name}: {top / name} holds no images (files ending in "
                    f"{', '.join(self.EXTENSIONS)}, any case)"
                )
            files.extend(images)
            labels.extend([label_of[name]] * len(images))
        return classes, files, labels

    def load(self, image_size: int, max_resolution: int | None = None) -> None:
        classes, train_files, train_labels = self._scan("train", None)
        val_files, val_labels = [], []
        if self._val_required or (self.folder / "val").exists():
            _, val_files, val_labels = self._scan("val", classes)
        self.class_names, self.num_classes = tuple(classes), len(classes)
        self._files = train_files + val_files
        self._labels = np.asarray(train_labels + val_labels, dtype=np.int64)
        self._num_train = len(train_files)
        self._size, self._max_resolution = image_size, max_resolution

    @property
    def labels(self) -> np.ndarray:
        assert self._labels is not None, "call load() first"
        return self._labels

    def image(self, index: int, crop: bool = True) -> np.ndarray:
        from PIL import Image

        path = self._files[index]
        try:
            with Image.open(path) as img:
                img = img.convert("RGB")
                w, h = img.size
                if crop:  # the square view: shorter side to image_size, then the centre square
                    side = self._size
                    scale = side / min(w, h)
                    img = img.resize(
                        (max(side, round(w * scale)), max(side, round(h * scale))), Image.BILINEAR, reducing_gap=None
                    )
                    left, top = (img.size[0] - side) // 2, (img.size[1] - side) // 2
                    img = img.crop((left, top, left + side, top + side))
                elif self._max_resolution and max(w, h) > self._max_resolution:  # the whole view, made smaller
                    scale = self._max_resolution / max(w, h)
                    img = img.resize(
                        (max(1, round(w * scale)), max(1, round(h * scale))), Image.BILINEAR, reducing_gap=None
                    )
                return np.asarray(img, dtype=np.uint8)
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            raise InputError(f"{self.name}: {path} is not a readable image ({err}); replace or remove it") from err

    def fetch(self) -> str:
        """Nothing to download (the images are yours; ImageNet's need a licence): checks that train/ is there."""
        classes = self._class_folders(self.folder / "train")  # missing: an error naming the folder and the layout
        return f"{self.name}: nothing to download; {self.folder / 'train'} holds {len(classes)} class folder(s)"

    def fingerprint(self, index: int) -> bytes:
        """The file's name, byte size and the preparation sizes: hashing a large folder reads no pixels."""
        path = self._files[index]
        return f"{path.relative_to(self.folder)}\0{path.stat().st_size}\0{self._size}\0{self._max_resolution}".encode()

    @property
    def fixed_test(self) -> np.ndarray | None:
        assert self._labels is not None, "call load() first"
        return np.arange(self._num_train, len(self._labels)) if self._num_train < len(self._labels) else None


class ImageNetSource(ImageFolderSource):
    """ImageNet-1k in the usual ImageFolder layout: ``<root>/imagenet/{train,val}/<wnid>/*.JPEG``.

    Nothing is downloaded (ImageNet needs a licence): put (or link) the folder there.
    1000 class folders; ``val`` is required and is the test split.
    """

    def __init__(self, root: str | Path = "data", download: bool = False):
        folder = Path(root) / "imagenet"
        super().__init__(
            "imagenet",
            folder,
            num_classes=1000,
            val_required=True,
            hint=f"ImageNet is not downloaded for you: place the ImageFolder layout (train/ and val/, "
            f"one sub-folder per class) in {folder} (or set data.root to the folder that holds "
            f"imagenet/)",
        )


SOURCES: dict[str, Callable[..., DatasetSource]] = {
    "digits": lambda root="data", download=False: DigitsSource(),
    "cifar10": lambda root="data", download=False: CifarSource("cifar10", root, download),
    "cifar100": lambda root="data", download=False: CifarSource("cifar100", root, download),
    "imagenet": lambda root="data", download=False: ImageNetSource(root, download),
    "imagefolder": lambda root="data", download=False: ImageFolderSource("imagefolder", root),
}


def get_source(name: str, root: str | Path = "data", download: bool = False) -> DatasetSource:
    """The source called ``name``; ``root`` and ``download`` matter to the file-backed datasets."""
    allowed("data.source", name, SOURCES)
    return SOURCES[name](root=root, download=download)
