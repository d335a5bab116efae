"""The papers' baselines: timm's at 32 x 32 (each entry of CIFAR_32 has its documented size and grid; the
NesT paper's CIFAR NesT-T) and those timm lacks (PVT v1, CIFAR WRN, PyramidNet, LocalViT): their sizes against
the papers' on the meta device, PVT's spatial-reduction maps against the layer's output, LocalViT's
feed-forward on the patch grid. test_models.py trains every one of them a step."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.models.nest import Nest

import locvit.models  # noqa: F401  registers them
from locvit.analysis.attention import collect_attention
from locvit.errors import InputError
from locvit.models.baselines import BASELINES, CIFAR_32, NEST_TINY_CIFAR, create_at_32
from locvit.models.family import family_of
from locvit.models.pvt import CIFAR

# Millions of parameters with num_classes=10, as baselines.py documents them.
PARAMS_M = {
    "deit_tiny_patch16_224": 5.36,
    "deit_small_patch16_224": 21.34,
    "cait_xxs24_224": 11.60,
    "convit_tiny": 5.36,
    "nest_tiny": 16.32,
}


def _trains(model: torch.nn.Module) -> None:
    out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    out.sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_every_baseline_is_a_timm_model_with_a_32px_setting():
    assert set(CIFAR_32) == set(BASELINES) == set(PARAMS_M)
    assert all(timm.is_model(name) for name in BASELINES)


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_has_its_documented_size_and_grid_at_32px(name):
    with torch.device("meta"):  # shapes only: test_models.py trains each a step
        model = create_at_32(name, num_classes=10)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == PARAMS_M[name]
    if name != "nest_tiny":
        assert tuple(model.patch_embed.grid_size) == (8, 8)  # the grid our masked models use


def test_the_callers_keywords_win():
    assert tuple(create_at_32("deit_tiny_patch16_224", patch_size=8).patch_embed.grid_size) == (4, 4)
    with pytest.raises(ValueError, match="no 32 x 32 setting"):
        create_at_32("resnet18")


def test_nest_tiny_cifar_is_the_nest_papers_model():
    torch.manual_seed(0)
    model = Nest(num_classes=10, **NEST_TINY_CIFAR)
    assert model.num_blocks == [64, 16, 4, 1] and model.block_size == 4 and model.seq_length == 16
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == 6.60
    _trains(model)
    registered = timm.create_model("nest_tiny_cifar")  # the same model by name, as params.yaml uses it
    assert registered.num_blocks == model.num_blocks and registered.num_classes == 10
    assert sum(p.numel() for p in registered.parameters()) == sum(p.numel() for p in model.parameters())


# --- the baselines timm lacks ------------------------------------------------------------------------------

# (timm name, keyword arguments, the paper's millions of parameters, where the paper says so)
PAPER_SIZES = [
    ("wrn_28_10", dict(num_classes=10), 36.5, "LSA Table 3, WRN28-10"),
    ("pyramidnet164_a48", dict(num_classes=10), 1.7, "LSA Table 3, Pyramid-164-48"),
    ("pvt_v1_tiny", {}, 13.2, "MaiT Table 4 / LSA Table 4, PVT-T"),
    ("pvt_v1_small", {}, 24.5, "MaiT Table 4 / LSA Table 4, PVT-S"),
    ("pvt_v1_medium", {}, 44.2, "MaiT Table 4, PVT-M"),
    ("pvt_v1_large", {}, 61.4, "the PVT paper's PVT-L"),
    ("localvit_tiny_patch16_224", {}, 5.9, "MaiT Table 4, LocalViT-T"),
    ("localvit_small_patch16_224", {}, 22.4, "MaiT Table 4, LocalViT-S"),
    # LSA Table 3's CIFAR PVTs at the study's 32 px with 10 classes (docs/models.md, pvt.py: the CIFAR setting)
    ("pvt_v1_tiny", dict(img_size=32, num_classes=10, **CIFAR), 12.8, "LSA Table 3, PVT-T"),
    ("pvt_v1_small", dict(img_size=32, num_classes=10, **CIFAR), 24.1, "LSA Table 3, PVT-S"),
    ("pvt_v1_large", dict(img_size=32, num_classes=10, **CIFAR), 60.9, "LSA Table 3, PVT-B"),
]


def _params_m(name: str, **kwargs) -> float:
    with torch.device("meta"):
        model = timm.create_model(name, **kwargs)
    return sum(p.numel() for p in model.parameters()) / 1e6


@pytest.mark.parametrize("name, kwargs, paper, where", PAPER_SIZES, ids=[f"{r[0]}-{r[3]}" for r in PAPER_SIZES])
def test_params_are_within_3_percent_of_the_papers(name, kwargs, paper, where):
    ours = _params_m(name, **kwargs)
    assert abs(ours / paper - 1) <= 0.03, f"{name} {kwargs}: {ours:.2f}M, {where}: {paper}M"


def test_the_cifar_pvt_needs_pixel_tokens_to_match_lsa_table_3():
    """pvt.py's choice: with 8 x 8 patches the CIFAR PVT-T is more than 3 % below LSA's 12.8M."""
    assert _params_m("pvt_v1_tiny", img_size=32, num_classes=10, patch_size=4) / 12.8 < 0.97


def test_the_small_wrn_is_the_same_builder():
    assert round(_params_m("wrn_16_2", num_classes=10), 2) == 0.69
    with pytest.raises(InputError, match="depth: 27"):
        timm.create_model("wrn_28_10", depth=27)
    with pytest.raises(InputError, match="depth: 100"):
        timm.create_model("pyramidnet164_a48", depth=100)


def test_pvt_reads_the_weights_its_attention_applies():
    """Each layer's map, applied to its values, gives the layer's own output: pooled keys in stages 1-3."""
    torch.manual_seed(0)
    model = timm.create_model("pvt_v1_tiny", img_size=32, num_classes=10, **CIFAR).eval()
    x = torch.randn(2, 3, 32, 32)
    seen = {}

    def keep(name):
        def hook(module, args, output):
            seen[name] = (args, output)

        return hook

    handles = [
        b.attn.register_forward_hook(keep(f"stages.{i}.blocks.{j}.attn"))
        for i, s in enumerate(model.stages)
        for j, b in enumerate(s.blocks)
    ]
    logits, maps = collect_attention(model, x)
    for h in handles:
        h.remove()
    torch.testing.assert_close(logits, model(x))
    assert [m.kind for m in maps] == ["pooled_keys"] * 6 + ["softmax"] * 2
    assert [tuple(m.probs.shape) for m in maps[::2]] == [
        (2, 1, 1024, 16),
        (2, 2, 256, 16),
        (2, 5, 64, 16),
        (2, 8, 17, 17),
    ]  # keys: 32/8, 16/4, 8/2 -> a 4 x 4 grid
    assert maps[-1].num_prefix == 1 and maps[0].num_prefix == 0 and maps[0].grid == (32, 32)
    for m in maps:
        (inp, feat_size), out = seen[m.name]
        attn = model.get_submodule(m.name)
        b, n, c = inp.shape
        source = (
            inp
            if attn.sr is None
            else attn.norm(attn.sr(inp.transpose(1, 2).reshape(b, c, *feat_size)).flatten(2).transpose(1, 2))
        )
        v = attn.kv(source).reshape(b, -1, 2, attn.num_heads, attn.head_dim)[:, :, 1].transpose(1, 2)
        mixed = (m.probs @ v).transpose(1, 2).reshape(b, n, c)  # (B, N, C)
        torch.testing.assert_close(attn.proj(mixed), out, rtol=1e-4, atol=1e-5)


def test_every_new_model_has_a_family():
    names = {
        "wrn_16_2": "wrn",
        "pyramidnet164_a48": "pyramidnet",
        "pvt_v1_tiny": "pvt_v1",
        "localvit_tiny_patch16_224": "localvit",
    }
    for name, family in names.items():
        with torch.device("meta"):
            assert family_of(timm.create_model(name)).name == family


def test_localvit_runs_its_feed_forward_on_the_patch_grid_and_leaves_the_class_token():
    """LocalViT's locality is a depth-wise conv over the grid: a patch's FFN output moves only with its 3 x 3
    neighbourhood (two 1x1 convs around one 3x3), and the class token passes the FFN unchanged."""
    torch.manual_seed(0)
    model = timm.create_model("localvit_tiny_patch16_224", img_size=32, patch_size=4, depth=1).eval()
    ffn = model.blocks[0].mlp
    x = torch.randn(1, 1 + 64, 192)
    y = x.clone()
    y[:, 1 + 0] += 1.0  # patch (0, 0)
    moved = (ffn(y) - ffn(x)).abs().sum(-1)[0, 1:].reshape(8, 8) > 1e-6
    assert moved[:2, :2].all() and moved.sum() == 4  # its 3 x 3 neighbourhood, clipped at the corner
    torch.testing.assert_close(ffn(x)[:, 0], x[:, 0])
    with pytest.raises(ValueError, match="init_values"):
        timm.create_model("localvit_tiny_patch16_224", init_values=1e-5)
