"""The state that survives a restart: the generators, the training state and its checkpoints, resume and stop.

- ``seed_everything``, ``rng_state``: the generators a step draws from, saved into last.pt, put back;
- ``TrainState`` and ``RunCheckpoints``: what the epochs change, and the one writer of last.pt and
  best.pt (timm's ``CheckpointSaver``);
- ``plan_run``: skip, resume or start over, from what a run folder holds;
- ``REQUEST`` and ``listen``: a stop at a step boundary when the scheduler asks, so that the run
  resumes exactly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import signal
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from locvit.checkpoint import load_checkpoint, model_code, save_checkpoint
from locvit.config.run import flatten
from locvit.layout import RunFiles
from locvit.train.distributed import Dist
from locvit.train.engine import EpochStart, PartialEpoch

log = logging.getLogger(__name__)


# The generators ------------------------------------------------------------------------------------------------
# The random number generators a training step draws from: seeded, saved into last.pt, put back.
#
# A checkpoint holds plain tensors and lists only (``locvit.checkpoint``): ``rng_state``
# turns the generators' states into those.


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # CUDA's generators too


def rng_state(device: torch.device) -> dict[str, Any]:
    """Every generator a training step draws from, as tensors and plain types (``weights_only``-safe).

    Python's ``random``, numpy's global generator (FFCV's uncompiled augmentations and
    timm's MixUp/CutMix draw from it), torch's CPU generator and, on CUDA, the device's.
    """
    version, keys, gauss = random.getstate()  # (3, 625 ints, None or float)
    _, mt, pos, has_gauss, cached = np.random.get_state()  # ('MT19937', uint32 (624,), int, int, float)
    return {
        "python": [version, list(keys), gauss],
        "numpy": {
            "mt": torch.from_numpy(mt.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Put back what ``rng_state`` saved."""
    version, keys, gauss = state["python"]
    random.setstate((version, tuple(keys), gauss))
    np_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            np_state["mt"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


# The training state and its files ------------------------------------------------------------------------------
# A run's training state, and the two files that keep it: last.pt (all of it) and best.pt.
#
# ``TrainState`` is what the epochs change and a resume puts back. ``RunCheckpoints``
# is the one writer of a run folder's last.pt and best.pt (timm's ``CheckpointSaver``), in
# ``locvit.checkpoint``'s format; ``TrainState.restore`` reads last.pt back.


@dataclass
class TrainState:
    """Model, optimiser, EMA, lr schedule, progress and (after a resume) the generators to put back.

    ``model`` is the raw module checkpoints hold; ``net`` is what trains (``model``, compiled and/or
    DDP-wrapped, sharing its parameters).
    """

    model: torch.nn.Module
    net: torch.nn.Module
    optimizer: torch.optim.Optimizer
    ema: Any  # timm's ModelEmaV3 or None
    lr_at: Callable[[int], float]  # the schedule: a step's lr
    epoch: int = 0  # the next epoch to train
    step: int = 0  # optimiser steps done
    history: list[dict] = field(default_factory=list)
    best_top1: float = -1.0
    best_epoch: int = -1
    best_model: dict[str, torch.Tensor] | None = None  # CPU copy of the best epoch's evaluated weights
    run_id: str | None = None  # MLflow
    train_time_s: float = 0.0
    partial: PartialEpoch | None = None  # epoch ``epoch`` stopped within: its batches and sums so far
    generators: list[dict] | None = None  # every rank's saved generator states, until restore_generators

    @property
    def evaluated(self) -> torch.nn.Module:
        """The weights that are evaluated and kept as best.pt: the EMA's when on."""
        return self.ema.module if self.ema is not None else self.model

    def epoch_start(self) -> EpochStart:
        """Where the next epoch starts (``locvit.train.engine.train_one_epoch``)."""
        return EpochStart(
            self.step, sum(row.get("bad_steps", 0) for row in self.history), self.partial or PartialEpoch()
        )

    def restore(self, last: dict[str, Any]) -> None:
        """Put back what last.pt holds: weights (in place: DDP and compile wrappers see them), optimiser,
        EMA and progress. The generators wait in ``generators`` for ``restore_generators``."""
        self.model.load_state_dict(last["model"])
        self.optimizer.load_state_dict(last["optimizer"])
        if self.ema is not None:
            self.ema.module.load_state_dict(last["ema"])
        self.epoch, self.step, self.history = last["epoch"] + 1, last["step"], list(last["history"])
        self.best_top1, self.best_epoch, self.best_model = last["best_val_top1"], last["best_epoch"], last["best_model"]
        self.run_id, self.train_time_s = last["mlflow_run_id"], last["train_time_s"]
        self.partial = PartialEpoch(**last["partial"]) if last.get("partial") else None
        self.generators = last["rng"]

    def restore_generators(self, dist: Dist, device: torch.device, seed: int) -> None:
        """Put back this rank's generators (the run's loop calls it just before its first epoch: nothing
        may draw in between); a no-op unless ``restore`` left some."""
        saved, self.generators = self.generators, None
        if saved is None:
            return
        if len(saved) == dist.world_size:
            set_rng_state(saved[dist.rank], device)
            return
        # Another process count: no rank's stream can continue; a fresh seeded one per rank and epoch.
        if dist.main:
            log.info(
                "resuming with %d process(es) after %d: the data order and the random streams differ "
                "from an uninterrupted run from here on",
                dist.world_size,
                len(saved),
            )
        seed_everything(seed + 1000 * self.epoch + dist.rank)


@dataclass(frozen=True)
class RunCheckpoints:
    """Writes last.pt and best.pt of one run (rank 0 only): what each holds.

    last.pt, after every epoch, holds everything the next one depends on: weights, optimiser,
    EMA, step and epoch counters (the lr is a function of the step; FFCV's order of the epoch's
    index), every rank's generator states, the best epoch's weights (Snakemake deletes best.pt
    before re-running a job) and the history; after a stop within an epoch, that epoch's
    progress (``partial``). best.pt holds the weights evaluated at the best epoch.
    """

    files: RunFiles
    cfg: dict
    key: str  # the run key (``run_key``)

    def write_last(
        self,
        state: TrainState,
        rng: list[dict],
        world_size: int,
        finished: bool = False,
        slurm_job_ids: list[str] | None = None,
    ) -> None:
        """``rng``: every rank's ``rng_state``; ``finished``: never resumed."""
        contents = {
            "model": state.model.state_dict(),  # the raw module: no 'module.' (DDP) or '_orig_mod.' (compile) prefixes
            "optimizer": state.optimizer.state_dict(),
            "config": self.cfg,
            "run_key": self.key,
            "epoch": state.epoch - 1,
            "step": state.step,
            "val_top1": state.history[-1]["val_top1"] if state.history else None,
            "best_val_top1": state.best_top1,
            "partial": asdict(state.partial) if state.partial else None,
            "best_epoch": state.best_epoch,
            "best_model": state.best_model,
            "history": state.history,
            "mlflow_run_id": state.run_id,
            "train_time_s": state.train_time_s,
            "rng": rng,
            "world_size": world_size,
            "weights": "model",
            "finished": finished,
        }
        if state.ema is not None:
            contents["ema"] = state.ema.module.state_dict()
        if slurm_job_ids is not None:  # the SLURM jobs so far, carried over a resume
            contents["slurm_job_ids"] = slurm_job_ids
        save_checkpoint(self.files.last, contents)

    def write_best(self, state: TrainState) -> None:
        """best.pt: the weights that were evaluated (EMA's when on) at the best epoch, naming the MLflow run."""
        save_checkpoint(
            self.files.best,
            {
                "model": state.best_model,
                "config": self.cfg,
                "epoch": state.best_epoch,
                "val_top1": state.best_top1,
                "mlflow_run_id": state.run_id,
                "weights": "ema" if state.ema is not None else "model",
            },
        )


def read_last(files: RunFiles) -> dict[str, Any]:
    """last.pt's contents. A corrupt one stops here with its name: never silently dropped, never half trusted."""
    return load_checkpoint(
        files.last,
        fix=f"It is the run's progress: delete it to train the run from scratch "
        f"(rm {files.last}), or put back a good copy.",
        allow_code_change=True,
    )  # changed model code changes the run key: trained from scratch


# Resume --------------------------------------------------------------------------------------------------------
# Resume: skip, resume or start over, planned from what a run folder holds.
#
# ``locvit train`` decides from the files in the run's folder (``plan_run``, which only reads;
# the loop restores the state, ``TrainState.restore``):
#
# * ``metrics.json`` and ``best.pt`` exist and ``metrics.json``'s run key is this run's:
#   **skip**, the run is finished.
# * ``last.pt`` exists, its run key is this run's and it is not marked finished:
#   **resume** after its epoch, into the same MLflow run.
# * ``last.pt`` is this run's and marked finished, but ``metrics.json`` is gone (Snakemake
#   removes a job's outputs before re-running it): with ``keep_finished`` (a job that
#   trains a variant's seeds, re-run because another of its runs was cut or added),
#   **resume** into zero epochs, which writes best.pt and metrics.json back; without it,
#   train from scratch (that is how ``--forcerun`` asks for a one-run job's re-training).
# * anything else: **train from scratch** (and say why when files were there: another
#   config or data). Rank 0 then overwrites the folder.
#   A run killed before its first last.pt starts over into the MLflow run it had
#   created (recorded in ``mlflow_run.json`` with the run key, ``locvit.layout.RunFiles.record``),
#   so a run keeps one MLflow run however often it is killed.
#
# The run key hashes the resolved run config, the training data's hash (from the manifest) and the
# model's code: a changed recipe, model, model code or dataset never continues an old run.
#
# What last.pt holds: ``RunCheckpoints``.


@dataclass
class Plan:
    """What ``plan_run`` decided; the loop carries it out."""

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


def run_key(cfg: dict, data_hash: str, legacy: bool = False) -> str:
    """The config, the data's hash and the model's code (``locvit.checkpoint.model_code``): a change to any
    of them trains the run again rather than restoring or resuming it. ``legacy``: the key locvit wrote
    before 29/34 (``model_code(legacy=True)``)."""
    code = model_code(cfg, legacy=legacy)
    text = json.dumps({"config": cfg, "data_hash": data_hash, **({"model_code": code} if code else {})}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _differences(old: dict, new: dict) -> str:
    a, b = flatten(old), flatten(new)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:6]) + (" ..." if len(keys) > 6 else "")


def plan_run(cfg: dict, data_hash: str, out_dir: Path, keep_finished: bool = False) -> Plan:
    """Skip, resume or start over: see the module docstring. Reads files, writes nothing."""
    key = run_key(cfg, data_hash)
    keys = (key, run_key(cfg, data_hash, legacy=True))  # a run of this config written before 29/34 counts
    files = RunFiles.at(out_dir)
    metrics_path, last_path = files.metrics, files.last
    if metrics_path.is_file() and files.best.is_file():
        try:
            metrics = json.loads(metrics_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            metrics = {}  # half-written by hand or by an old version: not a finished run of ours
        if metrics.get("run_key") in keys:
            return Plan(
                "skip",
                key,
                f"{out_dir}: already trained (metrics.json matches this config); not retraining",
                metrics=metrics,
            )
    if not last_path.is_file():
        record = recorded_run(files)
        if record.get("run_key") in keys:  # killed before its first epoch ended: the same MLflow run
            return Plan(
                "fresh",
                key,
                f"{out_dir}: starting over into MLflow run {record.get('run_id')} "
                "(interrupted before its first epoch ended)",
                run_id=record.get("run_id"),
            )
        return Plan("fresh", key, stale_run_id=record.get("run_id"))  # another config's, if any
    state = read_last(files)
    if state.get("run_key") not in keys:
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


# Stop on request -----------------------------------------------------------------------------------------------
# Stopping a run at a step boundary when the scheduler asks, so that it resumes exactly.
#
# A SLURM job asks for a warning before its time limit (``sbatch --signal=URG@<seconds>``,
# cluster/config.yaml). ``listen`` makes SIGURG or SIGUSR1 set a flag; the epoch's batches ask it
# every ``read_every`` optimiser steps (``locvit.train.engine.EpochBatches``; ``StopRequest.agreed``:
# with several processes the flags are summed, so every rank stops after the same step), the loop writes
# ``last.pt`` with the epoch's position and raises ``locvit.errors.Stopped``. ``locvit train`` then exits
# with ``locvit.errors.EXIT_STOPPED``; Snakemake's retry (or SLURM's requeue) starts the job again and
# the run resumes at that step, as if it had never stopped.


#: The signals that ask a run to stop at its next step boundary. SLURM sends a job step's
#: warning to every process of the step: Snakemake's inner process and the rule's shell
#: too, which SIGUSR1 (default action: terminate) would kill and SIGURG (default: ignore)
#: leaves alone. So the cluster profile asks for SIGURG; SIGUSR1 is for a plain ``kill``.
STOP_SIGNALS = (signal.SIGURG, signal.SIGUSR1)


class StopRequest:
    """Whether one of ``STOP_SIGNALS`` arrived (set by ``listen``'s handler)."""

    def __init__(self) -> None:
        self.requested = False

    def agreed(self, dist, device) -> bool:
        """True on every rank when any rank was asked to stop (one all-reduce per call under DDP)."""
        if not dist.ddp:
            return self.requested
        from locvit.train import distributed

        return distributed.all_sum([float(self.requested)], dist, device)[0] > 0


REQUEST = StopRequest()


def listen() -> None:
    """Let ``STOP_SIGNALS`` set ``REQUEST`` (call from the main thread)."""

    def handler(signum, frame) -> None:
        REQUEST.requested = True  # nothing else here: the loop reports it (a print could re-enter one)

    for signum in STOP_SIGNALS:
        signal.signal(signum, handler)
