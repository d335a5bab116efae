"""MaiT: Integrating Spatial Locality into Image Transformers with Attention Masks (anonymous; no public code).

Masks on some heads of DeiT (and CaiT) keep those heads on each patch's ``kh x kw`` neighbourhood (no wrap;
not the class token: "9 out of all (N+1)" for 3x3; class and distillation rows keep all); the others stay
global. Blocks: ``MaskedAttention`` (via ``VisionTransformer(attn_layer=...)``; unmasked heads keep the fused
path) and ``MaskedTalkingHeadAttn`` (CaiT's self-attention: the mask multiplies the logits after the
pre-softmax head mix ``proj_l``; class attention unchanged). Models: ``MaiT`` and ``MaskedCait``, masks
configured per layer after construction. ``multiply`` (Eq. 2) leaves a dropped entry at logit 0;
``restrict`` puts -inf there. Options and the choices where the paper is vague: docs/models.md, MaiT.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention, DropPath, register_notrace_module
from timm.layers.attention import maybe_add_mask, resolve_self_attn_mask
from timm.models import register_model
from timm.models._builder import build_model_with_cfg
from timm.models._registry import generate_default_cfgs
from timm.models.cait import Cait, TalkingHeadAttn
from timm.models.vision_transformer import VisionTransformer, _cfg

from locvit.device import describe_missing, missing_toolchain, require_toolchain
from locvit.errors import InputError, allowed
from locvit.models.baselines import cait_blocks, cait_sites, read_talking
from locvit.models.family import (
    CLASS,
    SHALLOW_VIT,
    SMALL_CAIT,
    SMALL_VIT,
    SOFTMAX,
    TALKING,
    Cfg,
    Extra,
    Family,
    SmallBuild,
    neighbourhood_mask,
    normed_qk,
    read_vit,
    register_family,
    vit_blocks,
    vit_sites,
)

log = logging.getLogger(__name__)

MASK_MODES = ("multiply", "restrict")
DROP_PATH_SCHEDULES = ("linear", "constant")
MASK_TYPES = ("hard", "soft", "random")
SCHEMES = ("none", "sch1", "sch2", "sch3", "mixed", "all")
HeadSpec = str | Sequence[int | Sequence[int]]
FLEX_BLOCK = 128  # FlexAttention's block size (tokens a side): it skips the block pairs a mask leaves empty
# BlockMask.from_kv_blocks' first four arguments (flex_blocks): restrict masks keep them as buffers
FLEX_BLOCK_NAMES = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
# FlexAttention's block size is 128, so a 3x3 neighbourhood mask leaves blocks empty only from about 1,000 tokens
# (docs/models.md; to be replaced by a figure measured on a GPU): restrict_kernel auto takes it from here on
FLEX_MIN_TOKENS = 1024


def random_mask(like: torch.Tensor, num_prefix: int, seed: int) -> torch.Tensor:
    """A fixed random mask with the same keep rate on the patch rows as ``like`` (Sec. 5.5 control).

    Every patch row keeps at least itself (as a neighbourhood does): with ``restrict``
    masks a row with no key left would be all -inf and its softmax NaN.
    """
    gen = torch.Generator().manual_seed(seed)
    patch_rows = like[num_prefix:]
    rate = patch_rows.float().mean().item()
    mask = like.clone()
    mask[num_prefix:] = torch.rand(patch_rows.shape, generator=gen, device="cpu") < rate
    rows = torch.arange(num_prefix, like.shape[0])
    mask[rows, rows] = True
    return mask


def scheme_heads(scheme: HeadSpec, depth: int, num_heads: int) -> list[list[int]]:
    """Masked head indices per layer from a scheme name or a per-layer list.

    A per-layer list holds a count (the first heads) or head indices; the names: docs/models.md, MaiT
    (``sch2`` at 24 layers: 0-7, 8-19, 20-23; ``sch3``: 0-20; ``mixed`` at 36: 12 + 24).
    """
    if isinstance(scheme, str):
        third, five_sixths, seven_eighths = depth // 3, (5 * depth) // 6, -(-7 * depth // 8)
        counts = {
            "none": [0] * depth,
            "sch1": [1] * depth,
            "sch2": [num_heads - 1 if i < third else 1 if i < five_sixths else 0 for i in range(depth)],
            "sch3": [num_heads if i < seven_eighths else 0 for i in range(depth)],
            "mixed": [num_heads if i < third else 1 for i in range(depth)],
            "all": [num_heads] * depth,
        }
        if scheme not in counts:
            raise InputError(
                f"masked_heads: unknown scheme {scheme!r}; allowed values: {', '.join(SCHEMES)} "
                f"or a per-layer list of head counts / head indices"
            )
        return [list(range(c)) for c in counts[scheme]]
    scheme = list(scheme)
    if len(scheme) != depth:
        raise ValueError(f"masked_heads: a per-layer list needs one entry per layer ({depth}), got {len(scheme)}")
    heads = []
    for layer, entry in enumerate(scheme):
        idx = list(range(entry)) if isinstance(entry, int) else [int(h) for h in entry]
        bad = [h for h in idx if not 0 <= h < num_heads] + (
            [entry] if isinstance(entry, int) and entry > num_heads else []
        )
        if bad or len(set(idx)) != len(idx):
            raise ValueError(
                f"masked_heads[{layer}]: {entry!r} names heads that do not exist or repeat; "
                f"this model has heads 0..{num_heads - 1}"
            )
        heads.append(sorted(idx))
    return heads


def flex_blocks(keep: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """A (T, T) boolean mask in FlexAttention's block-sparse form, ``BlockMask.from_kv_blocks``' first four
    arguments: per row of ``FLEX_BLOCK``-token query blocks, how many key blocks it keeps in part and which
    (``(1, 1, nb)`` and ``(1, 1, nb, nb)`` int32), then the same for those it keeps whole. As
    ``create_block_mask`` builds them (the tokens past T count as dropped), without its mask_mod pass."""
    nb = -(-keep.shape[0] // FLEX_BLOCK)
    pad = nb * FLEX_BLOCK - keep.shape[0]
    kept = F.pad(keep, (0, pad, 0, pad)).view(nb, FLEX_BLOCK, nb, FLEX_BLOCK).sum((1, 3))  # (nb, nb) per block
    full = kept == FLEX_BLOCK * FLEX_BLOCK
    out = []
    for blocks in (~full & (kept > 0), full):  # (nb, nb) bool
        out += [
            blocks.sum(-1).to(torch.int32)[None, None],
            blocks.to(torch.int8).argsort(dim=-1, descending=True, stable=True).to(torch.int32)[None, None],
        ]
    return tuple(out)


class _HeadMasks(nn.Module):
    """Per-head masks of one layer: which heads, the boolean neighbourhood, soft alphas."""

    def __init__(self):
        super().__init__()
        self.mode = "multiply"
        self.mask_type = "hard"
        self.leading = True
        self.register_buffer("heads", torch.zeros(0, dtype=torch.long), persistent=False)
        # The other heads, in order: kept here so that a forward finds them without a nonzero() (a host sync).
        self.register_buffer("free", torch.zeros(0, dtype=torch.long), persistent=False)
        self.register_buffer("keep", torch.zeros(0, 0, dtype=torch.bool), persistent=False)
        # restrict's keep in FlexAttention's block-sparse form (``flex_blocks``), built with the masks: a
        # compiled forward then builds its BlockMask from buffers, which follow the module's device
        for name in FLEX_BLOCK_NAMES:
            self.register_buffer(name, torch.zeros(0, dtype=torch.int32), persistent=False)
        self.alpha_logit: nn.Parameter | None = None

    @property
    def active(self) -> bool:
        return self.heads.numel() > 0

    def configure(
        self, heads: Sequence[int], num_heads: int, keep: torch.Tensor, mode: str, mask_type: str, alpha_init: float
    ):
        allowed("mask_mode", mode, MASK_MODES)
        allowed("mask_type", mask_type, MASK_TYPES)
        if mask_type == "soft" and mode != "multiply":
            raise ValueError(
                "mask_type 'soft' scales logits, so it needs mask_mode 'multiply'; for mask_mode "
                "'restrict' set mask_type to 'hard' (or 'random')"
            )
        if not 0.0 < alpha_init < 1.0:
            raise ValueError(f"alpha_init: {alpha_init} must lie in (0, 1)")
        self.mode, self.mask_type = mode, mask_type
        self.heads = torch.as_tensor(list(heads), dtype=torch.long, device=self.heads.device)
        self.free = torch.as_tensor(
            [h for h in range(num_heads) if h not in heads], dtype=torch.long, device=self.heads.device
        )
        self.leading = list(heads) == list(range(len(heads)))  # heads 0..h'-1: sliceable
        self.keep = keep.to(self.heads.device)
        if mode == "restrict":
            for name, blocks in zip(FLEX_BLOCK_NAMES, flex_blocks(self.keep)):
                setattr(self, name, blocks)
        if mask_type == "soft" and heads:
            self.alpha_logit = nn.Parameter(torch.full((len(heads),), math.log(alpha_init / (1.0 - alpha_init))))

    def alpha(self) -> torch.Tensor | None:
        return None if self.alpha_logit is None else torch.sigmoid(self.alpha_logit)

    def block_mask(self):
        """``keep`` as FlexAttention's ``BlockMask`` (restrict masks), from the block-sparse buffers: a few
        small index ops (the transposed blocks its backward reads), no (T, T) pass."""
        from torch.nn.attention.flex_attention import BlockMask

        keep, tokens = self.keep, self.keep.shape[0]

        def neighbourhood(b, h, q_idx, kv_idx):  # the blocks partly kept read keep itself
            return keep[q_idx, kv_idx]

        return BlockMask.from_kv_blocks(
            *(getattr(self, name) for name in FLEX_BLOCK_NAMES),
            BLOCK_SIZE=FLEX_BLOCK,
            mask_mod=neighbourhood,
            seq_lengths=(tokens, tokens),
        )

    def mask_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask pre-softmax logits of the masked heads: (B, h', T, T) -> (B, h', T, T)."""
        if self.mode == "restrict":
            return logits.masked_fill(~self.keep, float("-inf"))
        if self.mask_type == "soft":
            alpha = self.alpha()
            assert alpha is not None, "soft masks have their alphas once configured"
            # Neighbours x1, others x alpha[h]: (h', T, T) weights.
            weight = torch.where(
                self.keep,
                torch.ones((), device=logits.device, dtype=logits.dtype),
                alpha.to(logits.dtype)[:, None, None],
            )
            return logits * weight
        return logits * self.keep.to(logits.dtype)


# torch.fx (timm's feature extraction) calls the masked attentions as leaves: their forward
# branches on Python values (active masks, fused kernels, a caller's attn_mask) that a trace
# would freeze, or see as Proxies.
@register_notrace_module
class MaskedAttention(Attention):
    """timm ``Attention`` whose masked heads use ``softmax(M * QK^T / sqrt(d))``.

    Unconfigured (no masked head) it is timm's ``Attention`` exactly, same parameters
    and fused kernel. Configured, the unmasked heads keep the fused kernel and only
    the masked heads take the eager path, so masks cost little.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.masks = _HeadMasks()
        self._restrict_cache: torch.Tensor | None = None  # built on the first eager use (not in the state dict)
        self.restrict_kernel = "auto"  # MaiT's option (see MaiT): flex on CUDA for long sequences, else dense
        self._block_mask = None  # (device, FlexAttention's BlockMask) of the eager calls, built on the first
        # What the node lacks to compile FlexAttention (locvit.device.missing_toolchain), probed before any forward so
        # that a torch.compile'd forward reads a constant here; None: probe at the first compiled call.
        self.toolchain_missing: dict[str, str] | None = None

    def _masked_logits(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return self.masks.mask_logits((q * self.scale) @ k.transpose(-2, -1))  # (B, h', T, T)

    def _normed_qk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.jit.is_scripting():  # the same as normed_qk, which takes the layer: TorchScript cannot pass one
            return self.q_norm(q).to(v.dtype), self.k_norm(k).to(v.dtype)
        else:
            return normed_qk(self, q, k, v)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
        if not self.masks.active:
            if torch.jit.is_scripting():
                return self._unmasked(x, attn_mask, is_causal)
            else:
                return super().forward(x, attn_mask=attn_mask, is_causal=is_causal)
        if attn_mask is not None or is_causal:
            # Passing it on to timm's attention would silently drop MaiT's masks.
            raise ValueError(
                "MaiT's masked attention does not take a caller's attn_mask or is_causal: its heads "
                "are masked by masked_heads; build the model with masked_heads='none' to use them"
            )
        B, N, _ = x.shape
        n_masked = self.masks.heads.numel()
        if torch.jit.is_scripting():
            if self.restrict_kernel == "flex" and self.masks.mode == "restrict":
                raise RuntimeError(
                    "MaiT's restrict_kernel 'flex' runs FlexAttention, which TorchScript cannot run; "
                    "use torch.export, or restrict_kernel 'auto' or 'dense' (the same result)"
                )
        elif self._flex(x):
            return self._restrict_flex(x, B, N)
        restrict_fused = self.masks.mode == "restrict" and self.fused_attn
        if self.masks.leading and n_masked < self.num_heads and not restrict_fused:
            # Masked heads are heads 0..h'-1 (the usual case): split the projections per
            # group (split's backward is one concatenation, where indexing would fill zeros).
            qkv_m, qkv_f = (
                self.qkv(x)
                .reshape(B, N, 3, self.num_heads, self.head_dim)
                .split([n_masked, self.num_heads - n_masked], dim=3)
            )
            qm, km, vm = qkv_m.permute(2, 0, 3, 1, 4).unbind(0)  # (B, h', T, hd)
            qf, kf, vf = qkv_f.permute(2, 0, 3, 1, 4).unbind(0)  # (B, H-h', T, hd)
            qm, km = self._normed_qk(qm, km, vm)
            qf, kf = self._normed_qk(qf, kf, vf)
            attn = self._masked_logits(qm, km).softmax(dim=-1)
            out_m = self.attn_drop(attn) @ vm
            out_f = self._plain_attention(qf, kf, vf)
            return self._finish(torch.cat([out_m, out_f], dim=1), B, N)
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, H, T, hd)
        q, k = self._normed_qk(q, k, v)  # v's dtype: out below is built in q's
        if restrict_fused:
            # -inf outside the neighbourhood is a boolean mask: one fused call for all heads,
            # unmasked heads keeping every key.
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=self._restrict_mask(), dropout_p=self.attn_drop.p if self.training else 0.0
            )
            return self._finish(out, B, N)
        if n_masked == self.num_heads:
            attn = self._masked_logits(q, k).softmax(dim=-1)
            return self._finish(self.attn_drop(attn) @ v, B, N)
        masked, free = self.masks.heads, self.masks.free
        attn = self._masked_logits(q[:, masked], k[:, masked]).softmax(dim=-1)
        out = self.attn_drop(attn) @ v[:, masked]  # (B, h', T, hd)
        free_out = self._plain_attention(q[:, free], k[:, free], v[:, free])
        out = torch.zeros_like(q).index_copy(1, free, free_out).index_copy(1, masked, out)
        return self._finish(out, B, N)

    def _flex(self, x: torch.Tensor) -> bool:
        """Whether this call takes FlexAttention: restrict masks, ``restrict_kernel`` asking for it
        (``_flex_wanted``), no attention dropout to apply (FlexAttention has none), and, where it is
        compiled, a node that can build Triton's launchers (``_flex_buildable``)."""
        if self.masks.mode != "restrict" or not _flex_wanted(self.restrict_kernel, x.device, x.shape[1]):
            return False
        compiled = _flex_compiles(x.device)
        if self.training and (not compiled or self.attn_drop.p > 0):
            return False  # eager FlexAttention (off CUDA) has no correct backward; it has no dropout either
        return not compiled or _flex_buildable(self.restrict_kernel, self.toolchain_missing)

    def _restrict_flex(self, x: torch.Tensor, B: int, N: int) -> torch.Tensor:
        """Masked heads through FlexAttention with a block-sparse neighbourhood mask (work skipped
        for blocks of 128 x 128 tokens the mask leaves empty: it pays from about 1,000 tokens,
        ``FLEX_MIN_TOKENS``); the other heads through the fused kernel."""
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, H, T, hd)
        q, k = normed_qk(self, q, k, v)
        h = self.masks.heads.numel()
        # Heads 0..h'-1 (the usual case) are sliced and concatenated after: a compiled training step with
        # FlexAttention beside index_copy failed on CUDA (torch 2.11, AOTAutograd: a copy_ into a non-input).
        pick = slice(0, h) if self.masks.leading else self.masks.heads
        out_m = _flex_attention(x.device)(
            q[:, pick], k[:, pick], v[:, pick], block_mask=self._flex_mask(), scale=self.scale
        )
        if h == self.num_heads:
            return self._finish(out_m, B, N)
        if self.masks.leading:
            out_f = self._plain_attention(q[:, h:], k[:, h:], v[:, h:])
            return self._finish(torch.cat([out_m.to(q.dtype), out_f], dim=1), B, N)
        free = self.masks.free
        out_f = self._plain_attention(q[:, free], k[:, free], v[:, free])
        out = torch.zeros_like(q).index_copy(1, free, out_f).index_copy(1, self.masks.heads, out_m.to(q.dtype))
        return self._finish(out, B, N)

    def _flex_mask(self):
        """FlexAttention's BlockMask. A compiled forward builds it in its graph from the masks' buffers and
        stores nothing: a mask cached on the module during the trace failed Dynamo's guard on the next call
        (a second graph). Eager calls keep it, per device."""
        if torch.compiler.is_compiling():
            return self.masks.block_mask()
        device = self.masks.keep.device
        if self._block_mask is None or self._block_mask[0] != device:
            self._block_mask = (device, self.masks.block_mask())
        return self._block_mask[1]

    def _finish(self, out: torch.Tensor, B: int, N: int) -> torch.Tensor:
        x = out.transpose(1, 2).reshape(B, N, self.attn_dim)  # (B, H, T, hd) -> (B, T, C)
        x = self.norm(x)
        return self.proj_drop(self.proj(x))

    def _restrict_mask(self) -> torch.Tensor:
        """(H, T, T) boolean: the neighbourhood for masked heads, every key for the others. Eager calls keep it;
        a compiled forward builds it in its graph (cached on the module there, it failed Dynamo's guard on the
        next call: a second graph)."""
        if torch.jit.is_scripting():
            return self._all_heads_mask()  # a scripted module keeps no Python cache
        else:
            if torch.compiler.is_compiling():
                return self._all_heads_mask()
            if self._restrict_cache is None or self._restrict_cache.device != self.masks.keep.device:
                self._restrict_cache = self._all_heads_mask()
            return self._restrict_cache

    def _all_heads_mask(self) -> torch.Tensor:
        t = self.masks.keep.shape[0]
        full = torch.ones(self.num_heads, t, t, dtype=torch.bool, device=self.masks.keep.device)
        full[self.masks.heads] = self.masks.keep
        return full

    def _plain_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Unmasked heads: timm's fused kernel unless fused attention is off (then eager, as timm does)."""
        if self.fused_attn:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.attn_drop(attn) @ v

    def _unmasked(self, x: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool) -> torch.Tensor:
        """timm's ``Attention.forward``, for TorchScript, which cannot call ``super()`` (the same ops)."""
        B, N, _ = x.shape
        gate = self.gate(x).sigmoid() if self.gate is not None else None
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)  # (B, H, T, hd)
        q, k = self.q_norm(q), self.k_norm(k)
        if self.fused_attn:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=attn_mask, is_causal=is_causal, dropout_p=self.attn_drop.p if self.training else 0.0
            )
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
            attn = maybe_add_mask(attn, resolve_self_attn_mask(N, attn, attn_mask, is_causal)).softmax(dim=-1)
            out = self.attn_drop(attn) @ v
        out = self.norm(out.transpose(1, 2).reshape(B, N, self.attn_dim))
        if gate is not None:
            out = out * gate
        return self.proj_drop(self.proj(out))

    @torch.no_grad()
    def attention_maps(self, x: torch.Tensor, logits: bool = False) -> torch.Tensor:
        """Every head's attention probabilities (or pre-softmax logits): (B, H, T, T)."""
        B, N, _ = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = normed_qk(self, q, k, v)
        scores = (q * self.scale) @ k.transpose(-2, -1)
        if self.masks.active:
            heads = self.masks.heads
            scores = scores.index_copy(1, heads, self.masks.mask_logits(scores.index_select(1, heads)))
        return scores if logits else scores.softmax(dim=-1)


@register_notrace_module
class MaskedTalkingHeadAttn(TalkingHeadAttn):
    """CaiT's talking-heads self-attention with per-head masks on the softmax input."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.masks = _HeadMasks()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # timm's TalkingHeadAttn.forward (the same ops; TorchScript cannot call super()) with the masks
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0] * self.scale, qkv[1], qkv[2]
        attn = q @ k.transpose(-2, -1)  # (B, H, N, N)
        attn = self.proj_l(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)  # talking heads, pre-softmax
        if self.masks.active:
            heads = self.masks.heads
            attn = attn.index_copy(1, heads, self.masks.mask_logits(attn.index_select(1, heads)))
        attn = attn.softmax(dim=-1)
        attn = self.proj_w(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        attn = self.attn_drop(attn)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


def _flex_compiles(device: torch.device) -> bool:
    """Whether FlexAttention runs compiled on ``device`` (on CUDA: its fast path, built by Triton)."""
    return device.type == "cuda"


def _flex_wanted(restrict_kernel: str, device: torch.device, tokens: int) -> bool:
    """Whether ``restrict_kernel`` asks for FlexAttention at ``tokens`` tokens on ``device``: ``flex`` always,
    ``dense`` never, ``auto`` where it is compiled (CUDA) from ``FLEX_MIN_TOKENS`` on."""
    if restrict_kernel == "auto":
        return _flex_compiles(device) and tokens >= FLEX_MIN_TOKENS
    return restrict_kernel == "flex"


def _flex_buildable(restrict_kernel: str, missing: dict[str, str] | None) -> bool:
    """Whether this node can build compiled FlexAttention (``locvit.device.missing_toolchain``). When it cannot,
    ``auto`` falls back to the dense restrict kernel (the same result) with one warning per process saying
    what to install, and an explicit ``flex`` raises ``locvit.device.ToolchainError``."""
    global _WARNED_NO_TOOLCHAIN
    missing = missing_toolchain() if missing is None else missing
    if not missing:
        return True
    if restrict_kernel == "flex":
        require_toolchain(
            "MaiT's restrict_kernel: flex (FlexAttention, compiled on CUDA)",
            "set restrict_kernel: auto (falls back to dense here) or dense",
        )
    if not _WARNED_NO_TOOLCHAIN:
        _WARNED_NO_TOOLCHAIN = True
        log.warning(
            "MaiT's restrict_kernel: auto runs restrict heads dense (the same result, slower from about "
            "1,000 tokens): compiled FlexAttention needs a C compiler and Python's headers to build "
            f"Triton's launchers, and this node lacks them: {describe_missing(missing)}"
        )
    return False


def _flex_attention(device: torch.device):
    """FlexAttention: compiled on CUDA (its fast path), eager elsewhere (a reference, for tests).

    Under ``torch.compile`` of MaiT, Dynamo inlines FlexAttention and the raw function is returned without
    touching the cache, so later eager calls still find the compiled kernel, not the unfused reference.
    Dynamic shapes: another batch size (an evaluation's last batch) recompiles once.
    """
    from torch.nn.attention.flex_attention import flex_attention

    if not _flex_compiles(device) or torch.compiler.is_compiling():
        return flex_attention
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention, dynamic=None)
    return _COMPILED_FLEX


_COMPILED_FLEX = None
_WARNED_NO_TOOLCHAIN = False  # the fallback's warning, once per process
RESTRICT_KERNELS = ("auto", "flex", "dense")


def install_masks(
    model: nn.Module,
    attns: Sequence[nn.Module],
    num_prefix: int,
    masked_heads: HeadSpec,
    mask_kernel: Sequence[int],
    mask_mode: str,
    mask_type: str | None,
    alpha_init: float,
    random_seed: int,
) -> None:
    """Configure every layer's masks from the model-level options; record them on ``model``."""
    # Sch.3 is the paper's soft-mask scheme; every other default is a hard mask.
    mask_type = mask_type or ("soft" if masked_heads == "sch3" else "hard")
    heads = scheme_heads(masked_heads, len(attns), attns[0].num_heads)
    keep = neighbourhood_mask(tuple(model.patch_embed.grid_size), tuple(mask_kernel), num_prefix)
    for layer, (attn, idx) in enumerate(zip(attns, heads)):
        layer_keep = random_mask(keep, num_prefix, random_seed + layer) if mask_type == "random" else keep
        attn.masks.configure(idx, attn.num_heads, layer_keep, mask_mode, mask_type, alpha_init)
    model.mask_options = dict(
        masked_heads=masked_heads,
        mask_kernel=tuple(mask_kernel),
        mask_mode=mask_mode,
        mask_type=mask_type,
        alpha_init=alpha_init,
        random_seed=random_seed,
    )


class MaiT(VisionTransformer):
    """A timm ``VisionTransformer`` with MaiT attention masks; its options: docs/models.md, MaiT.

    FlexAttention (``restrict_kernel``) has no dropout (training with ``attn_drop_rate`` > 0 runs dense) and
    off CUDA runs eagerly in eval mode only. Without a C compiler and Python's headers on CUDA, ``auto`` falls
    back to dense with one warning per process and ``flex`` raises ``locvit.device.ToolchainError`` at the
    first forward.
    """

    def __init__(
        self,
        masked_heads: HeadSpec = "sch1",
        mask_kernel: Sequence[int] = (3, 3),
        mask_mode: str = "multiply",
        mask_type: str | None = None,
        alpha_init: float = 0.5,
        random_seed: int = 0,
        drop_path_schedule: str = "linear",
        restrict_kernel: str = "auto",
        **kwargs,
    ):
        allowed("restrict_kernel", restrict_kernel, RESTRICT_KERNELS)
        allowed("drop_path_schedule", drop_path_schedule, DROP_PATH_SCHEDULES)
        kwargs.setdefault("attn_layer", MaskedAttention)
        super().__init__(**kwargs)
        rate = float(kwargs.get("drop_path_rate", 0.0))
        if drop_path_schedule == "constant" and rate > 0:
            for block in self.blocks:  # every block's both branches at the full rate
                block.drop_path1, block.drop_path2 = DropPath(rate), DropPath(rate)
        self.drop_path_schedule = drop_path_schedule
        missing = missing_toolchain() if mask_mode == "restrict" and restrict_kernel != "dense" else None
        for block in self.blocks:
            block.attn.restrict_kernel = restrict_kernel
            block.attn.toolchain_missing = missing
        install_masks(
            self,
            [b.attn for b in self.blocks],
            self.num_prefix_tokens,
            masked_heads,
            mask_kernel,
            mask_mode,
            mask_type,
            alpha_init,
            random_seed,
        )


class MaskedCait(Cait):
    """A timm ``Cait`` with MaiT masks in its self-attention layers (options as ``MaiT``)."""

    def __init__(
        self,
        masked_heads: HeadSpec = "sch1",
        mask_kernel: Sequence[int] = (3, 3),
        mask_mode: str = "multiply",
        mask_type: str | None = None,
        alpha_init: float = 0.5,
        random_seed: int = 0,
        **kwargs,
    ):
        kwargs.setdefault("attn_block", MaskedTalkingHeadAttn)
        super().__init__(**kwargs)
        # CaiT's self-attention layers see patch tokens only; its class token joins later.
        install_masks(
            self,
            [b.attn for b in self.blocks],
            0,
            masked_heads,
            mask_kernel,
            mask_mode,
            mask_type,
            alpha_init,
            random_seed,
        )


def _create(cls, variant: str, pretrained: bool = False, **kwargs):
    if pretrained:
        raise ValueError(f"{variant}: no pretrained weights exist for MaiT; use pretrained=False")
    return build_model_with_cfg(cls, variant, pretrained=False, **kwargs)


ENTRYPOINTS = (
    "mait_xtiny_d24_patch16_224",
    "mait_tiny_patch16_224",
    "mait_tiny_d24_patch16_224",
    "mait_tiny_d36_patch16_224",
    "mait_xsmall_d24_patch16_224",
    "mait_small_patch16_224",
    "mait_small_d24_patch16_224",
    "mait_cait_xxs24_224",
    "mait_cait_s24_224",
)
# No released weights: the configs only carry input size, classes and normalisation (DeiT's).
default_cfgs = generate_default_cfgs(
    {name: Cfg(**_cfg(url="", num_classes=1000, input_size=(3, 224, 224)), small=SHALLOW_VIT) for name in ENTRYPOINTS}
)


def _plus_mask_type(kwargs: dict) -> str:
    """MaiT+'s soft masks, or hard ones when the caller asks for mask_mode 'restrict' (soft masks scale
    logits, which restrict does not do)."""
    return "hard" if kwargs.get("mask_mode") == "restrict" else "soft"


# Entrypoints: sizes from the paper's Table 1; defaults follow its best setting per size.
@register_model
def mait_xtiny_d24_patch16_224(pretrained=False, **kwargs) -> MaiT:
    """MaiT-XT* (Table 4: 24 layers, 6.3M, LayerScale); Sch.2 hard 3x3 masks."""
    args = dict(patch_size=16, embed_dim=144, depth=24, num_heads=3, init_values=1e-5, masked_heads="sch2")
    return _create(MaiT, "mait_xtiny_d24_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def mait_tiny_patch16_224(pretrained=False, **kwargs) -> MaiT:
    """MaiT-T, 12 layers (DeiT-T shape, 5.7M); MaiT+ soft 3x3 masks on every head (Table 2: 74.7);
    hard ones with mask_mode="restrict"."""
    args = dict(
        patch_size=16, embed_dim=192, depth=12, num_heads=3, masked_heads="all", mask_type=_plus_mask_type(kwargs)
    )
    return _create(MaiT, "mait_tiny_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def mait_tiny_d24_patch16_224(pretrained=False, **kwargs) -> MaiT:
    """MaiT-T, 24 layers (Table 4: 11M); Sch.3 soft masks (Table 3: 79.3)."""
    args = dict(patch_size=16, embed_dim=192, depth=24, num_heads=3, masked_heads="sch3")
    return _create(MaiT, "mait_tiny_d24_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def mait_tiny_d36_patch16_224(pretrained=False, **kwargs) -> MaiT:
    """MaiT-T, 36 layers; mixed masking: every head in layers 0-11, one head after (Fig. 4: 79.8)."""
    args = dict(patch_size=16, embed_dim=192, depth=36, num_heads=3, masked_heads="mixed")
    return _create(MaiT, "mait_tiny_d36_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def mait_xsmall_d24_patch16_224(pretrained=False, **kwargs) -> MaiT:
    """MaiT-XS* (Table 4: 24 layers, 24.5M, LayerScale); Sch.2 hard 3x3 masks (Table 3: 81.4)."""
    args = dict(patch_size=16, embed_dim=288, depth=24, num_heads=3, init_values=1e-5, masked_heads="sch2")
    return _create(MaiT, "mait_xsmall_d24_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def mait_small_patch16_224(pretrained=False, **kwargs) -> MaiT:
    """MaiT-S, 12 layers (DeiT-S shape); MaiT+ soft 3x3 masks on every head (Table 2: 80.9);
    hard ones with mask_mode="restrict"."""
    args = dict(
        patch_size=16, embed_dim=384, depth=12, num_heads=6, masked_heads="all", mask_type=_plus_mask_type(kwargs)
    )
    return _create(MaiT, "mait_small_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def mait_small_d24_patch16_224(pretrained=False, **kwargs) -> MaiT:
    """MaiT-S* (Table 4: 24 layers, 43.3M, LayerScale); Sch.2 hard 3x3 masks."""
    args = dict(patch_size=16, embed_dim=384, depth=24, num_heads=6, init_values=1e-5, masked_heads="sch2")
    return _create(MaiT, "mait_small_d24_patch16_224", pretrained, **dict(args, **kwargs))


@register_model
def mait_cait_xxs24_224(pretrained=False, **kwargs) -> MaskedCait:
    """Masked CaiT-XXS24 (Table 4 "Masked CaiT"): one hard 3x3 masked head per self-attention layer."""
    args = dict(patch_size=16, embed_dim=192, depth=24, num_heads=4, init_values=1e-5, masked_heads="sch1")
    return _create(MaskedCait, "mait_cait_xxs24_224", pretrained, **dict(args, **kwargs))


@register_model
def mait_cait_s24_224(pretrained=False, **kwargs) -> MaskedCait:
    """Masked CaiT-S24 (Table 4 "Masked CaiT-S"): one hard 3x3 masked head per self-attention layer."""
    args = dict(patch_size=16, embed_dim=384, depth=24, num_heads=8, init_values=1e-5, masked_heads="sch1")
    return _create(MaskedCait, "mait_cait_s24_224", pretrained, **dict(args, **kwargs))


# The family, as analysis, profile and report see it (locvit.models.family) ------------------------


def _read_masked(attn: MaskedAttention, x: torch.Tensor):
    return "softmax", attn.attention_maps(x)  # masked heads: softmax(M * logits), as in forward


def _read_masked_talking(attn: MaskedTalkingHeadAttn, x: torch.Tensor):
    masks = attn.masks  # the mask acts on the head-mixed logits (after proj_l), as in forward

    def mask_logits(logits: torch.Tensor) -> torch.Tensor:
        if not masks.active:
            return logits
        return logits.index_copy(1, masks.heads, masks.mask_logits(logits.index_select(1, masks.heads)))

    return read_talking(attn, x, mask_logits)


def _mask_summary(model: nn.Module) -> dict:
    opts = model.mask_options
    heads = scheme_heads(opts["masked_heads"], len(model.blocks), model.blocks[0].attn.num_heads)
    return {
        "mask": {
            "masked_heads": opts["masked_heads"],
            "heads_per_layer": [len(h) for h in heads],
            "kernel": list(opts["mask_kernel"]),
            "mode": opts["mask_mode"],
            "type": opts["mask_type"],
            "alpha_init": opts["alpha_init"],
        }
    }


@torch.no_grad()
def soft_mask_alphas(model: nn.Module) -> torch.Tensor:
    """MaiT's soft-mask alphas (Sec. 4.3): (L, H) float32 on the CPU, NaN for heads without one.

    ``alpha = sigmoid(a)`` scales a soft-masked head's logits outside the neighbourhood; L
    counts MaiT's (or masked CaiT's self-attention) layers, soft-masked or not.
    """
    attns = [m for m in model.modules() if isinstance(m, (MaskedAttention, MaskedTalkingHeadAttn))]
    if not any(attn.masks.alpha() is not None for attn in attns):
        raise ValueError(
            f"soft_mask_alphas: {type(model).__name__} has no MaiT soft mask (build it with mask_type='soft')"
        )
    alphas = torch.full((len(attns), attns[0].num_heads), float("nan"))
    for layer, attn in enumerate(attns):
        alpha = attn.masks.alpha()
        if alpha is not None:
            alphas[layer, attn.masks.heads.cpu()] = alpha.float().cpu()
    return alphas


PRIOR = "hard, soft or random 2D-neighbourhood masks on chosen heads (the others global)"
ALPHAS = Extra(
    "alphas",
    "values",
    lambda m: soft_mask_alphas(m) if m.mask_options["mask_type"] == "soft" else None,
    "Soft-mask alpha",
    "Learned soft-mask alpha (MaiT Sec. 4.3: the weight MaiT+ keeps for attention "
    "outside the neighbourhood; 1 = no locality)",
    limits=(0.0, 1.0),
)
register_family(
    Family(
        "mait",
        "MaiT",
        MaiT,
        PRIOR,
        vit_blocks,
        lambda m: vit_sites(m, {MaskedAttention: _read_masked, Attention: read_vit}),
        options=_mask_summary,
        extras=(ALPHAS,),
        models=("mait_",),
        kinds=(SOFTMAX,),
        small=SmallBuild(  # hard masks on head 1, then heads 0 and 2
            "mait_tiny_patch16_224", dict(SMALL_VIT, masked_heads=[1, [0, 2]], mask_type="hard"), kinds=("softmax",) * 2
        ),
    )
)
register_family(
    Family(
        "mait_cait",
        "Masked CaiT",
        MaskedCait,
        PRIOR,
        cait_blocks,
        lambda m: cait_sites(m, {MaskedTalkingHeadAttn: _read_masked_talking, TalkingHeadAttn: read_talking}),
        options=_mask_summary,
        extras=(ALPHAS,),
        models=("mait_cait_",),
        kinds=(TALKING, CLASS),
        small=SmallBuild("mait_cait_xxs24_224", SMALL_CAIT, kinds=("talking", "talking", "class")),
    )
)
