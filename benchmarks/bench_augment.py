"""What DeiT's augmentations cost on this machine, in images per second (CPU).

Torch side (locvit.data.augment), on a fixed uint8 batch at 32 and 224 px:
RandAugment as locvit runs it (timm's ops on PIL images, 1 and 2 threads) next to
torchvision's ``transforms.v2.RandAugment`` per image tensor (the alternative),
random erasing (p 0.25, after normalisation) and normalisation alone.
FFCV side, at 32 px: one epoch of the training loader (uncompiled, ``loader_jit``
false as in the small studies) plain, with flip + translate 4 (CIFAR's RandomCrop),
and with repeated augmentation 3 as well.
Timings alternate between the cases (benchmarks/common.py); medians of the repeats.
Results: benchmarks/results/augment.json.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import torch

from common import alternate, median, write_result

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEIT = "rand-m9-mstd0.5-inc1"


def smooth_batch(n: int, size: int) -> torch.Tensor:
    """uint8 (n, 3, size, size): random images with some structure (histograms, edges)."""
    g = torch.Generator().manual_seed(0)
    small = torch.randint(0, 256, (n, 3, 8, 8), generator=g).float()
    big = torch.nn.functional.interpolate(small, size=(size, size), mode="bilinear", align_corners=False)
    return big.round().to(torch.uint8)


def torch_side(size: int, batch: int, repeats: int) -> dict:
    from torchvision.transforms import v2

    from locvit.data.augment import TrainAugment
    from locvit.data.ffcv_io import to_model_input

    x = smooth_batch(batch, size)
    one, two = TrainAugment(MEAN, STD, DEIT, seed=0), TrainAugment(MEAN, STD, DEIT, seed=0, workers=2)
    erase = TrainAugment(MEAN, STD, random_erasing=0.25, seed=0)
    tv = v2.RandAugment(num_ops=2, magnitude=9)
    normalised = to_model_input(x, MEAN, STD)
    step = iter(range(10 ** 9))
    fns = {
        "randaugment_timm_pil_1_thread": lambda: one.before_normalise(x, next(step)),
        "randaugment_timm_pil_2_threads": lambda: two.before_normalise(x, next(step)),
        "randaugment_torchvision_v2_per_image": lambda: torch.stack([tv(img) for img in x]),
        "random_erasing_0.25": lambda: erase.after_normalise(normalised.clone(), next(step)),
        "normalise_only": lambda: to_model_input(x, MEAN, STD),
    }
    times = alternate(fns, repeats, warmup=1)
    out = {name: batch / median(t) for name, t in times.items()}
    print(f"{size} px, batch {batch}:", {k: round(v) for k, v in out.items()}, "img/s")
    return {"batch": batch, "images_per_s": out}


class _Random32:
    """An in-memory source of n random 32x32 images for the writer."""

    variable_size = False

    def __init__(self, n: int):
        rng = np.random.default_rng(0)
        self._images = rng.integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)
        self.labels = rng.integers(0, 10, size=n)

    def image(self, index: int, crop: bool = True) -> np.ndarray:
        return self._images[index]


def ffcv_side(n: int, batch: int, repeats: int) -> dict:
    from locvit.data.ffcv_io import make_loader, write_beton

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "train.beton"
        write_beton(path, _Random32(n), np.arange(n), 32)
        cpu = torch.device("cpu")
        loaders = {
            "plain": make_loader(path, batch, True, cpu, seed=0, jit=False),
            "flip_translate4": make_loader(path, batch, True, cpu, seed=0, jit=False, hflip=True, translate=4),
            "flip_translate4_repeated3": make_loader(path, batch, True, cpu, seed=0, jit=False, hflip=True,
                                                    translate=4, repeated_aug=3),
        }
        counts = {name: len(loader) * batch for name, loader in loaders.items()}

        def epoch(loader):
            return lambda: [None for _ in loader]

        times = alternate({name: epoch(loader) for name, loader in loaders.items()}, repeats, warmup=1)
    out = {name: counts[name] / median(t) for name, t in times.items()}
    print(f"FFCV loader, 32 px, {n} images, batch {batch}:", {k: round(v) for k, v in out.items()}, "img/s")
    return {"images": n, "batch": batch, "images_per_s": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads (the augmentations run per image)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()  # a shared machine: other jobs' load is part of the context
    result = {
        "spec": DEIT,
        "torch_side": {"32px": torch_side(32, 256, args.repeats), "224px": torch_side(224, 32, args.repeats)},
        "ffcv_side": ffcv_side(4096, 256, args.repeats),
    }
    result["load_average_1min"] = {"before": load_before[0], "after": os.getloadavg()[0]}
    print("wrote", write_result("augment", result))


if __name__ == "__main__":
    main()
