"""Per-sample training augmentations FFCV's loader lacks: DeiT's RandAugment and random erasing.

Where each augmentation of DeiT's recipe runs (key in parentheses):

- random-resized crop: FFCV's decoder, on a training file written whole (data.max_resolution)
- CIFAR's RandomCrop(S, padding): FFCV's RandomTranslate, the same draw (train.translate;
  see :func:`locvit.data.ffcv_io.make_loader`)
- horizontal flip: FFCV's pipeline (train.hflip)
- repeated augmentation: FFCV's traversal order (train.repeated_aug)
- RandAugment: here, on the uint8 batch before normalisation (train.randaugment)
- random erasing: here, on the normalised batch (train.random_erasing)
- MixUp / CutMix: here (:class:`BatchMixup`, timm's Mixup in its batch mode), in the engine
  after erasing (train.mixup, train.cutmix)

Both augmentations here draw per image: each image gets its own ops, magnitudes and
box. RandAugment is timm's (``rand_augment_transform``, so DeiT's spec strings mean what
they mean in DeiT), applied with PIL image by image. Measured on one core of a shared
2-core machine (benchmarks/bench_augment.py, DeiT's spec): about 7,200 images/s at
32x32, 2.2 times torchvision's ``transforms.v2.RandAugment`` applied per image tensor
(3,300), and about 630 images/s at 224x224, on par with it (580); an earlier run under
more load gave half of each, same ratios. At 224 px PIL's pixel loops release the GIL,
so ``workers`` threads share a batch (2 threads: 1.2-2x here, depending on the other
core's load); at 32 px the work is Python overhead and threads do not help. On a GPU
run the batch goes to the CPU for it and back.

Randomness: every draw comes from a numpy Generator seeded by (run seed, rank, step,
which augmentation: 0 RandAugment, 1 random erasing, 2 MixUp/CutMix), so a seeded run repeats exactly, a resumed run continues as the
uninterrupted one would (the engine passes the global step), the result does not depend
on the thread count, and the global generators keep their streams. Two draws are not
ours to route: timm's level functions pick signs with Python's ``random``, and timm's
RandomErasing draws from Python's ``random`` and torch's default generator. Those are
seeded from our Generator for the call and restored after it; that is safe because
nothing else uses them concurrently (FFCV's loader thread draws from numpy only).
"""

from __future__ import annotations

import contextlib
import math
import os
import random
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Sequence

import numpy as np
import torch

_LEVEL_DENOM = 10.0  # timm's magnitude scale: 'm10' is the strongest level of an op


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


class TrainAugment:
    """RandAugment (``before_normalise``) and random erasing (``after_normalise``), per image.

    ``randaugment``: a timm spec such as DeiT's ``'rand-m9-mstd0.5-inc1'``, or None.
    ``random_erasing``: the probability per image (DeiT 0.25), 0 for none. ``mean`` /
    ``std``: the model's normalisation (RandAugment fills uncovered pixels with the mean
    colour, as timm does). ``seed`` / ``rank``: the run's seed and the process's rank.
    ``workers``: threads for RandAugment's pixel work (1: none).
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], randaugment: str | None = None,
                 random_erasing: float = 0.0, seed: int = 0, rank: int = 0, workers: int = 1):
        self.mean, self.std = tuple(mean), tuple(std)
        self.spec, self.erase_prob = randaugment, float(random_erasing)
        self.seed, self.rank, self.workers = int(seed), int(rank), int(workers)
        self._policies: dict[tuple[int, int], object] = {}
        self._erasers: dict[torch.device, object] = {}
        self._pool: ThreadPoolExecutor | None = None
        if self.spec:
            self._policy(32, 32)  # a bad spec fails here, not at the first batch

    def _rng(self, step: int, stream: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, self.rank, int(step), stream])

    def _policy(self, h: int, w: int):
        """timm's RandAugment for this image size, built with DeiT's hyper-parameters (timm's create_transform)."""
        if (h, w) not in self._policies:
            from PIL import Image
            from timm.data.auto_augment import rand_augment_transform

            hparams = dict(translate_const=int(min(h, w) * 0.45), interpolation=Image.BICUBIC,
                           img_mean=tuple(min(255, round(255 * m)) for m in self.mean))
            try:
                self._policies[(h, w)] = rand_augment_transform(self.spec, hparams)
            except (AssertionError, ValueError, KeyError) as err:
                raise ValueError(f"train.randaugment: {self.spec!r} is not a timm RandAugment spec ({err!r}); "
                                 f"DeiT's is 'rand-m9-mstd0.5-inc1'") from err
        return self._policies[(h, w)]

    def _plans(self, n: int, h: int, w: int, rng: np.random.Generator) -> list[list]:
        """Each image's ops and their arguments: the draws of timm's RandAugment / AugmentOp, from ``rng``."""
        policy = self._policy(h, w)
        ops, weights = policy.ops, policy.choice_weights
        plans = []
        with _seeded_python_random(int(rng.integers(2 ** 63))):  # the signs timm's level functions pick
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
                    magnitude = max(0.0, min(magnitude, op.magnitude_max or _LEVEL_DENOM))
                    plan.append((op, op.level_fn(magnitude, op.hparams) if op.level_fn is not None else ()))
                plans.append(plan)
        return plans

    def before_normalise(self, images: torch.Tensor, step: int) -> torch.Tensor:
        """RandAugment: uint8 (B, 3, H, W) -> uint8 (B, 3, H, W) on the same device; the identity when off."""
        if not self.spec:
            return images
        b, _, h, w = images.shape
        plans = self._plans(b, h, w, self._rng(step, 0))
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

    def after_normalise(self, x: torch.Tensor, step: int) -> torch.Tensor:
        """Random erasing of the normalised float batch (B, 3, H, W), in place; the identity when off."""
        if self.erase_prob <= 0:
            return x
        if x.device not in self._erasers:
            from timm.data.random_erasing import RandomErasing

            self._erasers[x.device] = RandomErasing(self.erase_prob, mode="pixel", max_count=1, device=str(x.device))
        seed = int(self._rng(step, 1).integers(2 ** 63))
        cuda = [x.device.index if x.device.index is not None else torch.cuda.current_device()] \
            if x.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda), _seeded_python_random(seed):
            torch.default_generator.manual_seed(seed)
            if cuda:
                with torch.cuda.device(cuda[0]):
                    torch.cuda.manual_seed(seed)
            return self._erasers[x.device](x)


class BatchMixup:
    """MixUp / CutMix of a batch with soft targets: timm's ``Mixup`` in its default batch mode, drawing
    from the run's seeded Generator (seed, rank, step) instead of numpy's global one.

    timm's ``Mixup`` draws from numpy's global generator, which FFCV's loader thread draws
    from at the same time (its translation and flip, with ``loader_jit: false``), so a run
    with it did not repeat even on one machine. Here each step's draws come from its own
    Generator, in timm's order and with timm's meaning: with probability ``prob`` the batch is
    mixed; with both alphas on, CutMix is chosen with ``switch_prob``; lam ~ Beta(alpha, alpha);
    CutMix pastes a box of side ``sqrt(1 - lam)`` times the image's, centred uniformly and
    clipped at the border, and lam is corrected to the pasted area (timm's ``correct_lam``);
    each image is mixed with the batch reversed. The targets are timm's ``mixup_target``
    (label smoothing included).
    """

    def __init__(self, mixup_alpha: float, cutmix_alpha: float, prob: float, switch_prob: float,
                 label_smoothing: float, num_classes: int, seed: int = 0, rank: int = 0):
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
    return BatchMixup(recipe["mixup"], recipe["cutmix"], recipe["mixup_prob"], recipe["mixup_switch_prob"],
                      recipe["label_smoothing"], num_classes, seed=seed, rank=rank)


def make_train_augment(recipe: dict, mean: Sequence[float], std: Sequence[float], seed: int,
                       rank: int | None = None) -> TrainAugment | None:
    """The recipe's per-sample augmentations for a run, or None when both are off.

    ``rank``: the process's rank (default: torchrun's ``RANK``, else 0), so the processes
    of a distributed run draw differently. RandAugment uses ``train.num_workers`` threads.
    """
    if not recipe["randaugment"] and recipe["random_erasing"] <= 0:
        return None
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    return TrainAugment(mean, std, recipe["randaugment"], recipe["random_erasing"], seed=seed, rank=rank,
                        workers=recipe["num_workers"])
