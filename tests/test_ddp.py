"""DDP: two CPU processes (gloo) under torchrun train one run, as rank 0 records it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
import torch
from helpers import BIN, config_file, copy_workflow, env_with_venv, seed_runs

from locvit import models
from locvit.checkpoint import load_checkpoint, weights_digest
from locvit.config.run import peak_lr, run_config
from locvit.train.distributed import Dist, shard_size
from locvit.train.loop import per_process_batch


def ddp_cmd(cfg: dict, prepared: dict, root) -> list[str]:
    """torchrun: two gloo processes training ``cfg`` into root/run, tracked in root/mlflow.db."""
    return [
        str(BIN / "torchrun"),
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "locvit",
        "train",
        "--run-config",
        config_file(cfg, root / "run.config.json"),
        "--train-data",
        str(prepared["train"]),
        "--val-data",
        str(prepared["val"]),
        "--manifest",
        str(prepared["manifest"]),
        "--out-dir",
        str(root / "run"),
        "--tracking-db",
        str(root / "mlflow.db"),
        "--threads",
        "1",
        "--no-progress",
    ]


@pytest.fixture(scope="module")
def ddp_run(tiny_params, prepared, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ddp")
    cfg = run_config(tiny_params, "deit_a", 0)
    cfg["train"].update(epochs=2, lr_scale_batch=64)
    proc = subprocess.run(
        ddp_cmd(cfg, prepared, root), env=env_with_venv(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"root": root, "run": root / "run", "cfg": cfg, "stdout": proc.stdout}


@pytest.mark.e2e
def test_two_processes_end_with_equal_weights_in_one_mlflow_run(ddp_run):
    import mlflow

    metrics = json.loads((ddp_run["run"] / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and len(metrics["history"]) == 2
    # Each rank hashed its own weights after training; both equal the checkpoint rank 0 wrote.
    last = load_checkpoint(ddp_run["run"] / "last.pt")
    assert metrics["rank_weights_sha256"] == [weights_digest(last["model"])] * 2
    assert last["world_size"] == 2 and len(last["rng"]) == 2  # each rank's generators, to resume from
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{ddp_run['root'] / 'mlflow.db'}")
    runs = seed_runs(client, ddp_run["cfg"]["study"])
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["world_size"] == "2" and float(runs[0].data.params["lr_peak"]) == 0.002
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_top1")] == [0, 1]
    epoch_lines = [line for line in ddp_run["stdout"].splitlines() if line.startswith("[deit_a seed 0] epoch")]
    assert len(epoch_lines) == 2  # rank 0 alone prints


@pytest.mark.e2e
def test_a_ddp_checkpoint_loads_in_one_process(ddp_run, prepared):
    best = load_checkpoint(ddp_run["run"] / "best.pt")
    assert not any(k.startswith(("module.", "_orig_mod.")) for k in best["model"])
    model = models.load(best, "cpu")
    with torch.no_grad():
        assert model(torch.randn(2, 3, 16, 16)).shape == (2, 10)


@pytest.mark.e2e
def test_two_nodes_of_one_process_end_with_the_weights_of_two_processes_on_one_node(ddp_run, prepared, tmp_path):
    """`locvit launch --agent` twice, as the two SLURM tasks of a two-node job start it (node rank from
    LOCVIT_NODE_RANK here, SLURM_PROCID there): torchrun's c10d rendezvous, node 0 hosting it, world size 2;
    the same weights as torchrun --standalone --nproc_per_node 2."""
    from locvit.train.launch import free_port

    cmd = ddp_cmd(ddp_run["cfg"], prepared, tmp_path)
    args = cmd[cmd.index("train") :]  # after torchrun's arguments
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        subprocess.Popen(
            [
                str(BIN / "python"),
                "-m",
                "locvit",
                "launch",
                "--agent",
                "--nodes",
                "2",
                "--endpoint",
                endpoint,
                "--rdzv-id",
                "two-nodes",
                "--",
                *args,
            ],
            env={**env_with_venv(), "LOCVIT_NODE_RANK": str(node), "LOCVIT_RDZV_TIMEOUT": "120"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for node in (0, 1)
    ]
    outs = [agent.communicate(timeout=300) for agent in agents]
    assert [a.returncode for a in agents] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    reference = json.loads((ddp_run["run"] / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    assert metrics["rank_weights_sha256"] == reference["rank_weights_sha256"]
    assert [r["val_top1"] for r in metrics["history"]] == [r["val_top1"] for r in reference["history"]]


def test_the_batch_is_global():
    recipe = {"batch_size": 64, "mixup": 0.0, "cutmix": 0.0, "lr": 5e-4, "lr_scale_batch": None}
    assert per_process_batch(recipe, 1) == 64 and per_process_batch(recipe, 4) == 16
    with pytest.raises(ValueError, match="must split evenly over the 3 processes"):
        per_process_batch(recipe, 3)
    with pytest.raises(ValueError, match="must be even"):
        per_process_batch({**recipe, "batch_size": 6, "cutmix": 1.0}, 2)
    assert peak_lr(recipe) == 5e-4
    assert peak_lr({**recipe, "batch_size": 1024, "lr_scale_batch": 512}) == pytest.approx(1e-3)  # DeiT


def test_every_validation_image_is_scored_once_over_the_ranks():
    for n, world in [(270, 2), (270, 4), (7, 8), (1, 3)]:
        assert sum(shard_size(n, Dist(r, r, world)) for r in range(world)) == n


@pytest.mark.e2e
def test_the_train_rule_starts_torchrun_for_several_gpus(tmp_path):
    work = copy_workflow(tmp_path)
    target = "results/tiny/runs/deit_a/seed0/metrics.json"
    # Under the cluster profile: a local run cuts a job's GPUs to the machine's (none here; tests/test_resources.py)
    out = subprocess.run(
        [
            str(BIN / "snakemake"),
            "-n",
            "-p",
            "--profile",
            "cluster",
            "--cores",
            "4",
            "--config",
            "params=presets/tiny.yaml",
            "--set-threads",
            "train=4",
            "--set-resources",
            "train:gpu=2",
            "--",
            target,
        ],
        cwd=work,
        env=env_with_venv(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    command = next(line for line in out.stdout.splitlines() if " train --run-config" in line)
    assert " -m torch.distributed.run --standalone --nproc_per_node 2 -m locvit train" in command
    assert "--threads 4" in command  # the job's 4 threads: locvit train shares them over its 2 processes


@pytest.mark.e2e
def test_a_stop_request_to_one_rank_stops_both_after_the_same_step_and_resumes_equal(ddp_run, prepared, tmp_path):
    """SIGUSR1 to one of the two processes, held after step 3: both stop after step 6, the next read of
    train.read_every 3 (the flag is all-reduced there), last.pt holds both ranks' generators, and the
    resumed run ends bitwise equal to the uninterrupted one (read_every 50)."""
    cfg = {**ddp_run["cfg"], "train": {**ddp_run["cfg"]["train"], "read_every": 3}}
    hold = tmp_path / "hold"
    hold.touch()
    env = {**env_with_venv(), "LOCVIT_HOLD_AT": "train_step_3", "LOCVIT_HOLD_FILE": str(hold)}
    proc = subprocess.Popen(
        ddp_cmd(cfg, prepared, tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 240
    while len(list(tmp_path.glob("hold.*.json"))) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    markers = sorted(tmp_path.glob("hold.*.json"))
    assert len(markers) == 2, proc.communicate(timeout=60)[0][-3000:]
    os.kill(json.loads(markers[0].read_text())["pid"], signal.SIGUSR1)  # one rank only
    hold.unlink()
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "stopped on request after step 6 (epoch 1, batch 6 of 18)" in out, out[-3000:]
    state = load_checkpoint(tmp_path / "run" / "last.pt")
    assert state["step"] == 6 and state["partial"]["batches"] == 6 and len(state["rng"]) == 2
    proc = subprocess.run(
        ddp_cmd(cfg, prepared, tmp_path), env=env_with_venv(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "resuming after step 6" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    whole = load_checkpoint(ddp_run["run"] / "last.pt")
    resumed = load_checkpoint(tmp_path / "run" / "last.pt")
    assert weights_digest(resumed["model"]) == weights_digest(whole["model"])
