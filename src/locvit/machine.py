"""Where a number was made: the CPU, the instruction set torch's kernels use, torch's build, and the GPU.

A run's per-seed accuracies differ between machines although the code and the config are the
same: torch picks its CPU kernels by the instruction set it finds (``AVX512``, ``AVX2``, ...;
``ATEN_CPU_CAPABILITY`` caps it), and kernels of different vector widths add floating-point
numbers in different orders, so a long training run drifts apart (docs/reproducibility.md). Every
run record (metrics.json, its MLflow tags, the evaluation files) and every benchmark file names the
machine with :func:`describe`, so that two numbers can be told apart by what made them.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:  # torch's CPU builds come without it
        return None
    return getattr(triton, "__version__", None)


def gpu(device: torch.device | str | int | None = None) -> dict | None:
    """The GPU ``device`` names (default: the current one): its name, compute capability, the CUDA torch
    runs on, cuDNN and triton; None without CUDA."""
    if not torch.cuda.is_available():
        return None
    index = torch.device(device).index if isinstance(device, (torch.device, str)) else device
    index = torch.cuda.current_device() if index is None else index
    return {
        "name": torch.cuda.get_device_name(index),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(index))),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": _triton_version(),
    }


def describe(device: torch.device | str | None = None) -> dict:
    """The machine a number comes from, as JSON-ready fields.

    ``cpu``: the model name; ``cpu_capability``: the instruction set torch's CPU kernels use
    (``torch.backends.cpu.get_cpu_capability()``, after ``ATEN_CPU_CAPABILITY``); ``cores``, and
    ``torch_threads`` now; torch's build (``torch``, its ``torch_git`` commit and the ``torch_cuda`` it was
    built with, None for a CPU build), ``python``; ``gpu``: :func:`gpu` of ``device`` when it is a CUDA
    device, or (``device`` None) of the current GPU when there is one, else None.
    """
    kind = torch.device(device).type if device is not None else None
    return {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "gpu": gpu(device) if kind in (None, "cuda") else None,
    }
