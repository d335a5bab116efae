"""The engine: one training epoch and one evaluation pass, callable from any script."""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from locvit.data.feed import TrainFeed
from locvit.data.ffcv_io import to_model_input


@dataclass(frozen=True)
class Compute:
    """How a batch meets the model: autocast dtype (None: full precision) and memory format."""

    amp_dtype: torch.dtype | None = None
    channels_last: bool = False

    def inputs(self, images: torch.Tensor, mean, std) -> torch.Tensor:
        """uint8 (B, 3, H, W) -> normalised float (B, 3, H, W), NHWC in memory when channels_last."""
        x = to_model_input(images, mean, std)
        return x.contiguous(memory_format=torch.channels_last) if self.channels_last else x

    def autocast(self, device: torch.device):
        # bf16 keeps fp32's exponent range, so no loss scaling (GradScaler) is needed.
        return torch.autocast(device.type, dtype=self.amp_dtype or torch.bfloat16, enabled=self.amp_dtype is not None)


def set_deterministic(enabled: bool) -> None:
    """Deterministic kernels for this process (``train.deterministic``); ``False`` changes nothing.

    On CUDA a run repeats bitwise only with these: the attention (SDPA) and index_select
    backward passes otherwise add with atomics, in no fixed order. Call before the process's
    first CUDA work (:func:`locvit.train.loop.train_run` calls it at the start of each run;
    again is harmless). An op with no deterministic kernel then raises torch's own error
    naming it. On CPU the kernels are deterministic already, so runs repeat without this.
    """
    if not enabled:
        return
    # cuBLAS reads this when it first initialises (the process's first CUDA matmul), so it must be
    # set before then; without it use_deterministic_algorithms makes cuBLAS calls raise.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False  # benchmarking picks kernels by timing: another pick per run


def cosine_schedule(step: int, total_steps: int, warmup_steps: int, lr: float, min_lr: float) -> float:
    """Linear warm-up from 0 to ``lr`` over ``warmup_steps``, then cosine down to ``min_lr``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * min(1.0, progress)))


class NonFiniteLoss(FloatingPointError):
    """Too many training steps with a NaN or inf loss (``train.max_bad_steps``)."""

    def __init__(self, step: int, loss: float, grad_norm: float, bad_steps: int, max_bad_steps: int):
        super().__init__(
            f"training stopped at step {step}: loss {loss}, gradient norm {grad_norm}; {bad_steps} step(s) with a "
            f"NaN or inf loss or gradient, more than train.max_bad_steps = {max_bad_steps}. last.pt holds the last "
            "good epoch. Lower train.lr, set train.clip_grad, or raise train.max_bad_steps to skip more such steps.")
        self.step, self.bad_steps = step, bad_steps


def train_one_epoch(model: torch.nn.Module, loader: Iterable, optimizer: torch.optim.Optimizer,
                    lr_at: callable, first_step: int, mean, std, label_smoothing: float = 0.0,
                    clip_grad: float | None = None, desc: str = "train", show_progress: bool = True,
                    mixup: Callable | None = None, compute: Compute = Compute(),
                    on_step: Callable[[int], None] | None = None, augment=None, max_bad_steps: int = 0,
                    bad_steps_before: int = 0, feed_ahead: int = 0, feed_workers: int = 1, done: dict | None = None,
                    stop: Callable[[], bool] | None = None) -> dict:
    """Train for one pass over ``loader``; ``lr_at(step)`` sets the lr before every step.

    ``mixup`` (:class:`locvit.data.augment.BatchMixup`, which also applies the label
    smoothing) mixes each batch with draws seeded by the step and turns the labels into
    soft targets; accuracy is still counted on the true labels.
    ``on_step(step)`` runs after every optimiser step (the EMA update), with the steps done.
    ``augment`` (:class:`locvit.data.augment.TrainAugment`): per-sample RandAugment on the
    uint8 batch, random erasing on the normalised one, both before MixUp, drawn from the step.
    ``feed_ahead``: batches prepared ahead (augmented, normalised) in a background thread
    while the step runs, ``feed_workers`` at once (:class:`locvit.data.feed.TrainFeed`;
    ahead 0: in this thread); the result is the same either way.

    A step whose loss or gradient norm is NaN or inf changes nothing (no update, no EMA;
    the lr schedule moves on) and is counted in ``bad_steps``. Once the run's count
    (``bad_steps_before`` + this epoch's) exceeds ``max_bad_steps``, :class:`NonFiniteLoss`
    is raised, before the epoch's checkpoint: last.pt stays the last good epoch's. The
    decision reads the gradient norm after backward, which DDP has already averaged, so
    every process skips the same steps.

    ``stop()``, asked after every step but the epoch's last, ends the epoch early when it
    says so (``stopped`` in the result). ``done``: the ``partial`` result of such an
    epoch; its batches are drawn again from ``loader`` (the same order and numpy draws
    when the generators are as they were at the epoch's start) and skipped, and its
    sums carried on, so the resumed epoch ends as the uninterrupted one would.
    """
    model.train()
    done = done or {"batches": 0, "loss_sum": 0.0, "correct": 0, "seen": 0, "bad_steps": 0, "elapsed_s": 0.0}
    total_loss, total_correct, total_seen, bad_steps = done["loss_sum"], done["correct"], done["seen"], done["bad_steps"]
    batches, stopped = done["batches"], False
    step = first_step
    start = time.perf_counter() - done["elapsed_s"]
    feed = TrainFeed(_Skip(loader, batches), augment, compute, mean, std, first_step, feed_ahead,
                     feed_workers)  # x: RandAugment, normalised, erased
    bar = tqdm(feed, desc=desc, leave=False, disable=not show_progress, mininterval=1.0)
    for x, labels in bar:
        batches += 1
        if stop is not None and batches > done["batches"] + 1 and stop():
            stopped = True  # asked after the previous step: that one was the last
            batches -= 1
            break
        lr = lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        soft = None
        if mixup is not None:
            x, soft = mixup(x, labels, step)  # soft: (B, num_classes), smoothing included; drawn from the step
        with compute.autocast(x.device):
            logits = model(x).float()  # (B, num_classes); fp32 for the loss under bf16 autocast
        if soft is not None:
            loss = torch.sum(-soft * F.log_softmax(logits, dim=-1), dim=-1).mean()
        else:
            loss = F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad or math.inf)
        if not (torch.isfinite(loss) and torch.isfinite(grad_norm)):
            bad_steps += 1
            if bad_steps_before + bad_steps > max_bad_steps:
                raise NonFiniteLoss(step, loss.item(), grad_norm.item(), bad_steps_before + bad_steps, max_bad_steps)
            optimizer.zero_grad(set_to_none=True)
            step += 1
            continue
        optimizer.step()
        step += 1
        if on_step is not None:
            on_step(step)
        n = labels.shape[0]
        total_seen += n
        total_loss += loss.item() * n
        total_correct += (logits.argmax(-1) == labels).sum().item()
        elapsed = time.perf_counter() - start
        bar.set_postfix(loss=f"{total_loss / total_seen:.3f}", acc=f"{total_correct / total_seen:.3f}",
                        img_s=f"{total_seen / max(elapsed, 1e-9):.0f}")
    elapsed = time.perf_counter() - start
    return {
        "stopped": stopped,
        "partial": {"batches": batches, "loss_sum": total_loss, "correct": total_correct, "seen": total_seen,
                    "bad_steps": bad_steps, "elapsed_s": elapsed},
        "train_loss": total_loss / max(total_seen, 1),
        "train_top1": total_correct / max(total_seen, 1),
        "train_images_per_s": total_seen / max(elapsed, 1e-9),
        "lr": optimizer.param_groups[0]["lr"],
        "steps": step,
        "bad_steps": bad_steps,
    }


class _Skip:
    """``loader`` without its first ``n`` batches (read and dropped: FFCV draws for them as before)."""

    def __init__(self, loader: Iterable, n: int):
        self.loader, self.n = loader, n

    def __len__(self) -> int:
        return len(self.loader) - self.n

    def __iter__(self):
        batches = iter(self.loader)
        for _ in range(self.n):
            next(batches)
        yield from batches


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Iterable, mean, std, compute: Compute = Compute(),
             limit: int | None = None) -> dict:
    """Top-1 accuracy and mean cross-entropy over every sample of ``loader`` (its first ``limit``).

    ``limit`` drops the padding a distributed loader adds at the end of a rank's share;
    the sums (``loss_sum``, ``correct``, ``n``) are what ranks add up. ``hits`` holds, per sample
    in the loader's order, whether its top-1 prediction was right (a CPU bool tensor): the report
    pairs two variants scored on the same test images with it.
    """
    model.eval()
    total_loss, total_correct, total_seen = 0.0, 0, 0
    hits = []
    for batch, (images, labels) in enumerate(loader):
        if limit is not None:
            keep = max(0, min(labels.shape[0], limit - total_seen))
            images, labels = images[:keep], labels[:keep]
            if keep == 0:
                continue  # drain the loader: FFCV's epoch thread must finish its epoch
        x = compute.inputs(images, mean, std)
        with compute.autocast(x.device):
            logits = model(x).float()  # (B, num_classes)
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        hit = logits.argmax(-1) == labels  # (B,)
        hits.append(hit)
        total_correct += hit.sum().item()
        total_seen += labels.shape[0]
    return {"loss": total_loss / max(total_seen, 1), "top1": total_correct / max(total_seen, 1), "n": total_seen,
            "loss_sum": total_loss, "correct": total_correct,
            "hits": torch.cat(hits).cpu() if hits else torch.zeros(0, dtype=torch.bool)}
