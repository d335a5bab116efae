"""MaiT training step time over its unmasked twin (same size, batch, data), in one run.

The paper says masks cost nothing; we report masked / unmasked step-time ratios for
the multiply, soft and restrict modes, against the unmasked twin with timm's fused
attention (the real baseline) and with its eager attention (what a mask costs on top
of the eager kernel it needs). Results: benchmarks/results/mait_step.json.
"""

from __future__ import annotations

import argparse

import torch

import locvit.models  # noqa: F401
from benchmarks.common import step_ratios, write_result

CASES = {
    "multiply_sch1": dict(masked_heads="sch1", mask_type="hard", mask_mode="multiply"),
    "multiply_all": dict(masked_heads="all", mask_type="hard", mask_mode="multiply"),
    "soft_all": dict(masked_heads="all", mask_type="soft"),
    "restrict_sch1": dict(masked_heads="sch1", mask_type="hard", mask_mode="restrict"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # The unmasked twin: timm's ViT of the same size (what MaiT is with no masked head).
    cases = {case: ("mait_tiny_patch16_224", opts) for case, opts in CASES.items()}
    results = step_ratios("vit_tiny_patch16_224", cases, args.repeats, args.batch, device)
    path = write_result("mait_step", {"device": str(device), "repeats": args.repeats, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
