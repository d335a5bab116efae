"""Profile a model: what it is (family, sizes, masks), params, GMACs and throughput.

GMACs = FLOPs / 2 as counted by ``torch.utils.flop_counter`` for one image at the
model's input size: matmuls and convolutions, the attention matmuls included (fused
attention kernels hide them from the counter, so the count runs on the eager path).
Element-wise work (softmax, norms, masks, LSA's attention over its T shifted variants)
is not counted. Throughput is images/s, the median of ``repeats`` timed batches after
two untimed ones, on the device the model is on, which is named in the result.
"""

from __future__ import annotations

import contextlib
import copy
import platform
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from locvit.models.family import summary


@contextlib.contextmanager
def eager_attention(model: torch.nn.Module):
    """Switch every attention module that has a fused path to its eager path, then back."""
    fused = [m for m in model.modules() if getattr(m, "fused_attn", False) is True]
    for m in fused:
        m.fused_attn = False
    try:
        yield model
    finally:
        for m in fused:
            m.fused_attn = True


def gmacs(model: torch.nn.Module, image_size: int) -> float:
    """Multiply-accumulates (in 10^9) of one forward pass on one ``image_size`` square RGB image."""
    x = torch.randn(1, 3, image_size, image_size, device=next(model.parameters()).device)
    was_training = model.training
    model.eval()
    try:
        # (autograd stays on: the counter's hooks need it)
        with eager_attention(model), FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() / 2e9


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{device.type} ({cpu}, {torch.get_num_threads()} threads)"


def _median_rate(step, batch: int, repeats: int, device: torch.device) -> float:
    times = []
    for i in range(repeats + 2):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:  # two untimed batches: allocator and kernel warm-up
            times.append(time.perf_counter() - start)
    return batch / sorted(times)[len(times) // 2]


def throughput(model: torch.nn.Module, image_size: int, batch: int, repeats: int) -> dict:
    """Inference and training images/s (training: forward, backward and an AdamW step on a copy)."""
    device = next(model.parameters()).device
    x = torch.randn(batch, 3, image_size, image_size, device=device)
    model = copy.deepcopy(model)  # the training step must not touch the caller's weights
    model.eval()

    def infer():
        with torch.no_grad():
            model(x)

    infer_rate = _median_rate(infer, batch, repeats, device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    target = torch.zeros(batch, dtype=torch.long, device=device)

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), target).backward()
        optimizer.step()

    return {"infer_images_per_s": infer_rate, "train_images_per_s": _median_rate(train_step, batch, repeats, device)}


def profile(model: torch.nn.Module, image_size: int, batch: int = 32, repeats: int = 5) -> dict:
    """Everything the analyse step records about a model (see the module docstring)."""
    device = next(model.parameters()).device
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "gmacs": gmacs(model, image_size),
        "input_size": [3, image_size, image_size],
        "device": device_name(device),
        "batch_size": batch,
        **throughput(model, image_size, batch, repeats),
        "arch": {**summary(model), "img_size": image_size},
    }
