"""Checkpoints: written atomically, read with ``torch.load(weights_only=True)``, checked by a digest.

A checkpoint is a plain dict of tensors and Python primitives (no pickled objects),
so loading one never executes code from the file (the generators' states in last.pt
are saved as tensors and lists too).

Each file records :func:`content_digest` of what it holds (key ``content_sha256``),
computed when it is written and checked when it is read: a truncated or bit-flipped
file either fails to load or loads into something whose digest differs, and
either way :func:`load_checkpoint` names the file and how to rebuild it. (A flip in
bytes that carry no content, e.g. zip padding, loads exactly what was written.)
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

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


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu",
                    fix: str | None = None) -> dict[str, Any]:
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
