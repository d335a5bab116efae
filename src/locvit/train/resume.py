"""Resume: skip, resume or start over, planned from what a run folder holds.

``locvit train`` decides from the files in the run's folder (:func:`plan_run`, which only reads;
the loop restores the state, :meth:`locvit.train.state.TrainState.restore`):

* ``metrics.json`` and ``best.pt`` exist and ``metrics.json``'s run key is this run's:
  **skip**, the run is finished.
* ``last.pt`` exists, its run key is this run's and it is not marked finished:
  **resume** after its epoch, into the same MLflow run.
* ``last.pt`` is this run's and marked finished, but ``metrics.json`` is gone (Snakemake
  removes a job's outputs before re-running it): with ``keep_finished`` (a job that
  trains a variant's seeds, re-run because another of its runs was cut or added),
  **resume** into zero epochs, which writes best.pt and metrics.json back; without it,
  train from scratch (that is how ``--forcerun`` asks for a one-run job's re-training).
* anything else: **train from scratch** (and say why when files were there: another
  config or data). Rank 0 then overwrites the folder.
  A run killed before its first last.pt starts over into the MLflow run it had
  created (recorded in ``mlflow_run.json`` with the run key, :attr:`locvit.layout.RunFiles.record`),
  so a run keeps one MLflow run however often it is killed.

The run key hashes the resolved run config, the training data's hash (from the manifest) and the
model's code: a changed recipe, model, model code or dataset never continues an old run.

What last.pt holds: :class:`locvit.train.state.RunCheckpoints`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from locvit.checkpoint import model_code
from locvit.config.run import flatten
from locvit.layout import RunFiles
from locvit.train.state import read_last


@dataclass
class Plan:
    """What :func:`plan_run` decided; the loop carries it out."""

    action: str  # "fresh", "resume" or "skip"
    key: str  # this run's run key
    message: str = ""
    state: dict[str, Any] | None = None  # last.pt, to resume from
    metrics: dict[str, Any] | None = None  # metrics.json of a finished run
    stale_run_id: str | None = None  # MLflow run of an unfinished last.pt that is started over
    run_id: str | None = None  # MLflow run to train into from scratch (created by a run killed before last.pt)


def recorded_run(files: RunFiles) -> dict:
    """What the run's MLflow record says, ``{"run_id", "run_key"}`` (``{}`` when absent or unreadable)."""
    try:
        record = json.loads(files.record.read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def run_key(cfg: dict, data_hash: str) -> str:
    """The config, the data's hash and the model's code (:func:`locvit.checkpoint.model_code`): a change to any
    of them trains the run again rather than restoring or resuming it."""
    code = model_code(cfg)
    text = json.dumps({"config": cfg, "data_hash": data_hash, **({"model_code": code} if code else {})}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _differences(old: dict, new: dict) -> str:
    a, b = flatten(old), flatten(new)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:6]) + (" ..." if len(keys) > 6 else "")


def plan_run(cfg: dict, data_hash: str, out_dir: Path, keep_finished: bool = False) -> Plan:
    """Skip, resume or start over: see the module docstring. Reads files, writes nothing."""
    key = run_key(cfg, data_hash)
    files = RunFiles.at(out_dir)
    metrics_path, last_path = files.metrics, files.last
    if metrics_path.is_file() and files.best.is_file():
        try:
            metrics = json.loads(metrics_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            metrics = {}  # half-written by hand or by an old version: not a finished run of ours
        if metrics.get("run_key") == key:
            return Plan(
                "skip",
                key,
                f"{out_dir}: already trained (metrics.json matches this config); not retraining",
                metrics=metrics,
            )
    if not last_path.is_file():
        record = recorded_run(files)
        if record.get("run_key") == key:  # killed before its first epoch ended: the same MLflow run
            return Plan(
                "fresh",
                key,
                f"{out_dir}: starting over into MLflow run {record.get('run_id')} "
                "(interrupted before its first epoch ended)",
                run_id=record.get("run_id"),
            )
        return Plan("fresh", key, stale_run_id=record.get("run_id"))  # another config's, if any
    state = read_last(files)
    if state.get("run_key") != key:
        if "run_key" not in state:
            why = "was written by an older locvit (no run key)"
        elif state.get("config") != cfg:
            why = f"has another config ({_differences(state['config'], cfg)})"
        else:
            why = (
                "was trained on other data or by other model code (the manifest's data_hash or a model module differs)"
            )
        stale = None if state.get("finished") else state.get("mlflow_run_id")
        return Plan("fresh", key, f"{last_path} {why}; training from scratch", stale_run_id=stale)
    if state.get("finished") and keep_finished:
        return Plan(
            "resume",
            key,
            f"{out_dir}: finished run without metrics.json (removed by a re-run of its "
            "job); restoring best.pt and metrics.json from last.pt, not retraining",
            state=state,
        )
    if state.get("finished"):
        return Plan(
            "fresh", key, f"{out_dir}: finished run without metrics.json (removed for a re-run); training from scratch"
        )
    where = f"epoch {state['epoch'] + 1} of {cfg['train']['epochs']}"
    if state.get("partial"):
        where = f"step {state['step']} (batch {state['partial']['batches']} of epoch {state['epoch'] + 2})"
    return Plan(
        "resume", key, f"{last_path}: resuming after {where} (MLflow run {state['mlflow_run_id']})", state=state
    )
