"""Analysis: attention maps of every family (exact, and harmless to the model), MaiT's ALS
(Eq. 3), the mean attention distance (ViT Fig. 7), cross-layer similarity (App. A.3),
attention rollout, the families' extras (learned masks, soft-mask alphas)."""

from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn as nn
from helpers import locvit_families

import locvit.models  # noqa: F401
from locvit.analysis.analyse import _extras, distances, locality, measures
from locvit.analysis.attention import AttentionMap, collect_attention
from locvit.analysis.metrics import (
    attention_locality_score,
    attention_rollout,
    cross_layer_similarity,
    mean_attention_distance,
    pooled_distance,
)
from locvit.models.family import family_of, map_kind, neighbourhood_mask, summary
from locvit.models.ibit import learned_masks
from locvit.models.mait import soft_mask_alphas

BUILDS = {name: family.small for name, family in locvit_families().items()}  # Family.small

VIT = dict(BUILDS["deit"].kwargs, num_classes=5)  # a 4 x 4 grid of 8-pixel patches, 3 heads, 2 blocks
# Every family at its small build (Family.small: its kinds of attention record in forward order), and
# MaiT's other mask kinds.
FAMILIES = {
    **BUILDS,
    "mait_restrict": BUILDS["mait"].but(masked_heads="sch1", mask_type="hard", mask_mode="restrict"),
    "mait_soft": BUILDS["mait"].but(masked_heads=[1, 2], mask_type="soft", alpha_init=0.3),
}


pytestmark = pytest.mark.usefixtures("cache_in_tmp")


def _build(family: str) -> nn.Module:
    """A small model whose linear weights give O(1) logits, unlike timm's 0.02 init (where
    logits are ~0 and a multiplicative mask, or its absence, changes almost nothing)."""
    torch.manual_seed(0)
    model = FAMILIES[family].build(num_classes=5)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=m.in_features**-0.5)
    return model


def _images(family: str, batch: int = 2) -> torch.Tensor:
    size = FAMILIES[family].size
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


#: The families whose records' shapes the test below works out by hand (3 heads, 4 x 4 grids; ConViT 4 heads).
SHAPES_BY_HAND = (
    "deit",
    "mait",
    "mait_restrict",
    "mait_soft",
    "mait_random",
    "mait_cait",
    "ibit",
    "convit",
    "cait",
    "lsa",
    "nest",
)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_collect_attention_reads_every_layer_and_leaves_the_model_alone(family):
    model = _build(family).train()  # collect_attention switches to eval, then back
    images = _images(family)
    fused = {n: m.fused_attn for n, m in model.named_modules() if hasattr(m, "fused_attn")}
    logits, maps = collect_attention(model, images)

    assert model.training and all(m.training for m in model.modules())
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert fused == {n: m.fused_attn for n, m in model.named_modules() if hasattr(m, "fused_attn")}
    with torch.no_grad():
        assert torch.equal(logits, model.eval()(images))

    assert tuple(m.kind for m in maps) == FAMILIES[family].kinds
    assert [m.layer for m in maps] == list(range(len(maps)))
    if family not in SHAPES_BY_HAND:  # the baselines of the papers' tables: their kinds and their rows' sums
        for record in maps:
            assert record.probs.dtype == torch.float32 and torch.isfinite(record.probs).all()
            if map_kind(record.kind).rows_sum_to_one:
                torch.testing.assert_close(record.probs.sum(-1), torch.ones(record.probs.shape[:-1]))
        return
    heads = 4 if family == "convit" else 3
    for record in maps:
        assert "attn" in record.name.split(".")[-1] and model.get_submodule(record.name) is not None
        assert record.probs.dtype == torch.float32 and record.probs.device.type == "cpu"
        n, t = record.grid[0] * record.grid[1], record.num_prefix + record.grid[0] * record.grid[1]
        if record.kind == "class":
            assert record.probs.shape == (2, heads, 1, t) and record.num_prefix == 1
        elif record.kind == "shift":
            assert record.probs.shape == (2, heads, n, 9) and record.grid == (4, 4) and record.num_prefix == 0
        elif record.kind == "block":  # 16 x 16 pixels in 4 x 4 blocks: 16, 4, 1 blocks per level
            assert record.grid == (4, 4) and record.probs.shape[1:] == (heads, 16, 16)
            assert record.probs.shape[0] == 2 * 4 ** (2 - record.layer)
        else:
            assert record.probs.shape == (2, heads, t, t)
        if map_kind(record.kind).rows_sum_to_one:
            torch.testing.assert_close(record.probs.sum(-1), torch.ones(record.probs.shape[:-1]))
    # The first layer's prefix: ViT's class token; none yet in ConViT's GPSA and CaiT's self-attention.
    first_prefix = 1 if family in ("deit", "mait", "mait_restrict", "mait_soft", "ibit") else 0
    assert maps[0].num_prefix == first_prefix


def _value(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's values (B, H or 1, T, hd), read from its own projections."""
    if hasattr(attn, "qkv"):  # timm Attention, MaiT, IBiT, MHSA, (masked) talking heads
        return attn.qkv(x).unflatten(-1, (3, attn.num_heads, -1))[:, :, 2].transpose(1, 2)
    if hasattr(attn, "kv"):  # LSA's global attention (keys/values maybe shared by the heads)
        return attn.kv(x).unflatten(-1, (2, attn.kv_heads, -1))[:, :, 1].transpose(1, 2)
    return attn.v(x).unflatten(-1, (attn.num_heads, -1)).transpose(1, 2)  # GPSA, CaiT's class attention


@pytest.mark.parametrize(
    "family", ["deit", "mait", "mait_restrict", "mait_soft", "mait_cait", "ibit", "convit", "cait", "lsa"]
)
def test_maps_are_the_weights_each_layer_applies(family):
    """proj(map @ V) gives every layer's output: the maps are the ones the model uses."""
    model = _build(family).eval()
    seen = {}
    hooks = [
        m.register_forward_hook(lambda mod, args, out: seen.__setitem__(mod, (args[0], out)))
        for m in model.modules()
        if m.__class__.__name__.endswith(("Attention", "Attn", "GPSA", "MHSA"))
    ]
    _, maps = collect_attention(model, _images(family))
    with torch.no_grad():
        model(_images(family))
        for h in hooks:
            h.remove()
        for record in maps:
            if record.kind == "shift":
                continue  # LSA's local block: its own weights() method, covered by tests/test_lsa.py
            attn = model.get_submodule(record.name)
            x, out = seen[attn]
            b, tq = x.shape[0], record.probs.shape[-2]
            mixed = (record.probs @ _value(attn, x)).transpose(1, 2).reshape(b, tq, -1)
            torch.testing.assert_close(attn.proj(mixed), out, atol=1e-5, rtol=1e-4)


def test_a_mait_hard_head_is_softmax_of_mask_times_logits():
    model = _build("mait").eval()  # layer 1 masks heads 0 and 2 (multiply mode)
    images = _images("mait")
    _, maps = collect_attention(model, images)
    with torch.no_grad():
        x = model.norm_pre(model._pos_embed(model.patch_embed(images)))
        x = model.blocks[0](x)
        attn = model.blocks[1].attn
        q, k, _ = attn.qkv(model.blocks[1].norm1(x)).reshape(2, 17, 3, 3, 8).permute(2, 0, 3, 1, 4)
        logits = q @ k.transpose(-2, -1) / math.sqrt(8)  # (B, H, 17, 17)
    mask = neighbourhood_mask((4, 4), (3, 3), num_prefix=1).float()
    expected = torch.stack(
        [(logits[:, 0] * mask).softmax(-1), logits[:, 1].softmax(-1), (logits[:, 2] * mask).softmax(-1)], dim=1
    )
    torch.testing.assert_close(maps[1].probs, expected, atol=1e-6, rtol=1e-5)


class _Unclaimed(nn.Module):
    """A transformer no family claims, built from timm's own layers: a patch grid and one ViT attention."""

    def __init__(self):
        super().__init__()
        self.patch_embed = timm.layers.PatchEmbed(img_size=16, patch_size=4, embed_dim=24)
        self.attn = timm.layers.Attention(24, num_heads=3)
        self.gru = nn.GRU(24, 24)  # not an attention layer
        self.unread = timm.models.pvt_v2.Attention(24, num_heads=3)  # one the generic reader does not know

    def forward(self, x):
        return self.attn(self.patch_embed(x)).mean(1)


def test_models_no_family_claims_are_read_generically():
    """A CNN has no attention layers, and the analyses say so; timm's own Attention in an unclaimed model is read
    over its patch grid, the ALS and distance computed; an attention layer no reader knows is named, not guessed."""
    cnn = timm.create_model("resnet18", num_classes=2)
    logits, maps = collect_attention(cnn, torch.randn(1, 3, 32, 32))
    assert logits.shape == (1, 2) and maps == []
    assert locality(maps, (3, 3), 1) == ([], [], None) and distances(maps, 32, 1) == []
    assert summary(cnn)["family"] == "resnet" and summary(cnn)["depth"] == 0 and family_of(cnn).unread(cnn) == []
    model = _Unclaimed()
    images = torch.randn(2, 3, 16, 16)
    _, maps = collect_attention(model, images)
    assert [(m.name, m.kind, m.grid, m.num_prefix) for m in maps] == [("attn", "softmax", (4, 4), 0)]
    x = model.patch_embed(images)
    q, k, _ = model.attn.qkv(x).reshape(2, 16, 3, 3, 8).permute(2, 0, 3, 1, 4)
    torch.testing.assert_close(maps[0].probs, (q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(-1))
    als, layers, _ = locality(maps, (3, 3), 2)
    assert layers == [0] and len(als[0]) == 3 and all(0 < a < 1 for a in als[0])
    assert all(0 < d < 16 for d in distances(maps, 16, 2)[0])
    assert family_of(model).unread(model) == ["Attention"]  # pvt_v2's, by class name


def test_unknown_models_and_layers_are_named():
    model = timm.create_model("vit_tiny_patch16_224", **VIT)
    model.blocks[0].attn = nn.MultiheadAttention(24, 3)
    with pytest.raises(ValueError, match="MultiheadAttention is an attention layer no reader of its family knows"):
        collect_attention(model, torch.randn(1, 3, 32, 32))


# --- Mean attention distance (ViT Fig. 7) ---------------------------------------------------


def _with_prefix(patches: torch.Tensor, prefix: int) -> torch.Tensor:
    """(N, N) patch-to-patch weights -> (T, T) with ``prefix`` class rows/columns holding junk weight."""
    n = patches.shape[-1]
    full = torch.full((prefix + n, prefix + n), 0.5)
    full[prefix:, prefix:] = patches
    return full


def test_mean_attention_distance_of_uniform_attention_is_the_mean_pairwise_distance():
    # A 2 x 2 grid: from any patch the distances are 0, 1, 1 and sqrt(2) patches.
    uniform = torch.full((4, 4), 0.25)
    expected = (2 + math.sqrt(2)) / 4
    assert mean_attention_distance(uniform, (2, 2), num_prefix=0).item() == pytest.approx(expected)
    # Class-token weight is left out (rows renormalised over the patches); spacing scales to pixels.
    assert mean_attention_distance(_with_prefix(uniform, 1), (2, 2), num_prefix=1, spacing=8.0).item() == pytest.approx(
        8 * expected
    )


def test_mean_attention_distance_of_self_attention_only_is_zero():
    assert mean_attention_distance(_with_prefix(torch.eye(9), 1), (3, 3), num_prefix=1).item() == 0.0


def test_mean_attention_distance_to_the_farthest_patch():
    # A 1 x 3 row: the farthest patch of 0 is 2 (2 away), of 1 is 0 (1 away), of 2 is 0 (2 away).
    farthest = torch.tensor([[0.0, 0.0, 1.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    assert mean_attention_distance(farthest, (1, 3), num_prefix=0).item() == pytest.approx(5 / 3)
    # 3 x 3: corners reach the opposite corner (2 sqrt 2), edges the far corners (sqrt 5), the centre a corner.
    grid = [(y, x) for y in range(3) for x in range(3)]
    far = torch.zeros(9, 9)
    for i, (y, x) in enumerate(grid):
        far[i, max(range(9), key=lambda j: (grid[j][0] - y) ** 2 + (grid[j][1] - x) ** 2)] = 1.0
    expected = (4 * 2 * math.sqrt(2) + 4 * math.sqrt(5) + math.sqrt(2)) / 9
    assert mean_attention_distance(far, (3, 3), num_prefix=0).item() == pytest.approx(expected)


def test_mean_attention_distance_keeps_leading_dims_and_checks_the_grid():
    maps = torch.stack([torch.eye(4), torch.full((4, 4), 0.25)]).expand(5, 2, 4, 4)  # (B, H, N, N)
    out = mean_attention_distance(maps, (2, 2), num_prefix=0)
    assert out.shape == (5, 2) and out[:, 0].eq(0).all()
    with pytest.raises(ValueError, match="do not have 1 prefix"):
        mean_attention_distance(maps, (2, 2), num_prefix=1)


@pytest.mark.parametrize("family", ["deit", "mait", "ibit", "cait", "convit", "lsa", "nest"])
def test_mean_attention_distance_of_real_models_is_in_pixels(family):
    """Per layer and head, within [0, the image's diagonal]; None exactly where a layer has no patch grid."""
    images = _images(family)
    _, maps = collect_attention(_build(family), images)
    mad = distances(maps, images.shape[-1], len(images))
    assert len(mad) == len(maps)
    for m, heads in zip(maps, mad):
        assert (heads is None) == (m.kind in ("shift", "class"))
        if heads is not None:
            assert len(heads) == m.probs.shape[1]
            assert all(0 <= d <= images.shape[-1] * math.sqrt(2) for d in heads)


def test_mean_attention_distance_of_a_vit_layer_by_hand():
    """DeiT on a 4 x 4 grid of 8-pixel patches: the record equals the formula applied to the layer's map."""
    images = _images("deit")
    _, maps = collect_attention(_build("deit"), images)
    m = maps[0]
    n = 16
    dist = torch.cdist(*(torch.tensor([[i // 4, i % 4] for i in range(n)], dtype=torch.float64),) * 2) * 8
    a = m.probs[..., 1:, 1:].double()
    a = a / a.sum(-1, keepdim=True)
    expected = (a * dist).sum(-1).mean(-1).mean(0)  # (H,)
    assert distances(maps, 32, len(images))[0] == pytest.approx(expected.tolist(), rel=1e-5)


# --- MaiT's attention locality score (Eq. 3) ----------------------------------------------


def test_als_of_a_uniform_map_is_the_mean_neighbourhood_over_t():
    mask = neighbourhood_mask((3, 3), (3, 3), num_prefix=1)  # T = 10
    uniform = torch.full((10, 10), 0.1)
    # 3 x 3 grid: 4 corners keep 4 patches, 4 edges keep 6, the centre keeps 9 -> 49 / 9 per row.
    expected = (4 * 4 + 4 * 6 + 9) / 9 / 10
    assert attention_locality_score(uniform, mask).item() == pytest.approx(expected)


def test_als_is_one_on_the_patch_itself_and_ignores_the_class_row():
    mask = neighbourhood_mask((4, 4), (3, 3), num_prefix=1)
    own = torch.eye(17)
    assert attention_locality_score(own, mask).item() == pytest.approx(1.0)
    noisy = own.clone()
    noisy[0] = torch.softmax(torch.randn(17), -1)  # the class row is not scored
    assert attention_locality_score(noisy, mask).item() == pytest.approx(1.0)
    half = 0.5 * own + 0.5 * torch.nn.functional.one_hot(torch.zeros(17, dtype=torch.long), 17)  # half to CLS
    assert attention_locality_score(half, mask).item() == pytest.approx(0.5)  # CLS is outside a patch's mask


def test_als_keeps_layer_and_head_dims():
    mask = neighbourhood_mask((3, 3), (3, 3), num_prefix=1)
    maps = torch.softmax(torch.randn(4, 2, 3, 10, 10), dim=-1)  # (L, B, H, T, T)
    als = attention_locality_score(maps, mask)
    assert als.shape == (4, 2, 3)
    assert torch.allclose(als[1, 0, 2], attention_locality_score(maps[1, 0, 2], mask))
    with pytest.raises(ValueError, match="does not match"):
        attention_locality_score(maps, neighbourhood_mask((4, 4)))


# --- cross-layer similarity (MaiT App. A.3) -----------------------------------------------


def test_cross_layer_similarity_of_identical_and_orthogonal_layers():
    a = torch.softmax(torch.randn(2, 5, 5), dim=-1)  # (H, T, T)
    same = cross_layer_similarity(torch.stack([a, a, a]))  # (L=3, H, T, T)
    assert same.shape == (2, 3, 3)
    torch.testing.assert_close(same, torch.ones(2, 3, 3))
    first = torch.zeros(2, 5, 5)
    first[..., 0] = 1.0
    second = torch.zeros(2, 5, 5)
    second[..., 1] = 1.0
    sim = cross_layer_similarity(torch.stack([first, second]))
    torch.testing.assert_close(sim, torch.eye(2).expand(2, 2, 2))  # orthogonal rows: 0 off the diagonal


def test_cross_layer_similarity_is_symmetric_with_unit_diagonal_and_averages_a_batch():
    maps = torch.softmax(torch.randn(3, 4, 2, 6, 6), dim=-1)  # (B, L, H, T, T)
    sim = cross_layer_similarity(maps)
    assert sim.shape == (2, 4, 4)
    torch.testing.assert_close(sim, sim.transpose(1, 2))
    torch.testing.assert_close(torch.diagonal(sim, dim1=1, dim2=2), torch.ones(2, 4))
    torch.testing.assert_close(sim, torch.stack([cross_layer_similarity(m) for m in maps]).mean(0))
    assert 0.0 < sim.min() and sim.max() <= 1.0 + 1e-6


# --- attention rollout ----------------------------------------------------------------------


def _record(probs: torch.Tensor, layer: int, kind: str = "softmax", num_prefix: int = 1) -> AttentionMap:
    return AttentionMap(f"blocks.{layer}.attn", layer, probs, (2, 2), num_prefix, kind)


def _moves(t: int, moves: dict[int, int]) -> torch.Tensor:
    """(1, 1, t, t): identity rows except ``row -> column`` one-hot moves."""
    a = torch.eye(t)
    for row, col in moves.items():
        a[row] = torch.nn.functional.one_hot(torch.tensor(col), t).float()
    return a[None, None]


def test_rollout_multiplies_the_layers_in_forward_order():
    # Tokens: 0 = CLS, 1..4 = patches. Layer 0: patch 1 looks at patch 4; layer 1: CLS looks at patch 1.
    # CLS = 0.5 CLS + 0.5 (patch 1 after layer 0 = 0.5 p1 + 0.5 p4): equal shares of p1 and p4.
    early, late = _record(_moves(5, {1: 4}), 0), _record(_moves(5, {0: 1}), 1)
    torch.testing.assert_close(attention_rollout([early, late]), torch.tensor([[[1.0, 0.0], [0.0, 1.0]]]))
    # The other order: CLS reads patch 1 before patch 1 moves, so only p1 counts.
    swapped = [_record(_moves(5, {0: 1}), 0), _record(_moves(5, {1: 4}), 1)]
    torch.testing.assert_close(attention_rollout(swapped), torch.tensor([[[1.0, 0.0], [0.0, 0.0]]]))


def test_rollout_of_identity_and_uniform_attention():
    identity = [_record(torch.eye(5).expand(2, 3, 5, 5), i) for i in range(3)]
    assert torch.equal(attention_rollout(identity), torch.zeros(2, 2, 2))  # CLS never reads a patch
    uniform = [_record(torch.full((2, 3, 5, 5), 0.2), i) for i in range(3)]
    torch.testing.assert_close(attention_rollout(uniform), torch.ones(2, 2, 2))  # every patch alike


def test_rollout_of_signed_maps_uses_their_magnitude():
    probs = _moves(5, {0: 2})
    signed = [_record(-probs, 0, kind="frobenius")]
    assert torch.equal(attention_rollout(signed), attention_rollout([_record(probs, 0)]))


def test_rollout_embeds_class_attention_and_patch_only_layers():
    # CaiT: a self-attention layer over the 4 patches (no CLS), then class attention (Tq = 1).
    patch_only = _record(_moves(4, {0: 3}), 0, num_prefix=0)  # patch 1 (index 0) looks at patch 4
    cls_row = torch.nn.functional.one_hot(torch.tensor(1), 5).float()[None, None, None]  # CLS reads patch 1
    torch.testing.assert_close(
        attention_rollout([patch_only, _record(cls_row, 1, kind="class")]), torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    )


@pytest.mark.parametrize("family", ["deit", "mait_soft", "mait_cait", "ibit", "convit"])
def test_rollout_of_real_models(family):
    model = _build(family)
    _, maps = collect_attention(model, _images(family))
    for fusion in ("mean", "max", "min"):
        roll = attention_rollout(maps, head_fusion=fusion)
        assert roll.shape == (2, 4, 4) and roll.min() >= 0
        torch.testing.assert_close(roll.flatten(1).amax(-1), torch.ones(2))


@pytest.mark.parametrize("family", ["lsa", "nest"])
def test_rollout_needs_a_class_token(family):
    model = _build(family)
    _, maps = collect_attention(model, _images(family))
    with pytest.raises(ValueError, match="class token"):
        attention_rollout(maps)
    with pytest.raises(ValueError, match="head_fusion"):
        attention_rollout(maps, head_fusion="sum")


# --- learned masks ------------------------------------------------------------------------


def test_ibit_learned_masks_start_as_a_kernel_around_the_centre_patch():
    model = _build("ibit")
    masks = learned_masks(model)
    assert masks.shape == (2, 3, 4, 4)
    centre = 2 * 4 + 2
    assert (masks.flatten(2).argmax(-1) == centre).all()
    assert (masks[..., 2, 2] - 1.0).abs().max() < 0.05  # exp(-0.5 d): 1 on the patch,
    assert (masks[..., 2, 3] - math.exp(-0.5)).abs().max() < 0.05  # exp(-0.5) one patch away
    with pytest.raises(ValueError, match="VisionTransformer has no IBiT"):
        learned_masks(_build("deit"))


def test_soft_mask_alphas_are_nan_where_no_soft_mask():
    alphas = soft_mask_alphas(_build("mait_soft"))  # layer 0: head 0 soft; layer 1: heads 0, 1
    nan = float("nan")
    torch.testing.assert_close(alphas, torch.tensor([[0.3, nan, nan], [0.3, 0.3, nan]]), equal_nan=True)
    for family in ("mait", "deit"):
        with pytest.raises(ValueError, match="no MaiT soft mask"):
            soft_mask_alphas(_build(family))


# --- the families' extras, through their declarations --------------------------------------


def test_the_analysis_writes_what_each_family_declares_as_extras():
    """MaiT's soft masks give JSON alphas (null where a head has none), IBiT's learned masks an array for
    the npz; a model with none of an extra (MaiT's hard masks) and a family without extras write nothing."""
    values, arrays = _extras(_build("mait_soft"))
    assert arrays == {} and list(values) == ["alphas"]
    assert [[a is None for a in row] for row in values["alphas"]] == [[False, True, True], [False, False, True]]
    assert values["alphas"][1][1] == pytest.approx(0.3)
    values, arrays = _extras(_build("ibit"))
    assert values == {} and arrays["learned_masks"].shape == (2, 3, 4, 4)
    assert _extras(_build("mait")) == ({}, {}) == _extras(_build("deit"))


def test_a_family_declares_its_own_extras_the_way_locvits_do(monkeypatch):
    """A family outside locvit declares an Extra of each shape and the analysis writes both."""
    from timm.models.vision_transformer import VisionTransformer

    from locvit.models import family

    class Ours(VisionTransformer):
        pass

    monkeypatch.setattr(family, "_FAMILIES", family.families())  # registered for this test only
    heads = [[0.5, float("nan"), 1.5]] * 2
    family.register_family(
        family.Family(
            "ours",
            "Ours",
            Ours,
            "none",
            family.vit_blocks,
            lambda m: family.vit_sites(m, {}),
            extras=(
                family.Extra("spread", "values", lambda m: torch.tensor(heads), "Spread", "Spread"),
                family.Extra("maps", "images", lambda m: torch.ones(2, 3, 4, 4), "Maps", "Maps"),
                family.Extra("absent", "values", lambda m: None, "Absent", "Absent"),
            ),
        )
    )
    values, arrays = _extras(Ours(**VIT))
    assert values == {"spread": [[0.5, None, 1.5]] * 2} and arrays["maps"].shape == (2, 3, 4, 4)
    with pytest.raises(ValueError, match="shape 'table' is not one of values, images"):
        family.Extra("x", "table", lambda m: None, "X", "X")


def test_the_distance_to_pooled_keys_is_to_their_cells_centres():
    """PVT's and Twins' keys lie on the grid pooled by R: a key sits at its cell's centre. With R = 1 the distance is
    the ordinary one; attention to the cell that holds the query is the query's distance to that centre."""
    grid = (4, 4)
    probs = torch.rand(2, 3, 16, 16).softmax(-1)
    torch.testing.assert_close(pooled_distance(probs, grid, 2.0), mean_attention_distance(probs, grid, 0, 2.0))
    own = torch.zeros(1, 1, 16, 4)  # R = 2: four 2 x 2 cells, centres half a patch from each of their patches
    for q in range(16):
        own[0, 0, q, (q // 4 // 2) * 2 + (q % 4) // 2] = 1.0
    torch.testing.assert_close(pooled_distance(own, grid, 4.0), torch.tensor([[4.0 * math.sqrt(0.5)]]))
    with pytest.raises(ValueError, match="do not have the 4x4 grid's patches as queries"):
        pooled_distance(torch.rand(1, 1, 16, 3), grid)
    # Twins' sub-sampled attention as the analysis sees it: a distance, no ALS (ALS needs the queries' grid as keys)
    model = timm.create_model(
        "twins_pcpvt_small",
        img_size=32,
        embed_dims=(16, 32, 32, 32),
        depths=(1, 1, 1, 1),
        num_heads=(1, 2, 2, 2),
        num_classes=2,
    )
    _, maps = collect_attention(model, torch.randn(2, 3, 32, 32))
    assert [m.kind for m in maps] == ["pooled_keys"] * 3 + ["softmax"]
    als, _, _ = locality(maps, (3, 3), 2)
    assert als[:3] == [None] * 3 and all(d is not None and all(x > 0 for x in d) for d in distances(maps, 32, 2)[:3])


# --- What a locality number measured: stages, one headline over the same layers, "by construction" -----------


def test_a_pyramid_reports_each_stage_and_one_headline_over_the_same_layers():
    """PVT v1 at 64 pixels: stages on 16, 8, 4 and 2 x 2 grids; stages 1-3 attend to pooled keys (a distance, no
    ALS), stage 4 to its own 2 x 2 grid, which the 3 x 3 kernel covers: its ALS is 1 less the class token's share
    by construction. The headline ALS and distance are both stage 4's, said so, and every stage has its own."""
    torch.manual_seed(0)
    model = timm.create_model("pvt_v1_tiny", img_size=64, depths=(1, 1, 1, 1), num_classes=2).eval()
    _, maps = collect_attention(model, torch.randn(2, 3, 64, 64))
    record = measures(maps, (3, 3), 64, 2)
    assert [(s["layers"], s["grid"]) for s in record["stages"]] == [
        ([0], [16, 16]),
        ([1], [8, 8]),
        ([2], [4, 4]),
        ([3], [2, 2]),
    ]
    assert [s["als_mean"] is None for s in record["stages"]] == [True, True, True, False]
    assert all(s["mad_mean"] > 0 for s in record["stages"])
    assert record["als_by_construction"] == [None, None, None, True] and record["stages"][3]["als_by_construction"]
    assert record["locality_layers"] == [3] and record["als_mean_by_construction"]
    assert (record["als_mean"], record["mad_mean"]) == (
        record["stages"][3]["als_mean"],
        record["stages"][3]["mad_mean"],
    )
    assert record["not_run"]["rollout"] == "its layers see different grids (2x2, 4x4, 8x8, 16x16)"


def test_a_window_inside_the_kernel_is_marked_and_a_wider_one_is_not():
    """Swin with window 2: every window lies inside the 3 x 3 kernel, ALS 1.000 by construction at both stages;
    with window 4 the first stage's windows reach past it and the headline is theirs alone. Layers of different
    shapes get no cross-layer similarity, and the file says why."""
    kw = dict(img_size=16, embed_dim=16, depths=(2, 2), num_heads=(1, 2), num_classes=2)
    images = torch.randn(2, 3, 16, 16)
    _, maps = collect_attention(timm.create_model("swin_tiny_patch4_window7_224", window_size=2, **kw), images)
    record = measures(maps, (3, 3), 16, 2)
    assert record["als_by_construction"] == [True] * 4 and record["locality_layers"] == [0, 1, 2, 3]
    assert record["als_mean"] == pytest.approx(1.0) and record["als_mean_by_construction"]
    assert [s["grid"] for s in record["stages"]] == [[4, 4], [2, 2]]
    assert record["cross_layer_similarity"] is None
    assert record["not_run"]["cross_layer_similarity"] == "its layers' maps differ in shape (2x2x4x4, 8x1x4x4)"
    _, maps = collect_attention(timm.create_model("swin_tiny_patch4_window7_224", window_size=4, **kw), images)
    record = measures(maps, (3, 3), 16, 2)
    assert record["als_by_construction"] == [False, False, True, True] and record["locality_layers"] == [0, 1]
    assert record["als_mean"] < 1 and not record["als_mean_by_construction"]
    first = [d for heads in record["mad"][:2] for d in heads]
    assert record["mad_mean"] == pytest.approx(sum(first) / len(first))
