"""Every registered model, the way timm's own tests/test_models.py tests its registry.

The registry is read, not listed: every entrypoint a ``locvit.*`` module registers, the timm baselines
(:data:`locvit.models.baselines.BASELINES`) and the timm models a family claims (Swin, Twins), each at its
small build: an entrypoint's is in its default cfg (``Cfg.small``), a family's on its ``Family.small``. The
first test fails while one lacks its build. Then timm's checks: forward, backward, the default cfg
(heads, sizes, ``pool_size`` for the models whose features are a map, ViT-likes as timm's ``vit_*``),
``features_only``, ``forward_intermediates``, torch.fx, TorchScript, torch.export; what builds through the
pipeline at 32 px (:func:`locvit.models.create`, ``locvit validate``); and a study of unclaimed models and an
out-of-tree family end to end. A model TorchScript cannot run without harm is named in
:data:`NOT_SCRIPTABLE`, and exactly those must fail. Family-specific behaviour is in test_mait.py,
test_lsa.py, test_ibit.py and test_baselines.py.
"""

from __future__ import annotations

import csv
import fnmatch
import json
import math
import sys
from pathlib import Path

import pytest
import timm
import torch
from helpers import PLUGIN_VARIANTS, locvit_entrypoints, locvit_families
from timm.layers import get_channel_dim, get_spatial_dim
from timm.models import (
    create_feature_extractor,
    get_graph_node_names,
    get_notrace_functions,
    get_notrace_modules,
    get_pretrained_cfg,
)
from torchvision.models.feature_extraction import create_feature_extractor as tv_feature_extractor
from torchvision.models.feature_extraction import get_graph_node_names as tv_graph_node_names

from locvit import models
from locvit.config.models import check_model
from locvit.models.baselines import BASELINES, create_at_32
from locvit.models.family import Cfg, Family, family_claiming, family_of, small_build

pytestmark = [
    pytest.mark.usefixtures("cache_in_tmp"),
    # Scripting is what these tests check; PyTorch deprecates it in favour of torch.export (tested here too).
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:FutureWarning"),
    # torchvision's note that a train-mode trace has more nodes (dropout): each mode returns its last one.
    pytest.mark.filterwarnings("ignore:NOTE. The nodes obtained by tracing:UserWarning"),
]

# --- the registry and its small builds --------------------------------------------------------------------

ENTRYPOINTS = locvit_entrypoints()
#: timm's own models a family claims, at their family's build, that are no baseline: Swin and Twins.
CLAIMED = sorted({f.small.model for f in locvit_families().values() if f.small} - set(ENTRYPOINTS) - set(BASELINES))
MODELS = ENTRYPOINTS + CLAIMED  # timm's checks run over these
REGISTRY = sorted(set(MODELS) | set(BASELINES))  # forward and backward run over these


def small(name: str, **kwargs) -> tuple[torch.nn.Module, int]:
    """(model, input side): a locvit entrypoint or a claimed timm model at its small build, or a timm baseline
    at 32 x 32 (:func:`locvit.models.baselines.create_at_32`); the caller's keywords win."""
    torch.manual_seed(0)
    build = small_build(name)
    if build is None:
        return create_at_32(name, **kwargs), 32
    return build.build(**kwargs), build.size


def missing_builds(families: dict, entrypoints: list[str]) -> list[str]:
    """What the families and entrypoints lack of their small builds; empty when each declares one."""
    problems = [
        f"family {name!r} declares no small build: give its Family small=SmallBuild(...)"
        for name, family in sorted(families.items())
        if family.small is None
    ]
    for name in entrypoints:
        cfg = get_pretrained_cfg(name)
        if not (isinstance(cfg, Cfg) and cfg.small is not None):
            problems.append(f"entrypoint {name!r} declares no small build: give its default cfg Cfg(..., small=...)")
    for name, family in sorted(families.items()):
        claimed = family.small and family_claiming(family.small.model)
        if family.small and (claimed is None or claimed.name != name):
            problems.append(
                f"family {name!r}: its small build {family.small.model!r} is claimed by "
                f"{claimed.name if claimed else None!r}, not by it"
            )
    return problems


def test_every_family_and_entrypoint_declares_a_small_build():
    assert len(locvit_families()) >= 8 and len(ENTRYPOINTS) >= 16  # the registries are read
    assert set(CLAIMED) == {"swin_tiny_patch4_window7_224", "twins_svt_small"}
    problems = missing_builds(locvit_families(), ENTRYPOINTS)
    assert not problems, "\n".join(problems)


def test_the_guard_names_a_family_or_entrypoint_without_a_small_build():
    new = Family("hypo", "Hypo", torch.nn.Module, "windows", lambda m: [], lambda m: [], models=("hypo_",))
    assert missing_builds({**locvit_families(), "hypo": new}, [*ENTRYPOINTS, "resnet18"]) == [
        "family 'hypo' declares no small build: give its Family small=SmallBuild(...)",
        "entrypoint 'resnet18' declares no small build: give its default cfg Cfg(..., small=...)",
    ]


def test_a_family_is_one_file_in_the_models_folder():
    """Importing locvit.models imports every module in its folder, and every entrypoint is defined in one."""
    folder = Path(models.__file__).parent
    found = {f"locvit.models.{path.stem}" for path in folder.glob("*.py") if path.stem != "__init__"}
    assert len(found) >= 10 and found <= set(sys.modules)
    from timm.models._registry import _model_entrypoints

    assert {_model_entrypoints[name].__module__ for name in ENTRYPOINTS} <= found


# --- forward and backward -------------------------------------------------------------------------------------


def _input(size: int, batch: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(1))


def _assert_every_parameter_has_a_gradient(model: torch.nn.Module) -> None:
    missing = [n for n, p in model.named_parameters() if p.grad is None]
    assert not missing, f"no gradient for {missing}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("name", MODELS)
def test_forward_in_eval_mode_with_and_without_gradient_checkpointing(name):
    model, size = small(name)
    model.eval()
    x = _input(size)
    with torch.no_grad():
        out = model(x)
        assert out.shape == (1, model.num_classes) and not torch.isnan(out).any()
        # timm's Twins has the method but asserts that it is never enabled
        if hasattr(model, "set_grad_checkpointing") and not name.startswith("twins_"):
            model.set_grad_checkpointing()
            torch.testing.assert_close(model(x), out, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", REGISTRY)
def test_backward_reaches_every_parameter(name):
    model, size = small(name, num_classes=42)
    model.train()
    out = model(_input(size, batch=2))
    assert out.shape == (2, 42) and torch.isfinite(out).all()
    out.mean().backward()
    _assert_every_parameter_has_a_gradient(model)


# --- the default cfg, features ------------------------------------------------------------------------------


def _is_map(name: str) -> bool:
    """Its features are a spatial map (timm's standard models), not tokens (ViT-likes, as timm's ``vit_*``)."""
    build = small_build(name)
    with torch.device("meta"):  # shapes only
        return build.build().eval().forward_features(torch.empty(1, 3, build.size, build.size)).ndim == 4


@pytest.mark.parametrize("name", MODELS)
def test_default_config_heads_and_feature_sizes(name):
    """timm's checks of a model's config: feature and pre-logit widths, a removed head, the named layers."""
    model, size = small(name)
    model.eval()
    assert model.num_classes > 0 and model.num_features > 0 and model.head_hidden_size > 0
    cfg, state = model.pretrained_cfg, model.state_dict()
    x = _input(size)
    with torch.no_grad():
        features = model.forward_features(x)
        pre_logits = model.forward_head(features, pre_logits=True)
        channels = -1 if features.ndim == 3 else get_channel_dim(getattr(model, "output_fmt", "NCHW"))  # Swin: NHWC
        assert features.shape[channels] == model.num_features
        assert pre_logits.shape == (1, model.head_hidden_size)
        model.reset_classifier(0)
        assert model.num_classes == 0 and model(x).shape == pre_logits.shape
        headless, _ = small(name, num_classes=0)
        assert headless.eval()(x).shape == (1, model.num_features)
    for layer in (cfg["classifier"], cfg["first_conv"]):
        assert f"{layer}.weight" in state, f"{layer} (the config's) is not a layer of {name}"


#: The entrypoints whose default cfg declares a pool size: their features are a map (the test below checks it).
MAPS = [name for name in ENTRYPOINTS if get_pretrained_cfg(name).pool_size is not None]


@pytest.mark.parametrize("name", ENTRYPOINTS)
def test_a_pool_size_is_declared_exactly_where_the_features_are_a_map(name):
    """timm's ViT-likes (``vit_*``, and here MaiT, IBiT, LSA, LocalViT, PVT v1: tokens) declare none."""
    assert _is_map(name) == (name in MAPS), f"{name}: pool_size {get_pretrained_cfg(name).pool_size}"


@pytest.mark.parametrize("name", MAPS)
def test_a_map_models_pool_size_is_its_features_at_its_input_size(name):
    """timm's test_model_default_cfgs: at the cfg's input size (on the meta device: shapes only) the features,
    and the output without head and pooling, are ``pool_size``."""
    cfg = get_pretrained_cfg(name)
    with torch.device("meta"):
        model = timm.create_model(name).eval()
        x = torch.empty(1, *cfg.input_size)
        fmt = getattr(model, "output_fmt", "NCHW")
        spatial = get_spatial_dim(fmt)
        features = model.forward_features(x)
        assert tuple(features.shape[i] for i in spatial) == tuple(cfg.pool_size), f"{name}: pool_size {cfg.pool_size}"
        assert features.shape[get_channel_dim(fmt)] == model.num_features
        model.reset_classifier(0, "")
        unpooled = model(x)
        assert unpooled.ndim == 4 and tuple(unpooled.shape[i] for i in spatial) == tuple(cfg.pool_size)
        headless = timm.create_model(name, num_classes=0, global_pool="")
        assert tuple(headless(x).shape[i] for i in spatial) == tuple(cfg.pool_size)


@pytest.mark.parametrize("name", ENTRYPOINTS)
def test_features_only_gives_the_levels_its_feature_info_declares(name):
    """timm's test_model_forward_features (a map model, its default levels) and, for the ViT-likes,
    test_model_forward_intermediates_features (through ``forward_intermediates``, every level of the small
    build): at least 3 levels, each of its declared channels and at most its declared size."""
    build = small_build(name)
    with torch.device("meta"):
        declared = len(build.build().feature_info)
    levels = dict(feature_cls="getter", out_indices=tuple(range(declared)))
    model = timm.create_model(name, features_only=True, **({} if name in MAPS else levels), **build.kwargs).eval()
    channels, reductions = model.feature_info.channels(), model.feature_info.reduction()
    assert len(channels) >= 3
    with torch.no_grad():
        outputs = model(_input(build.size))
    assert len(outputs) == len(channels)
    for c, r, out in zip(channels, reductions, outputs):
        assert out.shape[1] == c and max(out.shape[2:]) <= math.ceil(build.size / r) + 1
        assert not torch.isnan(out).any()


@pytest.mark.parametrize("name", MODELS)
def test_forward_intermediates_end_in_the_features(name):
    model, size = small(name)
    model.eval()
    x = _input(size)
    with torch.no_grad():
        final, intermediates = model.forward_intermediates(x)
        torch.testing.assert_close(final, model.forward_features(x))
    assert len(intermediates) == len(model.feature_info)
    for info, inter in zip(model.feature_info, intermediates):
        assert inter.ndim == 4 and inter.shape[:2] == (1, info["num_chs"]) and not torch.isnan(inter).any()


# --- torch.fx -------------------------------------------------------------------------------------------------

TRACER = dict(leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions())


def _fx(model: torch.nn.Module) -> torch.nn.Module:
    """The model traced by torch.fx through timm's leaves, returning its output (in the mode it is in)."""
    train_nodes, eval_nodes = tv_graph_node_names(model, tracer_kwargs=TRACER)
    return tv_feature_extractor(
        model, train_return_nodes=train_nodes[-1:], eval_return_nodes=eval_nodes[-1:], tracer_kwargs=TRACER
    )


@pytest.mark.parametrize("name", MODELS)
def test_fx_forward_equals_eager(name):
    model, size = small(name)
    model.eval()
    x = _input(size)
    with torch.inference_mode():
        eager = model(x)
        traced = _fx(model)(x)
    (out,) = traced.values()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("name", MODELS)
def test_fx_backward_reaches_every_parameter(name):
    model, size = small(name, num_classes=42)
    model.train()
    traced = _fx(model)
    (out,) = traced(_input(size, batch=2)).values()
    assert out.shape == (2, 42) and not torch.isnan(out).any()
    out.mean().backward()
    _assert_every_parameter_has_a_gradient(traced)


def _family_builds() -> dict:
    """Every family's small build with attention blocks, and MaiT's other mask kinds."""
    builds = {name: f.small for name, f in locvit_families().items() if f.small.kinds}
    mait = builds["mait"]
    return {
        **builds,
        "mait_restrict": mait.but(masked_heads="sch1", mask_type="hard", mask_mode="restrict"),
        "mait_soft": mait.but(masked_heads=[1, 2], mask_type="soft"),
        "mait_random": mait.but(masked_heads="sch1", mask_type="random"),
    }


TRACED = _family_builds()


@pytest.mark.parametrize("family", TRACED)
def test_timm_feature_extraction_traces_every_family_to_the_eager_outputs(family):
    build = TRACED[family]
    torch.manual_seed(0)
    model = build.build(num_classes=5).eval()
    x = torch.randn(2, 3, build.size, build.size, generator=torch.Generator().manual_seed(1))
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


# --- TorchScript, torch.export, and the exceptions -------------------------------------------------------------

# The options whose forward takes a path no entrypoint's default takes: (timm name, keyword arguments).
VARIANTS = {
    **{name: (name, {}) for name in MODELS},
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


def _not_scriptable(variant: str) -> str | None:
    return next((why for pattern, why in NOT_SCRIPTABLE.items() if fnmatch.fnmatch(variant, pattern)), None)


def test_the_variants_cover_every_model_and_the_exceptions_name_variants():
    assert len(MODELS) >= 16 and set(MODELS) <= set(VARIANTS)
    assert all(any(fnmatch.fnmatch(v, pattern) for v in VARIANTS) for pattern in NOT_SCRIPTABLE)


def _scripted(variant: str, prepare):
    """``prepare(model)`` scripted, with the eager model and input; None for a named exception, after
    checking that its scripted forward raises naming FlexAttention."""
    name, kwargs = VARIANTS[variant]
    with timm.set_scriptable(True):  # as timm builds a model it scripts
        model, size = small(name, **kwargs)
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


# The exceptions, and a model of each family locvit registers entrypoints for (its family's build):
# torch.export is the supported path for all of them.
EXPORTED = sorted(
    {v for v in VARIANTS if _not_scriptable(v)}
    | {f.small.model for f in locvit_families().values() if f.small.model in ENTRYPOINTS}
)


@pytest.mark.parametrize("variant", EXPORTED)
def test_torch_export_runs_each_family_and_what_torchscript_cannot(variant):
    name, kwargs = VARIANTS[variant]
    model, size = small(name, **kwargs)
    model.eval()
    x = _input(size)
    with torch.no_grad():  # for inference, as a scripted model is (FlexAttention has no backward on the CPU)
        exported = torch.export.export(model, (x,))
        torch.testing.assert_close(exported.module()(x), model(x))


# --- any timm model through the pipeline -------------------------------------------------------------------

#: timm module -> (an entrypoint of it, the keywords that make it right at 32 px). Swin and Twins need
#: windows that divide every stage's grid (docs/models.md); the others build with none.
AT_32 = {
    "resnet": ("resnet18", {}),
    "regnet": ("regnetx_002", {}),
    "convnext": ("convnext_atto", {}),
    "efficientnet": ("efficientnet_b0", {}),
    "swin_transformer": ("swin_tiny_patch4_window7_224", dict(window_size=4)),
    "twins": ("twins_svt_small", dict(patch_size=2, wss=[4, 4, 2, 2])),
    "pvt_v2": ("pvt_v2_b0", {}),
    "vision_transformer": ("vit_tiny_patch16_224", dict(patch_size=4)),
}


@pytest.mark.parametrize("module", AT_32)
def test_one_entrypoint_of_each_timm_module_builds_at_32_px_through_the_pipeline(module):
    name, kwargs = AT_32[module]
    assert name in timm.list_models(module=module)
    assert check_model("v", {"model": name, "kwargs": kwargs}, 32, 10) == []  # locvit validate's build check
    torch.manual_seed(0)
    model = models.create({"model": name, "model_kwargs": dict(kwargs, img_size=32, num_classes=10)}).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_img_size_goes_only_to_models_that_take_it():
    vit = models.create(
        {"model": "vit_tiny_patch16_224", "model_kwargs": dict(img_size=32, patch_size=4, num_classes=10)}
    )
    assert tuple(vit.patch_embed.grid_size) == (8, 8)  # taken: the grid is the 32-px image's
    with torch.device("meta"):
        cnn = models.create({"model": "resnet18", "model_kwargs": dict(img_size=32, num_classes=7)})
    assert cnn.fc.out_features == 7  # num_classes always goes
    with pytest.raises(TypeError, match="unexpected keyword argument 'no_such_option'"):  # other errors stay
        models.create({"model": "resnet18", "model_kwargs": dict(img_size=32, no_such_option=1)})


def test_windows_that_do_not_divide_a_stage_are_refused_by_name():
    """Swin's ImageNet window (7) does not divide the 8 x 8 grid of 32 px in 4-px patches; Twins' windows must
    divide each stage's grid too. timm would pad them; locvit validate names the stage and the fix."""
    swin = check_model("s", {"model": "swin_tiny_patch4_window7_224", "kwargs": {}}, 32, 10)
    assert swin == [
        "variants.s.kwargs: swin_tiny_patch4_window7_224 at img_size=32: stage 0: window 7x7 does not "
        "divide its 8x8 grid; choose kwargs.window_size dividing the first stage's grid (8x8), e.g. 4"
    ]
    twins = check_model("t", {"model": "twins_svt_small", "kwargs": {"wss": [4, 4, 2, 2]}}, 32, 10)
    assert len(twins) == 1 and "stage 3: window 2x2 does not divide its 1x1 grid" in twins[0]
    assert "kwargs.patch_size" in twins[0]


def test_a_pvt_reduction_larger_than_its_stages_grid_is_refused_by_name():
    """PVT v1 pools a stage's keys with an R x R stride-R conv: a grid smaller than R fails at the first forward
    pass, one not a multiple of R loses its last rows and columns; validate names the stage instead."""
    fine = check_model("p", {"model": "pvt_v1_tiny", "kwargs": {}}, 32, 10)  # grids 8, 4, 2, 1 and R 8, 4, 2, 1
    assert fine == []
    small_grid = check_model("p", {"model": "pvt_v1_tiny", "kwargs": {"sr_ratios": [8, 8, 2, 1]}}, 32, 10)
    assert small_grid == [
        "variants.p.kwargs: pvt_v1_tiny at img_size=32: stage 2: its 4x4 grid is smaller than its key "
        "reduction 8 (sr_ratios[1]); choose kwargs.sr_ratios dividing each stage's grid, or a larger "
        "image or smaller patch_size"
    ]
    uneven = check_model("p", {"model": "pvt_v1_tiny", "kwargs": {"sr_ratios": [3, 4, 2, 1]}}, 32, 10)
    assert len(uneven) == 1 and "stage 1: its 8x8 grid is not a multiple of its key reduction 3" in uneven[0]
    model = models.create(
        {"model": "pvt_v1_tiny", "model_kwargs": {"img_size": 32, "num_classes": 10, "sr_ratios": [8, 8, 2, 1]}}
    )
    with pytest.raises(RuntimeError):  # what the check saves a study from: the first batch fails
        model(torch.zeros(1, 3, 32, 32))


# --- end to end: unclaimed models and a family declared outside src/ ------------------------------------------

STUDY = PLUGIN_VARIANTS  # conftest's plugin_study: every one trained, analysed and reported
NO_ATTENTION = {"resnet", "wrn"}


@pytest.mark.e2e
def test_unclaimed_models_and_a_new_map_kind_are_profiled_and_analysed(plugin_study):
    layout, _ = plugin_study
    profiles = {v: json.loads(layout.profile_file(v).read_text()) for v in STUDY}
    assert {v: p["arch"]["family"] for v, p in profiles.items()} == {
        "deit_a": "deit",
        "resnet": "resnet",
        "swin": "swin",
        "linear": "linear",
        "wrn": "wrn",
        "pvt": "pvt_v1",
        "toy": "toy",
    }
    assert all(p["params"] > 0 and p["gmacs"] > 0 for p in profiles.values())
    analyses = {v: json.loads(layout.analysis_file(v, 0).read_text()) for v in STUDY}
    for v in NO_ATTENTION:
        assert analyses[v]["layers"] == [] and analyses[v]["als_mean"] is None and analyses[v]["mad"] == []
        assert analyses[v]["unread_attention"] == []
    assert [layer["kind"] for layer in analyses["pvt"]["layers"]] == ["pooled_keys"] * 3 + ["softmax"]
    assert all(heads is not None for heads in analyses["pvt"]["mad"][:3])  # the distance to pooled keys
    assert [layer["kind"] for layer in analyses["swin"]["layers"]] == ["block"] * 4
    assert [layer["kind"] for layer in analyses["linear"]["layers"]] == ["linear", "linear"]
    for v in ("deit_a", "swin", "linear"):
        assert 0 < analyses[v]["als_mean"] <= 1 and analyses[v]["mad_mean"] > 0
    assert {r["variant"] for r in csv.DictReader(layout.throughput_file.open())} == set(STUDY)


@pytest.mark.e2e
def test_every_table_and_figure_lists_them_and_says_where_there_is_no_attention(plugin_study):
    layout, _ = plugin_study
    report = layout.report
    rows = {r["variant"]: r for r in csv.DictReader((report / "results.csv").open())}
    assert set(rows) == set(STUDY) and all(float(r["test_top1_mean"]) >= 0 for r in rows.values())
    locality = {r["Variant"]: r for r in csv.DictReader((report / "tables" / "locality.csv").open())}
    assert set(locality) == set(STUDY)
    assert locality["resnet"]["Family"] == "ResNet" and locality["wrn"]["Family"] == "WRN"
    for v in NO_ATTENTION:
        assert locality[v]["ALS (3x3)"] == locality[v]["Mean attention distance (px)"] == "no attention layers"
    assert locality["swin"]["Family"] == "Swin" and locality["linear"]["Family"] == "LinearViT"
    record = json.loads((report / "report.json").read_text())
    caption = record["figures"]["attention_distance"]["caption"]
    assert "No attention layers: resnet, wrn." in caption and "No analysis" not in caption
    for v in NO_ATTENTION:
        assert record["skipped"][f"attention_{v}"] == f"{v}: no attention layers"
    per_variant = {fig["variant"] for fig in record["figures"].values()}
    assert {"deit_a", "swin", "linear", "pvt"} <= per_variant and not NO_ATTENTION & per_variant
    assert {"als_swin", "als_linear", "rollout_linear"} <= set(record["figures"])
    for name, table in record["tables"].items():  # every table that lists the study's variants lists them all
        text = (report / table["md"]).read_text()
        if "deit_a" in text:
            assert all(v in text for v in STUDY), f"{name} lists deit_a but not all of {sorted(STUDY)}"
    metrics = {v: json.loads((report / "metrics" / f"{v}.json").read_text()) for v in STUDY}
    assert all("als_mean" not in metrics[v] and metrics[v]["params_m"] > 0 for v in NO_ATTENTION)
