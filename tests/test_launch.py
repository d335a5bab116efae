"""Starting a training job over several nodes (locvit.train.launch), without SLURM.

What needs no scheduler: the command each kind of job runs, reading SLURM's allocation,
two agents started by hand that meet at a rendezvous and train (test_ddp compares their
weights with torchrun --standalone), and a rendezvous that cannot complete failing in
bounded time with a message naming the endpoint. The same launcher through a real SLURM:
tests/test_cluster.py.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from helpers import env_with_venv

from locvit.train import launch


def test_the_prefix_follows_nodes_and_gpus():
    py = "/venv/bin/python"
    assert launch.prefix(1, 0, py) == launch.prefix(1, 1, py) == f"{py} -m locvit"
    assert launch.prefix(1, 4, py) == f"{py} -m torch.distributed.run --standalone --nproc_per_node 4 -m locvit"
    assert launch.prefix(2, 4, py) == f"{py} -m locvit launch --nodes 2 --gpus-per-node 4 --"
    assert launch.prefix(3, 0, py) == f"{py} -m locvit launch --nodes 3 --gpus-per-node 0 --"


def test_a_jobs_processes_follow_what_slurm_was_asked_for():
    one = launch.slurm_resources({"nodes": 1, "gpus": 4, "cpus": 32, "mem_mb": 1000, "runtime": 60})
    assert (one["nodes"], one["gpu"], one["mpi"], one["tasks"], one["gres"]) == (1, 4, None, None, None)
    assert launch.shape(one) == (1, 4) and "--nproc_per_node 4 -m locvit" in launch.rule_prefix(one)
    two = launch.slurm_resources({"nodes": 2, "gpus": 8, "cpus": 64, "mem_mb": 1000, "runtime": 60})
    assert (two["nodes"], two["gpu"], two["mpi"], two["tasks"], two["gres"]) == (2, None, "srun", 2, "gpu:8")
    assert launch.shape(two) == (2, 8) and launch.shape({**two, "gres": "gpu:a100:4"}) == (2, 4)
    assert launch.rule_prefix(two).endswith("-m locvit launch --nodes 2 --gpus-per-node 8 --")
    assert launch.shape({**two, "nodes": 1}) == (2, 8)  # the agents share one node (the test cluster)
    with pytest.raises(launch.LaunchError, match="nodes=3 from --set-resources for a job of 2 nodes"):
        launch.shape({**two, "nodes": 3})
    with pytest.raises(launch.LaunchError, match="nodes=2 from --set-resources: .* resources.nodes in params"):
        launch.shape({**one, "nodes": 2})


@pytest.mark.parametrize(
    "hostlist, hosts",
    [
        ("node7", ["node7"]),
        ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
        ("gpu[08-10,12],cpu1", ["gpu08", "gpu09", "gpu10", "gpu12", "cpu1"]),
        ("a[1-2]-ib,b3", ["a1-ib", "a2-ib", "b3"]),
        ("r[1-2]n[07-08]", ["r1n07", "r1n08", "r2n07", "r2n08"]),
    ],
)
def test_slurm_host_lists_expand_in_order(hostlist, hosts):
    assert launch.expand_hostlist(hostlist) == hosts


def test_the_allocation_comes_from_scontrol():
    text = (
        "JobId=4242 JobName=snakejob UserId=me(1000) JobState=RUNNING NumNodes=2 NumCPUs=64 NumTasks=2 "
        "CPUs/Task=32 NodeList=gpu[07-08] BatchHost=gpu07\n"
    )
    alloc = launch.parse_scontrol(text)
    assert alloc == launch.Allocation("4242", ["gpu07", "gpu08"], 32)
    with pytest.raises(launch.LaunchError, match="did not describe a running job"):
        launch.parse_scontrol("JobId=4242 JobState=PENDING NodeList=(null)")


def test_the_job_runs_one_agent_per_node_meeting_at_its_first_node():
    alloc = launch.Allocation("4242", ["gpu07", "gpu08"], 32)
    cmd = launch.job_command(alloc, 2, 4, ["train", "--x"], env={}, python="py")
    assert cmd[:7] == [
        "srun",
        "--ntasks=2",
        "--nodes=2",
        "--ntasks-per-node=1",
        "--kill-on-bad-exit=1",
        "--cpus-per-task=32",
        "--gres=gpu:4",
    ]
    host, port = cmd[cmd.index("--endpoint") + 1].split(":")
    assert host == "gpu07" and 0 < int(port) < 65536  # a port free on this (the first) node
    assert cmd[7:] == [
        "py",
        "-m",
        "locvit",
        "launch",
        "--agent",
        "--nodes",
        "2",
        "--gpus-per-node",
        "4",
        "--endpoint",
        f"gpu07:{port}",
        "--rdzv-id",
        "4242",
        "--",
        "train",
        "--x",
    ]
    # Without GPUs no gres; node names mapped to another network's addresses.
    cpu = launch.job_command(alloc, 2, 0, ["train"], env={"LOCVIT_NODE_ADDRESS": "{node}-ib"}, python="py")
    assert not any(a.startswith("--gres") for a in cpu)
    assert cpu[cpu.index("--endpoint") + 1].startswith("gpu07-ib:")
    # The one-node test cluster: both agents on its node (no --nodes, no --ntasks-per-node).
    one = launch.job_command(launch.Allocation("7", ["c1"], 1), 2, 0, ["train"], env={}, python="py")
    assert one[:4] == ["srun", "--ntasks=2", "--kill-on-bad-exit=1", "--cpus-per-task=1"]
    with pytest.raises(launch.LaunchError, match=r"LOCVIT_NODE_ADDRESS='10.1.0.7' must contain \{node\}"):
        launch.job_command(alloc, 2, 0, ["train"], env={"LOCVIT_NODE_ADDRESS": "10.1.0.7"})

    agent = launch.agent_command(2, 4, "gpu07:29611", "4242", True, 300, ["train"], python="py")
    assert agent[agent.index("--nnodes") + 1] == "2" and agent[agent.index("--nproc-per-node") + 1] == "4"
    assert agent[agent.index("--rdzv-conf") + 1].startswith("is_host=1,join_timeout=300,read_timeout=300")
    assert "--local-addr" not in agent  # torchrun's default: the host's name
    cpu_agent = launch.agent_command(2, 0, "h:1", "j", False, 9, ["train"], local_addr="gpu08-ib")
    assert cpu_agent[cpu_agent.index("--nproc-per-node") + 1] == "1"  # one CPU process a node
    assert cpu_agent[cpu_agent.index("--local-addr") + 1] == "gpu08-ib"


@pytest.mark.e2e
def test_outside_slurm_and_with_a_bad_timeout_it_says_what_to_do():
    with pytest.raises(launch.LaunchError, match="inside a SLURM job"):
        launch.allocation(env={})
    with pytest.raises(launch.LaunchError, match="LOCVIT_RDZV_TIMEOUT='soon'"):
        launch.rdzv_timeout({"LOCVIT_RDZV_TIMEOUT": "soon"})
    proc = subprocess.run(
        [sys.executable, "-m", "locvit", "launch", "--nodes", "2", "--", "train", "--help"],
        env={k: v for k, v in env_with_venv().items() if not k.startswith("SLURM_")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0 and "inside a SLURM job (no SLURM_JOB_ID here)" in proc.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("node, role", [(1, "joining it"), (0, "hosting it")])
def test_a_rendezvous_that_cannot_complete_fails_in_bounded_time(node, role):
    """Node 1 finds nobody at the endpoint; node 0 hosts it and nobody joins: both stop after the timeout."""
    timeout = 8
    endpoint = f"127.0.0.1:{launch.free_port()}"
    env = {**env_with_venv(), "LOCVIT_NODE_RANK": str(node), "LOCVIT_RDZV_TIMEOUT": str(timeout)}
    env.pop("SLURM_PROCID", None)
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "locvit",
            "launch",
            "--agent",
            "--nodes",
            "2",
            "--endpoint",
            endpoint,
            "--rdzv-id",
            "t",
            "--",
            "train",
            "--help",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"the rendezvous of 2 nodes at {endpoint} did not complete (node {node}, {role}" in proc.stderr
    assert "Rendezvous" in proc.stderr.splitlines()[-2]  # torchrun's own reason is quoted
    assert timeout <= took < timeout + 60, took
