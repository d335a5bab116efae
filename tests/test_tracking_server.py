"""`locvit mlflow-server`: a study's tracking database served over HTTP with MLflow's basic-auth login.

A real server (MLflow's basic-auth app) on a free loopback port: a client without the
credentials is refused (HTTP 401) and locvit names the variables to set; `locvit train`
with them logs a run that the server lists; the password is in no file under the study and
not on the server's command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests
from helpers import env_with_venv, free_port, train_cmd

from locvit.config.run import run_config
from locvit.tracking import TrackingAuthError, check_reachable
from locvit.tracking.server import server_command

USER, PASSWORD = "locvit-admin", "s3cret-for-the-test-only"


def _wait_ready(proc: subprocess.Popen, uri: str, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        with contextlib.suppress(requests.RequestException):
            if requests.get(f"{uri}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(f"locvit mlflow-server on {uri} did not start:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    study = tmp_path_factory.mktemp("served") / "tiny"
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    log = study.parent / "server.log"
    env = {**env_with_venv(), "MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "locvit",
                "mlflow-server",
                "--study-dir",
                str(study),
                "--port",
                str(port),
                "--workers",
                "1",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_ready(proc, uri, log)
        yield {"uri": uri, "study": study, "proc": proc, "log": log}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.e2e
def test_a_client_without_the_login_is_refused_and_told_what_to_set(server, monkeypatch):
    answer = requests.get(f"{server['uri']}/api/2.0/mlflow/experiments/search", params={"max_results": 1}, timeout=10)
    assert answer.status_code == 401
    for name in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(
        TrackingAuthError, match="refused no credentials.*set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
    ):
        check_reachable(server["uri"])
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong")
    with pytest.raises(TrackingAuthError, match="HTTP 401"):
        check_reachable(server["uri"])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    check_reachable(server["uri"])  # the right login passes


@pytest.mark.e2e
def test_training_with_the_login_logs_a_run_the_server_lists(server, tiny_params, prepared, tmp_path):
    import mlflow

    cfg = run_config(tiny_params, "deit_a", 0)
    cfg["train"]["epochs"] = 1
    env = {
        **env_with_venv(),
        "MLFLOW_TRACKING_URI": server["uri"],
        "MLFLOW_TRACKING_USERNAME": USER,
        "MLFLOW_TRACKING_PASSWORD": PASSWORD,
    }
    proc = subprocess.run(
        train_cmd(cfg, prepared, tmp_path / "run", tmp_path / "unused.db"),
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run_id = json.loads((tmp_path / "run" / "metrics.json").read_text())["mlflow_run_id"]
    os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"] = USER, PASSWORD
    try:
        run = mlflow.MlflowClient(tracking_uri=server["uri"]).get_run(run_id)
    finally:
        del os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]
    assert run.info.status == "FINISHED" and "val_top1" in run.data.metrics
    assert not (tmp_path / "unused.db").exists()  # the job wrote no SQLite file of its own
    assert (server["study"] / "mlflow.db").is_file()  # the server alone writes the study's database


@pytest.mark.e2e
def test_the_password_is_in_no_file_and_not_on_the_command_line(server):
    cmdlines = [
        server["proc"].pid,
        *map(
            int, subprocess.run(["pgrep", "-g", str(server["proc"].pid)], capture_output=True, text=True).stdout.split()
        ),
    ]
    for pid in cmdlines:
        with contextlib.suppress(FileNotFoundError):
            assert PASSWORD not in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    files = [p for p in server["study"].rglob("*") if p.is_file()]
    assert any(p.name == "basic_auth.ini" for p in files)
    for path in files:
        assert PASSWORD.encode() not in path.read_bytes(), path
    ini = server["study"] / "mlflow-auth" / "basic_auth.ini"
    assert ini.stat().st_mode & 0o777 == 0o600


def test_a_server_for_other_machines_needs_the_login(tmp_path):
    with pytest.raises(
        ValueError,
        match="--host 0.0.0.0: a server reachable from other machines needs a login; "
        "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD",
    ):
        server_command(tmp_path, host="0.0.0.0", env={})
    with pytest.raises(ValueError, match="MLFLOW_TRACKING_PASSWORD is not set"):
        server_command(tmp_path, host="127.0.0.1", env={"MLFLOW_TRACKING_USERNAME": USER})
    cmd, env = server_command(
        tmp_path, host="10.1.2.3", env={"MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": PASSWORD}
    )
    assert cmd[cmd.index("--host") + 1] == "10.1.2.3" and cmd[cmd.index("--app-name") + 1] == "basic-auth"
    assert PASSWORD not in " ".join(cmd) and env["MLFLOW_AUTH_ADMIN_PASSWORD"] == PASSWORD
    cmd, _ = server_command(tmp_path, host="127.0.0.1", env={})
    assert "--app-name" not in cmd  # this machine only: no login needed


def test_the_server_starts_on_databases_built_whole(tmp_path, monkeypatch):
    """`locvit mlflow-server` builds the study's database and its login database (at this MLflow's
    schema, under temporary names) before it becomes MLflow, which would build them in place."""
    from locvit.io import temporaries
    from locvit.tracking import server as served
    from locvit.tracking import sqlite

    execs = []
    monkeypatch.setattr(served.os, "execve", lambda *args: execs.append(args))
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", USER)
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", PASSWORD)
    served.serve(tmp_path)
    assert len(execs) == 1 and "--app-name" in execs[0][1]
    auth_db = tmp_path / "mlflow-auth" / "basic_auth.db"
    for db, schema in ((tmp_path / "mlflow.db", sqlite.TRACKING), (auth_db, sqlite.AUTH)):
        assert sqlite.revision(db, schema) == schema.head() and temporaries(db) == [], db


@pytest.mark.e2e
def test_a_login_database_whose_creation_was_killed_is_built_whole_next_time(tmp_path):
    from helpers import create_and_die

    from locvit.io import temporaries
    from locvit.tracking import sqlite

    db = tmp_path / "basic_auth.db"
    create_and_die("auth", db, at=4)  # of 14 tables
    assert not db.exists() and len(temporaries(db)) == 1
    sqlite.ensure(db, sqlite.AUTH)
    assert temporaries(db) == [] and sqlite.revision(db, sqlite.AUTH) == sqlite.AUTH.head()
    with contextlib.closing(sqlite3.connect(db)) as con:
        tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "users" in tables
