"""FFCV loader with and without numba compilation (``loader_jit``), on the demo's data.

Each setting runs in a fresh process (the switch and numba's compiled code are
process-wide): time of the first training epoch (where the pipeline is compiled), of
later epochs, and of one validation pass. The data is the demo's (digits, 32 px),
prepared into a temporary folder. Results: benchmarks/results/loader.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write_result


def child(train: str, val: str, jit: bool, epochs: int) -> dict:
    import torch

    from locvit.data.ffcv_io import make_loader

    loader = make_loader(train, 32, True, torch.device("cpu"), seed=0, translate=2, jit=jit)
    val_loader = make_loader(val, 256, False, torch.device("cpu"), jit=jit)
    epoch_s = []
    for _ in range(epochs):
        start = time.perf_counter()
        for _x, _y in loader:
            pass
        epoch_s.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _x, _y in val_loader:
        pass
    return {
        "first_epoch_s": epoch_s[0],
        "later_epoch_s": sorted(epoch_s[1:])[len(epoch_s[1:]) // 2],
        "val_pass_s": time.perf_counter() - start,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--child", nargs=3, metavar=("TRAIN", "VAL", "JIT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        train, val, jit = args.child
        print(json.dumps(child(train, val, jit == "1", args.epochs)))
        return

    from locvit.config import load_params
    from locvit.data.prepare import prepare

    data = load_params(Path(__file__).resolve().parents[1] / "params.yaml", check_models=False)["data"]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {s: Path(tmp) / f"{s}.beton" for s in ("train", "val", "test")}
        prepare(data, paths, Path(tmp) / "manifest.json")
        for name, jit in (("jit", "1"), ("no_jit", "0")):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "benchmarks.bench_loader",
                    "--epochs",
                    str(args.epochs),
                    "--child",
                    str(paths["train"]),
                    str(paths["val"]),
                    jit,
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[name] = json.loads(out.strip().splitlines()[-1])
            print(name, {k: round(v, 3) for k, v in results[name].items()})
    path = write_result("loader", {"data": data, "batch": 32, "epochs": args.epochs, "results": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
