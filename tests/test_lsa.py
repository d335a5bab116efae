"""LSA: shift variants, the local attention's locality and cost, the pyramid, every entrypoint."""

from __future__ import annotations

import pytest
import timm
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode

import locvit.models  # noqa: F401
from locvit.models.family import family_named
from locvit.models.lsa import SHIFTS, LocalShiftAttention, LSAAttention, resolve_shifts

# The family's own small build (16x16 input, a 4x4 grid of 4-pixel patches, two levels) less its shifts, which
# the tests choose, with 5 classes and no drop path.
SMALL = {k: v for k, v in family_named("lsa").small.kwargs.items() if k != "shifts"} | dict(
    num_classes=5, drop_path_rate=0.0
)


def test_variants_are_exact_circular_shifts():
    model = timm.create_model("lsa_tiny_cifar", **SMALL)
    img = torch.arange(2 * 3 * 16 * 16, dtype=torch.float32).reshape(2, 3, 16, 16)
    variants = model.patch_embed.variants(img)  # (B, T, C, H, W)
    assert variants.shape == (2, 18, 3, 16, 16)
    assert torch.equal(variants[:, 0], img)  # variant 0 is the unshifted image
    for i, (dx, dy) in enumerate(SHIFTS["cifar18"]):
        assert torch.equal(variants[:, i], torch.roll(img, shifts=(dy, dx), dims=(2, 3)))
    # (dx, dy) = (1, 0) moves the content one pixel right, wrapping the last column to the front.
    right = variants[:, SHIFTS["cifar18"].index((1, 0))]
    assert torch.equal(right[..., 1:], img[..., :-1]) and torch.equal(right[..., 0], img[..., -1])


def test_translate_mode_reflects_at_the_edges():
    model = timm.create_model("lsa_tiny_cifar", shift_mode="translate", **SMALL)
    img = torch.randn(1, 3, 16, 16)
    variants = model.patch_embed.variants(img)
    i = SHIFTS["cifar18"].index((2, -1))  # 2 right, 1 up
    assert torch.equal(variants[0, i, :, :-1, 2:], img[0, :, 1:, :-2])  # the interior is translated
    assert torch.equal(variants[0, i, :, :-1, 0], img[0, :, 1:, 2])  # the new left column is reflected
    assert model.patch_embed.proj.groups == 1  # one conv shared by all variants


def test_local_attention_of_a_patch_sees_only_its_own_variants():
    torch.manual_seed(0)
    attn = LocalShiftAttention(24, 3).eval()
    x, z = torch.randn(2, 16, 24), torch.randn(2, 18, 16, 24)
    out = attn(x, z)
    z2 = z.clone()
    z2[:, :, 5] += torch.randn(2, 18, 24)  # perturb every variant of patch 5
    out2 = attn(x, z2)
    assert torch.equal(out[:, torch.arange(16) != 5], out2[:, torch.arange(16) != 5])
    assert not torch.allclose(out[:, 5], out2[:, 5])


def test_a_pixel_reaches_only_the_patches_whose_variants_contain_it():
    torch.manual_seed(0)
    model = timm.create_model("lsa_tiny_cifar", **SMALL).eval()
    img = torch.randn(1, 3, 16, 16)
    r, c = 9, 6  # a pixel of patch (2, 1)
    bumped = img.clone()
    bumped[0, :, r, c] += 5.0
    changed = (model.forward_local(img) - model.forward_local(bumped)).abs().amax(dim=(0, 2)) > 0  # (N,)
    # Variant (dx, dy) holds the pixel at ((r + dy) % 16, (c + dx) % 16), i.e. in one 4x4 patch.
    reach = {((r + dy) % 16 // 4) * 4 + (c + dx) % 16 // 4 for dx, dy in SHIFTS["cifar18"]}
    assert set(changed.nonzero().flatten().tolist()) == reach
    assert len(reach) < 16


def test_one_variant_gives_weight_exactly_one():
    torch.manual_seed(0)
    attn = LocalShiftAttention(24, 3).eval()
    x, z = torch.randn(2, 16, 24), torch.randn(2, 1, 16, 24)
    assert torch.equal(attn.weights(x, z), torch.ones(2, 1, 16, 3))
    v = attn.kv(z)[..., 24:].reshape(2, 16, 24)  # the values of the single variant
    torch.testing.assert_close(attn(x, z), attn.proj(v))


class _Largest(TorchDispatchMode):
    """Records the largest tensor any op produces (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


def _cost(module, n: int, t: int) -> tuple[int, int]:
    """(matmul FLOPs, largest tensor) of a forward and backward on B=2 images, N tokens, T variants."""
    x, z = torch.randn(2, n, 24, requires_grad=True), torch.randn(2, t, n, 24, requires_grad=True)
    with FlopCounterMode(display=False) as flops, _Largest() as largest:
        module(x, z).sum().backward()
    return flops.get_total_flops(), largest.numel


def test_local_cost_is_linear_in_tokens_and_in_variants():
    local = LocalShiftAttention(24, 3)
    flops, largest = _cost(local, 64, 9)
    assert _cost(local, 256, 9) == (4 * flops, 4 * largest)  # O(N T): 4x the tokens, 4x the cost
    flops_t, largest_t = _cost(local, 64, 18)
    assert flops_t < 2 * flops and largest_t == 2 * largest  # only keys/values grow with T
    assert largest <= 2 * 9 * 64 * 2 * 24  # never more than the (B, T, N, 2D) keys and values


def test_eager_global_attention_matches_the_fused_path():
    torch.manual_seed(0)
    attn = LSAAttention(24, 3, kv_shared=True).eval()
    x = torch.randn(2, 16, 24)
    fused = attn(x)
    attn.fused_attn = False
    torch.testing.assert_close(attn(x), fused, atol=1e-6, rtol=1e-5)


def test_pyramid_halves_the_grid_per_level():
    model = timm.create_model("lsa_tiny_cifar")
    assert model.grids == [(32, 32), (16, 16), (8, 8), (4, 4)]  # 1024 -> 256 -> 64 -> 16 tokens
    assert [len(level) for level in model.levels] == [2, 4, 4, 4]
    assert model.levels[0][0].local and not model.levels[0][1].local
    assert model.patch_embed.pos_embed.shape == (18, 1024, 192)
    assert model.levels[1][0].attn.kv.out_features == 2 * 64  # tiny: one K/V pair shared by its 3 heads
    assert timm.create_model("lsa_small_cifar").levels[1][0].attn.kv.out_features == 2 * 384


def test_shift_lists_and_bad_options():
    assert len(SHIFTS["cifar18"]) == 18 and len(SHIFTS["imagenet10"]) == 10 and len(SHIFTS["axes9"]) == 9
    for shifts in SHIFTS.values():
        assert shifts[0] == (0, 0) and len(set(shifts)) == len(shifts)
        assert set(shifts) == {(dy, dx) for dx, dy in shifts}  # symmetric: the axis convention cannot matter
    assert resolve_shifts([[0, 0], [3, -1]]) == ((0, 0), (3, -1))
    with pytest.raises(ValueError, match="allowed values: none, axes9"):
        resolve_shifts("cifar17")
    with pytest.raises(ValueError, match=r"starting with \[0, 0\]"):
        resolve_shifts([[1, 0], [0, 0]])
    with pytest.raises(ValueError, match="shift_mode: 'roll' is not allowed; allowed values: conv, translate"):
        timm.create_model("lsa_tiny_cifar", shift_mode="roll", **SMALL)
    with pytest.raises(ValueError, match="num_heads: need one value per level"):
        timm.create_model("lsa_tiny_cifar", **dict(SMALL, num_heads=(3, 3, 3)))


def _params(name: str, **kwargs) -> float:
    with torch.device("meta"):
        model = timm.create_model(name, **kwargs)
    return sum(p.numel() for p in model.parameters()) / 1e6


@pytest.mark.parametrize(
    "name,kwargs,paper",
    [
        ("lsa_tiny_cifar", {}, 10.2),
        ("lsa_small_cifar", {}, 36.2),
        ("lsa_base_cifar", {}, 115.8),  # Table 3
        ("lsa_tiny_224", {}, 9.9),
        ("lsa_small_224", {}, 22.0),  # Table 4
        ("lsa_tiny_cifar", dict(shifts="none"), 6.8),  # Table 5, A: no shifting
        ("lsa_tiny_cifar", dict(shifts="axes9"), 8.4),  # B: 9 shifts
        ("lsa_tiny_cifar", dict(shift_mode="translate", pos_embed="shared"), 6.8),  # C
        ("lsa_tiny_cifar", dict(shift_mode="translate"), 10.1),  # D
    ],
)
def test_parameter_counts_match_the_paper(name, kwargs, paper):
    assert abs(_params(name, **kwargs) - paper) / paper < 0.03


def test_the_no_shift_ablation_has_no_local_block():
    model = timm.create_model("lsa_tiny_cifar", shifts="none", **SMALL)
    assert not any(block.local for level in model.levels for block in level)
    assert timm.create_model("lsa_tiny_cifar", shifts="none", local_block=True, **SMALL).levels[0][0].local


def test_the_shift_embedding_learns():
    """Forward and backward of every entrypoint: tests/test_models.py; here the embedding gets gradients."""
    model = timm.create_model("lsa_tiny_cifar", **SMALL)
    model(torch.randn(2, 3, 16, 16)).logsumexp(dim=1).mean().backward()
    assert model.patch_embed.proj.weight.grad.abs().sum() > 0 and model.patch_embed.pos_embed.grad.abs().sum() > 0
