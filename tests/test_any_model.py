"""Any timm classification model that builds at the data's image size is a variant.

The pipeline's builder (:func:`locvit.models.create`) gives ``img_size`` only to the models that take it, and
``locvit validate``'s build check (:func:`locvit.config.models.check_model`) builds through it; one entrypoint of
each of these timm modules builds at 32 px and runs forward: resnet, regnet, convnext, efficientnet,
swin_transformer, twins, pvt_v2, vision_transformer. End to end, a tiny study with a ResNet, a Swin, a
WRN-16-2, a PVT v1 and a family declared outside src/ with a kind of map of its own (linear attention) beside
DeiT runs prepare -> report: every table and figure lists them, and "no attention layers" stands where that holds.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import timm
import torch
import yaml
from helpers import copy_workflow, snakemake

from locvit import models
from locvit.config.models import check_model
from locvit.layout import StudyLayout

PLUGINS = Path(__file__).parent / "plugins"

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


@pytest.mark.usefixtures("cache_in_tmp")
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


@pytest.mark.usefixtures("cache_in_tmp")
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


@pytest.mark.usefixtures("cache_in_tmp")
def test_a_pvt_reduction_larger_than_its_stages_grid_is_refused_by_name():
    """PVT v1 pools a stage's keys with an R x R stride-R conv: a grid smaller than R fails at the first forward
    pass, one not a multiple of R loses its last rows and columns; validate names the stage instead."""
    fine = check_model("p", {"model": "pvt_v1_tiny", "kwargs": {}}, 32, 10)  # grids 8, 4, 2, 1 and R 8, 4, 2, 1
    assert fine == []
    small = check_model("p", {"model": "pvt_v1_tiny", "kwargs": {"sr_ratios": [8, 8, 2, 1]}}, 32, 10)
    assert small == [
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


# --- end to end ---------------------------------------------------------------------------------------

SHAPE = {"patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2}
VARIANTS = {
    "deit_a": {"model": "deit_tiny_patch16_224", "kwargs": SHAPE},
    "resnet": {"model": "resnet18", "kwargs": {"layers": [1, 1, 1, 1], "channels": [8, 16, 32, 64], "stem_width": 8}},
    # 16 px in 4-px patches: a 4 x 4 grid, then 2 x 2; windows of 2 divide both.
    "swin": {
        "model": "swin_tiny_patch4_window7_224",
        "kwargs": {"embed_dim": 16, "depths": [2, 2], "num_heads": [1, 2], "window_size": 2},
    },
    "linear": {"model": "linear_vit", "kwargs": SHAPE},
    "wrn": {"model": "wrn_16_2", "kwargs": {}},  # WRN-16-2, locvit's CIFAR wide ResNet at its smallest size
    # PVT v1 in 2-px patches: stages of 8, 4, 2, 1 patches, keys pooled by 8, 4, 2 to one cell, then global
    "pvt": {
        "model": "pvt_v1_tiny",
        "kwargs": {"patch_size": 2, "embed_dims": [16, 32, 32, 32], "depths": [1, 1, 1, 1], "num_heads": [1, 2, 2, 2]},
    },
}
NO_ATTENTION = {"resnet", "wrn"}


@pytest.fixture(scope="module")
def any_study(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("anymodel"))
    shutil.copy(PLUGINS / "linear_family.py", work / "linear_family.py")
    params = yaml.safe_load((work / "presets" / "tiny.yaml").read_text())
    del params["mask_search"]
    params["train"]["epochs"] = 1
    params.update(study="any", seeds=[0], model_modules=["linear_family"], variants=VARIANTS)
    (work / "any.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    snakemake(work, "--cores", "2", "all", "--config", "params=any.yaml")
    return StudyLayout(work / "results" / "any"), params


@pytest.mark.e2e
def test_unclaimed_models_and_a_new_map_kind_are_profiled_and_analysed(any_study):
    layout, _ = any_study
    profiles = {v: json.loads(layout.profile_file(v).read_text()) for v in VARIANTS}
    assert {v: p["arch"]["family"] for v, p in profiles.items()} == {
        "deit_a": "deit",
        "resnet": "resnet",
        "swin": "swin",
        "linear": "linear",
        "wrn": "wrn",
        "pvt": "pvt_v1",
    }
    assert all(p["params"] > 0 and p["gmacs"] > 0 for p in profiles.values())
    analyses = {v: json.loads(layout.analysis_file(v, 0).read_text()) for v in VARIANTS}
    for v in NO_ATTENTION:
        assert analyses[v]["layers"] == [] and analyses[v]["als_mean"] is None and analyses[v]["mad"] == []
        assert analyses[v]["unread_attention"] == []
    assert [layer["kind"] for layer in analyses["pvt"]["layers"]] == ["pooled_keys"] * 3 + ["softmax"]
    assert all(heads is not None for heads in analyses["pvt"]["mad"][:3])  # the distance to pooled keys
    assert [layer["kind"] for layer in analyses["swin"]["layers"]] == ["block"] * 4
    assert [layer["kind"] for layer in analyses["linear"]["layers"]] == ["linear", "linear"]
    for v in ("deit_a", "swin", "linear"):
        assert 0 < analyses[v]["als_mean"] <= 1 and analyses[v]["mad_mean"] > 0
    assert {r["variant"] for r in csv.DictReader(layout.throughput_file.open())} == set(VARIANTS)


@pytest.mark.e2e
def test_every_table_and_figure_lists_them_and_says_where_there_is_no_attention(any_study):
    layout, _ = any_study
    report = layout.report
    rows = {r["variant"]: r for r in csv.DictReader((report / "results.csv").open())}
    assert set(rows) == set(VARIANTS) and all(float(r["test_top1_mean"]) >= 0 for r in rows.values())
    locality = {r["Variant"]: r for r in csv.DictReader((report / "tables" / "locality.csv").open())}
    assert set(locality) == set(VARIANTS)
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
            assert all(v in text for v in VARIANTS), f"{name} lists deit_a but not all of {sorted(VARIANTS)}"
    metrics = {v: json.loads((report / "metrics" / f"{v}.json").read_text()) for v in VARIANTS}
    assert all("als_mean" not in metrics[v] and metrics[v]["params_m"] > 0 for v in NO_ATTENTION)
