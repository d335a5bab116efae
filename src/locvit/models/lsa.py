"""LSA: Locally Shifted Attention With Early Global Integration (Sheynin, Benaim, Polyak and Wolf).

Where the paper is vague, the authors' code (github shellysheynin/Locally-SAG-Transformer); each choice
where they differ is an option (docs/models.md, LSA). Blocks: ``ShiftEmbed`` (T shifted versions of the
image, ``torch.roll`` with circular wrap, variant 0 unshifted, each through its own conv and positions ->
(B, T, N, D)); ``LocalShiftAttention`` (per patch, the unshifted query over its own T versions: B*N
attentions of one query over T keys, never the (B*T) x (B*T) map); ``LSAAttention`` (global, per-head or
shared K/V); ``LSABlock``; ``Downsample`` (conv 3x3 -> LayerNorm -> max-pool 3x3/2). Model: ``LSA``, the
first block of the first level local, then global levels, LayerNorm, token mean, linear head.
"""

# No `from __future__ import annotations`: torch.fx copies forward's annotations into the code it
# generates, and TorchScript cannot read a string there.
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath, Mlp, trunc_normal_, use_fused_attn
from timm.models import register_model
from timm.models._builder import build_model_with_cfg
from timm.models._features import feature_take_indices
from timm.models._registry import generate_default_cfgs

from locvit.errors import InputError, allowed
from locvit.models.family import (
    SHIFT,
    SOFTMAX,
    AttentionSite,
    Cfg,
    Family,
    SmallBuild,
    exact_reader,
    register_family,
    softmax_map,
)

Shift = tuple[int, int]
SHIFTS: dict[str, tuple[Shift, ...]] = {
    "none": ((0, 0),),
    "axes9": ((0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (-1, 0), (-2, 0), (0, -1), (0, -2)),
    "cifar18": (
        (0, 0),
        (1, 0),
        (0, 1),
        (-1, 0),
        (0, -1),
        (2, 0),
        (0, 2),
        (-2, 0),
        (0, -2),
        (1, 1),
        (1, 2),
        (1, -1),
        (-1, 1),
        (-1, 2),
        (-1, -1),
        (2, 1),
        (2, 2),
        (2, -1),
    ),
    "imagenet10": ((0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (0, 2), (0, 3), (1, 1), (2, 2), (3, 3)),
}
SHIFT_MODES = ("conv", "translate")
POS_EMBEDS = ("per_variant", "shared")


def resolve_shifts(shifts: str | Sequence[Sequence[int]]) -> tuple[Shift, ...]:
    """A named shift list or explicit ``(dx, dy)`` pairs; the first must be ``(0, 0)``."""
    if isinstance(shifts, str):
        if shifts not in SHIFTS:
            raise InputError(
                f"shifts: unknown list {shifts!r}; allowed values: {', '.join(SHIFTS)} "
                f"or a list of [dx, dy] pairs starting with [0, 0]"
            )
        return SHIFTS[shifts]
    pairs = tuple((int(s[0]), int(s[1])) for s in shifts if len(s) == 2)
    if len(pairs) != len(shifts) or not pairs or pairs[0] != (0, 0) or len(set(pairs)) != len(pairs):
        raise ValueError(
            f"shifts: need distinct [dx, dy] pairs starting with [0, 0] (the unshifted image), got {shifts!r}"
        )
    return pairs


def shift_image(img: torch.Tensor, dx: int, dy: int, pad: str = "circular") -> torch.Tensor:
    """``img`` (..., H, W) moved ``dx`` right and ``dy`` down; edges wrap or reflect."""
    if pad == "circular":
        return torch.roll(img, shifts=(dy, dx), dims=(-2, -1))
    p = max(abs(dx), abs(dy))
    if p == 0:
        return img
    h, w = img.shape[-2:]
    padded = F.pad(img, (p, p, p, p), mode="reflect")
    return padded[..., p - dy : p - dy + h, p - dx : p - dx + w]


class ShiftEmbed(nn.Module):
    """T shifted copies of the image, each through its conv embedding, plus positions: tokens (B, T, N, D)."""

    def __init__(
        self,
        img_size: int,
        shifts: Sequence[Shift],
        kernel_size: int,
        stride: int,
        padding: int,
        in_chans: int,
        embed_dim: int,
        shift_mode: str = "conv",
        pos_embed: str = "per_variant",
    ):
        super().__init__()
        allowed("shift_mode", shift_mode, SHIFT_MODES)
        allowed("pos_embed", pos_embed, POS_EMBEDS)
        self.shifts = tuple(shifts)
        too_far = [s for s in self.shifts if max(abs(s[0]), abs(s[1])) >= img_size]
        if too_far:  # a roll by the image size or more repeats (or wraps past) a smaller shift
            raise ValueError(
                f"shifts: {[list(s) for s in too_far]} move the image by {img_size} px or more "
                f"(img_size {img_size}); every |dx| and |dy| must be smaller than the image"
            )
        self.shift_mode = shift_mode
        self.in_chans = in_chans
        t = len(self.shifts)
        side = (img_size + 2 * padding - kernel_size) // stride + 1
        if side < 1:
            raise ValueError(f"img_size {img_size} is too small for a kernel {kernel_size} conv embedding")
        self.grid_size = (side, side)
        self.num_patches = side * side
        groups = t if shift_mode == "conv" else 1  # one conv per variant = a grouped conv over stacked variants
        self.proj = nn.Conv2d(in_chans * groups, embed_dim * groups, kernel_size, stride, padding, groups=groups)
        self.pos_embed = nn.Parameter(torch.zeros(t if pos_embed == "per_variant" else 1, self.num_patches, embed_dim))
        trunc_normal_(self.pos_embed, std=0.02)

    def variants(self, img: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, T, C, H, W): the image-shifting variants."""
        pad = "circular" if self.shift_mode == "conv" else "reflect"
        variants: list[torch.Tensor] = []
        for shift in self.shifts:  # a loop, not a comprehension: TorchScript unrolls it over the tuple
            variants.append(shift_image(img, shift[0], shift[1], pad))
        return torch.stack(variants, dim=1)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        b, c, h, w = img.shape
        t = len(self.shifts)
        v = self.variants(img)  # (B, T, C, H, W)
        if self.shift_mode == "conv":
            x = self.proj(v.reshape(b, t * c, h, w)).reshape(b, t, -1, self.num_patches)  # (B, T, D, N)
        else:
            x = self.proj(v.reshape(b * t, c, h, w)).reshape(b, t, -1, self.num_patches)
        return x.transpose(2, 3) + self.pos_embed  # (B, T, N, D)


class _QueryKeyValue(nn.Module):
    """The projections both LSA attentions share: a query per head, keys/values per head or
    one pair shared by all heads (``kv_shared``), and the output projection."""

    def __init__(
        self, dim: int, num_heads: int, qkv_bias: bool = True, kv_shared: bool = False, proj_drop: float = 0.0
    ):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.kv_heads = 1 if kv_shared else num_heads
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * self.kv_heads * self.head_dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)


class LocalShiftAttention(_QueryKeyValue):
    """Attention of each unshifted patch (B, N, D) over its own T variants (B, T, N, D) (Eqs. 1-4): O(B N T D)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        kv_shared: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ):
        super().__init__(dim, num_heads, qkv_bias, kv_shared, proj_drop)
        self.scale = self.head_dim**-0.5
        self.attn_drop = nn.Dropout(attn_drop)

    def _logits(self, x: torch.Tensor, z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, n, _ = z.shape
        q = self.q(x).reshape(b, 1, n, self.num_heads, self.head_dim) * self.scale  # (B, 1, N, h, hd)
        k, v = self.kv(z).reshape(b, t, n, 2, self.kv_heads, self.head_dim).unbind(3)  # (B, T, N, h_kv, hd)
        # A broadcast product summed over hd: B*N*h dot products of length hd per variant,
        # no permuted copies (a shared K/V broadcasts over the heads).
        return (q * k).sum(-1), v  # (B, T, N, h), (B, T, N, h_kv, hd)

    def weights(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """Softmax weights (B, T, N, heads) of each patch over its T variants."""
        return self._logits(x, z)[0].softmax(dim=1)

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        logits, v = self._logits(x, z)
        attn = self.attn_drop(logits.softmax(dim=1))  # over the T variants
        out = (attn.unsqueeze(-1) * v).sum(1).reshape(b, n, c)  # (B, N, h, hd) -> (B, N, D)
        return self.proj_drop(self.proj(out))


class LSAAttention(_QueryKeyValue):
    """Global multi-head self-attention; keys/values per head or one pair shared by all heads."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        qkv_bias: bool = True,
        kv_shared: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ):
        super().__init__(dim, num_heads, qkv_bias, kv_shared, proj_drop)
        self.fused_attn = use_fused_attn()
        self.attn_drop = attn_drop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # (B, h, N, hd)
        kv = self.kv(x).reshape(b, n, 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)  # (B, h_kv, N, hd)
        if self.kv_heads != self.num_heads:
            k, v = k.expand(-1, self.num_heads, -1, -1), v.expand(-1, self.num_heads, -1, -1)
        if self.fused_attn:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        else:  # eager, as timm does when fused attention is off (e.g. to count FLOPs or read the maps)
            attn = ((q * self.head_dim**-0.5) @ k.transpose(-2, -1)).softmax(dim=-1)
            out = F.dropout(attn, self.attn_drop, self.training) @ v
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))


class LSABlock(nn.Module):
    """Pre-norm block: ``x + attn(LN(x))`` then ``x + MLP(LN(x))``; local or global attention."""

    __constants__ = ["local"]  # TorchScript compiles only the branch of this block's attention

    def __init__(
        self,
        dim: int,
        num_heads: int,
        local: bool = False,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        kv_shared: bool = False,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
    ):
        super().__init__()
        self.local = local
        attn_cls = LocalShiftAttention if local else LSAAttention
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = attn_cls(
            dim, num_heads, qkv_bias=qkv_bias, kv_shared=kv_shared, attn_drop=attn_drop, proj_drop=proj_drop
        )
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), drop=proj_drop)

    def forward(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        if self.local:  # x: the unshifted tokens (B, N, D); z: all variants (B, T, N, D)
            assert z is not None, "the local block needs the shifted variants z"
            x = x + self.drop_path(self.attn(self.norm1(x), self.norm1(z)))
        else:
            x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class Downsample(nn.Module):
    """(B, N, C) on the (h, w) grid ``grid`` -> conv 3x3 -> LayerNorm over channels -> max-pool 3x3/2."""

    def __init__(self, dim: int, dim_out: int, grid: tuple[int, int]):
        super().__init__()
        self.grid = tuple(grid)
        self.conv = nn.Conv2d(dim, dim_out, 3, padding=1)
        self.norm = nn.LayerNorm(dim_out, eps=1e-6)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        x = self.conv(x.transpose(1, 2).reshape(b, c, self.grid[0], self.grid[1]))
        x = self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.pool(x).flatten(2).transpose(1, 2)


def _per_level(value, levels: int, name: str) -> tuple:
    values = tuple(value) if isinstance(value, (list, tuple)) else (value,) * levels
    if len(values) != levels:
        raise ValueError(f"{name}: need one value per level ({levels}), got {list(values)}")
    return values


class LSA(nn.Module):
    """Locally shifted attention with a pyramid of global attention levels; options: docs/models.md, LSA.

    embed_dims, depths, num_heads: per level (one number: every level); local_block None: iff T > 1.
    """

    def __init__(
        self,
        img_size: int = 32,
        in_chans: int = 3,
        num_classes: int = 10,
        shifts: str | Sequence[Sequence[int]] = "cifar18",
        kernel_size: int = 3,
        stride: int = 1,
        padding: int = 1,
        embed_dims: int | Sequence[int] = 192,
        depths: Sequence[int] = (2, 4, 4, 4),
        num_heads: int | Sequence[int] = 3,
        kv_shared: bool = False,
        shift_mode: str = "conv",
        pos_embed: str = "per_variant",
        local_block: bool | None = None,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.1,
        global_pool: str = "avg",
    ):
        super().__init__()
        if global_pool not in ("avg", ""):
            raise InputError(f"global_pool: {global_pool!r} is not allowed; allowed values: avg, '' (tokens)")
        levels = len(depths)
        dims = _per_level(embed_dims, levels, "embed_dims")
        heads = _per_level(num_heads, levels, "num_heads")
        self.shifts = resolve_shifts(shifts)
        self.local_block = len(self.shifts) > 1 if local_block is None else bool(local_block)
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = dims[-1]

        self.patch_embed = ShiftEmbed(
            img_size,
            self.shifts,
            kernel_size,
            stride,
            padding,
            in_chans,
            dims[0],
            shift_mode=shift_mode,
            pos_embed=pos_embed,
        )
        grid = self.patch_embed.grid_size
        self.grids, self.levels, self.downsamples = [], nn.ModuleList(), nn.ModuleList()
        self.level_pos = nn.ParameterList()
        self.feature_info = []  # timm's: each level's output, its width and pixels per token
        for i, (dim, depth, h) in enumerate(zip(dims, depths, heads)):
            self.grids.append(grid)
            self.feature_info.append(dict(num_chs=dim, reduction=stride * 2**i, module=f"levels.{i}"))
            blocks = [
                LSABlock(
                    dim,
                    h,
                    local=(i == 0 and j == 0 and self.local_block),
                    mlp_ratio=mlp_ratio,
                    qkv_bias=qkv_bias,
                    kv_shared=kv_shared,
                    proj_drop=proj_drop_rate,
                    attn_drop=attn_drop_rate,
                    drop_path=drop_path_rate,
                )
                for j in range(depth)
            ]
            self.levels.append(nn.ModuleList(blocks))
            if i > 0:  # the first level's positions live in the shift embedding (per variant)
                self.level_pos.append(nn.Parameter(trunc_normal_(torch.zeros(1, grid[0] * grid[1], dim), std=0.02)))
            if i + 1 < levels:
                self.downsamples.append(Downsample(dim, dims[i + 1], grid))
                grid = ((grid[0] + 1) // 2, (grid[1] + 1) // 2)  # max-pool 3x3, stride 2, padding 1
        self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m: nn.Module) -> None:
        # The authors' (and DeiT's) init: truncated normal 0.02 for linear and conv weights, zero biases.
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"patch_embed.pos_embed"} | {f"level_pos.{i}" for i in range(len(self.level_pos))}

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = global_pool
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward_local(self, img: torch.Tensor) -> torch.Tensor:
        """Tokens (B, N, D) after the shift embedding and the local block (or the unshifted tokens)."""
        z = self.patch_embed(img)  # (B, T, N, D)
        x = z[:, 0]
        for block in self.levels[0]:  # only the first block of the first level can be local
            if block.local:
                x = block(x, z)
        return x

    def forward_features(self, img: torch.Tensor) -> torch.Tensor:
        x = self.forward_local(img)
        # Every level but the last, then its downsampling and the next level's positions (zipped, as
        # TorchScript indexes module lists by literals only); then the last level.
        for level, down, pos in zip(self.levels, self.downsamples, self.level_pos):
            for block in level:
                if not block.local:  # the local block ran in forward_local
                    x = block(x)
            x = down(x) + pos
        for block in self.levels[-1]:
            if not block.local:
                x = block(x)
        return self.norm(x)

    def forward_intermediates(
        self,
        img: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """timm's feature API: the levels' (B, C, h, w) maps and ``forward_features``'s output.

        ``stop_early`` skips the levels after the last one asked for (the features are then that level's, normed)."""
        allowed("output_fmt", output_fmt, ("NCHW",))
        take, last = feature_take_indices(len(self.levels), indices)
        intermediates = []
        x = self.forward_local(img)
        for i, blocks in enumerate(self.levels[: last + 1] if stop_early else self.levels):
            if i > 0:
                x = self.downsamples[i - 1](x) + self.level_pos[i - 1]
            for block in blocks:
                if not block.local:  # the local block ran in forward_local
                    x = block(x)
            if i in take:
                inter = self.norm(x) if norm and i == len(self.levels) - 1 else x
                intermediates.append(inter.transpose(1, 2).reshape(x.shape[0], -1, *self.grids[i]))  # (B, C, h, w)
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        if self.global_pool == "avg":
            x = x.mean(dim=1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(img))


def _create(variant: str, pretrained: bool = False, **kwargs) -> LSA:
    if pretrained:
        raise ValueError(f"{variant}: no pretrained weights exist for LSA; use pretrained=False")
    return build_model_with_cfg(LSA, variant, pretrained=False, **kwargs)


def _cfg(size: int, num_classes: int, **kwargs) -> Cfg:
    mean, std = (
        ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))
        if size == 32
        else ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    )
    return Cfg(
        url="",
        num_classes=num_classes,
        input_size=(3, size, size),
        pool_size=None,
        crop_pct=1.0 if size == 32 else 0.875,
        interpolation="bicubic",
        fixed_input_size=True,
        mean=mean,
        std=std,
        first_conv="patch_embed.proj",
        classifier="head",
        **kwargs,
    )


ENTRYPOINTS = ("lsa_tiny_cifar", "lsa_small_cifar", "lsa_base_cifar", "lsa_tiny_224", "lsa_small_224")
default_cfgs = generate_default_cfgs(
    {
        **{name: _cfg(32, 10, small=dict(img_size=16, depths=(1,) * 4)) for name in ENTRYPOINTS[:3]},
        # the ImageNet stem needs a larger input
        "lsa_tiny_224": _cfg(224, 1000, small=dict(img_size=112, depths=(1,) * 4)),
        "lsa_small_224": _cfg(224, 1000, small=dict(img_size=112, depths=(1,) * 3)),
    }
)

# Entrypoints: Table 2's sizes. CIFAR: T=18, a 3x3 stride-1 conv per variant (1024 tokens),
# four levels 1024 -> 256 -> 64 -> 16 tokens. ImageNet: T=10, a strided conv per variant.
CIFAR_EMBED = dict(shifts="cifar18", kernel_size=3, stride=1, padding=1, img_size=32, num_classes=10)


@register_model
def lsa_tiny_cifar(pretrained=False, **kwargs) -> LSA:
    """Our-T, CIFAR (Table 3: 10.2M): 192-d, 3 heads, blocks (2, 4, 4, 4), shared K/V."""
    args = dict(CIFAR_EMBED, embed_dims=192, depths=(2, 4, 4, 4), num_heads=3, kv_shared=True)
    return _create("lsa_tiny_cifar", pretrained, **dict(args, **kwargs))


@register_model
def lsa_small_cifar(pretrained=False, **kwargs) -> LSA:
    """Our-S, CIFAR (Table 3: 36.2M): 384-d, 6 heads, blocks (2, 4, 4, 4), per-head K/V."""
    args = dict(CIFAR_EMBED, embed_dims=384, depths=(2, 4, 4, 4), num_heads=6)
    return _create("lsa_small_cifar", pretrained, **dict(args, **kwargs))


@register_model
def lsa_base_cifar(pretrained=False, **kwargs) -> LSA:
    """Our-B, CIFAR (Table 3: 115.8M): 768-d, 12 heads, blocks (3, 3, 3, 3), per-head K/V."""
    args = dict(CIFAR_EMBED, embed_dims=768, depths=(3, 3, 3, 3), num_heads=12)
    return _create("lsa_base_cifar", pretrained, **dict(args, **kwargs))


@register_model
def lsa_tiny_224(pretrained=False, **kwargs) -> LSA:
    """Our-T, ImageNet (Table 4: 9.9M): K=9, S=7, P=1 (1024 tokens), 192-d, 4 heads, blocks (2, 4, 4, 4)."""
    args = dict(
        shifts="imagenet10",
        kernel_size=9,
        stride=7,
        padding=1,
        img_size=224,
        num_classes=1000,
        embed_dims=192,
        depths=(2, 4, 4, 4),
        num_heads=4,
    )
    return _create("lsa_tiny_224", pretrained, **dict(args, **kwargs))


@register_model
def lsa_small_224(pretrained=False, **kwargs) -> LSA:
    """Our-S, ImageNet (Table 4: 22.0M): K=S=4 (3136 tokens), dims (64, 192, 384), heads (2, 6, 12), blocks
    (2, 2, 10)."""
    args = dict(
        shifts="imagenet10",
        kernel_size=4,
        stride=4,
        padding=0,
        img_size=224,
        num_classes=1000,
        embed_dims=(64, 192, 384),
        depths=(2, 2, 10),
        num_heads=(2, 6, 12),
    )
    return _create("lsa_small_224", pretrained, **dict(args, **kwargs))


__all__ = ["LSA", "ShiftEmbed", "LocalShiftAttention", "LSAAttention", "SHIFTS", "resolve_shifts", "shift_image"]


# The family, as analysis, profile and report see it (locvit.models.family) ------------------------


def _read_global(attn: LSAAttention, x: torch.Tensor):
    q = attn.q(x).unflatten(-1, (attn.num_heads, attn.head_dim)).transpose(1, 2)  # (B, H, N, hd)
    k = attn.kv(x).unflatten(-1, (2, attn.kv_heads, attn.head_dim))[:, :, 0].transpose(1, 2)  # (B, h_kv, N, hd)
    return "softmax", softmax_map(q, k, attn.head_dim**-0.5)  # a shared K (h_kv = 1) broadcasts over heads


def _read_local(attn: LocalShiftAttention, x: torch.Tensor, z: torch.Tensor):
    return "shift", attn.weights(x, z).permute(0, 3, 2, 1)  # (B, S, N, H) -> (B, H, N, S)


def _blocks(model: LSA) -> list[nn.Module]:
    return [b for level in model.levels for b in level]


def _sites(model: LSA) -> list[AttentionSite]:
    readers = {LSAAttention: _read_global, LocalShiftAttention: _read_local}
    return [
        AttentionSite(b.attn, tuple(grid), exact_reader(b.attn, readers))
        for blocks, grid in zip(model.levels, model.grids)
        for b in blocks
    ]


def _summary(model: LSA) -> dict:
    embed = model.patch_embed
    return {
        "lsa": {
            "num_shifts": len(model.shifts),
            "shift_mode": embed.shift_mode,
            "pos_embed": "per_variant" if embed.pos_embed.shape[0] > 1 else "shared",
            "local_block": bool(model.local_block),
        }
    }


register_family(
    Family(
        "lsa",
        "LSA",
        LSA,
        "locally shifted attention over each patch's shifted copies, then global attention in a pyramid",
        _blocks,
        _sites,
        options=_summary,
        models=("lsa_",),
        kinds=(SHIFT, SOFTMAX),
        small=SmallBuild(  # nine shifts on a 4 x 4 grid of 4-pixel patches, two levels
            "lsa_tiny_cifar",
            dict(
                img_size=16,
                kernel_size=4,
                stride=4,
                padding=0,
                embed_dims=24,
                depths=(2, 1),
                num_heads=3,
                shifts="axes9",
            ),
            kinds=("shift", "softmax", "softmax"),
        ),
    )
)
