"""Checkpoints: written atomically, read with ``torch.load(weights_only=True)``, checked by a digest.

A checkpoint is a plain dict of tensors and Python primitives (no pickled objects),
so loading one never executes code from the file. That holds for the random number
generators' states too: :func:`rng_state` turns them into tensors and lists.

Each file records :func:`content_digest` of what it holds (key ``content_sha256``),
computed when it is written and checked when it is read: a truncated or bit-flipped
file either fails to load or loads into something whose digest differs, and
either way :func:`load_checkpoint` names the file and how to rebuild it. (A flip in
bytes that carry no content, e.g. zip padding, loads exactly what was written.)
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from locvit.errors import InputError, MissingFileError
from locvit.io import atomic_path


#: The key under which a checkpoint records its own :func:`content_digest`.
DIGEST_KEY = "content_sha256"


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save({**state, DIGEST_KEY: content_digest(state)}, tmp)


def rebuild_hint(path: str | Path) -> str:
    """How to make a checkpoint again: re-run the job that wrote it (and what depends on it)."""
    return (f"Rebuild it: snakemake --cores all --forcerun {path} (re-runs its training job and the steps after "
            f"it), or dvc repro --force train@<its variant>.")


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu", fix: str | None = None) -> dict[str, Any]:
    """Read a checkpoint and check its recorded digest; a missing, corrupt or unchecked file raises.

    The error names the file and ``fix`` (default :func:`rebuild_hint`).
    """
    path = Path(path)
    fix = fix or rebuild_hint(path)
    if not path.is_file():
        raise MissingFileError(f"checkpoint {path} does not exist. {fix}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        raise InputError(f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); "
                         f"it is truncated or corrupt. {fix}") from err
    recorded = state.pop(DIGEST_KEY, None) if isinstance(state, dict) else None
    if recorded is None:
        raise InputError(f"checkpoint {path} records no content digest (not written by this version of locvit's "
                         f"save_checkpoint), so it cannot be checked. {fix}")
    if recorded != content_digest(state):
        raise InputError(f"checkpoint {path} is corrupt: what it holds does not match the digest recorded when it "
                         f"was written. {fix}")
    return state


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


def _feed_tensor(digest, t: torch.Tensor) -> None:
    t = t.detach().cpu().contiguous()
    digest.update(f"{t.dtype}|{tuple(t.shape)}|".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # bytes, whatever the dtype (bf16 too)


def weights_digest(state_dict: dict[str, torch.Tensor]) -> str:
    """SHA-256 of a state dict's names, dtypes, shapes and bytes: equal digests, bitwise-equal weights."""
    digest = hashlib.sha256()
    for name, t in state_dict.items():
        digest.update(f"{name}|".encode())
        _feed_tensor(digest, t)
    return digest.hexdigest()


def content_digest(obj: Any) -> str:
    """SHA-256 of a checkpoint's contents: every key and value, in order, with its type.

    Tensors count with their dtype, shape and bytes; dicts, lists and tuples element by
    element; anything else (the primitives ``weights_only`` admits) by type and ``repr``.
    ``torch.load`` gives back dicts in the order they were saved, so the digest of a
    loaded checkpoint equals the digest of what was saved if and only if nothing changed.
    """
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            digest.update(b"T")
            _feed_tensor(digest, value)
        elif isinstance(value, dict):
            digest.update(f"D{len(value)}|".encode())
            for key, item in value.items():
                feed(key)
                feed(item)
        elif isinstance(value, (list, tuple)):
            digest.update(f"{type(value).__name__}{len(value)}|".encode())
            for item in value:
                feed(item)
        else:
            digest.update(f"{type(value).__name__}:{value!r}|".encode())

    feed(obj)
    return digest.hexdigest()
