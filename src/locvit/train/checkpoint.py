"""Checkpoints: written atomically, read with ``torch.load(weights_only=True)``.

A checkpoint is a plain dict of tensors and Python primitives (no pickled objects),
so loading one never executes code from the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
