"""IBiT training step time over DeiT-Tiny of the same size (batch, data), in one run.

LMSA cannot use a fused attention kernel (the mask multiplies the logits and, by
default, no softmax follows), so we report IBiT / DeiT step-time ratios against DeiT
with timm's fused attention (the real baseline) and with its eager attention (what the
mask costs on top of the unfused kernel it needs), for the default Frobenius
normalisation and the softmax option. Results: benchmarks/results/ibit_step.json.
"""

from __future__ import annotations

import argparse

import timm
import torch
import torch.nn.functional as F

import locvit.models  # noqa: F401
from common import alternate, median, write_result

CASES = {
    "ibit_frobenius": dict(normalize="frobenius"),
    "ibit_softmax": dict(normalize="softmax"),
}


def step_fn(model: torch.nn.Module, batch: int, size: int, device: torch.device):
    x = torch.randn(batch, 3, size, size, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    # Two sizes: the demo's (65 tokens) and DeiT-Tiny's at 224 (197 tokens; 6 of its 12 layers).
    shapes = {
        "demo_32px_p4_48d_4L": dict(img_size=32, patch_size=4, embed_dim=48, depth=4, num_heads=3),
        "deit_tiny_224_6L": dict(img_size=224, patch_size=16, embed_dim=192, depth=6, num_heads=3),
    }
    results = {}
    for shape_name, shape in shapes.items():
        batch = args.batch if shape["img_size"] <= 32 else max(8, args.batch // 4)
        torch.manual_seed(0)
        fns = {"deit": step_fn(timm.create_model("deit_tiny_patch16_224", num_classes=10, **shape).to(device),
                               batch, shape["img_size"], device)}
        eager = timm.create_model("deit_tiny_patch16_224", num_classes=10, **shape).to(device)
        for block in eager.blocks:
            block.attn.fused_attn = False
        fns["deit_eager"] = step_fn(eager, batch, shape["img_size"], device)
        for case, opts in CASES.items():  # the mask fit runs once per grid, before timing
            model = timm.create_model("ibit_tiny_patch16_224", num_classes=10, **shape, **opts).to(device)
            fns[case] = step_fn(model, batch, shape["img_size"], device)
        times = alternate(fns, args.repeats)
        base = median(times["deit"])
        results[shape_name] = {
            "batch": batch, "shape": shape, "deit_step_s": base,
            "ratios": {case: median(times[case]) / base for case in CASES},
            "ratios_vs_eager_twin": {case: median(times[case]) / median(times["deit_eager"]) for case in CASES},
        }
        for label, key in (("vs fused DeiT", "ratios"), ("vs eager DeiT", "ratios_vs_eager_twin")):
            print(shape_name, label, {k: round(v, 3) for k, v in results[shape_name][key].items()})
    path = write_result("ibit_step", {"device": str(device), "repeats": args.repeats, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
