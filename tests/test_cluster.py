"""`snakemake --profile cluster all` through a real one-node SLURM cluster (`make test-cluster`).

tests/slurm_cluster.py brings up munged, MariaDB, slurmdbd, slurmctld and slurmd in a
private folder; the tiny study then runs through the SLURM executor exactly as the
README says, with the per-rule sizes scaled down to this machine on the command line
(the one node has 2 CPUs and no GPU). One variant trains over "two nodes": its job has 2 SLURM
tasks on the one node, each running one torchrun of one gloo process, through the same
rule and launcher (locvit launch: srun, c10d rendezvous) a real two-node job uses, and
ends with the weights of 2 processes on one node. That job is also preempted: it holds after its
first epoch's checkpoint (LOCVIT_HOLD_AT, tests/faultinject), the test `scancel`s it,
Snakemake's retry re-submits it and it resumes from last.pt into the same MLflow run.
Another meets its time limit: its variant's group job has a 5-minute limit with the
profile's warning signal 60 s before; the run stalls mid-epoch (LOCVIT_STALL_AT) until
the signal comes, stops at the next step, and the re-submitted job resumes it to the
weights of an uninterrupted run. The profile's grouping sends each variant's (and each
mask-search round's) train, evaluate and analyse jobs to SLURM as one job, except the
two-node training job, which goes alone.

Skipped, with the reason, unless LOCVIT_CLUSTER_TEST=1 (set by `make test-cluster`), and
where the cluster cannot run (not root, packages missing).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import BIN, REPO, copy_workflow, env_with_venv, seed_runs, train_cmd
from locvit.checkpoint import load_checkpoint
from slurm_cluster import LocalSlurm, node_overrides, unavailable

pytestmark = pytest.mark.cluster
TINY = "presets/tiny.yaml"
PREEMPTED = "runs/deit_a/seed0"  # the training run the test cancels after its first epoch
TWO_NODES = "deit_a"  # the variant that trains on 2 nodes (2 SLURM tasks on the one node)
TIMED_OUT = "runs/mait_b/seed0"  # the training run that meets its time limit in the middle of epoch 0
STALL_STEP = 5  # of 18 per epoch
TIME_LIMIT = {"train": 3, "evaluate": 1, "analyse": 1}  # minutes: a variant's group job gets their sum (5)
WARNING_S = 60


def small_node_overrides() -> list[str]:
    """The profile's sizes fitted to the one node; the variant groups' jobs get a 5-minute limit (TIME_LIMIT)
    and the warning WARNING_S before it."""
    return node_overrides(TIME_LIMIT, 30, f"'--signal=URG@{WARNING_S}'")


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
        with LocalSlurm() as slurm:
            yield slurm
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    env = {**env_with_venv(), **{k: v for k, v in cluster.env.items() if k == "SLURM_CONF"},
           "LOCVIT_HOLD_AT": f"after_epoch_0@{PREEMPTED}", "LOCVIT_HOLD_FILE": str(hold),
           "LOCVIT_STALL_AT": f"train_step_{STALL_STEP}@{TIMED_OUT}", "LOCVIT_STALL_FILE": str(stall)}
    done, record = threading.Event(), {}
    watcher = threading.Thread(target=preempt_once, args=(cluster, hold, done, record), daemon=True)
    watcher.start()
    started = time.monotonic()
    proc = subprocess.run(
        [str(BIN / "snakemake"), "--profile", "cluster", "all", "--config", f"params={TINY}",
         "--slurm-init-seconds-before-status-checks", "2", *small_node_overrides()],
        cwd=work, env=env, capture_output=True, text=True, timeout=1800)
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
    except the two-node variant's training, alone (its evaluate and analyse grouped): 10 submissions for the
    tiny study where 17 jobs ran, plus one re-submission each for the preempted and the timed-out run."""
    work, out, _ = study
    jobs = cluster.sacct()
    params = yaml.safe_load((work / TINY).read_text())
    variants, rounds = len(params["variants"]), params["mask_search"]["rounds"]
    assert submitted(jobs) == {
        "prepare": 1, "report": 1, "search": 1, "search_spec": rounds, "throughput": 1,
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
        assert job["state"] == "COMPLETED" and job["comment"].startswith(("rule_variant_", "rule_search_round_",
                                                                          "rule_train_"))


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


def test_a_two_node_job_trains_like_two_processes_on_one_node(study, cluster, tmp_path):
    """The variant with resources.nodes 2 went to SLURM with 2 tasks; locvit launch started one torchrun
    per task with srun, they met at the job's first node, and the run (preempted and resumed on the way)
    ended with the weights of `torchrun --standalone --nproc_per_node 2` of the same config."""
    work, _, _ = study
    root = work / "results" / "tiny"
    metrics = json.loads((root / PREEMPTED / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    last_job = metrics["slurm_job_ids"][-1]
    assert {j["job_id"]: j for j in cluster.sacct()}[last_job]["comment"].startswith("rule_train_")  # alone
    steps = cluster.steps(last_job)  # the batch step, the launcher's srun of the agents
    assert any(s["tasks"] == "2" and s["state"] == "COMPLETED" for s in steps), steps
    log = (root / "logs" / "train" / f"{TWO_NODES}.log").read_text()
    assert "locvit launch: 2 nodes x 1 processes" in log and "rendezvous at" in log, log[-2000:]

    cfg = load_checkpoint(root / PREEMPTED / "last.pt")["config"]
    data = {split: root / "data" / f"{split}.beton" for split in ("train", "val")}
    data["manifest"] = root / "data" / "manifest.json"
    cmd = train_cmd(cfg, data, tmp_path / "run", tmp_path / "mlflow.db")
    cmd[1:3] = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "-m", "locvit"]
    proc = subprocess.run(cmd, env=env_with_venv(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert whole["world_size"] == 2
    assert whole["rank_weights_sha256"] == metrics["rank_weights_sha256"]


def test_a_rendezvous_that_cannot_complete_fails_in_bounded_time(cluster, tmp_path):
    """Through the real srun: a job whose second node never joins (1 task for 2 nodes) ends non-zero once
    LOCVIT_RDZV_TIMEOUT has passed, with locvit's message naming the endpoint, not a hang."""
    env = {**env_with_venv(), **{k: v for k, v in cluster.env.items() if k == "SLURM_CONF"},
           "LOCVIT_RDZV_TIMEOUT": "15"}
    started = time.monotonic()
    proc = subprocess.run(
        ["srun", "--ntasks=1", "--partition=cpu", "--time=5", str(BIN / "python"), "-m", "locvit", "launch",
         "--agent", "--nodes", "2", "--endpoint", "127.0.0.1:29417", "--rdzv-id", "never", "--", "train", "--help"],
        env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    took = time.monotonic() - started
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "the rendezvous of 2 nodes at 127.0.0.1:29417 did not complete" in proc.stderr, proc.stderr[-3000:]
    assert took < 120, took


def test_a_job_at_its_time_limit_stops_at_a_step_and_resumes_to_an_uninterrupted_runs_weights(study, cluster,
                                                                                                 tmp_path):
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
    log = (root / "logs" / "train" / "mait_b.log").read_text()  # the re-submitted job's
    assert "resuming after step" in log and "of epoch 1)" in log, log[-2000:]

    cfg = load_checkpoint(root / TIMED_OUT / "last.pt")["config"]
    data = {split: root / "data" / f"{split}.beton" for split in ("train", "val")}
    data["manifest"] = root / "data" / "manifest.json"
    proc = subprocess.run(train_cmd(cfg, data, tmp_path / "run", tmp_path / "mlflow.db"), env=env_with_venv(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert whole["rank_weights_sha256"] == metrics["rank_weights_sha256"]
    assert [row["val_top1"] for row in whole["history"]] == [row["val_top1"] for row in metrics["history"]]
