"""The analyse step: attention analyses of trained checkpoints and a profile of the model.

For each checkpoint (the seeds of one variant) it runs the model once on a fixed
evaluation batch (the first ``images`` of the test split, in order, as the model sees
them in evaluation) and writes

* ``<seed>.json``: every attention layer (kind, heads, tokens, patch grid), the
  Attention Locality Score of every head of every layer that has a patch grid (MaiT
  Eq. 3, over the ``als_kernel`` neighbourhood, mean over the batch), the mean attention
  distance in pixels of the same heads (ViT Fig. 7), their means over layers and heads
  (``als_mean``, ``mad_mean``: DVC metrics), the cross-layer similarity of those layers
  when they share one token count (MaiT App. A.3), and the family's ``values`` extras
  (:class:`locvit.models.family.Extra`: MaiT's soft-mask ``alphas``), each under its name;
* ``<seed>.npz``: the batch (uint8, H x W x 3), the class-token attention rollout for
  models whose layers follow a class token over one grid, and the family's ``images``
  extras (IBiT's ``learned_masks`` around the centre patch). An extra the model has none of
  (MaiT with hard masks) is left out of both.

Everything comes from the model's family (:mod:`locvit.models.family`): no family is named
here. What applies to a layer follows from its map kind's declared properties
(:class:`locvit.models.family.MapKind`): ALS and distance to token-by-token maps over the patch
grid whose keys are the queries' tokens, distance also to maps whose keys lie on a pooled grid;
maps whose rows do not sum to one (IBiT's Frobenius-normalised maps, CaiT's talking-heads maps)
enter as |A| normalised per row. A model without attention layers (a CNN) gets an empty
``layers`` list and null ALS and distance; attention layers that no reader knows are named in
``unread_attention``.

The profile (params, GMACs, the model's facts) is written once per variant, from the
first checkpoint. The report step reads all three files. Speed is not measured here, beside
other jobs, but by the study's one throughput job (:mod:`locvit.analysis.throughput`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from locvit import models
from locvit.analysis.attention import collect_attention
from locvit.analysis.metrics import (
    attention_locality_score,
    attention_rollout,
    cross_layer_similarity,
    mean_attention_distance,
    pooled_distance,
    rollout_applies,
)
from locvit.analysis.profile import profile
from locvit.checkpoint import load_checkpoint
from locvit.data.ffcv_io import read_all, to_model_input
from locvit.data.prepare import load_manifest
from locvit.device import device_for
from locvit.errors import InputError
from locvit.io import atomic_path, remove_temporaries, write_json
from locvit.models.family import family_of, map_kind
from locvit.neighbourhood import neighbourhood_mask


def _row_mass(probs: torch.Tensor, kind: str) -> torch.Tensor:
    """The maps as row distributions: as they are where the kind's rows sum to one, else |A| per row."""
    if map_kind(kind).rows_sum_to_one:
        return probs
    mag = probs.abs()
    return mag / mag.sum(-1, keepdim=True).clamp_min(1e-12)


def locality(maps: list, kernel: tuple[int, int]) -> tuple[list, list[int], list | None]:
    """ALS per layer and head (None for layers without a grid), those layers, their similarity."""
    als, layers, stack = [], [], []
    for m in maps:
        if not map_kind(m.kind).spatial:
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


def distances(maps: list, image_size: int, images: int) -> list:
    """Mean attention distance in pixels per layer and head (None for layers without a patch grid).

    Maps over the grid whose keys are its tokens (:attr:`MapKind.spatial`) and maps whose keys lie on a
    pooled grid (``keys: pooled``: PVT, Twins; :func:`locvit.analysis.metrics.pooled_distance`) have one.

    The pixels between neighbouring tokens are the image width over the layer's full grid:
    the patch size for a ViT, more at a pyramid's later levels; a windowed kind's maps (NesT's
    blocks, Swin's windows) hold ``images * K`` windows of one level, whose full grid is ``sqrt(K)``
    windows wide.
    """
    out = []
    for m in maps:
        kind = map_kind(m.kind)
        if kind.grid and kind.keys == "pooled" and m.num_prefix == 0:  # PVT's, Twins' keys: pooled cells
            out.append(
                pooled_distance(_row_mass(m.probs, m.kind), tuple(m.grid), image_size / m.grid[1]).mean(0).tolist()
            )
            continue
        if not kind.spatial:
            out.append(None)
            continue
        blocks = m.probs.shape[0] // images if kind.windows else 1  # NesT's blocks, Swin's windows per image
        spacing = image_size / (m.grid[1] * blocks**0.5)
        out.append(
            mean_attention_distance(_row_mass(m.probs, m.kind), tuple(m.grid), m.num_prefix, spacing).mean(0).tolist()
        )
    return out


def _mean(per_layer: list) -> float | None:
    values = [v for heads in per_layer if heads is not None for v in heads]
    return float(np.mean(values)) if values else None


def _extras(model: torch.nn.Module) -> tuple[dict, dict[str, np.ndarray]]:
    """The family's declared extras of ``model``: JSON values by name, arrays for the npz by name."""
    values, arrays = {}, {}
    for extra in family_of(model).extras:
        found = extra.read(model)
        if found is None:
            continue
        found = np.asarray(found.numpy() if isinstance(found, torch.Tensor) else found, dtype=np.float32)
        if extra.shape == "values":  # (L, H); NaN (a head without one) is JSON's null
            values[extra.name] = [[None if np.isnan(a) else float(a) for a in row] for row in found]
        else:
            arrays[extra.name] = found  # (L, H, gh, gw)
    return values, arrays


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez_compressed(f, **arrays)


def analyse_checkpoints(
    checkpoints: list[Path],
    out_json: list[Path],
    out_npz: list[Path],
    data: Path,
    manifest_path: Path,
    images: int = 16,
    als_kernel: tuple[int, int] = (3, 3),
    profile_out: Path | None = None,
    threads: int | None = None,
) -> list[dict]:
    """Analyse each checkpoint (see the module docstring); return the per-seed records."""
    if not len(checkpoints) == len(out_json) == len(out_npz):
        raise InputError(
            f"{len(checkpoints)} checkpoint(s), {len(out_json)} JSON and {len(out_npz)} npz "
            "output(s): give one of each per checkpoint"
        )
    remove_temporaries(*out_json, *out_npz, *([profile_out] if profile_out else []))  # a killed run's
    manifest = load_manifest(manifest_path, {"test": data})
    if images > manifest["splits"]["test"]["size"]:  # never fewer images than the config says, silently
        raise InputError(
            f"analysis.images: {images} is more than the {manifest['splits']['test']['size']} images of "
            f"the test split ({manifest_path}); use at most that many"
        )
    states = [load_checkpoint(c) for c in checkpoints]  # fail on a bad file before any work
    batch, _ = read_all(data, limit=images, jit=False)  # (B, H, W, 3) uint8
    if threads:
        torch.set_num_threads(threads)  # after the loader: FFCV's Loader resets torch's thread count
    records = []
    for i, (state, json_path, npz_path) in enumerate(zip(states, out_json, out_npz)):
        cfg = state["config"]
        device = device_for(cfg["train"]["device"])
        model = models.load(state, device)
        x = to_model_input(torch.from_numpy(batch).permute(0, 3, 1, 2).to(device), *models.normalisation(model))
        _, maps = collect_attention(model, x)
        image_size = int(cfg["model_kwargs"]["img_size"])
        als, als_layers, similarity = locality(maps, tuple(als_kernel))
        mad = distances(maps, image_size, len(batch))
        values, extras = _extras(model)
        record = {
            "variant": cfg["variant"],
            "seed": cfg["seed"],
            "model": cfg["model"],
            "mlflow_run_id": state["mlflow_run_id"],
            "images": int(len(batch)),
            "als_kernel": list(als_kernel),
            "layers": [
                {
                    "name": m.name,
                    "layer": m.layer,
                    "kind": m.kind,
                    "heads": int(m.probs.shape[1]),
                    "tokens": int(m.probs.shape[-1]),
                    "grid": list(m.grid),
                    "num_prefix": m.num_prefix,
                }
                for m in maps
            ],
            "als": als,
            "als_layers": als_layers,
            "als_mean": _mean(als),
            "mad": mad,
            "mad_mean": _mean(mad),
            "cross_layer_similarity": similarity,
            "unread_attention": family_of(model).unread(model),
            **values,
        }
        arrays = {"images": batch, **extras}
        if rollout_applies(maps):
            arrays["rollout"] = attention_rollout(maps).float().numpy()
        _save_npz(npz_path, arrays)
        write_json(json_path, record)
        records.append(record)
        if i == 0 and profile_out is not None:
            write_json(profile_out, {"variant": cfg["variant"], "model": cfg["model"], **profile(model, image_size)})
    return records
