"""Shared helpers of the benchmarks: alternating timed repeats, the machine's name, atomic JSON output.

Every figure is a ratio of two things measured in the same run, alternating between
them so that drift on the machine hits both alike, reported as the median of repeats.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from locvit.device import describe

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    """The machine every result file names: :func:`locvit.device.describe` (the CPU, the instruction set
    torch's kernels use, torch's build, the GPU with its CUDA, cuDNN and triton)."""
    return describe()


def alternate(fns: dict[str, Callable[[], None]], repeats: int, warmup: int = 2) -> dict[str, list[float]]:
    """Time each function ``repeats`` times, alternating between them; seconds per call."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            times[name].append(time.perf_counter() - start)
    return times


def median(values: list[float]) -> float:
    return statistics.median(values)


def commit() -> str | None:
    """The commit of the code that made a result: ``git rev-parse --short HEAD``, with ``+changes`` when
    ``src/`` or ``benchmarks/``' code differ from it (not its results, which a run is writing); outside a git
    checkout (a GPU node's copy) ``LOCVIT_COMMIT``, which gpu_node/visit.py sets, else None."""
    import subprocess

    root = RESULTS.parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src", "benchmarks", "gpu_node", ":!benchmarks/results"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("LOCVIT_COMMIT") or None
    return head + ("+changes" if dirty else "")


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"machine": machine(), "commit": commit(), **payload}, indent=2) + "\n")
    os.replace(tmp, path)
    return path


# Two sizes for step-time ratios: the demo's (65 tokens) and DeiT-Tiny's at 224 (197
# tokens; 6 of its 12 layers, to keep CPU runs short).
SHAPES = {
    "demo_32px_p4_48d_4L": dict(img_size=32, patch_size=4, embed_dim=48, depth=4, num_heads=3),
    "deit_tiny_224_6L": dict(img_size=224, patch_size=16, embed_dim=192, depth=6, num_heads=3),
}


def train_step_fn(model: torch.nn.Module, batch: int, size: int, device: torch.device) -> Callable[[], None]:
    """One AdamW training step of ``model`` on a fixed random batch."""
    import torch.nn.functional as F

    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def step_ratios(
    baseline: str, cases: dict[str, tuple[str, dict]], repeats: int, batch: int, device: torch.device
) -> dict:
    """Step time of each case over ``baseline`` (timm's fused attention) and over its eager twin.

    ``cases`` maps a label to (timm model name, keyword arguments); every model is built
    at each of :data:`SHAPES` with 10 classes. Batch ``batch`` at 32 px, a quarter at 224.
    """
    import timm

    results = {}
    for shape_name, shape in SHAPES.items():
        size = shape["img_size"]
        b = batch if size <= 32 else max(8, batch // 4)
        torch.manual_seed(0)
        fns = {
            "baseline": train_step_fn(timm.create_model(baseline, num_classes=10, **shape).to(device), b, size, device)
        }
        eager = timm.create_model(baseline, num_classes=10, **shape).to(device)
        for block in eager.blocks:  # the same model with timm's eager attention
            block.attn.fused_attn = False
        fns["baseline_eager"] = train_step_fn(eager, b, size, device)
        for case, (name, kwargs) in cases.items():
            fns[case] = train_step_fn(
                timm.create_model(name, num_classes=10, **shape, **kwargs).to(device), b, size, device
            )
        times = alternate(fns, repeats)
        base = median(times["baseline"])
        results[shape_name] = {
            "batch": b,
            "shape": shape,
            "baseline": baseline,
            "baseline_step_s": base,
            "ratios": {case: median(times[case]) / base for case in cases},
            "ratios_vs_eager_twin": {case: median(times[case]) / median(times["baseline_eager"]) for case in cases},
        }
        for label, key in (("vs fused baseline", "ratios"), ("vs eager baseline", "ratios_vs_eager_twin")):
            print(shape_name, label, {k: round(v, 3) for k, v in results[shape_name][key].items()})
    return results
