"""``locvit mlflow-server``: one MLflow tracking server for a study's jobs on many nodes.

SQLite on a shared file system is unsafe for many writers, so cluster jobs log over HTTP
(``MLFLOW_TRACKING_URI``) to one server, the only process that opens ``mlflow.db``; it stores their artifacts.
It binds to ``--host`` (default 127.0.0.1). With ``MLFLOW_TRACKING_USERNAME``/``_PASSWORD`` it runs MLflow's
basic-auth app with that user as administrator; another host without them is refused. Credentials come from
the environment only, never written (the auth config, mode 0600, holds user and database path). Users live in
``mlflow-auth/basic_auth.db``: the first start sets the password, a later different one is refused
(docs/tracking.md).
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from locvit.errors import InputError
from locvit.io import atomic_path
from locvit.layout import StudyLayout
from locvit.tracking.sqlite import AUTH, TRACKING
from locvit.tracking.sqlite import ensure as ensure_sqlite
from locvit.tracking.sqlite import lock as sqlite_lock
from locvit.tracking.ui import LOCAL_HOST, LOOPBACK, ui_env, ui_url

USER, PASSWORD = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
AUTH_DIR = "mlflow-auth"
AUTH_DB = "basic_auth.db"  # the login database, in AUTH_DIR


def credentials(env: dict[str, str] | None = None) -> tuple[str, str] | None:
    """(user, password) from the environment, None when neither is set; half a pair is an error."""
    env = os.environ if env is None else env
    user, password = env.get(USER), env.get(PASSWORD)
    if not user and not password:
        return None
    if not (user and password):
        missing = USER if not user else PASSWORD
        raise InputError(
            f"{missing} is not set: set both {USER} and {PASSWORD} (the server's administrator, "
            f"and what its clients send), or neither for a server without a login on {LOCAL_HOST}"
        )
    return user, password


def write_auth_config(study_dir: Path, user: str) -> Path:
    """The basic-auth app's config under the study (mode 0600; no password in it); its path."""
    folder = StudyLayout(study_dir).root / AUTH_DIR
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = folder / "basic_auth.ini"
    with atomic_path(path, mode=0o600) as tmp:
        tmp.write_text(
            "[mlflow]\n"
            "default_permission = READ\n"
            f"database_uri = sqlite:///{folder / AUTH_DB}\n"
            f"admin_username = {user}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        )
    return path


def auth_database(config: Path) -> Path:
    """The login database of the auth config ``write_auth_config`` wrote."""
    return config.parent / AUTH_DB


def server_command(
    study_dir: str | Path, host: str = LOCAL_HOST, port: int = 5000, workers: int = 1, env: dict[str, str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """The ``mlflow server`` command (an argument list, run without a shell) and its environment."""
    env = dict(os.environ if env is None else env)
    login = credentials(env)
    if login is None and host not in LOOPBACK:
        raise InputError(
            f"--host {host}: a server reachable from other machines needs a login; set {USER} and "
            f"{PASSWORD} in the environment (the server's administrator; jobs send the same two "
            f"variables), or serve on {LOCAL_HOST}"
        )
    layout = StudyLayout(Path(study_dir).resolve())
    layout.root.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        f"sqlite:///{layout.tracking_db}",
        "--serve-artifacts",
        "--artifacts-destination",
        layout.artifacts.as_uri(),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    env = {**ui_env(), **env}
    env.pop("MLFLOW_TRACKING_URI", None)  # the server's own store is the study's file, whatever the shell says
    if login is not None:
        cmd += ["--app-name", "basic-auth"]
        env["MLFLOW_AUTH_CONFIG_PATH"] = str(write_auth_config(layout.root, login[0]))
        env["MLFLOW_AUTH_ADMIN_PASSWORD"] = login[1]
        # the auth app's CSRF secret, shared by the server's workers
        env.setdefault("MLFLOW_FLASK_SERVER_SECRET_KEY", secrets.token_hex(32))
    return cmd, env


def serve(study_dir: str | Path, host: str = LOCAL_HOST, port: int = 5000, workers: int = 1) -> None:
    """Replace this process by ``mlflow server`` (a signal to our pid reaches MLflow itself)."""
    cmd, env = server_command(study_dir, host, port, workers)
    # Both databases whole or not at all, as jobs create the study's (the server would build them in place).
    databases = [(StudyLayout(Path(study_dir).resolve()).tracking_db, TRACKING)]
    if "--app-name" in cmd:
        databases.append((auth_database(Path(env["MLFLOW_AUTH_CONFIG_PATH"])), AUTH))
    for db, schema in databases:
        with sqlite_lock(db):
            ensure_sqlite(db, schema)
    login = "with a login (basic auth)" if "--app-name" in cmd else "without a login (this machine only)"
    print(
        f"MLflow tracking server on {cmd[cmd.index('--backend-store-uri') + 1]}, {login}: jobs log to it with "
        f"MLFLOW_TRACKING_URI={ui_url(host, port)}"
        + (f" and {USER} / {PASSWORD}" if "--app-name" in cmd else "")
        + " (Ctrl-C stops it)",
        flush=True,
    )
    os.execve(cmd[0], cmd, env)
