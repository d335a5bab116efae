"""Shared helpers of the benchmarks: alternating timed repeats, the machine's name, atomic JSON output.

Every figure is a ratio of two things measured in the same run, alternating between
them so that drift on the machine hits both alike, reported as the median of repeats.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "torch": torch.__version__, "python": platform.python_version(),
    }


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


def write_result(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"machine": machine(), **payload}, indent=2) + "\n")
    os.replace(tmp, path)
    return path
