"""PyramidNet for CIFAR (Han, Kim and Kim, "Deep Pyramidal Residual Networks", CVPR 2017), which timm lacks.

LSA's Table 3 compares with Pyramid-164-48. ``PyramidBottleneck``: BN-conv1x1-BN-ReLU-conv3x3(stride)-BN-ReLU-
conv1x1(x4)-BN (Fig. 6(d)); the shortcut is the identity, a 2 x 2 average pool where the map halves, and
zero-padded channels where the block widens (parameter-free). ``PyramidNet``: a conv to 16 channels, three
groups of ``(depth - 2) / 9`` bottlenecks (strides 1, 2, 2) widening by ``alpha / (3 n)`` per block (rounded,
as the authors' code), BN-ReLU, average pool, linear head. No attention layers.
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


class PyramidBottleneck(nn.Module):
    """Bottleneck of width ``planes`` with ``4 * planes`` outputs; the shortcut pads ``in_chs`` with zeros."""

    expansion = 4

    def __init__(self, in_chs: int, planes: int, stride: int):
        super().__init__()
        out_chs = planes * self.expansion
        if out_chs < in_chs:
            raise InputError(f"a PyramidNet block cannot narrow ({in_chs} -> {out_chs} channels); use alpha >= 0")
        self.bn1 = nn.BatchNorm2d(in_chs)
        self.conv1 = nn.Conv2d(in_chs, planes, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out_chs, 1, bias=False)
        self.bn4 = nn.BatchNorm2d(out_chs)
        self.pool = nn.AvgPool2d(2, 2, ceil_mode=True) if stride != 1 else nn.Identity()
        self.pad = out_chs - in_chs  # zero channels added to the shortcut (static: traceable and scriptable)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(self.bn1(x))
        y = self.conv2(F.relu(self.bn2(y)))
        y = self.bn4(self.conv3(F.relu(self.bn3(y))))
        return y + F.pad(self.pool(x), [0, 0, 0, 0, 0, self.pad])  # (B, C, H, W): pad C at the end


class PyramidNet(CifarCnn):
    """Bottleneck PyramidNet-``depth`` with widening step ``alpha`` for 32 x 32 images (module docstring)."""

    def __init__(
        self,
        depth: int = 164,
        alpha: float = 48,
        num_classes: int = 10,
        in_chans: int = 3,
        global_pool: str = "avg",
        drop_rate: float = 0.0,
    ):
        super().__init__()
        if depth < 11 or (depth - 2) % 9:
            raise InputError(
                f"depth: {depth} is not a bottleneck PyramidNet depth; use 9n + 2 with n >= 1 "
                "(11, 29, 110, 164, 272, ...)"
            )
        n = (depth - 2) // 9
        step = alpha / (3 * n)
        self.num_classes = num_classes
        self.stem = nn.Sequential(nn.Conv2d(in_chans, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16))
        width, chs, stages, self.feature_info, reduction = 16.0, 16, [], [], 1
        for i, stride in enumerate((1, 2, 2)):
            blocks = []
            for j in range(n):
                width += step
                blocks.append(PyramidBottleneck(chs, int(round(width)), stride if j == 0 else 1))
                chs = int(round(width)) * PyramidBottleneck.expansion
            reduction *= stride
            stages.append(nn.Sequential(*blocks))
            self.feature_info.append(dict(num_chs=chs, reduction=reduction, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)
        self._finish(chs, num_classes, global_pool, drop_rate)


SMALL = dict(depth=11, alpha=12)  # one bottleneck per stage
default_cfgs = generate_default_cfgs({"pyramidnet164_a48": Cfg(**cifar_cfg("stem.0"), small=SMALL)})


@register_model
def pyramidnet164_a48(pretrained=False, **kwargs) -> PyramidNet:
    """Bottleneck PyramidNet-164, alpha 48 (LSA Table 3's Pyramid-164-48: 1.7M)."""
    if pretrained:
        raise ValueError("pyramidnet164_a48: no pretrained weights; use pretrained=False")
    return build_model_with_cfg(
        PyramidNet,
        "pyramidnet164_a48",
        pretrained=False,
        feature_cfg=dict(flatten_sequential=True, out_indices=(0, 1, 2)),  # its three stages
        **dict(dict(depth=164, alpha=48), **kwargs),
    )


register_family(
    Family(
        "pyramidnet",
        "PyramidNet",
        PyramidNet,
        "convolution: 3x3 kernels (no attention layers)",
        lambda m: [],
        lambda m: [],
        models=("pyramidnet",),
        small=SmallBuild("pyramidnet164_a48", SMALL, size=32),  # a CNN: no attention layers
    )
)

__all__ = ["PyramidNet", "PyramidBottleneck"]
