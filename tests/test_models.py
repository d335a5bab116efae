"""Every registered model, the way timm tests its registry: forward and backward on small inputs, and
torch.fx tracing through timm's feature-extraction helpers giving the eager outputs.

One parametrised test over the registry (locvit's families: mait_*, lsa_*, ibit_*, nest_tiny_cifar;
the baselines timm lacks: pvt_v1_*, wrn_*, pyramidnet*, localvit_*; and the timm baselines they are compared
with). Family-specific checks (sizes against the papers, masks, shifts) stay in test_mait.py,
test_lsa.py, test_ibit.py, test_baselines.py and test_paper_baselines.py.
"""

from __future__ import annotations

import pytest
import timm
import torch
from timm.models import create_feature_extractor, get_graph_node_names

import locvit.models  # noqa: F401  registers locvit's families
from locvit.models.baselines import BASELINES, create_at_32
from locvit.models.family import family_of

FAMILIES = ("mait_*", "lsa_*", "ibit_*", "pvt_v1_*", "wrn_*", "pyramidnet*", "localvit_*")
REGISTRY = sorted({n for pattern in FAMILIES for n in timm.list_models(pattern)} | {"nest_tiny_cifar"} | set(BASELINES))


pytestmark = pytest.mark.usefixtures("cache_in_tmp")


def small(name: str, **kwargs) -> tuple[torch.nn.Module, int]:
    """The entrypoint at a small size (its own architecture, fewer layers and pixels) and that size."""
    if name.startswith("lsa_"):
        size = 16 if name.endswith("cifar") else 112  # the ImageNet LSA's stem needs a larger input
        return timm.create_model(name, img_size=size, **kwargs), size
    if name in BASELINES:
        return create_at_32(name, **kwargs), 32
    if name == "nest_tiny_cifar":
        return timm.create_model(name, img_size=32, **kwargs), 32
    if name.startswith("swin_"):  # windows of 2 divide the 4 x 4 grid of 16 px in 4-px patches, then 2 x 2
        return timm.create_model(name, img_size=16, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=2,
                                 **kwargs), 16
    if name.startswith("twins_"):  # 16 px in 2-px patches: stages of 8, 4, 2 and windows of 4, 2, 2 dividing them
        return timm.create_model(name, img_size=16, patch_size=2, embed_dims=(16, 32, 32), depths=(2, 2, 2),
                                 num_heads=(1, 2, 2), mlp_ratios=(2, 2, 2), sr_ratios=(4, 2, 1), wss=(4, 2, 2),
                                 **kwargs), 16
    if name.startswith("pvt_v1_"):  # one block per stage; an 8 x 8 grid in stage 1, keys pooled to 1 x 1
        return timm.create_model(name, img_size=32, depths=(1, 1, 1, 1), **kwargs), 32
    if name.startswith("wrn_"):
        return timm.create_model(name, depth=10, widen_factor=1, **kwargs), 32
    if name.startswith("pyramidnet"):
        return timm.create_model(name, depth=11, alpha=12, **kwargs), 32
    return timm.create_model(name, img_size=32, patch_size=8, depth=3, **kwargs), 32


def test_the_registry_holds_every_family():
    assert all(timm.list_models(pattern) for pattern in FAMILIES) and len(REGISTRY) > 20


@pytest.mark.parametrize("name", REGISTRY)
def test_every_model_trains_on_a_small_input(name):
    torch.manual_seed(0)
    model, size = small(name, num_classes=7)
    out = model(torch.randn(2, 3, size, size))
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    out.logsumexp(dim=1).mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


# Every family and mask kind, small: (timm name, keyword arguments).
TRACED = {
    "deit": ("deit_tiny_patch16_224", {}),
    "mait_hard": ("mait_tiny_patch16_224", dict(masked_heads=[1, [0, 2], 0], mask_type="hard")),
    "mait_restrict": ("mait_tiny_patch16_224", dict(masked_heads="sch1", mask_type="hard", mask_mode="restrict")),
    "mait_soft": ("mait_tiny_patch16_224", dict(masked_heads=[1, 2, 0], mask_type="soft")),
    "mait_random": ("mait_tiny_patch16_224", dict(masked_heads="sch1", mask_type="random")),
    "mait_cait": ("mait_cait_xxs24_224", {}),
    "cait": ("cait_xxs24_224", {}),
    "ibit": ("ibit_tiny_patch16_224", dict(mask_fit_steps=200)),
    "convit": ("convit_tiny", {}),
    "lsa": ("lsa_tiny_cifar", dict(shifts="axes9")),
    "nest": ("nest_tiny_cifar", {}),
    "pvt_v1": ("pvt_v1_tiny", {}),
    "localvit": ("localvit_tiny_patch16_224", {}),
}


@pytest.mark.parametrize("family", TRACED)
def test_timm_feature_extraction_traces_every_family_to_the_eager_outputs(family):
    name, kwargs = TRACED[family]
    torch.manual_seed(0)
    model, size = small(name, num_classes=5, **kwargs)
    model.eval()
    x = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
    _, nodes = get_graph_node_names(model)
    first = family_of(model).blocks(model)[0]  # the first transformer block, as its family declares it
    block = next(name for name, module in model.named_modules() if module is first)
    inner = [n for n in nodes if n.startswith(block + ".")][-1]  # the block's output node
    extractor = create_feature_extractor(model, return_nodes={inner: "inner", nodes[-1]: "out"})
    seen = {}
    handle = first.register_forward_hook(lambda m, a, o: seen.setdefault("inner", o))
    with torch.no_grad():
        traced = extractor(x)
        eager = model(x)
    handle.remove()
    torch.testing.assert_close(traced["out"], eager)
    torch.testing.assert_close(traced["inner"], seen["inner"])
