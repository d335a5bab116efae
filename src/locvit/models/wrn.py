"""Wide residual networks for CIFAR (Zagoruyko and Komodakis, BMVC 2016); timm has only the ImageNet WRNs.

``WideBasic``: the paper's pre-activation block, BN-ReLU-conv3x3-BN-ReLU-[dropout]-conv3x3, a 1 x 1 conv on the
shortcut where width or stride change (on the pre-activated input, as the paper's code). ``WideResNet``: a conv
to 16 channels, three groups of ``(depth - 4) / 6`` blocks of widths ``16k, 32k, 64k`` (strides 1, 2, 2),
BN-ReLU, average pool, linear head. ``wrn_28_10`` is LSA Table 3's; ``wrn_16_2`` trains in seconds on a CPU
(end-to-end tests). No attention layers.
"""

# No `from __future__ import annotations`: torch.fx copies forward's annotations into the code it
# generates, and TorchScript cannot read them as strings (as in lsa.py).

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.models import register_model
from timm.models._builder import build_model_with_cfg
from timm.models._registry import generate_default_cfgs

from locvit.errors import InputError
from locvit.models.cifar_cnn import CifarCnn, cifar_cfg
from locvit.models.family import Cfg, Family, SmallBuild, register_family


class WideBasic(nn.Module):
    """Pre-activation basic block (module docstring); ``drop_rate``: the dropout between the two convs."""

    def __init__(self, in_chs: int, out_chs: int, stride: int, drop_rate: float = 0.0):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_chs)
        self.conv1 = nn.Conv2d(in_chs, out_chs, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_chs)
        self.drop = nn.Dropout(drop_rate)
        self.conv2 = nn.Conv2d(out_chs, out_chs, 3, 1, 1, bias=False)
        self.shortcut = nn.Conv2d(in_chs, out_chs, 1, stride, bias=False) if in_chs != out_chs or stride != 1 else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = F.relu(self.bn1(x))
        skip = x if self.shortcut is None else self.shortcut(o)
        y = self.conv2(self.drop(F.relu(self.bn2(self.conv1(o)))))
        return y + skip


class WideResNet(CifarCnn):
    """WRN-``depth``-``widen_factor`` for 32 x 32 images (module docstring)."""

    def __init__(
        self,
        depth: int = 28,
        widen_factor: int = 10,
        num_classes: int = 10,
        in_chans: int = 3,
        global_pool: str = "avg",
        drop_rate: float = 0.0,
        block_drop_rate: float = 0.0,
    ):
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise InputError(f"depth: {depth} is not a WRN depth; use 6n + 4 with n >= 1 (10, 16, 22, 28, 40, ...)")
        n = (depth - 4) // 6
        widths = [16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.num_classes = num_classes
        self.stem = nn.Conv2d(in_chans, 16, 3, 1, 1, bias=False)
        stages, chs, self.feature_info, reduction = [], 16, [], 1
        for i, (width, stride) in enumerate(zip(widths, (1, 2, 2))):
            stages.append(
                nn.Sequential(
                    *[
                        WideBasic(chs if j == 0 else width, width, stride if j == 0 else 1, block_drop_rate)
                        for j in range(n)
                    ]
                )
            )
            chs, reduction = width, reduction * stride
            self.feature_info.append(dict(num_chs=width, reduction=reduction, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)
        self._finish(chs, num_classes, global_pool, drop_rate)


SMALL = dict(depth=10, widen_factor=1)  # one block per stage, 16-32-64 channels
default_cfgs = generate_default_cfgs(
    {name: Cfg(**cifar_cfg("stem"), small=SMALL) for name in ("wrn_28_10", "wrn_16_2")}
)


def _create(variant: str, pretrained: bool = False, **kwargs) -> WideResNet:
    if pretrained:
        raise ValueError(f"{variant}: no pretrained weights; use pretrained=False")
    return build_model_with_cfg(
        WideResNet,
        variant,
        pretrained=False,
        feature_cfg=dict(flatten_sequential=True, out_indices=(0, 1, 2)),
        **kwargs,
    )


@register_model
def wrn_28_10(pretrained=False, **kwargs) -> WideResNet:
    """WRN-28-10 (LSA Table 3: 36.5M)."""
    return _create("wrn_28_10", pretrained, **dict(dict(depth=28, widen_factor=10), **kwargs))


@register_model
def wrn_16_2(pretrained=False, **kwargs) -> WideResNet:
    """WRN-16-2: the same builder at a size that trains in seconds (end-to-end tests)."""
    return _create("wrn_16_2", pretrained, **dict(dict(depth=16, widen_factor=2), **kwargs))


register_family(
    Family(
        "wrn",
        "WRN",
        WideResNet,
        "convolution: 3x3 kernels (no attention layers)",
        lambda m: [],
        lambda m: [],
        models=("wrn_",),
        small=SmallBuild("wrn_16_2", SMALL, size=32),  # a CNN: no attention layers
    )
)

__all__ = ["WideResNet", "WideBasic"]
