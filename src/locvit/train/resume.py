"""Resume: what a run folder holds, and the state that carries a run over an interruption.

``locvit train`` decides from the files in the run's folder (:func:`plan_run`):

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
  created (recorded in ``mlflow_run.json`` with the run key, :data:`RUN_RECORD`), so a
  run keeps one MLflow run however often it is killed.

The run key hashes the resolved run config and the training data's hash (from the
manifest): a changed recipe, model or dataset never continues an old run.

``last.pt`` (written after every epoch) holds everything the next epoch depends on:
weights, optimiser, EMA, step and epoch counters (the lr is a function of the step;
FFCV's order of the epoch's index), every rank's generator states, the best epoch's
weights (Snakemake deletes ``best.pt`` before re-running a job) and the history. A run
stopped on request within an epoch (:mod:`locvit.train.stop`) writes it at that step, with
the epoch's progress (``partial``), and resumes at the next step.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from locvit.config import flatten
from locvit.train.checkpoint import load_checkpoint, save_checkpoint, seed_everything, set_rng_state


@dataclass
class Progress:
    """Where a run is: what ``last.pt`` saves besides the weights and the optimiser."""

    epoch: int = 0  # the next epoch to train
    step: int = 0  # optimiser steps done
    history: list[dict] = field(default_factory=list)
    best_top1: float = -1.0
    best_epoch: int = -1
    best_model: dict[str, torch.Tensor] | None = None  # CPU copy of the best epoch's evaluated weights
    run_id: str | None = None  # MLflow
    train_time_s: float = 0.0
    partial: dict | None = None  # epoch ``epoch`` stopped within: train_one_epoch's sums and batches done


@dataclass
class Plan:
    action: str  # "fresh", "resume" or "skip"
    key: str  # this run's run key
    message: str = ""
    state: dict[str, Any] | None = None  # last.pt, to resume from
    metrics: dict[str, Any] | None = None  # metrics.json of a finished run
    stale_run_id: str | None = None  # MLflow run of an unfinished last.pt that is started over
    run_id: str | None = None  # MLflow run to train into from scratch (created by a run killed before last.pt)


#: Written when a run creates its MLflow run: {"run_id", "run_key"}.
RUN_RECORD = "mlflow_run.json"


def recorded_run(out_dir: Path) -> dict:
    """What :data:`RUN_RECORD` says (``{}`` when absent or unreadable)."""
    try:
        record = json.loads((out_dir / RUN_RECORD).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def run_key(cfg: dict, data_hash: str) -> str:
    text = json.dumps({"config": cfg, "data_hash": data_hash}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _differences(old: dict, new: dict) -> str:
    a, b = flatten(old), flatten(new)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:6]) + (" ..." if len(keys) > 6 else "")


def plan_run(cfg: dict, data_hash: str, out_dir: Path, keep_finished: bool = False) -> Plan:
    """Skip, resume or start over: see the module docstring. Reads files, writes nothing."""
    key = run_key(cfg, data_hash)
    metrics_path, last_path = out_dir / "metrics.json", out_dir / "last.pt"
    if metrics_path.is_file() and (out_dir / "best.pt").is_file():
        try:
            metrics = json.loads(metrics_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            metrics = {}  # half-written by hand or by an old version: not a finished run of ours
        if metrics.get("run_key") == key:
            return Plan("skip", key, f"{out_dir}: already trained (metrics.json matches this config); not retraining",
                        metrics=metrics)
    if not last_path.is_file():
        record = recorded_run(out_dir)
        if record.get("run_key") == key:  # killed before its first epoch ended: the same MLflow run
            return Plan("fresh", key, f"{out_dir}: starting over into MLflow run {record.get('run_id')} "
                                      "(interrupted before its first epoch ended)", run_id=record.get("run_id"))
        return Plan("fresh", key, stale_run_id=record.get("run_id"))  # another config's, if any
    # A corrupt last.pt stops here with its name: never silently dropped, never half trusted.
    state = load_checkpoint(last_path, fix=f"It is the run's progress: delete it to train the run from scratch "
                                           f"(rm {last_path}), or put back a good copy.")
    if state.get("run_key") != key:
        if "run_key" not in state:
            why = "was written by an older locvit (no run key)"
        elif state.get("config") != cfg:
            why = f"has another config ({_differences(state['config'], cfg)})"
        else:
            why = "was trained on other data (the manifest's data_hash differs)"
        stale = None if state.get("finished") else state.get("mlflow_run_id")
        return Plan("fresh", key, f"{last_path} {why}; training from scratch", stale_run_id=stale)
    if state.get("finished") and keep_finished:
        return Plan("resume", key, f"{out_dir}: finished run without metrics.json (removed by a re-run of its "
                                   "job); restoring best.pt and metrics.json from last.pt, not retraining", state=state)
    if state.get("finished"):
        return Plan("fresh", key, f"{out_dir}: finished run without metrics.json (removed for a re-run); "
                             "training from scratch")
    where = f"epoch {state['epoch'] + 1} of {cfg['train']['epochs']}"
    if state.get("partial"):
        where = f"step {state['step']} (batch {state['partial']['batches']} of epoch {state['epoch'] + 2})"
    return Plan("resume", key, f"{last_path}: resuming after {where} (MLflow run {state['mlflow_run_id']})",
                state=state)


def last_state(run, progress: Progress, rng: list[dict], finished: bool = False) -> dict[str, Any]:
    """The contents of last.pt (``rng``: every rank's :func:`~locvit.train.checkpoint.rng_state`)."""
    state = {
        "model": run.model.state_dict(),  # the raw module: no 'module.' (DDP) or '_orig_mod.' (compile) prefixes
        "optimizer": run.optimizer.state_dict(),
        "config": run.cfg, "run_key": run.key, "epoch": progress.epoch - 1, "step": progress.step,
        "val_top1": progress.history[-1]["val_top1"] if progress.history else None,
        "best_val_top1": progress.best_top1, "partial": progress.partial,
        "best_epoch": progress.best_epoch, "best_model": progress.best_model, "history": progress.history,
        "mlflow_run_id": progress.run_id, "train_time_s": progress.train_time_s, "rng": rng,
        "world_size": run.dist.world_size, "weights": "model", "finished": finished,
    }
    if run.ema is not None:
        state["ema"] = run.ema.module.state_dict()
    return state


def best_state(run, progress: Progress) -> dict[str, Any]:
    """The contents of best.pt: the weights that were evaluated (EMA's when on) at the best epoch."""
    return {"model": progress.best_model, "config": run.cfg, "epoch": progress.best_epoch,
            "val_top1": progress.best_top1, "mlflow_run_id": progress.run_id,
            "weights": "ema" if run.ema is not None else "model"}


def restore(run, state: dict[str, Any]) -> Progress:
    """Load last.pt into a built run (all but the generators: :func:`restore_rng`); return where it stands."""
    run.model.load_state_dict(state["model"])  # in place: DDP and compile wrappers see it
    run.optimizer.load_state_dict(state["optimizer"])
    if run.ema is not None:
        run.ema.module.load_state_dict(state["ema"])
    progress = Progress(epoch=state["epoch"] + 1, step=state["step"], history=list(state["history"]),
                        best_top1=state["best_val_top1"], best_epoch=state["best_epoch"],
                        best_model=state["best_model"], run_id=state["mlflow_run_id"],
                        train_time_s=state["train_time_s"], partial=state.get("partial"))
    if run.dist.main and progress.best_model is not None:  # Snakemake removes best.pt before re-running a job
        save_checkpoint(run.out_dir / "best.pt", best_state(run, progress))
    return progress


def restore_rng(run, state: dict[str, Any]) -> None:
    """Put back this rank's generator states: call it last, just before the next epoch."""
    if len(state["rng"]) == run.dist.world_size:
        set_rng_state(state["rng"][run.dist.rank], run.device)
        return
    # Another process count: no rank's stream can continue; a fresh seeded one per rank and epoch.
    if run.dist.main:
        print(f"resuming with {run.dist.world_size} process(es) after {len(state['rng'])}: the data order and "
              "the random streams differ from an uninterrupted run from here on", flush=True)
    seed_everything(run.cfg["seed"] + 1000 * (state["epoch"] + 1) + run.dist.rank)
