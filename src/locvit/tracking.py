"""MLflow tracking: one run per (variant, seed) in an experiment named after the study.

The default backend is a SQLite file in the study's results folder (MLflow 3
deprecates the file store); ``MLFLOW_TRACKING_URI`` overrides it (an ``mlflow
server`` for clusters). SQLite answers "database is locked" when several jobs write
at once, so every call goes through :func:`retry`.
"""

from __future__ import annotations

import functools
import os
import random
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

T = TypeVar("T")


def default_uri(study_dir: str | Path) -> str:
    """The tracking URI: ``$MLFLOW_TRACKING_URI`` or ``sqlite:///<study_dir>/mlflow.db``."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    db = (Path(study_dir) / "mlflow.db").resolve()
    return f"sqlite:///{db}"


def artifact_root(study_dir: str | Path) -> str:
    return (Path(study_dir) / "mlartifacts").resolve().as_uri()


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


def setup(study: str, study_dir: str | Path) -> str:
    """Point MLflow at the study's backend and make sure its experiment exists; return its id."""
    import mlflow

    uri = default_uri(study_dir)
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient()
    exp = retry(client.get_experiment_by_name, study)
    if exp is not None:
        return exp.experiment_id
    try:
        return retry(client.create_experiment, study, artifact_location=None if "MLFLOW_TRACKING_URI" in os.environ
                     else artifact_root(study_dir))
    except Exception:
        # Another job created it between our two calls.
        exp = retry(client.get_experiment_by_name, study)
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
