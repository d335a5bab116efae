"""Wide residual networks for CIFAR (Zagoruyko and Komodakis, BMVC 2016), which timm does not have
(its ``wide_resnet50_2`` / ``101_2`` are the ImageNet bottleneck WRNs).

LSA's Table 3 compares with WRN-28-10 on CIFAR-10/100 (36.5M parameters).

Block
    :class:`WideBasic`: the paper's pre-activation basic block, BN-ReLU-conv3x3-BN-ReLU-[dropout]-conv3x3,
    with a 1 x 1 conv on the shortcut where the width or stride changes (applied to the pre-activated
    input, as the paper's code does).
Model
    :class:`WideResNet`: a 3 x 3 conv to 16 channels, three groups of ``(depth - 4) / 6`` blocks of
    widths ``16k, 32k, 64k`` (strides 1, 2, 2), BN-ReLU, global average pool, linear head.

==========  ==========================================  =================================
entrypoint  size                                        params (10 classes)
==========  ==========================================  =================================
wrn_28_10   depth 28, widen 10 (LSA Table 3)            36.48M (paper 36.5M)
wrn_16_2    depth 16, widen 2 (a model that trains in   0.69M
            seconds on a CPU, for end-to-end tests)
==========  ==========================================  =================================

No attention: its family declares no attention layers (the analyses have no maps to read).
"""

# No `from __future__ import annotations`: torch.fx copies forward's annotations into the code it
# generates, and TorchScript cannot read them as strings (as in lsa.py).

from typing import List, Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import ClassifierHead
from timm.models import register_model
from timm.models._builder import build_model_with_cfg
from timm.models._features import feature_take_indices
from timm.models._registry import generate_default_cfgs

from locvit.errors import InputError, allowed
from locvit.models.family import Family, register_family

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class WideBasic(nn.Module):
    """Pre-activation basic block (module docstring); ``drop_rate``: the dropout between the two convs."""

    def __init__(self, in_chs: int, out_chs: int, stride: int, drop_rate: float = 0.0):
        super().__init__()
        self.bn1 = nn.BatchNorm2d(in_chs)
        self.conv1 = nn.Conv2d(in_chs, out_chs, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_chs)
        self.drop = nn.Dropout(drop_rate)
        self.conv2 = nn.Conv2d(out_chs, out_chs, 3, 1, 1, bias=False)
        self.shortcut = nn.Conv2d(in_chs, out_chs, 1, stride, bias=False) if in_chs != out_chs or stride != 1 \
            else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        o = F.relu(self.bn1(x))
        skip = x if self.shortcut is None else self.shortcut(o)
        y = self.conv2(self.drop(F.relu(self.bn2(self.conv1(o)))))
        return y + skip


class WideResNet(nn.Module):
    """WRN-``depth``-``widen_factor`` for 32 x 32 images (module docstring)."""

    def __init__(self, depth: int = 28, widen_factor: int = 10, num_classes: int = 10, in_chans: int = 3,
                 global_pool: str = "avg", drop_rate: float = 0.0, block_drop_rate: float = 0.0):
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise InputError(f"depth: {depth} is not a WRN depth; use 6n + 4 with n >= 1 (10, 16, 22, 28, 40, ...)")
        n = (depth - 4) // 6
        widths = [16 * widen_factor, 32 * widen_factor, 64 * widen_factor]
        self.num_classes = num_classes
        self.stem = nn.Conv2d(in_chans, 16, 3, 1, 1, bias=False)
        stages, chs, self.feature_info, reduction = [], 16, [], 1
        for i, (width, stride) in enumerate(zip(widths, (1, 2, 2))):
            stages.append(nn.Sequential(*[WideBasic(chs if j == 0 else width, width, stride if j == 0 else 1,
                                                    block_drop_rate) for j in range(n)]))
            chs, reduction = width, reduction * stride
            self.feature_info.append(dict(num_chs=width, reduction=reduction, module=f"stages.{i}"))
        self.stages = nn.Sequential(*stages)
        self.norm = nn.BatchNorm2d(chs)
        self.num_features = self.head_hidden_size = chs
        self.head = ClassifierHead(chs, num_classes, pool_type=global_pool, drop_rate=drop_rate)
        for m in self.modules():  # the paper's code: He-normal convs (fan out), BN 1 and 0, zero linear bias
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head.fc

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        self.head.reset(num_classes, global_pool)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, 64k, H / 4, W / 4), after the final BN-ReLU."""
        return F.relu(self.norm(self.stages(self.stem(x))))

    def forward_intermediates(self, x: torch.Tensor, indices: Optional[Union[int, List[int]]] = None,
                              norm: bool = False, stop_early: bool = False, output_fmt: str = "NCHW",
                              intermediates_only: bool = False):
        """timm's feature API: the outputs of the groups in ``indices`` and ``forward_features``'s output;
        ``norm`` applies the final BN-ReLU to the last group's map."""
        allowed("output_fmt", output_fmt, ("NCHW",))
        take, last = feature_take_indices(len(self.stages), indices)
        intermediates = []
        x = self.stem(x)
        for i, stage in enumerate(self.stages[:last + 1] if stop_early else self.stages):
            x = stage(x)
            if i in take:
                intermediates.append(F.relu(self.norm(x)) if norm and i == len(self.stages) - 1 else x)
        if intermediates_only:
            return intermediates
        return F.relu(self.norm(x)), intermediates

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return self.head(x, pre_logits=pre_logits)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))


default_cfgs = generate_default_cfgs({name: dict(
    url="", num_classes=10, input_size=(3, 32, 32), pool_size=(8, 8), crop_pct=1.0, interpolation="bilinear",
    mean=CIFAR_MEAN, std=CIFAR_STD, first_conv="stem", classifier="head.fc") for name in ("wrn_28_10", "wrn_16_2")})


def _create(variant: str, pretrained: bool = False, **kwargs) -> WideResNet:
    if pretrained:
        raise ValueError(f"{variant}: no pretrained weights; use pretrained=False")
    return build_model_with_cfg(WideResNet, variant, pretrained=False, feature_cfg=dict(flatten_sequential=True),
                                **kwargs)


@register_model
def wrn_28_10(pretrained=False, **kwargs) -> WideResNet:
    """WRN-28-10 (LSA Table 3: 36.5M)."""
    return _create("wrn_28_10", pretrained, **dict(dict(depth=28, widen_factor=10), **kwargs))


@register_model
def wrn_16_2(pretrained=False, **kwargs) -> WideResNet:
    """WRN-16-2: the same builder at a size that trains in seconds (end-to-end tests)."""
    return _create("wrn_16_2", pretrained, **dict(dict(depth=16, widen_factor=2), **kwargs))


register_family(Family("wrn", "WRN", WideResNet, "convolution: 3x3 kernels (no attention layers)",
                       lambda m: [], lambda m: [], models=("wrn_",)))

__all__ = ["WideResNet", "WideBasic"]
