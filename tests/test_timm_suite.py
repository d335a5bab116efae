"""timm's model checks over locvit's families, the checks timm's own suite (its tests/test_models.py) runs
over its ViTs: forward, backward, the default config's heads and sizes, forward_intermediates, torch.fx
forward and backward, TorchScript, and torch.fx then TorchScript.

Every entrypoint locvit registers runs at its small shape (tests/helpers.py's ENTRYPOINT_SHAPES: its own
architecture, fewer layers and pixels), and so do the timm models locvit's swin and twins families claim
(CLAIMED_MODELS, at their family's shape); TorchScript also runs over the
options whose forward takes another path (:data:`VARIANTS`). A model TorchScript cannot run without
harm is named in :data:`NOT_SCRIPTABLE` with the reason; the TorchScript test asserts that exactly those
fail, so the list cannot go stale; torch.export, the supported path for them, runs them and a model of
each family.
"""

from __future__ import annotations

import fnmatch

import pytest
import timm
import torch
from helpers import CLAIMED_MODELS, ENTRYPOINT_SHAPES, FAMILY_SHAPES, small
from timm.models import get_notrace_functions, get_notrace_modules
from torchvision.models.feature_extraction import create_feature_extractor, get_graph_node_names

import locvit.models  # noqa: F401  registers locvit's families

pytestmark = [
    pytest.mark.usefixtures("cache_in_tmp"),
    # Scripting is what these tests check; PyTorch deprecates it in favour of torch.export (tested here too).
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning"),
    # torchvision's note that a train-mode trace has more nodes (dropout): each mode returns its last one.
    pytest.mark.filterwarnings("ignore:NOTE. The nodes obtained by tracing:UserWarning"),
]

ENTRYPOINTS = sorted(ENTRYPOINT_SHAPES) + sorted(CLAIMED_MODELS)  # and the Swin and Twins the families read

# The options whose forward takes a path no entrypoint's default takes: (timm name, keyword arguments).
VARIANTS = {
    **{name: (name, {}) for name in ENTRYPOINTS},
    "mait_unmasked": ("mait_tiny_patch16_224", dict(masked_heads="none")),
    "mait_head_indices": ("mait_tiny_patch16_224", dict(masked_heads=[1, [0, 2], 0], mask_type="hard")),
    "mait_random": ("mait_tiny_patch16_224", dict(masked_heads="sch1", mask_type="random")),
    "mait_restrict": ("mait_tiny_patch16_224", dict(masked_heads="sch1", mask_mode="restrict")),
    "mait_restrict_flex": (
        "mait_tiny_patch16_224",
        dict(masked_heads="sch1", mask_mode="restrict", restrict_kernel="flex"),
    ),
    "ibit_softmax_reference": (
        "ibit_tiny_patch16_224",
        dict(normalize="softmax", residual="reference", pos_embed="sincos"),
    ),
    "lsa_no_shift": ("lsa_tiny_cifar", dict(shifts="none")),
    "lsa_translate": ("lsa_tiny_cifar", dict(shift_mode="translate", pos_embed="shared")),
}

#: Variant patterns TorchScript cannot run, and why; torch.export runs them (test below).
NOT_SCRIPTABLE = {
    "mait_restrict_flex": "restrict_kernel 'flex' runs FlexAttention, which only eager PyTorch and "
    "torch.compile run; the scripted model raises rather than run dense in its place",
}

TRACER = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())


def _build(name: str, **kwargs) -> tuple[torch.nn.Module, int]:
    torch.manual_seed(0)
    with timm.set_scriptable(True):  # as timm builds a model it scripts
        return small(name, **kwargs)


def _input(size: int, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def _not_scriptable(variant: str) -> str | None:
    return next((why for pattern, why in NOT_SCRIPTABLE.items() if fnmatch.fnmatch(variant, pattern)), None)


def _fx(model: torch.nn.Module) -> torch.nn.Module:
    """The model traced by torch.fx through timm's leaves, returning its output (in the mode it is in)."""
    train_nodes, eval_nodes = get_graph_node_names(model, tracer_kwargs=TRACER)
    return create_feature_extractor(
        model, train_return_nodes=train_nodes[-1:], eval_return_nodes=eval_nodes[-1:], tracer_kwargs=TRACER
    )


def _assert_every_parameter_has_a_gradient(model: torch.nn.Module) -> None:
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_the_variants_cover_every_entrypoint_and_the_exceptions_name_variants():
    assert len(ENTRYPOINTS) >= 16 and set(ENTRYPOINTS) <= set(VARIANTS)
    assert all(any(fnmatch.fnmatch(v, pattern) for v in VARIANTS) for pattern in NOT_SCRIPTABLE)


# --- forward, backward, the default config --------------------------------------------------


@pytest.mark.parametrize("name", ENTRYPOINTS)
def test_forward_in_eval_mode_with_and_without_gradient_checkpointing(name):
    model, size = _build(name)
    model.eval()
    x = _input(size)
    with torch.no_grad():
        out = model(x)
        assert out.shape == (1, model.num_classes) and not torch.isnan(out).any()
        # timm's Twins has the method but asserts that it is never enabled
        if hasattr(model, "set_grad_checkpointing") and not name.startswith("twins_"):
            model.set_grad_checkpointing()
            torch.testing.assert_close(model(x), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ENTRYPOINTS)
def test_backward_reaches_every_parameter(name):
    model, size = _build(name, num_classes=42)
    model.train()
    out = model(_input(size, batch=2))
    assert out.shape == (2, 42) and not torch.isnan(out).any()
    out.mean().backward()
    _assert_every_parameter_has_a_gradient(model)


@pytest.mark.parametrize("name", ENTRYPOINTS)
def test_default_config_heads_and_feature_sizes(name):
    """timm's checks of a ViT's config: feature and pre-logit widths, a removed head, the named layers."""
    model, size = _build(name)
    model.eval()
    assert model.num_classes > 0 and model.num_features > 0 and model.head_hidden_size > 0
    cfg, state = model.pretrained_cfg, model.state_dict()
    x = _input(size)
    with torch.no_grad():
        features = model.forward_features(x)
        pre_logits = model.forward_head(features, pre_logits=True)
        channels = -1 if features.ndim == 3 or getattr(model, "output_fmt", "NCHW") == "NHWC" else 1  # Swin: NHWC
        assert features.shape[channels] == model.num_features
        assert pre_logits.shape == (1, model.head_hidden_size)
        model.reset_classifier(0)
        assert model.num_classes == 0 and model(x).shape == pre_logits.shape
        headless, _ = _build(name, num_classes=0)
        assert headless.eval()(x).shape == (1, model.num_features)
    for layer in (cfg["classifier"], cfg["first_conv"]):
        assert f"{layer}.weight" in state, f"{layer} (the config's) is not a layer of {name}"


@pytest.mark.parametrize("name", ENTRYPOINTS)
def test_forward_intermediates_end_in_the_features(name):
    model, size = _build(name)
    model.eval()
    x = _input(size)
    with torch.no_grad():
        final, intermediates = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x))
    assert len(intermediates) == len(model.feature_info)
    for info, inter in zip(model.feature_info, intermediates):
        assert inter.ndim == 4 and inter.shape[:2] == (1, info["num_chs"]) and not torch.isnan(inter).any()


# --- torch.fx ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ENTRYPOINTS)
def test_fx_forward_equals_eager(name):
    model, size = _build(name)
    model.eval()
    x = _input(size)
    with torch.inference_mode():
        eager = model(x)
        traced = _fx(model)(x)
    (out,) = traced.values()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("name", ENTRYPOINTS)
def test_fx_backward_reaches_every_parameter(name):
    model, size = _build(name, num_classes=42)
    model.train()
    traced = _fx(model)
    (out,) = traced(_input(size, batch=2)).values()
    assert out.shape == (2, 42) and not torch.isnan(out).any()
    out.mean().backward()
    _assert_every_parameter_has_a_gradient(traced)


# --- TorchScript, and the exceptions ------------------------------------------------------------


def _scripted(variant: str, prepare):
    """``prepare(model)`` scripted, with the eager model and input; None for a named exception, after
    checking that its scripted forward raises naming FlexAttention."""
    name, kwargs = VARIANTS[variant]
    model, size = _build(name, **kwargs)
    model.eval()
    x = _input(size)
    if _not_scriptable(variant):
        with pytest.raises((RuntimeError, torch.jit.Error), match="FlexAttention"):
            torch.jit.script(prepare(model))(x)
        return None
    return torch.jit.script(prepare(model)), model, x


@pytest.mark.parametrize("variant", VARIANTS)
def test_torchscript_runs_every_variant_but_the_named_exceptions(variant):
    if (got := _scripted(variant, lambda m: m)) is None:
        return
    scripted, model, x = got
    with torch.no_grad():
        torch.testing.assert_close(scripted(x), model(x))


@pytest.mark.parametrize("variant", VARIANTS)
def test_fx_then_torchscript_equals_eager(variant):
    if (got := _scripted(variant, _fx)) is None:
        return
    scripted, model, x = got
    with torch.inference_mode():
        (out,) = scripted(x).values()
        torch.testing.assert_close(out, model(x))


# The exceptions, and a model of each family locvit registers entrypoints for (the entrypoint its family's
# shape builds): torch.export is the supported path for all of them.
EXPORTED = sorted(
    {v for v in VARIANTS if _not_scriptable(v)}
    | {shape.model for shape in FAMILY_SHAPES.values() if shape.model in ENTRYPOINT_SHAPES}
)


@pytest.mark.parametrize("variant", EXPORTED)
def test_torch_export_runs_each_family_and_what_torchscript_cannot(variant):
    name, kwargs = VARIANTS[variant]
    model, size = _build(name, **kwargs)
    model.eval()
    x = _input(size)
    with torch.no_grad():  # for inference, as a scripted model is (FlexAttention has no backward on the CPU)
        exported = torch.export.export(model, (x,))
        torch.testing.assert_close(exported.module()(x), model(x))
