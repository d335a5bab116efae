"""LocalViT: Bringing locality to vision transformers (Li et al., 2021), which timm lacks; MaiT's Table 4.

DeiT's attention, and locality in the feed-forward network (``LocalityFeedForward``): the patch tokens go back
to their grid through a 1x1 conv, a 3x3 depth-wise conv and a 1x1 conv (each with BatchNorm, h-swish after the
first two) and are added back; the class token passes unchanged (the authors' code). ``LocalViTBlock``:
``x + attn(LN(x))``, then ``x + FFN(x)`` (no norm before the FFN: its BatchNorms normalise). ``LocalViT``:
timm's ``VisionTransformer`` with that block. DeiT's sizes, expand ratio 4, no squeeze-excitation (it would
add 3.5M to the tiny model against the paper's 5.9M); LayerScale (``init_values``) is refused.
"""

# No `from __future__ import annotations`: torch.fx copies forward's annotations into the code it
# generates, and TorchScript cannot read them as strings (as in lsa.py).
from functools import partial

import torch
import torch.nn as nn
from timm.layers import Attention, DropPath, to_2tuple
from timm.models import register_model
from timm.models._builder import build_model_with_cfg
from timm.models._registry import generate_default_cfgs
from timm.models.vision_transformer import VisionTransformer, _cfg, checkpoint_filter_fn

from locvit.models.family import (
    SHALLOW_VIT,
    SMALL_VIT,
    Cfg,
    Family,
    SmallBuild,
    read_vit,
    register_family,
    vit_blocks,
    vit_sites,
)


class LocalityFeedForward(nn.Module):
    """(B, P + gh * gw, C) -> the same: the patch tokens through 1x1 conv-BN-h-swish, 3x3 depth-wise
    conv-BN-h-swish, 1x1 conv-BN on their ``grid``, added to themselves; the P prefix tokens unchanged."""

    def __init__(self, dim: int, hidden: int, grid: tuple[int, int], num_prefix: int = 1):
        super().__init__()
        self.grid = grid
        self.num_prefix = num_prefix
        self.conv = nn.Sequential(
            nn.Conv2d(dim, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.Hardswish(),
            nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.Hardswish(),
            nn.Conv2d(hidden, dim, 1, bias=False),
            nn.BatchNorm2d(dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        prefix, patches = x[:, : self.num_prefix], x[:, self.num_prefix :]
        grid = patches.transpose(1, 2).reshape(x.shape[0], -1, self.grid[0], self.grid[1])  # (B, C, gh, gw)
        patches = patches + self.conv(grid).flatten(2).transpose(1, 2)
        return torch.cat([prefix, patches], dim=1)


class LocalViTBlock(nn.Module):
    """DeiT's attention sub-block, then the locality feed-forward (module docstring)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_layer=nn.LayerNorm,
        grid: tuple[int, int] = (14, 14),
        num_prefix: int = 1,
        **kwargs,
    ):
        super().__init__()
        if kwargs.get("init_values") is not None:
            raise ValueError("LocalViT: init_values (LayerScale) is not supported; LocalViT has no LayerScale")
        self.norm1 = norm_layer(dim)
        self.attn = Attention(
            dim,
            num_heads=num_heads,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            norm_layer=norm_layer,
        )
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.mlp = LocalityFeedForward(dim, int(dim * mlp_ratio), grid, num_prefix)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        x = x + self.drop_path1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal))
        return self.mlp(x)


class LocalViT(VisionTransformer):
    """timm's ViT with LocalViT's blocks on the patch grid of ``img_size / patch_size``."""

    def __init__(
        self,
        img_size=224,
        patch_size=16,
        class_token: bool = True,
        reg_tokens: int = 0,
        no_embed_class: bool = False,
        **kwargs,
    ):
        if kwargs.get("dynamic_img_size"):
            raise ValueError("LocalViT: dynamic_img_size is not supported (its feed-forward convs run on one grid)")
        size, patch = to_2tuple(img_size), to_2tuple(patch_size)
        grid = (size[0] // patch[0], size[1] // patch[1])
        block = partial(LocalViTBlock, grid=grid, num_prefix=int(class_token) + reg_tokens)
        super().__init__(
            img_size=img_size,
            patch_size=patch_size,
            class_token=class_token,
            reg_tokens=reg_tokens,
            no_embed_class=no_embed_class,
            block_fn=block,
            **kwargs,
        )


def _create(variant: str, pretrained: bool = False, **kwargs) -> LocalViT:
    if pretrained:
        raise ValueError(f"{variant}: no pretrained weights for LocalViT in locvit; use pretrained=False")
    return build_model_with_cfg(
        LocalViT,
        variant,
        pretrained=False,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=3, feature_cls="getter"),
        **kwargs,
    )


default_cfgs = generate_default_cfgs(
    {name: Cfg(**_cfg(), small=SHALLOW_VIT) for name in ("localvit_tiny_patch16_224", "localvit_small_patch16_224")}
)


@register_model
def localvit_tiny_patch16_224(pretrained=False, **kwargs) -> LocalViT:
    """LocalViT-T (MaiT Table 4: 5.9M): DeiT-T's sizes."""
    return _create(
        "localvit_tiny_patch16_224",
        pretrained,
        **dict(dict(patch_size=16, embed_dim=192, depth=12, num_heads=3), **kwargs),
    )


@register_model
def localvit_small_patch16_224(pretrained=False, **kwargs) -> LocalViT:
    """LocalViT-S (MaiT Table 4: 22.4M): DeiT-S's sizes."""
    return _create(
        "localvit_small_patch16_224",
        pretrained,
        **dict(dict(patch_size=16, embed_dim=384, depth=12, num_heads=6), **kwargs),
    )


register_family(
    Family(
        "localvit",
        "LocalViT",
        LocalViT,
        "none in the attention: a 3x3 depth-wise convolution over the patch grid in every feed-forward network",
        vit_blocks,
        lambda m: vit_sites(m, {Attention: read_vit}),
        models=("localvit_",),
        small=SmallBuild("localvit_tiny_patch16_224", SMALL_VIT, kinds=("softmax",) * 2),
    )
)

__all__ = ["LocalViT", "LocalViTBlock", "LocalityFeedForward"]
