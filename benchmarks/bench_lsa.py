"""LSA: inference throughput against NesT, and the local block against a global block.

1. Images per second of ``lsa_tiny_cifar`` against timm's ``nest_tiny`` adapted to 32x32
   inputs (the overrides in ``locvit.models.baselines.CIFAR_32``) and against the NesT
   paper's CIFAR NesT-T (``nest_tiny_cifar``), measured alternately in one run (the
   paper's Table 3 reports LSA-T at 1700 img/s and NesT-T at 628 on one GPU: 2.7x).
2. Forward + backward time of LSA's local block (T variants per token) over one global
   block at the same token count and width.

Results: benchmarks/results/lsa.json.
"""

from __future__ import annotations

import argparse

import timm
import torch

import locvit.models  # noqa: F401
from benchmarks.common import alternate, median, write_result
from locvit.models.baselines import CIFAR_32
from locvit.models.lsa import LSABlock


def infer_fn(model: torch.nn.Module, batch: int, device: torch.device):
    model.eval()
    x = torch.randn(batch, 3, 32, 32, device=device)

    @torch.no_grad()
    def run():
        model(x)

    return run


def block_fn(block: LSABlock, x: torch.Tensor, z: torch.Tensor | None):
    def run():
        out = block(x, z) if block.local else block(x)
        out.sum().backward()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)

    models = {
        "lsa_tiny_cifar": timm.create_model("lsa_tiny_cifar", num_classes=10),
        "nest_tiny_32": timm.create_model("nest_tiny", num_classes=10, **CIFAR_32["nest_tiny"]),
        "nest_tiny_cifar": timm.create_model("nest_tiny_cifar", num_classes=10),
    }
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    times = alternate({name: infer_fn(m.to(device), args.batch, device) for name, m in models.items()}, args.repeats)
    throughput = {name: args.batch / median(t) for name, t in times.items()}
    ratio = throughput["lsa_tiny_cifar"] / throughput["nest_tiny_32"]
    ratio_paper_nest = throughput["lsa_tiny_cifar"] / throughput["nest_tiny_cifar"]
    print(
        {k: round(v, 1) for k, v in throughput.items()},
        f"lsa/nest_tiny = {ratio:.2f}, lsa/nest_tiny_cifar = {ratio_paper_nest:.2f} (paper: 2.7)",
    )

    # The first level of lsa_tiny_cifar: 1024 tokens, 192-d, 3 heads, T = 18, shared K/V.
    b, n, d, t = max(1, args.batch // 8), 1024, 192, 18
    local = LSABlock(d, 3, local=True, kv_shared=True).to(device)
    glob = LSABlock(d, 3, local=False, kv_shared=True).to(device)
    x = torch.randn(b, n, d, device=device, requires_grad=True)
    z = torch.randn(b, t, n, d, device=device, requires_grad=True)
    block_times = alternate({"local": block_fn(local, x, z), "global": block_fn(glob, x, None)}, args.repeats)
    block_ratio = median(block_times["local"]) / median(block_times["global"])
    print(f"local block / global block (N={n}, T={t}, D={d}, fwd+bwd) = {block_ratio:.2f}")

    path = write_result(
        "lsa",
        {
            "device": str(device),
            "repeats": args.repeats,
            "batch": args.batch,
            "throughput_img_per_s": throughput,
            "params": params,
            "lsa_over_nest": ratio,
            "lsa_over_nest_tiny_cifar": ratio_paper_nest,
            "paper_lsa_over_nest": 1700.2 / 627.9,
            "block": {
                "batch": b,
                "tokens": n,
                "dim": d,
                "variants": t,
                "local_s": median(block_times["local"]),
                "global_s": median(block_times["global"]),
                "local_over_global": block_ratio,
            },
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
