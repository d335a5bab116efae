"""A run's training state, and the two files that keep it: last.pt (all of it) and best.pt.

:class:`TrainState` is what the epochs change and a resume puts back. :class:`RunCheckpoints`
is the one writer of a run folder's last.pt and best.pt (timm's ``CheckpointSaver``), in
:mod:`locvit.checkpoint`'s format; :meth:`TrainState.restore` reads last.pt back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from locvit.checkpoint import load_checkpoint, save_checkpoint
from locvit.layout import RunFiles
from locvit.train.distributed import Dist
from locvit.train.engine import EpochStart, PartialEpoch
from locvit.train.generators import seed_everything, set_rng_state

log = logging.getLogger(__name__)


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
        """Where the next epoch starts (:func:`locvit.train.engine.train_one_epoch`)."""
        return EpochStart(
            self.step, sum(row.get("bad_steps", 0) for row in self.history), self.partial or PartialEpoch()
        )

    def restore(self, last: dict[str, Any]) -> None:
        """Put back what last.pt holds: weights (in place: DDP and compile wrappers see them), optimiser,
        EMA and progress. The generators wait in ``generators`` for :meth:`restore_generators`."""
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
        may draw in between); a no-op unless :meth:`restore` left some."""
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
    key: str  # the run key (:func:`locvit.train.resume.run_key`)

    def write_last(
        self,
        state: TrainState,
        rng: list[dict],
        world_size: int,
        finished: bool = False,
        slurm_job_ids: list[str] | None = None,
    ) -> None:
        """``rng``: every rank's :func:`~locvit.train.generators.rng_state`; ``finished``: never resumed."""
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
