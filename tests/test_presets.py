"""Every preset's variants at their real shapes on the CPU, before a GPU hour is spent: each distinct model (its
name, keywords, the preset's image size and class count) built as a run builds it, two optimiser steps at batch 2
through locvit's own step (the preset's recipe: MixUp/CutMix, label smoothing, clipping) on synthetic images of
the preset's shape, then the attention analysis' forward. A model over :data:`FULL_DEPTH_GMACS` runs its forward
at full depth on the meta device (shapes, no compute) and its steps at a reduced depth: each stack of identical
blocks cut to its first two (:func:`shallow`; the real image size and token counts kept), and says so. A shape,
dtype or memory error shows here, not hours into a cluster's queue. A few minutes in all: the rest lane."""

from __future__ import annotations

import functools
import json
import math
import time
from pathlib import Path

import pytest
import torch

import locvit.models  # noqa: F401  (registers locvit's families)
from locvit import models
from locvit.analysis.attention import collect_attention
from locvit.config import load_params
from locvit.config.run import run_config
from locvit.data.augment import make_mixup
from locvit.train.engine import Compute, EpochStart, StepRecipe, train_one_epoch

REPO = Path(__file__).resolve().parents[1]
BATCH, STEPS = 2, 2
# Forward GMACs of one image above which the steps run at a reduced depth: every ImageNet-size model, and the
# largest CIFAR ones (2 cores step DeiT-S at 224 px in seconds, the 60-GMAC LSA-B in minutes).
FULL_DEPTH_GMACS = 1.0


def shallow(model: torch.nn.Module) -> int:
    """Cut every stack of blocks (a Sequential or ModuleList of 3 or more whose members after the first have the
    same parameter shapes) to its first two members, in place: each stage keeps its first block (which may change
    the width) and one of its repeated ones (Swin's shifted window, the second of a pair). The blocks cut."""

    def shapes(m):
        return [tuple(p.shape) for p in m.parameters()]

    cut = 0
    for module in list(model.modules()):
        for name, child in list(module._modules.items()):
            if (
                isinstance(child, (torch.nn.Sequential, torch.nn.ModuleList))
                and len(child) > 2
                and len({type(c) for c in child}) == 1
                and all(shapes(c) == shapes(child[1]) for c in child[2:])
                and shapes(child[1])
            ):
                cut += len(child) - 2
                kept = list(child)[:2]
                module._modules[name] = (
                    torch.nn.ModuleList(kept) if isinstance(child, torch.nn.ModuleList) else torch.nn.Sequential(*kept)
                )
    return cut


@functools.cache
def _shapes() -> dict[str, tuple[dict, list[str]]]:
    """One run config per distinct (model, keywords, image size, classes) over every preset, and the
    preset:variant pairs that share it."""
    found: dict[str, tuple[dict, list[str]]] = {}
    for path in sorted((REPO / "presets").glob("*.yaml")):
        params = load_params(path, check_models=False)
        for variant in params["variants"]:
            cfg = run_config(params, variant, params["seeds"][0])
            key = json.dumps([cfg["model"], cfg["model_kwargs"]], sort_keys=True)
            found.setdefault(key, (cfg, []))[1].append(f"{path.stem}:{variant}")
    return found


SHAPES = list(_shapes())


@pytest.mark.e2e  # not a process: minutes of CPU, so the rest lane
@pytest.mark.parametrize("key", SHAPES, ids=[_shapes()[k][1][0] for k in SHAPES])
def test_a_presets_model_steps_at_its_real_shapes_and_is_analysed(key):
    cfg, used_by = _shapes()[key]
    recipe, size = cfg["train"], cfg["model_kwargs"]["img_size"]
    classes = cfg["model_kwargs"]["num_classes"]
    from locvit.analysis.profile import gmacs

    with torch.device("meta"):
        full = models.create(cfg)
        forward_gmacs = gmacs(full, size)
        reduced = forward_gmacs > FULL_DEPTH_GMACS
        if reduced:  # every block's shapes at full depth, on the meta device
            assert full(torch.empty(BATCH, 3, size, size)).shape == (BATCH, classes), used_by
    torch.manual_seed(0)
    start = time.perf_counter()
    model = models.create(cfg)
    cut = shallow(model) if reduced else 0
    mean, std = models.normalisation(model)
    compute = Compute()  # the CPU's: float32, no channels_last (a GPU run's bf16 is the GPU visit's)
    images = torch.randint(0, 256, (BATCH, 3, size, size), dtype=torch.uint8)
    x, y = compute.inputs(images, mean, std), torch.arange(BATCH) % classes
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe["lr"], weight_decay=recipe["weight_decay"])
    mixup = make_mixup(recipe, classes, seed=0)
    for step in range(STEPS):
        stats = train_one_epoch(
            model,
            [(x, y)],
            optimizer,
            lambda _: recipe["lr"],
            start=EpochStart(step=step),
            recipe=StepRecipe(recipe["label_smoothing"], recipe["clip_grad"]),
            compute=compute,
            mixup=mixup,
        )
        assert stats["bad_steps"] == 0 and math.isfinite(stats["train_loss"]), (used_by, stats)
    model.eval()
    with torch.no_grad():
        logits, maps = collect_attention(model, x)
    assert logits.shape == (BATCH, classes), used_by
    for m in maps:  # every map a probability distribution over its keys
        assert torch.isfinite(m.probs).all(), (used_by, m)
    print(
        f"{', '.join(used_by)}: {cfg['model']} at {size} px ({forward_gmacs:.2f} GMACs), "
        + (f"steps at a reduced depth ({cut} blocks cut; full depth on the meta device), " if reduced else "")
        + f"{len(maps)} attention map(s), {time.perf_counter() - start:.1f} s"
    )
