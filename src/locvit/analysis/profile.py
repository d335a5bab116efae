"""Profile a model: what it is (family, sizes, masks), params and GMACs.

GMACs = FLOPs / 2 as counted by ``torch.utils.flop_counter`` for one image at the
model's input size: matmuls and convolutions, the attention matmuls included (fused
attention kernels hide them from the counter, so the count runs on the eager path).
Element-wise work (softmax, norms, masks, LSA's attention over its T shifted variants)
is not counted. Throughput (images/s) is not measured here, beside whatever else runs,
but by the study's one throughput job, every variant side by side and alone
(``locvit.analysis.throughput``).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.flop_counter import FlopCounterMode

from locvit.device import cpu_model
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
    """The device as a measurement names it: the GPU's name, or the CPU's model, the instruction set torch's
    kernels use and torch's threads (``locvit.device.describe``)."""
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return (
        f"{device.type} ({cpu_model()}, {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads)"
    )


def profile(model: torch.nn.Module, image_size: int) -> dict:
    """Everything the analyse step records about a model (see the module docstring)."""
    return {
        "params": sum(p.numel() for p in model.parameters()),
        "gmacs": gmacs(model, image_size),
        "input_size": [3, image_size, image_size],
        "arch": {**summary(model), "img_size": image_size},
    }
