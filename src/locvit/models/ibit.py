"""IBiT: Learned Mask Self-Attention (LMSA), a learned low-rank mask on the attention logits.

Paper: "IBiT: Utilizing Inductive Biases to Create a More Data Efficient Attention Mechanism"
(anonymous, under review); where it is vague, the authors' code (github giriguy/ConvFormer, read only).
Each choice where they differ is an option: docs/models.md, IBiT. Blocks: ``LearnedMaskAttention``
(via ``VisionTransformer(attn_layer=...)``), ``IBiTBlock``; model: ``IBiT``; Algorithm 1's fit:
``fit_mask_factors``, cached by ``initial_factors``. Per head the mask is ``L = A^T B`` ((rank, N) factors)
stored relative to the query and rolled into place, ``mask[p, k] = L[p, (k - p) mod N]`` (a 1-D roll that
wraps across image rows, as the code's); prefix tokens' rows and columns are fixed at 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from functools import partial
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention, register_notrace_module
from timm.models import register_model
from timm.models._builder import build_model_with_cfg
from timm.models._registry import generate_default_cfgs
from timm.models.deit import _cfg
from timm.models.vision_transformer import Block, VisionTransformer

from locvit import io
from locvit.errors import allowed
from locvit.io import atomic_path
from locvit.models.family import (
    FROBENIUS,
    SHALLOW_VIT,
    SMALL_VIT,
    SOFTMAX,
    Cfg,
    Extra,
    Family,
    SmallBuild,
    normed_qk,
    register_family,
    vit_blocks,
    vit_sites,
)

log = logging.getLogger(__name__)

KERNELS = ("radial", "gaussian")
NORMALIZATIONS = ("frobenius", "softmax")
RESIDUALS = ("prenorm", "reference")
POS_EMBEDS = ("learn", "sincos", "none")
NORM_EPS = 1e-8  # added to the Frobenius norm, as in the authors' code
FIT_FORMAT = 1  # bump when the fit or its file changes: old files are then ignored


# ---------------------------------------------------------------------------------------
# The kernel, the roll and the fit (Algorithm 1)


def kernel_matrix(grid: tuple[int, int], kernel: str = "radial") -> torch.Tensor:
    """(N, N) float32, N = H*W: ``K[p, k]`` = kernel of the distance between patches p and k."""
    allowed("mask_kernel", kernel, KERNELS)
    h, w = grid
    idx = torch.arange(h * w, device="cpu")  # built on the CPU, whatever the default device
    rows, cols = idx // w, idx % w
    sq = ((rows[:, None] - rows[None, :]) ** 2 + (cols[:, None] - cols[None, :]) ** 2).double()
    k = torch.exp(-0.5 * sq.sqrt()) if kernel == "radial" else torch.exp(-0.5 * sq)
    return k.float()


def roll_index(n: int) -> torch.Tensor:
    """(n, n) long: ``mask = L.gather(-1, idx)`` puts ``mask[p, k] = L[p, (k - p) mod n]``."""
    i = torch.arange(n, device="cpu")
    return (i[None, :] - i[:, None]) % n


def unroll_index(n: int) -> torch.Tensor:
    """(n, n) long, the inverse of ``roll_index``: ``L = mask.gather(-1, idx)``."""
    i = torch.arange(n, device="cpu")
    return (i[:, None] + i[None, :]) % n


def rolled_kernel(grid: tuple[int, int], kernel: str = "radial") -> torch.Tensor:
    """The fit's target: each patch's kernel stored relative to the patch, (N, N)."""
    k = kernel_matrix(grid, kernel)
    return k.gather(-1, unroll_index(k.shape[0]))


@dataclasses.dataclass(frozen=True)
class MaskFit:
    """Everything the initial mask depends on, and so the key of its cache."""

    grid: tuple[int, int]
    rank: int = 9
    kernel: str = "radial"
    steps: int = 10_000
    lr: float = 0.1
    seed: int = 0
    init_std: float = 1e-3

    def record(self) -> dict:
        return {**dataclasses.asdict(self), "grid": list(self.grid), "format": FIT_FORMAT}

    def file_name(self) -> str:
        h, w = self.grid
        return (
            f"lmsa_{h}x{w}_rank{self.rank}_{self.kernel}_steps{self.steps}_lr{self.lr:g}"
            f"_seed{self.seed}_std{self.init_std:g}_v{FIT_FORMAT}.pt"
        )


def fit_mask_factors(spec: MaskFit) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Algorithm 1: ``A, B`` (rank, N) with ``A^T B`` fitted to the rolled kernel by Adam on MSE.

    Returns ``(A, B, mse)`` on the CPU. The gradient of the MSE is written out (``G = 2/N^2
    (A^T B - L)``, ``dA = B G^T``, ``dB = A G``): the same step as autograd's, at a third of
    the cost per step, which dominates 10,000 tiny steps.
    """
    target = rolled_kernel(spec.grid, spec.kernel)  # (N, N)
    n = target.shape[0]
    gen = torch.Generator(device="cpu").manual_seed(spec.seed)
    a = nn.Parameter(torch.randn(spec.rank, n, generator=gen, device="cpu") * spec.init_std)
    b = nn.Parameter(torch.randn(spec.rank, n, generator=gen, device="cpu") * spec.init_std)
    a.grad, b.grad = torch.zeros_like(a), torch.zeros_like(b)
    opt = torch.optim.Adam([a, b], lr=spec.lr, fused=True)
    # One thread: the ops are too small to split, and on a busy machine a second thread
    # made each step 50x slower (8 ms instead of 0.15 ms at 14 x 14).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            for _ in range(spec.steps):
                g = torch.addmm(target, a.t(), b, beta=-1.0).mul_(2.0 / target.numel())  # (N, N)
                torch.mm(b, g.t(), out=a.grad)
                torch.mm(a, g, out=b.grad)
                opt.step()
            mse = F.mse_loss(a.t() @ b, target).item()
    finally:
        torch.set_num_threads(threads)
    return a.detach().clone(), b.detach().clone(), mse


def cache_dir() -> Path:
    """Where fits are kept: ``$LOCVIT_CACHE_DIR/ibit``, else ``~/.cache/locvit/ibit``."""
    return io.cache_dir("ibit")


_FITS: dict[MaskFit, tuple[torch.Tensor, torch.Tensor]] = {}  # this process's fits


def initial_factors(spec: MaskFit) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, B)`` of ``fit_mask_factors``, fitted once: from this process, the disk, or a fit."""
    if spec in _FITS:
        return _FITS[spec]
    path = cache_dir() / spec.file_name()
    factors = _read_fit(path, spec)
    if factors is None:
        log.info("IBiT: fitting the initial mask for %s (once; kept in %s)", spec, path)
        a, b, mse = fit_mask_factors(spec)
        factors = (a, b)
        _write_fit(path, spec, a, b, mse)
    _FITS[spec] = factors
    return factors


def _read_fit(path: Path, spec: MaskFit) -> tuple[torch.Tensor, torch.Tensor] | None:
    if not path.is_file():
        return None
    n = spec.grid[0] * spec.grid[1]
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        a, b = data["a"], data["b"]
        if data["key"] != spec.record() or a.shape != (spec.rank, n) or b.shape != (spec.rank, n):
            raise ValueError("it holds a different fit")
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            raise ValueError("it holds non-finite values")
    except Exception as err:  # noqa: BLE001  (torch.load fails in many ways; any of them means refit)
        log.warning(f"IBiT mask-fit cache {path} is unusable ({type(err).__name__}: {err}); refitting")
        return None
    return a.float(), b.float()


def _write_fit(path: Path, spec: MaskFit, a: torch.Tensor, b: torch.Tensor, mse: float) -> None:
    try:
        with atomic_path(path) as tmp:  # concurrent jobs each write whole files; the last one wins
            torch.save({"key": spec.record(), "a": a, "b": b, "mse": mse}, tmp)
    except OSError as err:
        log.warning(f"IBiT mask fit not cached ({err}); the next process will fit again")


# ---------------------------------------------------------------------------------------
# Blocks


class FrobeniusAttention(torch.autograd.Function):
    """``(S * M) @ V / (||S * M||_F + eps)`` with ``S = Q K^T``, the norm per (sample, head) map.

    ``q, k, v`` (B, H, T, hd), ``mask`` (H, T, T); autograd's values and gradients with fewer passes over
    the maps. With ``A = S * M``, ``n = ||A|| + eps`` and ``O = A V / n``, for an output gradient ``G``:
    ``dA = (G / n) V^T - A * sum(G * O) / (n ||A||)``, ``dV = A^T G / n``,
    ``dS = dA * M``, ``dM = sum over the batch of dA * S``.
    """

    @staticmethod
    def forward(ctx, q, k, v, mask):
        # Autograd runs the backward outside this autocast state (CUDA: on its own thread); the
        # backward enters it again, torch.amp.custom_fwd / custom_bwd's rule for any device.
        device = q.device.type
        ctx.autocast = (
            dict(device_type=device, enabled=torch.is_autocast_enabled(device), dtype=torch.get_autocast_dtype(device))
            if torch.amp.is_autocast_available(device)
            else None
        )
        s = q @ k.transpose(-2, -1)  # (B, H, T, T)
        a = s * mask
        r = torch.linalg.vector_norm(a, dim=(-2, -1), keepdim=True).to(a.dtype)  # (B, H, 1, 1)
        n = r + NORM_EPS
        out = (a @ v).div_(n)  # (B, H, T, hd)
        ctx.save_for_backward(q, k, v, mask, s, a, r, n, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, mask, s, a, r, n, out = ctx.saved_tensors
        with torch.autocast(**ctx.autocast) if ctx.autocast else contextlib.nullcontext():
            g = grad / n
            beta = (grad * out).sum(dim=(-2, -1), keepdim=True) / (n * r.clamp_min(NORM_EPS))  # (B, H, 1, 1)
            grad_a = (g @ v.transpose(-2, -1)).addcmul_(a, beta, value=-1.0)  # (B, H, T, T)
            grad_v = a.transpose(-2, -1) @ g
            grad_s = grad_a * mask
            grad_mask = grad_a.mul_(s).sum(dim=0)  # (H, T, T); grad_a is spent
            return grad_s @ k, grad_s.transpose(-2, -1) @ q, grad_v, grad_mask


@register_notrace_module  # torch.fx calls it as a leaf: a custom autograd Function and a caller's-mask check
class LearnedMaskAttention(Attention):
    """timm ``Attention`` with IBiT's learned mask; it has none until ``configure`` gives it the patch grid."""

    __constants__ = ["norm_eps"]
    norm_eps = NORM_EPS  # a constant TorchScript can read (it cannot read a module's global float)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.normalize = "frobenius"
        self.num_prefix = 0
        self.fit: MaskFit | None = None
        self.register_parameter("mask_a", None)  # (H, rank, N) after configure()
        self.register_parameter("mask_b", None)
        self.register_buffer("roll", torch.zeros(0, 0, dtype=torch.long), persistent=False)  # (N, N)

    def configure(
        self,
        grid: tuple[int, int],
        num_prefix: int,
        rank: int = 9,
        kernel: str = "radial",
        normalize: str = "frobenius",
        fit_steps: int = 10_000,
        fit_lr: float = 0.1,
    ) -> None:
        """Create the mask for an ``H x W`` patch grid after ``num_prefix`` class/register tokens."""
        allowed("normalize", normalize, NORMALIZATIONS)
        allowed("mask_kernel", kernel, KERNELS)
        self.normalize = normalize
        if rank < 1 or fit_steps < 0 or fit_lr <= 0:
            raise ValueError(
                f"mask_rank ({rank}) must be >= 1, mask_fit_steps ({fit_steps}) >= 0 and mask_fit_lr ({fit_lr}) > 0"
            )
        self.num_prefix = num_prefix
        self.fit = MaskFit(tuple(int(s) for s in grid), int(rank), kernel, int(fit_steps), float(fit_lr))
        n = self.fit.grid[0] * self.fit.grid[1]
        like = self.qkv.weight
        self.mask_a = nn.Parameter(torch.empty(self.num_heads, rank, n, device=like.device, dtype=like.dtype))
        self.mask_b = nn.Parameter(torch.empty(self.num_heads, rank, n, device=like.device, dtype=like.dtype))
        self.roll = roll_index(n).to(like.device)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Every head starts from the cached fit; nothing to do before configure() or on ``meta``."""
        if self.mask_a is None or self.mask_a.is_meta:
            return
        self.roll.copy_(roll_index(self.roll.shape[0]))  # after meta -> to_empty() it holds garbage
        a, b = initial_factors(self.fit)
        self.mask_a.copy_(a.expand_as(self.mask_a))
        self.mask_b.copy_(b.expand_as(self.mask_b))

    def init_weights(self) -> None:
        """timm's ViT init calls this hook on every module that has one."""
        self.reset_parameters()

    def full_mask(self) -> torch.Tensor:
        """The mask over all tokens, (H, T, T), T = prefix tokens + N: differentiable."""
        low = self.mask_a.transpose(-2, -1) @ self.mask_b  # (H, N, N), rows relative to the query
        mask = low.gather(-1, self.roll.expand_as(low))  # (H, N, N): mask[p, k] = low[p, (k - p) mod N]
        if self.num_prefix:
            p = self.num_prefix
            mask = F.pad(mask, (p, 0, p, 0), value=1.0)  # prefix rows and columns are 1
        return mask

    def _normed_qk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.jit.is_scripting():  # the same as normed_qk, which takes the layer: TorchScript cannot pass one
            return self.q_norm(q).to(v.dtype), self.k_norm(k).to(v.dtype)
        else:
            return normed_qk(self, q, k, v)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        B, T, _ = x.shape
        if self.mask_a is None:
            raise RuntimeError("LearnedMaskAttention has no mask yet: call configure(grid, num_prefix) first")
        if T != self.roll.shape[0] + self.num_prefix:
            raise ValueError(
                f"LMSA's mask is for {self.num_prefix} prefix + {self.roll.shape[0]} patch tokens, "
                f"got {T} tokens: the image size (and token count) is fixed when the model is built"
            )
        qkv = self.qkv(x).reshape(B, T, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        # One copy here, rather than one inside each of the six matmuls (forward and backward)
        # that would otherwise flatten a strided (B, H) batch.
        q, k, v = qkv.contiguous().unbind(0)  # (B, H, T, hd)
        q, k = self._normed_qk(q, k, v)  # one dtype, as FrobeniusAttention's backward needs
        return q, k, v

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if attn_mask is not None or is_causal:
            raise NotImplementedError("LMSA applies its own learned mask; attn_mask / is_causal are not supported")
        B, T, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        q, k, v = self._qkv(x)
        mask = (self.full_mask() * self.scale).to(q.dtype)  # (H, T, T); the 1/sqrt(d) folded in
        if self.normalize == "softmax":
            out = self.attn_drop(((q @ k.transpose(-2, -1)) * mask).softmax(dim=-1)) @ v
        elif torch.jit.is_scripting():
            # TorchScript cannot run a custom autograd Function: the plain expression, whose values and
            # gradients FrobeniusAttention reproduces (it only saves passes over the maps).
            out = self._frobenius(q, k, v, mask)
        elif self.training and self.attn_drop.p > 0:
            out = self._frobenius(q, k, v, mask)
        else:
            out = FrobeniusAttention.apply(q, k, v, mask)
        x = out.transpose(1, 2).reshape(B, T, self.attn_dim)  # (B, H, T, hd) -> (B, T, C)
        x = self.norm(x)
        if gate is not None:
            x = x * gate
        return self.proj_drop(self.proj(x))

    def _frobenius(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``attn_drop(S * M) @ V / (||S * M||_F + eps)``, autograd's way (FrobeniusAttention's reference)."""
        attn = (q @ k.transpose(-2, -1)) * mask  # (B, H, T, T)
        norm = torch.linalg.vector_norm(attn, dim=(-2, -1), keepdim=True)  # (B, H, 1, 1)
        return (self.attn_drop(attn) @ v) / (norm + self.norm_eps)  # dropout scales entries: linear, commutes

    @torch.no_grad()
    def attention_maps(self, x: torch.Tensor) -> torch.Tensor:
        """Every head's normalised attention map (B, H, T, T), as the forward pass applies it to V."""
        q, k, _ = self._qkv(x)
        attn = (q @ k.transpose(-2, -1)) * (self.full_mask() * self.scale)
        if self.normalize == "softmax":
            return attn.softmax(dim=-1)
        return attn / (torch.linalg.vector_norm(attn, dim=(-2, -1), keepdim=True) + NORM_EPS)


class IBiTBlock(Block):
    """timm's pre-norm ``Block``, or (``reference``) the code's ``y = attn(LN1 x) + LN1 x``, ``MLP(LN2 y) + LN2 y``."""

    def __init__(self, *args, residual: str = "prenorm", mlp_drop_path: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        allowed("residual", residual, RESIDUALS)
        self.residual = residual
        if not mlp_drop_path:
            self.drop_path2 = nn.Identity()

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if self.residual == "prenorm":  # timm's Block.forward (TorchScript cannot call super())
            x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal)))
            return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        x = self.norm1(x)
        x = x + self.drop_path1(self.ls1(self.attn(x, attn_mask=attn_mask, is_causal=is_causal)))
        x = self.norm2(x)
        return x + self.drop_path2(self.ls2(self.mlp(x)))


# ---------------------------------------------------------------------------------------
# Model


def sincos_1d(length: int, dim: int) -> torch.Tensor:
    """The authors' fixed encoding, (1, length, dim): ``[sin(t f), cos(t f)]``, f from 1 to e^-ceil(ln T)."""
    if dim % 2:
        raise ValueError(f"pos_embed 'sincos' needs an even embed_dim, got {dim}")
    pos = torch.arange(length, dtype=torch.float64, device="cpu")[:, None]
    freq = torch.exp(-torch.linspace(0.0, math.ceil(math.log(length)), dim // 2, dtype=torch.float64, device="cpu"))
    return torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], dim=-1).float()[None]


class IBiT(VisionTransformer):
    """A timm ``VisionTransformer`` whose every attention is LMSA; its options: docs/models.md, IBiT."""

    def __init__(
        self,
        mask_rank: int = 9,
        mask_kernel: str = "radial",
        normalize: str = "frobenius",
        mask_fit_steps: int = 10_000,
        mask_fit_lr: float = 0.1,
        residual: str = "prenorm",
        mlp_drop_path: bool = False,
        pos_embed: str = "learn",
        **kwargs,
    ):
        allowed("residual", residual, RESIDUALS)
        allowed("pos_embed", pos_embed, POS_EMBEDS)
        if kwargs.get("dynamic_img_size") or kwargs.get("patch_drop_rate"):
            raise ValueError(
                "IBiT's mask is built for one patch grid: dynamic_img_size and patch_drop_rate are not supported"
            )
        self.pos_embed_kind = pos_embed  # read by init_weights(), which the parent calls
        super().__init__(
            attn_layer=LearnedMaskAttention,
            block_fn=partial(IBiTBlock, residual=residual, mlp_drop_path=mlp_drop_path),
            pos_embed="learn" if pos_embed == "sincos" else pos_embed,
            **kwargs,
        )
        if pos_embed == "sincos":  # a fixed buffer in the learned table's place
            like = self.pos_embed
            del self.pos_embed
            self.register_buffer("pos_embed", torch.empty_like(like), persistent=False)
            self._fill_sincos()
        grid = tuple(self.patch_embed.grid_size)
        for block in self.blocks:
            block.attn.configure(
                grid,
                self.num_prefix_tokens,
                rank=mask_rank,
                kernel=mask_kernel,
                normalize=normalize,
                fit_steps=mask_fit_steps,
                fit_lr=mask_fit_lr,
            )
        self.mask_options = dict(
            mask_rank=mask_rank,
            mask_kernel=mask_kernel,
            normalize=normalize,
            mask_fit_steps=mask_fit_steps,
            mask_fit_lr=mask_fit_lr,
            residual=residual,
            mlp_drop_path=mlp_drop_path,
            pos_embed=pos_embed,
        )

    def init_weights(self, mode: str = "", needs_reset: bool = True) -> None:
        super().init_weights(mode, needs_reset)  # LMSA masks refill through their init_weights hook
        if getattr(self, "pos_embed_kind", "learn") == "sincos" and isinstance(self.pos_embed, torch.Tensor):
            self._fill_sincos()

    @torch.no_grad()
    def _fill_sincos(self) -> None:
        if not self.pos_embed.is_meta:
            self.pos_embed.copy_(sincos_1d(self.pos_embed.shape[1], self.pos_embed.shape[2]))


def _create(variant: str, pretrained: bool = False, **kwargs) -> IBiT:
    if pretrained:
        raise ValueError(f"{variant}: no pretrained weights exist for IBiT; use pretrained=False")
    return build_model_with_cfg(IBiT, variant, pretrained=False, **kwargs)


# No released weights: the config carries input size, classes and DeiT's normalisation.
default_cfgs = generate_default_cfgs({"ibit_tiny_patch16_224": Cfg(**_cfg(url=""), small=SHALLOW_VIT)})


@register_model
def ibit_tiny_patch16_224(pretrained=False, **kwargs) -> IBiT:
    """IBiT-Tiny (Table 1: DeiT-Tiny's shape, 12 layers, 3 heads, 192-d; rank-9 masks; 5.84M)."""
    args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, mask_rank=9)
    return _create("ibit_tiny_patch16_224", pretrained, **dict(args, **kwargs))


# The family, as analysis, profile and report see it (locvit.models.family) ------------------------


def _read_learned(attn: LearnedMaskAttention, x: torch.Tensor):
    return ("frobenius" if attn.normalize == "frobenius" else "softmax"), attn.attention_maps(x)


@torch.no_grad()
def learned_masks(model: nn.Module) -> torch.Tensor:
    """IBiT's learned masks as images: (L, H, gh, gw) float32 on the CPU.

    Per layer and head, the mask's row (before the 1/sqrt(d) scale) of the centre patch ``(gh // 2, gw // 2)``
    over the patch keys: at initialisation the radial kernel around it (Sec. 3.3).
    """
    attns = [m for m in model.modules() if isinstance(m, LearnedMaskAttention)]
    if not attns:
        raise ValueError(f"learned_masks: {type(model).__name__} has no IBiT learned-mask attention layer")
    images = []
    for attn in attns:
        (gh, gw), p = attn.fit.grid, attn.num_prefix
        centre = p + (gh // 2) * gw + gw // 2  # the centre patch's token
        images.append(attn.full_mask()[:, centre, p:].reshape(-1, gh, gw))  # (H, gh, gw)
    return torch.stack(images).float().cpu()


def _summary(model: IBiT) -> dict:
    opts = model.mask_options
    return {"ibit": {"rank": opts["mask_rank"], "normalize": opts["normalize"], "mask_kernel": opts["mask_kernel"]}}


register_family(
    Family(
        "ibit",
        "IBiT",
        IBiT,
        "learned low-rank multiplicative attention masks, initialised as a local radial kernel",
        vit_blocks,
        lambda m: vit_sites(m, {LearnedMaskAttention: _read_learned}),
        options=_summary,
        extras=(
            Extra(
                "learned_masks",
                "images",
                learned_masks,
                "Learned masks",
                "Learned attention masks around the centre patch (IBiT Fig. 6)",
                pdf=True,
            ),
        ),
        models=("ibit_",),
        kinds=(FROBENIUS, SOFTMAX),
        small=SmallBuild("ibit_tiny_patch16_224", dict(SMALL_VIT, mask_fit_steps=2000), kinds=("frobenius",) * 2),
    )
)
