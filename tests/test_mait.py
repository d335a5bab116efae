"""MaiT: masks (Fig. 1), the two mask modes, soft masks, schemes, every entrypoint."""

from __future__ import annotations

import warnings

import pytest
import timm
import torch
import torch.nn as nn

import locvit.models  # noqa: F401
from locvit.models.family import neighbourhood_mask
from locvit.models.mait import MaiT, MaskedAttention, random_mask, scheme_heads

SMALL = dict(img_size=32, patch_size=4, embed_dim=48, depth=3, num_heads=3, num_classes=10)


def test_figure_1_masks_on_the_14x14_grid():
    mask = neighbourhood_mask((14, 14), (3, 3), num_prefix=1)  # token t = patch t-1
    kept = lambda patch, m=mask: sorted((m[patch + 1].nonzero().flatten() - 1).tolist())  # noqa: E731
    assert kept(16) == [1, 2, 3, 15, 16, 17, 29, 30, 31]
    big = neighbourhood_mask((14, 14), (5, 5), num_prefix=1)
    assert kept(36, big) == [r * 14 + c for r in range(0, 5) for c in range(6, 11)]  # its 25 neighbours
    assert len(kept(0)) == 4 and len(kept(13)) == 4 and len(kept(14)) == 6  # corners and borders keep fewer
    assert mask[0].all()  # the class-token row keeps everything
    assert not mask[1:, 0].any()  # patch rows keep 9 of N+1 entries, not the class token
    assert mask.shape == (197, 197)


def test_rectangular_kernel_and_bad_kernels():
    mask = neighbourhood_mask((6, 6), (3, 5), num_prefix=0)
    assert int(mask[2 * 6 + 2].sum()) == 15  # an interior patch: 3 rows x 5 columns
    with pytest.raises(ValueError, match="odd"):
        neighbourhood_mask((6, 6), (2, 3))


def test_random_mask_has_the_same_keep_rate():
    keep = neighbourhood_mask((14, 14), (3, 3), 1)
    rnd = random_mask(keep, 1, seed=0)
    assert rnd[0].all()
    rate, rnd_rate = keep[1:].float().mean().item(), rnd[1:].float().mean().item()
    assert abs(rate - rnd_rate) < 0.005 and not torch.equal(rnd, keep)
    assert torch.equal(rnd, random_mask(keep, 1, seed=0))  # fixed by its seed


def test_schemes():
    assert scheme_heads("sch1", 24, 3) == [[0]] * 24
    sch2 = scheme_heads("sch2", 24, 3)
    assert sch2[:8] == [[0, 1]] * 8 and sch2[8:20] == [[0]] * 12 and sch2[20:] == [[]] * 4
    sch3 = scheme_heads("sch3", 24, 3)
    assert sch3[:21] == [[0, 1, 2]] * 21 and sch3[21:] == [[]] * 3
    mixed = scheme_heads("mixed", 36, 3)
    assert mixed[:12] == [[0, 1, 2]] * 12 and mixed[12:] == [[0]] * 24
    assert scheme_heads([0, 2, [1, 2]], 3, 3) == [[], [0, 1], [1, 2]]
    with pytest.raises(ValueError, match="allowed values: none, sch1"):
        scheme_heads("sch9", 12, 3)
    with pytest.raises(ValueError, match="heads that do not exist"):
        scheme_heads([[3], 0, 0], 3, 3)
    with pytest.raises(ValueError, match="one entry per layer"):
        scheme_heads([1, 1], 3, 3)


def _first_attn(model: MaiT) -> MaskedAttention:
    return model.blocks[0].attn


def test_multiply_mode_zeroes_logits_outside_the_neighbourhood():
    model = timm.create_model("mait_tiny_patch16_224", masked_heads=[1, 0, 0], mask_type="hard", **SMALL).eval()
    attn = _first_attn(model)
    x = torch.randn(2, 65, 48)
    logits = attn.attention_maps(x, logits=True)  # (B, H, T, T)
    keep = attn.masks.keep
    assert torch.all(logits[:, 0][:, ~keep] == 0)  # masked head: exactly 0 outside
    assert torch.all(logits[:, 0][:, keep] != 0)
    assert torch.all(logits[:, 1:] != 0)  # other heads untouched
    probs = attn.attention_maps(x)
    assert torch.all(probs[:, 0][:, ~keep] > 0)  # e^0: the head can still look outside
    assert torch.allclose(probs.sum(-1), torch.ones(()))


def test_restrict_mode_zeroes_attention_outside_the_neighbourhood():
    model = timm.create_model(
        "mait_tiny_patch16_224", masked_heads="sch1", mask_mode="restrict", mask_type="hard", **SMALL
    ).eval()
    attn = _first_attn(model)
    probs = attn.attention_maps(torch.randn(2, 65, 48))
    keep = attn.masks.keep
    assert torch.all(probs[:, 0][:, ~keep] == 0) and torch.all(probs[:, 0][:, keep] > 0)
    assert torch.allclose(probs.sum(-1), torch.ones(()))


@pytest.mark.parametrize(
    "opts", [dict(mask_type="soft"), dict(mask_type="hard"), dict(mask_type="hard", mask_mode="restrict")]
)
def test_forward_agrees_with_the_attention_maps(opts):
    """The fast paths (fused unmasked heads + eager masked heads; one masked SDPA call for
    restrict) equal the plain computation from the attention maps."""
    torch.manual_seed(0)
    model = timm.create_model("mait_tiny_patch16_224", masked_heads=[1, 2, [2]], **opts, **SMALL).eval()
    attn = model.blocks[1].attn
    x = torch.randn(2, 65, 48)
    probs = attn.attention_maps(x)  # (B, H, T, T)
    v = attn.qkv(x).reshape(2, 65, 3, 3, 16).permute(2, 0, 3, 1, 4)[2]
    expected = attn.proj((probs @ v).transpose(1, 2).reshape(2, 65, 48))
    assert torch.allclose(attn(x), expected, atol=1e-5)


def test_soft_alpha_gets_a_gradient_and_alpha_one_is_the_unmasked_head():
    torch.manual_seed(0)
    soft = timm.create_model("mait_tiny_patch16_224", masked_heads="all", mask_type="soft", alpha_init=0.3, **SMALL)
    alphas = [b.attn.masks.alpha() for b in soft.blocks]
    assert all(torch.allclose(a, torch.full((3,), 0.3)) for a in alphas)
    # All tokens' features: in the last layer only patch rows (not the class row) see alpha.
    soft.forward_features(torch.randn(2, 3, 32, 32)).pow(2).sum().backward()
    assert all(b.attn.masks.alpha_logit.grad.abs().sum() > 0 for b in soft.blocks)

    plain = timm.create_model("mait_tiny_patch16_224", masked_heads="none", **SMALL).eval()
    plain.load_state_dict({k: v for k, v in soft.state_dict().items() if "alpha" not in k})
    with torch.no_grad():
        for b in soft.blocks:
            b.attn.masks.alpha_logit.fill_(100.0)  # sigmoid(100) == 1.0 in float32
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(soft.eval()(x), plain(x), atol=1e-5)


def test_no_masked_head_is_exactly_timms_vit():
    torch.manual_seed(0)
    vit = timm.create_model("vit_tiny_patch16_224", **SMALL).eval()
    mait = timm.create_model("mait_tiny_patch16_224", masked_heads="none", **SMALL).eval()
    assert list(mait.state_dict()) == list(vit.state_dict())
    mait.load_state_dict(vit.state_dict())
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(mait(x), vit(x))


def test_masks_add_no_parameters_and_soft_masks_one_per_head():
    base = sum(p.numel() for p in timm.create_model("vit_tiny_patch16_224", **SMALL).parameters())
    hard = timm.create_model("mait_tiny_patch16_224", masked_heads="all", mask_type="hard", **SMALL)
    soft = timm.create_model("mait_tiny_patch16_224", masked_heads="all", mask_type="soft", **SMALL)
    assert sum(p.numel() for p in hard.parameters()) == base
    assert sum(p.numel() for p in soft.parameters()) == base + 3 * 3  # depth x heads


def test_masked_cait_masks_its_self_attention():
    model = timm.create_model(
        "mait_cait_xxs24_224", img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=10
    )
    attn = model.blocks[0].attn
    assert attn.masks.active and attn.masks.heads.tolist() == [0] and attn.masks.keep.shape == (64, 64)
    cait = timm.create_model(
        "cait_xxs24_224", img_size=32, patch_size=4, embed_dim=32, depth=2, num_heads=4, num_classes=10
    )
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in cait.parameters())


def test_bad_options_name_the_option():
    with pytest.raises(ValueError, match="mask_mode: 'sparse' is not allowed; allowed values: multiply, restrict"):
        timm.create_model("mait_tiny_patch16_224", mask_mode="sparse", **SMALL)
    with pytest.raises(ValueError, match="needs mask_mode 'multiply'"):
        timm.create_model("mait_tiny_patch16_224", mask_mode="restrict", mask_type="soft", **SMALL)


# Parameter counts of the paper's Table 4 (and DeiT-T's 5.7M for the 12-layer tiny).
PAPER_PARAMS = {
    "mait_xtiny_d24_patch16_224": 6.3e6,
    "mait_tiny_d24_patch16_224": 11e6,
    "mait_xsmall_d24_patch16_224": 24.5e6,
    "mait_small_d24_patch16_224": 43.3e6,
    "mait_tiny_patch16_224": 5.7e6,
}


@pytest.mark.parametrize("name", sorted(PAPER_PARAMS))
def test_entrypoints_have_the_papers_sizes(name):
    """Forward and backward of every entrypoint: tests/test_models.py."""
    with torch.device("meta"):
        full = timm.create_model(name)
    n = sum(p.numel() for p in full.parameters())
    assert abs(n - PAPER_PARAMS[name]) / PAPER_PARAMS[name] < 0.03, n


def test_random_restrict_masks_keep_every_row_finite():
    """A random mask at a low keep rate would leave some rows with no key: each keeps at least itself."""
    keep = neighbourhood_mask((8, 8), (1, 1), 1)  # itself only: keep rate 1/65 per patch row
    for seed in range(20):
        rnd = random_mask(keep, 1, seed=seed)
        assert rnd[1:].any(dim=1).all() and rnd.diagonal()[1:].all()
    model = timm.create_model(
        "mait_tiny_patch16_224",
        masked_heads="all",
        mask_type="random",
        mask_mode="restrict",
        mask_kernel=(1, 1),
        **SMALL,
    ).eval()
    assert torch.isfinite(model(torch.randn(2, 3, 32, 32))).all()


def test_a_callers_attention_mask_is_refused_not_silently_dropped():
    model = timm.create_model("mait_tiny_patch16_224", masked_heads="sch1", mask_type="hard", **SMALL).eval()
    attn = model.blocks[0].attn
    x = torch.randn(1, 65, attn.qkv.in_features)
    with pytest.raises(ValueError, match="masked_heads='none'"):
        attn(x, attn_mask=torch.zeros(65, 65, dtype=torch.bool))
    with pytest.raises(ValueError, match="is_causal"):
        attn(x, is_causal=True)
    plain = timm.create_model("mait_tiny_patch16_224", masked_heads="none", **SMALL).eval()
    assert plain.blocks[0].attn(x, attn_mask=torch.ones(65, 65, dtype=torch.bool)).shape == x.shape


def test_restrict_on_the_maitplus_entrypoints_takes_hard_masks_and_soft_restrict_says_what_to_set():
    for name in ("mait_tiny_patch16_224", "mait_small_patch16_224"):
        model = timm.create_model(name, img_size=32, patch_size=8, depth=2, mask_mode="restrict")
        assert model.mask_options["mask_type"] == "hard" and model.mask_options["mask_mode"] == "restrict"
        assert timm.create_model(name, img_size=32, patch_size=8, depth=2).mask_options["mask_type"] == "soft"
    with pytest.raises(ValueError, match="for mask_mode 'restrict' set mask_type to 'hard'"):
        timm.create_model(
            "mait_tiny_patch16_224", img_size=32, patch_size=8, depth=2, mask_mode="restrict", mask_type="soft"
        )


def test_timms_block_arguments_reach_the_masked_blocks():
    model = timm.create_model(
        "mait_tiny_patch16_224",
        img_size=32,
        patch_size=8,
        depth=2,
        qk_norm=True,
        attn_drop_rate=0.1,
        proj_drop_rate=0.2,
        init_values=1e-4,
        scale_attn_norm=True,
    )
    attn = model.blocks[1].attn
    assert isinstance(attn, MaskedAttention) and attn.masks.active
    assert isinstance(attn.q_norm, nn.LayerNorm) and isinstance(attn.norm, nn.LayerNorm)
    assert attn.attn_drop.p == 0.1 and attn.proj_drop.p == 0.2
    assert torch.allclose(model.blocks[1].ls1.gamma, torch.full((192,), 1e-4))
    cait = timm.create_model(
        "mait_cait_xxs24_224", img_size=32, patch_size=8, depth=2, attn_drop_rate=0.1, proj_drop_rate=0.2
    )
    assert cait.blocks[0].attn.attn_drop.p == 0.1 and cait.blocks[0].attn.proj_drop.p == 0.2


@pytest.mark.parametrize("schedule", ["linear", "constant"])
def test_drop_path_schedule(schedule):
    model = timm.create_model(
        "mait_small_d24_patch16_224",
        img_size=32,
        patch_size=8,
        depth=4,
        drop_path_rate=0.1,
        drop_path_schedule=schedule,
    )
    rates = [getattr(b.drop_path1, "drop_prob", 0.0) for b in model.blocks]
    assert rates == pytest.approx([0.1] * 4 if schedule == "constant" else [0.0, 0.1 / 3, 0.2 / 3, 0.1])
    assert all(getattr(b.drop_path2, "drop_prob", 0.0) == r for b, r in zip(model.blocks, rates))
    with pytest.raises(
        ValueError, match="drop_path_schedule: 'cosine' is not allowed; allowed values: linear, constant"
    ):
        timm.create_model("mait_tiny_patch16_224", drop_path_schedule="cosine", img_size=32, patch_size=8, depth=2)


@pytest.mark.parametrize("masked_heads", ["sch1", "all"])
def test_restrict_through_flex_attention_equals_dense_restrict(masked_heads):
    """FlexAttention's block-sparse path (CUDA's default; here its eager reference on CPU, forward only)
    against the dense boolean-mask path on the same weights."""
    kwargs = dict(
        img_size=64,
        patch_size=4,
        embed_dim=48,
        depth=2,
        num_heads=3,
        masked_heads=masked_heads,
        mask_type="hard",
        mask_mode="restrict",
    )  # a 16 x 16 grid: 257 tokens, three 128-blocks
    torch.manual_seed(0)
    flex = timm.create_model("mait_tiny_patch16_224", restrict_kernel="flex", **kwargs).eval()
    dense = timm.create_model("mait_tiny_patch16_224", restrict_kernel="dense", **kwargs).eval()
    dense.load_state_dict(flex.state_dict())
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(flex(x), dense(x), atol=1e-5, rtol=1e-4)
    assert flex.blocks[0].attn._block_mask is not None  # it did take the flex path
    assert (
        timm.create_model("mait_tiny_patch16_224", mask_mode="restrict", img_size=32, patch_size=8, depth=2)
        .blocks[0]
        .attn.restrict_kernel
        == "auto"
    )
    with pytest.raises(ValueError, match="restrict_kernel: 'sparse' is not allowed; allowed values: auto, flex"):
        timm.create_model("mait_tiny_patch16_224", restrict_kernel="sparse", img_size=32, patch_size=8, depth=2)


@pytest.mark.e2e  # torch.compile probes the C++ compiler
def test_a_compiled_maits_flex_attention_stays_compiled_for_later_eager_calls(monkeypatch):
    """torch.compile of a restrict MaiT traces through FlexAttention (Dynamo takes an inner torch.compile as a
    no-op): the module's cached compiled FlexAttention is left alone, so a later eager call (an evaluation of a
    ``compile: true`` run) compiles and uses its own, never FlexAttention's unfused reference. Compiled
    FlexAttention is CUDA's path; on the CPU it compiles too, for inference, which this test uses by making
    ``_flex_compiles`` say yes. A batch of another size (the last, partial one) recompiles once, not per size."""
    from torch._dynamo.utils import counters
    from torch.nn.attention.flex_attention import flex_attention

    from locvit.models import mait

    monkeypatch.setattr(mait, "_flex_compiles", lambda device: True)
    monkeypatch.setattr(mait, "_COMPILED_FLEX", None)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = timm.create_model(
        "mait_tiny_patch16_224",
        img_size=32,
        patch_size=4,
        embed_dim=48,
        depth=2,
        num_heads=3,
        num_classes=10,
        masked_heads="all",
        mask_mode="restrict",
        mask_type="hard",
        restrict_kernel="flex",
    ).eval()
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))

    import torch.nn.attention.flex_attention as flex_module

    def eager_warnings(fn, *args, **kwargs) -> list[str]:
        # FlexAttention warns once per process (its _WARNINGS_SHOWN): forget an earlier test's warning
        monkeypatch.setattr(flex_module, "_WARNINGS_SHOWN", set())
        with warnings.catch_warnings(record=True) as seen, torch.no_grad():
            warnings.simplefilter("always")
            fn(*args, **kwargs)
        return [str(w.message) for w in seen if "without torch.compile" in str(w.message)]

    q = torch.randn(1, 1, 16, 8)
    assert eager_warnings(flex_attention, q, q, q)  # the raw function says so: what the test looks for
    with torch.no_grad():
        compiled_out = torch.compile(model)(x)
    assert mait._COMPILED_FLEX is None  # the compiled model neither wrote nor read it
    assert eager_warnings(model, x) == []  # the eager call compiled FlexAttention for itself
    assert mait._COMPILED_FLEX is not None and mait._COMPILED_FLEX is not flex_attention
    with torch.no_grad():
        torch.testing.assert_close(model(x), compiled_out, atol=1e-5, rtol=1e-4)
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        for batch in (3, 2, 5, 4):  # a partial batch, then others: one recompile (a symbolic batch) in all
            model(torch.randn(batch, 3, 32, 32))
    assert counters["stats"]["unique_graphs"] - graphs <= 1
