"""The random number generators a training step draws from: seeded, saved into last.pt, put back.

A checkpoint holds plain tensors and lists only (:mod:`locvit.checkpoint`): :func:`rng_state`
turns the generators' states into those.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # CUDA's generators too


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every generator a training step draws from, as tensors and plain types (``weights_only``-safe).

    Python's ``random``, numpy's global generator (FFCV's uncompiled augmentations and
    timm's MixUp/CutMix draw from it), torch's CPU generator and, on CUDA, the device's.
    """
    version, keys, gauss = random.getstate()  # (3, 625 ints, None or float)
    _, mt, pos, has_gauss, cached = np.random.get_state()  # ('MT19937', uint32 (624,), int, int, float)
    return {
        "python": [version, list(keys), gauss],
        "numpy": {
            "mt": torch.from_numpy(mt.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Put back what :func:`rng_state` saved."""
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    np_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            np_state["mt"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)
