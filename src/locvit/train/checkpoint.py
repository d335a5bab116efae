"""Checkpoints: written atomically, read with ``torch.load(weights_only=True)``.

A checkpoint is a plain dict of tensors and Python primitives (no pickled objects),
so loading one never executes code from the file. That holds for the random number
generators' states too: :func:`rng_state` turns them into tensors and lists.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from locvit.io import atomic_path


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    fix = "Re-run its training step (snakemake --cores all <that file> or dvc repro train@<variant>)."
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist. {fix}")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        raise ValueError(f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); "
                         f"it is truncated or corrupt. {fix}") from err


def build_from_checkpoint(state: dict[str, Any]) -> torch.nn.Module:
    """Rebuild the model a checkpoint was trained as and load its weights."""
    import timm

    import locvit.models  # noqa: F401  registers locvit's families

    cfg = state["config"]
    model = timm.create_model(cfg["model"], pretrained=False, **cfg["model_kwargs"])
    model.load_state_dict(state["model"])
    return model


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
        "numpy": {"mt": torch.from_numpy(mt.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Put back what :func:`rng_state` saved."""
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    np_state = state["numpy"]
    np.random.set_state(("MT19937", np_state["mt"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def weights_digest(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a state dict's names, dtypes, shapes and bytes: equal digests, bitwise-equal weights."""
    digest = hashlib.sha256()
    for name, t in state_dict.items():
        t = t.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # bytes, whatever the dtype (bf16 too)
    return digest.hexdigest()
