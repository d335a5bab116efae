"""The demo study through the one-node SLURM test cluster, with the profile's job grouping and without.

Brings up tests/slurm_cluster.py's cluster (root and Debian's slurm-wlm, slurmdbd, munge,
mariadb-server, as `make test-cluster`), then runs `snakemake --profile cluster all` on
params.yaml in a fresh copy of the workflow twice: with cluster/config.yaml as it is
(`groups`: a variant's train, evaluate and analyse as one SLURM job) and with a copy of
the profile without `groups` and `group-components` (every job its own SLURM job). For
each: the SLURM jobs submitted (sacct, per rule or group), the jobs Snakemake ran, and
the wall time of the whole `snakemake` call. The sizes are scaled to the one 2-CPU node
as in tests/test_cluster.py (1 CPU, 1.5-2 GB, no GPU per job). The study's DAG, and so
the job counts, do not depend on the epochs: `--epochs N` shortens training for the wall
time and changes nothing else.

    flock /tmp/locvit-slurm.lock .venv/bin/python -m benchmarks.bench_cluster_grouping [--epochs 25]

Results: benchmarks/results/cluster_grouping.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.common import write_result
from tests.helpers import copy_workflow  # the tests' copy of a checkout
from tests.slurm_cluster import node_overrides  # the test cluster

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

GROUP_KEYS = ("groups", "group-components")


def submitted(jobs: list[dict]) -> dict[str, int]:
    """SLURM jobs per rule or group (``<group>_<its rules>``), from Snakemake's job comments."""
    names = [j["comment"].split("_wildcards_")[0].removeprefix("rule_") for j in jobs]
    return {name: names.count(name) for name in sorted(set(names))}


def ran(log: str) -> dict[str, int]:
    """Snakemake's own count of the jobs it ran (its 'Job stats' table), without the local rule all."""
    counts, inside = {}, False
    for line in log.splitlines():
        if line.startswith("Job stats:"):
            inside, counts = True, {}
            continue
        parts = line.split()
        if inside and len(parts) == 2 and parts[1].isdigit():
            counts[parts[0]] = int(parts[1])
        elif inside and counts and not parts:
            inside = False
    counts.pop("all", None)
    counts.pop("total", None)
    return counts


def run_study(slurm, mode: str, epochs: int, root: Path) -> dict:
    (root / mode).mkdir()
    work = copy_workflow(root / mode)
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["train"]["epochs"] = epochs
    for recipe in [params["train"], *(v.get("train", {}) for v in params["variants"].values())]:
        if recipe.get("warmup_epochs", 0) >= epochs:  # the recipe asks for warm-up < epochs
            recipe["warmup_epochs"] = epochs / 2
    (work / "bench.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    profile = yaml.safe_load((work / "cluster" / "config.yaml").read_text())
    if mode == "ungrouped":
        for key in GROUP_KEYS:
            profile.pop(key, None)
        (work / "cluster" / "config.yaml").write_text(yaml.safe_dump(profile, sort_keys=False))
    before = {j["job_id"] for j in slurm.sacct()}
    cmd = [
        str(BIN / "snakemake"),
        "--profile",
        "cluster",
        "all",
        "--config",
        "params=bench.yaml",
        "--slurm-init-seconds-before-status-checks",
        "2",
        *node_overrides(default_runtime=60),
    ]
    env = {**slurm.env, "PATH": f"{BIN}:{slurm.env.get('PATH', '')}"}
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    log = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: snakemake failed:\n{log[-5000:]}\n{slurm.log_tail()}")
    jobs = [j for j in slurm.sacct() if j["job_id"] not in before]
    sizes = usage(slurm, {j["job_id"] for j in jobs})
    print(f"{mode}: {len(jobs)} SLURM jobs in {wall:.0f} s", flush=True)
    return {
        "slurm_jobs": len(jobs),
        "slurm_jobs_by_rule_or_group": submitted(jobs),
        "snakemake_jobs": ran(log),
        "wall_s": round(wall, 1),
        "jobs_elapsed_s": sum(s["elapsed_s"] for s in sizes.values()),
        "allocated_cpu_s": sum(s["elapsed_s"] * s["cpus"] for s in sizes.values()),
        "cpus_per_job": sorted({s["cpus"] for s in sizes.values()}),
        "states": sorted({j["state"] for j in jobs}),
    }


def usage(slurm, ids: set[str]) -> dict[str, dict]:
    """Each job's elapsed seconds and allocated CPUs (sacct)."""
    out = subprocess.run(
        ["sacct", "-X", "-n", "-P", "--starttime=2000-01-01", "-o", "JobIDRaw,ElapsedRaw,AllocCPUS"],
        env=slurm.env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line]
    return {r[0]: {"elapsed_s": int(r[1]), "cpus": int(r[2])} for r in rows if r[0] in ids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=None, help="train.epochs (default: params.yaml's)")
    args = parser.parse_args()
    from slurm_cluster import LocalSlurm, unavailable

    why = unavailable()
    if why:
        raise SystemExit(f"the test cluster cannot start here: {why}")
    full = yaml.safe_load((REPO / "params.yaml").read_text())["train"]["epochs"]
    epochs = args.epochs or full
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-grouping-") as tmp, LocalSlurm() as slurm:
        for mode in ("ungrouped", "grouped"):
            results[mode] = run_study(slurm, mode, epochs, Path(tmp))
    payload = {
        "command": "flock /tmp/locvit-slurm.lock .venv/bin/python -m benchmarks.bench_cluster_grouping"
        + (f" --epochs {args.epochs}" if args.epochs else ""),
        "study": "params.yaml (the demo)"
        + (
            f", train.epochs {epochs} instead of {full} (warm-up {epochs / 2} epochs where it was longer)"
            if epochs != full
            else ""
        ),
        "node": "one SLURM node, 2 CPUs, no GPU; every job 1 CPU and 2 GB; a variant's group job Snakemake's "
        "estimate for its jobs (cpus_per_job), which run one after another",
        **results,
        "jobs_saved": results["ungrouped"]["slurm_jobs"] - results["grouped"]["slurm_jobs"],
        "wall_ratio_grouped_over_ungrouped": round(results["grouped"]["wall_s"] / results["ungrouped"]["wall_s"], 3),
    }
    path = write_result("cluster_grouping", payload)
    print(json.dumps(payload, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
