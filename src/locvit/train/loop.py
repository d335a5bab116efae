"""One training run (a variant at a seed): data, model, optimiser, checkpoints, MLflow.

Paths come from the caller (the CLI, called by a Snakemake rule or a DVC stage);
nothing here re-derives where files live.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

from locvit import tracking
from locvit.config import flatten
from locvit.data.ffcv_io import make_loader
from locvit.data.prepare import load_manifest
from locvit.io import write_json
from locvit.train.checkpoint import save_checkpoint
from locvit.train.engine import cosine_schedule, evaluate, train_one_epoch


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def build_model(cfg: dict) -> torch.nn.Module:
    import timm

    import locvit.models  # noqa: F401  registers locvit's families

    return timm.create_model(cfg["model"], pretrained=False, **cfg["model_kwargs"])


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on biases, norms, tokens and position embeddings (DeiT's rule)."""
    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_mixup(recipe: dict, num_classes: int):
    """timm's batch MixUp/CutMix for the recipe, or None when both are off."""
    if not (recipe["mixup"] > 0 or recipe["cutmix"] > 0):
        return None
    from timm.data import Mixup

    return Mixup(mixup_alpha=recipe["mixup"], cutmix_alpha=recipe["cutmix"], prob=recipe["mixup_prob"],
                 switch_prob=recipe["mixup_switch_prob"], label_smoothing=recipe["label_smoothing"],
                 num_classes=num_classes)


def normalisation(model: torch.nn.Module) -> tuple[tuple, tuple]:
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    return tuple(cfg.get("mean", (0.485, 0.456, 0.406))), tuple(cfg.get("std", (0.229, 0.224, 0.225)))


def train_run(cfg: dict, train_path: Path, val_path: Path, manifest_path: Path, out_dir: Path,
              tracking_db: Path, show_progress: bool | None = None, threads: int | None = None) -> dict:
    """Train ``cfg`` (a :func:`locvit.config.run_config`); write last.pt, best.pt, metrics.json."""
    out_dir = Path(out_dir)
    recipe = cfg["train"]
    manifest = load_manifest(manifest_path, {"train": train_path, "val": val_path})
    device = resolve_device(recipe["device"])
    if show_progress is None:
        show_progress = sys.stderr.isatty()
    seed_everything(cfg["seed"])

    model = build_model(cfg).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    mean, std = normalisation(model)
    train_loader = make_loader(train_path, recipe["batch_size"], True, device, recipe["num_workers"],
                               seed=cfg["seed"], translate=recipe["translate"], hflip=recipe["hflip"],
                               jit=recipe["loader_jit"])
    val_loader = make_loader(val_path, recipe["eval_batch_size"], False, device, recipe["num_workers"],
                             jit=recipe["loader_jit"])
    if threads and device.type == "cpu":
        torch.set_num_threads(threads)  # after the loaders: FFCV's Loader resets torch's thread count
    steps_per_epoch = len(train_loader)
    total_steps = steps_per_epoch * recipe["epochs"]
    warmup_steps = int(round(recipe["warmup_epochs"] * steps_per_epoch))
    optimizer = torch.optim.AdamW(param_groups(model, recipe["weight_decay"]), lr=recipe["lr"],
                                  betas=tuple(recipe["betas"]))

    mixup = make_mixup(recipe, manifest["num_classes"])

    def lr_at(step: int) -> float:
        return cosine_schedule(step, total_steps, warmup_steps, recipe["lr"], recipe["min_lr"])

    experiment_id = tracking.setup(cfg["study"], tracking_db)
    tags = {
        "study": cfg["study"], "variant": cfg["variant"], "model": cfg["model"], "seed": str(cfg["seed"]),
        "dataset": manifest["source"], "data_hash": manifest["data_hash"], "git_commit": tracking.git_commit(),
        "device": str(device),
    }
    if os.environ.get("SLURM_JOB_ID"):
        tags["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
    import mlflow

    client = mlflow.MlflowClient()
    run = tracking.retry(client.create_run, experiment_id, run_name=f"{cfg['variant']}-seed{cfg['seed']}", tags=tags)
    run_id = run.info.run_id
    tracking.log_params(run_id, {**flatten(cfg), "n_params": n_params})

    history, best_top1, best_epoch, step = [], -1.0, -1, 0
    started = time.perf_counter()
    try:
        for epoch in range(recipe["epochs"]):
            stats = train_one_epoch(model, train_loader, optimizer, lr_at, step, mean, std,
                                    recipe["label_smoothing"], recipe["clip_grad"], mixup=mixup,
                                    desc=f"{cfg['variant']} s{cfg['seed']} ep{epoch}", show_progress=show_progress)
            step = stats.pop("steps")
            val = evaluate(model, val_loader, mean, std)
            row = {"epoch": epoch, **stats, "val_loss": val["loss"], "val_top1": val["top1"]}
            history.append(row)
            tracking.log_metrics(run_id, {k: v for k, v in row.items() if k != "epoch"}, step=epoch)
            print(f"[{cfg['variant']} seed {cfg['seed']}] epoch {epoch + 1}/{recipe['epochs']} "
                  f"loss {row['train_loss']:.4f} train@1 {row['train_top1']:.3f} val@1 {row['val_top1']:.3f} "
                  f"{row['train_images_per_s']:.0f} img/s", flush=True)
            state = {"model": model.state_dict(), "config": cfg, "epoch": epoch, "val_top1": val["top1"],
                     "mlflow_run_id": run_id}
            if val["top1"] > best_top1:
                best_top1, best_epoch = val["top1"], epoch
                save_checkpoint(out_dir / "best.pt", state)
            save_checkpoint(out_dir / "last.pt", {**state, "optimizer": optimizer.state_dict(), "step": step})
    except BaseException:
        tracking.retry(client.set_terminated, run_id, status="FAILED")
        raise
    metrics = {
        "study": cfg["study"], "variant": cfg["variant"], "seed": cfg["seed"], "model": cfg["model"],
        "n_params": n_params, "best_val_top1": best_top1, "best_epoch": best_epoch,
        "final_val_top1": history[-1]["val_top1"], "train_time_s": time.perf_counter() - started,
        "mlflow_run_id": run_id, "history": history,
    }
    write_json(out_dir / "metrics.json", metrics)
    tracking.log_metrics(run_id, {"best_val_top1": best_top1}, step=best_epoch)
    tracking.retry(client.log_artifact, run_id, str(out_dir / "metrics.json"))
    tracking.retry(client.log_artifact, run_id, str(out_dir / "best.pt"), "checkpoints")
    tracking.retry(client.set_terminated, run_id, status="FINISHED")
    return metrics
