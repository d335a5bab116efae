"""IBiT: the roll, the initial mask (Algorithm 1's fit) and its cache, LMSA's two
normalisations and hand-written backward, the reference options, the entrypoint."""

from __future__ import annotations

import logging

import pytest
import timm
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import Attention

import locvit.models  # noqa: F401
from locvit.models import ibit
from locvit.models.ibit import (
    FrobeniusAttention,
    LearnedMaskAttention,
    MaskFit,
    initial_factors,
    kernel_matrix,
    roll_index,
    rolled_kernel,
    unroll_index,
)

SMALL = dict(img_size=32, patch_size=4, embed_dim=48, depth=2, num_heads=3, num_classes=10)  # 8 x 8 grid
QUICK = dict(mask_fit_steps=200)  # where the cache, not the fit, is under test


pytestmark = pytest.mark.usefixtures("cache_in_tmp")


@pytest.fixture
def fits(tmp_path, monkeypatch) -> list[MaskFit]:
    """An empty disk cache and in-process memo; the list records every fit that runs."""
    monkeypatch.setenv("LOCVIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ibit, "_FITS", {})
    calls: list[MaskFit] = []
    real = ibit.fit_mask_factors

    def counting(spec):
        calls.append(spec)
        return real(spec)

    monkeypatch.setattr(ibit, "fit_mask_factors", counting)
    return calls


def _build(**kwargs):
    return timm.create_model("ibit_tiny_patch16_224", **{**SMALL, **kwargs})


# --- the roll --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 5, 16, 35])
def test_roll_and_unroll_are_inverse_permutations(n):
    roll, unroll = roll_index(n), unroll_index(n)
    ordered = torch.arange(n).expand(n, n)
    assert torch.equal(roll.sort(dim=-1).values, ordered)  # every row a permutation
    assert torch.equal(unroll.sort(dim=-1).values, ordered)
    x = torch.randn(3, n, n)
    assert torch.equal(x.gather(-1, roll.expand(3, n, n)).gather(-1, unroll.expand(3, n, n)), x)
    assert torch.equal(x.gather(-1, unroll.expand(3, n, n)).gather(-1, roll.expand(3, n, n)), x)
    rolled = x[0].gather(-1, roll)
    assert all(rolled[p, k] == x[0, p, (k - p) % n] for p in range(n) for k in range(n))


def test_kernels_and_the_rolled_target():
    k = kernel_matrix((3, 4), "radial")  # patch 5 is (row 1, col 1)
    assert k[5, 5] == 1 and torch.isclose(k[5, 6], torch.tensor(0.5).neg().exp())
    assert torch.isclose(k[5, 10], torch.tensor(-0.5 * 2**0.5).exp())  # the diagonal neighbour
    g = kernel_matrix((3, 4), "gaussian")
    assert torch.isclose(g[5, 6], torch.tensor(0.5).neg().exp()) and torch.isclose(g[5, 10], torch.tensor(-1.0).exp())
    target = rolled_kernel((3, 4))
    assert torch.equal(target[:, 0], torch.ones(12))  # offset 0 is the patch itself, in every row
    assert torch.equal(target.gather(-1, roll_index(12)), k)


# --- the initial mask ------------------------------------------------------------------


@pytest.mark.parametrize("grid", [(4, 4), (5, 7), (8, 8)])
@pytest.mark.parametrize("class_token", [True, False])
def test_initial_mask_is_the_kernel_centred_on_each_patch(grid, class_token):
    h, w = grid
    pool = {} if class_token else dict(class_token=False, global_pool="avg")
    model = _build(img_size=(4 * h, 4 * w), **pool)
    prefix = int(class_token)
    kernel = kernel_matrix(grid)  # (N, N)
    near = kernel > 0.45  # each patch's 3 x 3 neighbourhood: 1, e^-0.5, e^-0.71
    first = model.blocks[0].attn.full_mask().detach()
    for block in model.blocks:
        mask = block.attn.full_mask().detach()  # (H, T, T)
        assert mask.shape == (3, prefix + h * w, prefix + h * w)
        assert torch.equal(mask, first)  # every head of every layer starts from the same fit
        if class_token:
            assert torch.equal(mask[:, 0], torch.ones_like(mask[:, 0]))
            assert torch.equal(mask[:, :, 0], torch.ones_like(mask[:, :, 0]))
        patches = mask[:, prefix:, prefix:]
        # Centred exactly: every patch row peaks on its own patch (the reference code's
        # off-by-one would put the peak on the next token).
        assert torch.equal(patches.argmax(dim=-1), torch.arange(h * w).expand(3, -1))
        err = (patches - kernel).abs()
        # Measured with rank 9 (4 x 4, 5 x 7, 8 x 8): near <= 0.05, mean <= 0.018, max 0.22
        # (8 x 8: far, wrapped entries of border rows). A one-token shift errs by 0.39 at
        # the centre itself and up to 1 elsewhere in the neighbourhood.
        assert err[:, near].max() < 0.08
        assert err.mean() < 0.025
        assert err.max() < 0.25


@pytest.mark.parametrize("grid", [(4, 4), (8, 8)])
def test_the_fit_reaches_the_best_rank_9_approximation(grid):
    """Algorithm 1 minimises an MSE whose optimum is the truncated SVD (Eckart-Young)."""
    a, b = initial_factors(MaskFit(grid))  # the fits of the test above, from this process
    target = rolled_kernel(grid).double()
    mse = F.mse_loss(a.double().t() @ b.double(), target).item()
    u, s, vh = torch.linalg.svd(target)
    best = F.mse_loss((u[:, :9] * s[:9]) @ vh[:9], target).item()
    assert best <= mse < 1.02 * best


# --- LMSA ------------------------------------------------------------------------------


def _lmsa(normalize="frobenius", grid=(4, 4), num_prefix=1, **kwargs) -> LearnedMaskAttention:
    attn = LearnedMaskAttention(48, num_heads=3, qkv_bias=True, **kwargs)
    attn.configure(grid, num_prefix, normalize=normalize, fit_steps=200)
    return attn


def test_all_ones_mask_with_softmax_is_ordinary_attention():
    torch.manual_seed(0)
    lmsa = _lmsa("softmax").eval()
    with torch.no_grad():  # A^T B = rank * (1/sqrt(rank))^2 = 1 everywhere
        lmsa.mask_a.fill_(9**-0.5)
        lmsa.mask_b.fill_(9**-0.5)
    assert torch.allclose(lmsa.full_mask(), torch.ones(3, 17, 17))
    plain = Attention(48, num_heads=3, qkv_bias=True).eval()
    plain.load_state_dict({k: v for k, v in lmsa.state_dict().items() if not k.startswith("mask_")})
    assert plain.fused_attn  # the comparison is with F.scaled_dot_product_attention
    x = torch.randn(2, 17, 48)
    with torch.no_grad():
        assert torch.allclose(lmsa(x), plain(x), atol=1e-5)


@pytest.mark.parametrize("normalize", ["frobenius", "softmax"])
def test_forward_agrees_with_the_attention_maps(normalize):
    torch.manual_seed(0)
    lmsa = _lmsa(normalize)
    x = torch.randn(2, 17, 48)
    maps = lmsa.attention_maps(x)  # (B, H, T, T)
    if normalize == "frobenius":
        assert torch.allclose(torch.linalg.matrix_norm(maps), torch.ones(2, 3))  # unit norm per map...
        assert (maps < 0).any()  # ...and no softmax
    else:
        assert torch.allclose(maps.sum(-1), torch.ones(()))
    v = lmsa.qkv(x).reshape(2, 17, 3, 3, 16).permute(2, 0, 3, 1, 4)[2]
    expected = lmsa.proj((maps @ v).transpose(1, 2).reshape(2, 17, 48))
    with torch.no_grad():
        assert torch.allclose(lmsa.train()(x), expected, atol=1e-5)
        assert torch.allclose(lmsa.eval()(x), expected, atol=1e-5)


def test_hand_written_backward_is_the_gradient():
    torch.manual_seed(0)
    args = [torch.randn(2, 3, 7, 4, dtype=torch.double, requires_grad=True) for _ in range(3)]
    args.append(torch.randn(3, 7, 7, dtype=torch.double, requires_grad=True))
    assert torch.autograd.gradcheck(FrobeniusAttention.apply, args)

    def plain(q, k, v, mask):
        attn = (q @ k.transpose(-2, -1)) * mask
        return (attn @ v) / (torch.linalg.vector_norm(attn, dim=(-2, -1), keepdim=True) + ibit.NORM_EPS)

    x = [a.detach().float().requires_grad_() for a in args]
    y = [a.detach().float().requires_grad_() for a in args]
    grad = torch.randn(2, 3, 7, 4)
    FrobeniusAttention.apply(*x).backward(grad)
    plain(*y).backward(grad)
    assert all(torch.allclose(a.grad, b.grad, atol=1e-5) for a, b in zip(x, y, strict=True))


def test_dropout_path_is_the_same_function():
    """With attention dropout on, training takes the plain autograd path."""
    torch.manual_seed(0)
    lmsa = _lmsa()
    x = torch.randn(2, 17, 48)
    fused = lmsa.train()(x)
    lmsa.attn_drop = nn.Dropout(1e-12)  # on, yet (almost surely) dropping nothing
    assert torch.allclose(lmsa(x), fused, atol=1e-6)


def test_wrong_token_count_is_an_error():
    with pytest.raises(ValueError, match="1 prefix \\+ 16 patch tokens, got 10"):
        _lmsa()(torch.randn(1, 10, 48))


# --- the model -------------------------------------------------------------------------


def test_mask_parameters_get_gradients():
    model = _build()
    model(torch.randn(2, 3, 32, 32)).sum().backward()
    for block in model.blocks:
        for p in (block.attn.mask_a, block.attn.mask_b):
            assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_bf16_autocast_trains():
    model = _build()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(2, 3, 32, 32))
    out.float().sum().backward()
    assert torch.isfinite(out.float()).all() and torch.isfinite(model.blocks[0].attn.mask_a.grad).all()


def test_reference_options():
    torch.manual_seed(0)
    model = _build(
        residual="reference",
        pos_embed="sincos",
        normalize="softmax",
        mask_kernel="gaussian",
        num_heads=4,
        drop_path_rate=0.1,
        mlp_drop_path=True,
        **QUICK,
    )
    assert "pos_embed" not in dict(model.named_parameters()) and "pos_embed" not in model.state_dict()
    assert torch.equal(model.pos_embed[0, 0, :24], torch.zeros(24))  # sin(0) at the class token
    assert not isinstance(model.blocks[1].drop_path2, nn.Identity)
    model.init_weights()
    assert torch.equal(model.pos_embed, ibit.sincos_1d(65, 48))  # a re-init keeps the fixed table
    block = model.blocks[0].eval()
    x = torch.randn(2, 65, 48)
    y = block.norm1(x) + block.attn(block.norm1(x))
    with torch.no_grad():
        assert torch.allclose(block(x), block.norm2(y) + block.mlp(block.norm2(y)), atol=1e-6)
    model.train()(torch.randn(2, 3, 32, 32)).sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    # Paper default: stochastic depth on the attention branch only.
    assert isinstance(_build(drop_path_rate=0.1).blocks[1].drop_path2, nn.Identity)


def test_bad_options_name_the_option():
    for key, value, allowed in [
        ("normalize", "l2", "frobenius, softmax"),
        ("mask_kernel", "box", "radial, gaussian"),
        ("residual", "post", "prenorm, reference"),
        ("pos_embed", "rope", "learn, sincos"),
    ]:
        with pytest.raises(ValueError, match=f"{key}: '{value}' is not allowed; allowed values: {allowed}"):
            _build(**{key: value})
    with pytest.raises(ValueError, match="dynamic_img_size"):
        _build(dynamic_img_size=True)


# --- the fit cache ---------------------------------------------------------------------


def test_the_fit_is_cached_and_refitted_for_a_new_grid_or_rank(fits, tmp_path):
    first = _build(**QUICK)
    assert len(fits) == 1  # one fit for every head of every layer
    _build(**QUICK)
    assert len(fits) == 1  # in-process memo
    ibit._FITS.clear()
    again = _build(**QUICK)
    assert len(fits) == 1  # read back from disk
    assert torch.equal(again.blocks[0].attn.mask_a, first.blocks[0].attn.mask_a)
    _build(img_size=24, **QUICK)  # 6 x 6 grid
    _build(mask_rank=3, **QUICK)
    assert [(f.grid, f.rank) for f in fits] == [((8, 8), 9), ((6, 6), 9), ((8, 8), 3)]
    assert len(list((tmp_path / "ibit").glob("*.pt"))) == 3


def test_a_corrupt_cache_file_is_refitted_with_a_warning(fits, tmp_path, caplog):
    first = _build(**QUICK)
    (path,) = (tmp_path / "ibit").glob("*.pt")
    path.write_bytes(b"not a checkpoint")
    ibit._FITS.clear()
    with caplog.at_level(logging.WARNING, logger="locvit"):
        again = _build(**QUICK)
    assert "IBiT mask-fit cache" in caplog.text and "is unusable" in caplog.text
    assert len(fits) == 2 and torch.equal(again.blocks[0].attn.mask_a, first.blocks[0].attn.mask_a)
    ibit._FITS.clear()
    _build(**QUICK)  # the refit rewrote the file
    assert len(fits) == 2


def test_meta_build_does_no_fit_and_real_weights_get_it(fits):
    with torch.device("meta"):
        model = timm.create_model("ibit_tiny_patch16_224", mask_fit_steps=50)
    assert fits == []
    model.to_empty(device="cpu")
    model.init_weights()
    assert [f.grid for f in fits] == [(14, 14)]
    a, _ = initial_factors(MaskFit((14, 14), steps=50))
    assert all(torch.equal(b.attn.mask_a, a.expand(3, 9, 196)) for b in model.blocks)
    assert all(torch.equal(b.attn.roll, roll_index(196)) for b in model.blocks)


# --- the entrypoint --------------------------------------------------------------------

# 5,717,416 for DeiT-Tiny + 12 layers x 2 factors x 3 heads x rank 9 x 196 patches.
IBIT_TINY_PARAMS = 5_717_416 + 12 * 2 * 3 * 9 * 196  # 5,844,424: "6M" in the paper's Table 1


@pytest.mark.parametrize("name", timm.list_models("ibit_*"))
def test_every_entrypoint_has_the_papers_size(name):
    """Forward and backward of every entrypoint: tests/test_models.py."""
    with torch.device("meta"):
        full = timm.create_model(name)  # no fit on meta (test_meta_build_does_no_fit...)
    n = sum(p.numel() for p in full.parameters())
    assert abs(n - IBIT_TINY_PARAMS) / IBIT_TINY_PARAMS < 0.03 and abs(n - 6e6) / 6e6 < 0.03, n


def test_the_demo_size_builds():
    model = timm.create_model(
        "ibit_tiny_patch16_224", img_size=32, patch_size=4, embed_dim=48, depth=4, num_heads=3, num_classes=10
    )
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)
    assert model.pretrained_cfg["input_size"] == (3, 224, 224)
