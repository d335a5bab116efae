"""Twins (Chu et al. 2021, "Twins: Revisiting the Design of Spatial Attention") as a locvit family.

The model is timm's ``Twins`` by name (``twins_svt_*``, MaiT's Table 4; ``twins_pcpvt_*``). Twins-SVT
alternates ``LocallyGroupedAttn`` (inside ``ws x ws`` windows: ``block`` maps, (B * K, H, ws^2, ws^2)) with
``GlobalSubSampleAttn`` (keys from the grid pooled by a stride-``sr`` conv: ``pooled_keys`` maps,
(B, H, N, N / sr^2); ``softmax`` where ``sr`` is 1); PCPVT has only the latter. At 32 x 32 (``CIFAR_32``)
2-pixel patches give stages of 16, 8, 4, 2, which windows of 4, 4, 2, 2 divide; ``window_problems`` names
a window that does not divide its stage's grid (timm pads it) and ``locvit validate`` refuses it.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models.twins import GlobalSubSampleAttn, LocallyGroupedAttn, Twins

from locvit.models.family import (
    BLOCK,
    POOLED,
    SOFTMAX,
    AttentionSite,
    Family,
    SmallBuild,
    exact_reader,
    register_family,
    softmax_map,
)

#: Twins-SVT-S at 32 x 32: a 16 x 16 grid of 2-pixel patches, windows dividing every stage's grid.
CIFAR_32 = dict(img_size=32, patch_size=2, wss=(4, 4, 2, 2))


def read_grouped(attn: LocallyGroupedAttn, x: torch.Tensor, size: tuple[int, int]):
    """Attention inside each ``ws x ws`` window as forward partitions x (B, N, C) on the (H, W) grid:
    (B * K, heads, ws^2, ws^2), window index ``b * K + k`` with k row-major."""
    b, n, c = x.shape
    h, w = size
    ws = attn.ws
    grid = F.pad(x.view(b, h, w, c), (0, 0, 0, (ws - w % ws) % ws, 0, (ws - h % ws) % ws))
    gh, gw = grid.shape[1] // ws, grid.shape[2] // ws
    windows = grid.reshape(b, gh, ws, gw, ws, c).transpose(2, 3).reshape(b, gh * gw, ws * ws, c)
    qkv = attn.qkv(windows).reshape(b, gh * gw, ws * ws, 3, attn.num_heads, -1).permute(3, 0, 1, 4, 2, 5)
    q, k, _ = qkv.unbind(0)  # (B, K, heads, ws^2, hd)
    return "block", softmax_map(q, k, attn.scale).flatten(0, 1)


def read_subsampled(attn: GlobalSubSampleAttn, x: torch.Tensor, size: tuple[int, int]):
    """Each patch's query over the keys of the pooled grid: (B, heads, N, N / sr^2) (``pooled_keys``), or over the
    grid itself where ``sr`` is 1 (``softmax``)."""
    b, n, c = x.shape
    q = attn.q(x).reshape(b, n, attn.num_heads, -1).transpose(1, 2)  # (B, heads, N, hd)
    if attn.sr is not None:
        x = attn.norm(attn.sr(x.transpose(1, 2).reshape(b, c, *size)).flatten(2).transpose(1, 2))
    k = attn.kv(x).reshape(b, -1, 2, attn.num_heads, c // attn.num_heads).permute(2, 0, 3, 1, 4)[0]
    return ("pooled_keys" if attn.sr is not None else "softmax"), softmax_map(q, k, attn.scale)


READERS = {LocallyGroupedAttn: read_grouped, GlobalSubSampleAttn: read_subsampled}


def twins_blocks(model: Twins) -> list[nn.Module]:
    return [block for stage in model.blocks for block in stage]


def _stage_grids(model: Twins) -> list[tuple[int, int]]:
    return [(int(embed.H), int(embed.W)) for embed in model.patch_embeds]


def twins_sites(model: Twins) -> list[AttentionSite]:
    """Per block: a window's grid for locally-grouped attention, the stage's grid for sub-sampled attention."""
    sites = []
    for grid, stage in zip(_stage_grids(model), model.blocks):
        for block in stage:
            attn = block.attn
            own = (attn.ws, attn.ws) if isinstance(attn, LocallyGroupedAttn) else grid
            sites.append(AttentionSite(attn, own, exact_reader(attn, READERS), num_prefix=0))
    return sites


def window_problems(model: Twins) -> list[str]:
    problems = []
    for i, (grid, stage) in enumerate(zip(_stage_grids(model), model.blocks)):
        ws = {b.attn.ws for b in stage if isinstance(b.attn, LocallyGroupedAttn)}
        for w in sorted(ws):
            if grid[0] % w or grid[1] % w:
                problems.append(
                    f"stage {i}: window {w}x{w} does not divide its {grid[0]}x{grid[1]} grid; choose "
                    "kwargs.wss (one window per stage) dividing each stage's grid, or a smaller "
                    "kwargs.patch_size"
                )
    return problems


def _summary(model: Twins) -> dict:
    blocks = twins_blocks(model)
    return {
        "twins": {
            "windows": sorted({int(b.attn.ws) for b in blocks if isinstance(b.attn, LocallyGroupedAttn)}),
            "sr_ratios": [
                next((int(b.attn.sr_ratio) for b in s if isinstance(b.attn, GlobalSubSampleAttn)), None)
                for s in model.blocks
            ],
            "stages": [len(s) for s in model.blocks],
        }
    }


register_family(
    Family(
        "twins",
        "Twins",
        Twins,
        "locally-grouped attention inside windows alternating with "
        "global attention over a pooled grid (Twins-SVT); pooled global attention only (PCPVT)",
        twins_blocks,
        twins_sites,
        options=_summary,
        models=("twins_",),
        kinds=(BLOCK, POOLED, SOFTMAX),
        small=SmallBuild(  # windows that divide every stage's grid
            "twins_svt_small",
            dict(
                img_size=16,
                patch_size=2,
                embed_dims=(16, 32, 32),
                depths=(2, 2, 2),
                num_heads=(1, 2, 2),
                mlp_ratios=(2, 2, 2),
                sr_ratios=(4, 2, 1),
                wss=(4, 2, 2),
            ),
            kinds=("block", "pooled_keys", "block", "pooled_keys", "block", "softmax"),
        ),
        check=window_problems,
    )
)
