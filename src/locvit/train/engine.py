"""The engine: one training epoch and one evaluation pass, callable from any script."""

from __future__ import annotations

import math
import time
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from locvit.data.ffcv_io import to_model_input


def cosine_schedule(step: int, total_steps: int, warmup_steps: int, lr: float, min_lr: float) -> float:
    """Linear warm-up from 0 to ``lr`` over ``warmup_steps``, then cosine down to ``min_lr``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * min(1.0, progress)))


def train_one_epoch(model: torch.nn.Module, loader: Iterable, optimizer: torch.optim.Optimizer,
                    lr_at: callable, first_step: int, mean, std, label_smoothing: float = 0.0,
                    clip_grad: float | None = None, desc: str = "train", show_progress: bool = True,
                    mixup: Callable | None = None) -> dict:
    """Train for one pass over ``loader``; ``lr_at(step)`` sets the lr before every step.

    ``mixup`` (timm's ``Mixup``, which also applies the label smoothing) mixes each batch
    and turns the labels into soft targets; accuracy is still counted on the true labels.
    """
    model.train()
    total_loss, total_correct, total_seen = 0.0, 0, 0
    step = first_step
    start = time.perf_counter()
    bar = tqdm(loader, desc=desc, leave=False, disable=not show_progress, mininterval=1.0)
    for images, labels in bar:
        lr = lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        x = to_model_input(images, mean, std)
        if mixup is not None:
            x, soft = mixup(x, labels)  # soft: (B, num_classes), smoothing included
            logits = model(x)  # (B, num_classes)
            loss = torch.sum(-soft * F.log_softmax(logits, dim=-1), dim=-1).mean()
        else:
            logits = model(x)
            loss = F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
        if not torch.isfinite(loss):
            raise FloatingPointError(f"non-finite training loss {loss.item()} at step {step}")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip_grad:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip_grad)
        optimizer.step()
        step += 1
        n = labels.shape[0]
        total_seen += n
        total_loss += loss.item() * n
        total_correct += (logits.argmax(-1) == labels).sum().item()
        elapsed = time.perf_counter() - start
        bar.set_postfix(loss=f"{total_loss / total_seen:.3f}", acc=f"{total_correct / total_seen:.3f}",
                        img_s=f"{total_seen / max(elapsed, 1e-9):.0f}")
    elapsed = time.perf_counter() - start
    return {
        "train_loss": total_loss / max(total_seen, 1),
        "train_top1": total_correct / max(total_seen, 1),
        "train_images_per_s": total_seen / max(elapsed, 1e-9),
        "lr": optimizer.param_groups[0]["lr"],
        "steps": step,
    }


@torch.no_grad()
def evaluate(model: torch.nn.Module, loader: Iterable, mean, std) -> dict:
    """Top-1 accuracy and mean cross-entropy over every sample of ``loader``."""
    model.eval()
    total_loss, total_correct, total_seen = 0.0, 0, 0
    for images, labels in loader:
        logits = model(to_model_input(images, mean, std))
        total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
        total_correct += (logits.argmax(-1) == labels).sum().item()
        total_seen += labels.shape[0]
    return {"loss": total_loss / max(total_seen, 1), "top1": total_correct / max(total_seen, 1), "n": total_seen}
