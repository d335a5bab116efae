"""MLflow tracking: one run per (variant, seed) in an experiment named after the study.

The default backend is a SQLite file in the study's results folder (MLflow 3
deprecates the file store); ``MLFLOW_TRACKING_URI`` overrides it (an ``mlflow
server`` for clusters). SQLite answers "database is locked" when several jobs write
at once, so every call goes through :func:`retry`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def default_uri(db: str | Path) -> str:
    """The tracking URI: ``$MLFLOW_TRACKING_URI`` or the SQLite file ``db``."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path(db).resolve()}"


def retry(fn: Callable[..., T], *args, attempts: int = 8, **kwargs) -> T:
    """Call ``fn`` retrying transient backend errors (locked SQLite, a busy server)."""
    delay = 0.2
    for attempt in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # MLflow wraps backend errors in several types
            text = str(err).lower()
            transient = any(s in text for s in ("locked", "busy", "timed out", "temporarily", "connection"))
            if not transient or attempt == attempts - 1:
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 5.0)
    raise AssertionError("unreachable")


def setup(study: str, db: str | Path) -> str:
    """Point MLflow at the study's backend and make sure its experiment exists; return its id.

    With the default SQLite backend, the first job to get here creates the database
    and the experiment under a file lock, so parallel jobs never race on MLflow's
    schema migrations. Artifacts go to ``mlartifacts/`` beside the database.
    """
    import mlflow
    from filelock import FileLock

    uri = default_uri(db)
    ours = "MLFLOW_TRACKING_URI" not in os.environ  # read first: set_tracking_uri sets that variable
    mlflow.set_tracking_uri(uri)
    # Any SQLite backend (ours or one given by URI) is created under a lock beside its file.
    lock_path = Path(uri[len("sqlite:///"):] + ".lock") if uri.startswith("sqlite:///") else None
    if lock_path:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_path)) if lock_path else contextlib.nullcontext():
        client = mlflow.MlflowClient()  # opening the store creates/migrates the database: under the lock
        exp = retry(client.get_experiment_by_name, study)
        if exp is not None:
            return exp.experiment_id
        artifacts = (Path(db).parent / "mlartifacts").resolve().as_uri() if ours else None
        try:
            return retry(client.create_experiment, study, artifact_location=artifacts)
        except Exception:
            exp = retry(client.get_experiment_by_name, study)  # created meanwhile by another client
            if exp is None:
                raise
            return exp.experiment_id


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def log_params(run_id: str, params: dict[str, Any]) -> None:
    import mlflow
    from mlflow.entities import Param

    client = mlflow.MlflowClient()
    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 90):  # MLflow accepts at most 100 params per batch
        retry(client.log_batch, run_id, params=items[start:start + 90])


def log_metrics(run_id: str, metrics: dict[str, float], step: int) -> None:
    import mlflow
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()
    now = int(time.time() * 1000)
    retry(client.log_batch, run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


def log_to_run(run_id: str, metrics: dict[str, float], step: int) -> bool:
    """Log to an existing run; if the backend does not know it, warn and go on.

    That happens after ``dvc pull`` on a fresh clone: the checkpoints come back, the
    MLflow database of the machine that trained them does not. The caller's own
    result files are still written.
    """
    from mlflow.exceptions import MlflowException

    try:
        log_metrics(run_id, metrics, step)
        return True
    except MlflowException as err:
        if "not found" not in str(err).lower() and "does not exist" not in str(err).lower():
            raise
        print(f"WARNING: MLflow run {run_id} is not in the tracking backend {_current_uri()}; "
              f"{', '.join(metrics)} written to the local result file only.", file=sys.stderr, flush=True)
        return False


def _current_uri() -> str:
    import mlflow

    return mlflow.get_tracking_uri()
