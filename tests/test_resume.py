"""Resume: a run killed (SIGKILL) after an epoch continues where it stopped, bitwise, into the same MLflow run.

One uninterrupted `locvit train` and one that SIGKILLs itself right after writing the
second epoch's last.pt (LOCVIT_KILL_AT, tests/faultinject), then started again with the same command; both on CPU
with a fixed seed and FFCV's loader uncompiled (its augmentations then draw from the seeded numpy
generator), with EMA on so the average is carried over too.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import torch
from helpers import env_with_venv, seed_runs, train_cmd

from locvit.checkpoint import load_checkpoint, save_checkpoint
from locvit.config.run import run_config
from locvit.errors import EXIT_STOPPED
from locvit.train.state import plan_run

EPOCHS = 3

pytestmark = pytest.mark.e2e  # every test reads the runs of `locvit train` processes


@pytest.fixture(scope="module")
def cfg(tiny_params) -> dict:
    cfg = run_config(tiny_params, "deit_a", 0)
    cfg["train"].update(epochs=EPOCHS, ema=True, ema_decay=0.9, lr_scale_batch=128)
    return cfg


def run_ok(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, env=env_with_venv(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def kill_after_epoch(cmd: list[str], epoch: int) -> None:
    """Run ``cmd`` and have it SIGKILL itself once epoch ``epoch`` (0-based) is checkpointed."""
    kill_at(cmd, f"after_epoch_{epoch}")


def kill_at(cmd: list[str], point: str) -> None:
    """Run ``cmd`` and have it SIGKILL itself at ``point`` (tests/faultinject)."""
    env = {**env_with_venv(), "LOCVIT_KILL_AT": point}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, f"the run was not killed (rc {proc.returncode}): {proc.stderr[-2000:]}"


@pytest.fixture(scope="module")
def runs(cfg, prepared, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("resume")
    # The uninterrupted run goes alongside the one that is killed (one thread each).
    whole = subprocess.Popen(
        train_cmd(cfg, prepared, root / "whole", root / "whole.db"),
        env=env_with_venv(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cut = root / "cut"
    kill_after_epoch(train_cmd(cfg, prepared, cut, root / "cut.db"), 1)
    out, _ = whole.communicate(timeout=300)
    assert whole.returncode == 0, out[-3000:]
    killed_at = load_checkpoint(cut / "last.pt")["epoch"]
    metrics_after_kill = (cut / "metrics.json").exists()
    out = run_ok(train_cmd(cfg, prepared, cut, root / "cut.db"))
    return {
        "root": root,
        "whole": root / "whole",
        "cut": cut,
        "killed_at": killed_at,
        "metrics_after_kill": metrics_after_kill,
        "resume_stdout": out,
    }


def test_a_killed_run_resumes_to_the_same_weights_and_history(runs):
    assert runs["killed_at"] == 1  # killed right after the second epoch's last.pt
    assert not runs["metrics_after_kill"]
    assert f"resuming after epoch 2 of {EPOCHS}" in runs["resume_stdout"]
    trained = [line for line in runs["resume_stdout"].splitlines() if line.startswith("[deit_a seed 0] epoch")]
    assert len(trained) == 1 and f"epoch {EPOCHS}/{EPOCHS}" in trained[0]  # only the last epoch ran again
    whole, cut = load_checkpoint(runs["whole"] / "last.pt"), load_checkpoint(runs["cut"] / "last.pt")
    for part in ("model", "ema", "best_model"):
        assert whole[part].keys() == cut[part].keys()
        for name in whole[part]:
            assert torch.equal(whole[part][name], cut[part][name]), f"{part}.{name} differs"
    for a, b in zip(whole["optimizer"]["state"].values(), cut["optimizer"]["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert whole["step"] == cut["step"]

    def history(run):
        rows = json.loads((run / "metrics.json").read_text())["history"]
        return [{k: v for k, v in row.items() if k != "train_images_per_s"} for row in rows]  # timing differs

    assert len(history(runs["whole"])) == EPOCHS and history(runs["cut"]) == history(runs["whole"])
    best_whole, best_cut = load_checkpoint(runs["whole"] / "best.pt"), load_checkpoint(runs["cut"] / "best.pt")
    assert best_cut["weights"] == "ema" and best_cut["epoch"] == best_whole["epoch"]
    assert all(torch.equal(best_whole["model"][k], best_cut["model"][k]) for k in best_whole["model"])


def test_a_resumed_run_is_one_finished_mlflow_run(runs, cfg):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{runs['root'] / 'cut.db'}")
    found = seed_runs(client, cfg["study"])
    assert len(found) == 1
    run = found[0]
    assert run.info.status == "FINISHED"
    points = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "val_top1"))
    history = json.loads((runs["cut"] / "metrics.json").read_text())["history"]
    assert points == [(row["epoch"], row["val_top1"]) for row in history] and [s for s, _ in points] == [0, 1, 2]
    assert json.loads((runs["cut"] / "metrics.json").read_text())["mlflow_run_id"] == run.info.run_id


def test_a_run_killed_before_its_params_were_logged_gets_them_when_it_resumes(runs, cfg, prepared, tmp_path):
    """Killed once its MLflow run exists and its id is recorded, before its params and datasets are
    logged: the resumed run logs them into that run, as the uninterrupted run has them."""
    import mlflow

    db = tmp_path / "mlflow.db"
    cmd = train_cmd(cfg, prepared, tmp_path / "run", db)
    kill_at(cmd, "run_created")
    run_ok(cmd)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    (run,) = seed_runs(client, cfg["study"])
    whole_client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{runs['root'] / 'whole.db'}")
    (whole,) = seed_runs(whole_client, cfg["study"])
    assert run.info.status == "FINISHED" and run.data.params and run.data.params == whole.data.params
    datasets = [{(d.dataset.name, d.dataset.digest) for d in r.inputs.dataset_inputs} for r in (run, whole)]
    assert datasets[0] and datasets[0] == datasets[1]


def test_what_a_run_folder_decides(runs, cfg, prepared, tmp_path):
    data_hash = prepared["manifest_data"]["data_hash"]
    assert plan_run(cfg, data_hash, runs["cut"]).action == "skip"  # finished: not retrained

    changed = {**cfg, "train": {**cfg["train"], "lr": 0.001}}
    plan = plan_run(changed, data_hash, runs["cut"])
    assert plan.action == "fresh" and "train.lr 0.002 -> 0.001" in plan.message
    assert plan_run(cfg, "another-data-hash", runs["cut"]).action == "fresh"

    folder = tmp_path / "run"
    shutil.copytree(runs["cut"], folder)
    (folder / "metrics.json").unlink()  # what Snakemake does before re-running a finished job
    plan = plan_run(cfg, data_hash, folder)
    assert plan.action == "fresh" and "finished run" in plan.message
    # A job of several runs (train_jobs: per_variant) that Snakemake re-runs keeps its finished runs.
    plan = plan_run(cfg, data_hash, folder, keep_finished=True)
    assert plan.action == "resume" and "not retraining" in plan.message

    state = load_checkpoint(folder / "last.pt")
    save_checkpoint(folder / "last.pt", {**state, "finished": False})  # killed before metrics.json
    plan = plan_run(cfg, data_hash, folder)
    assert plan.action == "resume" and plan.state["epoch"] == EPOCHS - 1


def test_a_finished_run_is_restored_not_retrained_when_asked(runs, cfg, prepared, tmp_path):
    """Snakemake removed best.pt and metrics.json (it re-runs a variant's job): --keep-finished puts them back
    from last.pt, with the weights, history and MLflow run of the finished run, and trains nothing."""
    from locvit.train.loop import train_run

    folder = tmp_path / "run"
    shutil.copytree(runs["whole"], folder)
    shutil.copy2(runs["root"] / "whole.db", tmp_path / "mlflow.db")  # its MLflow run, to be closed again
    before = json.loads((folder / "metrics.json").read_text())
    (folder / "metrics.json").unlink()
    (folder / "best.pt").unlink()
    after = train_run(
        cfg,
        prepared["train"],
        prepared["val"],
        prepared["manifest"],
        folder,
        tmp_path / "mlflow.db",
        show_progress=False,
        threads=1,
        keep_finished=True,
    )
    for key in ("history", "rank_weights_sha256", "best_epoch", "train_time_s", "mlflow_run_id"):
        assert after[key] == before[key], key
    assert json.loads((folder / "metrics.json").read_text())["history"] == before["history"]
    assert load_checkpoint(folder / "best.pt")["epoch"] == before["best_epoch"]


def test_a_run_stopped_by_signal_within_an_epoch_resumes_at_that_step_to_the_same_weights(
    runs, cfg, prepared, tmp_path
):
    """SIGUSR1 (what a SLURM job's warning before its time limit becomes) in the middle of the second epoch:
    `locvit train` saves last.pt at its next read (train.read_every 5 here, 50 in the uninterrupted run) and
    exits with EXIT_STOPPED; run again, it continues at that step and ends bitwise equal to the
    uninterrupted run, in one MLflow run."""
    import mlflow

    cfg = {**cfg, "train": {**cfg["train"], "read_every": 5}}
    per_epoch = load_checkpoint(runs["whole"] / "last.pt")["step"] // EPOCHS
    at = per_epoch + per_epoch // 2  # optimiser step (0-based) in the middle of epoch 1
    stop = -(-(at + 1) // 5) * 5  # optimiser steps done at the next read
    assert stop < 2 * per_epoch
    hold = tmp_path / "hold"
    hold.touch()
    env = {**env_with_venv(), "LOCVIT_HOLD_AT": f"train_step_{at}", "LOCVIT_HOLD_FILE": str(hold)}
    out, db = tmp_path / "run", tmp_path / "mlflow.db"
    proc = subprocess.Popen(
        train_cmd(cfg, prepared, out, db), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 240
    while not list(tmp_path.glob("hold.*.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGUSR1)  # while it holds after step `at`
    hold.unlink()
    log, _ = proc.communicate(timeout=300)
    assert proc.returncode == EXIT_STOPPED, log[-3000:]
    state = load_checkpoint(out / "last.pt")
    assert (state["epoch"], state["step"], state["partial"]["batches"]) == (0, stop, stop - per_epoch), log
    assert not (out / "metrics.json").exists() and "run it again to resume" in log

    resumed = run_ok(train_cmd(cfg, prepared, out, db))
    assert f"resuming after step {stop} (batch {stop - per_epoch} of epoch 2)" in resumed
    whole, cut = load_checkpoint(runs["whole"] / "last.pt"), load_checkpoint(out / "last.pt")
    for part in ("model", "ema", "best_model"):
        assert all(torch.equal(whole[part][k], cut[part][k]) for k in whole[part]), part
    for a, b in zip(whole["optimizer"]["state"].values(), cut["optimizer"]["state"].values()):
        assert all(torch.equal(a[k], b[k]) for k in a)
    for a, b in zip(whole["history"], cut["history"]):
        assert {k: v for k, v in a.items() if k != "train_images_per_s"} == {
            k: v for k, v in b.items() if k != "train_images_per_s"
        }
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    found = seed_runs(client, cfg["study"])
    assert [r.info.status for r in found] == ["FINISHED"]
