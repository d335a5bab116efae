"""Score a trained checkpoint on a split and record the result in its MLflow run."""

from __future__ import annotations

from pathlib import Path

import torch

from locvit import tracking
from locvit.data.ffcv_io import make_loader
from locvit.data.prepare import load_manifest
from locvit.io import write_json
from locvit.train.checkpoint import build_from_checkpoint, load_checkpoint
from locvit.train.engine import evaluate
from locvit.train.loop import normalisation, resolve_device


def evaluate_checkpoint(checkpoint: Path, data: Path, manifest_path: Path, out: Path, study_dir: Path,
                        split: str = "test", threads: int | None = None) -> dict:
    manifest = load_manifest(manifest_path, {split: data})
    state = load_checkpoint(checkpoint)
    cfg = state["config"]
    device = resolve_device(cfg["train"]["device"])
    model = build_from_checkpoint(state).to(device)
    mean, std = normalisation(model)
    loader = make_loader(data, cfg["train"]["eval_batch_size"], False, device, cfg["train"]["num_workers"])
    if threads and device.type == "cpu":
        torch.set_num_threads(threads)  # after the loader: FFCV's Loader resets torch's thread count
    scores = evaluate(model, loader, mean, std)
    result = {
        "study": cfg["study"], "variant": cfg["variant"], "seed": cfg["seed"], "model": cfg["model"],
        "split": split, f"{split}_top1": scores["top1"], f"{split}_loss": scores["loss"], "n": scores["n"],
        "n_params": sum(p.numel() for p in model.parameters()), "checkpoint_epoch": state["epoch"],
        "val_top1": state["val_top1"], "mlflow_run_id": state["mlflow_run_id"], "data_hash": manifest["data_hash"],
    }
    tracking.setup(cfg["study"], study_dir)
    tracking.log_metrics(state["mlflow_run_id"], {f"{split}_top1": scores["top1"], f"{split}_loss": scores["loss"]},
                         step=state["epoch"])
    write_json(out, result)
    return result
