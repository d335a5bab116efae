"""Feeding DeiT's recipe: locvit's FFCV path against a torch DataLoader with timm's transforms.

Two measurements, each at 32 and 224 px, both sides in one process alternating, pinned to
the same CPU cores (all of the machine's), each side free to use them with the threads or
processes it is built for:

(a) Feed capacity, no model: images/s delivered ready for the model (decoded, cropped,
    flipped, RandAugment rand-m9-mstd0.5-inc1, random erasing 0.25 (pixel mode),
    normalised to float). locvit: FFCV's loader (decode, crop, flip in its numba threads,
    ``num_workers``) and locvit.data.feed.TrainFeed (the tensor RandAugment, normalisation
    and erasing, prepared ahead, ``feed_workers`` batches at once, 1 torch thread each). torch: a DataLoader whose
    worker processes run timm's ``create_transform(is_training=True)`` with DeiT's settings
    (RandomResizedCrop 0.08-1 bicubic, flip, the same RandAugment, ToTensor, Normalize,
    RandomErasing) on each image. Each side at each worker count in ``--workers``; the
    goal (locvit at least 2x) is judged best against best.
(b) End to end: locvit's train_one_epoch, a fixed number of steps, fed by each side (timm's
    side pre-normalised by its transform), the training thread on ``--threads`` torch
    threads, one loader worker per side (a second one only competes with the step on 2
    cores); goal: FFCV-fed at least as fast.

Data, the same bytes on both sides: 32 px, a generated CIFAR-sized set (smooth random
images, 10 labels) stored raw, cropped by FFCV's RandomTranslate(4) (CIFAR's RandomCrop)
on locvit's side and by timm's RandomResizedCrop on the torch side, each side's own
recipe; 224 px, generated images of 256 px on the longer side (aspect 3/4-4/3) stored as
JPEG (quality 90) as the ImageNet presets store them (data.write_mode: jpg,
max_resolution: 256), random-resized-cropped to 224 by both. The torch side decodes the
very JPEG bytes of the FFCV file with PIL.

    .venv/bin/python -m benchmarks.bench_feed [--repeats 5] [--workers 1,2]

Results: benchmarks/results/feed.json.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench_dataloader import RAW, BetonImages, GeneratedSource, Steps, torch_loader
from benchmarks.common import SHAPES, alternate, median, write_result

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # DeiT's
DEIT_RA = "rand-m9-mstd0.5-inc1"


def _posterize(img, bits_to_keep, **kwargs):
    """timm's posterize, but 0 bits kept gives black (older Pillow's answer) instead of Pillow 13's ValueError.

    DeiT's magnitude noise (mstd0.5) reaches magnitude 10, where timm's PosterizeIncreasing
    keeps 0 bits; locvit.data.augment does the same.
    """
    from PIL import Image
    from timm.data.auto_augment import posterize

    return Image.new(img.mode, img.size) if bits_to_keep < 1 else posterize(img, bits_to_keep, **kwargs)


class PhotoSource:
    """Generated 'photos' for write_beton: smooth colour fields with texture, the longer side ``side`` px.

    Each image is a random 6x6 colour grid upsampled to a random aspect in 3/4-4/3, plus
    pixel noise of std 12 (so JPEG has detail to code, as in a photo); the same every time.
    """

    variable_size = True

    def __init__(self, n: int, side: int = 256, seed: int = 0):
        import cv2

        rng = np.random.default_rng(seed)
        self.labels = rng.integers(0, 10, n)
        self._images = []
        for _ in range(n):
            aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
            h, w = (side, int(round(side / aspect))) if aspect > 1 else (int(round(side * aspect)), side)
            grid = rng.integers(0, 256, (6, 6, 3)).astype(np.float32)
            img = cv2.resize(grid, (w, h), interpolation=cv2.INTER_CUBIC) + rng.normal(0, 12, (h, w, 3))
            self._images.append(np.clip(img, 0, 255).astype(np.uint8))

    def image(self, index: int, crop: bool = True) -> np.ndarray:
        return self._images[index]


class JpegBytes(torch.utils.data.Dataset):
    """The FFCV file's stored images as a timm user reads an image folder: each item decoded by PIL, transformed."""

    def __init__(self, path: str, transform):
        self.beton, self.transform = BetonImages(path), transform

    def __len__(self) -> int:
        return len(self.beton)

    def __getitem__(self, i: int):
        from PIL import Image

        file, _ = self.beton._state()
        ptr = self.beton.ptr[i]
        if self.beton.mode[i] == RAW:
            h, w = self.beton.height[i], self.beton.width[i]
            img = Image.fromarray(np.asarray(file[ptr : ptr + h * w * 3]).reshape(h, w, 3))
        else:
            img = Image.open(io.BytesIO(file[ptr : ptr + self.beton.nbytes[ptr]].tobytes())).convert("RGB")
        return self.transform(img), int(self.beton.labels[i])


def timm_train_transform(size: int):
    """timm's create_transform with DeiT's training settings at ``size`` px."""
    from timm.data import create_transform
    from timm.data.auto_augment import RandAugment, posterize

    transform = create_transform(
        input_size=size,
        is_training=True,
        auto_augment=DEIT_RA,
        re_prob=0.25,
        re_mode="pixel",
        re_count=1,
        interpolation="bicubic",
        mean=MEAN,
        std=STD,
    )
    for t in transform.transforms:  # magnitude 10 posterize: black, as locvit (Pillow 13 refuses 0 bits)
        for op in t.ops if isinstance(t, RandAugment) else ():
            if op.aug_fn is posterize:
                op.aug_fn = _posterize
    return transform


def write_data(tmp: Path, images32: int, images224: int) -> dict:
    from locvit.data.ffcv_io import write_beton

    sets = {}
    start = time.perf_counter()
    write_beton(tmp / "32.beton", GeneratedSource(images32), np.arange(images32), 32)
    sets["32px"] = dict(
        path=str(tmp / "32.beton"), size=32, images=images32, stored="raw 32x32", write_s=time.perf_counter() - start
    )
    start = time.perf_counter()
    write_beton(
        tmp / "224.beton",
        PhotoSource(images224),
        np.arange(images224),
        256,
        crop=False,
        write_mode="jpg",
        jpeg_quality=90,
    )
    sets["224px"] = dict(
        path=str(tmp / "224.beton"),
        size=224,
        images=images224,
        stored="JPEG q90, longer side 256, aspect 3/4-4/3",
        write_s=time.perf_counter() - start,
        mb=os.path.getsize(tmp / "224.beton") / 2**20,
    )
    return sets


def ffcv_loader(d: dict, batch: int, workers: int):
    from locvit.data.ffcv_io import make_loader

    crop = dict(translate=4) if d["size"] == 32 else dict(image_size=d["size"])
    return make_loader(
        d["path"], batch, True, torch.device("cpu"), num_workers=workers, seed=0, hflip=True, jit=True, **crop
    )


def child(spec: dict) -> dict:
    """One data set: (a) feed capacity at each worker count, then (b) end to end; one process, alternating."""
    import timm

    from locvit.data.augment import TrainAugment
    from locvit.data.feed import TrainFeed
    from locvit.train.engine import Compute, StepRecipe, train_one_epoch

    d, repeats, size = spec["dataset"], spec["repeats"], spec["dataset"]["size"]
    batch, steps = spec["batch"], spec["steps"]
    samples = steps * batch
    # every DataLoader forks its workers here, before FFCV starts numba's threads
    timm_loaders = {
        w: torch_loader(JpegBytes(d["path"], timm_train_transform(size)), batch, w, samples) for w in spec["workers"]
    }
    for loader in timm_loaders.values():
        next(iter(loader))
    ffcv = {w: ffcv_loader(d, batch, w) for w in spec["workers"]}
    first = {}
    for w, loader in ffcv.items():  # numba's compile, timed apart
        start = time.perf_counter()
        next(iter(Steps(loader, 1)))
        first[w] = time.perf_counter() - start

    def feed(w: int, feed_workers: int, ahead: int = 2):
        augment = TrainAugment(MEAN, STD, DEIT_RA, 0.25, seed=0)

        def run():
            torch.set_num_threads(1)  # FFCV's Loader sets torch's thread count to num_workers at each epoch
            for _ in TrainFeed(Steps(ffcv[w], steps), augment, Compute(), MEAN, STD, 0, ahead, feed_workers):
                pass

        return run

    fns = {
        f"timm_dataloader_w{w}": (lambda loader=timm_loaders[w]: [None for _ in Steps(loader, steps)])
        for w in spec["workers"]
    }
    for w in spec["workers"]:
        for f in (1, 2):
            fns[f"locvit_ffcv_w{w}_f{f}"] = feed(w, f)
        # FFCV's part alone (decode, crop, flip): all that is left on the CPU when the augmentation runs on a GPU
        fns[f"ffcv_loader_only_w{w}"] = lambda loader=ffcv[w]: [None for _ in Steps(loader, steps)]
    times = alternate(fns, repeats, warmup=1)
    feed_img_s = {k: samples / median(v) for k, v in times.items()}
    best_locvit = max((k for k in feed_img_s if k.startswith("locvit_")), key=feed_img_s.get)
    best_timm = max((k for k in feed_img_s if k.startswith("timm")), key=feed_img_s.get)
    best_loader = max((k for k in feed_img_s if k.startswith("ffcv_loader_only")), key=feed_img_s.get)
    capacity = {
        "images_per_s": feed_img_s,
        "best_locvit": best_locvit,
        "best_timm": best_timm,
        "ratio_ffcv_loader_only_over_best_timm": feed_img_s[best_loader] / feed_img_s[best_timm],
        "ratio_best_over_best": feed_img_s[best_locvit] / feed_img_s[best_timm],
        "ratio_per_round": sorted(t / f for f, t in zip(times[best_locvit], times[best_timm])),
        "ratio_at_equal_workers": {
            w: feed_img_s[f"locvit_ffcv_w{w}_f{w}"] / feed_img_s[f"timm_dataloader_w{w}"] for w in spec["workers"]
        },
        "ffcv_first_batch_s": first,
    }
    print(
        f"{size} px feed: "
        + ", ".join(f"{k} {v:,.0f}" for k, v in feed_img_s.items())
        + f" img/s; best/best {capacity['ratio_best_over_best']:.2f}",
        file=sys.stderr,
        flush=True,
    )

    # (b) end to end: one loader worker each, the training thread on --threads torch threads
    e2e_steps, e2e_batch = spec["e2e_steps"], spec["e2e_batch"]
    torch.manual_seed(0)
    shape = SHAPES["demo_32px_p4_48d_4L"] if size == 32 else SHAPES["deit_tiny_224_6L"]
    model = timm.create_model("deit_tiny_patch16_224", num_classes=10, **shape)
    e2e_timm = torch_loader(JpegBytes(d["path"], timm_train_transform(size)), e2e_batch, 1, e2e_steps * e2e_batch)
    next(iter(e2e_timm))
    e2e_ffcv = ffcv_loader(d, e2e_batch, 1)
    next(iter(Steps(e2e_ffcv, 1)))
    nets = {side: copy.deepcopy(model) for side in ("ffcv", "timm", "compute")}
    opts = {side: torch.optim.AdamW(net.parameters(), lr=1e-3) for side, net in nets.items()}
    augment = TrainAugment(MEAN, STD, DEIT_RA, 0.25, seed=0)
    fixed = (torch.randint(0, 256, (e2e_batch, 3, size, size), dtype=torch.uint8), torch.randint(0, 10, (e2e_batch,)))

    class Prenormalised(Compute):  # timm's transform already normalised the batch
        def inputs(self, images, mean, std):
            return images

    def train(side, batches, augment=None, feed_ahead=0, compute=Compute()):
        def run():
            torch.set_num_threads(spec["threads"])
            feed = TrainFeed(batches, augment, compute, MEAN, STD, first_step=0, ahead=feed_ahead)
            train_one_epoch(
                nets[side],
                feed,
                opts[side],
                lambda step: 1e-3,
                recipe=StepRecipe(label_smoothing=0.1, clip_grad=1.0),
                compute=compute,
            )

        return run

    fns = {
        "ffcv_fed": train("ffcv", Steps(e2e_ffcv, e2e_steps), augment=augment, feed_ahead=2),
        "ffcv_fed_inline": train("ffcv", Steps(e2e_ffcv, e2e_steps), augment=augment, feed_ahead=0),
        "timm_fed": train("timm", Steps(e2e_timm, e2e_steps), compute=Prenormalised()),
        "compute_only": train("compute", [fixed] * e2e_steps),
    }
    times = alternate(fns, repeats, warmup=1)
    e2e_img_s = {k: e2e_steps * e2e_batch / median(v) for k, v in times.items()}
    paired = sorted(t / f for f, t in zip(times["ffcv_fed"], times["timm_fed"]))  # each round's FFCV-fed / timm-fed
    e2e = {
        "images_per_s": e2e_img_s,
        "ratio_ffcv_fed_over_timm_fed": e2e_img_s["ffcv_fed"] / e2e_img_s["timm_fed"],
        "ratio_per_round": paired,
        "ratio_inline_over_timm_fed": e2e_img_s["ffcv_fed_inline"] / e2e_img_s["timm_fed"],
        "model": "deit_tiny_patch16_224 " + json.dumps(shape),
        "batch": e2e_batch,
        "steps": e2e_steps,
        "torch_threads": spec["threads"],
    }
    print(
        f"{size} px end to end: "
        + ", ".join(f"{k} {v:,.1f}" for k, v in e2e_img_s.items())
        + f" img/s; FFCV-fed / timm-fed {e2e['ratio_ffcv_fed_over_timm_fed']:.2f}",
        file=sys.stderr,
        flush=True,
    )
    return {"feed_capacity": capacity, "end_to_end": e2e}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", default="1,2", help="loader workers (threads / processes) of each side")
    parser.add_argument("--images32", type=int, default=10_000)
    parser.add_argument("--images224", type=int, default=1_000)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the training thread (end to end)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    import subprocess

    began, load_before = time.perf_counter(), os.getloadavg()
    workers = [int(w) for w in args.workers.split(",")]
    cores = sorted(os.sched_getaffinity(0))
    shapes = {
        "32px": dict(batch=256, steps=8, e2e_batch=128, e2e_steps=6),
        "224px": dict(batch=32, steps=6, e2e_batch=32, e2e_steps=4),
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        sets = write_data(Path(tmp), args.images32, args.images224)
        for name, d in sets.items():
            spec = dict(dataset=d, repeats=args.repeats, workers=workers, threads=args.threads, **shapes[name])
            proc = subprocess.run(
                [
                    "taskset",
                    "-c",
                    ",".join(map(str, cores)),
                    sys.executable,
                    "-m",
                    "benchmarks.bench_feed",
                    "--child",
                    json.dumps(spec),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            if proc.returncode != 0:
                raise SystemExit(f"{name} failed (exit {proc.returncode}); its stderr is above")
            results[name] = {**json.loads(proc.stdout.strip().splitlines()[-1]), "data": d, **shapes[name]}
    goals = {
        "feed_capacity_2x": {k: r["feed_capacity"]["ratio_best_over_best"] >= 2 for k, r in results.items()},
        "end_to_end_1x": {k: r["end_to_end"]["ratio_ffcv_fed_over_timm_fed"] >= 1 for k, r in results.items()},
    }
    path = write_result(
        "feed",
        {
            "command": " ".join([".venv/bin/python -m benchmarks.bench_feed", *sys.argv[1:]]),
            "settings": {
                "repeats": args.repeats,
                "workers": workers,
                "cores": cores,
                "e2e_torch_threads": args.threads,
                "randaugment": DEIT_RA,
                "random_erasing": 0.25,
            },
            "results": results,
            "goals": goals,
            "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]},
            "elapsed_s": time.perf_counter() - began,
        },
    )
    print(f"wrote {path}: goals {json.dumps(goals)}")


if __name__ == "__main__":
    main()
