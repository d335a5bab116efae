"""Tracking with many jobs at once: concurrent writers, SLURM provenance, a backend that is gone, sync-tracking.

Real `locvit train` processes (tiny preset, CPU, one thread each), four at a time, into
one SQLite file and into a real `mlflow server`; a run whose tracking server does not
exist and one whose server is killed mid-run, both uploaded afterwards with
`locvit sync-tracking`. Eleven training processes in all (their imports dominate), in
three phases that overlap as much as they can (:func:`trained`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from helpers import BIN, create_and_die, env_with_venv, free_port, train_cmd

from locvit import cli, tracking
from locvit.config.run import run_config
from locvit.tracking.run import SYSTEM_METRICS_ENV
from locvit.tracking.tree import PARENT, ROLE, find, study_tags, variant_tags

EPOCHS = 2
RUNS = [("deit_a", 0), ("deit_a", 1), ("mait_b", 0), ("mait_b", 1)]
KEYS = {"train_loss", "train_top1", "train_images_per_s", "lr", "val_loss", "val_top1"}  # one value per epoch
SAMPLED = {SYSTEM_METRICS_ENV: "0.5"}  # system metrics sampled often enough for runs of a few seconds


@pytest.fixture(autouse=True)
def quick_http(monkeypatch):
    """This process's MLflow client gives up on a dead server in seconds, not minutes."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")


def start(cmd: list[str], **env: str) -> subprocess.Popen:
    """Start ``cmd``; its output goes to files (a pipe nobody reads yet could block it mid-transaction)."""
    full = {**env_with_venv(), "PYTHONFAULTHANDLER": "1", **env}  # a hung process dumps its stacks on SIGABRT
    logs = Path(tempfile.mkdtemp(prefix="locvit-proc-"))
    with open(logs / "out", "w") as out, open(logs / "err", "w") as err:  # the child keeps its own copies
        proc = subprocess.Popen(cmd, env=full, stdout=out, stderr=err)
    proc.logs = logs
    return proc


def finish(proc: subprocess.Popen, rc: int = 0, timeout: float = 300) -> tuple[str, str]:
    """Wait for ``proc``; its stdout and stderr."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        proc.wait()
    out, err = ((proc.logs / name).read_text() for name in ("out", "err"))
    shutil.rmtree(proc.logs)
    assert proc.returncode == rc, f"rc {proc.returncode} (-6: hung for {timeout} s)\n{out[-2000:]}\n{err[-6000:]}"
    return out, err


class Server:
    """`mlflow server` on 127.0.0.1 with a SQLite backend and proxied artifacts in ``root``."""

    def __init__(self, root: Path, workers: int = 2):
        self.root, self.port = root, free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.log = open(root / f"server-{self.port}.log", "w")
        self.proc = subprocess.Popen(
            [
                str(BIN / "mlflow"),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                str(workers),
                "--backend-store-uri",
                f"sqlite:///{root / 'server.db'}",
                "--artifacts-destination",
                str(root / "art"),
            ],
            env=env_with_venv(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 120) -> None:
        import requests

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, (self.root / f"server-{self.port}.log").read_text()[-3000:]
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.uri}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"mlflow server on {self.uri} did not start")

    def kill(self) -> None:
        """SIGKILL the server and its workers (its own process group): a crash, not a shutdown."""
        with contextlib.suppress(ProcessLookupError):  # the group may be gone already
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.log.close()


@contextlib.contextmanager
def env_uri(monkeypatch, uri: str | None):
    """MLFLOW_TRACKING_URI for an in-process call; tracking.setup sets it, so it is put back afterwards."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "unset")
    if uri:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    else:
        monkeypatch.delenv("MLFLOW_TRACKING_URI")
    yield
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def configs(tiny_params) -> dict:
    out = {}
    for variant, seed in RUNS:
        cfg = run_config(tiny_params, variant, seed)
        cfg["train"]["epochs"] = EPOCHS
        out[(variant, seed)] = cfg
    return out


def client_for(uri: str):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=uri)


def check_tree(client, seed_runs: dict[tuple[str, int], str]) -> None:
    """One top-level run (the study's), one run per variant under it, each seed run under its variant's."""
    exp = client.get_experiment_by_name("tiny").experiment_id
    (study,) = find(client, exp, study_tags("tiny"))
    assert [r.info.run_id for r in client.search_runs([exp]) if PARENT not in r.data.tags] == [study.info.run_id]
    for variant in {v for v, _ in seed_runs}:
        (run,) = find(client, exp, variant_tags("tiny", variant))
        assert run.info.run_name == variant and run.data.tags[PARENT] == study.info.run_id
        for (v, seed), run_id in seed_runs.items():
            if v == variant:
                tags = client.get_run(run_id).data.tags
                assert tags[PARENT] == run.info.run_id and tags[ROLE] == "seed", (variant, seed)


def check_system_metrics(client, run_id: str) -> None:
    """MLflow's system metrics were sampled into the run (CPU and memory at least), at steps 0, 1, ..."""
    metrics = client.get_run(run_id).data.metrics
    for key in ("system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps and steps == list(range(len(steps))), (key, steps)
    assert 0 <= metrics["system/cpu_utilization_percentage"] <= 100


def check_complete(client, run_id: str, history: list[dict]) -> None:
    """The run is FINISHED and holds every epoch of every metric, once, equal to metrics.json's history."""
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    for key in KEYS:
        points = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
        assert points == [(row["epoch"], row[key]) for row in history], key


# Every training process, in phases that overlap as much as they can ------------------------------------


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """The mlflow server, started at once; a second one on its database comes later."""
    started = [Server(tmp_path_factory.mktemp("server"))]
    yield started
    for srv in started:
        srv.kill()  # also when a test failed


@pytest.fixture(scope="module")
def trained(tiny_params, prepared, tmp_path_factory, servers) -> dict:
    """Phase 1, at once: the server starts; four processes write into one SQLite file, one of them under
    SLURM job 1001 and killed after epoch 0; a run whose server does not exist (a closed port) trains.
    Phase 2, at once: SLURM job 1002 (a requeue: restart count 1) resumes the killed run; four processes
    log to the server. Phase 3: a fifth run logs to the server, which is SIGKILLed once it has logged
    the run's first epoch; then the server comes back on the same database (another port)."""
    root, cfgs = tmp_path_factory.mktemp("tracking"), configs(tiny_params)
    server = servers[0]
    sqlite_dir, db = root / "sqlite", root / "sqlite" / "mlflow.db"
    via_server, untracked = root / "via_server" / "tiny", root / "untracked" / "tiny"
    closed = f"http://127.0.0.1:{free_port()}"
    killed = ("deit_a", 1)

    def sqlite_cmd(key):
        return train_cmd(cfgs[key], prepared, sqlite_dir / key[0] / f"seed{key[1]}", db)

    untracked_dir = untracked / "runs" / "deit_a" / "seed0"
    lone = start(
        train_cmd(cfgs[("deit_a", 0)], prepared, untracked_dir, untracked / "mlflow.db"), MLFLOW_TRACKING_URI=closed
    )
    lone_started = time.monotonic()
    procs = {
        key: start(
            sqlite_cmd(key),
            **SAMPLED,
            **({"SLURM_JOB_ID": "1001", "LOCVIT_KILL_AT": "after_epoch_0"} if key == killed else {}),
        )
        for key in RUNS
    }
    sqlite_logs = {key: finish(proc, rc=-signal.SIGKILL if key == killed else 0) for key, proc in procs.items()}
    lone_logs = finish(lone)
    lone_s = time.monotonic() - lone_started

    server.wait_ready()
    resumed = start(sqlite_cmd(killed), SLURM_JOB_ID="1002", SLURM_RESTART_COUNT="1", **SAMPLED)
    procs = {
        key: start(
            train_cmd(cfg, prepared, via_server / "runs" / key[0] / f"seed{key[1]}", via_server / "unused.db"),
            MLFLOW_TRACKING_URI=server.uri,
            **SAMPLED,
        )
        for key, cfg in cfgs.items()
    }
    server_logs = {key: finish(proc) for key, proc in procs.items()}
    sqlite_logs[killed] = finish(resumed)

    late_cfg = {**cfgs[("deit_a", 0)], "variant": "deit_late"}
    late_dir = via_server / "runs" / "deit_late" / "seed0"
    with open(root / "late.err", "w") as late_err:
        late = subprocess.Popen(
            train_cmd(late_cfg, prepared, late_dir, via_server / "unused.db"),
            stdout=subprocess.PIPE,
            stderr=late_err,
            text=True,
            env={**env_with_venv(), "MLFLOW_TRACKING_URI": server.uri},
        )
    for line in late.stdout:
        if f"epoch 1/{EPOCHS}" in line:  # printed after the epoch is logged
            break
    server.kill()
    server_killed = time.monotonic()
    servers.append(Server(server.root, workers=1))  # back on its database (another port) while the run ends
    late.stdout.read()
    assert late.wait(timeout=300) == 0, (root / "late.err").read_text()[-3000:]
    late_s = time.monotonic() - server_killed
    servers[-1].wait_ready()
    print(
        f"\nrun with a closed port as its server: {lone_s:.1f} s in all; "
        f"run whose server died: finished {late_s:.1f} s after the kill"
    )
    return {
        "sqlite": {"root": sqlite_dir, "uri": f"sqlite:///{db}", "logs": sqlite_logs},
        "server": {
            "study": via_server,
            "logs": server_logs,
            "late_dir": late_dir,
            "late_s": late_s,
            "late_err": (root / "late.err").read_text(),
            "dead_uri": server.uri,
            "uri": servers[-1].uri,
        },
        "untracked": {
            "study": untracked,
            "out_dir": untracked_dir,
            "uri": closed,
            "logs": lone_logs,
            "seconds": lone_s,
        },
        "prepared": prepared,
    }


@pytest.fixture
def sqlite_runs(trained) -> dict:
    return trained["sqlite"]


# Concurrent writers -----------------------------------------------------------------------------------


@pytest.mark.e2e
def test_four_concurrent_writers_into_one_sqlite_file_lose_nothing(sqlite_runs):
    client = client_for(sqlite_runs["uri"])
    (experiment,) = [e for e in client.search_experiments() if e.name == "tiny"]
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`locvit.role` = 'seed'")
    assert len(runs) == len(RUNS)
    ids = {}
    for variant, seed in RUNS:
        out, err = sqlite_runs["logs"][(variant, seed)]
        assert "database is locked" not in err and "TRACKING FAILED" not in err
        metrics = json.loads((sqlite_runs["root"] / variant / f"seed{seed}" / "metrics.json").read_text())
        assert metrics["tracking"]["status"] == "ok" and len(metrics["history"]) == EPOCHS
        check_complete(client, metrics["mlflow_run_id"], metrics["history"])
        run = client.get_run(metrics["mlflow_run_id"])
        assert run.data.tags["variant"] == variant and run.data.tags["seed"] == str(seed)
        assert run.data.metrics["best_val_top1"] == metrics["best_val_top1"]
        check_system_metrics(client, run.info.run_id)
        ids[(variant, seed)] = run.info.run_id
    check_tree(client, ids)  # four jobs created the tree at once: one study run, one run per variant


@pytest.mark.e2e
def test_a_resubmitted_slurm_job_adds_itself_to_the_runs_job_history(sqlite_runs):
    client = client_for(sqlite_runs["uri"])
    resumed = json.loads((sqlite_runs["root"] / "deit_a" / "seed1" / "metrics.json").read_text())
    assert "resuming after epoch 1" in sqlite_runs["logs"][("deit_a", 1)][0]
    assert resumed["slurm_job_ids"] == ["1001", "1002"]
    tags = client.get_run(resumed["mlflow_run_id"]).data.tags
    assert tags["slurm_job_id"] == "1002" and tags["slurm_job_ids"] == "1001,1002"
    assert tags["slurm_restart_count"] == "1" and tags["hostname"] == socket.gethostname()
    other = json.loads((sqlite_runs["root"] / "mait_b" / "seed0" / "metrics.json").read_text())
    assert other["slurm_job_ids"] == []  # outside SLURM
    other_tags = client.get_run(other["mlflow_run_id"]).data.tags
    assert not {"slurm_job_id", "slurm_job_ids", "slurm_restart_count"} & set(other_tags)


def test_slurm_provenance(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert tracking.slurm_provenance([]) == ([], {"hostname": socket.gethostname()})
    assert tracking.slurm_provenance(["7"])[0] == ["7"]  # resumed outside SLURM: the history stays
    monkeypatch.setenv("SLURM_JOB_ID", "8")
    ids, tags = tracking.slurm_provenance(["7", "", "7"])
    assert ids == ["7", "8"] and tags["slurm_job_ids"] == "7,8" and "slurm_restart_count" not in tags
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")  # requeued: same job id, counted
    ids, tags = tracking.slurm_provenance(ids)
    assert ids == ["7", "8"] and tags["slurm_job_id"] == "8" and tags["slurm_restart_count"] == "2"


@pytest.mark.e2e
def test_four_concurrent_writers_through_an_mlflow_server(trained):
    study, logs = trained["server"]["study"], trained["server"]["logs"]
    client = client_for(trained["server"]["uri"])  # the same database, served again after phase 3
    ids = {}
    for (variant, seed), (out, err) in logs.items():
        assert "TRACKING FAILED" not in err, err[-3000:]
        metrics = json.loads((study / "runs" / variant / f"seed{seed}" / "metrics.json").read_text())
        assert metrics["tracking"]["status"] == "ok"
        check_complete(client, metrics["mlflow_run_id"], metrics["history"])
        artifacts = {a.path for a in client.list_artifacts(metrics["mlflow_run_id"])}
        assert {"metrics.json", "checkpoints"} <= artifacts
        check_system_metrics(client, metrics["mlflow_run_id"])
        ids[(variant, seed)] = metrics["mlflow_run_id"]
    check_tree(client, ids)
    assert not (study / "unused.db").exists()  # MLFLOW_TRACKING_URI wins


@pytest.mark.e2e
def test_a_run_whose_server_dies_finishes_and_is_completed_later(trained, monkeypatch, capsys):
    study, out_dir, err = trained["server"]["study"], trained["server"]["late_dir"], trained["server"]["late_err"]
    dead, uri = trained["server"]["dead_uri"], trained["server"]["uri"]
    assert trained["server"]["late_s"] < 60, f"training waited {trained['server']['late_s']:.0f} s on a dead server"
    assert "MLFLOW TRACKING FAILED" in err and dead in err
    metrics = json.loads((out_dir / "metrics.json").read_text())
    assert metrics["tracking"]["status"] == "failed" and metrics["tracking"]["uri"] == dead
    assert len(metrics["history"]) == EPOCHS and (out_dir / "best.pt").is_file() and (out_dir / "last.pt").is_file()
    partial = metrics["mlflow_run_id"]
    assert partial  # created before the server died

    # The server is back (same database and artifacts); the run's test result is there by now.
    (study / "eval" / "deit_late").mkdir(parents=True)
    (study / "eval" / "deit_late" / "seed0.json").write_text(
        json.dumps(
            {
                "study": "tiny",
                "variant": "deit_late",
                "seed": 0,
                "split": "test",
                "test_top1": 0.25,
                "test_loss": 2.0,
                "checkpoint_epoch": metrics["best_epoch"],
                "mlflow_run_id": partial,
            }
        )
    )
    sync = ["sync-tracking", "--runs-dir", str(study / "runs"), "--tracking-db", str(study / "unused.db")]
    with env_uri(monkeypatch, uri):
        assert cli.main(sync) == 0
        first = capsys.readouterr().out
        assert cli.main(sync) == 0
        second = capsys.readouterr().out
    assert f"uploaded to MLflow run {partial}" in first and "1 run(s) uploaded" in first
    assert f"{len(RUNS)} already complete" in first  # the four that were tracked are left alone
    assert "0 run(s) uploaded, 0 test result(s) added" in second and "nothing to upload" in second
    synced = json.loads((out_dir / "metrics.json").read_text())
    assert synced["mlflow_run_id"] == partial and synced["tracking"]["status"] == "ok"
    client = client_for(uri)
    check_complete(client, partial, metrics["history"])  # the epochs logged before the kill: once
    run = client.get_run(partial)
    assert run.data.metrics["test_top1"] == 0.25 and run.data.metrics["best_val_top1"] == metrics["best_val_top1"]
    assert [a.path for a in client.list_artifacts(partial, "checkpoints")] == ["checkpoints/best.pt"]
    exp = client.get_experiment_by_name("tiny").experiment_id
    (variant_run,) = find(client, exp, variant_tags("tiny", "deit_late"))
    assert run.data.tags[PARENT] == variant_run.info.run_id  # made before the server died, found again by sync
    assert not any(k.startswith("system/") for k in run.data.metrics)  # trained with system metrics off (0 s)


# A backend that cannot be reached at all ---------------------------------------------------------------


@pytest.mark.e2e
def test_an_unreachable_backend_does_not_stop_training_and_sync_uploads_it_later(trained, monkeypatch, capsys):
    untracked = trained["untracked"]
    out, err = untracked["logs"]
    out_dir, study = untracked["out_dir"], untracked["study"]
    assert {"best.pt", "last.pt", "metrics.json"} <= {p.name for p in out_dir.iterdir()}
    metrics = json.loads((out_dir / "metrics.json").read_text())
    record = metrics["tracking"]
    assert record["status"] == "failed" and record["uri"] == untracked["uri"] and "ConnectionError" in record["error"]
    assert metrics["mlflow_run_id"] is None and metrics["slurm_job_ids"] == [] and len(metrics["history"]) == EPOCHS
    assert record["params"]["train.epochs"] == str(EPOCHS) and record["tags"]["data_hash"]
    assert record["artifacts"] == {"metrics.json": None, "best.pt": "checkpoints"}
    assert err.count("MLFLOW TRACKING FAILED") == 2  # when it failed and again at the end
    assert untracked["uri"] in err
    command = next(line.strip(" !") for line in err.splitlines() if "locvit sync-tracking" in line)
    args = shlex.split(command)
    assert args[:2] == [f"MLFLOW_TRACKING_URI={untracked['uri']}", "locvit"]
    assert args[2:] == ["sync-tracking", "--runs-dir", str(out_dir), "--tracking-db", str(study / "mlflow.db")]

    # The printed command, with the study's SQLite file as the backend instead of the dead server.
    with env_uri(monkeypatch, None):
        assert cli.main(args[2:]) == 0
        first = capsys.readouterr().out
    # Then the run is evaluated, the server still dead: the score is written, the failure said aloud.
    evaluation = study / "eval" / "deit_a" / "seed0.json"
    with env_uri(monkeypatch, untracked["uri"]):
        assert (
            cli.main(
                [
                    "evaluate",
                    "--checkpoint",
                    str(out_dir / "best.pt"),
                    "--out",
                    str(evaluation),
                    "--data",
                    str(trained["prepared"]["test"]),
                    "--manifest",
                    str(trained["prepared"]["manifest"]),
                    "--tracking-db",
                    str(study / "mlflow.db"),
                    "--threads",
                    "1",
                ]
            )
            == 0
        )
    err = capsys.readouterr().err
    assert "MLFLOW TRACKING FAILED while logging test_top1, test_loss" in err and f"kept in {evaluation}" in err
    test_top1 = json.loads(evaluation.read_text())["test_top1"]
    command = shlex.split(next(line.strip(" !") for line in err.splitlines() if "locvit sync-tracking" in line))
    assert command[:2] == [f"MLFLOW_TRACKING_URI={untracked['uri']}", "locvit"]
    assert command[2:] == [
        "sync-tracking",
        "--runs-dir",
        str(out_dir),
        "--tracking-db",
        str(study / "mlflow.db"),
        "--eval-dir",
        str(study / "eval"),
    ]
    with env_uri(monkeypatch, None):  # the printed command, with the study's SQLite file as the backend
        assert cli.main(command[2:]) == 0
        evaluated = capsys.readouterr().out
        assert cli.main(command[2:]) == 0
        last = capsys.readouterr().out
    assert "1 run(s) uploaded" in first
    synced = json.loads((out_dir / "metrics.json").read_text())
    run_id = synced["mlflow_run_id"]
    assert run_id and synced["tracking"]["status"] == "ok" and synced["history"] == metrics["history"]
    assert "1 test result(s) added" in evaluated and "0 run(s) uploaded" in evaluated
    assert "nothing to upload" in last and "1 already complete" in last

    client = client_for(f"sqlite:///{study / 'mlflow.db'}")
    check_complete(client, run_id, metrics["history"])
    run = client.get_run(run_id)
    assert run.info.run_name == "deit_a-seed0" and run.data.params == record["params"]
    assert {k: run.data.tags[k] for k in record["tags"]} == record["tags"]
    assert run.data.metrics["test_top1"] == test_top1 and run.data.metrics["best_val_top1"] == metrics["best_val_top1"]
    assert {a.path for a in client.list_artifacts(run_id)} == {"metrics.json", "checkpoints"}
    check_tree(client, {("deit_a", 0): run_id})  # the spool's run lands under its variant's run, made by sync
    uploaded = json.loads(Path(client.download_artifacts(run_id, "metrics.json")).read_text())
    assert uploaded["mlflow_run_id"] == run_id  # the uploaded record names its run


def test_a_dead_server_costs_one_short_probe(monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="cannot be reached"):
        tracking.check_reachable(os.environ["MLFLOW_TRACKING_URI"])
    assert time.monotonic() - started < tracking.PROBE_TIMEOUT_S
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "33")  # the user's setting wins
    monkeypatch.delenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", raising=False)
    with tracking.bounded_http():
        assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == "33"
        assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == tracking.HTTP_LIMITS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]
    assert "MLFLOW_HTTP_REQUEST_MAX_RETRIES" not in os.environ


def test_runs_logging_one_dataset_at_once_all_get_it(tmp_path, monkeypatch):
    """MLflow checks for a dataset, then inserts it: four runs of a study starting together collide
    on the insert (a unique-constraint error in about half the calls here without the retry)."""
    import threading

    from locvit.tracking.run import log_datasets

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    client = client_for(os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.create_experiment("race")
    runs = [client.create_run(experiment).info.run_id for _ in range(4)]
    files = {split: tmp_path / f"{split}.beton" for split in ("train", "val")}
    errors, rounds = [], 8
    for round_ in range(rounds):
        manifest = {"source": "digits", "data_hash": f"{round_:016x}", "splits": {s: {"size": 10} for s in files}}
        barrier = threading.Barrier(len(runs))

        def log(run_id):
            barrier.wait()
            try:
                log_datasets(client_for(os.environ["MLFLOW_TRACKING_URI"]), run_id, manifest, files)
            except Exception as err:
                errors.append(err)

        threads = [threading.Thread(target=log, args=(run_id,)) for run_id in runs]
        [t.start() for t in threads]
        [t.join() for t in threads]
    assert not errors, errors[:2]
    for run_id in runs:
        logged = {(d.dataset.name, d.dataset.digest) for d in client.get_run(run_id).inputs.dataset_inputs}
        assert logged == {(f"digits-{s}", f"{r:016x}") for s in files for r in range(rounds)}


def test_a_lost_race_is_retried_over_http_and_a_bad_request_is_not(monkeypatch):
    from mlflow.exceptions import RestException

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    calls = []

    def answer(message):
        calls.append(message)
        if len(calls) < tracking.backend.RACE_ATTEMPTS:
            raise RestException({"error_code": "BAD_REQUEST", "message": message})
        return "logged"

    race = "(sqlite3.IntegrityError) UNIQUE constraint failed: datasets.experiment_id, datasets.name"
    assert tracking.backend.retry(answer, race) == "logged" and len(calls) == tracking.backend.RACE_ATTEMPTS
    calls.clear()
    with pytest.raises(RestException, match="Invalid value"):
        tracking.backend.retry(answer, "Invalid value for parameter lr")
    assert len(calls) == 1  # one try: HTTP retries are MLflow's own, and a bad request stays bad


@pytest.mark.e2e
def test_a_job_killed_while_it_creates_the_database_leaves_none_half_made(tmp_path, monkeypatch):
    """A job killed in MLflow's schema creation left a file that no later job could open (CI saw it
    in test_kill); the schema is now built under a temporary name and renamed when whole."""
    from locvit.io import temporaries

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    db = tmp_path / "mlflow.db"
    create_and_die("setup", db, at=20)  # of about 60 tables
    assert not db.exists() and len(temporaries(db)) == 1  # killed half-way, under the temporary name
    experiment = tracking.setup("study", db)  # the next job creates it whole, and clears the leftover
    assert temporaries(db) == []
    client = client_for(f"sqlite:///{db}")
    assert client.get_experiment_by_name("study").experiment_id == experiment
    assert client.create_run(experiment).info.status == "RUNNING"


@pytest.mark.e2e
def test_a_half_created_database_is_named_with_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    db = tmp_path / "mlflow.db"
    create_and_die("mlflow", db, at=20)  # MLflow alone builds it in place
    with pytest.raises(
        RuntimeError,
        match=re.escape(f"{db} is a half-built MLflow tracking database")
        + ".* It holds no runs: delete it and run the step again",
    ):
        tracking.setup("study", db)
    db.unlink()  # what the message says to do
    tracking.setup("study", db)
    with contextlib.closing(sqlite3.connect(db)) as con:
        assert ("study",) in con.execute("SELECT name FROM experiments").fetchall()


#: A study database with one run (param a=1), one schema revision older than this MLflow's (a newer
#: MLflow opens it, and upgrades it); argv: the file. MLflow's own alembic set-up, as `mlflow db` uses it.
OLDER = """
import sys
import mlflow
from alembic import command
from mlflow.store.db.utils import _get_alembic_config, create_sqlalchemy_engine_with_retry

uri = f"sqlite:///{sys.argv[1]}"
client = mlflow.MlflowClient(tracking_uri=uri)
run = client.create_run(client.create_experiment("study"))
client.log_param(run.info.run_id, "a", 1)
config = _get_alembic_config(uri)
with create_sqlalchemy_engine_with_retry(uri).begin() as conn:
    config.attributes["connection"] = conn
    command.downgrade(config, "-1")
print(run.info.run_id)
"""


@pytest.mark.e2e
def test_an_older_database_is_upgraded_whole_and_keeps_its_runs(tmp_path, monkeypatch):
    """A newer MLflow upgrades a study's database in place, one migration at a time: a job killed
    meanwhile left the study's runs in a file no job could open. locvit upgrades a copy."""
    import hashlib

    from locvit.io import temporaries
    from locvit.tracking import sqlite

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    db, alone = tmp_path / "mlflow.db", tmp_path / "alone" / "mlflow.db"
    run_id = subprocess.run(
        [str(BIN / "python"), "-c", OLDER, str(db)],
        env=env_with_venv(),
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.split()[-1]
    assert sqlite.revision(db, sqlite.TRACKING) != sqlite.TRACKING.head()
    alone.parent.mkdir()
    shutil.copy(db, alone)
    before = hashlib.sha256(db.read_bytes()).hexdigest()

    create_and_die("setup", db, at=1)  # killed in the upgrade's first new table
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before and len(temporaries(db)) == 1
    experiment = tracking.setup("study", db)
    assert sqlite.revision(db, sqlite.TRACKING) == sqlite.TRACKING.head() and temporaries(db) == []
    run = client_for(f"sqlite:///{db}").get_run(run_id)
    assert run.info.experiment_id == experiment and run.data.params == {"a": "1"}

    create_and_die("mlflow", alone, at=1)  # MLflow alone upgrades in place: its runs are stuck
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # set by setup (mlflow.set_tracking_uri)
    with pytest.raises(
        RuntimeError,
        match=re.escape(f"{alone} is an MLflow tracking database whose upgrade")
        + ".* It holds runs \\(1\\), so do not delete it: restore it from a backup",
    ):
        tracking.setup("study", alone)


def test_a_database_of_a_newer_mlflow_is_named_as_such(tmp_path, monkeypatch):
    from locvit.io import temporaries
    from locvit.tracking import sqlite

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    db = tmp_path / "mlflow.db"
    tracking.setup("study", db)
    with contextlib.closing(sqlite3.connect(db)) as con, con:
        con.execute("UPDATE alembic_version SET version_num = 'f00dfeedbeef'")  # a revision this MLflow lacks
    with pytest.raises(
        RuntimeError,
        match=re.escape(f"{db} was written by a newer MLflow than this one") + ".* revision f00dfeedbeef, unknown here",
    ):
        sqlite.ensure(db)
    assert sqlite.revision(db, sqlite.TRACKING) == "f00dfeedbeef" and temporaries(db) == []


def test_this_mlflows_schema_revision_is_read_once_per_mlflow_version(tmp_path, monkeypatch):
    """alembic reads every migration script to name the head revision: remembered per MLflow version."""
    import dataclasses

    from locvit.tracking import sqlite

    monkeypatch.setenv("LOCVIT_CACHE_DIR", str(tmp_path))
    asked = []
    schema = dataclasses.replace(sqlite.TRACKING, head=lambda: asked.append(1) or sqlite.TRACKING.head())
    assert sqlite.head(schema) == sqlite.head(schema) == sqlite.TRACKING.head() and asked == [1]
    assert len(list((tmp_path / "mlflow-heads").iterdir())) == 1
