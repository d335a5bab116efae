"""Numerical faults: NaN losses injected at chosen steps (LOCVIT_NAN_AT, tests/faultinject).

Up to ``train.max_bad_steps`` such steps are skipped and the run finishes; one more stops
it with a message naming the key, its MLflow run marked FAILED and its last.pt, the last
good epoch's, kept. An epoch whose every step was skipped took no optimiser step: the run
stops there, before any result.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from helpers import config_file, env_with_venv, seed_runs, train_cmd

from locvit.config.run import run_config

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cfg(tiny_params) -> dict:
    cfg = run_config(tiny_params, "deit_a", 0)
    cfg["train"].update(epochs=2)
    return cfg


def steps_per_epoch(cfg: dict, prepared: dict) -> int:
    n_train = sum(prepared["manifest_data"]["splits"]["train"]["class_counts"])
    return n_train // cfg["train"]["batch_size"]  # the training loader drops the last partial batch


def train(cfg: dict, prepared: dict, out_dir, db, nan_at: list[int]) -> subprocess.CompletedProcess:
    env = {**env_with_venv(), "LOCVIT_NAN_AT": ",".join(map(str, nan_at))}
    return subprocess.run(train_cmd(cfg, prepared, out_dir, db), env=env, capture_output=True, text=True, timeout=300)


def mlflow_run(db, run_id: str):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}").get_run(run_id)


def test_bad_steps_within_the_budget_are_skipped(cfg, prepared, tmp_path):
    cfg = {**cfg, "train": {**cfg["train"], "max_bad_steps": 2}}
    proc = train(cfg, prepared, tmp_path / "run", tmp_path / "mlflow.db", nan_at=[1, 2])
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert [row["bad_steps"] for row in metrics["history"]] == [2, 0]
    assert all(
        torch.isfinite(v).all() for v in torch.load(tmp_path / "run" / "best.pt", weights_only=True)["model"].values()
    )
    assert mlflow_run(tmp_path / "mlflow.db", metrics["mlflow_run_id"]).info.status == "FINISHED"


def test_one_bad_step_too_many_stops_the_run_and_keeps_the_last_good_epoch(cfg, prepared, tmp_path):
    cfg = {**cfg, "train": {**cfg["train"], "max_bad_steps": 1}}
    second_epoch = steps_per_epoch(cfg, prepared) + 3
    proc = train(cfg, prepared, tmp_path / "run", tmp_path / "mlflow.db", nan_at=[1, second_epoch])
    assert proc.returncode == 1, proc.stderr[-3000:]
    message = proc.stderr.strip().splitlines()[-1]
    assert f"training stopped at step {second_epoch}" in message and "train.max_bad_steps = 1" in message
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.json").exists()
    last = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert last["epoch"] == 0  # epoch 0 finished (its one bad step skipped); epoch 1 never saved
    assert all(torch.isfinite(v).all() for v in last["model"].values())
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = seed_runs(client, cfg["study"])
    assert run.info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val_top1")] == [0]


def test_an_epoch_without_an_optimiser_step_stops_the_run_before_any_result(cfg, prepared, tmp_path):
    """Every step of the first epoch bad, within a budget that allows them all: not one optimiser step, so the
    run stops with the reason (a user's error, one line) and writes no result (no metrics.json, no best.pt)."""
    cfg = {**cfg, "train": {**cfg["train"], "max_bad_steps": 1000}}
    n = steps_per_epoch(cfg, prepared)
    proc = train(cfg, prepared, tmp_path / "run", tmp_path / "mlflow.db", nan_at=list(range(n)))
    assert proc.returncode == 1, proc.stderr[-3000:]
    message = proc.stderr.strip().splitlines()[-1]
    assert f"an epoch took no optimiser step: all its {n} step(s) had a NaN or inf loss or gradient" in message
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "metrics.json").exists() and not (tmp_path / "run" / "best.pt").exists()
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = seed_runs(client, cfg["study"])
    assert run.info.status == "FAILED"


def test_prepare_killed_mid_write_leaves_nothing_a_later_step_trusts(tiny_params, tmp_path):
    """SIGKILL after val.beton is written under its temporary name, before the rename (LOCVIT_KILL_AT)."""
    import signal

    from locvit.data.prepare import load_manifest
    from locvit.io import sha256_file

    out = tmp_path / "data"
    files = {s: out / f"{s}.beton" for s in ("train", "val", "test")}
    cmd = [
        sys.executable,
        "-m",
        "locvit",
        "prepare",
        "--data-config",
        config_file(tiny_params["data"], tmp_path / "data_config.json"),
        *(a for s in files for a in (f"--{s}", str(files[s]))),
        "--manifest",
        str(out / "manifest.json"),
    ]
    killed = subprocess.run(
        cmd,
        env={**env_with_venv(), "LOCVIT_KILL_AT": "before_rename_val.beton"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert files["train"].is_file() and not files["val"].exists() and not files["test"].exists()
    assert not (out / "manifest.json").exists()  # written last: without it no step reads the files
    assert list(out.glob(".val.beton.*.tmp"))  # the whole file, under a name nothing reads
    with pytest.raises(
        FileNotFoundError, match="manifest.json.*Rebuild the prepared data: snakemake .*--forcerun prepare"
    ):
        load_manifest(out / "manifest.json", {"train": files["train"]})

    again = subprocess.run(cmd, env=env_with_venv(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    manifest = load_manifest(out / "manifest.json", files)
    for split, path in files.items():
        assert manifest["splits"][split]["file_sha256"] == sha256_file(path)


def test_atomic_writes_get_the_mode_a_plain_write_gets(tmp_path):
    """The temporary file of an atomic write is created 0600; the result must be readable as any file the
    process writes (a results folder shared on a cluster), and no temporary file stays behind."""
    import os

    from locvit.io import write_text

    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    write_text(tmp_path / "atomic.txt", "x")
    assert oct((tmp_path / "atomic.txt").stat().st_mode & 0o777) == oct(plain.stat().st_mode & 0o777)
    assert sorted(os.listdir(tmp_path)) == ["atomic.txt", "plain.txt"]


def test_the_fault_hooks_come_from_the_tests_and_fire(tmp_path):
    """The points live in tests/faultinject (on the subprocesses' PYTHONPATH), not in locvit."""
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "locvit"
    assert not [p for p in src.rglob("*.py") if "LOCVIT_KILL_AT" in p.read_text() or "kill_point" in p.read_text()]
    write = f"from locvit.io import write_text; write_text({str(tmp_path / 'x.txt')!r}, 'x')"
    killed = subprocess.run(
        [sys.executable, "-c", write], env={**env_with_venv(), "LOCVIT_KILL_AT": "before_rename_x.txt"}
    )
    assert killed.returncode == -9 and not (tmp_path / "x.txt").exists()  # SIGKILLed before the rename
    plain = subprocess.run([sys.executable, "-c", write], env=env_with_venv())
    assert plain.returncode == 0 and (tmp_path / "x.txt").read_text() == "x"
