"""What the papers' CIFAR CNNs share (LSA Table 3's WRN-28-10 and PyramidNet-164, which timm lacks):
a stem, three stages, a final BN-ReLU and timm's classifier head, with timm's model API over them.

``CifarCnn`` is their base: a subclass builds ``self.stem`` and ``self.stages`` (each stage a
``Sequential`` of blocks, ``self.feature_info`` one entry per stage) and calls ``CifarCnn._finish``,
which adds the norm and the head and initialises the weights as the authors' code does (He-normal
convolutions, fan out; BatchNorm 1 and 0; zero linear bias). Not a family: ``wrn.py`` and
``pyramidnet.py`` each register theirs.
"""

# No `from __future__ import annotations`: torch.fx copies forward's annotations into the code it
# generates, and TorchScript cannot read them as strings (as in lsa.py).

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import ClassifierHead
from timm.models._features import feature_take_indices

from locvit.errors import allowed

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def cifar_cfg(first_conv: str) -> dict:
    """timm's default cfg of a 32 x 32, 10-class CIFAR model whose first convolution is ``first_conv``."""
    return dict(
        url="",
        num_classes=10,
        input_size=(3, 32, 32),
        pool_size=(8, 8),
        crop_pct=1.0,
        interpolation="bilinear",
        mean=CIFAR_MEAN,
        std=CIFAR_STD,
        first_conv=first_conv,
        classifier="head.fc",
    )


class CifarCnn(nn.Module):
    """The shared part of a pre-activation CIFAR CNN (module docstring)."""

    def _finish(self, chs: int, num_classes: int, global_pool: str, drop_rate: float) -> None:
        """The final BN-ReLU's norm over ``chs`` channels, the head, and the authors' initialisation."""
        self.norm = nn.BatchNorm2d(chs)
        self.num_features = self.head_hidden_size = chs
        self.head = ClassifierHead(chs, num_classes, pool_type=global_pool, drop_rate=drop_rate)
        for m in self.modules():  # the authors' code: He-normal convs (fan out), BN 1 and 0, zero linear bias
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

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        self.num_classes = num_classes
        self.head.reset(num_classes, global_pool)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) -> (B, C, H / 4, W / 4), after the final BN-ReLU."""
        return F.relu(self.norm(self.stages(self.stem(x))))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | list[int] | None = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """timm's feature API: the outputs of the stages in ``indices`` and ``forward_features``'s output;
        ``norm`` applies the final BN-ReLU to the last stage's map."""
        allowed("output_fmt", output_fmt, ("NCHW",))
        take, last = feature_take_indices(len(self.stages), indices)
        intermediates = []
        x = self.stem(x)
        for i, stage in enumerate(self.stages[: last + 1] if stop_early else self.stages):
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
