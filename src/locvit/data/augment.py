"""Per-sample training augmentations FFCV's loader lacks: DeiT's RandAugment, random erasing, MixUp/CutMix.

FFCV does the crop, translation (CIFAR's RandomCrop), flip and repeated augmentation's order; here
RandAugment (timm's ``rand_augment_transform``, on the uint8 batch), random erasing (normalised batch) and
``BatchMixup`` (timm's Mixup, batch mode, in the engine). Two backends apply the same draws: ``tensor``
(default; batched, geometric ops through one ``grid_sample``) and ``pil`` (timm's, kept to measure against);
they agree to the bit but for interpolation kernels (docs/benchmarks.md#augmentation). Every draw comes from a
numpy Generator seeded by (seed, rank, step, augmentation), so runs repeat and resume exactly whatever the
threads; timm's Python ``random`` is seeded for each draw and restored. Erasing noise differs CPU vs CUDA.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import random
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from locvit.errors import InputError


@contextlib.contextmanager
def _seeded_python_random(seed: int) -> Iterator[None]:
    """Python's global ``random`` seeded for a block, then put back as it was."""
    state = random.getstate()
    random.seed(seed)
    try:
        yield
    finally:
        random.setstate(state)


def _apply(image: np.ndarray, plan: list) -> np.ndarray:
    """One image (H, W, 3) uint8 through its drawn ops (timm's PIL functions; no randomness left)."""
    from PIL import Image
    from timm.data.auto_augment import posterize

    img = Image.fromarray(np.ascontiguousarray(image))
    for op, args in plan:
        if op.aug_fn is posterize and args[0] < 1:
            # Magnitude 10 keeps 0 bits: Pillow 13 refuses that; older Pillow (and TF's RandAugment) gave black.
            img = Image.new("RGB", img.size)
        else:
            img = op.aug_fn(img, *args, **op.kwargs)
    return np.asarray(img)


# --- RandAugment's ops as batched tensor ops (the "tensor" backend) ---------------------------
# Every kernel takes a uint8 sub-batch (n, 3, H, W) and its images' arguments, one per image,
# and returns uint8 (n, 3, H, W) on the same device; each rounds to uint8 as the PIL op does,
# so a chain of ops sees what the PIL chain sees.


def _aa():
    from timm.data import auto_augment

    return auto_augment


@functools.cache
def _erasing_ranges() -> tuple[float, float, tuple[float, float]]:
    """timm's RandomErasing defaults, as DeiT uses them: the box's area as fractions of the image (min, max)
    and the log of its aspect ratio (min, max)."""
    from timm.data.random_erasing import RandomErasing

    timm_erasing = RandomErasing(device="cpu")
    return timm_erasing.min_area, timm_erasing.max_area, timm_erasing.log_aspect_ratio


def _on(device: torch.device, values, dtype: torch.dtype) -> torch.Tensor:
    """Host values (the draws) as a tensor on ``device``; to a GPU through pinned memory without
    blocking, so the host never waits for the GPU in the middle of a batch's ops."""
    t = torch.as_tensor(np.asarray(values), dtype=dtype)
    if device.type != "cuda":
        return t
    return t.pin_memory().to(device, non_blocking=True)


def _affine_matrix(fn, arg: float, w: int, h: int) -> tuple[float, ...] | None:
    """PIL's inverse affine matrix (a, b, c, d, e, f) of a geometric op (output pixel centre -> source
    point, in pixels), as timm's op passes it to ``Image.transform``; None where PIL copies the image."""
    aa = _aa()
    if fn is aa.rotate:  # Image.rotate: about the centre (w/2, h/2); angle 0 is a copy
        angle = arg % 360.0
        if angle == 0:
            return None
        t = -math.radians(angle)
        a, b, d, e = round(math.cos(t), 15), round(math.sin(t), 15), round(-math.sin(t), 15), round(math.cos(t), 15)
        cx, cy = w / 2, h / 2
        return a, b, a * -cx + b * -cy + cx, d, e, d * -cx + e * -cy + cy
    matrix = {
        aa.shear_x: (1, arg, 0, 0, 1, 0),
        aa.shear_y: (1, 0, 0, arg, 1, 0),
        aa.translate_x_rel: (1, 0, arg * w, 0, 1, 0),
        aa.translate_y_rel: (1, 0, 0, 0, 1, arg * h),
        aa.translate_x_abs: (1, 0, arg, 0, 1, 0),
        aa.translate_y_abs: (1, 0, 0, 0, 1, arg),
    }[fn]
    return None if matrix == (1, 0, 0, 0, 1, 0) else matrix  # an identity transform samples pixel centres: a copy


def _warp(x: torch.Tensor, matrices: np.ndarray, fill: Sequence[int], mode: str) -> torch.Tensor:
    """Each image through its own PIL affine matrix (n, 6), sampled by one ``grid_sample``.

    PIL maps each output pixel centre (x + 0.5, y + 0.5) to a source point in float64, gives
    ``fill`` where that point falls outside [0, W) x [0, H), samples inside with edge-clamped
    neighbours, and truncates to uint8. The source points are computed here the same way, in
    float64, so the fill decision is PIL's to the bit; the sampling kernel is grid_sample's.
    """
    n, _, h, w = x.shape
    m = _on(x.device, matrices, torch.float64).T.reshape(6, n, 1, 1)
    px = torch.arange(w, dtype=torch.float64, device=x.device).view(1, 1, w) + 0.5
    py = torch.arange(h, dtype=torch.float64, device=x.device).view(1, h, 1) + 0.5
    grid = torch.empty(n, h, w, 2, device=x.device)  # (n, H, W, 2): grid_sample's [-1, 1], align_corners=False
    inside = torch.ones(n, h, w, dtype=torch.bool, device=x.device)
    for k, size in ((0, w), (1, h)):
        source = (m[3 * k] * px + m[3 * k + 1] * py).add_(m[3 * k + 2])  # (n, H, W): PIL's sums, in its order
        inside &= (source >= 0) & (source < size)
        grid[..., k] = source.mul_(2 / size).sub_(1)
    inside = inside.unsqueeze(1)  # (n, 1, H, W)
    out = torch.nn.functional.grid_sample(x.float(), grid, mode=mode, padding_mode="border", align_corners=False)
    fill_t = _on(x.device, fill, torch.float32).view(1, 3, 1, 1)
    # (v - fill) * inside + fill: exact on whole numbers, and cheaper than torch.where with broadcasting on CPU
    return out.clamp_(0, 255).floor_().sub_(fill_t).mul_(inside).add_(fill_t).to(torch.uint8)


def _per_image(values, x: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """One value per image as an (n, 1, 1, 1) tensor on the batch's device."""
    return _on(x.device, values, dtype).view(-1, 1, 1, 1)


def _blend(degenerate: torch.Tensor, x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ``Image.blend(degenerate, x, factor)``: in1 + factor * (in2 - in1) in float32, clipped, truncated."""
    diff = (x.to(torch.int16) - degenerate.to(torch.int16)).float()
    out = degenerate.float() + factor * diff  # two roundings, as PIL's C does (no fused multiply-add)
    return out.clamp_(0, 255).floor_().to(torch.uint8)


def _luma(x: torch.Tensor) -> torch.Tensor:
    """PIL's RGB -> L conversion (ITU-R 601-2 in 16-bit fixed point): int32 (n, 1, H, W)."""
    r, g, b = x.to(torch.int32).unbind(1)
    return ((r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16).unsqueeze(1)


def _brightness(x, args):
    return _blend(torch.zeros_like(x), x, _per_image(args[:, 0], x))


def _color(x, args):
    return _blend(_luma(x).to(torch.uint8).expand_as(x), x, _per_image(args[:, 0], x))


def _desaturate(x, args):
    return _color(x, np.clip(1.0 - args, 0.0, 1.0))  # timm's desaturate: enhance Color by 1 - level


def _contrast(x, args):
    # PIL's degenerate: the mean of the L image, rounded half up, in every pixel
    mean = torch.floor(_luma(x).sum((1, 2, 3), dtype=torch.int64).double() / (x.shape[2] * x.shape[3]) + 0.5)
    return _blend(mean.to(torch.uint8).view(-1, 1, 1, 1).expand_as(x), x, _per_image(args[:, 0], x))


def _sharpness(x, args):
    # PIL's SMOOTH filter ([[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13, rounded half up), border pixels left as they are
    v = x.to(torch.int16)
    rows = v[:, :, :-2] + v[:, :, 1:-1] + v[:, :, 2:]  # (n, 3, H-2, W): vertical sums of three
    sums = rows[..., :-2] + rows[..., 1:-1] + rows[..., 2:] + 4 * v[:, :, 1:-1, 1:-1]  # (n, 3, H-2, W-2), exact
    smooth = x.clone()
    smooth[:, :, 1:-1, 1:-1] = torch.div(sums * 2 + 13, 26, rounding_mode="floor").to(torch.uint8)
    return _blend(smooth, x, _per_image(args[:, 0], x))


def _posterize(x, args):
    bits = args[:, 0].astype(np.int64)  # 0 bits: black (Pillow 13 refuses it; older Pillow gave black)
    masks = np.where(bits >= 8, 255, (~((1 << (8 - np.clip(bits, 0, 8))) - 1)) & 255)
    return x & _per_image(masks, x, torch.uint8)


def _solarize(x, args):
    return torch.where(x.to(torch.int16) < _per_image(args[:, 0], x, torch.int16), x, 255 - x)


def _solarize_add(x, args):
    added = (x.to(torch.int16) + _per_image(args[:, 0], x, torch.int16)).clamp_(max=255).to(torch.uint8)
    return torch.where(x < 128, added, x)


def _invert(x, args):
    from torchvision.transforms.v2.functional import invert

    return invert(x)


def _equalize(x, args):
    from torchvision.transforms.v2.functional import equalize  # batched, per image and channel, PIL's LUT

    return equalize(x)


def _autocontrast(x, args):
    # PIL's LUT, in float64: int(i * scale + offset), scale = 255 / (hi - lo), per image and channel
    lo, hi = x.amin((2, 3)).double(), x.amax((2, 3)).double()  # (n, 3)
    scale = torch.full_like(lo, 255.0) / (hi - lo).clamp(min=1)  # not 255.0 / t: torch multiplies by 1 / t
    ramp = torch.arange(256, dtype=torch.float64, device=x.device)
    lut = (ramp * scale[..., None] + (-lo * scale)[..., None]).trunc().clamp_(0, 255)  # (n, 3, 256)
    lut = torch.where((hi > lo)[..., None], lut, ramp).to(torch.uint8)
    return lut.gather(2, x.flatten(2).long()).view_as(x)


def _gaussian_blur(x, args):
    # A true Gaussian of sigma = radius (PIL approximates it with three box blurs), edges replicated
    n, c, h, w = x.shape
    sigma = _on(x.device, args[:, 0], torch.float32).clamp(min=1e-3)
    r = min(int(math.ceil(3 * float(args[:, 0].max()))), (min(h, w) - 1) // 2)
    taps = torch.arange(-r, r + 1, dtype=torch.float32, device=x.device)
    k = torch.exp(-(taps**2) / (2 * sigma[:, None] ** 2))
    k = (k / k.sum(1, keepdim=True)).repeat_interleave(c, 0)  # (n*3, 2r+1)
    y = torch.nn.functional.pad(x.float().reshape(1, n * c, h, w), (r, r, r, r), mode="replicate")
    y = torch.nn.functional.conv2d(y, k.view(n * c, 1, 1, -1), groups=n * c)
    y = torch.nn.functional.conv2d(y, k.view(n * c, 1, -1, 1), groups=n * c)
    return y.view(n, c, h, w).add_(0.5).floor_().clamp_(0, 255).to(torch.uint8)


def _colour_kernels() -> dict:
    aa = _aa()
    return {
        aa.brightness: _brightness,
        aa.color: _color,
        aa.contrast: _contrast,
        aa.sharpness: _sharpness,
        aa.posterize: _posterize,
        aa.solarize: _solarize,
        aa.solarize_add: _solarize_add,
        aa.invert: _invert,
        aa.equalize: _equalize,
        aa.auto_contrast: _autocontrast,
        aa.desaturate: _desaturate,
        aa.gaussian_blur: _gaussian_blur,
    }


_INTERPOLATION = {0: "nearest", 2: "bilinear", 3: "bicubic"}  # PIL's resample codes -> grid_sample's modes


def apply_plans(images: torch.Tensor, plans: list[list]) -> torch.Tensor:
    """RandAugment on the batch's device: uint8 (B, 3, H, W) -> uint8 (B, 3, H, W), image i through ``plans[i]``.

    At each layer position the images are grouped by the op they drew there; a colour op runs
    once on its sub-batch with per-image arguments, the geometric ops of the position run
    together through one ``grid_sample`` with each image's matrix.
    """
    b, _, h, w = images.shape
    x = images.clone(memory_format=torch.contiguous_format)
    kernels = _colour_kernels()
    geometric = {
        _aa().rotate,
        _aa().shear_x,
        _aa().shear_y,
        _aa().translate_x_rel,
        _aa().translate_y_rel,
        _aa().translate_x_abs,
        _aa().translate_y_abs,
    }
    for layer in range(max((len(p) for p in plans), default=0)):
        groups: dict[tuple, tuple[list[int], list]] = {}
        for i, plan in enumerate(plans):
            if layer >= len(plan):
                continue
            op, args = plan[layer]
            if op.aug_fn in geometric:
                matrix = _affine_matrix(op.aug_fn, args[0], w, h)
                if matrix is None:
                    continue
                resample = op.kwargs["resample"]
                if resample not in _INTERPOLATION:
                    raise ValueError(f"RandAugment's tensor backend needs one interpolation, not {resample!r}")
                key, item = ("warp", tuple(op.kwargs["fillcolor"]), _INTERPOLATION[resample]), matrix
            elif op.aug_fn in kernels:
                key, item = ("colour", op.aug_fn), tuple(args)
            else:
                raise ValueError(f"RandAugment's tensor backend has no kernel for {op.name}; use backend='pil'")
            ids, items = groups.setdefault(key, ([], []))
            ids.append(i)
            items.append(item)
        for key, (ids, items) in groups.items():
            idx = _on(x.device, ids, torch.int64)
            sub = x.index_select(0, idx)
            if key[0] == "warp":
                out = _warp(sub, np.asarray(items, dtype=np.float64), key[1], key[2])
            else:
                out = kernels[key[1]](sub, np.asarray(items, dtype=np.float64).reshape(len(ids), -1))
            x.index_copy_(0, idx, out)
    return x


class TrainAugment:
    """RandAugment (``before_normalise``) and random erasing (``after_normalise``), per image.

    ``randaugment``: a timm spec (DeiT's ``'rand-m9-mstd0.5-inc1'``) or None; ``random_erasing``: the
    probability per image; ``mean``/``std`` fill uncovered pixels, as timm; ``workers``: the PIL backend's threads.
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        randaugment: str | None = None,
        random_erasing: float = 0.0,
        seed: int = 0,
        rank: int = 0,
        workers: int = 1,
        backend: str = "tensor",
    ):
        if backend not in ("tensor", "pil"):
            raise ValueError(f"TrainAugment: backend must be 'tensor' or 'pil', not {backend!r}")
        self.mean, self.std = tuple(mean), tuple(std)
        self.spec, self.erase_prob = randaugment, float(random_erasing)
        self.seed, self.rank, self.workers, self.backend = int(seed), int(rank), int(workers), backend
        self._policies: dict[tuple[int, int], object] = {}
        self._erasers: dict[torch.device, object] = {}
        self._local = threading.local()  # each thread's torch.Generator per device (erasing noise)
        # Draws from process-wide state (Python's random, torch's default generator) are taken one
        # thread at a time: the feed's threads prepare different batches at once (locvit.data.feed).
        self._draw_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        if self.spec:
            self._policy(32, 32)  # a bad spec fails here, not at the first batch

    def _rng(self, step: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.rank, int(step), stream])

    def _policy(self, h: int, w: int):
        """timm's RandAugment for this image size, built with DeiT's hyper-parameters (timm's create_transform)."""
        with self._draw_lock:
            return self._policy_locked(h, w)

    def _policy_locked(self, h: int, w: int):
        if (h, w) not in self._policies:
            from PIL import Image
            from timm.data.auto_augment import rand_augment_transform

            hparams = dict(
                translate_const=int(min(h, w) * 0.45),
                interpolation=Image.BICUBIC,
                img_mean=tuple(min(255, round(255 * m)) for m in self.mean),
            )
            try:
                self._policies[(h, w)] = rand_augment_transform(self.spec, hparams)
            except (AssertionError, ValueError, KeyError) as err:
                raise InputError(
                    f"train.randaugment: {self.spec!r} is not a timm RandAugment spec ({err!r}); "
                    f"DeiT's is 'rand-m9-mstd0.5-inc1'"
                ) from err
        return self._policies[(h, w)]

    def _plans(self, n: int, h: int, w: int, rng: np.random.Generator) -> list[list]:
        """Each image's ops and their arguments: the draws of timm's RandAugment / AugmentOp, from ``rng``."""
        policy = self._policy(h, w)
        ops, weights = policy.ops, policy.choice_weights
        bound = _aa()._LEVEL_DENOM  # timm's magnitude scale: 'm10' is an op's strongest level (unless 'mmax')
        plans = []
        # the signs timm's level functions pick, from Python's random: seeded here, one thread at a time
        with self._draw_lock, _seeded_python_random(int(rng.integers(2**63))):
            for _ in range(n):
                plan = []
                for k in rng.choice(len(ops), policy.num_layers, replace=weights is None, p=weights):
                    op = ops[k]
                    if op.prob < 1.0 and rng.random() > op.prob:
                        continue
                    magnitude = op.magnitude
                    if op.magnitude_std == math.inf:
                        magnitude = rng.uniform(0, magnitude)
                    elif op.magnitude_std > 0:
                        magnitude = rng.normal(magnitude, op.magnitude_std)
                    magnitude = max(0.0, min(magnitude, op.magnitude_max or bound))
                    plan.append((op, op.level_fn(magnitude, op.hparams) if op.level_fn is not None else ()))
                plans.append(plan)
        return plans

    def before_normalise(self, images: torch.Tensor, step: int) -> torch.Tensor:
        """RandAugment: uint8 (B, 3, H, W) -> uint8 (B, 3, H, W) on the same device; the identity when off."""
        if not self.spec:
            return images
        b, _, h, w = images.shape
        plans = self._plans(b, h, w, self._rng(step, 0))
        if self.backend == "tensor":
            return apply_plans(images, plans)
        batch = images.permute(0, 2, 3, 1).cpu().numpy()  # (B, H, W, 3)
        out = np.empty((b, h, w, 3), dtype=np.uint8)

        def run(i: int) -> None:
            out[i] = _apply(batch[i], plans[i])

        if self.workers > 1:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="randaugment")
            list(self._pool.map(run, range(b)))
        else:
            for i in range(b):
                run(i)
        return torch.from_numpy(out).permute(0, 3, 1, 2).to(images.device, non_blocking=True)  # (B, 3, H, W)

    def erase_boxes(self, n: int, h: int, w: int, step: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Random erasing's draws for a batch: the erased images' indices, their boxes (k, 4) as
        (top, left, height, width), and the seed of their noise; timm's RandomErasing semantics
        (mode 'pixel', one box, area 0.02-1/3 of the image, log-uniform aspect 0.3-3.3, ten tries
        to fit), drawn from the run's Generator for (seed, rank, step)."""
        rng = self._rng(step, 1)
        min_area, max_area, log_aspect = _erasing_ranges()
        hit = rng.random(n) <= self.erase_prob  # timm skips an image when random() > p
        area = rng.uniform(min_area, max_area, (n, 10)) * (h * w)  # (n, 10): timm's ten tries
        aspect = np.exp(rng.uniform(*log_aspect, (n, 10)))
        bh = np.rint(np.sqrt(area * aspect)).astype(np.int64)  # rint: Python's round, half to even
        bw = np.rint(np.sqrt(area / aspect)).astype(np.int64)
        fits = (bh < h) & (bw < w)
        first = fits.argmax(1)  # the first of the ten tries that fits
        bh, bw = bh[np.arange(n), first], bw[np.arange(n), first]
        top = (rng.random(n) * (h - bh + 1)).astype(np.int64)
        left = (rng.random(n) * (w - bw + 1)).astype(np.int64)
        seed = int(rng.integers(2**63))
        ids = np.flatnonzero(hit & fits.any(1))
        return ids, np.stack([top, left, bh, bw], 1)[ids], seed

    def _generator(self, device: torch.device) -> torch.Generator:
        generators = self._local.__dict__.setdefault("generators", {})
        if device not in generators:
            generators[device] = torch.Generator(device=device)
        return generators[device]

    def after_normalise(self, x: torch.Tensor, step: int) -> torch.Tensor:
        """Random erasing of the normalised float batch (B, 3, H, W), in place; the identity when off."""
        if self.erase_prob <= 0:
            return x
        if self.backend == "pil":
            return self._timm_erase(x, step)
        b, c, h, w = x.shape
        ids, boxes, seed = self.erase_boxes(b, h, w, step)
        if len(ids) == 0:
            return x
        idx = _on(x.device, ids, torch.int64)
        top, left, bh, bw = _on(x.device, boxes, torch.int64).unbind(1)  # (k,) each
        rows, cols = torch.arange(h, device=x.device), torch.arange(w, device=x.device)
        in_rows = (rows >= top[:, None]) & (rows < (top + bh)[:, None])  # (k, H)
        in_cols = (cols >= left[:, None]) & (cols < (left + bw)[:, None])  # (k, W)
        box = in_rows[:, None, :, None] & in_cols[:, None, None, :]  # (k, 1, H, W)
        # Normal noise for the boxes' pixels only, from a generator of our own on the batch's device
        # (torch's global one is untouched), written into the boxes in (image, channel, row, column) order.
        noise = torch.randn(
            int((boxes[:, 2] * boxes[:, 3]).sum()) * c,
            device=x.device,
            dtype=x.dtype,
            generator=self._generator(x.device).manual_seed(seed),
        )
        return x.index_copy_(0, idx, x.index_select(0, idx).masked_scatter_(box, noise))

    def _timm_erase(self, x: torch.Tensor, step: int) -> torch.Tensor:
        """The PIL backend's random erasing: timm's RandomErasing, its global draws seeded from our Generator."""
        if x.device not in self._erasers:
            from timm.data.random_erasing import RandomErasing

            self._erasers[x.device] = RandomErasing(self.erase_prob, mode="pixel", max_count=1, device=str(x.device))
        seed = int(self._rng(step, 1).integers(2**63))
        cuda = (
            [x.device.index if x.device.index is not None else torch.cuda.current_device()]
            if x.device.type == "cuda"
            else []
        )
        with self._draw_lock, torch.random.fork_rng(devices=cuda), _seeded_python_random(seed):
            torch.default_generator.manual_seed(seed)
            if cuda:
                with torch.cuda.device(cuda[0]):
                    torch.cuda.manual_seed(seed)
            return self._erasers[x.device](x)


class BatchMixup:
    """MixUp / CutMix of a batch with soft targets: timm's ``Mixup`` in its default batch mode, drawing
    from the run's seeded Generator (seed, rank, step) instead of numpy's global one.

    FFCV's loader thread draws from numpy's global generator at the same time, so timm's own did not repeat.
    Draws in timm's order and meaning (``prob``, ``switch_prob``, lam ~ Beta, ``correct_lam``, the batch
    reversed); targets are timm's ``mixup_target``, label smoothing included.
    """

    def __init__(
        self,
        mixup_alpha: float,
        cutmix_alpha: float,
        prob: float,
        switch_prob: float,
        label_smoothing: float,
        num_classes: int,
        seed: int = 0,
        rank: int = 0,
    ):
        self.mixup_alpha, self.cutmix_alpha = float(mixup_alpha), float(cutmix_alpha)
        self.prob, self.switch_prob, self.smoothing = float(prob), float(switch_prob), float(label_smoothing)
        self.num_classes, self.seed, self.rank = int(num_classes), int(seed), int(rank)

    def draw(self, step: int, h: int, w: int) -> tuple[float, tuple[int, int, int, int] | None]:
        """lam and the CutMix box (top, bottom, left, right), or None for MixUp / no mixing (lam 1)."""
        rng = np.random.default_rng([self.seed, self.rank, int(step), 2])
        if rng.random() >= self.prob:
            return 1.0, None
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            cutmix = bool(rng.random() < self.switch_prob)
        else:
            cutmix = self.cutmix_alpha > 0
        alpha = self.cutmix_alpha if cutmix else self.mixup_alpha
        lam = float(rng.beta(alpha, alpha))
        if not cutmix:
            return lam, None
        ratio = math.sqrt(1.0 - lam)
        cut_h, cut_w = int(h * ratio), int(w * ratio)
        cy, cx = int(rng.integers(0, h)), int(rng.integers(0, w))
        top, bottom = min(max(cy - cut_h // 2, 0), h), min(max(cy + cut_h // 2, 0), h)
        left, right = min(max(cx - cut_w // 2, 0), w), min(max(cx + cut_w // 2, 0), w)
        return 1.0 - (bottom - top) * (right - left) / float(h * w), (top, bottom, left, right)

    def __call__(self, x: torch.Tensor, target: torch.Tensor, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Mix ``x`` (B, C, H, W) in place; return it and the soft targets (B, num_classes)."""
        from timm.data.mixup import mixup_target

        lam, box = self.draw(step, x.shape[-2], x.shape[-1])
        if box is not None:
            top, bottom, left, right = box
            x[:, :, top:bottom, left:right] = x.flip(0)[:, :, top:bottom, left:right]
        elif lam < 1.0:
            flipped = x.flip(0).mul_(1.0 - lam)  # a copy, taken before x is scaled in place
            x.mul_(lam).add_(flipped)
        return x, mixup_target(target, self.num_classes, lam, self.smoothing)


def make_mixup(recipe: dict, num_classes: int, seed: int, rank: int = 0) -> BatchMixup | None:
    """The recipe's MixUp/CutMix for a run, or None when both are off."""
    if not (recipe["mixup"] > 0 or recipe["cutmix"] > 0):
        return None
    return BatchMixup(
        recipe["mixup"],
        recipe["cutmix"],
        recipe["mixup_prob"],
        recipe["mixup_switch_prob"],
        recipe["label_smoothing"],
        num_classes,
        seed=seed,
        rank=rank,
    )


def make_train_augment(
    recipe: dict, mean: Sequence[float], std: Sequence[float], seed: int, rank: int | None = None
) -> TrainAugment | None:
    """The recipe's per-sample augmentations for a run, or None when both are off.

    ``rank``: the process's rank (default: torchrun's ``RANK``, else 0), so the processes
    of a distributed run draw differently. Both run as batched tensor ops on the batch's
    device (the tensor backend); ``train.num_workers`` is passed on for the PIL backend's threads.
    """
    if not recipe["randaugment"] and recipe["random_erasing"] <= 0:
        return None
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    return TrainAugment(
        mean, std, recipe["randaugment"], recipe["random_erasing"], seed=seed, rank=rank, workers=recipe["num_workers"]
    )
