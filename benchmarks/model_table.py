"""Params and GMACs of every locvit entrypoint (and the baselines) at its default size.

Prints the Markdown table quoted in the README. GMACs = FLOPs / 2 as counted by
``torch.utils.flop_counter`` for one 224x224 image (matmuls, attention included).
"""

from __future__ import annotations

import timm
import torch
from torch.utils.flop_counter import FlopCounterMode

import locvit.models  # noqa: F401

PAPER = {  # name -> (paper name, params in the paper)
    "deit_tiny_patch16_224": ("DeiT-T (baseline, timm)", "5.7M"),
    "mait_xtiny_d24_patch16_224": ("MaiT-XT*, 24 layers, Sch.2", "6.3M"),
    "mait_tiny_patch16_224": ("MaiT-T / MaiT+ (soft, all heads)", "5.7M (DeiT-T)"),
    "mait_tiny_d24_patch16_224": ("MaiT-T, 24 layers, Sch.3 (soft)", "11M"),
    "mait_tiny_d36_patch16_224": ("MaiT-T, 36 layers, mixed", "-"),
    "mait_xsmall_d24_patch16_224": ("MaiT-XS*, 24 layers, Sch.2", "24.5M"),
    "mait_small_patch16_224": ("MaiT-S / MaiT+ (soft, all heads)", "22M (DeiT-S)"),
    "mait_small_d24_patch16_224": ("MaiT-S*, 24 layers, Sch.2", "43.3M"),
    "mait_cait_xxs24_224": ("Masked CaiT-XXS24, Sch.1", "12M"),
    "mait_cait_s24_224": ("Masked CaiT-S24, Sch.1", "46.9M"),
}


def main() -> None:
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print("| entrypoint | paper model (default setting) | params | paper params | GMACs |")
    print("|---|---|---:|---:|---:|")
    for name, (paper, paper_params) in PAPER.items():
        model = timm.create_model(name).eval()
        params = sum(p.numel() for p in model.parameters())
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.randn(1, 3, 224, 224))
        print(f"| `{name}` | {paper} | {params / 1e6:.2f}M | {paper_params} | {counter.get_total_flops() / 2e9:.2f} |")


if __name__ == "__main__":
    main()
