"""MLflow tracking: one run per (variant, seed) in an experiment named after the study.

The default backend is a SQLite file in the study's results folder (MLflow 3
deprecates the file store); ``MLFLOW_TRACKING_URI`` overrides it (an ``mlflow
server`` for clusters). SQLite answers "database is locked" when several jobs write
at once, so every call goes through :func:`retry` (MLflow's own sessions wait up to
20 s on a lock, ``PRAGMA busy_timeout``; :func:`retry` tries again after that).

Training never stops for tracking (:class:`TrainingTracker`): when the backend cannot
be reached, or fails mid-run, the run trains on, says so loudly on stderr, and its
``metrics.json`` keeps everything MLflow would have had; ``locvit sync-tracking``
(:func:`sync_runs`) uploads those records later. Time spent on a backend that is
gone is bounded (see :data:`HTTP_LIMITS`): one probe of at most
:data:`PROBE_TIMEOUT_S` to connect (:data:`PROBE_READ_TIMEOUT_S` for the answer of a
server that is up but busy) before the run starts, and after the first failed call no
further call is made.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shlex
import socket
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


def retry(fn: Callable[..., T], *args, attempts: int | None = None, **kwargs) -> T:
    """Call ``fn`` retrying transient backend errors (locked SQLite, a busy server).

    ``attempts`` defaults to 8, or to 1 for an HTTP(S) server: MLflow's HTTP client
    retries those itself (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``), and a second layer of
    retries would multiply the wait on a server that is gone.
    """
    if attempts is None:
        attempts = 1 if _is_http(_current_uri()) else 8
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


def log_to_run(run_id: str, metrics: dict[str, float], step: int) -> bool:
    """Log to an existing run; if the backend does not know it, warn and go on.

    That happens after ``dvc pull`` on a fresh clone: the checkpoints come back, the
    MLflow database of the machine that trained them does not. The caller's own
    result files are still written.
    """
    from mlflow.exceptions import MlflowException

    if not run_id:  # trained while the backend was unreachable: no run yet (locvit sync-tracking makes it)
        print(f"WARNING: this checkpoint names no MLflow run (its training was not tracked); "
              f"{', '.join(metrics)} written to the local result file only. Upload it with locvit sync-tracking.",
              file=sys.stderr, flush=True)
        return False
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
HTTP_LIMITS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
#: One try, before the run is created: does the server answer at all? A closed port or an
#: unreachable host fails within PROBE_TIMEOUT_S; a server that has accepted the connection
#: gets PROBE_READ_TIMEOUT_S to answer, since one that many jobs start against at once can
#: take longer than 5 s (seen on a 2-core machine with five runs importing torch at once).
PROBE_TIMEOUT_S = 5.0
PROBE_READ_TIMEOUT_S = 30.0


@contextlib.contextmanager
def bounded_http():
    """Apply :data:`HTTP_LIMITS` (where the environment does not set them) for the block."""
    added = [k for k in HTTP_LIMITS if k not in os.environ]
    os.environ.update({k: HTTP_LIMITS[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def check_reachable(uri: str, timeout: float = PROBE_TIMEOUT_S, read_timeout: float = PROBE_READ_TIMEOUT_S) -> None:
    """Raise ConnectionError unless the HTTP(S) server at ``uri`` accepts a connection within
    ``timeout`` s and answers within ``read_timeout`` s more (one try).

    Any HTTP answer counts (a proxy may refuse ``/health`` without credentials): this only
    tells a dead or unreachable server from a live one. Other backends are not probed.
    """
    if not _is_http(uri):
        return
    import requests

    verify = os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or \
        os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() not in ("true", "1")
    try:
        requests.get(uri.rstrip("/") + "/health", timeout=(timeout, read_timeout), verify=verify)
    except requests.RequestException as err:
        raise ConnectionError(f"the tracking server {safe_uri(uri)} cannot be reached (one try: at most "
                              f"{timeout:g} s to connect, {read_timeout:g} s to answer: "
                              f"{type(err).__name__}: {err})") from err


# SLURM provenance --------------------------------------------------------------------------------


def slurm_provenance(previous: list[str]) -> tuple[list[str], dict[str, str]]:
    """The SLURM jobs that worked on a run, and the run's provenance tags.

    ``previous``: the job ids recorded so far (last.pt, the MLflow run's tag). Under
    SLURM the current job is appended (once: a requeued job keeps its id and counts up
    ``SLURM_RESTART_COUNT``) and the tags are ``slurm_job_id``, ``slurm_job_ids``
    (comma-joined, oldest first), ``slurm_restart_count`` when set; ``hostname`` always.
    """
    ids = list(dict.fromkeys(str(i) for i in previous if i))
    tags = {"hostname": socket.gethostname()}
    job = os.environ.get("SLURM_JOB_ID")
    if job:
        if job not in ids:
            ids.append(job)
        tags.update(slurm_job_id=job, slurm_job_ids=",".join(ids))
        if os.environ.get("SLURM_RESTART_COUNT"):
            tags["slurm_restart_count"] = os.environ["SLURM_RESTART_COUNT"]
    return ids, tags


# One training run's MLflow run -------------------------------------------------------------------

#: What a run folder uploads as artifacts: file name -> artifact folder (None: the run's root).
ARTIFACTS = {"metrics.json": None, "best.pt": "checkpoints"}


class TrainingTracker:
    """A training run's MLflow run, kept so that tracking can fail without stopping training.

    Every backend call goes through :meth:`guard`: the first error is recorded, printed
    loudly to stderr (what failed, the backend, the command that uploads the record
    later) and turns tracking off for the rest of the run. :meth:`record` is what
    ``metrics.json`` keeps under ``"tracking"`` so that :func:`sync_runs` can rebuild the
    run: status, backend, error, experiment, run name, tags, params and artifacts (every
    epoch's metrics are the record's ``history``).
    """

    def __init__(self, study: str, tracking_db: str | Path, out_dir: str | Path, run_name: str = "",
                 tags: dict[str, str] | None = None, params: dict[str, Any] | None = None,
                 slurm_job_ids: list[str] | None = None, run_id: str | None = None):
        self.study, self.tracking_db, self.out_dir, self.run_name = study, Path(tracking_db), Path(out_dir), run_name
        self.uri = default_uri(tracking_db)
        self.tags = dict(tags or {})
        self.params = {k: str(v)[:6000] for k, v in (params or {}).items()}  # as MLflow stores them
        self.slurm_job_ids = list(slurm_job_ids or [])
        self.run_id = run_id
        self.experiment_id: str | None = None
        self.client = None  # an MlflowClient once connected
        self.error: str | None = None
        self.failed_during: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @contextlib.contextmanager
    def guard(self, what: str):
        """Run the block against the backend (HTTP bounded); on an error, record it, say so, go on."""
        try:
            with bounded_http():
                yield
        except Exception as err:  # whatever the backend raised: training goes on
            self.fail(what, err)

    def connect(self):
        """Probe the backend and set up the study's experiment; an MlflowClient, or None when that failed."""
        with self.guard("connecting to the tracking backend"):
            import mlflow

            check_reachable(self.uri)
            self.experiment_id = setup(self.study, self.tracking_db)
            self.client = mlflow.MlflowClient()
        return self.client

    def log_epoch(self, row: dict[str, float]) -> None:
        """Log one history row (``epoch`` is the step); nothing once tracking has failed."""
        if self.ok and self.run_id:
            with self.guard(f"logging epoch {row['epoch']}"):
                log_metrics(self.run_id, {k: v for k, v in row.items() if k != "epoch"}, step=row["epoch"])

    def fail(self, what: str, err: BaseException) -> None:
        self.error, self.failed_during = f"{type(err).__name__}: {err}"[:4000], what
        print(self.message(), file=sys.stderr, flush=True)

    def sync_command(self) -> str:
        return sync_command(self.uri, self.out_dir, self.tracking_db)

    def message(self) -> str:
        """The loud failure notice (printed when tracking fails and again when the run ends)."""
        return failure_notice(
            f"{self.failed_during}: this run is NOT in MLflow from here on",
            f"Training goes on; everything is kept in {self.out_dir} (metrics.json: \"tracking\" status \"failed\")",
            self.run_name or str(self.out_dir), self.uri, self.error or "",
            "Upload the run once the backend answers again (after training has finished)", self.sync_command())

    def record(self) -> dict[str, Any]:
        return {"status": "ok" if self.ok else "failed", "uri": safe_uri(self.uri), "error": self.error,
                "failed_during": self.failed_during, "experiment": self.study, "run_name": self.run_name,
                "tags": self.tags, "params": self.params, "artifacts": ARTIFACTS}


def sync_command(uri: str, runs_dir: Path, tracking_db: Path, eval_dir: Path | None = None) -> str:
    """The ``locvit sync-tracking`` command line that uploads ``runs_dir`` (and its test results) to ``uri``."""
    env = f"MLFLOW_TRACKING_URI={shlex.quote(uri)} " if os.environ.get("MLFLOW_TRACKING_URI") else ""
    extra = f" --eval-dir {shlex.quote(str(eval_dir))}" if eval_dir is not None else ""
    return (f"{env}locvit sync-tracking --runs-dir {shlex.quote(str(runs_dir))} "
            f"--tracking-db {shlex.quote(str(tracking_db))}{extra}")


def failure_notice(during: str, consequence: str, subject: str, uri: str, error: str, upload: str,
                   command: str) -> str:
    """The loud block a step prints when tracking fails: what, the backend, the error, how to upload later."""
    bar = "!" * 100
    error = error if len(error) < 600 else error[:600] + " ..."
    return "\n".join([
        bar,
        f"!! MLFLOW TRACKING FAILED while {during}.",
        f"!! {consequence}.",
        f"!!   run:     {subject}",
        f"!!   backend: {safe_uri(uri)}",
        f"!!   error:   {error}",
        f"!! {upload}:",
        f"!!   {command}",
        bar,
    ])


# Uploading records later (locvit sync-tracking) ----------------------------------------------------


def _batches(items: list, size: int):
    for start in range(0, len(items), size):
        yield items[start:start + size]


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


def find_evaluation(folder: Path, metrics: dict, eval_dir: Path | None) -> dict | None:
    """The run's test result: ``<eval_dir>/<variant>/seed<k>.json`` or (mask-search rounds) ``eval.json``."""
    from locvit.io import read_json

    candidates = [folder / "eval.json"]
    if eval_dir is not None:
        candidates.append(eval_dir / metrics["variant"] / f"seed{metrics['seed']}.json")
    for path in candidates:
        if path.is_file():
            result = read_json(path, "evaluation file")
            if all(result.get(k) == metrics.get(k) for k in ("study", "variant", "seed")):
                return result
    return None


def _params_from_checkpoint(folder: Path, metrics: dict) -> dict[str, str]:
    """Params of a record written before metrics.json kept them: rebuilt from best.pt's config."""
    from locvit.config import flatten
    from locvit.train.checkpoint import load_checkpoint
    from locvit.train.loop import peak_lr

    cfg = load_checkpoint(folder / "best.pt")["config"]
    params = {**flatten(cfg), "n_params": metrics["n_params"], "world_size": metrics.get("world_size", 1),
              "lr_peak": peak_lr(cfg["train"])}
    return {k: str(v)[:6000] for k, v in params.items()}


def _upload(client, experiment_id: str, folder: Path, metrics: dict, run, evaluation: dict | None,
            uri: str) -> tuple[str, int]:
    """Create (or complete) the run of a record; return its id and the number of metric points logged."""
    from mlflow.entities import Metric

    from locvit.io import write_json

    record = metrics.get("tracking") or {}
    tags = {"study": metrics["study"], "variant": metrics["variant"], "model": metrics["model"],
            "seed": str(metrics["seed"]), **record.get("tags", {})}
    if metrics.get("slurm_job_ids") and "slurm_job_ids" not in tags:
        tags["slurm_job_ids"] = ",".join(metrics["slurm_job_ids"])
    params = record.get("params") or _params_from_checkpoint(folder, metrics)
    if run is None:
        run = retry(client.create_run, experiment_id, tags=tags,
                    run_name=record.get("run_name") or f"{metrics['variant']}-seed{metrics['seed']}")
    else:  # the run got this far before tracking failed: complete it
        set_tags(run.info.run_id, tags)
    run_id = run.info.run_id
    log_params(run_id, {k: v for k, v in params.items() if k not in run.data.params})
    points = [(k, v, row["epoch"]) for row in metrics["history"] for k, v in row.items() if k != "epoch"]
    points.append(("best_val_top1", metrics["best_val_top1"], metrics["best_epoch"]))
    if evaluation is not None:
        split = evaluation["split"]
        points += [(f"{split}_{m}", evaluation[f"{split}_{m}"], evaluation["checkpoint_epoch"]) for m in ("top1", "loss")]
    logged = {key: {m.step for m in retry(client.get_metric_history, run_id, key)} if key in run.data.metrics else set()
              for key in {k for k, _, _ in points}}
    now = int(time.time() * 1000)
    missing = [Metric(k, float(v), now, int(s)) for k, v, s in points if s not in logged[k]]
    for batch in _batches(missing, 900):  # MLflow takes at most 1000 metrics per batch
        retry(client.log_batch, run_id, metrics=batch)
    # The record names its run before its metrics.json is uploaded, so the artifact says so too.
    synced = {**record, "status": "ok", "uri": safe_uri(uri), "error": None, "failed_during": None,
              "synced_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "error_before_sync": record.get("error")}
    write_json(folder / "metrics.json", {**metrics, "mlflow_run_id": run_id, "tracking": synced})
    for name, artifact_path in (record.get("artifacts") or ARTIFACTS).items():
        if (folder / name).is_file():
            retry(client.log_artifact, run_id, str(folder / name), artifact_path)
    retry(client.set_terminated, run_id, status="FINISHED")
    return run_id, len(missing)


def sync_runs(runs_dir: str | Path, tracking_db: str | Path, eval_dir: str | Path | None = None,
              log: Callable[[str], None] = print) -> dict[str, list[str]]:
    """Upload every run record under ``runs_dir`` (any depth) that the tracking backend lacks.

    A run folder (one with a training ``metrics.json``) is uploaded when its record says
    tracking failed, its ``mlflow_run_id`` is unknown to the backend, or its MLflow run is
    not FINISHED: the run is created in the study's experiment (or, when the backend
    knows it, completed), with params, tags, every epoch's metrics at their steps,
    ``best_val_top1``, the test result when there is one (``<eval_dir>/<variant>/seed<k>.json``,
    ``eval_dir`` defaulting to ``eval/`` beside ``runs_dir``, or ``eval.json`` in the run
    folder), ``metrics.json`` and ``best.pt`` as artifacts, and marked FINISHED; then
    ``metrics.json`` is rewritten (atomically) with the run's id and status ``ok``. A run
    that is complete but lacks its test result gets just that. Anything else is left
    alone, so a second call uploads nothing. Returns the folders by outcome:
    ``uploaded``, ``evaluation`` (test result only), ``up_to_date``, ``failed``.
    """
    import mlflow

    from locvit.io import read_json

    runs_dir = Path(runs_dir)
    eval_dir = Path(eval_dir) if eval_dir is not None else runs_dir.parent / "eval"
    uri = default_uri(tracking_db)
    outcome: dict[str, list[str]] = {"uploaded": [], "evaluation": [], "up_to_date": [], "failed": []}
    experiments: dict[str, str] = {}
    with bounded_http():
        check_reachable(uri)
        for folder in sorted(p.parent for p in runs_dir.rglob("metrics.json")):
            metrics = read_json(folder / "metrics.json", "run record")
            if not isinstance(metrics, dict) or not {"study", "variant", "seed", "history"} <= set(metrics):
                continue  # another file of that name, not a training record
            try:
                if metrics["study"] not in experiments:
                    experiments[metrics["study"]] = setup(metrics["study"], tracking_db)
                client = mlflow.MlflowClient()
                run = find_run(client, metrics.get("mlflow_run_id"))
                evaluation = find_evaluation(folder, metrics, eval_dir)
                test_key = f"{evaluation['split']}_top1" if evaluation else None
                complete = (metrics.get("tracking") or {}).get("status") != "failed" and run is not None \
                    and run.info.status == "FINISHED"
                if complete and (test_key is None or test_key in run.data.metrics):
                    outcome["up_to_date"].append(str(folder))
                elif complete:
                    split, step = evaluation["split"], evaluation["checkpoint_epoch"]
                    log_metrics(run.info.run_id, {f"{split}_top1": evaluation[f"{split}_top1"],
                                                  f"{split}_loss": evaluation[f"{split}_loss"]}, step=step)
                    outcome["evaluation"].append(str(folder))
                    log(f"{folder}: test result logged to MLflow run {run.info.run_id}")
                else:
                    run_id, n = _upload(client, experiments[metrics["study"]], folder, metrics, run, evaluation, uri)
                    outcome["uploaded"].append(str(folder))
                    log(f"{folder}: uploaded to MLflow run {run_id} ({n} metric values"
                        f"{', test result' if evaluation else ''}; metrics.json updated)")
            except Exception as err:  # one bad record does not stop the others
                outcome["failed"].append(str(folder))
                log(f"{folder}: NOT uploaded: {type(err).__name__}: {err}")
    return outcome
