"""PVT v1: Pyramid Vision Transformer (Wang et al., ICCV 2021), which timm lacks (it has v2).

Blocks: timm's PVT v2 ``Attention`` with ``sr_ratio > 1`` and no linear attention is v1's spatial-reduction
attention exactly (keys and values from the grid pooled by an R x R stride-R conv and a LayerNorm), used as
it is; ``PvtBlock`` puts v1's plain ``Mlp`` (no depth-wise conv: v2's change) around it. Model:
``PyramidVisionTransformer``, four stages of patch embedding, positions and blocks; the class token joins in
stage 4 (global, R = 1), whose maps are ``softmax``, the others' ``pooled_keys``. Sizes are the PVT paper's
Table 1; LSA's "PVT-B" is PVT-Large. At 32 px ``CIFAR`` embeds pixels (``patch_size=1``): why, and the
sizes against the papers', docs/models.md.
"""

# No `from __future__ import annotations`: torch.fx copies forward's annotations into the code it
# generates, and TorchScript cannot read them as strings (as in lsa.py).

from collections.abc import Sequence

import torch
import torch.nn as nn
from timm.layers import DropPath, Mlp, PatchEmbed, calculate_drop_path_rates, to_2tuple, trunc_normal_
from timm.models import register_model
from timm.models._builder import build_model_with_cfg
from timm.models._features import feature_take_indices
from timm.models._registry import generate_default_cfgs
from timm.models.pvt_v2 import Attention as SRAttention

from locvit.errors import allowed
from locvit.models.family import (
    POOLED,
    SOFTMAX,
    AttentionSite,
    Cfg,
    Family,
    SmallBuild,
    exact_reader,
    register_family,
    softmax_map,
)


class PvtBlock(nn.Module):
    """PVT v1's block: ``x + SRA(LN(x))``, then ``x + MLP(LN(x))`` (a plain MLP, GELU)."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        mlp_ratio: float,
        sr_ratio: int,
        qkv_bias: bool = True,
        proj_drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = SRAttention(
            dim, num_heads=num_heads, sr_ratio=sr_ratio, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=proj_drop
        )
        self.drop_path1 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=nn.GELU, drop=proj_drop)
        self.drop_path2 = DropPath(drop_path) if drop_path > 0.0 else nn.Identity()

    def forward(self, x: torch.Tensor, feat_size: list[int]) -> torch.Tensor:  # x (B, [1 +] h * w, C)
        x = x + self.drop_path1(self.attn(self.norm1(x), feat_size))
        return x + self.drop_path2(self.mlp(self.norm2(x)))


class PvtStage(nn.Module):
    """Patch embedding (B, C, H, W) -> (B, h * w, dim), [class token,] positional embedding, blocks."""

    def __init__(
        self,
        img_size: tuple[int, int],
        patch_size: int,
        in_chans: int,
        dim: int,
        depth: int,
        num_heads: int,
        mlp_ratio: float,
        sr_ratio: int,
        cls_token: bool,
        qkv_bias: bool,
        pos_drop: float,
        proj_drop: float,
        attn_drop: float,
        drop_paths: Sequence[float],
    ):
        super().__init__()
        self.patch_embed = PatchEmbed(img_size, patch_size, in_chans, dim, norm_layer=nn.LayerNorm)
        gh, gw = self.patch_embed.grid_size
        self.feat_size: list[int] = [gh, gw]  # a list: SRAttention takes List[int] (TorchScript)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim)) if cls_token else None
        self.pos_embed = nn.Parameter(torch.zeros(1, gh * gw + int(cls_token), dim))
        self.pos_drop = nn.Dropout(pos_drop)
        self.blocks = nn.ModuleList(
            [
                PvtBlock(dim, num_heads, mlp_ratio, sr_ratio, qkv_bias, proj_drop, attn_drop, drop_paths[i])
                for i in range(depth)
            ]
        )
        trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            trunc_normal_(self.cls_token, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)  # (B, h * w, dim)
        if self.cls_token is not None:
            x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = self.pos_drop(x + self.pos_embed)
        for block in self.blocks:
            x = block(x, self.feat_size)
        return x

    def to_map(self, x: torch.Tensor) -> torch.Tensor:
        """The stage's patch tokens (class token dropped) as a (B, dim, h, w) map."""
        if self.cls_token is not None:
            x = x[:, 1:]
        return x.transpose(1, 2).reshape(x.shape[0], -1, self.feat_size[0], self.feat_size[1])


class PyramidVisionTransformer(nn.Module):
    """PVT v1 (module docstring). ``global_pool``: ``token`` (the class token, PVT v1's) or ``avg``
    (the mean of stage 4's patch tokens)."""

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dims: Sequence[int] = (64, 128, 320, 512),
        num_heads: Sequence[int] = (1, 2, 5, 8),
        mlp_ratios: Sequence[float] = (8, 8, 4, 4),
        depths: Sequence[int] = (2, 2, 2, 2),
        sr_ratios: Sequence[int] = (8, 4, 2, 1),
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        pos_drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
    ):
        super().__init__()
        allowed("global_pool", global_pool, ("token", "avg"))
        if not len(embed_dims) == len(num_heads) == len(mlp_ratios) == len(depths) == len(sr_ratios) == 4:
            raise ValueError(
                "embed_dims, num_heads, mlp_ratios, depths and sr_ratios: give 4 values each (one per stage)"
            )
        self.num_classes = num_classes
        self.global_pool = global_pool
        self.num_features = self.head_hidden_size = self.embed_dim = embed_dims[-1]
        rates = calculate_drop_path_rates(drop_path_rate, list(depths), stagewise=True)  # timm's linear ramp, per stage
        stages, self.feature_info = [], []
        size, chans, reduction = to_2tuple(img_size), in_chans, 1  # (H, W) of each stage's input
        for i in range(4):
            stride = patch_size if i == 0 else 2
            stages.append(
                PvtStage(
                    size,
                    stride,
                    chans,
                    embed_dims[i],
                    depths[i],
                    num_heads[i],
                    mlp_ratios[i],
                    sr_ratios[i],
                    i == 3,
                    qkv_bias,
                    pos_drop_rate,
                    proj_drop_rate,
                    attn_drop_rate,
                    rates[i],
                )
            )
            size, chans, reduction = (size[0] // stride, size[1] // stride), embed_dims[i], reduction * stride
            self.feature_info.append(dict(num_chs=chans, reduction=reduction, module=f"stages.{i}"))
        self.stages = nn.ModuleList(stages)
        self.norm = nn.LayerNorm(embed_dims[-1], eps=1e-6)
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        self.apply(_init_weights)

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {n for n, _ in self.named_parameters() if n.endswith(("pos_embed", "cls_token"))}

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        if global_pool is not None:
            allowed("global_pool", global_pool, ("token", "avg"))
            self.global_pool = global_pool
        self.num_classes = num_classes
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> stage 4's tokens after the final norm, (B, 1 + N, C)."""
        for i, stage in enumerate(self.stages):
            x = stage(x)
            if i < len(self.stages) - 1:  # the next stage embeds the map
                x = stage.to_map(x)
        return self.norm(x)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """timm's feature API: the outputs of the stages in ``indices`` as (B, C, h, w) maps (class token
        dropped), and ``forward_features``'s output (the last stage run's tokens when ``stop_early``
        stops before stage 4); ``norm`` applies the final norm to stage 4's map."""
        allowed("output_fmt", output_fmt, ("NCHW",))
        take, last = feature_take_indices(len(self.stages), indices)
        intermediates = []
        stages = self.stages[: last + 1] if stop_early else self.stages
        for i, stage in enumerate(stages):
            x = stage(x)
            if i in take:
                intermediates.append(stage.to_map(self.norm(x) if norm and i == 3 else x))
            if i < len(stages) - 1:
                x = stage.to_map(x)
        if intermediates_only:
            return intermediates
        return (self.norm(x) if len(stages) == 4 else x), intermediates  # stopped early: that stage's tokens

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x[:, 1:].mean(dim=1) if self.global_pool == "avg" else x[:, 0]
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


def _init_weights(m: nn.Module) -> None:
    """PVT v1's: truncated-normal linear weights (std 0.02), zero biases; LayerNorms 1 and 0."""
    if isinstance(m, nn.Linear):
        trunc_normal_(m.weight, std=0.02)
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    elif isinstance(m, nn.LayerNorm):
        nn.init.ones_(m.weight)
        nn.init.zeros_(m.bias)


def _cfg() -> Cfg:
    return Cfg(
        url="",
        num_classes=1000,
        input_size=(3, 224, 224),
        pool_size=None,
        crop_pct=0.9,
        interpolation="bicubic",
        fixed_input_size=True,
        mean=(0.485, 0.456, 0.406),
        std=(0.229, 0.224, 0.225),
        first_conv="stages.0.patch_embed.proj",
        classifier="head",
        small=dict(img_size=32, depths=(1, 1, 1, 1)),
    )


SIZES = {
    "pvt_v1_tiny": (2, 2, 2, 2),
    "pvt_v1_small": (3, 4, 6, 3),
    "pvt_v1_medium": (3, 4, 18, 3),
    "pvt_v1_large": (3, 8, 27, 3),
}
#: LSA Table 3's CIFAR setting (docs/models.md, pvt.py): a variant at 32 px with 10 classes sets this.
CIFAR = dict(patch_size=1)
default_cfgs = generate_default_cfgs({name: _cfg() for name in SIZES})


def _create(variant: str, pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    if pretrained:
        raise ValueError(f"{variant}: no pretrained weights for PVT v1 in locvit; use pretrained=False")
    return build_model_with_cfg(
        PyramidVisionTransformer,
        variant,
        pretrained=False,
        feature_cfg=dict(out_indices=(0, 1, 2, 3), feature_cls="getter"),  # the stages' maps
        **dict(dict(depths=SIZES[variant]), **kwargs),
    )


@register_model
def pvt_v1_tiny(pretrained=False, **kwargs) -> PyramidVisionTransformer:
    """PVT-T (13.2M; MaiT Table 4, LSA Tables 3 and 4)."""
    return _create("pvt_v1_tiny", pretrained, **kwargs)


@register_model
def pvt_v1_small(pretrained=False, **kwargs) -> PyramidVisionTransformer:
    """PVT-S (24.5M; MaiT Table 4, LSA Tables 3 and 4)."""
    return _create("pvt_v1_small", pretrained, **kwargs)


@register_model
def pvt_v1_medium(pretrained=False, **kwargs) -> PyramidVisionTransformer:
    """PVT-M (44.2M; MaiT Table 4)."""
    return _create("pvt_v1_medium", pretrained, **kwargs)


@register_model
def pvt_v1_large(pretrained=False, **kwargs) -> PyramidVisionTransformer:
    """PVT-L (61.4M; LSA Table 3's "PVT-B", 60.9M at CIFAR's 10 classes)."""
    return _create("pvt_v1_large", pretrained, **kwargs)


# The family, as analysis, profile and report see it (locvit.models.family) -----------------------


def read_sra(attn: SRAttention, x: torch.Tensor, feat_size: list[int]) -> tuple[str, torch.Tensor]:
    """Spatial-reduction attention: ``pooled_keys`` (B, H, N, N / R^2) where the keys come from the pooled
    grid (R > 1), else ``softmax`` (B, H, T, T) over the layer's own tokens (stage 4: class token + grid)."""
    if attn.pool is not None:
        raise ValueError("PVT v2's linear spatial-reduction attention (linear_attn) is not PVT v1's; no reader")
    b, n, c = x.shape
    q = attn.q(x).reshape(b, n, attn.num_heads, -1).transpose(1, 2)  # (B, H, N, hd)
    kind, source = "softmax", x
    if attn.sr is not None:  # keys and values from the R x R-pooled grid: (B, N / R^2, C)
        kind = "pooled_keys"
        source = attn.norm(attn.sr(x.transpose(1, 2).reshape(b, c, *feat_size)).flatten(2).transpose(1, 2))
    k = attn.kv(source).reshape(b, -1, 2, attn.num_heads, attn.head_dim)[:, :, 0].transpose(1, 2)  # (B, H, M, hd)
    return kind, softmax_map(q, k, attn.scale)


def _blocks(model: PyramidVisionTransformer) -> list[nn.Module]:
    return [block for stage in model.stages for block in stage.blocks]


def _sites(model: PyramidVisionTransformer) -> list[AttentionSite]:
    return [
        AttentionSite(block.attn, tuple(stage.feat_size), exact_reader(block.attn, {SRAttention: read_sra}))
        for stage in model.stages
        for block in stage.blocks
    ]


def reduction_problems(model: PyramidVisionTransformer) -> list[str]:
    """Stages whose grid is smaller than their key reduction ``R`` (the ``R x R`` stride-``R`` conv cannot pool
    it: the first forward pass fails) or not a multiple of it (the conv drops the grid's last rows and
    columns from the keys)."""
    problems = []
    for i, stage in enumerate(model.stages):
        (h, w), sr = stage.feat_size, stage.blocks[0].attn.sr
        r = sr.kernel_size[0] if sr is not None else 1
        if h % r or w % r:
            problems.append(
                f"stage {i + 1}: its {h}x{w} grid is {'smaller than' if min(h, w) < r else 'not a multiple of'} "
                f"its key reduction {r} (sr_ratios[{i}]); choose kwargs.sr_ratios dividing each stage's "
                f"grid, or a larger image or smaller patch_size"
            )
    return problems


register_family(
    Family(
        "pvt_v1",
        "PVT",
        PyramidVisionTransformer,
        "none in the attention: global attention over "
        "keys pooled by a strided conv (8x8, 4x4, 2x2 cells of the grid in stages 1-3); a "
        "pyramid of shrinking grids",
        _blocks,
        _sites,
        models=("pvt_v1_",),
        kinds=(POOLED, SOFTMAX),
        # one block per stage: stages 1-3 attend to a pooled key grid, stage 4 to its own
        small=SmallBuild(
            "pvt_v1_tiny", dict(img_size=32, depths=(1, 1, 1, 1)), kinds=("pooled_keys",) * 3 + ("softmax",)
        ),
        check=reduction_problems,
    )
)

__all__ = ["PyramidVisionTransformer", "PvtBlock", "PvtStage", "read_sra", "CIFAR", "SIZES"]
