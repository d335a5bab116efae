"""Pipeline overhead on a finished study: `snakemake -n all` and `dvc status`, and the demo's wall time.

What a user waits for before anything runs: Snakemake parsing the workflow (the config
validated, every variant's model checked) and building the DAG; DVC hashing what
changed. Goal: under 5 s each on a finished study. Timed alternately, median of
repeats, from the repository root on the study of params.yaml (the demo: run
`make demo` first). With `--demo`, also the whole demo from scratch in a temporary
copy of the workflow (about 9 minutes on 2 cores).

    cd benchmarks && ../.venv/bin/python bench_pipeline.py [--repeats 5] [--demo]

Results: benchmarks/results/pipeline.json.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import alternate, median, write_result

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GOAL_S = 5.0


def run(cmd: list[str], cwd: Path = REPO) -> str:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    return proc.stdout + proc.stderr


def demo_wall_time() -> float:
    """`snakemake --cores all all` on params.yaml in a fresh copy of the workflow (nothing cached but models)."""
    with tempfile.TemporaryDirectory(prefix="locvit-demo-") as tmp:
        work = Path(tmp)
        for name in ("Snakefile", "params.yaml", "dvc.yaml"):
            shutil.copy2(REPO / name, work / name)
        for name in ("workflow", "profiles", "src"):
            shutil.copytree(REPO / name, work / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        start = time.perf_counter()
        run([str(BIN / "snakemake"), "--cores", "all", "all"], cwd=work)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--demo", action="store_true", help="also time the whole demo from scratch")
    args = parser.parse_args()

    dry = run([str(BIN / "snakemake"), "-n", "all"])
    if "Nothing to be done" not in dry:
        raise SystemExit("the study of params.yaml is not finished (snakemake -n all has jobs to run): "
                         "run `make demo` first, then this benchmark")
    times = alternate({
        "snakemake -n all": lambda: run([str(BIN / "snakemake"), "-n", "all"]),
        "dvc status": lambda: run([str(BIN / "dvc"), "status"]),
    }, repeats=args.repeats, warmup=1)
    result = {name: {"median_s": round(median(t), 2), "min_s": round(min(t), 2), "max_s": round(max(t), 2),
                     "under_goal": median(t) < GOAL_S} for name, t in times.items()}
    payload = {"goal_s": GOAL_S, "repeats": args.repeats, "study": "params.yaml (demo)", "commands": result}
    for name, r in result.items():
        print(f"{name:18s} median {r['median_s']:.2f} s (min {r['min_s']:.2f}, max {r['max_s']:.2f}); "
              f"goal < {GOAL_S:g} s: {'yes' if r['under_goal'] else 'NO'}")
    if args.demo:
        wall = demo_wall_time()
        payload["demo_wall_s"] = round(wall, 1)
        print(f"demo from scratch: {wall / 60:.1f} min")
    print(f"wrote {write_result('pipeline', payload)}")


if __name__ == "__main__":
    main()
