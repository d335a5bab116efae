"""Masked attention under CUDA autocast's dtypes, reproduced on the CPU.

CUDA autocast runs LayerNorm in float32, so with ``qk_norm`` the q/k norms hand float32 q and
k to attention while v (from the qkv Linear) is bfloat16. CPU autocast keeps LayerNorm in
bfloat16 and never shows this: here forward hooks on the q/k norms return the dtypes CUDA's
would (and the other mixes), ``index_copy`` refuses mixed dtypes as on CUDA (CPU autocast
promotes them, CUDA's does not), and every masked path of MaiT and IBiT must train a step.
Without autocast the cast that makes them agree changes nothing, bit for bit.
"""

from __future__ import annotations

import pytest
import timm
import torch
import torch.nn as nn
from helpers import locvit_families
from timm.layers import Attention
from timm.models.vision_transformer import VisionTransformer
from torch.overrides import TorchFunctionMode

from locvit.models import ibit, mait  # importing locvit.models registers every family
from locvit.models.family import families, normed_qk
from locvit.models.ibit import FrobeniusAttention

BUILDS = {name: family.small for name, family in locvit_families().items()}  # Family.small

pytestmark = pytest.mark.usefixtures("cache_in_tmp")

SMALL = dict(img_size=32, patch_size=4, embed_dim=48, depth=2, num_heads=3, num_classes=10, qk_norm=True)
F32, BF16 = torch.float32, torch.bfloat16
# (q, k) dtypes out of the q/k norms under autocast: CUDA's (LayerNorm in float32), and one of each.
MIXES = {"cuda": (F32, F32), "q_f32": (F32, BF16), "k_f32": (BF16, F32)}


def _family(family: str, **options) -> tuple[str, dict]:
    """(timm name, keyword arguments): the family's small build (Family.small) at SMALL's size, options changed."""
    shape = BUILDS[family]
    return shape.model, {**shape.kwargs, **SMALL, **options}


#: Every family built on timm's ViT (its Attention's q/k norms) at its shape's options, then MaiT's and IBiT's
#: other masked paths. DeiT is the control: timm's Attention, where autocast casts for SDPA.
MODELS = {
    **{f: _family(f) for f in BUILDS if issubclass(families()[f].model_class, VisionTransformer)},
    "mait_sch1_hard": _family("mait", masked_heads="sch1", mask_type="hard"),
    "mait_all_hard": _family("mait", masked_heads="all", mask_type="hard"),
    "mait_all_soft": _family("mait", masked_heads="all", mask_type="soft"),
    # heads 1 and 0, 2: not the leading heads, the outputs assembled with index_copy
    "mait_heads_1_02": _family("mait", masked_heads=[[1], [0, 2]], mask_type="hard"),
    "mait_restrict_dense": _family(
        "mait", masked_heads="sch1", mask_mode="restrict", mask_type="hard", restrict_kernel="dense"
    ),
    "ibit_softmax": _family("ibit", mask_fit_steps=200, normalize="softmax"),
    "ibit_attn_drop": _family("ibit", mask_fit_steps=200, attn_drop_rate=0.1),  # autograd's path
}
MASKED = [name for name in MODELS if name != "deit"]


def _build(name: str, fused: bool = True) -> nn.Module:
    torch.manual_seed(0)
    entry, kwargs = MODELS[name]
    model = timm.create_model(entry, **kwargs)
    for m in model.modules():
        if isinstance(m, Attention):
            m.fused_attn = fused  # False: timm's (and MaiT's) eager paths
    return model


def emulate_norm_dtypes(model: nn.Module, q_dtype: torch.dtype, k_dtype: torch.dtype) -> list[int]:
    """Make every q/k norm return ``q_dtype`` / ``k_dtype`` (CUDA autocast: float32); returns a list
    that counts the calls, so a test can see the hooks ran."""
    calls: list[int] = []

    def to(dtype):
        def hook(module, args, out):
            calls.append(1)
            return out.to(dtype)

        return hook

    for m in model.modules():
        if isinstance(m, Attention):
            assert isinstance(m.q_norm, nn.LayerNorm), "build with qk_norm=True"
            m.q_norm.register_forward_hook(to(q_dtype))
            m.k_norm.register_forward_hook(to(k_dtype))
    return calls


class CudaIndexCopy(TorchFunctionMode):
    """``index_copy`` as CUDA autocast runs it: CPU autocast promotes a float32 tensor and a
    bfloat16 source to float32, CUDA's leaves them to the kernel, which refuses the mix."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.index_copy, torch.Tensor.index_copy, torch.Tensor.index_copy_):
            target, source = args[0], kwargs.get("source", args[3] if len(args) > 3 else None)
            if target.dtype != source.dtype:
                raise RuntimeError(
                    f"index_copy_(): self and source expected to have the same dtype, "
                    f"but got (self) {target.dtype} and (source) {source.dtype}"
                )
        return func(*args, **kwargs)


def _train_step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=BF16), CudaIndexCopy():
        out = model(x)
    out.float().square().mean().backward()
    return out


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("name", list(MODELS))
def test_a_train_step_with_the_norms_dtypes_of_cuda_autocast(name, mix):
    model = _build(name)
    calls = emulate_norm_dtypes(model, *MIXES[mix])
    out = _train_step(model, torch.randn(2, 3, 32, 32))
    assert calls and out.shape == (2, 10) and torch.isfinite(out.float()).all()
    for pname, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), pname


@pytest.mark.parametrize("name", ["deit", "mait_sch1_hard", "mait_heads_1_02", "mait_all_soft", "mait_restrict_dense"])
def test_the_eager_paths_with_cudas_dtypes(name):
    model = _build(name, fused=False)
    emulate_norm_dtypes(model, F32, F32)
    out = _train_step(model, torch.randn(2, 3, 32, 32))
    assert torch.isfinite(out.float()).all() and model.blocks[0].attn.qkv.weight.grad is not None


@pytest.mark.parametrize("mix", list(MIXES))
def test_flex_restrict_with_cudas_dtypes(mix):
    """FlexAttention (CUDA's restrict kernel), its heads and the fused ones joined by index_copy;
    off CUDA its eager reference runs, in eval mode only."""
    model = timm.create_model(
        "mait_tiny_patch16_224",
        masked_heads="sch1",
        mask_mode="restrict",
        mask_type="hard",
        restrict_kernel="flex",
        **SMALL,
    ).eval()
    emulate_norm_dtypes(model, *MIXES[mix])
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=BF16), CudaIndexCopy():
        flex = model(x)
        assert model.blocks[0].attn._block_mask is not None  # it did take the flex path
        for block in model.blocks:
            block.attn.restrict_kernel = "dense"
        dense = model(x)
    torch.testing.assert_close(flex.float(), dense.float(), atol=0.05, rtol=0.05)


@pytest.mark.parametrize("mix", list(MIXES))
@pytest.mark.parametrize("name", ["mait_sch1_hard", "mait_heads_1_02", "ibit"])
def test_attention_maps_with_cudas_dtypes(name, mix):
    model = _build(name).eval()
    emulate_norm_dtypes(model, *MIXES[mix])
    attn = model.blocks[0].attn
    x = torch.randn(2, 65, 48)
    with torch.autocast("cpu", dtype=BF16), CudaIndexCopy():
        maps = attn.attention_maps(x)
    assert maps.shape == (2, 3, 65, 65) and torch.isfinite(maps.float()).all()


def test_normed_qk_brings_q_and_k_to_vs_dtype():
    model = _build("mait_sch1_hard")
    emulate_norm_dtypes(model, F32, F32)
    attn = model.blocks[0].attn
    q, k, v = torch.randn(3, 2, 3, 65, 16).to(BF16).unbind(0)
    assert [t.dtype for t in normed_qk(attn, q, k, v)] == [BF16, BF16]
    q32, k32 = normed_qk(attn, q.float(), k.float(), v.float())
    assert q32.dtype == k32.dtype == F32


def test_frobenius_attention_with_mixed_dtypes_runs_backward_under_the_forwards_autocast():
    """Called with CUDA autocast's mix (q, k and the mask float32, v bfloat16), the hand-written
    backward (run outside autocast, as CUDA's always is) gets the same gradients as autograd."""
    torch.manual_seed(0)
    q, k = (torch.randn(2, 3, 10, 8, requires_grad=True) for _ in range(2))
    mask = torch.randn(3, 10, 10, requires_grad=True)
    v = torch.randn(2, 3, 10, 8).to(BF16).requires_grad_()
    w = torch.randn(2, 3, 10, 8)

    def plain(q, k, v, mask):
        a = (q @ k.transpose(-2, -1)) * mask
        return (a @ v) / (torch.linalg.vector_norm(a, dim=(-2, -1), keepdim=True) + ibit.NORM_EPS)

    grads = []
    for fn in (FrobeniusAttention.apply, plain):
        with torch.autocast("cpu", dtype=BF16):
            out = fn(q, k, v, mask)
        (out.float() * w).sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v, mask)])
        for t in (q, k, v, mask):
            t.grad = None
    for ours, ref, t in zip(*grads, (q, k, v, mask)):
        assert ours.dtype == t.dtype
        torch.testing.assert_close(ours.float(), ref.float(), atol=0.05, rtol=0.05)


def _no_cast(attn, q, k, v):
    return attn.q_norm(q), attn.k_norm(k)


@pytest.mark.parametrize("name", MASKED)
def test_without_autocast_the_cast_changes_nothing(name, monkeypatch):
    """float32 everywhere: outputs and gradients bitwise those of the layers without the cast."""
    x = torch.randn(2, 3, 32, 32)
    runs = []
    for patch in (False, True):
        if patch:
            monkeypatch.setattr(mait, "normed_qk", _no_cast)
            monkeypatch.setattr(ibit, "normed_qk", _no_cast)
        model = _build(name)
        out = model(x)
        out.square().mean().backward()
        runs.append([out.detach(), *(p.grad for p in model.parameters())])
    assert all(torch.equal(a, b) for a, b in zip(*runs))
