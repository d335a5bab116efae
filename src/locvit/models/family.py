"""The model-family protocol: what analysis, profiling and the report need to know about a family.

A family is one file: the timm model (``@register_model``) and, at its end, one ``Family`` passed to
``register_family``; nothing else in locvit names a family, and one outside locvit (params.yaml's
``model_modules``) does the same. Attention records name a ``MapKind`` its family declares. The
fields, the kinds' properties and the shapes of locvit's kinds: docs/models.md, "Adding a model
family". A model no family claims gets ``generic_family`` (timm's ``Attention`` and Swin's
``WindowAttention`` are read; a CNN has no attention layers).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from timm.layers import Attention
from timm.models import PretrainedCfg
from timm.models.swin_transformer import WindowAttention

KEYS = ("tokens", "pooled", "other")


@dataclasses.dataclass(frozen=True)
class MapKind:
    """What a kind of attention map is, as the analyses need to know it (fields: docs/models.md).

    keys: ``tokens`` (the queries' grid, prefix included), ``pooled`` (a grid pooled from it) or ``other``.
    """

    name: str
    grid: bool
    rows_sum_to_one: bool
    keys: str = "tokens"
    windows: bool = False
    dilated: bool = False
    description: str = ""

    def __post_init__(self):
        if self.keys not in KEYS:
            raise ValueError(f"MapKind {self.name!r}: keys {self.keys!r} is not one of {', '.join(KEYS)}")
        if self.dilated and not self.windows:
            raise ValueError(f"MapKind {self.name!r}: dilated groups are windows; declare windows=True too")

    def layout(self, grid: tuple[int, int], groups: int) -> tuple[tuple[int, int], int]:
        """The layer's full token grid, and the step on it between a group's neighbouring tokens.

        grid: one map's ``(s, s)``; groups: K maps per image, tiling a g x g grid (g = sqrt(K); else
        ValueError). Windows: step 1; dilated: group k's token (i, j) at ``(i*g + k//g, j*g + k%g)``, step g.
        """
        if not self.windows:
            return tuple(grid), 1
        g = round(groups**0.5)
        if g * g != groups:
            raise ValueError(f"map kind {self.name!r}: {groups} groups per image do not tile a square grid")
        return (grid[0] * g, grid[1] * g), g if self.dilated else 1

    @property
    def spatial(self) -> bool:
        """ALS and attention distance apply: token-by-token maps over the grid, keys on the queries' grid."""
        return self.grid and self.keys == "tokens"


SOFTMAX = MapKind("softmax", grid=True, rows_sum_to_one=True, description="softmax(QK^T / sqrt(d))")
FROBENIUS = MapKind("frobenius", grid=True, rows_sum_to_one=False, description="IBiT's Frobenius-normalised maps")
TALKING = MapKind("talking", grid=True, rows_sum_to_one=False, description="CaiT's talking heads after the mix")
CLASS = MapKind("class", grid=False, rows_sum_to_one=True, description="CaiT's class attention")
GPSA_MAP = MapKind("gpsa", grid=True, rows_sum_to_one=True, description="ConViT's gated positional attention")
SHIFT = MapKind("shift", grid=False, rows_sum_to_one=True, keys="other", description="LSA's shifted variants")
BLOCK = MapKind(
    "block",
    grid=True,
    rows_sum_to_one=True,
    windows=True,
    description="attention inside each window of a level (NesT, Swin, Twins)",
)
POOLED = MapKind(
    "pooled_keys",
    grid=True,
    rows_sum_to_one=True,
    keys="pooled",
    description="spatial reduction: keys on a pooled grid (PVT, Twins)",
)

_MAP_KINDS: dict[str, MapKind] = {}


def register_kind(kind: MapKind) -> MapKind:
    """Make a map kind known; a second kind of the same name with other properties is refused."""
    known = _MAP_KINDS.get(kind.name)
    if known is not None and dataclasses.replace(known, description="") != dataclasses.replace(kind, description=""):
        raise ValueError(
            f"map kind {kind.name!r} is declared twice with different properties: {known} and {kind}; "
            "give the new one a name of its own"
        )
    _MAP_KINDS[kind.name] = kind
    return kind


def map_kind(name: str) -> MapKind:
    """The declared kind called ``name`` (a family declares it in ``Family.kinds``)."""
    try:
        return _MAP_KINDS[name]
    except KeyError:
        raise ValueError(
            f"map kind {name!r} is declared by no registered family (known: "
            f"{', '.join(sorted(_MAP_KINDS))}); declare it in the family's kinds "
            "(locvit.models.family.MapKind)"
        ) from None


def map_kinds() -> dict[str, MapKind]:
    return dict(_MAP_KINDS)


Reader = Callable[..., "tuple[str, torch.Tensor]"]  # (layer, *its forward args) -> (kind, probs)


@dataclasses.dataclass(frozen=True)
class AttentionMap:
    """One attention layer's weights for a batch: probs float32 on the CPU, shaped per ``kind`` (docs/models.md).

    name: the module path; layer: its position in forward order; grid: ``(gh, gw)`` of its patch tokens.
    """

    name: str
    layer: int
    probs: torch.Tensor
    grid: tuple[int, int]
    num_prefix: int
    kind: str


@dataclasses.dataclass(frozen=True)
class AttentionSite:
    """An attention layer: the module to hook, the patch grid it sees, the reader of its weights.

    num_prefix None: the layer's input tokens less the grid's (one window's for Swin and NesT).
    """

    module: nn.Module
    grid: tuple[int, int]
    read: Reader
    num_prefix: int | None = None


def _no_options(model: nn.Module) -> dict:
    return {}


EXTRA_SHAPES = ("values", "images")


@dataclasses.dataclass(frozen=True)
class Extra:
    """A family-specific analysis output, and the figure the report draws of it (shapes: docs/models.md).

    shape ``values``: (L, H), NaN where a head has none; ``images``: (L, H, gh, gw). read returns None
    where the model has none (MaiT's hard masks). caption: a sentence's start, naming no variant.
    """

    name: str
    shape: str
    read: Callable[[nn.Module], Any]
    title: str
    caption: str
    limits: tuple[float, float] | None = None
    pdf: bool = False

    def figure(self) -> dict:
        """All but ``read``: what the report draws it from (``summary``'s ``extras``)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "read"}

    def __post_init__(self):
        if self.shape not in EXTRA_SHAPES:
            raise ValueError(f"Extra {self.name!r}: shape {self.shape!r} is not one of {', '.join(EXTRA_SHAPES)}")


#: The tests' small ViT: a 4 x 4 grid of 8-pixel patches, 3 heads of 8 dimensions, 2 blocks.
SMALL_VIT = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3)
SMALL_CAIT = dict(SMALL_VIT, depth_token_only=1)  # 2 talking-heads layers, then 1 class-attention layer
#: A ViT entrypoint at the tests' size: its own widths and heads, three blocks of 8-pixel patches at 32 pixels.
SHALLOW_VIT = dict(img_size=32, patch_size=8, depth=3)


@dataclasses.dataclass(frozen=True)
class SmallBuild:
    """A model at the tests' size; size defaults to ``kwargs["img_size"]``, kinds are its layers' in forward order."""

    model: str
    kwargs: dict
    size: int | None = None
    kinds: tuple[str, ...] = ()

    def __post_init__(self):
        if self.size is None:
            if "img_size" not in self.kwargs:
                raise ValueError(f"SmallBuild({self.model!r}): give size= where the kwargs hold no img_size")
            object.__setattr__(self, "size", self.kwargs["img_size"])

    def build(self, **kwargs) -> nn.Module:
        """The model, the caller's keywords over the build's (``num_classes=...``, an option)."""
        import timm

        return timm.create_model(self.model, **{**self.kwargs, **kwargs})

    def but(self, **kwargs) -> SmallBuild:
        """The same build with some keyword arguments changed (another option of the family)."""
        return dataclasses.replace(self, kwargs={**self.kwargs, **kwargs})


@dataclasses.dataclass
class Cfg(PretrainedCfg):
    """timm's default cfg of a locvit entrypoint, with ``small``: the keywords that make it a ``SmallBuild``."""

    small: dict | None = None


def small_build(model: str) -> SmallBuild | None:
    """The small build of a timm model: its entrypoint's (``Cfg.small``), else the family's whose build it is."""
    from timm.models import get_pretrained_cfg

    cfg = get_pretrained_cfg(model)
    if isinstance(cfg, Cfg) and cfg.small is not None:
        return SmallBuild(model, cfg.small, cfg.small.get("img_size", cfg.input_size[-1]))
    return next((f.small for f in _FAMILIES.values() if f.small is not None and f.small.model == model), None)


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
    kinds: tuple[MapKind, ...] = (SOFTMAX,)  # the kinds of map its readers return
    check: Callable[[nn.Module], list[str]] = lambda model: []  # problems of a built model (``locvit validate``)
    unread: Callable[[nn.Module], list[str]] = lambda model: []  # attention layers it cannot read, by class
    small: SmallBuild | None = None  # a model it claims at the tests' size, its own attention path on


_FAMILIES: dict[str, Family] = {}
_MODULES: dict[str, str] = {}  # family name -> the module that registered it


def register_family(family: Family) -> Family:
    """Make a family and its map kinds known (re-registering a name replaces it, as re-importing its module does)."""
    for kind in family.kinds:
        register_kind(kind)
    _FAMILIES[family.name] = family
    _MODULES[family.name] = sys._getframe(1).f_globals.get("__name__", "")  # the family's file, for its code
    return family


def family_module(family: Family) -> str:
    """The module that registered ``family`` (its file: the code a job using the family runs)."""
    return _MODULES.get(family.name, "")


def families() -> dict[str, Family]:
    return dict(_FAMILIES)


def family_named(name: str) -> Family | None:
    return _FAMILIES.get(name)


def family_claiming(model: str) -> Family | None:
    """The family that claims the timm model name ``model`` (``Family.models``; the longest prefix wins)."""
    claims = [(len(prefix), f) for f in _FAMILIES.values() for prefix in f.models if model.startswith(prefix)]
    return max(claims, key=lambda c: c[0])[1] if claims else None


def family_of(model: nn.Module) -> Family:
    """The family of the most specific model class ``model`` is an instance of, else ``generic_family``."""
    mro = type(model).__mro__
    matches = [f for f in _FAMILIES.values() if isinstance(model, f.model_class)]
    if not matches:
        return generic_family(model)
    return min(matches, key=lambda f: mro.index(f.model_class))


def summary(model: nn.Module) -> dict:
    """The architecture summary the report groups variants by, the family's own options included."""
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
        "embed_dim": _width(blocks[0]) if blocks else 0,  # first level's width
        "depth": len(blocks),
        "num_heads": int(getattr(blocks[0].attn, "num_heads", 0)) if blocks else 0,
        "patch_size": int(patch[0]) if isinstance(patch, (tuple, list)) else patch,
        "layer_scale": any(
            n.split(".")[-1] in ("gamma", "gamma_1", "gamma1") or ".ls1." in n for n, _ in model.named_parameters()
        ),
        "extras": [extra.figure() for extra in family.extras],  # so the report draws them without timm
        **family.options(model),
    }


def _width(block: nn.Module) -> int:
    norm = getattr(block, "norm1", None)
    shape = getattr(norm, "normalized_shape", None)
    return int(shape[0]) if shape else int(getattr(block.attn, "dim", 0))


# Shared by the attention layers built on timm's ------------------------------------------------


def normed_qk(attn: nn.Module, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k through the layer's q/k norms (timm's ``qk_norm``), in v's dtype.

    CUDA autocast runs LayerNorm in float32; ``index_copy`` and custom backwards refuse the mix (docs/models.md).
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
        raise ValueError(
            f"{type(attn).__name__} is an attention layer no reader of its family knows "
            f"(known: {', '.join(t.__name__ for t in readers)})"
        )
    return read


def vit_blocks(model: nn.Module) -> list[nn.Module]:
    return list(model.blocks)


def vit_sites(model: nn.Module, readers: dict[type, Reader]) -> list[AttentionSite]:
    """One site per block of a ViT-like model (``blocks``, ``patch_embed.grid_size``), read by class."""
    grid = tuple(model.patch_embed.grid_size)
    return [AttentionSite(b.attn, grid, exact_reader(b.attn, readers)) for b in model.blocks]


def read_window(attn: WindowAttention, x: torch.Tensor, mask: torch.Tensor | None = None):
    """Swin's ``WindowAttention`` on x (B * nW, n, C): the softmax map of each window with the relative-position
    bias and, in a shifted block, the mask (nW, n, n) that keeps tokens from wrapped-around regions apart,
    as in forward: (B * nW, H, n, n), window index ``b * nW + k``, k row-major (a ``block`` map)."""
    q, k = split_qk(attn, x)  # (B * nW, H, n, hd)
    logits = (q * attn.scale) @ k.transpose(-2, -1) + attn._get_rel_pos_bias()
    if mask is not None:
        nw, n = mask.shape[0], logits.shape[-1]
        logits = (logits.view(-1, nw, attn.num_heads, n, n) + mask[None, :, None].to(logits.dtype)).flatten(0, 1)
    return "block", logits.softmax(dim=-1)


# Models no family claims: timm's own attention layers, read generically ----------------------------

#: timm's attention layers the generic reader knows, by exact class (a subclass may compute otherwise).
GENERIC_READERS: dict[type, Reader] = {Attention: read_vit, WindowAttention: read_window}


def _generic_sites(model: nn.Module) -> list[AttentionSite]:
    """Every layer of a class in ``GENERIC_READERS``, in module order: ViT-style ``Attention`` over
    the model's ``patch_embed.grid_size`` (left unread without one), Swin's windows over their window."""
    grid = getattr(getattr(model, "patch_embed", None), "grid_size", None)
    sites = []
    for module in model.modules():
        if type(module) is WindowAttention:
            sites.append(AttentionSite(module, tuple(module.window_size), read_window))
        elif type(module) is Attention and grid is not None:
            sites.append(AttentionSite(module, tuple(grid), read_vit))
    return sites


def _generic_blocks(model: nn.Module) -> list[nn.Module]:
    read = {site.module for site in _generic_sites(model)}
    return [m for m in model.modules() if getattr(m, "attn", None) in read]


def _generic_unread(model: nn.Module) -> list[str]:
    """Classes of the model's attention layers (timm names them ``*Attention``/``*Attn``) the generic reader
    does not read."""
    read = {site.module for site in _generic_sites(model)}
    return sorted(
        {
            type(m).__name__
            for m in model.modules()
            if m not in read and type(m).__name__.endswith(("Attention", "Attn"))
        }
    )


def generic_family(model: nn.Module) -> Family:
    """The family of a model no registered family claims, named after its class: timm's own attention
    layers read by ``GENERIC_READERS``, no locality prior declared. A CNN has no attention layers."""
    cls = type(model)
    return Family(
        cls.__name__.lower(),
        cls.__name__,
        cls,
        "not declared (no locvit family claims this model)",
        _generic_blocks,
        _generic_sites,
        kinds=(SOFTMAX, BLOCK),
        unread=_generic_unread,
    )


for _kind in (SOFTMAX, BLOCK):  # the generic reader's kinds are known without a family
    register_kind(_kind)


# A patch's spatial neighbourhood as a token mask: what MaiT's masks keep (locvit.models.mait) and what ALS
# measures on any family's attention (locvit.analysis, MaiT's Eq. 3): one definition below both users.


def neighbourhood_mask(grid: tuple[int, int], kernel: tuple[int, int] = (3, 3), num_prefix: int = 1) -> torch.Tensor:
    """Boolean (T, T) mask, T = num_prefix + H*W: which key each query row keeps.

    Patch ``p`` at (r, c) keeps patches within ``kh // 2`` rows and ``kw // 2`` columns
    (``kernel = (kh, kw)``, both odd; no wrap at the borders). Prefix rows (class,
    distillation tokens) keep every key; patch rows keep no prefix column.
    """
    kh, kw = kernel
    if kh % 2 == 0 or kw % 2 == 0 or kh < 1 or kw < 1:
        raise ValueError(f"mask_kernel must be odd sizes like (3, 3) or (3, 5), got {kernel}")
    h, w = grid
    rows = torch.arange(h, device="cpu").repeat_interleave(w)  # (N,) row of each patch; built on the CPU
    cols = torch.arange(w, device="cpu").repeat(h)
    near = ((rows[:, None] - rows[None, :]).abs() <= kh // 2) & ((cols[:, None] - cols[None, :]).abs() <= kw // 2)
    t = num_prefix + h * w
    mask = torch.zeros(t, t, dtype=torch.bool, device="cpu")
    mask[:num_prefix] = True
    mask[num_prefix:, num_prefix:] = near
    return mask
