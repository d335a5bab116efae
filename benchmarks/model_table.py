"""Params and GMACs of every locvit entrypoint (and the baselines) at its default size.

Prints the Markdown table quoted in the README. GMACs as the analyse step counts them
(:func:`locvit.analysis.profile.gmacs`) for one image at the entrypoint's default input
size (224x224, or 32x32 for the CIFAR models): matmuls and convolutions, attention
matmuls included; element-wise work (softmax, norms, LSA's per-token attention over its
T variants) is not.
"""

from __future__ import annotations

import timm

import locvit.models  # noqa: F401
from locvit.analysis.profile import gmacs

PAPER = {  # name -> (paper model, params and "GFLOPs" (= GMACs) in the paper's Table 4)
    "deit_tiny_patch16_224": ("DeiT-T (baseline, timm)", "5.7M", "1.3"),
    "mait_xtiny_d24_patch16_224": ("MaiT-XT*, 24 layers, Sch.2", "6.3M", "1.5"),
    "mait_tiny_patch16_224": ("MaiT-T / MaiT+ (soft, all heads)", "5.7M (DeiT-T)", "1.3 (DeiT-T)"),
    "mait_tiny_d24_patch16_224": ("MaiT-T, 24 layers, Sch.3 (soft)", "11M", "2.5"),
    "mait_tiny_d36_patch16_224": ("MaiT-T, 36 layers, mixed", "-", "-"),
    "mait_xsmall_d24_patch16_224": ("MaiT-XS*, 24 layers, Sch.2", "24.5M", "5.3"),
    "mait_small_patch16_224": ("MaiT-S / MaiT+ (soft, all heads)", "22M (DeiT-S)", "4.6 (DeiT-S)"),
    "mait_small_d24_patch16_224": ("MaiT-S*, 24 layers, Sch.2", "43.3M", "9.1"),
    "mait_cait_xxs24_224": ("Masked CaiT-XXS24, Sch.1", "12M", "2.5"),
    "mait_cait_s24_224": ("Masked CaiT-S24, Sch.1", "46.9M", "9.4"),
    # LSA: Table 3 (CIFAR, 32x32, no FLOPs given) and Table 4 (ImageNet).
    "lsa_tiny_cifar": ("LSA Our-T, CIFAR (T=18)", "10.2M", "-"),
    "lsa_small_cifar": ("LSA Our-S, CIFAR (T=18)", "36.2M", "-"),
    "lsa_base_cifar": ("LSA Our-B, CIFAR (T=18)", "115.8M", "-"),
    "lsa_tiny_224": ("LSA Our-T, ImageNet (T=10)", "9.9M", "3.1"),
    "lsa_small_224": ("LSA Our-S, ImageNet (T=10)", "22.0M", "7.6"),
    # IBiT: Table 1 gives "6M" and no FLOPs.
    "ibit_tiny_patch16_224": ("IBiT-Ti, rank-9 learned masks", "6M", "-"),
    # Baselines the papers compare to (timm; nest_tiny_cifar registered by locvit).
    "convit_tiny": ("ConViT-Ti (baseline, timm)", "6M (IBiT Table 1)", "-"),
    "cait_xxs24_224": ("CaiT-XXS24 (baseline, timm)", "12M", "2.5"),
    "nest_tiny": ("NesT-T, ImageNet (baseline, timm)", "17.0M", "5.8"),
    "nest_tiny_cifar": ("NesT-T, CIFAR (NesT paper's setting)", "6.2M", "-"),
}


def main() -> None:
    print("| entrypoint | paper model (default setting) | input | params | paper params | GMACs | paper GFLOPs |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, (paper, paper_params, paper_gmacs) in PAPER.items():
        model = timm.create_model(name).eval()
        size = model.pretrained_cfg["input_size"][-1]
        params = sum(p.numel() for p in model.parameters())
        print(f"| `{name}` | {paper} | {size} | {params / 1e6:.2f}M | {paper_params} | "
              f"{gmacs(model, size):.2f} | {paper_gmacs} |")


if __name__ == "__main__":
    main()
