"""Swin Transformer (Liu et al. 2021, "Hierarchical Vision Transformer using Shifted Windows") as a locvit family.

The model is timm's ``SwinTransformer`` by name (LSA's Table 3, MaiT's Table 4). Its ``WindowAttention``
gives one softmax map per window, with the relative-position bias and, in shifted blocks, the mask that keeps
wrapped-around tokens apart: ``block`` maps (B * nW, H, w * w, w * w), read by ``family.read_window``. At
32 x 32 (``CIFAR_32``) 4-pixel patches give stages of 8, 4, 2, 1 and window 4 (timm narrows it to a smaller
grid); ImageNet's window 7 does not divide 8: ``window_problems`` names such a stage, ``locvit validate``
refuses it.
"""

from __future__ import annotations

import torch.nn as nn
from timm.models.swin_transformer import SwinTransformer, WindowAttention

from locvit.models.family import BLOCK, AttentionSite, Family, SmallBuild, exact_reader, read_window, register_family

#: timm's Swin-T at 32 x 32: the 8 x 8 grid of 4-pixel patches, windows of 4 (27.5M parameters with
#: 10 classes, LSA's Table 3: 27.5M).
CIFAR_32 = dict(img_size=32, patch_size=4, window_size=4)


def swin_blocks(model: SwinTransformer) -> list[nn.Module]:
    return [block for stage in model.layers for block in stage.blocks]


def swin_sites(model: SwinTransformer) -> list[AttentionSite]:
    """One site per block, over one window's grid (the window timm settled on for the stage)."""
    return [
        AttentionSite(b.attn, tuple(b.window_size), exact_reader(b.attn, {WindowAttention: read_window}))
        for b in swin_blocks(model)
    ]


def window_problems(model: SwinTransformer) -> list[str]:
    """Stages whose window does not divide the grid: timm pads them, and their maps hold padding tokens."""
    problems = []
    for i, stage in enumerate(model.layers):
        block = stage.blocks[0]
        grid, window = tuple(block.input_resolution), tuple(block.window_size)
        if any(g % w for g, w in zip(grid, window)):
            problems.append(
                f"stage {i}: window {window[0]}x{window[1]} does not divide its {grid[0]}x{grid[1]} "
                f"grid; choose kwargs.window_size dividing the first stage's grid "
                f"({model.patch_embed.grid_size[0]}x{model.patch_embed.grid_size[1]}), e.g. "
                f"{_dividing(model.patch_embed.grid_size[0])}"
            )
    return problems


def _dividing(side: int) -> int:
    """The largest power of two dividing ``side`` that is at most half of it (at least 1)."""
    w = 1
    while side % (2 * w) == 0 and 2 * w <= max(1, side // 2):
        w *= 2
    return w


def _summary(model: SwinTransformer) -> dict:
    blocks = swin_blocks(model)
    return {
        "swin": {
            "window": [int(stage.blocks[0].window_size[0]) for stage in model.layers],
            "shifted_blocks": sum(1 for b in blocks if any(b.shift_size)),
            "stages": [len(stage.blocks) for stage in model.layers],
        }
    }


register_family(
    Family(
        "swin",
        "Swin",
        SwinTransformer,
        "self-attention inside local windows, shifted every other block; patches merged between stages",
        swin_blocks,
        swin_sites,
        options=_summary,
        models=("swin_",),
        kinds=(BLOCK,),
        small=SmallBuild(  # windows of 2 divide both stages' grids (4 x 4, 2 x 2)
            "swin_tiny_patch4_window7_224",
            dict(img_size=16, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=2),
            kinds=("block",) * 4,
        ),
        check=window_problems,
    )
)
