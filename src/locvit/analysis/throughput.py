"""Inference throughput of a study's variants, measured side by side and alone.

Why: images/s measured by each variant's own analyse job measured its neighbours as well.
Those jobs share the machine's cores with training and with each other, so a variant's
number depended on what happened to run beside it (a hard-masked MaiT, strictly more work
than DeiT, came out faster). Here one process builds every variant and times them in turns,
and the ``throughput`` job that calls it runs alone: on one machine it takes every core
after all training; on a cluster, a node of its own.

The choices:

* **Random weights, inference only** (eval mode, no autograd): speed does not depend on the
  weights, so the job needs no checkpoint. Each variant is built from its entry in the job's
  config (:func:`locvit.config.jobs.throughput_config`: model, keyword arguments at the study's
  image size and class count, its run's device, precision and memory format) by
  :func:`locvit.models.create`, and timed under its run's precision (``train.amp``: bf16 autocast,
  TF32 on CUDA; :func:`locvit.device.set_backends`) and memory format (``train.channels_last``), cuDNN's
  autotuner on (the batch's shape is fixed).
* **Alternating rounds**: ``analysis.throughput_rounds`` rounds (at least 3), and each round
  times every variant once. The order is rotated by one place every round, so no variant
  always runs first. A slow spell of the machine then lands on one round of every variant
  instead of on all rounds of one.
* **Within a round**: ``WARMUP`` untimed batches (allocator, caches, lazy buffers; before the
  first round every variant also runs once untimed, for the process's own first passes), then
  ``analysis.profile_repeats`` timed batches of ``analysis.profile_batch`` random images;
  the round's images/s is the batch size over the median batch time.
* **Per variant**: the median over rounds, its low and high (min and max over rounds, the
  spread to read a difference against), and ``ratio_vs_baseline``: the median over rounds of
  the variant's images/s over the baseline's *in the same round* (the pairs ran moments
  apart, so the ratio cancels what the rounds share); empty when the study has no baseline.

The CSV (:data:`locvit.io.THROUGHPUT_COLUMNS`, one row per variant in the study's order) is
read back by :func:`locvit.io.read_throughput`, which needs no torch.
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


def _images_per_s(model: torch.nn.Module, x: torch.Tensor, repeats: int, dtype: torch.dtype | None = None) -> float:
    """One round's images/s of ``model`` on the batch ``x`` under autocast to ``dtype`` (see the module docstring)."""
    times = []
    set_backends(x.device, dtype)  # per variant: TF32 follows its amp
    with torch.no_grad(), torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        for i in range(WARMUP + repeats):
            _sync(x.device)
            start = time.perf_counter()
            model(x)
            _sync(x.device)
            if i >= WARMUP:
                times.append(time.perf_counter() - start)
    return x.shape[0] / statistics.median(times)


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
    """Each variant's images/s in each round, the order rotated by one every round."""
    names = list(built)
    for b in built.values():  # the process's first forward passes (thread pool, kernels), untimed
        _images_per_s(b.model, b.x, 1, b.dtype)
    rates: dict[str, list[float]] = {v: [] for v in names}
    for r in range(rounds):
        shift = r % len(names)
        for variant in names[shift:] + names[:shift]:  # a different variant first each round
            b = built[variant]
            rates[variant].append(_images_per_s(b.model, b.x, repeats, b.dtype))
    return rates


def measure_throughput(config: dict, out: str | Path, threads: int | None = None) -> dict[str, dict]:
    """Measure every variant of the throughput job's config (:func:`locvit.config.jobs.throughput_config`)
    in one process and write the CSV ``out``.

    ``threads``: torch's CPU threads while it measures (give it every core the job holds).
    Returns what the file holds: variant -> row (see :func:`locvit.io.read_throughput`).
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
