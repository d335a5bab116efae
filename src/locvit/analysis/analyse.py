"""The analyse step: attention analyses of trained checkpoints and a profile of the model.

For each checkpoint (the seeds of one variant) it runs the model once on a fixed
evaluation batch (the first ``images`` of the test split, in order, as the model sees
them in evaluation) and writes

* ``<seed>.json``: every attention layer (kind, heads, tokens, patch grid), the
  Attention Locality Score of every head of every layer that has a patch grid (MaiT
  Eq. 3, over the ``als_kernel`` neighbourhood, mean over the batch), the cross-layer
  similarity of those layers when they share one token count (MaiT App. A.3), and the
  soft-mask alphas of a MaiT model with soft masks;
* ``<seed>.npz``: the batch (uint8, H x W x 3), the class-token attention rollout for
  models with a class token, and IBiT's learned masks around the centre patch.

ALS of maps that are not row-stochastic (IBiT's Frobenius-normalised maps, CaiT's
talking-heads maps) is taken over |A| normalised per row: the share of attention magnitude inside the neighbourhood.
The profile (params, GMACs, images/s on this machine, the model's facts) is written
once per variant, from the first checkpoint. The report step reads all three files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from locvit.analysis import (ROW_STOCHASTIC, attention_locality_score, attention_rollout, collect_attention, cross_layer_similarity,
                             learned_masks, neighbourhood_mask, soft_mask_alphas)
from locvit.analysis.profile import describe, profile
from locvit.data.ffcv_io import read_all, to_model_input
from locvit.data.prepare import load_manifest
from locvit.io import atomic_path, remove_temporaries, write_json
from locvit.train.checkpoint import build_from_checkpoint, load_checkpoint
from locvit.train.loop import normalisation, resolve_device

# Kinds of square token-by-token maps over a patch grid: ALS and similarity apply.
GRID_KINDS = ("softmax", "frobenius", "talking", "gpsa", "block")
# Models without a class token: no class-token rollout.
NO_CLASS_TOKEN = ("lsa", "nest")


def _row_mass(probs: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ROW_STOCHASTIC:
        return probs
    mag = probs.abs()
    return mag / mag.sum(-1, keepdim=True).clamp_min(1e-12)


def locality(maps: list, kernel: tuple[int, int]) -> tuple[list, list[int], list | None]:
    """ALS per layer and head (None for layers without a grid), those layers, their similarity."""
    als, layers, stack = [], [], []
    for m in maps:
        square = m.probs.shape[-1] == m.probs.shape[-2]
        if m.kind not in GRID_KINDS or not square:
            als.append(None)
            continue
        probs = _row_mass(m.probs, m.kind)  # (B, H, T, T)
        mask = neighbourhood_mask(tuple(m.grid), kernel, m.num_prefix)
        als.append(attention_locality_score(probs, mask, m.num_prefix).mean(0).tolist())
        layers.append(m.layer)
        stack.append(probs)
    similarity = None
    if len(stack) > 1 and len({s.shape for s in stack}) == 1:
        per_image = [cross_layer_similarity(torch.stack([s[b] for s in stack])) for b in range(stack[0].shape[0])]
        similarity = torch.stack(per_image).mean(0).tolist()  # (H, L, L)
    return als, layers, similarity


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)


def analyse_checkpoints(checkpoints: list[Path], out_json: list[Path], out_npz: list[Path], data: Path,
                        manifest_path: Path, images: int = 16, als_kernel: tuple[int, int] = (3, 3),
                        profile_out: Path | None = None, profile_batch: int = 32, profile_repeats: int = 5,
                        threads: int | None = None) -> list[dict]:
    """Analyse each checkpoint (see the module docstring); return the per-seed records."""
    if not len(checkpoints) == len(out_json) == len(out_npz):
        raise ValueError(f"{len(checkpoints)} checkpoint(s), {len(out_json)} JSON and {len(out_npz)} npz "
                         "output(s): give one of each per checkpoint")
    remove_temporaries(*out_json, *out_npz, *([profile_out] if profile_out else []))  # a killed run's
    load_manifest(manifest_path, {"test": data})
    states = [load_checkpoint(c) for c in checkpoints]  # fail on a bad file before any work
    batch, _ = read_all(data, limit=images, jit=False)  # (B, H, W, 3) uint8
    if threads:
        torch.set_num_threads(threads)  # after the loader: FFCV's Loader resets torch's thread count
    records = []
    for i, (state, json_path, npz_path) in enumerate(zip(states, out_json, out_npz)):
        cfg = state["config"]
        device = resolve_device(cfg["train"]["device"])  # the profile's images/s are this device's
        model = build_from_checkpoint(state).to(device).eval()
        x = to_model_input(torch.from_numpy(batch).permute(0, 3, 1, 2).to(device), *normalisation(model))
        _, maps = collect_attention(model, x)
        arch = describe(model)
        als, als_layers, similarity = locality(maps, tuple(als_kernel))
        alphas = None
        if arch["mask"] and arch["mask"]["type"] == "soft":
            alphas = [[None if np.isnan(a) else a for a in row] for row in soft_mask_alphas(model).tolist()]
        record = {
            "variant": cfg["variant"], "seed": cfg["seed"], "model": cfg["model"],
            "mlflow_run_id": state["mlflow_run_id"], "images": int(len(batch)), "als_kernel": list(als_kernel),
            "layers": [{"name": m.name, "layer": m.layer, "kind": m.kind, "heads": int(m.probs.shape[1]),
                        "tokens": int(m.probs.shape[-1]), "grid": list(m.grid),
                        "num_prefix": m.num_prefix} for m in maps],
            "als": als, "als_layers": als_layers, "cross_layer_similarity": similarity, "alphas": alphas,
        }
        arrays = {"images": batch}
        if arch["family"] not in NO_CLASS_TOKEN:
            arrays["rollout"] = attention_rollout(maps).float().numpy()
        if arch["family"] == "ibit":
            arrays["learned_masks"] = learned_masks(model).float().numpy()
        _save_npz(npz_path, arrays)
        write_json(json_path, record)
        records.append(record)
        if i == 0 and profile_out is not None:
            image_size = int(cfg["model_kwargs"]["img_size"])
            write_json(profile_out, {"variant": cfg["variant"], "model": cfg["model"],
                                     **profile(model, image_size, profile_batch, profile_repeats)})
    return records
