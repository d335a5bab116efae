"""The timm baselines the three papers compare against, and how to build them at 32 x 32.

A baseline is a timm name plus keyword arguments, ``timm.create_model(name, **CIFAR_32[name], num_classes=...)``
(or ``create_at_32``, where the caller's keywords win): nothing here subclasses a model. At 32 x 32 the
ViT-like ones take 4 x 4-pixel patches, the 8 x 8 grid of locvit's MaiT and IBiT there, so baseline and
masked model differ only in the attention. One entrypoint is registered, ``nest_tiny_cifar``: the NesT
paper's CIFAR NesT-T, whose widths and levels timm's ``nest_tiny`` fixes. Which paper compares with which,
and their sizes: docs/models.md.
"""

from __future__ import annotations

import timm
import torch.nn as nn
from timm.layers import Attention
from timm.models import register_model
from timm.models._builder import build_model_with_cfg
from timm.models._registry import generate_default_cfgs
from timm.models.cait import Cait, ClassAttn, TalkingHeadAttn
from timm.models.convit import GPSA, MHSA, ConVit
from timm.models.nest import Attention as NestAttention
from timm.models.nest import Nest, checkpoint_filter_fn
from timm.models.vision_transformer import VisionTransformer

from locvit.models.family import (
    BLOCK,
    CLASS,
    GPSA_MAP,
    SMALL_CAIT,
    SMALL_VIT,
    SOFTMAX,
    TALKING,
    AttentionSite,
    Cfg,
    Family,
    SmallBuild,
    exact_reader,
    read_vit,
    register_family,
    softmax_map,
    split_qk,
    vit_blocks,
    vit_sites,
)

BASELINES = ("deit_tiny_patch16_224", "deit_small_patch16_224", "cait_xxs24_224", "convit_tiny", "nest_tiny")

CIFAR_32: dict[str, dict] = {
    # 8 x 8 patches + class token; 5.36M parameters (LSA's Table 3 lists DeiT-T at 5.3M).
    "deit_tiny_patch16_224": dict(img_size=32, patch_size=4),
    # The same grid; 21.34M (LSA's Table 3: 21.3M).
    "deit_small_patch16_224": dict(img_size=32, patch_size=4),
    # The same grid for its 24 self-attention layers; its 2 class-attention layers are
    # unchanged. 11.60M.
    "cait_xxs24_224": dict(img_size=32, patch_size=4),
    # The same grid: GPSA builds its relative positions (and its local initialisation) from
    # the grid, whatever its size. 5.36M.
    "convit_tiny": dict(img_size=32, patch_size=4),
    # The NesT paper's CIFAR models embed single pixels (patch 1). timm's ``nest_tiny`` fixes
    # its widths (96/192/384) and three levels, so by keyword we get pixel tokens in 16
    # blocks of 8 x 8, then 4, then 1: 16.32M parameters, not the paper's CIFAR NesT-T (6.2M,
    # see NEST_TINY_CIFAR). Stochastic depth 0.1 as in the NesT CIFAR code; timm's 0.5
    # default is NesT-B's ImageNet value.
    "nest_tiny": dict(img_size=32, patch_size=1, drop_path_rate=0.1),
}

# The NesT paper's CIFAR NesT-T (its code's ``nest_tiny_s16_32``), for timm's ``Nest`` class:
# pixel tokens in blocks of 4 x 4, four levels (64, 16, 4, 1 blocks), 192-d, 3 heads and 3
# layers per level. 6.60M parameters in timm against the paper's 6.2M: timm's attention
# gives every head its own keys and values, the NesT code shares one (multi-query).
NEST_TINY_CIFAR = dict(
    img_size=32,
    patch_size=1,
    num_levels=4,
    embed_dims=(192,) * 4,
    num_heads=(3,) * 4,
    depths=(3,) * 4,
    drop_path_rate=0.1,
)


def create_at_32(name: str, **kwargs) -> nn.Module:
    """``timm.create_model(name)`` with the 32 x 32 overrides; the caller's keywords win."""
    if name not in CIFAR_32:
        raise ValueError(f"{name!r} has no 32 x 32 setting; known baselines: {', '.join(CIFAR_32)}")
    return timm.create_model(name, **{**CIFAR_32[name], **kwargs})


default_cfgs = generate_default_cfgs(
    {
        "nest_tiny_cifar": Cfg(
            url="",
            num_classes=10,
            input_size=(3, 32, 32),
            pool_size=(4, 4),
            crop_pct=1.0,
            interpolation="bicubic",
            fixed_input_size=True,
            mean=(0.4914, 0.4822, 0.4465),
            std=(0.2470, 0.2435, 0.2616),
            first_conv="patch_embed.proj",
            classifier="head",
            small=dict(img_size=32, depths=(1,) * 4),
        )
    }
)


class CifarNest(Nest):
    """timm's Nest with the ``feature_info`` of its patch size (timm's counts from 4-pixel patches)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        for i, info in enumerate(self.feature_info):  # the first level at the patch grid, each next one halved
            info["reduction"] = self.patch_embed.patch_size[0] * 2**i


@register_model
def nest_tiny_cifar(pretrained=False, **kwargs) -> Nest:
    """NesT-T in the NesT paper's CIFAR setting (``NEST_TINY_CIFAR``; 6.60M with 10 classes)."""
    if pretrained:
        raise ValueError("nest_tiny_cifar: no pretrained weights; use pretrained=False")
    return build_model_with_cfg(
        CifarNest,
        "nest_tiny_cifar",
        pretrained=False,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=(0, 1, 2, 3), flatten_sequential=True),  # its four levels
        **{**NEST_TINY_CIFAR, **kwargs},
    )


# The baselines' families, as analysis, profile and report see them (locvit.models.family) ------------


def read_talking(attn: nn.Module, x, mask_logits=None):
    """CaiT's talking-heads self-attention: the map after the post-softmax head mix; ``mask_logits``
    (masked CaiT) acts on the mixed logits before the softmax, as in forward."""
    q, k = split_qk(attn, x)
    logits = attn.proj_l(((q * attn.scale) @ k.transpose(-2, -1)).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    if mask_logits is not None:
        logits = mask_logits(logits)
    return "talking", attn.proj_w(logits.softmax(dim=-1).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def read_class(attn: ClassAttn, x):
    q = attn.q(x[:, :1]).unflatten(-1, (attn.num_heads, -1)).transpose(1, 2)  # (B, H, 1, hd)
    k = attn.k(x).unflatten(-1, (attn.num_heads, -1)).transpose(1, 2)  # (B, H, 1 + N, hd)
    return "class", softmax_map(q, k, attn.scale)


def cait_blocks(model: Cait) -> list[nn.Module]:
    return list(model.blocks) + list(model.blocks_token_only or [])


def cait_sites(model: Cait, self_attention: dict) -> list[AttentionSite]:
    """Self-attention layers (readers by class: ``self_attention``), then class attention."""
    grid = tuple(model.patch_embed.grid_size)
    readers = {**self_attention, ClassAttn: read_class}
    return [AttentionSite(b.attn, grid, exact_reader(b.attn, readers)) for b in cait_blocks(model)]


def _read_mhsa(attn: MHSA, x):
    return "softmax", softmax_map(*split_qk(attn, x), attn.scale)


def _read_gpsa(attn: GPSA, x):
    return "gpsa", attn.get_attention(x)  # timm's own function, the one forward uses


def _read_nest(attn: NestAttention, x):
    probs = softmax_map(*split_qk(attn, x), attn.scale)  # x (B, K, n, C) -> (B, K, H, n, n)
    return "block", probs.flatten(0, 1)  # (B * K, H, n, n)


def _nest_blocks(model: Nest) -> list[nn.Module]:
    return [layer for level in model.levels for layer in level.transformer_encoder]


def _nest_sites(model: Nest) -> list[AttentionSite]:
    return [
        AttentionSite(
            layer.attn, (level.block_size, level.block_size), exact_reader(layer.attn, {NestAttention: _read_nest})
        )
        for level in model.levels
        for layer in level.transformer_encoder
    ]


register_family(
    Family(
        "deit",
        "DeiT",
        VisionTransformer,
        "none: global attention from the first layer",
        vit_blocks,
        lambda m: vit_sites(m, {Attention: read_vit}),
        models=("deit", "vit_"),
        baseline=True,
        kinds=(SOFTMAX,),
        small=SmallBuild("deit_tiny_patch16_224", SMALL_VIT, kinds=("softmax",) * 2),
    )
)
register_family(
    Family(
        "cait",
        "CaiT",
        Cait,
        "none: global self-attention, then class attention",
        cait_blocks,
        lambda m: cait_sites(m, {TalkingHeadAttn: read_talking}),
        models=("cait_",),
        kinds=(TALKING, CLASS),
        small=SmallBuild("cait_xxs24_224", SMALL_CAIT, kinds=("talking", "talking", "class")),
    )
)
register_family(
    Family(
        "convit",
        "ConViT",
        ConVit,
        "gated positional self-attention, initialised local (a soft convolutional prior the gates can leave)",
        vit_blocks,
        lambda m: vit_sites(m, {GPSA: _read_gpsa, MHSA: _read_mhsa}),
        models=("convit_",),
        kinds=(GPSA_MAP, SOFTMAX),
        small=SmallBuild(
            "convit_tiny",
            dict(img_size=32, patch_size=8, embed_dim=8, num_heads=4, depth=3, local_up_to_layer=2),
            kinds=("gpsa", "gpsa", "softmax"),
        ),
    )
)
register_family(
    Family(
        "nest",
        "NesT",
        Nest,
        "attention within non-overlapping blocks, aggregated hierarchically",
        _nest_blocks,
        _nest_sites,
        models=("nest_",),
        kinds=(BLOCK,),
        small=SmallBuild(
            "nest_tiny_cifar",
            dict(img_size=16, num_levels=3, embed_dims=(24,) * 3, num_heads=(3,) * 3, depths=(1,) * 3),
            kinds=("block",) * 3,
        ),
    )
)
