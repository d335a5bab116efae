"""What DeiT's augmentations cost on this machine, in images per second (CPU), and how far
locvit's tensor backend is from timm's PIL ops.

Side by side, at 32 px (batch 256) and 224 px (batch 32), with equal cores on both sides
(1 thread each, then 2: torch threads for the tensor backend, PIL worker threads for timm's
path): RandAugment m9 (DeiT's spec) + normalisation + random erasing 0.25, as the engine
calls them, on locvit's batched tensor backend and on timm's per-image PIL path
(``TrainAugment(..., backend="pil")``), and the ratio; RandAugment alone as well.
Per-augmentation costs on one thread: RandAugment as timm's PIL ops (1 and 2 threads) next
to torchvision's ``transforms.v2.RandAugment`` per image tensor, random erasing (p 0.25,
after normalisation) and normalisation alone. FFCV side, at 32 px: one epoch of the
training loader (uncompiled, ``loader_jit`` false as in the small studies) plain, with
flip + translate 4 (CIFAR's RandomCrop), and with repeated augmentation 3 as well.
How the tensor ops' results differ from timm's PIL ops on the same draws, op by op, in
uint8 levels, on smooth images and on pixel noise at both sizes.
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

from benchmarks.common import alternate, median, write_result

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DEIT = "rand-m9-mstd0.5-inc1"


def smooth_batch(n: int, size: int) -> torch.Tensor:
    """uint8 (n, 3, size, size): random images with some structure (histograms, edges)."""
    g = torch.Generator().manual_seed(0)
    small = torch.randint(0, 256, (n, 3, 8, 8), generator=g).float()
    big = torch.nn.functional.interpolate(small, size=(size, size), mode="bilinear", align_corners=False)
    return big.round().to(torch.uint8)


def torch_side(size: int, batch: int, repeats: int) -> dict:
    """Each augmentation alone on one thread (the keys of earlier runs: timm's PIL path; the tensor backend added)."""
    from torchvision.transforms import v2

    from locvit.data.augment import TrainAugment
    from locvit.data.ffcv_io import to_model_input

    x = smooth_batch(batch, size)
    one = TrainAugment(MEAN, STD, DEIT, seed=0, backend="pil")
    two = TrainAugment(MEAN, STD, DEIT, seed=0, workers=2, backend="pil")
    tensor = TrainAugment(MEAN, STD, DEIT, seed=0)
    erase = TrainAugment(MEAN, STD, random_erasing=0.25, seed=0, backend="pil")
    erase_tensor = TrainAugment(MEAN, STD, random_erasing=0.25, seed=0)
    tv = v2.RandAugment(num_ops=2, magnitude=9)
    normalised = to_model_input(x, MEAN, STD)
    step = iter(range(10**9))
    fns = {
        "randaugment_timm_pil_1_thread": lambda: one.before_normalise(x, next(step)),
        "randaugment_timm_pil_2_threads": lambda: two.before_normalise(x, next(step)),
        "randaugment_tensor_1_thread": lambda: tensor.before_normalise(x, next(step)),
        "randaugment_torchvision_v2_per_image": lambda: torch.stack([tv(img) for img in x]),
        "random_erasing_0.25": lambda: erase.after_normalise(normalised.clone(), next(step)),
        "random_erasing_0.25_tensor": lambda: erase_tensor.after_normalise(normalised.clone(), next(step)),
        "normalise_only": lambda: to_model_input(x, MEAN, STD),
    }
    times = alternate(fns, repeats, warmup=1)
    out = {name: batch / median(t) for name, t in times.items()}
    print(f"{size} px, batch {batch}:", {k: round(v) for k, v in out.items()}, "img/s")
    return {"batch": batch, "images_per_s": out}


def side_by_side(size: int, batch: int, repeats: int) -> dict:
    """RandAugment m9 + normalisation + erasing 0.25 as the engine runs them: tensor backend vs timm's PIL path."""
    from locvit.data.augment import TrainAugment
    from locvit.data.ffcv_io import to_model_input

    x = smooth_batch(batch, size)
    step = iter(range(10**9))

    def full(aug):
        def run():
            s = next(step)
            return aug.after_normalise(to_model_input(aug.before_normalise(x, s), MEAN, STD), s)

        return run

    out, before = {}, torch.get_num_threads()
    for threads in (1, 2):
        torch.set_num_threads(threads)
        tensor = TrainAugment(MEAN, STD, DEIT, 0.25, seed=0)
        pil = TrainAugment(MEAN, STD, DEIT, 0.25, seed=0, workers=threads, backend="pil")
        fns = {
            "tensor": full(tensor),
            "timm_pil": full(pil),
            "tensor_randaugment_only": lambda: tensor.before_normalise(x, next(step)),
            "timm_pil_randaugment_only": lambda: pil.before_normalise(x, next(step)),
        }
        times = alternate(fns, repeats, warmup=1)
        ips = {name: batch / median(t) for name, t in times.items()}
        out[f"{threads}_thread{'s' if threads > 1 else ''}"] = {
            "images_per_s": ips,
            "ratio_tensor_over_pil": ips["tensor"] / ips["timm_pil"],
            "ratio_tensor_over_pil_randaugment_only": ips["tensor_randaugment_only"] / ips["timm_pil_randaugment_only"],
        }
        print(
            f"{size} px, batch {batch}, {threads} thread(s): RandAugment m9 + erasing, tensor {ips['tensor']:.0f}, "
            f"timm PIL {ips['timm_pil']:.0f} img/s, ratio {ips['tensor'] / ips['timm_pil']:.2f}"
        )
    torch.set_num_threads(before)
    return {"batch": batch, "spec": DEIT, "random_erasing": 0.25, **out}


def pil_differences(size: int, n: int = 48) -> dict:
    """Per op, |tensor - PIL| in uint8 levels on the same one-op plans (magnitudes 0-10, both signs):
    mean, share of pixels more than 2 levels apart, max; on smooth images and on pixel noise."""
    import random

    from locvit.data.augment import TrainAugment, _apply, apply_plans

    ops = {}
    for spec in (DEIT, "rand-m9-mstd0.5", "rand-m9-t3a"):
        ops.update({op.name: op for op in TrainAugment(MEAN, STD, spec)._policy(size, size).ops})
    images = {
        "smooth": smooth_batch(n, size),
        "noise": torch.randint(
            0, 256, (n, 3, size, size), generator=torch.Generator().manual_seed(1), dtype=torch.uint8
        ),
    }
    out = {}
    for name, op in sorted(ops.items()):
        plans = []
        for i in range(n):
            random.seed(i)
            plans.append([(op, op.level_fn(10 * i / (n - 1), op.hparams) if op.level_fn else ())])
        out[name] = {}
        for kind, x in images.items():
            ref = torch.stack(
                [
                    torch.from_numpy(_apply(img.permute(1, 2, 0).numpy(), plan).copy()).permute(2, 0, 1)
                    for img, plan in zip(x, plans)
                ]
            )
            d = (apply_plans(x, plans).int() - ref.int()).abs().float()
            out[name][kind] = {
                "mean": d.mean().item(),
                "share_over_2": (d > 2).float().mean().item(),
                "max": int(d.max().item()),
            }
    return out


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
            "flip_translate4_repeated3": make_loader(
                path, batch, True, cpu, seed=0, jit=False, hflip=True, translate=4, repeated_aug=3
            ),
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
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads outside the side-by-side cases (those run at 1 and 2)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()  # a shared machine: other jobs' load is part of the context
    result = {
        "spec": DEIT,
        "side_by_side": {"32px": side_by_side(32, 256, args.repeats), "224px": side_by_side(224, 32, args.repeats)},
        "torch_side": {"32px": torch_side(32, 256, args.repeats), "224px": torch_side(224, 32, args.repeats)},
        "ffcv_side": ffcv_side(4096, 256, args.repeats),
        "tensor_vs_pil_levels": {"32px": pil_differences(32), "224px": pil_differences(224)},
    }
    result["load_average_1min"] = {"before": load_before[0], "after": os.getloadavg()[0]}
    print("wrote", write_result("augment", result))


if __name__ == "__main__":
    main()
