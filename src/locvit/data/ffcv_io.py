"""Everything locvit does with FFCV, in one small module so FFCV can be swapped.

FFCV (pinned, source-only, barely maintained upstream) writes each split to one
``.beton`` file and reads it back with its JIT-compiled ``Loader``: random order
for training, sequential order for evaluation, on CPU and on CUDA. Decoding and the
cheap augmentations (random translation, horizontal flip) run inside the loader;
float conversion and normalisation happen on the device in :func:`to_model_input`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from locvit.io import atomic_path


def _cache_numba_typed_dict() -> None:
    """Let numba cache its typed-Dict functions on disk before ``import ffcv`` needs them.

    Importing FFCV fills a numba typed ``Dict`` (``ffcv.fields.rgb_image``), which
    JIT-compiles numba's dict functions in every process: 5-7 s on 2 cores, the
    largest part of a short job's start-up. With caching on (numba's public
    ``Dispatcher.enable_caching``; the cache lives in numba's ``__pycache__`` or
    ``NUMBA_CACHE_DIR``) the first process compiles and later ones load in about 1 s.
    """
    from numba.core.registry import CPUDispatcher
    from numba.typed import typeddict

    for name in dir(typeddict):
        fn = getattr(typeddict, name)
        if isinstance(fn, CPUDispatcher):
            fn.enable_caching()


_cache_numba_typed_dict()


class _Subset:
    """The indexed dataset FFCV's writer wants: ``ds[i] -> (image, label)``."""

    def __init__(self, source, indices: Sequence[int]):
        self.source, self.indices = source, np.asarray(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        j = int(self.indices[i])
        return self.source.image(j), int(self.source.labels[j])


def write_beton(path: str | Path, source, indices: Sequence[int], image_size: int,
                write_mode: str = "raw", jpeg_quality: int = 90, num_workers: int = 1) -> None:
    """Write ``source[indices]`` to an FFCV file at ``path`` (atomically)."""
    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    fields = {
        "image": RGBImageField(write_mode=write_mode, max_resolution=image_size, jpeg_quality=jpeg_quality),
        "label": IntField(),
    }
    with atomic_path(path) as tmp:
        writer = DatasetWriter(str(tmp), fields, num_workers=num_workers)
        # FFCV's progress bar goes to stderr; harmless in logs.
        writer.from_indexed_dataset(_Subset(source, indices), chunksize=64)


def make_loader(path: str | Path, batch_size: int, train: bool, device: torch.device,
                num_workers: int = 1, seed: int = 0, translate: int = 0, hflip: bool = False,
                distributed: bool = False, drop_last: bool | None = None, jit: bool = True):
    """An FFCV ``Loader`` yielding ``(images uint8 (B, 3, H, W), labels int64 (B,))``.

    Training: random order (seeded), optional random translation and flip.
    Evaluation: sequential order, no augmentation, every sample exactly once.

    ``jit``: FFCV compiles its pipeline with numba on the first batch (about 10 s on a
    2-core CPU, in every process); worth it for large datasets, not for small ones,
    where the plain-Python pipeline is as fast per epoch. Without it FFCV's random
    augmentations draw from numpy's global generator, which the run's seed sets (numba
    keeps its own, unseeded one), so runs repeat exactly. The switch is process-wide
    (FFCV's ``Compiler``): every loader of a process should use the same value.
    """
    from ffcv.fields.decoders import IntDecoder, SimpleRGBImageDecoder
    from ffcv.loader import Loader, OrderOption
    from ffcv.pipeline.compiler import Compiler
    from ffcv.transforms import RandomHorizontalFlip, RandomTranslate, Squeeze, ToDevice, ToTensor, ToTorchImage

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"FFCV file {path} does not exist; run the prepare step (snakemake prepare / dvc repro prepare)")
    image_pipe = [SimpleRGBImageDecoder()]
    if train and hflip:
        image_pipe.append(RandomHorizontalFlip())
    if train and translate > 0:
        image_pipe.append(RandomTranslate(padding=translate, fill=(0, 0, 0)))
    image_pipe += [ToTensor(), ToDevice(device, non_blocking=True), ToTorchImage()]
    label_pipe = [IntDecoder(), ToTensor(), Squeeze(), ToDevice(device, non_blocking=True)]
    Compiler.set_enabled(jit)  # read when the pipeline is compiled, at the first batch
    return Loader(
        str(path),
        batch_size=batch_size,
        num_workers=num_workers,
        order=OrderOption.RANDOM if train else OrderOption.SEQUENTIAL,
        distributed=distributed,
        seed=seed,
        os_cache=True,
        drop_last=train if drop_last is None else drop_last,
        pipelines={"image": image_pipe, "label": label_pipe},
    )


def read_all(path: str | Path, limit: int | None = None, jit: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The images (B, H, W, 3) uint8 and labels of an FFCV file in order: all, or the first ``limit``."""
    batch = min(256, limit) if limit else 256
    loader = make_loader(path, batch_size=batch, train=False, device=torch.device("cpu"), jit=jit)
    images, labels, seen = [], [], 0
    for x, y in loader:
        images.append(x.permute(0, 2, 3, 1).contiguous().numpy())
        labels.append(y.numpy())
        seen += len(y)
        if limit and seen >= limit:
            break
    return np.concatenate(images)[:limit], np.concatenate(labels)[:limit]


def to_model_input(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> normalised float (B, 3, H, W) on the images' device."""
    x = images.float().div_(255.0)
    mean_t = torch.tensor(mean, device=x.device, dtype=x.dtype).view(1, -1, 1, 1)
    std_t = torch.tensor(std, device=x.device, dtype=x.dtype).view(1, -1, 1, 1)
    return (x - mean_t) / std_t
