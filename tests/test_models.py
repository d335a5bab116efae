"""Every registered model, the way timm tests its registry: forward and backward on small inputs, and
torch.fx tracing through timm's feature-extraction helpers giving the eager outputs.

The registry is read, not listed: every entrypoint locvit registers and the timm baselines they are compared
with (:data:`locvit.models.baselines.BASELINES`), and every family, at the small shapes of tests/helpers.py;
the first test fails while a registered family or entrypoint has no shape there. Family-specific checks
(sizes against the papers, masks, shifts) stay in test_mait.py, test_lsa.py, test_ibit.py and test_baselines.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers import ENTRYPOINT_SHAPES, FAMILY_SHAPES, locvit_entrypoints, locvit_families, missing_shapes, small
from timm.models import create_feature_extractor, get_graph_node_names

import locvit.models  # noqa: F401  registers locvit's families
from locvit.models.baselines import BASELINES
from locvit.models.family import Family, family_of

REGISTRY = sorted(set(ENTRYPOINT_SHAPES) | set(BASELINES))


pytestmark = pytest.mark.usefixtures("cache_in_tmp")


def test_every_registered_family_and_entrypoint_has_a_small_shape():
    assert len(locvit_families()) >= 8 and len(locvit_entrypoints()) >= 16  # the registries are read
    assert not missing_shapes(), "\n".join(missing_shapes())


def test_the_shape_guard_names_a_family_or_entrypoint_without_a_shape():
    """A family (or an entrypoint) registered without an entry in tests/helpers.py fails the test above."""
    new = Family("hypo", "Hypo", torch.nn.Module, "windows", lambda m: [], lambda m: [], models=("hypo_",))
    problems = missing_shapes({**locvit_families(), "hypo": new}, [*locvit_entrypoints(), "hypo_tiny_cifar"])
    assert problems == [
        "family 'hypo' has no small shape: add one entry to FAMILY_SHAPES in tests/helpers.py",
        "entrypoint 'hypo_tiny_cifar' has no small shape: add one entry to ENTRYPOINT_SHAPES in tests/helpers.py",
    ]
    gone = {name: f for name, f in locvit_families().items() if name != "nest"}
    assert missing_shapes(gone) == ["FAMILY_SHAPES['nest']: no such family is registered"]


@pytest.mark.parametrize("name", REGISTRY)
def test_every_model_trains_on_a_small_input(name):
    torch.manual_seed(0)
    model, size = small(name, num_classes=7)
    out = model(torch.randn(2, 3, size, size))
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    out.logsumexp(dim=1).mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


# Every family at its small shape, and MaiT's other mask kinds.
TRACED = {
    **{family: shape for family, shape in FAMILY_SHAPES.items() if shape.kinds},  # those with attention blocks
    "mait_restrict": FAMILY_SHAPES["mait"].but(masked_heads="sch1", mask_type="hard", mask_mode="restrict"),
    "mait_soft": FAMILY_SHAPES["mait"].but(masked_heads=[1, 2], mask_type="soft"),
    "mait_random": FAMILY_SHAPES["mait"].but(masked_heads="sch1", mask_type="random"),
}


@pytest.mark.parametrize("family", TRACED)
def test_timm_feature_extraction_traces_every_family_to_the_eager_outputs(family):
    shape = TRACED[family]
    torch.manual_seed(0)
    model = shape.build(num_classes=5).eval()
    x = torch.randn(2, 3, shape.size, shape.size, generator=torch.Generator().manual_seed(1))
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
