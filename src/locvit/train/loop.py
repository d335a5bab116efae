"""One training run (a variant at a seed): data, model, optimiser, the epochs, checkpoints.

Paths come from the caller (the CLI); nothing here re-derives where files live. With several processes
(torchrun; ``locvit.train.distributed``) ``batch_size`` is the global batch, split evenly, the model is
DDP-wrapped, and only rank 0 writes, logs to MLflow and prints. A stopped run continues where it stopped;
a finished one is not retrained (``locvit.train.state``).
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from locvit import models
from locvit.checkpoint import weights_digest
from locvit.data.augment import make_mixup, make_train_augment
from locvit.data.feed import TrainFeed
from locvit.data.ffcv_io import make_loader
from locvit.data.prepare import check_split, load_manifest
from locvit.device import describe, device_for, require_toolchain, set_backends
from locvit.errors import InputError, Stopped
from locvit.io import remove_temporaries, write_json
from locvit.layout import RunFiles
from locvit.tracking import TrainingTracker, confirm_finished
from locvit.train import distributed
from locvit.train.distributed import Dist
from locvit.train.engine import (
    Compute,
    EpochBatches,
    EpochStart,
    StepRecipe,
    channels_last,
    evaluate,
    make_ema,
    make_optimizer,
    make_schedule,
    set_deterministic,
    train_one_epoch,
    update_ema,
)
from locvit.train.state import REQUEST, Plan, RunCheckpoints, TrainState, plan_run, rng_state, seed_everything

log = logging.getLogger(__name__)

__all__ = ["train_run"]


def per_process_batch(recipe: dict, world_size: int) -> int:
    """The recipe's batch_size is global: each of ``world_size`` processes takes an equal share."""
    batch = recipe["batch_size"]
    if batch % world_size:
        raise InputError(
            f"train.batch_size {batch} is the global batch and must split evenly over the "
            f"{world_size} processes; use a multiple of {world_size} or another process count"
        )
    share = batch // world_size
    if (recipe["mixup"] > 0 or recipe["cutmix"] > 0) and share % 2:
        raise InputError(
            f"train.batch_size {batch} over {world_size} processes gives {share} images per process; "
            "MixUp/CutMix pair images within a process's batch, so that must be even"
        )
    return share


@dataclass
class Run:
    """A built run's setting: what it is, where it writes, its processes, data and batch preparation.
    What training changes is its ``TrainState``."""

    cfg: dict
    key: str  # resume's run key: config and data hash
    out_dir: Path
    dist: Dist
    device: torch.device
    train_loader: Any
    val_loader: Any
    mixup: Any
    augment: Any  # locvit.data.augment.TrainAugment (RandAugment, random erasing) or None
    compute: Compute
    mean: tuple
    std: tuple
    show_progress: bool
    tracker: TrainingTracker | None = None  # the MLflow run, on rank 0 (set by open_tracking)

    @property
    def files(self) -> RunFiles:
        return RunFiles.at(self.out_dir)

    @property
    def checkpoints(self) -> RunCheckpoints:
        return RunCheckpoints(self.files, self.cfg, self.key)

    def batches(self, start: EpochStart) -> EpochBatches:
        """The training loader's batches from ``start`` (an ``EpochStart``), prepared
        (``TrainFeed``) and ending at a stop request (``locvit.train.state``)."""
        recipe = self.cfg["train"]
        feed = functools.partial(
            TrainFeed,
            augment=self.augment,
            compute=self.compute,
            mean=self.mean,
            std=self.std,
            ahead=recipe["feed_ahead"],
            workers=recipe["feed_workers"],
        )
        return EpochBatches(self.train_loader, feed, start, recipe["read_every"], self.stop_requested)

    def stop_requested(self) -> bool:
        """Whether any process was asked to stop (``locvit.train.state``; a collective under DDP)."""
        return REQUEST.agreed(self.dist, self.device)


def build_run(
    cfg: dict,
    key: str,
    train_path: Path,
    val_path: Path,
    out_dir: Path,
    dist: Dist,
    show_progress: bool,
    threads: int | None,
    num_classes: int,
) -> tuple[Run, TrainState]:
    recipe = cfg["train"]
    device = device_for(recipe["device"], dist.local_rank)
    batch = per_process_batch(recipe, dist.world_size)
    if recipe["compile"]:
        # torch.compile's default backend, inductor, builds C++ kernels on the CPU and Triton's launchers on
        # CUDA with a C compiler: without one, say so now, not at the first step.
        require_toolchain(
            f"train.compile: true (torch.compile's inductor on {device.type})", "set train.compile: false"
        )
    model = models.create(cfg).to(device)
    if recipe["channels_last"]:
        channels_last(model)
    mean, std = models.normalisation(model)
    train_loader = make_loader(
        train_path,
        batch,
        True,
        device,
        recipe["num_workers"],
        seed=cfg["seed"],
        translate=recipe["translate"],
        hflip=recipe["hflip"],
        distributed=dist.ddp,
        jit=recipe["loader_jit"],
        image_size=cfg["data"]["image_size"],
        repeated_aug=recipe["repeated_aug"],
    )
    val_loader = make_loader(
        val_path,
        recipe["eval_batch_size"],
        False,
        device,
        recipe["num_workers"],
        distributed=dist.ddp,
        jit=recipe["loader_jit"],
    )
    if threads and device.type == "cpu":
        torch.set_num_threads(threads)  # after the loaders: FFCV's Loader resets torch's thread count
    optimizer = make_optimizer(model, recipe, device)
    net = torch.compile(model) if recipe["compile"] else model  # nanoGPT's order: compile, then DDP
    if dist.ddp:  # the constructor broadcasts rank 0's weights, so every rank starts equal
        device_ids = [device.index] if device.type == "cuda" else None
        # broadcast_buffers: rank 0's buffers copied to the others before every forward, needed only where
        # training changes them (BatchNorm's running statistics). Our families and timm's baselines have none:
        # MaiT's head indices and masks and IBiT's roll index and sin-cos table are fixed, and ConViT's relative
        # positions are built at the first forward from the token count, the same on every process.
        # finish() compares the replicas' weights at the end.
        net = torch.nn.parallel.DistributedDataParallel(
            net, device_ids=device_ids, broadcast_buffers=buffers_change(model)
        )
    ema = make_ema(model, recipe)  # after DDP's broadcast: the average starts from the common weights
    lr_at = make_schedule(recipe, len(train_loader))  # per process = global steps: each takes 1/W of every batch
    compute = Compute.of(recipe, device)
    set_backends(device, compute.amp_dtype, recipe["deterministic"])  # TF32 with amp, cuDNN's autotuner
    # Per-sample draws seeded by (seed, rank, step): a resumed run draws what the uninterrupted one did.
    augment = make_train_augment(recipe, mean, std, cfg["seed"], dist.rank)
    run = Run(
        cfg,
        key,
        out_dir,
        dist,
        device,
        train_loader,
        val_loader,
        make_mixup(recipe, num_classes, cfg["seed"], dist.rank),
        augment,
        compute,
        mean,
        std,
        show_progress and dist.main,
    )
    return run, TrainState(model, net, optimizer, ema, lr_at)


def buffers_change(model: torch.nn.Module) -> bool:
    """Whether training changes one of ``model``'s buffers: running statistics (BatchNorm's)."""
    return any(getattr(m, "track_running_stats", False) for m in model.modules())


def train_run(
    cfg: dict,
    train_path: Path,
    val_path: Path,
    manifest_path: Path,
    out_dir: Path,
    tracking_db: Path,
    show_progress: bool | None = None,
    threads: int | None = None,
    keep_finished: bool = False,
    system_metrics_s: float = 0.0,
) -> dict:
    """Train ``cfg`` (a ``locvit.config.run.run_config``); write last.pt, best.pt, metrics.json (rank 0).

    Skips a finished run and resumes an interrupted one (``locvit.train.state.plan_run``;
    ``keep_finished``: a finished run whose metrics.json was removed is restored, not retrained).
    ``system_metrics_s``: seconds between samples of MLflow's system metrics (0: none).
    """
    dist = distributed.current()
    out_dir = Path(out_dir)
    manifest = load_manifest(manifest_path, {"train": train_path, "val": val_path})
    check_split(cfg, manifest, manifest_path)
    images, batch = manifest["splits"]["train"]["size"], cfg["train"]["batch_size"]
    if images < batch:  # before any compute (locvit validate refuses it where the dataset's size is known)
        raise InputError(
            f"train.batch_size: {batch} is more than the {images} images of the training split "
            f"({manifest_path}): not one optimiser step per epoch (a partial batch is dropped); use a "
            f"batch of at most {images} or a larger data.train_fraction"
        )
    plan = plan_run(cfg, manifest["data_hash"], out_dir, keep_finished)
    distributed.barrier(dist)  # every rank has read the folder before rank 0 writes to it
    if dist.main and plan.message:
        log.info("%s", plan.message)
    if plan.action == "skip":
        if dist.main:
            confirm_finished(plan.metrics, out_dir, tracking_db)
        return plan.metrics
    set_deterministic(cfg["train"]["deterministic"])  # before the model and loaders touch the GPU
    seed_everything(cfg["seed"] + dist.rank)  # rank 0 (and a single process) draws from the run's seed
    run, state = build_run(
        cfg,
        plan.key,
        train_path,
        val_path,
        out_dir,
        dist,
        sys.stderr.isatty() if show_progress is None else show_progress,
        threads,
        manifest["num_classes"],
    )
    if plan.action == "resume":
        state.restore(plan.state)
    else:
        state.run_id = plan.run_id
    if dist.main:  # only rank 0 writes this folder
        remove_temporaries(*run.files.all())
        if plan.action == "fresh":
            run.files.metrics.unlink(missing_ok=True)  # an old run's: never mistaken for this one's
        if state.best_model is not None:  # resumed: Snakemake removes best.pt before re-running a job
            run.checkpoints.write_best(state)
        run.tracker = open_tracking(
            run, state, manifest, tracking_db, plan, {"train": train_path, "val": val_path}, system_metrics_s
        )
    try:
        train_epochs(run, state)
        return finish(run, state)
    except Stopped:
        raise  # last.pt holds the step; the MLflow run goes on when the run resumes
    except BaseException:
        if run.tracker is not None:
            run.tracker.mark_failed()
        raise


def train_epochs(run: Run, state: TrainState) -> None:
    """Train from epoch ``state.epoch`` to the end; after each: evaluate, checkpoint, log (rank 0).

    A resume's saved generators are put back first. A stop request ends training at the next step
    ``train.read_every`` divides: last.pt holds the step, the epoch's sums and the generators (numpy's as at
    the epoch's start, since FFCV's loader thread draws ahead), and ``Stopped`` is raised.
    """
    state.restore_generators(run.dist, run.device, run.cfg["seed"])
    cfg, recipe = run.cfg, run.cfg["train"]
    on_step = functools.partial(update_ema, state.ema, state.model) if state.ema is not None else None
    for epoch in range(state.epoch, recipe["epochs"]):
        epoch_numpy = rng_state(run.device)["numpy"]  # before the loader's thread draws this epoch's augmentations
        started = time.perf_counter()
        # FFCV's RANDOM order is a function of (seed, the loader's epoch counter), and a new process
        # counts from 0: set it, so a resumed run sees the order the uninterrupted run saw.
        run.train_loader.next_epoch = epoch
        batches = run.batches(state.epoch_start())
        stats = train_one_epoch(
            state.net,
            batches,
            state.optimizer,
            state.lr_at,
            batches.start,
            StepRecipe.of(recipe),
            compute=run.compute,
            mixup=run.mixup,
            on_step=on_step,
            bar=f"{cfg['variant']} s{cfg['seed']} ep{epoch}" if run.show_progress else None,
        )
        state.step, state.partial = stats.pop("steps"), None
        if batches.stopped:
            state.partial = stats["partial"]
            state.train_time_s += time.perf_counter() - started
            save_epoch(run, state, improved=False, numpy_state=epoch_numpy)
            raise Stopped(
                f"stopped on request after step {state.step} (epoch {epoch + 1}, batch "
                f"{state.partial.batches} of {len(run.train_loader)}); last.pt holds it"
            )
        row = {
            "epoch": epoch,
            **reduce_train_stats(run, stats),
            **evaluate_run(run, state.evaluated),
            "bad_steps": stats["bad_steps"],
        }
        state.history.append(row)
        state.epoch, state.train_time_s = epoch + 1, state.train_time_s + time.perf_counter() - started
        improved = row["val_top1"] > state.best_top1
        if improved:
            state.best_top1, state.best_epoch = row["val_top1"], epoch
            if run.dist.main:  # a CPU copy: last.pt carries it, to restore best.pt after an interruption
                state.best_model = {k: v.detach().to("cpu", copy=True) for k, v in state.evaluated.state_dict().items()}
        save_epoch(run, state, improved)
        if run.dist.main:  # after last.pt: a run killed in between logs this epoch when resumed
            run.tracker.log_epoch(row)
            log.info(
                f"[{cfg['variant']} seed {cfg['seed']}] epoch {epoch + 1}/{recipe['epochs']} loss "
                f"{row['train_loss']:.4f} train@1 {row['train_top1']:.3f} val@1 {row['val_top1']:.3f} "
                f"{row['train_images_per_s']:.0f} img/s"
            )
        if epoch + 1 < recipe["epochs"] and run.stop_requested():
            raise Stopped(f"stopped on request after epoch {epoch + 1}; last.pt holds it")


def reduce_train_stats(run: Run, stats: dict) -> dict:
    """One process's epoch statistics -> the run's (the identity for one process).

    Every process trains on equally many images (FFCV pads each share to the same
    length and drops the same partial batch), so the mean of the processes' means is
    the run's mean; throughput adds up.
    """
    loss, top1, images_per_s = distributed.all_sum(
        [stats["train_loss"], stats["train_top1"], stats["train_images_per_s"]], run.dist, run.device
    )
    w = run.dist.world_size
    return {"train_loss": loss / w, "train_top1": top1 / w, "train_images_per_s": images_per_s, "lr": stats["lr"]}


def evaluate_run(run: Run, model: torch.nn.Module) -> dict:
    """Validation loss and top-1 of ``model`` (the evaluated weights), each rank scoring its share of the split."""
    n_val = run.val_loader.reader.num_samples
    limit = distributed.shard_size(n_val, run.dist) if run.dist.ddp else None
    val = evaluate(model, run.val_loader, run.mean, run.std, run.compute, limit)
    if not run.dist.ddp:
        return {"val_loss": val["loss"], "val_top1": val["top1"]}
    loss_sum, correct, n = distributed.all_sum([val["loss_sum"], val["correct"], val["n"]], run.dist, run.device)
    if int(n) != n_val:
        raise RuntimeError(f"the processes scored {int(n)} validation images, not the split's {n_val}")
    return {"val_loss": loss_sum / n, "val_top1": correct / n}


def save_epoch(
    run: Run, state: TrainState, improved: bool, finished: bool = False, numpy_state: dict | None = None
) -> None:
    """Write best.pt when the epoch improved, and last.pt (every rank takes part: it gathers the generators).

    ``numpy_state``: numpy's generator to record instead of the current one (a stop within an epoch).
    """
    rng = rng_state(run.device)
    if numpy_state is not None:
        rng["numpy"] = numpy_state
    rng = distributed.gather(rng, run.dist)
    if not run.dist.main:
        return
    if improved:
        run.checkpoints.write_best(state)
    slurm_job_ids = run.tracker.slurm_job_ids if run.tracker is not None else None
    run.checkpoints.write_last(state, rng, run.dist.world_size, finished, slurm_job_ids)


def finish(run: Run, state: TrainState) -> dict:
    """Check the replicas agree; write metrics.json; close the MLflow run; mark last.pt finished."""
    digests = distributed.gather(weights_digest(state.model.state_dict()), run.dist)
    if len(set(digests)) != 1:
        raise RuntimeError(f"the {len(digests)} processes hold different weights after training: {digests}")
    cfg = run.cfg
    metrics = {
        "study": cfg["study"],
        "variant": cfg["variant"],
        "seed": cfg["seed"],
        "model": cfg["model"],
        "n_params": sum(t.numel() for t in state.model.parameters()),
        "best_val_top1": state.best_top1,
        "best_epoch": state.best_epoch,
        "final_val_top1": state.history[-1]["val_top1"],
        "train_time_s": state.train_time_s,
        "mlflow_run_id": state.run_id,
        "history": state.history,
        "run_key": run.key,
        "world_size": run.dist.world_size,
        "rank_weights_sha256": digests,  # one per process: the replicas ended bitwise equal
        "machine": describe(run.device),  # CPU kernels differ by instruction set: so do the numbers
    }
    if run.dist.main:  # with the tracking record: what locvit sync-tracking uploads when tracking failed
        from locvit.train.fingerprint import fingerprint

        tracker = run.tracker
        # what this code computes for the run on fixed inputs: `locvit status --check` compares it after an upgrade
        metrics["fingerprint"] = fingerprint(cfg)
        metrics.update(slurm_job_ids=tracker.slurm_job_ids, tracking=tracker.record())
        write_json(run.files.metrics, metrics)
        tracker.close(metrics)
        if not tracker.ok:
            metrics["tracking"] = tracker.record()
            write_json(run.files.metrics, metrics)
            log.warning("training finished; tracking had failed:\n%s", tracker.message())
    save_epoch(run, state, improved=False, finished=True)  # last: a finished run is never resumed
    return metrics


def open_tracking(
    run: Run,
    state: TrainState,
    manifest: dict,
    tracking_db: Path,
    plan: Plan,
    data: dict[str, Path],
    system_metrics_s: float = 0.0,
) -> TrainingTracker:
    """The run's MLflow run (rank 0 only): created, or resumed with the epochs it lacks.

    A new run's id is recorded (``locvit.layout.RunFiles.record``) before any epoch, and a run resumed into a new
    MLflow run rewrites best.pt, which names it.
    """

    def created(run_id: str) -> None:
        state.run_id = run_id
        write_json(run.files.record, {"run_id": run_id, "run_key": run.key})
        if state.best_model is not None:
            run.checkpoints.write_best(state)

    tracker = TrainingTracker.for_run(
        run.cfg,
        tracking_db,
        run.out_dir,
        manifest,
        str(run.device),
        sum(t.numel() for t in state.model.parameters()),
        run.dist.world_size,
        run_id=state.run_id,
        slurm_job_ids=(plan.state or {}).get("slurm_job_ids", []),
        data=data,
        system_metrics_s=system_metrics_s,
        machine=describe(run.device),
    )
    tracker.open(state.history, plan.stale_run_id, on_created=created)
    return tracker
