"""IBiT training step time over DeiT-Tiny of the same size (batch, data), in one run.

LMSA cannot use a fused attention kernel (the mask multiplies the logits and, by
default, no softmax follows), so we report IBiT / DeiT step-time ratios against DeiT
with timm's fused attention (the real baseline) and with its eager attention (what the
mask costs on top of the unfused kernel it needs), for the default Frobenius
normalisation and the softmax option. Results: benchmarks/results/ibit_step.json.
"""

from __future__ import annotations

import argparse

import torch

import locvit.models  # noqa: F401
from benchmarks.common import step_ratios, write_result

CASES = {
    "ibit_frobenius": ("ibit_tiny_patch16_224", dict(normalize="frobenius")),
    "ibit_softmax": ("ibit_tiny_patch16_224", dict(normalize="softmax")),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # The mask fit runs once per grid while the models are built, before any timing.
    results = step_ratios("deit_tiny_patch16_224", CASES, args.repeats, args.batch, device)
    path = write_result("ibit_step", {"device": str(device), "repeats": args.repeats, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
