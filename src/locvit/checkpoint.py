"""Checkpoints: written atomically, read with ``torch.load(weights_only=True)``, checked by a digest.

A checkpoint is a plain dict of tensors and Python primitives, so loading never runs code from the file. Each
records ``content_digest`` of its content (``content_sha256``), checked on reading: a truncated or flipped file
fails to load or differs, and ``load_checkpoint`` names the file and how to rebuild it. A run's checkpoint
records its model's code (``model_code``): loaded after that code changed, it stops naming the changed
modules unless ``allow_code_change=True``; a checkpoint without the key loads as before.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import torch

from locvit.errors import InputError, MissingFileError
from locvit.io import atomic_path
from locvit.model_modules import NOT_FOUND, bytes_digest, module_digests, module_files, user_code

#: The key under which a checkpoint records its own ``content_digest``.
DIGEST_KEY = "content_sha256"
#: The key under which a run's checkpoint records its model's code (``model_code``).
CODE_KEY = "model_code"


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically with its ``content_digest``, and, for a run's checkpoint
    (it holds the run ``config``), its ``model_code``."""
    if isinstance(state.get("config"), dict) and "model" in state["config"] and CODE_KEY not in state:
        state = {**state, CODE_KEY: model_code(state["config"])}
    with atomic_path(path) as tmp:
        torch.save({**state, DIGEST_KEY: content_digest(state)}, tmp)


def model_code(cfg: dict, legacy: bool = False) -> dict[str, str]:
    """``{module: source_digest}`` of the code that defines a run config's model: the module that registered
    it with timm where that is locvit's (a family file) or a user's, with the user's modules it imports
    (``locvit.model_modules.module_digests``). The modules of locvit's that a family file imports are not
    followed (a job's code digest covers them, and so re-runs the job); timm's own models record none of timm
    (an installed package), and no other ``model_modules`` of the study count.

    ``legacy``: as locvit before 29/34 wrote it (every ``model_modules`` entry, each file by its bytes), so a
    run trained then is still recognised (``locvit.train.state.run_key``'s ``legacy``)."""
    modules = list(cfg.get("model_modules", ())) if legacy else []
    timm = sys.modules.get("timm")  # the model was built in this process, so its module is imported
    if timm is not None and timm.is_model(cfg["model"]):
        entry = sys.modules.get(timm.models.model_entrypoint(cfg["model"]).__module__)
        if (
            entry is not None
            and getattr(entry, "__file__", None)
            and (entry.__name__.split(".")[0] == "locvit" or user_code(entry.__name__, Path(entry.__file__)))
        ):
            modules.append(entry.__name__)
    if legacy:
        return {name: bytes_digest(path) if path else NOT_FOUND for name, path in module_files(modules).items()}
    return module_digests(modules)


def changed_code(recorded: dict[str, str]) -> list[str]:
    """The modules of a checkpoint's ``model_code`` whose code is not what it was (``name (missing)`` for one
    that is gone), found as a job would import them now. A digest of the file's bytes (written before 29/34)
    matches its file unchanged."""
    now, files = module_digests(recorded), module_files(recorded)
    return [
        name if now[name] != NOT_FOUND else f"{name} ({NOT_FOUND})"
        for name in sorted(recorded)
        if now[name] != recorded[name] and not (files[name] and bytes_digest(files[name]) == recorded[name])
    ]


def rebuild_hint(path: str | Path) -> str:
    """How to make a checkpoint again: re-run the job that wrote it (and what depends on it)."""
    return (
        f"Rebuild it: snakemake --cores all --forcerun {path} (re-runs its training job and the steps after "
        f"it), or dvc repro --force train@<its variant>."
    )


def load_checkpoint(
    path: str | Path, map_location: str | torch.device = "cpu", fix: str | None = None, allow_code_change: bool = False
) -> dict[str, Any]:
    """Read a checkpoint and check its recorded digest; a missing, corrupt or unchecked file raises.

    A checkpoint whose model's code changed since it was written (its ``model_code``, ``changed_code``)
    raises too, naming the modules, unless ``allow_code_change``; one written before checkpoints recorded
    their model's code (no ``model_code``) loads as before, unchecked. The error names the file and ``fix``
    (default ``rebuild_hint``). What it gives back is what ``save_checkpoint`` was given.
    """
    path = Path(path)
    fix = fix or rebuild_hint(path)
    if not path.is_file():
        raise MissingFileError(f"checkpoint {path} does not exist. {fix}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:
        raise InputError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); it is truncated or corrupt. {fix}"
        ) from err
    recorded = state.pop(DIGEST_KEY, None) if isinstance(state, dict) else None
    if recorded is None:
        raise InputError(
            f"checkpoint {path} records no content digest (not written by this version of locvit's "
            f"save_checkpoint), so it cannot be checked. {fix}"
        )
    if recorded != content_digest(state):
        raise InputError(
            f"checkpoint {path} is corrupt: what it holds does not match the digest recorded when it was written. {fix}"
        )
    recorded_code = state.pop(CODE_KEY, None) or {}  # like the digest, a record of the file's: not given back
    changed = [] if allow_code_change else changed_code(recorded_code)
    if changed:
        raise InputError(
            f"checkpoint {path} was trained with other model code: {', '.join(changed)} changed since "
            f"it was written, so its weights would load into a different model. {fix} Or put that code "
            "back; or, where the change computes the same (locvit status --check), keep the run with locvit "
            "accept; or load it anyway with load_checkpoint(..., allow_code_change=True)."
        )
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
