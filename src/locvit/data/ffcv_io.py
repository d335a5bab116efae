"""Everything locvit does with FFCV (pinned, source-only), in one small module so FFCV can be swapped.

Each split is one ``.beton`` file read back by FFCV's ``Loader`` (random order for training, sequential
for evaluation). Decoding and the cheap augmentations run inside the loader; float conversion and
normalisation on the device (``to_model_input``); the rest in ``locvit.data.augment``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from locvit.errors import InputError, LocvitError, MissingFileError
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


_BLANK = np.zeros((1, 1, 3), np.uint8)  # written in place of images once one has failed: the file is discarded


class _Subset:
    """The indexed dataset FFCV's writer wants: ``ds[i] -> (image, label)``.

    FFCV's writer processes die on an exception and its main process then waits for them
    forever. So an error (an unreadable image) is caught here: the first one is sent to
    the main process through ``errors`` and ``failed`` tells every writer process to skip
    the remaining images; ``write_beton`` raises it once the writer returns.
    """

    def __init__(self, source, indices: Sequence[int], crop: bool, failed, errors):
        self.source, self.indices, self.crop = source, np.asarray(indices), crop
        self.failed, self.errors = failed, errors

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int):
        j = int(self.indices[i])
        label = int(self.source.labels[j])
        if self.failed.value:
            return _BLANK, label
        try:
            return self.source.image(j, crop=self.crop), label
        except Exception as err:  # noqa: BLE001 - reported by write_beton, in the main process
            with self.failed.get_lock():
                first, self.failed.value = not self.failed.value, 1
            if first:  # one message at most: a full pipe would block this process
                mine = isinstance(err, LocvitError)  # a bad image, named; else a failure below locvit
                self.errors.put((mine, str(err) if mine else f"{type(err).__name__}: {err}"))
            return _BLANK, label


def write_beton(
    path: str | Path,
    source,
    indices: Sequence[int],
    max_resolution: int,
    crop: bool = True,
    write_mode: str = "raw",
    jpeg_quality: int = 90,
    compress_probability: float = 0.5,
    num_workers: int = 1,
    chunk_size: int = 100,
    seed: int = 0,
) -> None:
    """Write ``source[indices]`` to an FFCV file at ``path`` (atomically).

    ``crop``: each image's square view (``source.image(i)``), else the whole image
    (``source.image(i, crop=False)``); FFCV's ``RGBImageField`` caps the longer side at
    ``max_resolution`` in both cases (downscaling only, OpenCV's INTER_AREA).
    ``num_workers`` writer processes take ``chunk_size`` images at a time. ``seed`` seeds
    the draw of the 'proportion' mode (which images are JPEG-compressed): FFCV draws it
    from numpy's global generator in the writer processes, which inherit this process's
    state when forked. With one writer process the file is the same every time; with
    several, which process takes which chunk varies, and so does the draw.
    """
    import multiprocessing

    from ffcv.fields import IntField, RGBImageField
    from ffcv.writer import DatasetWriter

    fields = {
        "image": RGBImageField(
            write_mode=write_mode,
            max_resolution=max_resolution,
            jpeg_quality=jpeg_quality,
            compress_probability=compress_probability,
        ),
        "label": IntField(),
    }
    failed, errors = multiprocessing.Value("b", 0), multiprocessing.SimpleQueue()
    numpy_state = np.random.get_state()
    np.random.seed(seed % 2**32)
    try:
        with atomic_path(path) as tmp:
            writer = DatasetWriter(str(tmp), fields, num_workers=num_workers)
            # FFCV's progress bar goes to stderr; harmless in logs.
            writer.from_indexed_dataset(_Subset(source, indices, crop, failed, errors), chunksize=chunk_size)
            if failed.value:
                mine, message = errors.get()
                raise (InputError if mine else RuntimeError)(
                    f"{message} (while writing {Path(path).name}; nothing was written)"
                )
    finally:
        np.random.set_state(numpy_state)
        errors.close()


def stored_sizes(path: str | Path) -> tuple[tuple[int, int], tuple[int, int]]:
    """((min height, max height), (min width, max width)) of the images of an FFCV file (its metadata only)."""
    from ffcv.reader import Reader

    reader = Reader(str(path))
    meta = reader.metadata[reader.metadata.dtype.names[reader.field_names.index("image")]]
    return (int(meta["height"].min()), int(meta["height"].max())), (int(meta["width"].min()), int(meta["width"].max()))


def _image_decoder(path: Path, train: bool, image_size: int | None):
    """FFCV's decoder for the file: as stored when every image is image_size square, else a crop to it.

    Training files written whole (``data.max_resolution``) get DeiT's / FFCV's ImageNet
    RandomResizedCrop (scale 0.08-1, aspect 3/4-4/3); an evaluation file of varying sizes
    gets the centre crop of 224/256 of the shorter side (FFCV's ImageNet example).
    """
    from ffcv.fields.decoders import CenterCropRGBImageDecoder, RandomResizedCropRGBImageDecoder, SimpleRGBImageDecoder

    (h0, h1), (w0, w1) = stored_sizes(path)
    if h0 == h1 and w0 == w1 and (image_size is None or h0 == w0 == image_size):
        return SimpleRGBImageDecoder()
    if image_size is None:
        raise InputError(
            f"FFCV file {path} holds images of {h0}-{h1} x {w0}-{w1} px (written whole, "
            f"data.max_resolution): the loader needs image_size (data.image_size) to crop them"
        )
    if train:
        return RandomResizedCropRGBImageDecoder((image_size, image_size), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
    return CenterCropRGBImageDecoder((image_size, image_size), ratio=224 / 256)


def repeated_aug_order(repeats: int):
    """DeiT's repeated augmentation (its ``RASampler``) as an FFCV traversal order.

    Each epoch: a permutation of the file (seeded by ``seed + epoch``, like FFCV's RANDOM
    order, so a resumed run sees the same order), every index repeated ``repeats`` times
    in a row, cut to the usual epoch length: an epoch sees 1/``repeats`` of the images,
    each ``repeats`` times with independent augmentations. One process: the copies of an
    image sit next to each other, mostly in one batch. Several (``distributed``): the
    copies are dealt to consecutive ranks (rank r takes every W-th index from r), each
    rank taking n // W of them. DeiT also rounds the epoch down to a multiple of 256
    images; this keeps every image of the cut.
    """
    from ffcv.traversal_order.base import TraversalOrder  # imported here: importing ffcv is slow

    class RepeatedAugOrder(TraversalOrder):
        def __init__(self, repeats: int):  # bound to its loader later, by __call__
            self.repeats = repeats

        def __call__(self, loader):  # FFCV's Loader calls an order instance with itself
            TraversalOrder.__init__(self, loader)
            return self

        def sample_order(self, epoch: int) -> np.ndarray:
            n = len(self.indices)
            rng = np.random.default_rng(self.seed + epoch)
            order = np.repeat(rng.permutation(self.indices), self.repeats)  # (n * repeats,)
            if not self.distributed:
                return order[:n]
            import torch.distributed as dist

            world, rank = dist.get_world_size(), dist.get_rank()
            total = -(-len(order) // world) * world  # padded (wrapping) so every rank gets equally many
            return np.resize(order, total)[rank::world][: n // world]

    return RepeatedAugOrder(repeats)


def make_loader(
    path: str | Path,
    batch_size: int,
    train: bool,
    device: torch.device,
    num_workers: int = 1,
    seed: int = 0,
    translate: int = 0,
    hflip: bool = False,
    distributed: bool = False,
    drop_last: bool | None = None,
    jit: bool = True,
    image_size: int | None = None,
    repeated_aug: int = 1,
):
    """An FFCV ``Loader`` yielding ``(images uint8 (B, 3, H, W), labels int64 (B,))``.

    Training: seeded random order; evaluation: sequential, every sample exactly once. ``translate`` is
    exactly CIFAR's ``RandomCrop(S, padding=translate)`` (FFCV zero-pads and draws offsets in 0..2 x translate).
    ``image_size`` is needed for a file written whole (``data.max_resolution``), which it crops. ``jit``:
    numba compiles on the first batch (seconds, per process); without it FFCV draws from numpy's global
    generator, which the seed sets, so runs repeat. Process-wide (FFCV's ``Compiler``): one value per process.
    """
    from ffcv.fields.decoders import IntDecoder
    from ffcv.loader import OrderOption
    from ffcv.pipeline.compiler import Compiler
    from ffcv.transforms import RandomHorizontalFlip, RandomTranslate, Squeeze, ToDevice, ToTensor, ToTorchImage

    path = Path(path)
    if not path.is_file():
        raise MissingFileError(
            f"FFCV file {path} does not exist; run the prepare step (snakemake prepare / dvc repro prepare)"
        )
    image_pipe = [_image_decoder(path, train, image_size)]
    if train and hflip:
        image_pipe.append(RandomHorizontalFlip())
    if train and translate > 0:
        image_pipe.append(RandomTranslate(padding=translate, fill=(0, 0, 0)))
    image_pipe += [ToTensor(), ToDevice(device, non_blocking=True), ToTorchImage()]
    label_pipe = [IntDecoder(), ToTensor(), Squeeze(), ToDevice(device, non_blocking=True)]
    if not train:
        order = OrderOption.SEQUENTIAL
    else:
        order = repeated_aug_order(repeated_aug) if repeated_aug > 1 else OrderOption.RANDOM
    Compiler.set_enabled(jit)  # read when the pipeline is compiled, at the first batch
    return _loader_class()(
        str(path),
        batch_size=batch_size,
        num_workers=num_workers,
        order=order,
        distributed=distributed,
        seed=seed,
        os_cache=True,
        drop_last=train if drop_last is None else drop_last,
        pipelines={"image": image_pipe, "label": label_pipe},
    )


@functools.cache
def _loader_class():
    """FFCV's ``Loader``, except that starting an epoch leaves torch's thread count alone.

    FFCV's ``Loader.__iter__`` sets torch's (and numba's) thread count to the loader's
    ``num_workers`` at every epoch, which silently overrode a run's ``--threads`` from
    the first epoch on (found by benchmarks/bench_dataloader.py). numba's count, which
    the compiled pipeline uses, is left as FFCV sets it.
    """
    from ffcv.loader import Loader

    class ThreadKeepingLoader(Loader):
        def __iter__(self):
            threads = torch.get_num_threads()
            epoch = super().__iter__()
            torch.set_num_threads(threads)
            return epoch

    return ThreadKeepingLoader


def read_all(
    path: str | Path, limit: int | None = None, jit: bool = True, image_size: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The images (B, H, W, 3) uint8 and labels of an FFCV file in order: all, or the first ``limit``."""
    batch = min(256, limit) if limit else 256
    loader = make_loader(
        path, batch_size=batch, train=False, device=torch.device("cpu"), jit=jit, image_size=image_size
    )
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
    mean_t, std_t = _normalisation(tuple(map(float, mean)), tuple(map(float, std)), x.device, x.dtype)
    return (x - mean_t) / std_t


@functools.cache
def _normalisation(mean: tuple, std: tuple, device: torch.device, dtype: torch.dtype) -> tuple:
    """(1, C, 1, 1) mean and std tensors, built once per device: on CUDA each build is a copy from the host."""
    with torch.inference_mode(False):  # usable outside inference mode, whichever pass built them first
        return (
            torch.tensor(mean, device=device, dtype=dtype).view(1, -1, 1, 1),
            torch.tensor(std, device=device, dtype=dtype).view(1, -1, 1, 1),
        )
