"""What a study costs before it runs: per variant its runs, epochs, images seen, training FLOPs and GPU-hours.

Training FLOPs are 3 x the forward's (backward twice the forward) x 2 FLOPs a multiply-accumulate, the forward
counted on the meta device as the profile step counts it (``locvit.analysis.profile.gmacs``: matmuls and
convolutions), remembered per model, keywords and image size like the model checks (``locvit.config.models``).
GPU-hours divide them by a rate: a GPU visit's measured MFU for the same model where one is
committed (``benchmarks/results/gpu/mfu.json``), else ``ASSUMED_MFU`` of ``PEAK_TFLOPS``, said so.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from locvit import models
from locvit.analysis import profile
from locvit.config.models import model_cache_file
from locvit.config.run import run_config, variant_seeds
from locvit.data.sources import get_source
from locvit.data.splits import split_indices
from locvit.io import remember

#: An H100's dense bf16 peak from its data sheet (TFLOP/s), and the share of it assumed where none was measured.
PEAK_TFLOPS, ASSUMED_MFU = 989.0, 0.3
#: A GPU visit's compiled MFU per model (gpu_node/visit.py's mfu group), where one is committed.
MEASURED = Path("benchmarks") / "results" / "gpu" / "mfu.json"


def measured_mfu(path: Path = MEASURED) -> dict[str, float]:
    """Model name -> MFU (of the data sheet's peak) from a GPU visit's file; empty where there is none."""
    if not path.is_file():
        return {}
    rows = (json.loads(path.read_text()).get("mfu") or {}).get("families") or {}
    return {row["model"]: row["mfu"] for row in rows.values() if row.get("mfu")}


def study_cost(params: dict, measured: dict[str, float] | None = None, train_images: int | None = None) -> list[dict]:
    """One row per variant: runs, epochs, training images per epoch, images seen, training PFLOP and GPU-hours,
    and the rate. Where the source does not know its labels before it is prepared (an image folder), the training
    split's size is ``train_images`` (times a variant's train_fraction), or unknown (None)."""
    measured = measured_mfu() if measured is None else measured
    data = params["data"]
    source = get_source(data["source"], data["root"])
    known = source.known_labels()
    rows = []
    for variant in params["variants"]:
        seeds = variant_seeds(params, variant)
        cfg = run_config(params, variant, seeds[0])
        images = None
        if known is not None:
            labels, fixed_test = known
            split = split_indices(
                labels,
                data["val_fraction"],
                data["test_fraction"],
                data["split_seed"],
                fixed_test,
                cfg["data"]["train_fraction"],
            )
            images = len(split["train"])
        elif train_images is not None:
            images = round(train_images * cfg["data"]["train_fraction"])
        forward = forward_gmacs(cfg, data["image_size"])
        epochs = cfg["train"]["epochs"]
        seen = None if images is None else len(seeds) * epochs * images
        pflop = None if seen is None else 6 * forward * 1e9 * seen / 1e15
        mfu = measured.get(cfg["model"])
        rate = (mfu or ASSUMED_MFU) * PEAK_TFLOPS
        rows.append(
            {
                "variant": variant,
                "model": cfg["model"],
                "runs": len(seeds),
                "epochs": epochs,
                "train_images": images,
                "images_seen": seen,
                "forward_gmacs": forward,
                "pflop": pflop,
                "gpu_hours": None if pflop is None else pflop * 1e3 / rate / 3600,
                "mfu": mfu or ASSUMED_MFU,
                "mfu_measured": mfu is not None,
            }
        )
    return rows


def forward_gmacs(cfg: dict, image_size: int) -> float:
    """GMACs of one forward of ``cfg``'s model, counted on the meta device (shapes only: no memory, no compute)
    and remembered: seconds per ImageNet model, paid again only when the model's or the counter's code changes."""
    path = model_cache_file(
        "forward-gmacs",
        [cfg["model"], cfg["model_kwargs"], image_size],
        list(cfg.get("model_modules", ())),
        [Path(profile.__file__)],
    )
    with contextlib.suppress(OSError, ValueError):
        return float(path.read_text())
    with torch.device("meta"):
        forward = profile.gmacs(models.create(cfg), image_size)
    remember(path, repr(forward))
    return forward


def cost_lines(rows: list[dict]) -> list[str]:
    """The cost table as text (``locvit validate``), a total, and where its rate came from."""

    def num(x, fmt=None):
        if x is None:
            return "?"
        return format(x, fmt or (",.0f" if x >= 100 else ".1f" if x >= 1 else ".2g"))

    head = f"{'variant':<24} {'runs':>4} {'epochs':>6} {'images seen':>14} {'GMACs/img':>9} {'PFLOP':>10} {'GPU-h':>9}"
    lines = [head]
    for r in rows:
        lines.append(
            f"{r['variant']:<24} {r['runs']:>4} {r['epochs']:>6} {num(r['images_seen'], ',d'):>14} "
            f"{r['forward_gmacs']:>9.3g} {num(r['pflop']):>10} {num(r['gpu_hours']):>9}"
        )
    known = [r for r in rows if r["pflop"] is not None]
    lines.append(
        f"{'total':<24} {sum(r['runs'] for r in rows):>4} {'':>6} "
        f"{sum(r['images_seen'] for r in known):>14,d} {'':>9} {num(sum(r['pflop'] for r in known)):>10} "
        f"{num(sum(r['gpu_hours'] for r in known)):>9}"
        + ("" if len(known) == len(rows) else " (the variants with '?' not counted)")
    )
    assumed = [r["variant"] for r in rows if not r["mfu_measured"]]
    lines.append(
        "training FLOPs = 6 x forward MACs x images seen; GPU-hours at "
        + (
            f"an assumed {ASSUMED_MFU:.0%} of {PEAK_TFLOPS:g} TFLOP/s (an H100's bf16 peak)"
            + (f" for {len(assumed)} variant(s) with no measured MFU" if len(assumed) < len(rows) else "")
            if assumed
            else "the MFU a GPU visit measured"
        )
        + (
            "; '?': the training images are counted once the data is prepared (or give --train-images N)"
            if len(known) < len(rows)
            else ""
        )
    )
    return lines
