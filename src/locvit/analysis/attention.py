"""Attention maps of every model family, read from one ordinary forward pass.

:func:`collect_attention` hooks every attention layer of a known family, runs the model
once in eval mode, and recomputes each layer's attention weights from the layer's own
input with the layer's own projections: the weights the layer applies to its values,
whatever kernel (fused SDPA or eager) the layer itself runs. Hooks only read, so the
logits are those of a plain forward pass; no flag of the model is touched.

Record kinds (``AttentionMap.kind``) and their ``probs`` shapes. ``B`` images, ``H``
heads, ``N = gh * gw`` patch tokens on ``grid``, ``P = num_prefix`` class/distillation
tokens before them, ``T = P + N``:

=========  ========================  ==========================================================
kind       shape                     what it is (and where)
=========  ========================  ==========================================================
softmax    (B, H, T, T)              ``softmax(QK^T / sqrt(d))``; rows sum to 1. timm ViT/DeiT,
                                     ConViT's last (MHSA) layers, LSA's global blocks (P = 0, the
                                     level's grid), IBiT built with ``normalize='softmax'``, and
                                     MaiT, whose masked heads give ``softmax(M * logits)`` as the
                                     model computes it (multiply or restrict mode, hard, soft or
                                     random masks).
frobenius  (B, H, T, T)              IBiT: ``(M * QK^T / sqrt(d)) / ||.||_F`` per sample and head;
                                     signed, rows do not sum to 1 (each map has norm ~1).
talking    (B, H, N, N)              CaiT's (and masked CaiT's) talking-heads self-attention:
                                     ``proj_w(softmax(proj_l(QK^T / sqrt(d))))``, MaiT's mask on
                                     the softmax input; the post-softmax head mix makes it signed,
                                     rows sum to ``sum_g W[h, g] + N b[h]``, not 1. P = 0.
class      (B, H, 1, 1 + N)          CaiT's class attention: the class token's query over the
                                     class token and the patches; rows sum to 1. P = 1.
gpsa       (B, H, N, N)              ConViT's gated positional self-attention, the gated mix of
                                     content and positional softmaxes the layer uses; rows sum
                                     to 1. P = 0 (ConViT's class token joins after these layers).
shift      (B, H, N, S)              LSA's local block: each unshifted patch's weights over its
                                     own S shifted variants (variant 0 unshifted, the model's
                                     shift order); rows sum to 1. grid: the first level's; P = 0.
block      (B * K, H, n, n)          NesT: attention inside each of the K blocks of a level;
                                     index ``b * K + k`` (block k row-major over the level's
                                     block grid); rows sum to 1. grid: one block's ``(s, s)``,
                                     n = s * s; P = 0.
=========  ========================  ==========================================================
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch
import torch.nn as nn
from timm.layers import Attention
from timm.models.cait import Cait, ClassAttn, TalkingHeadAttn
from timm.models.convit import GPSA, MHSA, ConVit
from timm.models.nest import Attention as NestAttention
from timm.models.nest import Nest
from timm.models.vision_transformer import VisionTransformer

from locvit.models.ibit import LearnedMaskAttention
from locvit.models.lsa import LSA, LocalShiftAttention, LSAAttention
from locvit.models.mait import MaskedAttention, MaskedTalkingHeadAttn

KINDS = ("softmax", "frobenius", "talking", "class", "gpsa", "shift", "block")
ROW_STOCHASTIC = ("softmax", "class", "gpsa", "shift", "block")  # kinds whose rows sum to 1


@dataclasses.dataclass(frozen=True)
class AttentionMap:
    """One attention layer's weights for a batch (shapes per ``kind``: module docstring).

    name: the layer's module path (``model.get_submodule(name)``); layer: its position in
    forward order; probs: float32 on the CPU; grid: ``(gh, gw)`` of the patch tokens the
    layer sees; num_prefix: class/distillation tokens before them; kind: one of ``KINDS``.
    """

    name: str
    layer: int
    probs: torch.Tensor
    grid: tuple[int, int]
    num_prefix: int
    kind: str


def _softmax(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    return ((q * scale) @ k.transpose(-2, -1)).softmax(dim=-1)  # (..., H, Tq, Tk)


def _split_qk(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k (..., H, T, hd) from a fused ``qkv`` projection of x (..., T, C)."""
    qkv = attn.qkv(x).unflatten(-1, (3, attn.num_heads, -1)).movedim(-4, -2)  # (..., 3, H, T, hd)
    q, k, _ = qkv.unbind(-4)
    return q, k


def _vit(attn: Attention, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    q, k = _split_qk(attn, x)
    return "softmax", _softmax(attn.q_norm(q), attn.k_norm(k), attn.scale)


def _mhsa(attn: MHSA, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    return "softmax", _softmax(*_split_qk(attn, x), attn.scale)


def _mait(attn: MaskedAttention, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    return "softmax", attn.attention_maps(x)  # masked heads: softmax(M * logits), as in forward


def _ibit(attn: LearnedMaskAttention, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    return ("frobenius" if attn.normalize == "frobenius" else "softmax"), attn.attention_maps(x)


def _talking(attn: TalkingHeadAttn, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    """CaiT self-attention, plain or masked: the map after the post-softmax head mix."""
    q, k = _split_qk(attn, x)
    logits = attn.proj_l(((q * attn.scale) @ k.transpose(-2, -1)).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
    masks = getattr(attn, "masks", None)  # MaskedTalkingHeadAttn: the mask acts after proj_l
    if masks is not None and masks.active:
        logits = logits.index_copy(1, masks.heads, masks.mask_logits(logits.index_select(1, masks.heads)))
    return "talking", attn.proj_w(logits.softmax(dim=-1).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _class(attn: ClassAttn, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    q = attn.q(x[:, :1]).unflatten(-1, (attn.num_heads, -1)).transpose(1, 2)  # (B, H, 1, hd)
    k = attn.k(x).unflatten(-1, (attn.num_heads, -1)).transpose(1, 2)  # (B, H, 1 + N, hd)
    return "class", _softmax(q, k, attn.scale)


def _gpsa(attn: GPSA, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    return "gpsa", attn.get_attention(x)  # timm's own function, the one forward uses


def _nest(attn: NestAttention, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    probs = _softmax(*_split_qk(attn, x), attn.scale)  # x (B, K, n, C) -> (B, K, H, n, n)
    return "block", probs.flatten(0, 1)  # (B * K, H, n, n)


def _lsa_global(attn: LSAAttention, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    q = attn.q(x).unflatten(-1, (attn.num_heads, attn.head_dim)).transpose(1, 2)  # (B, H, N, hd)
    k = attn.kv(x).unflatten(-1, (2, attn.kv_heads, attn.head_dim))[:, :, 0].transpose(1, 2)  # (B, h_kv, N, hd)
    return "softmax", _softmax(q, k, attn.head_dim ** -0.5)  # a shared K (h_kv = 1) broadcasts over heads


def _lsa_local(attn: LocalShiftAttention, x: torch.Tensor, z: torch.Tensor) -> tuple[str, torch.Tensor]:
    return "shift", attn.weights(x, z).permute(0, 3, 2, 1)  # (B, S, N, H) -> (B, H, N, S)


# Exact classes: a subclass may compute its weights differently, so it is not guessed at.
_READERS: dict[type, Callable[..., tuple[str, torch.Tensor]]] = {
    Attention: _vit, MaskedAttention: _mait, LearnedMaskAttention: _ibit, MHSA: _mhsa, GPSA: _gpsa,
    TalkingHeadAttn: _talking, MaskedTalkingHeadAttn: _talking, ClassAttn: _class, NestAttention: _nest,
    LSAAttention: _lsa_global, LocalShiftAttention: _lsa_local,
}


def _sites(model: nn.Module) -> list[tuple[nn.Module, tuple[int, int]]]:
    """Every attention layer of a known family, with the grid of the patch tokens it sees."""
    if isinstance(model, LSA):
        return [(b.attn, tuple(grid)) for blocks, grid in zip(model.levels, model.grids) for b in blocks]
    if isinstance(model, Nest):
        return [(layer.attn, (level.block_size, level.block_size))
                for level in model.levels for layer in level.transformer_encoder]
    if isinstance(model, (VisionTransformer, Cait, ConVit)):
        grid = tuple(model.patch_embed.grid_size)
        blocks = list(model.blocks) + (list(model.blocks_token_only or []) if isinstance(model, Cait) else [])
        return [(b.attn, grid) for b in blocks]
    raise ValueError(f"collect_attention: {type(model).__name__} has no attention layer it recognises; known "
                     f"families: VisionTransformer (DeiT, MaiT, IBiT), Cait (and masked CaiT), ConVit, Nest, LSA")


@torch.no_grad()
def collect_attention(model: nn.Module, images: torch.Tensor) -> tuple[torch.Tensor, list[AttentionMap]]:
    """Run ``model`` once in eval mode; return its logits and one record per attention layer.

    Records come in forward order. The model is left as it was: hooks removed, every
    module's train/eval mode restored. Raises ``ValueError`` for a model (or an attention
    layer in it) of a kind this module does not know.
    """
    names = {module: name for name, module in model.named_modules()}
    records: list[AttentionMap] = []

    def hook_for(grid: tuple[int, int]):
        def hook(module, args, kwargs, output):
            if kwargs.get("attn_mask") is not None or kwargs.get("is_causal"):
                raise ValueError(f"{names[module]}: an attn_mask / is_causal given at call time is not supported")
            kind, probs = _READERS[type(module)](module, *args)
            tokens = args[0].shape[-2]  # the layer's input tokens: prefix + patches (per block for NesT)
            records.append(AttentionMap(names[module], len(records), probs.float().cpu(), grid,
                                        tokens - grid[0] * grid[1], kind))
        return hook

    sites = _sites(model)
    for module, _ in sites:
        if type(module) not in _READERS:
            raise ValueError(f"collect_attention: {type(model).__name__}.{names[module]} is a "
                             f"{type(module).__name__}, an attention layer it cannot read")
    modes = [(m, m.training) for m in model.modules()]
    handles = [module.register_forward_hook(hook_for(grid), with_kwargs=True) for module, grid in sites]
    try:
        model.eval()
        logits = model(images)
    finally:
        for handle in handles:
            handle.remove()
        for m, training in modes:
            m.training = training
    return logits, records
