"""A toy family: a ViT whose patches attend only inside a 3 x 3 window of patches."""

import torch
from timm.layers import Attention
from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer

from locvit.models.family import Extra, Family, register_family, vit_blocks, vit_sites


class WindowAttention(Attention):
    grid, num_prefix = (1, 1), 1

    def allowed(self, device):
        gh, gw = self.grid
        ys, xs = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        pos = torch.stack([ys.flatten(), xs.flatten()], -1)
        p, n = self.num_prefix, gh * gw
        ok = torch.ones(p + n, p + n, dtype=torch.bool)
        ok[p:, :p] = False  # a patch sees only its window; the class token sees everything
        ok[p:, p:] = (pos[:, None] - pos[None]).abs().amax(-1) <= 1
        return ok.to(device)

    def maps(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        logits = (q * self.scale) @ k.transpose(-2, -1)
        return logits.masked_fill(~self.allowed(x.device), float("-inf")).softmax(-1), v

    def forward(self, x, attn_mask=None, **kwargs):
        a, v = self.maps(x)
        b, t, c = x.shape
        return self.proj((a @ v).transpose(1, 2).reshape(b, t, c))


class ToyViT(VisionTransformer):
    def __init__(self, **kwargs):
        super().__init__(attn_layer=WindowAttention, **kwargs)
        for block in self.blocks:
            block.attn.grid, block.attn.num_prefix = tuple(self.patch_embed.grid_size), self.num_prefix_tokens


@register_model
def toy_window_vit(pretrained=False, **kwargs):
    kwargs = {k: v for k, v in kwargs.items() if not k.startswith("pretrained_") and k != "cache_dir"}
    return ToyViT(**kwargs)


def window_sides(model):
    """The window's side in patches, per layer and head: (L, H)."""
    return torch.full((len(model.blocks), model.blocks[0].attn.num_heads), 3.0)


register_family(
    Family(
        "toy",
        "ToyWindow",
        ToyViT,
        "every head inside a 3x3 window of patches",
        vit_blocks,
        lambda m: vit_sites(m, {WindowAttention: lambda attn, x: ("softmax", attn.maps(x)[0])}),
        extras=(Extra("window", "values", window_sides, "Window side", "The window's side in patches"),),
        models=("toy_",),
    )
)
