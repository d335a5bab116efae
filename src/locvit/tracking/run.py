"""A training run's MLflow run, and the test scores logged to it.

Training never stops for tracking (``TrainingTracker``): when the backend cannot
be reached, or fails mid-run, the run trains on, says so loudly on stderr, and its
``metrics.json`` keeps everything MLflow would have had; ``locvit sync-tracking``
(``locvit.tracking.sync``) uploads those records later. After the first failed
call no further call is made. Only rank 0 of a training creates a tracker.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shlex
import socket
import subprocess
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from locvit.config.run import flatten, peak_lr
from locvit.errors import InputError
from locvit.layout import RunFiles, StudyLayout
from locvit.tracking.backend import (
    bounded_http,
    check_reachable,
    current_uri,
    default_uri,
    find_run,
    log_metrics,
    log_params,
    retry,
    run_status,
    safe_uri,
    set_tags,
    setup,
)
from locvit.tracking.tree import lock_beside, seed_tags, variant_parent

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True)
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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


#: The environment variable that gives ``locvit train`` its seconds between system-metrics samples when
#: the command line does not (the workflow sets it from params' ``tracking.system_metrics_s``).
SYSTEM_METRICS_ENV = "LOCVIT_SYSTEM_METRICS_S"


def system_metrics_interval(given: float | None, params: dict | None = None) -> float:
    """Seconds between system-metrics samples: ``given`` (the command line), else the environment's
    ``SYSTEM_METRICS_ENV``, else ``params``' ``tracking.system_metrics_s``, else 0 (none)."""
    if given is not None:
        return max(0.0, float(given))
    env = os.environ.get(SYSTEM_METRICS_ENV)
    if env:
        try:
            return max(0.0, float(env))
        except ValueError:
            raise InputError(
                f"{SYSTEM_METRICS_ENV}={env!r} is not a number of seconds (0: no system metrics)"
            ) from None
    return float(params["tracking"]["system_metrics_s"]) if params else 0.0


# One training run's MLflow run -------------------------------------------------------------------

#: What a run folder uploads as artifacts: file name -> artifact folder (None: the run's root).
ARTIFACTS = {RunFiles.METRICS: None, RunFiles.BEST: "checkpoints"}


class TrainingTracker:
    """A training run's MLflow run, kept so that tracking can fail without stopping training.

    Every backend call goes through ``guard``: the first error is printed loudly to stderr (what failed, the
    backend, the command that uploads later) and turns tracking off for the run. ``record`` is what
    ``metrics.json`` keeps under ``"tracking"`` for ``sync_runs`` to rebuild the run. Life: ``for_run``,
    ``open`` (create under its variant's run, or resume), ``log_epoch``, then ``close`` or ``mark_failed``.
    ``seconds``: wall time spent in MLflow's calls so far.
    """

    def __init__(
        self,
        study: str,
        tracking_db: str | Path,
        out_dir: str | Path,
        run_name: str = "",
        tags: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        slurm_job_ids: list[str] | None = None,
        run_id: str | None = None,
    ):
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
        self.datasets: dict | None = None  # the manifest and split -> file, for the run's dataset inputs
        self.system_metrics_s = 0.0  # seconds between samples of MLflow's system metrics; 0: none
        self.monitor = None  # MLflow's SystemMetricsMonitor while it samples
        self.seconds = 0.0

    @classmethod
    def for_run(
        cls,
        cfg: dict,
        tracking_db: str | Path,
        out_dir: str | Path,
        manifest: dict,
        device: str,
        n_params: int,
        world_size: int,
        run_id: str | None = None,
        slurm_job_ids: list[str] = (),
        data: dict[str, Path] | None = None,
        system_metrics_s: float = 0.0,
        machine: dict | None = None,
    ) -> TrainingTracker:
        """The tracker of a training run (a ``locvit.config.run.run_config``) on its prepared data.

        ``slurm_job_ids``: the SLURM jobs that worked on the run so far (from last.pt), tagged with this one;
        ``data``: split -> FFCV file, logged as dataset inputs; ``system_metrics_s``: seconds between MLflow's
        system-metric samples, 0 for none; ``machine``: ``locvit.device.describe``'s, as ``machine.*`` tags.
        """
        jobs, provenance = slurm_provenance(list(slurm_job_ids))
        tags = {
            "study": cfg["study"],
            "variant": cfg["variant"],
            "model": cfg["model"],
            "seed": str(cfg["seed"]),
            "dataset": manifest["source"],
            "data_hash": manifest["data_hash"],
            "git_commit": git_commit(),
            "device": device,
            "run_config": json.dumps(cfg, sort_keys=True, separators=(",", ":")),
            **provenance,
            **{k: str(v) for k, v in flatten({"machine": machine}).items() if machine and v is not None},
        }
        params = {**flatten(cfg), "n_params": n_params, "world_size": world_size, "lr_peak": peak_lr(cfg["train"])}
        tracker = cls(
            cfg["study"], tracking_db, out_dir, f"{cfg['variant']}-seed{cfg['seed']}", tags, params, jobs, run_id=run_id
        )
        tracker.datasets = dict(manifest=manifest, files=dict(data or {}))
        tracker.system_metrics_s = float(system_metrics_s)
        return tracker

    @property
    def ok(self) -> bool:
        return self.error is None

    @contextlib.contextmanager
    def guard(self, what: str):
        """Run the block against the backend (HTTP bounded); on an error, record it, say so, go on."""
        started = time.perf_counter()
        try:
            with bounded_http():
                yield
        except Exception as err:  # whatever the backend raised: training goes on
            self.fail(what, err)
        finally:
            self.seconds += time.perf_counter() - started

    def connect(self):
        """Probe the backend and set up the study's experiment; an MlflowClient, or None when that failed."""
        with self.guard("connecting to the tracking backend"):
            import mlflow

            check_reachable(self.uri)
            self.experiment_id = setup(self.study, self.tracking_db)
            self.client = mlflow.MlflowClient()
        return self.client

    def open(
        self, history: list[dict], stale_run_id: str | None = None, on_created: Callable[[str], None] | None = None
    ) -> None:
        """Create the run's MLflow run, or set a resumed one (``run_id``) back to RUNNING; log the
        epochs of ``history`` it lacks.

        ``stale_run_id``: an abandoned run of another config in the same folder, marked KILLED
        if still RUNNING. ``on_created(run_id)`` is called as soon as a new run exists, before
        its params are logged (the caller records the id before any epoch). Never raises for
        the backend: a tracker whose backend failed trains on untracked.
        """
        client = self.connect()
        if client is None:
            return
        with self.guard("opening the MLflow run"):
            if stale_run_id and run_status(client, stale_run_id) == "RUNNING":
                retry(client.set_terminated, stale_run_id, status="KILLED")
            self.tags.update(
                seed_tags(
                    variant_parent(
                        client, self.experiment_id, self.study, self.tags["variant"], lock_beside(self.tracking_db)
                    )
                )
            )
            resumed = find_run(client, self.run_id)
            if resumed is not None:
                # Jobs recorded on the run but not in last.pt (killed before their first epoch) come first.
                self.slurm_job_ids, provenance = slurm_provenance(
                    resumed.data.tags.get("slurm_job_ids", "").split(",") + self.slurm_job_ids
                )
                self.tags.update(provenance)
                retry(client.update_run, self.run_id, status="RUNNING")
                # A run of an older locvit (no tree) is adopted by its variant's run.
                set_tags(self.run_id, {**provenance, **{k: v for k, v in self.tags.items() if k in seed_tags("")}})
                self.log_inputs(client, resumed)  # what a kill right after the run's creation left out
            else:
                if self.run_id is not None:
                    log.warning("MLflow run %s is not in %s; logging to a new run", self.run_id, safe_uri(self.uri))
                self.run_id = retry(
                    client.create_run, self.experiment_id, run_name=self.run_name, tags=self.tags
                ).info.run_id
                if on_created is not None:
                    on_created(self.run_id)
                self.log_inputs(client)
            logged = {m.step for m in retry(client.get_metric_history, self.run_id, "val_top1")}
            for row in history:  # epochs finished before an interruption but not logged
                if row["epoch"] not in logged:
                    log_metrics(self.run_id, {k: v for k, v in row.items() if k != "epoch"}, step=row["epoch"])
            self.start_monitor(resumed is not None)

    def start_monitor(self, resumed: bool) -> None:
        """Sample MLflow's system metrics every ``system_metrics_s`` (in a thread of MLflow's) into the run."""
        if self.system_metrics_s <= 0 or not self.ok or self.monitor is not None:
            return
        import psutil
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        psutil.cpu_percent()  # MLflow's CPU sample is the use since psutil's last call: else the first one reads 0

        quiet = logging.getLogger("mlflow.system_metrics")  # it says "started" and "stopped" at INFO each run
        quiet.setLevel(logging.WARNING)
        self.monitor = SystemMetricsMonitor(
            self.run_id, sampling_interval=self.system_metrics_s, resume_logging=resumed, tracking_uri=self.uri
        )
        self.monitor.start()

    def stop_monitor(self) -> None:
        """Stop sampling and log the last samples (only while tracking works: a dead backend would hold
        the join; the sampling thread is a daemon and ends with the process).

        MLflow's sampler logs a sample only once a whole interval has passed, and drops the one it is
        taking when stopped: a run shorter than an interval would have none, so it gets that one.
        """
        monitor, self.monitor = self.monitor, None
        if monitor is not None and self.ok:
            with self.guard("logging the last system metrics"):
                monitor.finish()
                if "system/cpu_utilization_percentage" not in retry(self.client.get_run, self.run_id).data.metrics:
                    monitor.collect_metrics()
                    monitor.publish_metrics(monitor.aggregate_metrics())
                    monitor.mlflow_logger.flush()

    def log_inputs(self, client, logged=None) -> None:
        """Log the run's params and datasets, those that ``logged`` (the MLflow run as found) lacks."""
        params = {k: v for k, v in self.params.items() if logged is None or k not in logged.data.params}
        if params:
            log_params(self.run_id, params)
        if self.datasets and self.datasets["files"] and (logged is None or not logged.inputs.dataset_inputs):
            log_datasets(client, self.run_id, self.datasets["manifest"], self.datasets["files"])

    def close(self, metrics: dict) -> None:
        """Log best_val_top1 and the run folder's artifacts, mark the run FINISHED (if tracking is still on)."""
        self.stop_monitor()
        if self.ok and self.run_id:
            with self.guard("closing the run (best_val_top1, artifacts, FINISHED)"):
                close_run(self.client, self.run_id, self.out_dir, metrics)

    def mark_failed(self) -> None:
        self.stop_monitor()
        if self.ok and self.run_id and self.client is not None:
            with self.guard("marking the run FAILED"):
                retry(self.client.set_terminated, self.run_id, status="FAILED")

    def log_epoch(self, row: dict[str, float]) -> None:
        """Log one history row (``epoch`` is the step); nothing once tracking has failed."""
        if self.ok and self.run_id:
            with self.guard(f"logging epoch {row['epoch']}"):
                log_metrics(self.run_id, {k: v for k, v in row.items() if k != "epoch"}, step=row["epoch"])

    def fail(self, what: str, err: BaseException) -> None:
        self.error, self.failed_during = f"{type(err).__name__}: {err}"[:4000], what
        log.warning("%s", self.message())

    def sync_command(self) -> str:
        return sync_command(self.uri, self.out_dir, self.tracking_db)

    def message(self) -> str:
        """The loud failure notice (printed when tracking fails and again when the run ends)."""
        return failure_notice(
            f"{self.failed_during}: this run is NOT in MLflow from here on",
            f'Training goes on; everything is kept in {self.out_dir} (metrics.json: "tracking" status "failed")',
            self.run_name or str(self.out_dir),
            self.uri,
            self.error or "",
            "Upload the run once the backend answers again (after training has finished)",
            self.sync_command(),
        )

    def record(self) -> dict[str, Any]:
        return {
            "status": "ok" if self.ok else "failed",
            "uri": safe_uri(self.uri),
            "error": self.error,
            "failed_during": self.failed_during,
            "experiment": self.study,
            "run_name": self.run_name,
            "tags": self.tags,
            "params": self.params,
            "artifacts": ARTIFACTS,
            "seconds": round(self.seconds, 3),
        }


def close_run(client, run_id: str, out_dir: Path, metrics: dict) -> None:
    """best_val_top1, the run folder's artifacts and its best checkpoint as an MLflow model; FINISHED."""
    log_metrics(run_id, {"best_val_top1": metrics["best_val_top1"]}, step=metrics["best_epoch"])
    for name, artifact_path in ARTIFACTS.items():  # metrics.json, checkpoints/best.pt
        retry(client.log_artifact, run_id, str(Path(out_dir) / name), artifact_path)
    log_best_model(run_id, RunFiles.at(out_dir).best, metrics["best_epoch"])
    retry(client.set_terminated, run_id, status="FINISHED")


#: The packages an MLflow model of ours needs (given, so MLflow does not infer them: inferring
#: imports the model in a subprocess, seconds per run).
MODEL_REQUIREMENTS = ("torch", "timm", "locvit")


def mlflow_pytorch():
    """``mlflow.pytorch``, imported without the root-logger handler its import adds (its Lightning autologger calls
    ``logging.basicConfig``): locvit's messages go to the root logger too, so a job's every line from then on,
    its second seed's epochs, would print twice."""
    handlers, level = list(logging.root.handlers), logging.root.level
    import mlflow.pytorch

    for handler in set(logging.root.handlers) - set(handlers):
        logging.root.removeHandler(handler)
    logging.root.setLevel(level)
    return mlflow.pytorch


def log_best_model(run_id: str, checkpoint: Path, step: int) -> str:
    """Log a run's best checkpoint as an MLflow PyTorch model named ``model``; return its URI.

    The whole module is pickled (locvit's and timm's classes must be importable where it is
    loaded: ``mlflow.pytorch.load_model`` then gives the logits of locvit's own loader), with
    one seeded input image as the example, from which MLflow records the signature, and at the
    best epoch's step, so the metrics logged at that step (val and test top-1) are linked to it
    in the Models tab.
    """
    from importlib.metadata import version

    import mlflow
    import torch

    from locvit import models
    from locvit.checkpoint import load_checkpoint

    state = load_checkpoint(checkpoint)
    model = models.load(state, "cpu")
    size = int(state["config"]["model_kwargs"].get("img_size", 224))
    example = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0)).numpy()
    requirements = [f"{p}=={version(p)}" for p in MODEL_REQUIREMENTS]
    quiet = logging.getLogger("mlflow.pytorch")  # it warns that a pickle runs code when loaded: ours are our own
    level, quiet.level = quiet.level, logging.ERROR
    try:
        # Inside the run (not run_id=): the model is created in the run's experiment, not MLflow's default one.
        with mlflow.start_run(run_id=run_id, log_system_metrics=False):
            info = retry(
                mlflow_pytorch().log_model,
                model,
                name="model",
                input_example=example,
                serialization_format="pickle",
                step=step,
                pip_requirements=requirements,
            )
    finally:
        quiet.level = level
    return info.model_uri


def log_datasets(client, run_id: str, manifest: dict, files: dict[str, Path]) -> None:
    """The run's dataset inputs, one per split: name ``<source>-<split>``, digest the manifest's data
    hash, source the FFCV file, tags context, split and image count (the UI's Datasets column)."""
    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag

    contexts = {"train": "training", "val": "validation", "test": "testing"}
    inputs = []
    for split, path in files.items():
        with warnings.catch_warnings():  # MLflow registers its local-file source twice and says so
            warnings.filterwarnings("ignore", message=".*can be interpreted in multiple ways")
            source = resolve_dataset_source(str(Path(path).resolve()))
        dataset = MetaDataset(source, name=f"{manifest['source']}-{split}", digest=manifest["data_hash"])
        inputs.append(
            DatasetInput(
                dataset._to_mlflow_entity(),
                tags=[
                    InputTag("mlflow.data.context", contexts.get(split, split)),
                    InputTag("split", split),
                    InputTag("images", str(manifest["splits"][split]["size"])),
                ],
            )
        )
    retry(client.log_inputs, run_id, datasets=inputs)


def confirm_finished(metrics: dict, out_dir: Path, tracking_db: Path) -> None:
    """A skipped (finished) run whose MLflow run was left open by a kill after metrics.json: close it.

    A run trained untracked, or a backend that cannot be reached now, only gets a reminder.
    """
    tracker = TrainingTracker(metrics["study"], tracking_db, out_dir, run_id=metrics.get("mlflow_run_id"))
    if (metrics.get("tracking") or {}).get("status") == "failed":
        log.warning("%s was trained while MLflow tracking failed; upload it with: %s", out_dir, tracker.sync_command())
        return
    client = tracker.connect()
    if client is None:
        return
    with tracker.guard("closing the finished run"):
        status = run_status(client, metrics["mlflow_run_id"])
        if status is not None and status != "FINISHED":
            close_run(client, metrics["mlflow_run_id"], out_dir, metrics)


def log_evaluation(
    study: str,
    tracking_db: Path,
    state: dict,
    out: Path,
    metrics: dict[str, float],
    run_dir: Path,
    manifest: dict | None = None,
    data: dict[str, Path] | None = None,
) -> None:
    """Log a test score to the checkpoint's MLflow run; a backend that fails is reported, not fatal.

    As in training: one short probe of a server, bounded HTTP retries, and on failure a
    loud message with the command that uploads the result later (``locvit sync-tracking``
    of ``run_dir``, the checkpoint's run folder, reading ``out``, the evaluation file).
    """
    uri = default_uri(tracking_db)
    started = time.perf_counter()
    try:
        with bounded_http():
            check_reachable(uri)
            setup(study, tracking_db)
            if log_to_run(state["mlflow_run_id"], metrics, step=state["epoch"]) and manifest and data:
                import mlflow

                log_datasets(mlflow.MlflowClient(), state["mlflow_run_id"], manifest, data)
        # the job log's record of what tracking cost (benchmarks/bench_pipeline.py sums it)
        log.info("MLflow: %s logged in %.3f s", ", ".join(metrics), time.perf_counter() - started)
    except Exception as err:  # any backend failure: the evaluation file is already written
        log.warning(
            "%s",
            failure_notice(
                f"logging {', '.join(metrics)}",
                f"The result is kept in {out}",
                state["config"]["variant"]
                + f"-seed{state['config']['seed']} ({state['mlflow_run_id'] or 'no MLflow run yet'})",
                uri,
                f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}",
                "Upload it once the backend answers again",
                sync_command(uri, run_dir, tracking_db, out.parent.parent),
            ),
        )


def sync_command(uri: str, runs_dir: Path, tracking_db: Path, eval_dir: Path | None = None) -> str:
    """The ``locvit sync-tracking`` command line that uploads ``runs_dir`` (and its test results) to ``uri``."""
    env = f"MLFLOW_TRACKING_URI={shlex.quote(uri)} " if os.environ.get("MLFLOW_TRACKING_URI") else ""
    extra = f" --eval-dir {shlex.quote(str(eval_dir))}" if eval_dir is not None else ""
    return (
        f"{env}locvit sync-tracking --runs-dir {shlex.quote(str(runs_dir))} "
        f"--tracking-db {shlex.quote(str(tracking_db))}{extra}"
    )


def untracked(study_dir: Path, tracking_db: Path) -> str | None:
    """A sentence on the study's training runs that are not in MLflow (their metrics.json says tracking failed):
    how many, the backend that did not answer and why, and the command that uploads them; None where there are
    none. Snakemake prints it when the workflow ends, the report puts it below its results table."""
    runs = StudyLayout(study_dir).runs
    failed = []
    for path in sorted(runs.glob(f"*/*/{RunFiles.METRICS}")):
        try:
            record = json.loads(path.read_text()).get("tracking") or {}
        except (OSError, ValueError, AttributeError):
            continue  # a file being written, or not a run's record: the step that reads it says so
        if record.get("status") == "failed":
            failed.append((f"{path.parent.parent.name} {path.parent.name}", record))
    if not failed:
        return None
    names = ", ".join(name for name, _ in failed[:4]) + (", ..." if len(failed) > 4 else "")
    first = failed[0][1]
    upload = sync_command(first.get("uri") or "", runs, tracking_db)
    return (
        f"MLflow: {len(failed)} training run(s) are not in MLflow ({names}): the tracking backend "
        f"{first.get('uri')} did not answer ({first.get('error') or 'no error recorded'}); their records are "
        f"kept in their metrics.json. Upload them once it answers: {upload}"
    )


def failure_notice(during: str, consequence: str, subject: str, uri: str, error: str, upload: str, command: str) -> str:
    """The loud block a step prints when tracking fails: what, the backend, the error, how to upload later."""
    bar = "!" * 100
    error = error if len(error) < 600 else error[:600] + " ..."
    return "\n".join(
        [
            bar,
            f"!! MLFLOW TRACKING FAILED while {during}.",
            f"!! {consequence}.",
            f"!!   run:     {subject}",
            f"!!   backend: {safe_uri(uri)}",
            f"!!   error:   {error}",
            f"!! {upload}:",
            f"!!   {command}",
            bar,
        ]
    )


def log_to_run(run_id: str, metrics: dict[str, float], step: int) -> bool:
    """Log to an existing run; if the backend does not know it, warn and go on.

    That happens after ``dvc pull`` on a fresh clone: the checkpoints come back, the
    MLflow database of the machine that trained them does not. The caller's own
    result files are still written.
    """
    from mlflow.exceptions import MlflowException

    if not run_id:  # trained while the backend was unreachable: no run yet (locvit sync-tracking makes it)
        log.warning(
            "this checkpoint names no MLflow run (its training was not tracked); %s written to the local "
            "result file only. Upload it with locvit sync-tracking.",
            ", ".join(metrics),
        )
        return False
    try:
        log_metrics(run_id, metrics, step)
        return True
    except MlflowException as err:
        if "not found" not in str(err).lower() and "does not exist" not in str(err).lower():
            raise
        log.warning(
            "MLflow run %s is not in the tracking backend %s; %s written to the local result file only.",
            run_id,
            current_uri(),
            ", ".join(metrics),
        )
        return False
