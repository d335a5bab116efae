"""A model family from outside locvit, end to end: the family protocol is all a new family needs.

A family with a kind of attention map locvit does not know (linear attention, ``tests/plugins/linear_family.py``:
rows sum to one, no softmax) declares the kind's properties and gets the analyses those properties call for;
it runs end to end beside unclaimed timm models in ``test_models.py``.

A toy family (``tests/plugins/toy_family.py``: a ViT whose every head attends only inside a 3 x 3
window of patches) is copied into the study's working directory, named in params.yaml's
``model_modules``, and run through prepare -> train -> evaluate -> analyse -> report by
Snakemake beside DeiT and the others (conftest's ``plugin_study``, shared with test_models).
Nothing under src/ names it; it must appear in every table and
figure that lists the study's variants, with analyses that its prior makes exact: all
attention inside the 3 x 3 neighbourhood (ALS 1) and no patch attended farther than one
diagonal step (mean attention distance at most sqrt(2) patches). It declares an extra of its
own (the window's side per layer and head), which the analysis writes and the report draws.
Its module is the study's code: a change to its forward re-runs training, and the old checkpoints
are refused (tests/test_user_code.py: the digests and the refusal without processes).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from helpers import PLUGINS, env_with_venv, snakemake

from locvit.analysis.analyse import covered, distances, locality, measures
from locvit.analysis.attention import collect_attention
from locvit.analysis.metrics import attention_rollout, rollout_applies
from locvit.layout import StudyLayout
from locvit.models import family as family_module
from locvit.models.family import (
    AttentionSite,
    Family,
    MapKind,
    map_kind,
    register_kind,
    summary,
    vit_blocks,
    vit_sites,
)


@pytest.fixture
def linear_family(monkeypatch):
    """tests/plugins/linear_family.py imported as a study's ``model_modules`` entry would be."""
    import sys

    from locvit.models import import_modules

    monkeypatch.chdir(PLUGINS)  # a study's own family beside its params: found in the working directory
    import_modules(["linear_family"])
    return sys.modules["linear_family"]


def test_a_family_with_a_kind_of_map_of_its_own_needs_no_edit_in_src(linear_family):
    """Linear attention's maps (rows sum to one, no softmax) are a kind locvit's families do not have. Declared
    with its properties, they get what those properties call for: ALS, distance, similarity and rollout."""
    kind = map_kind("linear")
    assert (kind.grid, kind.rows_sum_to_one, kind.keys, kind.windows) == (True, True, "tokens", False)
    model = timm.create_model(
        "linear_vit", img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3
    ).eval()
    images = torch.randn(2, 3, 16, 16)
    logits, maps = collect_attention(model, images)
    assert [m.kind for m in maps] == ["linear", "linear"] and maps[0].probs.shape == (2, 2, 17, 17)
    torch.testing.assert_close(maps[0].probs.sum(-1), torch.ones(2, 2, 17))
    assert maps[0].probs.min() > 0  # no softmax, yet a distribution over every token
    block = model.blocks[0]  # the map read is the one forward applies (computed there in linear time)
    x = model.norm_pre(model._pos_embed(model.patch_embed(images)))
    _, _, v = block.attn.features(block.norm1(x))
    expected = block.attn.proj((maps[0].probs @ v).transpose(1, 2).reshape(2, 17, 32))
    torch.testing.assert_close(block.attn(block.norm1(x)), expected, atol=1e-5, rtol=1e-4)
    als, layers, similarity = locality(maps, (3, 3), 2)
    assert layers == [0, 1] and all(0 < a < 1 for heads in als for a in heads) and similarity is not None
    assert all(0 < d < 16 for heads in distances(maps, 16, 2) for d in heads)
    assert rollout_applies(maps) and attention_rollout(maps).shape == (2, 4, 4)
    assert summary(model)["family"] == "linear"


@pytest.fixture
def grid_family(monkeypatch):
    """tests/plugins/grid_family.py (MaxViT's grid attention) imported as a study's ``model_modules`` entry."""
    import sys

    from locvit.models import import_modules

    monkeypatch.chdir(PLUGINS)
    import_modules(["grid_family"])
    return sys.modules["grid_family"]


def test_a_dilated_kind_is_measured_where_its_keys_lie(grid_family):
    """Grid attention on a 4 x 4 grid of 8-pixel patches, groups of 2 x 2 tokens 2 patches apart, attending
    uniformly (qkv zeroed). By hand: the 3 x 3 kernel around a query holds no other token of its group, so
    ALS = 1/4; its keys lie 0, 2, 2 and 2 sqrt(2) patches away, a mean of (1 + sqrt(2) / 2) x 8 px. Declared as
    contiguous windows, the same maps would score ALS 1 and a distance of 2 x 2 neighbours."""
    model = timm.create_model(
        "grid_vit", img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2, num_classes=3
    ).eval()
    attn = model.blocks[0].attn
    tokens = attn.partition(torch.arange(16.0).view(1, 16, 1))[..., 0]  # (K, 4): each group's token indices
    # the plugin's groups are where the kind says they are: group k's token (i, j) at (2 i + k // 2, 2 j + k % 2)
    assert tokens.tolist() == [[(2 * i + k // 2) * 4 + 2 * j + k % 2 for i in (0, 1) for j in (0, 1)] for k in range(4)]
    assert map_kind("grid").layout((2, 2), 4) == ((4, 4), 2)
    torch.nn.init.zeros_(attn.qkv.weight)
    torch.nn.init.zeros_(attn.qkv.bias)
    _, maps = collect_attention(model, torch.randn(2, 3, 32, 32))
    assert [m.kind for m in maps] == ["grid"] and maps[0].probs.shape == (2 * 4, 2, 4, 4)
    als, layers, _ = locality(maps, (3, 3), 2)
    assert layers == [0] and als == [pytest.approx([0.25, 0.25])]
    assert distances(maps, 32, 2) == [pytest.approx([(1 + math.sqrt(2) / 2) * 8] * 2)]
    assert covered(maps, (3, 3), 2) == [False]
    assert locality(maps, (5, 5), 2)[0] == [pytest.approx([1.0, 1.0])] and covered(maps, (5, 5), 2) == [True]
    record = measures(maps, (3, 3), 32, 2)
    assert record["als_mean"] == pytest.approx(0.25) and record["locality_layers"] == [0]
    assert record["not_run"] == {
        "cross_layer_similarity": "1 layer(s) with maps over the patch grid",
        "rollout": "no class token to follow",
    }


def test_a_site_whose_num_prefix_is_left_at_its_default_is_named(grid_family, monkeypatch):
    """A grid layer's input is the whole grid (16 tokens), its maps one group's 4: the default num_prefix (input
    tokens less the grid's) would be 12. Refused by name, not as a mismatch deep in the analyses."""
    family = family_module.family_named("grid")

    def sites(model):  # as the plugin's, num_prefix left out
        return [AttentionSite(b.attn, (2, 2), grid_family.read_grid) for b in model.blocks]

    monkeypatch.setitem(family_module._FAMILIES, "grid", dataclasses.replace(family, sites=sites))
    model = timm.create_model("grid_vit", img_size=32, patch_size=8, embed_dim=16, depth=1, num_heads=2)
    with pytest.raises(ValueError, match=r"blocks.0.attn: its grid maps have 4 keys, not num_prefix 12 \+ the 4 "):
        collect_attention(model, torch.randn(1, 3, 32, 32))
    with pytest.raises(ValueError, match="set the family's AttentionSite.num_prefix"):
        collect_attention(model, torch.randn(1, 3, 32, 32))


def test_a_kind_is_declared_once_and_an_undeclared_one_is_named(linear_family, monkeypatch):
    with pytest.raises(ValueError, match="map kind 'linear' is declared twice with different properties"):
        register_kind(MapKind("linear", grid=True, rows_sum_to_one=False))
    with pytest.raises(ValueError, match="keys 'nowhere' is not one of tokens, pooled, other"):
        MapKind("odd", grid=True, rows_sum_to_one=True, keys="nowhere")

    class Undeclared(linear_family.LinearViT):
        pass

    reader = {linear_family.LinearAttention: lambda attn, x: ("mystery", attn.maps(x))}
    monkeypatch.setitem(
        family_module._FAMILIES,
        "undeclared",
        Family("undeclared", "Undeclared", Undeclared, "none", vit_blocks, lambda m: vit_sites(m, reader)),
    )
    model = Undeclared(img_size=16, patch_size=4, embed_dim=32, depth=1, num_heads=2)
    with pytest.raises(ValueError, match="map kind 'mystery' is declared by no registered family"):
        collect_attention(model, torch.randn(1, 3, 16, 16))


@pytest.fixture
def toy_study(plugin_study):
    """conftest's plugin_study: the toy family (tests/plugins/toy_family.py) beside DeiT and the others."""
    return plugin_study


@pytest.mark.e2e
def test_the_toy_family_is_profiled_and_analysed_through_its_declaration(toy_study):
    layout, params = toy_study
    arch = json.loads(layout.profile_file("toy").read_text())["arch"]
    assert (arch["family"], arch["display"], arch["grid"]) == ("toy", "ToyWindow", [4, 4])
    assert arch["prior"] == "every head inside a 3x3 window of patches" and arch["depth"] == 2
    analysis = json.loads(layout.analysis_file("toy", 0).read_text())
    assert [layer["kind"] for layer in analysis["layers"]] == ["softmax", "softmax"]
    assert all(a == pytest.approx(1.0, abs=1e-5) for heads in analysis["als"] for a in heads)  # all inside 3 x 3
    spacing = 16 / 4  # pixels between patches: a 16-pixel image, a 4 x 4 grid
    assert all(0 < d <= math.sqrt(2) * spacing + 1e-6 for heads in analysis["mad"] for d in heads)
    assert analysis["window"] == [[3.0, 3.0], [3.0, 3.0]]  # its declared extra
    deit = json.loads(layout.analysis_file("deit_a", 0).read_text())
    assert deit["mad_mean"] > analysis["mad_mean"]  # global attention reaches farther than a 3 x 3 window


@pytest.mark.e2e
def test_the_toy_family_appears_in_every_table_and_figure(toy_study):
    layout, params = toy_study
    report = layout.report
    rows = {r["variant"]: r for r in csv.DictReader((report / "results.csv").open())}
    assert set(rows) == set(params["variants"]) and float(rows["toy"]["test_top1_mean"]) > 0
    locality = {r["Variant"]: r for r in csv.DictReader((report / "tables" / "locality.csv").open())}
    assert locality["toy"]["Family"] == "ToyWindow" and locality["toy"]["ALS (3x3)"].startswith("1.000")
    assert "toy" in json.loads((report / "summary.json").read_text())
    record = json.loads((report / "report.json").read_text())
    per_variant = {name for name, fig in record["figures"].items() if fig["variant"] == "toy"}
    assert {"als_toy", "similarity_toy", "rollout_toy", "window_toy"} <= per_variant  # window: its own extra
    assert record["figures"]["window_toy"]["caption"].startswith("The window's side in patches of toy per layer")
    study_figures = {name for name, fig in record["figures"].items() if fig["variant"] is None}
    assert {"curves", "attention_distance"} <= study_figures
    assert "No analysis" not in record["figures"]["attention_distance"]["caption"]
    for name, table in record["tables"].items():  # every table that lists the study's variants lists the toy
        text = (report / table["md"]).read_text()
        if "deit_a" in text:
            assert "toy" in text, f"{name} lists deit_a but not the toy family"


def dry_run(work: Path) -> tuple[dict[str, int], str]:
    """`snakemake -n all` of the plugin study: its job counts by rule (empty: nothing to do) and its output."""
    proc = snakemake(work, "-n", "all", "--config", "params=plugins.yaml")
    out = proc.stdout + proc.stderr
    if "Nothing to be done" in out:
        return {}, out
    table = out[out.index("Job stats:") :].splitlines()[3:]
    rows = dict(line.split() for line in table[: next(i for i, line in enumerate(table) if line.startswith("total"))])
    return {rule: int(n) for rule, n in rows.items() if rule != "all"}, out


@pytest.mark.e2e
def test_a_change_to_the_familys_forward_retrains_and_its_old_checkpoint_is_refused(toy_study, tmp_path):
    """The family's module is code of the study's (locvit.versioning.job_code), of the toy's jobs only: the
    finished study moved elsewhere plans nothing; a change to the toy's forward (a 5 x 5 window) plans the
    toy's training again, Snakemake naming the module in its reason, and what follows it; DeiT and the other
    variants, which do not run the toy's code, keep their runs. The old best.pt, evaluated by hand, is refused
    naming the module (locvit.checkpoint)."""
    layout, params = toy_study
    moved = shutil.copytree(layout.root.parents[1], tmp_path / "moved" / "plugins", symlinks=True)
    assert dry_run(moved)[0] == {}
    family = moved / "toy_family.py"
    family.write_text(family.read_text().replace(".amax(-1) <= 1", ".amax(-1) <= 2"))  # a 5 x 5 window
    jobs, out = dry_run(moved)
    assert jobs == {"train": 1, "evaluate": 1, "analyse": 1, "throughput": 1, "report": 1}, out[-3000:]
    reasons = re.findall(
        r"reason: Params have changed since last execution:.*before: '(\w+) toy_family=(\w+)' "
        r"now: '(\w+) toy_family=(\w+)'",
        out,
    )
    assert len(reasons) == 1, out[-3000:]  # the toy's training (what follows it re-runs for its new inputs)
    assert all(locvit_before == locvit_now and before != now for locvit_before, before, locvit_now, now in reasons)
    family.write_text(family.read_text().replace("<= 2", "<= 2  # a comment"))
    assert dry_run(moved)[0] == jobs  # a comment: the same plan

    moved_layout = StudyLayout(moved / "results" / "plugins")
    data = moved_layout.data_files()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "locvit",
            "evaluate",
            "--checkpoint",
            str(moved_layout.run_files("toy", 0).best),
            "--out",
            str(tmp_path / "eval.json"),
            "--data",
            str(data["test"]),
            "--manifest",
            str(data["manifest"]),
            "--tracking-db",
            str(tmp_path / "mlflow.db"),
            "--threads",
            "1",
        ],
        cwd=moved,
        env=env_with_venv(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode != 0 and not (tmp_path / "eval.json").exists()
    assert re.search(
        r"^locvit evaluate: error: checkpoint \S+best\.pt was trained with other model code: "
        r"toy_family changed since it was written.*allow_code_change=True\)\.$",
        proc.stderr,
        re.M,
    ), proc.stderr[-2000:]
