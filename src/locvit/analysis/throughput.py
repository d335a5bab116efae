"""Inference throughput of a study's variants, measured side by side in one process, alone on the machine.

Analyse jobs share cores with training and each other, so their own timings measured their neighbours. Here
every variant is built with random weights (``locvit.models.create`` from ``throughput_config``) and timed in
eval mode under its run's precision and memory format, in ``analysis.throughput_rounds`` rounds: each
runs ``WARMUP`` untimed then ``profile_repeats`` timed batches of every variant, the variants' batches in turn
and their order rotated every round (images/s from a round's median batch time). Per
variant: median, min and max over rounds, and ``ratio_vs_baseline``, the median of same-round ratios. The CSV
(``locvit.io.THROUGHPUT_COLUMNS``) is read back by ``locvit.io.read_throughput`` without torch.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import NamedTuple

import torch

from locvit import models
from locvit.analysis.profile import device_name
from locvit.device import amp_dtype, device_for, set_backends
from locvit.io import read_throughput, write_throughput

WARMUP = 2  # untimed batches per variant and round


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Built(NamedTuple):
    """A variant ready to time: its model, its batch and its run's autocast dtype (None: float32)."""

    model: torch.nn.Module
    x: torch.Tensor
    dtype: torch.dtype | None


def _seconds(b: Built) -> float:
    """One timed forward pass of ``b.model`` on ``b.x`` under autocast to ``b.dtype``."""
    set_backends(b.x.device, b.dtype)  # per variant: TF32 follows its amp
    with torch.no_grad(), torch.autocast(b.x.device.type, dtype=b.dtype or torch.bfloat16, enabled=b.dtype is not None):
        _sync(b.x.device)
        start = time.perf_counter()
        b.model(b.x)
        _sync(b.x.device)
    return time.perf_counter() - start


def _build(config: dict) -> dict[str, Built]:
    """Every variant of the job config, in eval mode on its device, with a batch of random images for it and its
    run's autocast dtype; channels_last where its run trains so."""
    batch = config["analysis"]["profile_batch"]
    built, inputs = {}, {}
    for variant, cfg in config["models"].items():
        device = device_for(cfg["device"])
        size = int(cfg["model_kwargs"]["img_size"])
        if (device, size) not in inputs:  # one batch per device and size: every variant sees the same images
            gen = torch.Generator().manual_seed(0)
            inputs[device, size] = torch.randn(batch, 3, size, size, generator=gen).to(device)  # (B, 3, H, W)
        with torch.random.fork_rng(devices=[]):  # repeatable weights, and the caller's generator untouched
            torch.manual_seed(0)
            model = models.create(cfg)
        model, x = model.to(device).eval(), inputs[device, size]
        if cfg["channels_last"]:
            model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
        built[variant] = Built(model, x, amp_dtype(cfg["amp"], device))
    return built


def _rounds(built: dict[str, Built], rounds: int, repeats: int) -> dict[str, list]:
    """Each variant's images/s in each round. A round warms every variant, then times their batches in turn
    (A B C A B C ...), so that a neighbour's burst falls on all of them alike; the order rotates every round."""
    names = list(built)
    for b in built.values():  # the process's first forward passes (thread pool, kernels), untimed
        _seconds(b)
    rates: dict[str, list[float]] = {v: [] for v in names}
    for r in range(rounds):
        shift = r % len(names)
        order = names[shift:] + names[:shift]  # a different variant first each round
        for _ in range(WARMUP):
            for variant in order:
                _seconds(built[variant])
        times: dict[str, list[float]] = {v: [] for v in names}
        for _ in range(repeats):
            for variant in order:
                times[variant].append(_seconds(built[variant]))
        for variant in names:
            rates[variant].append(built[variant].x.shape[0] / statistics.median(times[variant]))
    return rates


def measure_throughput(config: dict, out: str | Path, threads: int | None = None) -> dict[str, dict]:
    """Measure every variant of the throughput job's config (``locvit.config.jobs.throughput_config``)
    in one process and write the CSV ``out``.

    ``threads``: torch's CPU threads while it measures (give it every core the job holds).
    Returns what the file holds: variant -> row (see ``locvit.io.read_throughput``).
    """
    cfg, baseline, before = config["analysis"], config["baseline"], torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        built = _build(config)
        rates = _rounds(built, cfg["throughput_rounds"], cfg["profile_repeats"])
        devices = {v: device_name(b.x.device) for v, b in built.items()}  # names the threads in use
    finally:
        torch.set_num_threads(before)

    rows = []
    for variant, rate in rates.items():
        # the ratio per round, against the baseline's images/s of the same round
        ratio = statistics.median(a / b for a, b in zip(rate, rates[baseline])) if baseline else None
        rows.append((variant, statistics.median(rate), min(rate), max(rate), ratio, len(rate), devices[variant]))
    write_throughput(out, rows)
    return read_throughput(out)
