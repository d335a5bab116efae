"""FFCV's loader against torch's DataLoader on CPU, the loaders alone (DeiT's whole recipe: bench_feed.py).

Two data sets: the demo's digits (params.yaml's data section prepared into a temporary
folder: 1,167 training images, batch 32, translate 2, no flip) and a generated
CIFAR-sized set (50,000 smooth 32x32 RGB images, 10 labels, written with locvit's
write_beton; batch 256, CIFAR's translate 4 + flip).

Loaders alone (goal: FFCV at least 2x torch). FFCV: locvit's training loader
(make_loader: random order, decode, flip, translate). torch: a DataLoader over a
Dataset that reads the very same .beton (its memory map; FFCV's Reader for the table),
decodes each stored image in Python and applies the same flip and translation per
sample with numpy. Same batch, same drop_last, same worker count: FFCV's num_workers
are numba threads inside its one loading thread (without the JIT its pipeline is a
Python loop, so no more than one thread) and, as FFCV sets it, torch's thread count;
DataLoader's are processes. FFCV's JIT (loader_jit) is process-wide, so jit on and jit
off run in separate processes, each alternating its FFCV and torch loaders; the first
epoch (numba's compile; the torch workers' start) is timed apart. Also without any
augmentation, 1 worker. Every torch loader forks its workers before FFCV runs.

    .venv/bin/python -m benchmarks.bench_dataloader [--repeats 5] [--images 50000]

About 5 minutes on the 2-core machine. Results: benchmarks/results/dataloader.json.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import alternate, median, write_result

REPO = Path(__file__).resolve().parents[1]
RAW = 1  # FFCV's mode of an image stored raw (ffcv.fields.rgb_image.IMAGE_MODES['raw']; 0 is JPEG)


# --- the data -----------------------------------------------------------------------------


class GeneratedSource:
    """A CIFAR-sized source for write_beton: n smooth 32x32 RGB images, 10 labels, the same every time.

    Each image is a random 8x8 colour grid upsampled bilinearly to 32x32 (blobs and
    gradients rather than noise); labels are drawn independently.
    """

    variable_size = False

    def __init__(self, n: int, size: int = 32, grid: int = 8, seed: int = 0):
        rng = np.random.default_rng(seed)
        pos = np.clip((np.arange(size) + 0.5) * grid / size - 0.5, 0, grid - 1)  # (size,) in grid units
        lo = np.floor(pos).astype(int)
        hi, frac = np.minimum(lo + 1, grid - 1), (pos - lo).astype(np.float32)
        up = np.zeros((size, grid), np.float32)  # bilinear weights, (size, grid)
        np.add.at(up, (np.arange(size), lo), 1 - frac)
        np.add.at(up, (np.arange(size), hi), frac)
        self._images = np.empty((n, size, size, 3), np.uint8)
        for start in range(0, n, 5000):
            small = rng.integers(0, 256, (min(5000, n - start), grid, grid, 3)).astype(np.float32)
            rows = np.einsum("yi,nijc->nyjc", up, small)  # (n, size, grid, 3)
            self._images[start : start + len(small)] = np.einsum("nyjc,xj->nyxc", rows, up).round().astype(np.uint8)
        self.labels = rng.integers(0, 10, n)

    def image(self, index: int, crop: bool = True) -> np.ndarray:
        return self._images[index]


class BetonImages(torch.utils.data.Dataset):
    """The samples of an FFCV file decoded in Python, one per item: (uint8 (3, H, W), label).

    With ``hflip`` / ``translate``: FFCV's RandomHorizontalFlip (p 0.5) and RandomTranslate
    (zero padding, both offsets uniform in 0..2 x translate) on each sample, drawn from a
    generator per process (DataLoader's seed of the worker).
    """

    def __init__(self, path: str | Path, hflip: bool = False, translate: int = 0):
        from ffcv.reader import Reader

        reader = Reader(str(path))
        columns = reader.metadata.dtype.names  # one per field, in the file's order
        image = reader.metadata[columns[reader.field_names.index("image")]]
        self.ptr, self.height, self.width = (
            image[k].astype(np.int64).tolist() for k in ("data_ptr", "height", "width")
        )
        self.mode = image["mode"].tolist()
        self.labels = reader.metadata[columns[reader.field_names.index("label")]].tolist()
        self.nbytes = dict(zip(reader.alloc_table["ptr"].tolist(), reader.alloc_table["size"].tolist()))
        self.path, self.hflip, self.translate = str(path), hflip, translate
        self._file, self._rng, self._pid = None, None, None

    def __len__(self) -> int:
        return len(self.labels)

    def _state(self) -> tuple[np.ndarray, np.random.Generator]:
        if self._pid != os.getpid():  # first item in this process (a forked worker)
            self._file = np.memmap(self.path, np.uint8, mode="r").view(np.ndarray)
            self._rng, self._pid = np.random.default_rng(torch.initial_seed() % 2**63), os.getpid()
        return self._file, self._rng

    def decode(self, i: int) -> np.ndarray:
        """The stored image i as (H, W, 3) uint8, as FFCV's SimpleRGBImageDecoder gives it."""
        file, _ = self._state()
        h, w, ptr = self.height[i], self.width[i], self.ptr[i]
        if self.mode[i] == RAW:
            return file[ptr : ptr + h * w * 3].reshape(h, w, 3)  # a view of the map
        import cv2

        return cv2.cvtColor(cv2.imdecode(file[ptr : ptr + self.nbytes[ptr]], cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        img = self.decode(i)  # (H, W, 3)
        _, rng = self._state()
        if self.hflip and rng.random() < 0.5:
            img = img[:, ::-1]
        if self.translate:
            h, w, _ = img.shape
            dy, dx = (int(d) for d in rng.integers(-self.translate, self.translate + 1, size=2))
            out = np.zeros_like(img)  # out[y, x] = img[y + dy, x + dx], zero outside
            out[max(0, -dy) : h - max(0, dy), max(0, -dx) : w - max(0, dx)] = img[
                max(0, dy) : h - max(0, -dy), max(0, dx) : w - max(0, -dx)
            ]
        else:
            out = img.copy()  # out of the read-only map
        return torch.from_numpy(out).permute(2, 0, 1), self.labels[i]  # (3, H, W)


def torch_loader(dataset, batch: int, workers: int, samples: int | None = None) -> torch.utils.data.DataLoader:
    """A shuffling DataLoader with persistent workers (timm's default); an epoch of ``samples`` images if given.

    The end-to-end runs time epochs of exactly their step count, so no worker is left
    preparing batches nobody takes while the next measurement runs.
    """
    sampler = torch.utils.data.RandomSampler(dataset, num_samples=samples, generator=torch.Generator().manual_seed(0))
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch, sampler=sampler, drop_last=True, num_workers=workers, persistent_workers=True
    )


def epochs(loader, passes: int):
    def run():
        for _ in range(passes):
            for _batch in loader:
                pass

    return run


class Steps:
    """The first ``n`` batches of a fresh pass over ``loader`` (into the next epoch if need be).

    An FFCV epoch left early is closed, so its loading thread stops.
    """

    def __init__(self, loader, n: int):
        self.loader, self.n = loader, n

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        done = 0
        while done < self.n:
            it = iter(self.loader)
            try:
                for batch in it:
                    yield batch
                    done += 1
                    if done == self.n:
                        break
            finally:
                if hasattr(it, "close"):
                    it.close()


# --- children: one process per FFCV JIT setting --------------------------------------------


def loaders_child(spec: dict) -> dict:
    """Loaders alone: images/s of FFCV and torch, alternating, with this process's JIT setting."""
    from locvit.data.ffcv_io import make_loader

    jit, workers, repeats = spec["jit"], spec["workers"], spec["repeats"]
    loaders: dict[str, dict] = {name: {} for name in spec["datasets"]}
    first: dict[str, dict] = {name: {} for name in spec["datasets"]}
    # torch's workers first, forked before any FFCV thread (numba's thread pool) exists.
    for name, d in spec["datasets"].items():
        aug = dict(hflip=d["hflip"], translate=d["translate"])
        for w in workers:
            loaders[name][f"torch_w{w}"] = torch_loader(BetonImages(d["path"], **aug), d["batch"], w)
        loaders[name]["torch_plain_w1"] = torch_loader(BetonImages(d["path"]), d["batch"], 1)
        for key, loader in loaders[name].items():
            start = time.perf_counter()
            epochs(loader, 1)()
            first[name][key] = time.perf_counter() - start
    out = {}
    for name, d in spec["datasets"].items():
        cpu = torch.device("cpu")
        for w in workers:
            loaders[name][f"ffcv_w{w}"] = make_loader(
                d["path"],
                d["batch"],
                True,
                cpu,
                num_workers=w,
                seed=0,
                translate=d["translate"],
                hflip=d["hflip"],
                jit=jit,
            )
        loaders[name]["ffcv_plain_w1"] = make_loader(d["path"], d["batch"], True, cpu, num_workers=1, seed=0, jit=jit)
        for key, loader in loaders[name].items():
            if key.startswith("ffcv"):
                start = time.perf_counter()
                epochs(loader, 1)()  # numba compiles the pipeline here when the JIT is on
                first[name][key] = time.perf_counter() - start
        # No further warm-up: every loader has had its first epoch above.
        fns = {key: epochs(loader, d["passes"]) for key, loader in loaders[name].items()}
        epoch_s = {key: median(t) / d["passes"] for key, t in alternate(fns, repeats, warmup=0).items()}
        images = len(loaders[name]["ffcv_plain_w1"]) * d["batch"]  # per epoch: full batches only, on both sides
        cases = {f"w{w}": (f"ffcv_w{w}", f"torch_w{w}") for w in workers}
        cases["plain_w1"] = ("ffcv_plain_w1", "torch_plain_w1")
        out[name] = {
            "images_per_epoch": images,
            "cases": {
                case: {
                    "ffcv_images_per_s": images / epoch_s[f],
                    "torch_images_per_s": images / epoch_s[t],
                    "ratio_ffcv_over_torch": epoch_s[t] / epoch_s[f],
                    "ffcv_first_epoch_s": first[name][f],
                    "ffcv_later_epoch_s": epoch_s[f],
                    "torch_first_epoch_s": first[name][t],
                    "torch_later_epoch_s": epoch_s[t],
                }
                for case, (f, t) in cases.items()
            },
        }
        for case, r in out[name]["cases"].items():
            print(
                f"loaders, {name}, jit {jit}, {case}: FFCV {r['ffcv_images_per_s']:,.0f} img/s, torch "
                f"{r['torch_images_per_s']:,.0f}, ratio {r['ratio_ffcv_over_torch']:.2f}; FFCV first epoch "
                f"{r['ffcv_first_epoch_s']:.2f} s",
                file=sys.stderr,
                flush=True,
            )
        loaders[name].clear()  # the next data set's timings run without these workers
        gc.collect()
    return out


def run_child(spec: dict) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_dataloader", "--child", json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(f"child {spec.get('part')} failed (exit {proc.returncode}); its stderr is above")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def make_datasets(tmp: Path, images: int, batch: int, passes: int, data: dict, recipe: dict) -> dict:
    """The demo's digits (prepared) and the generated set (written) in ``tmp``; both sides must decode them alike."""
    from locvit.data.ffcv_io import read_all, write_beton
    from locvit.data.prepare import prepare

    paths = {s: tmp / f"{s}.beton" for s in ("train", "val", "test")}
    prepare(data, paths, tmp / "manifest.json")
    generated = tmp / "generated.beton"
    start = time.perf_counter()
    write_beton(generated, GeneratedSource(images), np.arange(images), 32)
    datasets = {
        "digits": dict(
            name="digits",
            path=str(paths["train"]),
            batch=recipe["batch_size"],
            hflip=recipe["hflip"],
            translate=recipe["translate"],
            passes=passes,
        ),
        "generated": dict(
            name="generated",
            path=str(generated),
            batch=batch,
            hflip=True,
            translate=4,
            passes=1,
            write_s=time.perf_counter() - start,
        ),
    }
    for d in datasets.values():  # "same files": the torch Dataset decodes exactly what FFCV's loader reads
        ffcv_images, ffcv_labels = read_all(d["path"], limit=512, jit=False)
        ours = BetonImages(d["path"])
        assert np.array_equal(ffcv_images, np.stack([ours.decode(i) for i in range(len(ffcv_images))]))
        assert np.array_equal(ffcv_labels, np.asarray(ours.labels[: len(ffcv_labels)]))
        d["images"] = len(ours)
    return datasets


def goals(loaders: dict) -> dict:
    """FFCV's loader at least 2x torch's (with augmentation)."""
    ratios = {
        f"{name}/{jit}/{case}": r["ratio_ffcv_over_torch"]
        for jit, per in loaders.items()
        for name, d in per.items()
        for case, r in d["cases"].items()
        if case != "plain_w1"
    }
    best = {}  # each loader at its fastest worker count, both measured in the same process
    for jit, per in loaders.items():
        for name, d in per.items():
            runs = {case: r for case, r in d["cases"].items() if case != "plain_w1"}
            f, t = (max(runs, key=lambda case: runs[case][f"{side}_images_per_s"]) for side in ("ffcv", "torch"))
            f_s, t_s = runs[f]["ffcv_images_per_s"], runs[t]["torch_images_per_s"]
            best[f"{name}/{jit}"] = {
                "ffcv": f,
                "ffcv_images_per_s": f_s,
                "torch": t,
                "torch_images_per_s": t_s,
                "ratio": f_s / t_s,
            }
    return {
        "ffcv_loader_2x_torch": {
            "ratios": ratios,
            "met_in": [k for k, v in ratios.items() if v >= 2],
            "not_met_in": [k for k, v in ratios.items() if v < 2],
            "best_vs_best": best,
            "met_best_vs_best_with_jit": all(b["ratio"] >= 2 for k, b in best.items() if k.endswith("/jit")),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--images", type=int, default=50_000, help="images of the generated CIFAR-sized set")
    parser.add_argument("--batch", type=int, default=256, help="loader batch on the generated set (digits: the demo's)")
    parser.add_argument("--workers", default="1,2", help="worker counts of the loaders alone, comma-separated")
    parser.add_argument("--digits-passes", type=int, default=3, help="digits epochs per loader measurement")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        spec = json.loads(args.child)
        print(json.dumps(loaders_child(spec)))
        return

    from locvit.config import load_params

    began, load_before = time.perf_counter(), os.getloadavg()  # a shared machine: others' load is context
    params = load_params(REPO / "params.yaml", check_models=False)
    recipe = params["train"]
    workers = [int(w) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        datasets = make_datasets(Path(tmp), args.images, args.batch, args.digits_passes, params["data"], recipe)
        loaders = {
            name: run_child(dict(part="loaders", jit=jit, datasets=datasets, workers=workers, repeats=args.repeats))
            for name, jit in (("jit", True), ("no_jit", False))
        }
    result = {
        "command": " ".join([".venv/bin/python -m benchmarks.bench_dataloader", *sys.argv[1:]]),
        "settings": {"repeats": args.repeats, "workers": workers},
        "datasets": {name: {k: v for k, v in d.items() if k != "path"} for name, d in datasets.items()},
        "loaders": loaders,
        "goals": goals(loaders),
        "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]},
        "elapsed_s": time.perf_counter() - began,
    }
    loader_goal = result["goals"]["ffcv_loader_2x_torch"]
    print(
        "FFCV loader >= 2x torch's, met in:",
        {k: round(loader_goal["ratios"][k], 2) for k in loader_goal["met_in"]},
        "not met in:",
        {k: round(loader_goal["ratios"][k], 2) for k in loader_goal["not_met_in"]},
    )
    print(
        "each at its best worker count:",
        {k: f"FFCV {b['ffcv']} / torch {b['torch']}: {b['ratio']:.2f}" for k, b in loader_goal["best_vs_best"].items()},
    )
    print("wrote", write_result("dataloader", result), f"in {result['elapsed_s']:.0f} s")


if __name__ == "__main__":
    main()
