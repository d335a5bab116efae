"""Sizes per variant: what `snakemake -n --profile cluster all` says each training job asks SLURM for.

The study's `resources` hold every variant's; a variant's override single keys; the
command line's --set-resources overrides them all. A variant on several nodes gets the
SLURM executor's multi-node resources (nodes, one task per node, GPUs per node through
gres, `mpi` so that the rule's shell starts the job steps) and locvit's multi-node launcher.
A one-node training job joins its variant's group job (with evaluate and analyse); a
multi-node one goes alone. No scheduler is needed: the dry run prints every job's resources
and its groups.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

import pytest
import yaml
from helpers import BIN, copy_workflow, env_with_venv

from locvit.config import load_params
from locvit.config.run import train_resources
from locvit.errors import InputError
from locvit.train import gpus

SIZES = {
    "deit_a": {"mem_mb": 4000, "runtime": 30},  # a small model: less memory and time, the study's GPU
    "mait_b": {"nodes": 2, "gpus": 4, "cpus": 32, "mem_mb": 200000, "runtime": 2880},  # a big one, two nodes
}


def dry_run(
    work, *extra, profile: tuple[str, ...] = ("--profile", "cluster"), said: list | None = None
) -> dict[str, dict]:
    """The dry run's resources, shell command and grouping of each training job, by variant (with ``said``:
    its output appended there)."""
    out = subprocess.run(
        [str(BIN / "snakemake"), *profile, "all", "-n", "--config", "params=presets/sized.yaml", *extra],
        cwd=work,
        env=env_with_venv(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    if said is not None:
        said.append(out.stdout + out.stderr)
    jobs: dict[str, dict] = {}
    for block in out.stdout.split("\n\n"):
        if not re.search(r"^\s*rule train:", block, re.M):
            continue
        variant = re.search(r"wildcards: variant=(\S+)", block).group(1)
        resources = dict(kv.split("=", 1) for kv in re.search(r"resources: (.*)", block).group(1).split(", "))
        jobs[variant] = {
            "resources": resources,
            "shell": re.search(r"Shell command: (.*)", block).group(1),
            "grouped": bool(re.search(r"^\s+rule train:", block, re.M)),
        }  # a group's jobs: indented
    return jobs


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work = copy_workflow(tmp_path_factory.mktemp("sized"))
    params = yaml.safe_load((work / "presets" / "tiny.yaml").read_text())
    params["study"] = "sized"
    params["resources"] = {"cpus": 8, "gpus": 1}  # the study's: every variant's unless it says otherwise
    for variant, sizes in SIZES.items():
        params["variants"][variant]["resources"] = sizes
    (work / "presets" / "sized.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return work


def test_a_variants_resources_override_the_studys_key_by_key(work):
    params = load_params(work / "presets" / "sized.yaml")
    assert train_resources(params, "deit_a") == {"nodes": 1, "gpus": 1, "cpus": 8, "mem_mb": 4000, "runtime": 30}
    assert train_resources(params, "mait_b") == {"nodes": 2, "gpus": 4, "cpus": 32, "mem_mb": 200000, "runtime": 2880}


@pytest.mark.e2e
def test_the_cluster_dry_run_shows_each_variants_sizes(work):
    jobs = dry_run(work)
    small, big = jobs["deit_a"], jobs["mait_b"]
    assert {k: small["resources"].get(k) for k in ("nodes", "gpu", "cpus_per_task", "mem_mb", "runtime")} == {
        "nodes": "1",
        "gpu": "1",
        "cpus_per_task": "8",
        "mem_mb": "4000",
        "runtime": "30",
    }
    assert not {"mpi", "tasks", "gres"} & set(small["resources"])
    assert " -m locvit train " in small["shell"]
    # Two nodes: one task (one torchrun) per node, 4 GPUs on each, and the launcher that starts them.
    assert {
        k: big["resources"].get(k)
        for k in ("nodes", "tasks", "gres", "mpi", "tasks_per_gpu", "cpus_per_task", "mem_mb", "runtime")
    } == {
        "nodes": "2",
        "tasks": "2",
        "gres": "gpu:4",
        "mpi": "srun",
        "tasks_per_gpu": "0",
        "cpus_per_task": "32",
        "mem_mb": "200000",
        "runtime": "2880",
    }
    assert "gpu" not in big["resources"]  # per-node GPUs go through gres, not --gpus for the whole job
    assert " -m locvit launch --nodes 2 --gpus-per-node 4 -- train " in big["shell"]
    # The profile adds only the site's settings to them.
    assert small["resources"]["slurm_partition"] == big["resources"]["slurm_partition"] == "gpu"
    assert "--signal=URG@300" in big["resources"]["slurm_extra"]
    # The small one trains in its variant's group job; the two-node one alone, so that its evaluate and
    # analyse (one GPU) do not hold its two nodes, and no group mixes --gres=gpu:4 with --gpus=1.
    assert small["grouped"] and not big["grouped"]


@pytest.mark.e2e
def test_the_command_line_overrides_every_variant(work):
    jobs = dry_run(work, "--set-resources", "train:mem_mb=1000", "train:runtime=5", "train:gres=gpu:8")
    for job in jobs.values():
        assert (job["resources"]["mem_mb"], job["resources"]["runtime"]) == ("1000", "5")
    assert jobs["mait_b"]["resources"]["nodes"] == "2"  # what was not overridden stays the variant's
    # The GPUs SLURM gives a node are the processes the launcher starts there.
    assert " -m locvit launch --nodes 2 --gpus-per-node 8 -- train " in jobs["mait_b"]["shell"]
    one = dry_run(work, "--set-resources", "train:gpu=4")["deit_a"]
    assert one["resources"]["gpu"] == "4" and " --nproc_per_node 4 -m locvit train " in one["shell"]


@pytest.mark.e2e
def test_nodes_from_the_command_line_are_refused_with_where_to_set_them(work):
    """deit_a would get two nodes and use one (a multi-node job's override: test_launch)."""
    out = subprocess.run(
        [
            str(BIN / "snakemake"),
            "--profile",
            "cluster",
            "all",
            "-n",
            "--config",
            "params=presets/sized.yaml",
            "--set-resources",
            "train:nodes=2",
        ],
        cwd=work,
        env=env_with_venv(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0
    said = out.stdout + out.stderr
    assert "train: nodes=2 from --set-resources" in said and "variant's resources.nodes in params" in said


@pytest.mark.e2e
@pytest.mark.parametrize("train_jobs, extra", [("per_variant", ["--group-components", "variant=2"]), ("per_run", [])])
def test_trainings_that_a_group_would_hold_side_by_side_go_alone(work, train_jobs, extra):
    """Inside a group job the SLURM executor runs one job at a time, while Snakemake would size side-by-side
    trainings (two variants' groups in one job; a variant's seeds as separate jobs) as parallel: sizes
    added, the longest runtime. So those trainings go to SLURM alone; evaluations stay grouped."""
    params = yaml.safe_load((work / "presets" / "sized.yaml").read_text())
    params["train_jobs"] = train_jobs
    (work / "presets" / "side_by_side.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = subprocess.run(
        [
            str(BIN / "snakemake"),
            "--profile",
            "cluster",
            "all",
            "-n",
            "--config",
            "params=presets/side_by_side.yaml",
            *extra,
        ],
        cwd=work,
        env=env_with_venv(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.search(r"^rule train:", out.stdout, re.M)  # at the top level: not in a group
    assert not re.search(r"^\s+rule train:", out.stdout, re.M)
    assert re.search(r"^\s+rule evaluate:", out.stdout, re.M)


def this_machine() -> dict[str, int]:
    """The CPUs, memory (MB) and GPUs of the machine the tests run on."""
    import psutil
    import torch

    return {"cpus": os.cpu_count(), "mem_mb": psutil.virtual_memory().total // 2**20, "gpus": torch.cuda.device_count()}


@pytest.mark.e2e
def test_a_local_run_sizes_training_by_this_machine(work):
    """Without the cluster profile a training job shows and gets this machine's sizes: the variant's CPUs,
    memory and GPUs cut to what it has, on one machine (the two-node variant too), with no time limit or
    SLURM settings; a job that uses GPUs first takes its own (locvit.train.gpus)."""
    said: list[str] = []
    jobs, here = dry_run(work, profile=(), said=said), this_machine()
    assert (
        f"locvit: local sizes: this machine's {here['cpus']} CPUs, {here['mem_mb']} MB, {here['gpus']} GPU(s)"
        in said[0]
    )
    params = load_params(work / "presets" / "sized.yaml")
    for variant, job in jobs.items():
        sizes = train_resources(params, variant)
        gpu = min(sizes["nodes"] * sizes["gpus"], here["gpus"])
        assert {k: job["resources"].get(k) for k in ("gpu", "cpus_per_task", "mem_mb")} == {
            "gpu": str(gpu),
            "cpus_per_task": str(min(sizes["cpus"], here["cpus"])),
            "mem_mb": str(min(sizes["mem_mb"], here["mem_mb"])),
        }, variant
        assert not {"nodes", "tasks", "gres", "mpi", "runtime", "slurm_partition", "slurm_extra"} & set(
            job["resources"]
        )
        # One machine: no multi-node launcher; torchrun over several GPUs. On GPUs the job takes its own first
        # (gpus.CLAIM, which the Snakefile turns on here: the same command as on the cluster, nothing recorded)
        launcher = f"-m torch.distributed.run --standalone --nproc_per_node {gpu} -m locvit" if gpu > 1 else "-m locvit"
        assert job["shell"].startswith(f'{gpus.CLAIM} "$LOCVIT_PYTHON" {launcher} train '), job["shell"]
    assert params["variants"]["mait_b"]["resources"]["nodes"] == 2


@pytest.mark.e2e
def test_the_gpu_resource_limits_local_training_jobs_to_the_machines_gpus(work):
    """A local run registers the `gpu` resource with this machine's GPU count (one training job per GPU at a
    time); --resources gpu=N still wins."""
    said: list[str] = []
    dry_run(work, profile=(), said=said)
    gpus_here = this_machine()["gpus"]
    if gpus_here:
        assert f"training jobs on GPUs at once: {gpus_here} (--resources gpu=N)" in said[0]
        dry_run(work, "--resources", "gpu=1", profile=(), said=said)
        assert "training jobs on GPUs at once: 1 (--resources gpu=N)" in said[1]
    else:
        assert "training on the CPU, within --cores" in said[0]
    cluster: list[str] = []
    dry_run(work, said=cluster)
    assert "locvit: local sizes" not in cluster[0]  # the cluster profile: params' sizes, nothing of this machine


def test_local_jobs_take_gpus_no_other_job_holds(tmp_path):
    """Each claim takes a GPU no open claim holds; with none free a claim waits until one is let go."""
    first = gpus.claim(1, ["0", "1"], tmp_path)
    second = gpus.claim(1, ["0", "1"], tmp_path)
    assert [d for d, _ in first + second] == ["0", "1"]
    third: list = []
    waiting = threading.Thread(
        target=lambda: third.extend(gpus.claim(1, ["0", "1"], tmp_path, poll_s=0.05)), daemon=True
    )
    waiting.start()
    waiting.join(timeout=0.5)
    assert waiting.is_alive() and not third  # both held
    os.close(second[0][1])
    waiting.join(timeout=10)
    assert [d for d, _ in third] == ["1"]
    for _, fd in first + third:
        os.close(fd)
    with pytest.raises(InputError, match="a job of 3 GPU"):
        gpus.claim(3, ["0", "1"], tmp_path)


CHILD = """
import fcntl, os, sys
held = os.environ["CUDA_VISIBLE_DEVICES"]
fd = os.open(os.path.join(sys.argv[1], f"gpu{held}.lock"), os.O_RDWR)
try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print(held, "free")
except BlockingIOError:
    print(held, "held")
"""


@pytest.mark.e2e
def test_a_local_job_runs_on_its_gpus_and_holds_them_while_it_runs(tmp_path):
    """`python -m locvit.train.gpus 1 -- COMMAND` runs COMMAND with CUDA_VISIBLE_DEVICES set to a GPU no other
    job holds (of those the job sees), and COMMAND holds its lock until it exits."""
    env = {**env_with_venv(), "CUDA_VISIBLE_DEVICES": "3,5", "TMPDIR": str(tmp_path)}
    folder = tmp_path / f"locvit-gpus-{os.getuid()}"
    folder.mkdir()
    taken = gpus.claim(1, ["3"], folder)  # another job holds GPU 3
    proc = subprocess.run(
        [sys.executable, "-m", "locvit.train.gpus", "--", sys.executable, "-c", CHILD, str(folder)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["5", "held"] and "locvit: GPU 5 for this job" in proc.stderr
    os.close(taken[0][1])
    # as many GPUs as the command starts processes
    assert (
        gpus.processes(
            ["python", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", "-m", "locvit", "train"]
        )
        == 4
    )
    assert gpus.processes(["python", "-m", "locvit", "train", "--threads", "2"]) == 1


@pytest.mark.e2e
def test_the_snakemake_inside_a_cluster_job_sizes_it_as_the_submitter_did(work):
    """In a SLURM job the executor starts Snakemake again (`--mode remote`, with a local executor for the job
    itself), which evaluates the job's resources and launcher anew: they are the cluster's, not the node's."""
    said: list[str] = []
    inside = dry_run(work, "--mode", "remote", "--printshellcmds", profile=(), said=said)
    submitted = dry_run(work)
    assert "locvit: local sizes" not in said[0]
    for variant in SIZES:
        assert inside[variant]["shell"] == submitted[variant]["shell"]
        assert {
            k: v for k, v in inside[variant]["resources"].items() if not k.startswith(("slurm_", "disk", "tmp"))
        } == {k: v for k, v in submitted[variant]["resources"].items() if not k.startswith(("slurm_", "disk", "tmp"))}
    assert " -m locvit launch --nodes 2 --gpus-per-node 4 -- train " in inside["mait_b"]["shell"]
