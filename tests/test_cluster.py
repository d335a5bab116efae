"""`snakemake --profile cluster all` through a real two-node SLURM cluster on this machine (`make test-cluster`).

tests/slurm_cluster.py brings up munged, MariaDB, slurmdbd and slurmctld, and two slurmd, each in
a network namespace of its own with its own address on a virtual link (locvit1 at 10.213.18.11,
locvit2 at .12; the controller at .1); the tiny study then runs through the SLURM executor
exactly as the README says, with the per-rule sizes scaled down to the nodes on the command line
(2 CPUs each, no GPU). One variant trains over two nodes: its job has one SLURM task on each,
each running one torchrun of one gloo process, through the same rule and launcher (locvit launch:
srun, c10d rendezvous at the first node's address, LOCVIT_NODE_ADDRESS='{node}-net') a real
cluster uses, and ends with the weights of 2 processes on one node. That job is also preempted: it
holds after its first epoch's checkpoint (LOCVIT_HOLD_AT, tests/faultinject), the test `scancel`s
it, Snakemake's retry re-submits it and it resumes from last.pt into the same MLflow run. Another
meets its time limit on the second node: its variant's group job has a 5-minute limit with the
profile's warning signal 60 s before; the run stalls mid-epoch (LOCVIT_STALL_AT) until the signal
comes, stops at the next step, and the re-submitted job resumes it to the weights of an
uninterrupted run. The profile's grouping sends each variant's (and each mask-search round's)
train, evaluate and analyse jobs to SLURM as one job, except the two-node training job, which goes
alone. Then the same two-node training, submitted with sbatch, loses a node in the middle of an
epoch (its link cut, its slurmd and processes killed), once the second node and once the first
(the batch host and rendezvous host): the job ends within SlurmdTimeout + KillWait, nothing of it
is left on the survivor, SLURM requeues it, and with the node back it resumes to the same weights.

Skipped, with the reason, unless LOCVIT_CLUSTER_TEST=1 (set by `make test-cluster`), and
where the cluster cannot run (not root, packages missing).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import BIN, copy_workflow, env_with_venv, seed_runs, train_cmd
from slurm_cluster import (
    KILL_WAIT_S,
    LINK,
    SLURMD_TIMEOUT_S,
    LocalSlurm,
    NodeNetwork,
    node_address,
    node_name,
    node_overrides,
    unavailable,
)

from locvit.checkpoint import load_checkpoint

pytestmark = pytest.mark.cluster
TINY = "presets/tiny.yaml"
PREEMPTED = "runs/deit_a/seed0"  # the training run the test cancels after its first epoch
TWO_NODES = "deit_a"  # the variant that trains on 2 nodes (one SLURM task on each)
TIMED_OUT = "runs/mait_b/seed0"  # the training run that meets its time limit in the middle of epoch 0
STALL_STEP = 5  # of 18 per epoch
TIME_LIMIT = {"train": 3, "evaluate": 1, "analyse": 1}  # minutes: a variant's group job gets their sum (5)
WARNING_S = 60


def small_node_overrides() -> list[str]:
    """The profile's sizes fitted to the test cluster's nodes; the variant groups' jobs get a 5-minute limit
    (TIME_LIMIT) and the warning WARNING_S before it, and run on the second node (``--nodelist``; the two-node
    job's allocation then includes the first), so that the time limit's signal is tested there while SLURM
    puts the other jobs on the first node, which it fills first."""
    return node_overrides(TIME_LIMIT, 30, f"'--signal=URG@{WARNING_S} --nodelist={node_name(2)}'", one_node=False)


@pytest.fixture(scope="module")
def cluster():
    if os.environ.get("LOCVIT_CLUSTER_TEST") != "1":
        pytest.skip("the SLURM cluster test runs with `make test-cluster` (LOCVIT_CLUSTER_TEST=1)")
    why = unavailable()
    if why:
        pytest.skip(why)

    def interrupted(signum, frame):  # a CI time-out's SIGTERM still tears the cluster down
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        with LocalSlurm(nodes=2) as slurm:
            yield slurm
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_two_nodes_each_with_its_own_network(cluster):
    """One srun task on each node: each is named by SLURM as its node, has only its loopback and its own address
    on the test link (no other interface, no default route), and resolves both nodes' `{node}-net` names
    (LOCVIT_NODE_ADDRESS) to their addresses."""
    probe = (
        "echo $SLURM_PROCID $SLURMD_NODENAME; ip -o -4 addr show | awk '{print $2, $4}'; ip -4 route show; "
        "getent hosts locvit1-net locvit2-net"
    )
    env = {**env_with_venv(), **cluster.job_env}
    proc = subprocess.run(
        ["srun", "--nodes=2", "--ntasks-per-node=1", "--partition=cpu", "--time=2", "--label", "bash", "-c", probe],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    by_task: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        task, _, text = line.partition(": ")
        by_task.setdefault(task.strip(), []).append(text.strip())
    for task, node in (("0", 1), ("1", 2)):
        lines = by_task[task]
        assert lines[0] == f"{task} {node_name(node)}", lines
        assert sorted(lines[1:3]) == sorted(["lo 127.0.0.1/8", f"{LINK} {node_address(node)}/24"]), lines
        assert not any(line.startswith("default") for line in lines), lines  # nothing routed off the link
        assert all([node_address(i), f"{node_name(i)}-net"] in [line.split() for line in lines] for i in (1, 2)), lines


def preempt_once(slurm: LocalSlurm, hold: Path, done: threading.Event, record: dict) -> None:
    """Wait for the held training job, scancel it, then let every run go on."""
    try:
        while not done.is_set():
            markers = list(hold.parent.glob(f"{hold.name}.*.json"))
            if markers:
                held = json.loads(markers[0].read_text())
                record.update(held)
                subprocess.run(["scancel", held["slurm_job_id"]], env=slurm.env, check=True, timeout=60)
                break
            time.sleep(0.5)
    finally:
        hold.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def study(cluster, tmp_path_factory):
    """The tiny study run through SLURM, with one training job preempted; (workdir, run output, preempted)."""
    work = copy_workflow(tmp_path_factory.mktemp("cluster"))
    preset = work / TINY
    params = yaml.safe_load(preset.read_text())
    params["variants"][TWO_NODES]["resources"] = {"nodes": 2, "gpus": 0}
    params["train"]["read_every"] = 1  # the time-limited run stops at the step after the warning
    preset.write_text(yaml.safe_dump(params, sort_keys=False))
    hold, stall = work / "hold", work / "stall"
    hold.touch()
    stall.touch()
    env = {
        **env_with_venv(),
        **cluster.job_env,
        "LOCVIT_HOLD_AT": f"after_epoch_0@{PREEMPTED}",
        "LOCVIT_HOLD_FILE": str(hold),
        "LOCVIT_STALL_AT": f"train_step_{STALL_STEP}@{TIMED_OUT}",
        "LOCVIT_STALL_FILE": str(stall),
    }
    done, record = threading.Event(), {}
    watcher = threading.Thread(target=preempt_once, args=(cluster, hold, done, record), daemon=True)
    watcher.start()
    started = time.monotonic()
    proc = subprocess.run(
        [
            str(BIN / "snakemake"),
            "--profile",
            "cluster",
            "all",
            "--config",
            f"params={TINY}",
            "--slurm-init-seconds-before-status-checks",
            "2",
            *small_node_overrides(),
        ],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    done.set()
    watcher.join(timeout=60)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise AssertionError(f"snakemake --profile cluster all failed:\n{out[-6000:]}\n{cluster.log_tail()}")
    print(f"tiny study through SLURM: {time.monotonic() - started:.0f} s")
    return work, out, record


def test_every_output_is_there(study):
    work, _, _ = study
    params = yaml.safe_load((work / TINY).read_text())
    root = work / "results" / "tiny"
    for variant in params["variants"]:
        for seed in params["seeds"]:
            metrics = json.loads((root / "runs" / variant / f"seed{seed}" / "metrics.json").read_text())
            assert len(metrics["history"]) == params["train"]["epochs"]
            assert (root / "eval" / variant / f"seed{seed}.json").is_file()
            assert (root / "analysis" / variant / f"seed{seed}.json").is_file()
    assert (root / "report" / "results.md").is_file() and (root / "report" / "mask_search.md").is_file()
    assert not list(root.rglob("*.tmp"))


def submitted(jobs: list[dict]) -> dict[str, int]:
    """SLURM jobs per rule, or per group (``<group>_<its rules>``), from Snakemake's job comments."""
    names = [j["comment"].split("_wildcards_")[0].removeprefix("rule_") for j in jobs]
    return {name: names.count(name) for name in sorted(set(names))}


def test_every_job_went_through_sbatch_grouped(study, cluster):
    """Each variant's train, evaluate and analyse went as one SLURM job, each search round's likewise,
    except the two-node variant's training, alone (its evaluate and analyse grouped), and the throughput job:
    11 first submissions for the tiny study's 18 jobs, plus one re-submission each for the preempted and the
    timed-out run."""
    work, out, _ = study
    jobs = [j for j in cluster.sacct() if j["comment"]]  # Snakemake's (the other tests' sruns carry none)
    params = yaml.safe_load((work / TINY).read_text())
    variants, rounds = len(params["variants"]), params["mask_search"]["rounds"]
    assert submitted(jobs) == {
        "prepare": 1,
        "report": 1,
        "search": 1,
        "search_spec": rounds,
        "throughput": 1,
        "search_round_search_analyse_search_evaluate_search_train": rounds,
        "train": 2,  # the two-node variant's, preempted and re-submitted
        "variant_analyse_evaluate": 1,  # its evaluate and analyse
        "variant_analyse_evaluate_train": variants,  # the others', and the timed-out one re-submitted
    }, jobs
    # Each training run's MLflow run names the SLURM job that finished it, and that job completed.
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{work / 'results' / 'tiny' / 'mlflow.db'}")
    runs = seed_runs(client, "tiny")
    by_id = {j["job_id"]: j for j in jobs}
    assert runs
    for run in runs:
        job = by_id.get(run.data.tags.get("slurm_job_id"))
        assert job is not None, f"MLflow run {run.info.run_name} has no SLURM job id known to sacct"
        assert job["state"] == "COMPLETED" and job["comment"].startswith(
            ("rule_variant_", "rule_search_round_", "rule_train_")
        )
    # The study spanned both nodes: one-node jobs on each, and the two-node training over both.
    assert {node_name(1), node_name(2), f"{node_name(1)[:-1]}[1-2]"} <= {j["node_list"] for j in jobs}, jobs


def test_preempted_job_was_resubmitted_and_resumed(study, cluster):
    work, out, held = study
    assert held, "the training job to preempt never reached its hold point"
    jobs = {j["job_id"]: j for j in cluster.sacct()}
    assert jobs[held["slurm_job_id"]]["state"].startswith("CANCELLED")
    run_dir = work / "results" / "tiny" / PREEMPTED
    metrics = json.loads((run_dir / "metrics.json").read_text())
    first, *rest = metrics["slurm_job_ids"]
    assert first == held["slurm_job_id"] and len(rest) == 1, metrics["slurm_job_ids"]
    assert jobs[rest[0]]["state"] == "COMPLETED"
    assert [row["epoch"] for row in metrics["history"]] == [0, 1]  # epoch 0 from the cancelled job, kept
    log = (work / "results" / "tiny" / "logs" / "train" / "deit_a.log").read_text()  # train_jobs: per_variant
    assert "resum" in log.lower(), log[-2000:]

    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{work / 'results' / 'tiny' / 'mlflow.db'}")
    run = client.get_run(metrics["mlflow_run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.tags["slurm_job_ids"] == ",".join(metrics["slurm_job_ids"])
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_top1")] == [0, 1]


def run_config_and_data(work: Path, run: str) -> tuple[dict, dict]:
    """A training run's config (from its last.pt) and the study's prepared data."""
    root = work / "results" / "tiny"
    cfg = load_checkpoint(root / run / "last.pt")["config"]
    data = {split: root / "data" / f"{split}.beton" for split in ("train", "val")}
    data["manifest"] = root / "data" / "manifest.json"
    return cfg, data


@pytest.fixture(scope="module")
def two_process_weights(study, tmp_path_factory) -> str:
    """The weights (rank_weights_sha256) of `torchrun --standalone --nproc_per_node 2` of the two-node run's config:
    what every two-node training, interrupted or not, must end with."""
    cfg, data = run_config_and_data(study[0], PREEMPTED)
    out = tmp_path_factory.mktemp("standalone")
    cmd = train_cmd(cfg, data, out / "run", out / "mlflow.db")
    cmd[1:3] = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "locvit"]
    proc = subprocess.run(cmd, env=env_with_venv(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole = json.loads((out / "run" / "metrics.json").read_text())
    assert whole["world_size"] == 2
    return whole["rank_weights_sha256"]


def test_a_two_node_job_trains_like_two_processes_on_one_node(study, cluster, two_process_weights):
    """The variant with resources.nodes 2 went to SLURM alone as a job of 2 nodes; locvit launch (its batch step, on
    the first node) started one torchrun per node with srun (a step of 2 tasks over both nodes), they met at the
    first node's address on the test network, and the run (preempted and resumed on the way) ended with the
    weights of `torchrun --standalone --nproc_per_node 2` of the same config."""
    work, _, _ = study
    root = work / "results" / "tiny"
    metrics = json.loads((root / PREEMPTED / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    last_job = metrics["slurm_job_ids"][-1]
    assert {j["job_id"]: j for j in cluster.sacct()}[last_job]["comment"].startswith("rule_train_")  # alone
    steps = {s["step_id"].split(".", 1)[-1]: s for s in cluster.steps(last_job)}
    both = f"{node_name(1)[:-1]}[1-2]"
    assert steps[last_job]["nodes"] == "2" and steps[last_job]["node_list"] == both, steps  # the allocation
    assert steps["batch"]["node_list"] == node_name(1), steps  # the launcher ran on the first node
    agents = [s for s in steps.values() if s["tasks"] == "2"]  # the launcher's srun: one agent per node
    assert len(agents) == 1 and agents[0]["state"] == "COMPLETED", steps
    assert (agents[0]["nodes"], agents[0]["node_list"]) == ("2", both), agents
    log = (root / "logs" / "train" / f"{TWO_NODES}.log").read_text()
    assert "locvit launch: 2 nodes x 1 processes" in log, log[-2000:]
    assert f"rendezvous at {node_name(1)}-net:" in log and "share nodes" not in log, log[-2000:]
    assert metrics["rank_weights_sha256"] == two_process_weights


def test_a_rendezvous_that_cannot_complete_fails_in_bounded_time(cluster, tmp_path):
    """Through the real srun: a job whose second node never joins (1 task for 2 nodes) ends non-zero once
    LOCVIT_RDZV_TIMEOUT has passed, with locvit's message naming the endpoint, not a hang."""
    env = {**env_with_venv(), **cluster.job_env, "LOCVIT_RDZV_TIMEOUT": "15"}
    started = time.monotonic()
    proc = subprocess.run(
        [
            "srun",
            "--ntasks=1",
            "--partition=cpu",
            "--time=5",
            str(BIN / "python"),
            "-m",
            "locvit",
            "launch",
            "--agent",
            "--nodes",
            "2",
            "--endpoint",
            "127.0.0.1:29417",
            "--rdzv-id",
            "never",
            "--",
            "train",
            "--help",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "the rendezvous of 2 nodes at 127.0.0.1:29417 did not complete" in proc.stderr, proc.stderr[-3000:]
    assert took < 120, took


def test_a_job_at_its_time_limit_stops_at_a_step_and_resumes_to_an_uninterrupted_runs_weights(study, cluster, tmp_path):
    """SLURM's warning (SIGURG, WARNING_S before the limit) reached the training process through the job step
    (Snakemake, bash and the rest ignore it): it saved last.pt at the next step and exited 75, so its job
    FAILED before the limit; the re-submitted job resumed within epoch 0 and ended with the weights an
    uninterrupted `locvit train` of the same config gets."""
    work, _, _ = study
    root = work / "results" / "tiny"
    metrics = json.loads((root / TIMED_OUT / "metrics.json").read_text())
    jobs = {j["job_id"]: j for j in cluster.sacct()}
    first, *rest = metrics["slurm_job_ids"]
    assert len(rest) == 1, metrics["slurm_job_ids"]
    assert (jobs[first]["state"], jobs[rest[0]]["state"]) == ("FAILED", "COMPLETED"), (jobs[first], jobs[rest[0]])
    assert jobs[first]["node_list"] == jobs[rest[0]]["node_list"] == node_name(2)  # the signal reached node 2's step
    log = (root / "logs" / "train" / "mait_b.log").read_text()  # the re-submitted job's
    assert "resuming after step" in log and "of epoch 1)" in log, log[-2000:]

    cfg = load_checkpoint(root / TIMED_OUT / "last.pt")["config"]
    data = {split: root / "data" / f"{split}.beton" for split in ("train", "val")}
    data["manifest"] = root / "data" / "manifest.json"
    proc = subprocess.run(
        train_cmd(cfg, data, tmp_path / "run", tmp_path / "mlflow.db"),
        env=env_with_venv(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert whole["rank_weights_sha256"] == metrics["rank_weights_sha256"]
    assert [row["val_top1"] for row in whole["history"]] == [row["val_top1"] for row in metrics["history"]]


# --- a node lost mid-run ---------------------------------------------------------------------------------------
HOLD_STEP = 22  # optimiser step 4 of epoch 1 (18 an epoch): epoch 0's last.pt written, an epoch under way
ENDS_WITHIN_S = SLURMD_TIMEOUT_S + KILL_WAIT_S + 45  # + slurmctld's ping period (SlurmdTimeout / 3) and slack


def sockets(pid: int) -> list[tuple[str, int, str, int]]:
    """A process's established TCP connections, (local address, port, remote address, port), read in its own
    network namespace (/proc/<pid>/net/tcp lists the namespace's sockets; its fds say which are the process's)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])

    def addr(field: str) -> tuple[str, int]:
        ip, port = field.split(":")
        return ".".join(str(b) for b in reversed(bytes.fromhex(ip))), int(port, 16)

    found = []
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[3] == "01" and cols[9] in inodes:  # ESTABLISHED
            found.append((*addr(cols[1]), *addr(cols[2])))
    return found


def worker(pid: int) -> dict:
    """Where a held training process runs: its rank, SLURM node, network namespace (node number), connections,
    the process group's store (MASTER_ADDR/PORT) and its torchrun's rendezvous endpoint."""
    import psutil

    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
    agent = psutil.Process(pid).parent().cmdline()
    return {
        "rank": int(env["RANK"]),
        "slurm_node": env.get("SLURMD_NODENAME"),
        "store": (env["MASTER_ADDR"], int(env["MASTER_PORT"])),
        "rdzv": agent[agent.index("--rdzv-endpoint") + 1],
        "node": next(i for i in (1, 2) if pid in NodeNetwork.pids(i)),
        "sockets": sockets(pid),
    }


def processes_of(job: str, node: int) -> list[str]:
    """A job's processes on a node (its job steps' slurmstepd, and what runs with its SLURM_JOB_ID)."""
    import psutil

    found = []
    for pid in NodeNetwork.pids(node):
        try:
            proc = psutil.Process(pid)
            cmdline = " ".join(proc.cmdline())
            ours = (proc.name() == "slurmstepd" and f"[{job}." in cmdline) or proc.environ().get("SLURM_JOB_ID") == job
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if ours:
            found.append(f"{pid} {proc.status()} {cmdline[:160]}")
    return found


def running_on(node: int) -> list[str]:
    """Every process on a node (its namespace), for the record."""
    import psutil

    found = []
    for pid in NodeNetwork.pids(node):
        try:
            found.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:100]}")
        except psutil.Error:
            pass
    return found


def sacct_states(cluster: LocalSlurm, job_id: str) -> list[str]:
    """The states of every run of a job (a requeued job's earlier runs first)."""
    out = cluster._run(["sacct", "-j", job_id, "-X", "-D", "-n", "-P", "-o", "State"])
    return [line.strip() for line in out.splitlines() if line.strip()]


def wait_until(check, timeout: float, what: str, cluster: LocalSlurm):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}\n{cluster.log_tail(15)}")


@pytest.mark.parametrize("lost", [2, 1], ids=["node2", "node1_rendezvous_host"])
def test_a_node_lost_mid_epoch_ends_the_job_which_resumes_when_it_is_back(
    study, cluster, two_process_weights, tmp_path, lost
):
    """The two-node training (the study's two-node run's config, submitted with sbatch --nodes 2 --ntasks-per-node 1
    --requeue, launched by locvit launch) is held in the middle of epoch 1 on both ranks: rank 0 on locvit1 and
    rank 1 on locvit2, each in its node's namespace, the process group's store and rendezvous at locvit1's address,
    and rank 1 connected to rank 0's address on another port (gloo's pair). Then one node is lost: its link cut,
    its slurmd and every process on it killed, as a host that dies. The survivor, waiting in a collective for the
    lost rank, is not told; slurmctld declares the lost node DOWN after SlurmdTimeout (SLURMD_TIMEOUT_S), ends the
    job (NODE_FAIL: SIGTERM, SIGKILL after KillWait) and requeues it; nothing of it is left on the survivor. When
    the node is back the job runs again, resumes from epoch 0's last.pt and ends with the uninterrupted run's
    weights. Losing locvit1 loses the batch script, the launcher and the rendezvous host too."""
    cfg, data = run_config_and_data(study[0], PREEMPTED)
    out_dir, hold = tmp_path / "run", tmp_path / "hold"
    hold.touch()
    cmd = train_cmd(cfg, data, out_dir, tmp_path / "mlflow.db")
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\nexec "
        + " ".join(
            map(shlex.quote, [cmd[0], "-m", "locvit", "launch", "--nodes", "2", "--gpus-per-node", "0", "--", *cmd[3:]])
        )
        + "\n"
    )
    env = {
        **env_with_venv(),
        **cluster.job_env,
        "LOCVIT_HOLD_AT": f"train_step_{HOLD_STEP}@{out_dir}",
        "LOCVIT_HOLD_FILE": str(hold),
    }
    submit = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=2",
            "--ntasks-per-node=1",
            "--cpus-per-task=1",
            "--mem=2000",
            "--time=10",
            "--requeue",
            "--partition=cpu",
            f"--chdir={tmp_path}",
            f"--output={tmp_path}/slurm-%j.out",
            str(script),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip().split(";")[0]
    try:
        markers = wait_until(
            lambda: len(list(tmp_path.glob("hold.*.json"))) == 2 and list(tmp_path.glob("hold.*.json")),
            300,
            "both ranks at the hold point",
            cluster,
        )
        workers = sorted((worker(json.loads(m.read_text())["pid"]) for m in markers), key=lambda w: w["rank"])
        rank0, rank1 = workers
        assert (rank0["node"], rank0["slurm_node"], rank1["node"], rank1["slurm_node"]) == (
            1,
            node_name(1),
            2,
            node_name(2),
        ), workers
        rdzv_port = int(rank0["rdzv"].rsplit(":", 1)[1])
        assert rank0["rdzv"].startswith(f"{node_name(1)}-net:") and rank0["rdzv"] == rank1["rdzv"], workers
        assert rank1["store"][0] == f"{node_name(1)}-net", workers
        one, two = node_address(1), node_address(2)
        assert any(
            s[0] == two and s[2] == one and s[3] not in (rank1["store"][1], rdzv_port) for s in rank1["sockets"]
        ), workers  # gloo: rank 1 to rank 0, between the two addresses
        assert all(s[0] in (two, "127.0.0.1") and s[2] in (one, two, "127.0.0.1") for s in rank1["sockets"]), workers

        started = time.monotonic()
        cluster.lose_node(lost)
        hold.unlink()  # the survivor goes on into the next step's all-reduce, which never completes
        survivor = 3 - lost

        def ended() -> bool:
            return "NODE_FAIL" in sacct_states(cluster, job) and not processes_of(job, survivor)

        try:
            wait_until(
                ended,
                ENDS_WITHIN_S + 60,
                f"the job to end on {node_name(survivor)} after losing {node_name(lost)}",
                cluster,
            )
        except AssertionError as failed:
            raise AssertionError(f"left on {node_name(survivor)}: {processes_of(job, survivor)}\n{failed}") from None
        took = time.monotonic() - started
        print(f"on {node_name(survivor)} once the job ended:", running_on(survivor))
        assert took < ENDS_WITHIN_S, took
        assert cluster.node_states()[node_name(lost)].startswith("down"), cluster.node_states()
        cluster.restore_node(lost)
        # SLURM makes a requeued job wait (BeginTime) about two minutes after its end; the test lets it start now
        # (as an admin could), and checks that it was requeued to wait, not dropped.
        wait_until(
            lambda: "JobState=PENDING" in cluster._run(["scontrol", "show", "job", job]),
            120,
            "the job to be requeued",
            cluster,
        )  # (once it has completed on the survivor)
        assert "Restarts=1" in cluster._run(["scontrol", "show", "job", job])
        cluster._run(["scontrol", "update", f"JobId={job}", "StartTime=now"])
        wait_until(lambda: "COMPLETED" in sacct_states(cluster, job), 300, "the requeued job to complete", cluster)
    finally:
        hold.unlink(missing_ok=True)
        subprocess.run(["scancel", job], env=cluster.env, capture_output=True, timeout=60)
        if not cluster.node_states().get(node_name(lost), "idle").startswith(("idle", "alloc", "mix")):
            cluster.restore_node(lost)  # the next test needs both nodes
    assert sacct_states(cluster, job) == ["NODE_FAIL", "COMPLETED"], sacct_states(cluster, job)
    log = (tmp_path / f"slurm-{job}.out").read_text()
    assert "resum" in log.lower(), log[-3000:]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert [row["epoch"] for row in metrics["history"]] == [0, 1]
    assert metrics["rank_weights_sha256"] == two_process_weights
    print(
        f"{node_name(lost)} lost: the job ended {took:.0f} s later (SlurmdTimeout {SLURMD_TIMEOUT_S} s, "
        f"KillWait {KILL_WAIT_S} s)"
    )
