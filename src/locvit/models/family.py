"""The model-family protocol: what analysis, profiling and the report need to know about a family.

A family is one file: the timm model (registered with ``@register_model``) and, at its
end, one :class:`Family` passed to :func:`register_family`. The analyses, the profile
and the report ask only this protocol; nothing else in locvit names a family. A family
outside locvit (a module named in params.yaml's ``model_modules``) does the same.

A family declares

* its name (the key in profiles and tables), its display name, the model class it
  covers (:func:`family_of` picks the most specific class) and its locality prior in words;
* :attr:`Family.blocks`: the model's transformer blocks in forward order (each with an
  ``attn`` and a ``norm1``), for the architecture summary;
* :attr:`Family.sites`: its attention layers, each with the patch-token grid it sees and
  a reader that recomputes the layer's weights from the layer's input
  (:class:`AttentionSite`); :func:`locvit.analysis.attention.collect_attention` hooks them;
* :attr:`Family.options`: family-specific facts for the summary (MaiT's masks, LSA's shifts);
* :attr:`Family.extras`: family-specific analysis outputs, each an :class:`Extra` that says
  how to read it from a model, where the analysis writes it and how the report draws it
  (MaiT's soft-mask ``alphas``, IBiT's ``learned_masks``);
* :attr:`Family.models`: the timm model-name prefixes it claims (``mait_``), and
  :attr:`Family.baseline`: whether it is a plain model the others are compared with (DeiT).
  Choices made from params alone, without building a model (the default ``baseline``),
  read these (:func:`family_claiming`).

Attention records (``AttentionMap.kind``) and their ``probs`` shapes. ``B`` images, ``H``
heads, ``N = gh * gw`` patch tokens on ``grid``, ``P = num_prefix`` class/distillation
tokens before them, ``T = P + N``:

=========  ========================  ==========================================================
kind       shape                     what it is
=========  ========================  ==========================================================
softmax    (B, H, T, T)              ``softmax(QK^T / sqrt(d))`` as the layer applies it (masked
                                     heads included); rows sum to 1.
frobenius  (B, H, T, T)              IBiT: ``(M * QK^T / sqrt(d)) / ||.||_F`` per sample and head;
                                     signed, rows do not sum to 1 (each map has norm ~1).
talking    (B, H, N, N)              CaiT's talking-heads self-attention after the post-softmax
                                     head mix: signed, rows sum to ``sum_g W[h, g] + N b[h]``. P = 0.
class      (B, H, 1, 1 + N)          CaiT's class attention: the class token's query over the
                                     class token and the patches; rows sum to 1. P = 1.
gpsa       (B, H, N, N)              ConViT's gated mix of content and positional softmaxes;
                                     rows sum to 1. P = 0.
shift      (B, H, N, S)              LSA's local block: each patch's weights over its own S
                                     shifted variants; rows sum to 1. P = 0.
block      (B * K, H, n, n)          NesT: attention inside each of the K blocks of a level
                                     (index ``b * K + k``, k row-major); grid: one block's
                                     ``(s, s)``, n = s * s; rows sum to 1. P = 0.
pooled_    (B, H, N, M)              ``pooled_keys``, PVT's spatial-reduction attention: queries
keys                                 on the layer's grid, keys and values on that grid pooled by
                                     a stride-R conv, (gh / R, gw / R), M = N / R^2; rows sum
                                     to 1. P = 0.
=========  ========================  ==========================================================
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch
import torch.nn as nn

KINDS = ("softmax", "frobenius", "talking", "class", "gpsa", "shift", "block", "pooled_keys")
ROW_STOCHASTIC = ("softmax", "class", "gpsa", "shift", "block", "pooled_keys")  # kinds whose rows sum to 1
#: Kinds that are token-by-token maps over the layer's patch grid (the spatial analyses apply).
GRID_KINDS = ("softmax", "frobenius", "talking", "gpsa", "block")

Reader = Callable[..., "tuple[str, torch.Tensor]"]  # (layer, *its forward args) -> (kind, probs)


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


@dataclasses.dataclass(frozen=True)
class AttentionSite:
    """An attention layer: the module to hook, the patch grid it sees, the reader of its weights."""

    module: nn.Module
    grid: tuple[int, int]
    read: Reader


def _no_options(model: nn.Module) -> dict:
    return {}


EXTRA_SHAPES = ("values", "images")


@dataclasses.dataclass(frozen=True)
class Extra:
    """A family-specific analysis output, and the figure the report draws of it.

    name: its key in the analysis files, and its figure's name (``<name>_<variant>``);
    shape: ``values``, an (L, H) number per layer and head, NaN where a head has none, written to
    ``<seed>.json`` (null for NaN) and drawn as a layer x head heatmap, mean over seeds; or
    ``images``, an (L, H, gh, gw) map per layer and head, written to ``<seed>.npz`` and drawn as
    a layer x head grid of images (the first seed's, each with its own colour scale);
    read: model -> tensor or array of that shape, or None where the model has none (MaiT's hard masks);
    title: the figure's title; caption: what it shows, for the caption (a sentence's start, no variant);
    limits: the colour scale of ``values`` (None: the data's range); pdf: a PDF too (a paper's figure).
    """

    name: str
    shape: str
    read: Callable[[nn.Module], Any]
    title: str
    caption: str
    limits: tuple[float, float] | None = None
    pdf: bool = False

    def __post_init__(self):
        if self.shape not in EXTRA_SHAPES:
            raise ValueError(f"Extra {self.name!r}: shape {self.shape!r} is not one of {', '.join(EXTRA_SHAPES)}")


@dataclasses.dataclass(frozen=True)
class Family:
    """A model family as analysis, profile and report see it (module docstring)."""

    name: str
    display: str
    model_class: type
    prior: str  # the locality prior in words ("none" for a plain ViT)
    blocks: Callable[[nn.Module], list[nn.Module]]
    sites: Callable[[nn.Module], list[AttentionSite]]
    options: Callable[[nn.Module], dict] = _no_options  # summary entries of its own: {"mask": {...}}
    extras: tuple[Extra, ...] = ()  # analysis outputs of its own, and their figures
    models: tuple[str, ...] = ()  # the timm model-name prefixes it claims ("mait_")
    baseline: bool = False  # a plain model the study compares the others with (the default ``baseline``)


_FAMILIES: dict[str, Family] = {}


def register_family(family: Family) -> Family:
    """Make a family known (re-registering a name replaces it, as re-importing its module does)."""
    _FAMILIES[family.name] = family
    return family


def families() -> dict[str, Family]:
    return dict(_FAMILIES)


def family_named(name: str) -> Family | None:
    return _FAMILIES.get(name)


def family_claiming(model: str) -> Family | None:
    """The family that claims the timm model name ``model`` (:attr:`Family.models`; the longest prefix wins)."""
    claims = [(len(prefix), f) for f in _FAMILIES.values() for prefix in f.models if model.startswith(prefix)]
    return max(claims, key=lambda c: c[0])[1] if claims else None


def family_of(model: nn.Module) -> Family:
    """The family whose model class is the most specific one ``model`` is an instance of."""
    mro = type(model).__mro__
    matches = [f for f in _FAMILIES.values() if isinstance(model, f.model_class)]
    if not matches:
        raise ValueError(f"{type(model).__name__} belongs to no registered model family (known: "
                         f"{', '.join(sorted(_FAMILIES))}); declare one with locvit.models.family.register_family")
    return min(matches, key=lambda f: mro.index(f.model_class))


def summary(model: nn.Module) -> dict:
    """The architecture summary the report groups variants by: family, display name, locality prior,
    token grid, sizes, and the family's own entries (:attr:`Family.options`, e.g. MaiT's ``mask``)."""
    family = family_of(model)
    blocks = family.blocks(model)
    sites = family.sites(model)
    embed = getattr(model, "patch_embed", None)
    patch = getattr(embed, "patch_size", None) or getattr(getattr(embed, "proj", None), "stride", None)
    return {
        "family": family.name,
        "display": family.display,
        "prior": family.prior,
        "grid": list(sites[0].grid) if sites else None,  # the first attention layer's patch grid
        "embed_dim": int(blocks[0].norm1.normalized_shape[0]) if blocks else 0,  # first level's width
        "depth": len(blocks),
        "num_heads": int(blocks[0].attn.num_heads) if blocks else 0,
        "patch_size": int(patch[0]) if isinstance(patch, (tuple, list)) else patch,
        "layer_scale": any(n.split(".")[-1] in ("gamma", "gamma_1", "gamma1") or ".ls1." in n
                           for n, _ in model.named_parameters()),
        **family.options(model),
    }


# Shared by the attention layers built on timm's ------------------------------------------------


def normed_qk(attn: nn.Module, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k through the layer's q/k norms (timm's ``qk_norm``), in v's dtype.

    CUDA autocast runs LayerNorm in float32, so normed q and k come out float32 beside a
    bfloat16 v (from the qkv Linear). Ops autocast covers (matmul, SDPA) cast them back; the
    rest do not (CUDA's ``index_copy`` refuses the mix, a custom autograd Function's backward
    runs outside autocast). bfloat16 is what autocast's matmul would take anyway; without
    autocast every dtype is already v's and nothing changes (``.to`` returns the same tensor).
    """
    return attn.q_norm(q).to(v.dtype), attn.k_norm(k).to(v.dtype)


# Readers shared by the families built on timm's attention layers ----------------------------------


def softmax_map(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """``softmax(q k^T * scale)`` over the keys: (..., H, Tq, Tk)."""
    return ((q * scale) @ k.transpose(-2, -1)).softmax(dim=-1)


def split_qk(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k (..., H, T, hd) from a fused ``qkv`` projection of x (..., T, C)."""
    qkv = attn.qkv(x).unflatten(-1, (3, attn.num_heads, -1)).movedim(-4, -2)  # (..., 3, H, T, hd)
    q, k, _ = qkv.unbind(-4)
    return q, k


def read_vit(attn: nn.Module, x: torch.Tensor) -> tuple[str, torch.Tensor]:
    """timm's ``Attention`` (ViT, DeiT): the softmax map, q/k norms applied as in forward."""
    q, k = split_qk(attn, x)
    return "softmax", softmax_map(attn.q_norm(q), attn.k_norm(k), attn.scale)


def exact_reader(attn: nn.Module, readers: dict[type, Reader]) -> Reader:
    """The reader of an attention layer by its exact class (a subclass may compute its weights differently)."""
    read = readers.get(type(attn))
    if read is None:
        raise ValueError(f"{type(attn).__name__} is an attention layer no reader of its family knows "
                         f"(known: {', '.join(t.__name__ for t in readers)})")
    return read


def vit_blocks(model: nn.Module) -> list[nn.Module]:
    return list(model.blocks)


def vit_sites(model: nn.Module, readers: dict[type, Reader]) -> list[AttentionSite]:
    """One site per block of a ViT-like model (``blocks``, ``patch_embed.grid_size``), read by class."""
    grid = tuple(model.patch_embed.grid_size)
    return [AttentionSite(b.attn, grid, exact_reader(b.attn, readers)) for b in model.blocks]
