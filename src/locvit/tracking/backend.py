"""The MLflow backend: its URI, bounded connections, retries and the study's experiment.

The default is a SQLite file in the study's folder (``locvit.layout``); ``MLFLOW_TRACKING_URI`` overrides it
(an ``mlflow server`` on clusters). SQLite answers "database is locked" to concurrent writers, so every call
goes through ``retry`` (after MLflow's own 20 s ``busy_timeout``). Time on a backend that is gone is bounded
(``HTTP_LIMITS``): one probe of at most ``PROBE_TIMEOUT_S`` (``PROBE_READ_TIMEOUT_S`` for a busy server),
then MLflow's HTTP client with few retries and short timeouts (``bounded_http``); ``connect`` does it all.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from locvit.errors import LocvitError
from locvit.layout import artifacts_beside
from locvit.tracking.sqlite import ensure as ensure_sqlite
from locvit.tracking.sqlite import lock as sqlite_lock

T = TypeVar("T")

#: MLflow's experiment-kind tag: a model-training experiment (MLflow never sets it by itself; newer
#: UIs choose their view by it, the 3.17 UI by the link's ``workflowType``: ``ui_link``).
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def default_uri(db: str | Path) -> str:
    """The tracking URI: ``$MLFLOW_TRACKING_URI`` or the SQLite file ``db``."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path(db).resolve()}"


#: Words of a database's answer to an insert that lost a race with another writer's same insert.
#: MLflow checks for a dataset and then inserts it, so runs logging one dataset at once collide
#: (SQLite, PostgreSQL and MySQL wordings); the retry finds the winner's row and uses it.
LOST_RACE = ("unique constraint", "duplicate key", "duplicate entry")

#: Tries for a lost race, over HTTP too: the server answered, so a retry costs no network wait.
RACE_ATTEMPTS = 3


def retry(fn: Callable[..., T], *args, attempts: int | None = None, **kwargs) -> T:
    """Call ``fn`` retrying transient backend errors (locked SQLite, a busy server, a lost race).

    ``attempts`` defaults to 8, or to 1 for an HTTP(S) server: MLflow's HTTP client
    retries those itself (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``), and a second layer of
    retries would multiply the wait on a server that is gone. An insert that lost a race
    with a concurrent writer (``LOST_RACE``) gets at least ``RACE_ATTEMPTS`` tries
    either way: MLflow's client does not retry an answer of the server.
    """
    if attempts is None:
        attempts = 1 if _is_http(current_uri()) else 8
    delay = 0.2
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # MLflow wraps backend errors in several types
            text = str(err).lower()
            raced = any(s in text for s in LOST_RACE)
            transient = raced or any(s in text for s in ("locked", "busy", "timed out", "temporarily", "connection"))
            if not transient or attempt >= (max(attempts, RACE_ATTEMPTS) if raced else attempts):
                raise
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 5.0)


def setup(study: str, db: str | Path) -> str:
    """Point MLflow at the study's backend and make sure its experiment exists; return its id.

    With a SQLite backend, the first job to get here creates (or upgrades) the database
    whole (``locvit.tracking.sqlite.ensure``) and the experiment under a file lock, so parallel jobs never
    race on MLflow's schema migrations. Artifacts go to ``mlartifacts/`` beside the database. The experiment
    is marked for model training (``EXPERIMENT_KIND``), an older one when it lacks the tag.
    """
    import mlflow
    from sqlalchemy.engine import make_url

    uri = default_uri(db)
    ours = "MLFLOW_TRACKING_URI" not in os.environ  # read first: set_tracking_uri sets that variable
    mlflow.set_tracking_uri(uri)
    # Any SQLite backend (ours or one given by URI) is created under a lock beside its file.
    path = Path(make_url(uri).database) if uri.startswith("sqlite:///") else None  # without ?query
    with sqlite_lock(path) if path else contextlib.nullcontext():
        if path:
            ensure_sqlite(path)
        client = mlflow.MlflowClient()
        exp = retry(client.get_experiment_by_name, study)
        if exp is not None:
            for key, value in EXPERIMENT_KIND.items():
                if exp.tags.get(key) != value:
                    retry(client.set_experiment_tag, exp.experiment_id, key, value)
            return exp.experiment_id
        artifacts = artifacts_beside(db).resolve().as_uri() if ours else None
        try:
            return retry(client.create_experiment, study, artifact_location=artifacts, tags=EXPERIMENT_KIND)
        except Exception:
            exp = retry(client.get_experiment_by_name, study)  # created meanwhile by another client
            if exp is None:
                raise
            return exp.experiment_id


def ui_link(base: str, experiment_id: str, run_id: str | None = None) -> str:
    """A link that opens the MLflow UI at ``base`` in its model-training view: the experiment's runs
    table (and charts), or one run. The 3.17 UI picks its view from ``workflowType`` (else GenAI)."""
    path = f"/#/experiments/{experiment_id}/runs" + (f"/{run_id}" if run_id else "")
    return f"{base.rstrip('/')}{path}?workflowType=machine_learning"


def compare_link(base: str, experiment_id: str, run_ids) -> str:
    """A link to the MLflow UI's compare view of ``run_ids`` (their params, metrics and curves side by side)."""
    import json
    from urllib.parse import quote

    runs = quote(json.dumps(list(run_ids), separators=(",", ":")))
    return (
        f"{base.rstrip('/')}/#/compare-runs?runs={runs}&experiments={quote(json.dumps([experiment_id]))}"
        "&workflowType=machine_learning"
    )


def connect(study: str, db: str | Path):
    """An MlflowClient on the study's backend with its experiment set up, after one bounded probe.

    Raises what the backend raised (ConnectionError for a server that does not answer);
    call it inside ``bounded_http`` to keep later calls bounded too.
    """
    import mlflow

    check_reachable(default_uri(db))
    setup(study, db)
    return mlflow.MlflowClient()


def run_status(client, run_id: str) -> str | None:
    """The MLflow run's status, or None when this backend does not know it."""
    from mlflow.exceptions import MlflowException

    try:
        return retry(client.get_run, run_id).info.status
    except MlflowException:
        return None


def experiments_of(client, run_ids) -> tuple[dict[str, str], list[str]]:
    """Run id -> its experiment id, for the runs the backend knows; and the run ids it does not know."""
    known, unknown = {}, []
    for run_id in run_ids:
        try:
            known[run_id] = retry(client.get_run, run_id).info.experiment_id
        except Exception:
            unknown.append(run_id)
    return known, unknown


def log_files(client, run_id: str, paths, artifact_path: str | None = None) -> list[str]:
    """Log files as artifacts of a run; return one line per file that failed (the others are logged)."""
    failed = []
    for path in paths:
        try:
            retry(client.log_artifact, run_id, str(path), artifact_path)
        except Exception as err:
            failed.append(
                f"{Path(path).name} -> {run_id}: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
            )
    return failed


def find_run(client, run_id: str | None):
    """The MLflow run, or None when the backend does not know it."""
    from mlflow.exceptions import MlflowException

    if not run_id:
        return None
    try:
        return retry(client.get_run, run_id)
    except MlflowException as err:
        if "not found" in str(err).lower() or "does not exist" in str(err).lower():
            return None
        raise


def log_params(run_id: str, params: dict[str, Any]) -> None:
    import mlflow
    from mlflow.entities import Param

    client = mlflow.MlflowClient()
    items = [Param(k, str(v)[:6000]) for k, v in params.items()]
    for start in range(0, len(items), 90):  # MLflow accepts at most 100 params per batch
        retry(client.log_batch, run_id, params=items[start : start + 90])


def set_tags(run_id: str, tags: dict[str, str]) -> None:
    import mlflow
    from mlflow.entities import RunTag

    if tags:
        retry(mlflow.MlflowClient().log_batch, run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])


def log_metrics(run_id: str, metrics: dict[str, float], step: int) -> None:
    import mlflow
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()
    now = int(time.time() * 1000)
    retry(client.log_batch, run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()])


def current_uri() -> str:
    import mlflow

    return mlflow.get_tracking_uri()


def _is_http(uri: str) -> bool:
    return uri.startswith(("http://", "https://"))


def safe_uri(uri: str) -> str:
    """``uri`` without a password, for messages and records."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


# A backend that is gone --------------------------------------------------------------------------

#: MLflow's HTTP client settings while a run is tracked, unless the environment sets them:
#: 3 retries with 0, 2 and 4 s pauses (+ up to 1 s jitter each) and 10 s per request. A
#: refused connection then fails after about 8 s, a server that accepts but never answers
#: after about 50 s (MLflow's defaults: 7 retries up to 120 s apart and 120 s per request,
#: minutes per call). After the first failure, no further call is made.
HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


#: One try, before the run is created: does the server answer at all? A closed port or an
#: unreachable host fails within PROBE_TIMEOUT_S; a server that has accepted the connection
#: gets PROBE_READ_TIMEOUT_S to answer, since one that many jobs start against at once can
#: take longer than 5 s (seen on a 2-core machine with five runs importing torch at once).
PROBE_TIMEOUT_S = 5.0


PROBE_READ_TIMEOUT_S = 30.0


@contextlib.contextmanager
def bounded_http():
    """Apply ``HTTP_LIMITS`` (where the environment does not set them) for the block."""
    added = [k for k in HTTP_LIMITS if k not in os.environ]
    os.environ.update({k: HTTP_LIMITS[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def check_reachable(uri: str, timeout: float = PROBE_TIMEOUT_S, read_timeout: float = PROBE_READ_TIMEOUT_S) -> None:
    """Raise ``TrackingUnreachable`` (a ConnectionError) unless the HTTP(S) server at ``uri``
    accepts a connection within ``timeout`` s and answers within ``read_timeout`` s more (one try
    each for ``/health`` and one read of the tracking API); ``TrackingAuthError`` when that
    read is refused (HTTP 401 or 403) with the credentials in the environment.

    Any answer of ``/health`` counts (a proxy may refuse it without credentials): that only
    tells a dead or unreachable server from a live one. Other backends are not probed.
    """
    if not _is_http(uri):
        return
    import requests

    verify = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or os.environ.get(
        "MLFLOW_TRACKING_INSECURE_TLS", ""
    ).lower() not in ("true", "1")
    try:
        requests.get(uri.rstrip("/") + "/health", timeout=(timeout, read_timeout), verify=verify)
        # One read of the tracking API with the client's credentials, as MLflow's client sends them.
        answer = requests.get(
            uri.rstrip("/") + "/api/2.0/mlflow/experiments/search",
            params={"max_results": 1},
            timeout=(timeout, read_timeout),
            verify=verify,
            **_client_auth(),
        )
    except requests.RequestException as err:
        raise TrackingUnreachable(
            f"the tracking server {safe_uri(uri)} cannot be reached (one try: at most "
            f"{timeout:g} s to connect, {read_timeout:g} s to answer: "
            f"{type(err).__name__}: {err})"
        ) from err
    if answer.status_code in (401, 403):
        sent = (
            "no credentials"
            if not _client_auth()
            else "the credentials of MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
        )
        raise TrackingAuthError(
            f"the tracking server {safe_uri(uri)} refused {sent} (HTTP {answer.status_code}): "
            "set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD to a user of that server "
            "(for `locvit mlflow-server`: the two it was started with) in the environment of "
            "every job (sbatch passes it on)"
        )


class TrackingAuthError(LocvitError, PermissionError):
    """The tracking server answers but refuses the client's credentials (HTTP 401 or 403)."""


class TrackingUnreachable(LocvitError, ConnectionError):
    """The tracking server does not answer within the probe's time (named, with what was tried)."""


def _client_auth() -> dict:
    """The credentials MLflow's HTTP client would send, as keyword arguments of ``requests.get``."""
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"auth": (user, password)}
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    return {"headers": {"Authorization": f"Bearer {token}"}} if token else {}
