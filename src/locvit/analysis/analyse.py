"""The analyse step: attention analyses of trained checkpoints and a profile of the model.

Per seed, one pass over a fixed evaluation batch (the test split's first ``images``) writes ``<seed>.json``
(per layer: kind, heads, grid; ALS (MaiT Eq. 3) and mean attention distance (ViT Fig. 7) per head, per
stage and as one mean, ``als_mean``/``mad_mean``, over ``locality_layers``; cross-layer similarity (MaiT App.
A.3); ``not_run``; ``values`` extras) and ``<seed>.npz`` (the batch, rollout, ``images`` extras). What applies
follows from each map's ``MapKind``; no family is named here; unsigned rows enter as |A| normalised per row.
A CNN gets empty ``layers``; unreadable layers are in ``unread_attention``. The profile is written once per
variant; speed is the throughput job's (``locvit.analysis.throughput``). Fields: docs/analyses.md.
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
    rollout_blocker,
)
from locvit.analysis.profile import profile
from locvit.checkpoint import load_checkpoint
from locvit.data.ffcv_io import read_all, to_model_input
from locvit.data.prepare import check_split, load_manifest, per_checkpoint
from locvit.device import device_for
from locvit.errors import InputError
from locvit.io import atomic_path, remove_temporaries, write_json
from locvit.models.family import family_of, map_kind, neighbourhood_mask


def _row_mass(probs: torch.Tensor, kind: str) -> torch.Tensor:
    """The maps as row distributions: as they are where the kind's rows sum to one, else |A| per row."""
    if map_kind(kind).rows_sum_to_one:
        return probs
    mag = probs.abs()
    return mag / mag.sum(-1, keepdim=True).clamp_min(1e-12)


def _layout(m, images: int) -> tuple[tuple[int, int], int]:
    """A record's full token grid and the step between its group's neighbouring keys (``MapKind.layout``)."""
    kind = map_kind(m.kind)
    return kind.layout(tuple(m.grid), m.probs.shape[0] // images if kind.windows else 1)


def _group_kernel(kernel: tuple[int, int], step: int) -> tuple[int, int]:
    """The kernel in a group's own tokens: they lie ``step`` patches apart, so it reaches ``(k // 2) // step``
    of them each way (all of its k for contiguous windows, only the query itself once the step passes k // 2)."""
    return tuple(2 * ((k // 2) // step) + 1 for k in kernel)


def locality(maps: list, kernel: tuple[int, int], images: int) -> tuple[list, list[int], list | None]:
    """ALS per layer and head (None for layers without a grid), those layers, their similarity.

    The neighbourhood is the kernel around each query on the layer's full grid, so a dilated kind's group
    (``MapKind.dilated``) counts only the keys that lie inside it there."""
    als, layers, stack = [], [], []
    for m in maps:
        if not map_kind(m.kind).spatial:
            als.append(None)
            continue
        probs = _row_mass(m.probs, m.kind)  # (B, H, T, T)
        mask = neighbourhood_mask(tuple(m.grid), _group_kernel(kernel, _layout(m, images)[1]), m.num_prefix)
        als.append(attention_locality_score(probs, mask, m.num_prefix).mean(0).tolist())
        layers.append(m.layer)
        stack.append(probs)
    similarity = None
    if len(stack) > 1 and len({s.shape for s in stack}) == 1:
        per_image = [cross_layer_similarity(torch.stack([s[b] for s in stack])) for b in range(stack[0].shape[0])]
        similarity = torch.stack(per_image).mean(0).tolist()  # (H, L, L)
    return als, layers, similarity


def covered(maps: list, kernel: tuple[int, int], images: int) -> list:
    """Per layer, whether the kernel around any query holds every key of its map (None: no ALS): ALS is then 1
    (less any share of the class token) by construction, whatever the model learned (a window of 2 in 3 x 3)."""
    out = []
    for m in maps:
        if not map_kind(m.kind).spatial:
            out.append(None)
            continue
        step = _layout(m, images)[1]
        out.append(all((side - 1) * step <= k // 2 for side, k in zip(m.grid, kernel)))
    return out


def distances(maps: list, image_size: int, images: int) -> list:
    """Mean attention distance in pixels per layer and head (None for layers without a patch grid).

    Maps over the grid whose keys are its tokens (``MapKind.spatial``) and maps whose keys lie on a
    pooled grid (``keys: pooled``: PVT, Twins; ``locvit.analysis.metrics.pooled_distance``) have one.

    The pixels between neighbouring tokens are the image width over the layer's full grid: the patch size
    for a ViT, more at a pyramid's later levels; a windowed kind's maps (NesT's blocks, Swin's windows) hold
    ``images * K`` groups of one level, whose full grid is ``sqrt(K)`` groups wide, and a dilated kind's
    neighbouring keys lie ``sqrt(K)`` tokens apart on it (``MapKind.layout``).
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
        full, step = _layout(m, images)
        spacing = image_size / full[1] * step  # pixels between a group's neighbouring keys
        out.append(
            mean_attention_distance(_row_mass(m.probs, m.kind), tuple(m.grid), m.num_prefix, spacing).mean(0).tolist()
        )
    return out


def stages(maps: list, images: int) -> list[list[int]]:
    """The layers of each stage, in forward order: a stage is the layers whose full token grid is one size
    (one stage for a ViT; a pyramid's levels, PVT's and Swin's stages)."""
    grids: dict[tuple[int, int], list[int]] = {}
    for m in maps:
        grids.setdefault(_layout(m, images)[0], []).append(m.layer)
    return list(grids.values())


def headline_layers(als: list, mad: list, trivial: list) -> list[int]:
    """The layers whose ALS and distance a study's one number per run averages, the same for both: those with
    an ALS that the kernel does not make 1 by construction; else those with an ALS (all by construction);
    else those with a distance (keys on a pooled grid only)."""
    measured = [i for i, a in enumerate(als) if a is not None and not trivial[i]]
    return (
        measured or [i for i, a in enumerate(als) if a is not None] or [i for i, d in enumerate(mad) if d is not None]
    )


def not_run(maps: list, similarity, als_layers: list[int]) -> dict[str, str]:
    """The analyses over all layers that could not run on these maps, each with why (the report says so)."""
    why = {}
    if similarity is None and len(als_layers) > 1:
        shapes = sorted({"x".join(map(str, maps[i].probs.shape)) for i in als_layers})
        why["cross_layer_similarity"] = f"its layers' maps differ in shape ({', '.join(shapes)})"
    elif similarity is None and maps:
        why["cross_layer_similarity"] = f"{len(als_layers) or 'no'} layer(s) with maps over the patch grid"
    blocker = rollout_blocker(maps)
    if blocker and maps:
        why["rollout"] = blocker
    return why


def measures(maps: list, kernel: tuple[int, int], image_size: int, images: int) -> dict:
    """The locality entries of a seed's analysis file (module docstring): per layer, per stage, one headline
    mean of ALS and distance over the same layers, the similarity, and what could not run."""
    als, als_layers, similarity = locality(maps, kernel, images)
    mad = distances(maps, image_size, images)
    trivial = covered(maps, kernel, images)
    headline = headline_layers(als, mad, trivial)
    return {
        "als": als,
        "als_layers": als_layers,
        "als_by_construction": trivial,
        "mad": mad,
        "stages": [
            {
                "layers": layers,
                "grid": list(_layout(maps[layers[0]], images)[0]),
                "als_mean": _mean([als[i] for i in layers]),
                "mad_mean": _mean([mad[i] for i in layers]),
                "als_by_construction": _by_construction(layers, als, trivial),
            }
            for layers in stages(maps, images)
        ],
        "locality_layers": headline,
        "als_mean": _mean([als[i] for i in headline]),
        "als_mean_by_construction": _by_construction(headline, als, trivial),
        "mad_mean": _mean([mad[i] for i in headline]),
        "cross_layer_similarity": similarity,
        "not_run": not_run(maps, similarity, als_layers),
    }


def _mean(per_layer: list) -> float | None:
    values = [v for heads in per_layer if heads is not None for v in heads]
    return float(np.mean(values)) if values else None


def _by_construction(layers: list[int], als: list, trivial: list) -> bool:
    """Whether these layers have an ALS and every one of them is 1 by construction (``covered``)."""
    flags = [trivial[i] for i in layers if als[i] is not None]
    return bool(flags) and all(flags)


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
    data: Path | list[Path],
    manifest_path: Path | list[Path],
    images: int = 16,
    als_kernel: tuple[int, int] = (3, 3),
    profile_out: Path | None = None,
    threads: int | None = None,
) -> list[dict]:
    """Analyse each checkpoint (see the module docstring) on the first images of ``data``'s test split (one
    file, or one per checkpoint: a split per seed); return the per-seed records."""
    if not len(checkpoints) == len(out_json) == len(out_npz):
        raise InputError(
            f"{len(checkpoints)} checkpoint(s), {len(out_json)} JSON and {len(out_npz)} npz "
            "output(s): give one of each per checkpoint"
        )
    remove_temporaries(*out_json, *out_npz, *([profile_out] if profile_out else []))  # a killed run's
    data, manifests = per_checkpoint(checkpoints, data, manifest_path)
    loaded = {path: load_manifest(path, {"test": test}) for path, test in zip(manifests, data)}
    for path, manifest in loaded.items():
        if images > manifest["splits"]["test"]["size"]:  # never fewer images than the config says, silently
            raise InputError(
                f"analysis.images: {images} is more than the {manifest['splits']['test']['size']} images of "
                f"the test split ({path}); use at most that many"
            )
    states = [load_checkpoint(c) for c in checkpoints]  # fail on a bad file before any work
    for state, path in zip(states, manifests):
        check_split(state["config"], loaded[path], path)
    batches = {test: read_all(test, limit=images, jit=False)[0] for test in dict.fromkeys(data)}  # (B, H, W, 3)
    if threads:
        torch.set_num_threads(threads)  # after the loader: FFCV's Loader resets torch's thread count
    records = []
    for i, (state, json_path, npz_path, test) in enumerate(zip(states, out_json, out_npz, data)):
        batch = batches[test]
        cfg = state["config"]
        device = device_for(cfg["train"]["device"])
        model = models.load(state, device)
        x = to_model_input(torch.from_numpy(batch).permute(0, 3, 1, 2).to(device), *models.normalisation(model))
        _, maps = collect_attention(model, x)
        image_size = int(cfg["model_kwargs"]["img_size"])
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
            **measures(maps, tuple(als_kernel), image_size, len(batch)),
            "unread_attention": family_of(model).unread(model),
            **values,
        }
        arrays = {"images": batch, **extras}
        if rollout_blocker(maps) is None:
            arrays["rollout"] = attention_rollout(maps).float().numpy()
        _save_npz(npz_path, arrays)
        write_json(json_path, record)
        records.append(record)
        if i == 0 and profile_out is not None:
            write_json(profile_out, {"variant": cfg["variant"], "model": cfg["model"], **profile(model, image_size)})
    return records
