"""The timm baselines at 32 x 32: every entry of CIFAR_32 builds, trains a step, has its documented size."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.models.nest import Nest

from locvit.models.baselines import BASELINES, CIFAR_32, NEST_TINY_CIFAR, create_at_32

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
def test_baseline_trains_at_32px(name):
    torch.manual_seed(0)
    model = create_at_32(name, num_classes=10)
    assert round(sum(p.numel() for p in model.parameters()) / 1e6, 2) == PARAMS_M[name]
    if name != "nest_tiny":
        assert tuple(model.patch_embed.grid_size) == (8, 8)  # the grid our masked models use
    _trains(model)


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
