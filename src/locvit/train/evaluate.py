"""Score trained checkpoints on a split and record the results in their MLflow runs.

Each checkpoint is scored under its run's precision (``train.amp``: bf16 autocast and TF32 on
CUDA; ``locvit.device.set_backends``) and memory format (``train.channels_last``), as its run validated.

Several checkpoints (the seeds of one variant) are scored by one process with one
FFCV loader: building a loader JIT-compiles its pipeline, which costs far more than
scoring a small test split, so the compile is paid once per variant, not per seed.
"""

from __future__ import annotations

from pathlib import Path

import torch

from locvit import models
from locvit.checkpoint import load_checkpoint
from locvit.data.ffcv_io import make_loader
from locvit.data.prepare import check_split, load_manifest, per_checkpoint
from locvit.device import describe, device_for, set_backends
from locvit.errors import InputError
from locvit.io import pack_bits, remove_temporaries, write_json
from locvit.tracking import log_evaluation
from locvit.train.engine import Compute, channels_last, evaluate


def evaluate_checkpoints(
    checkpoints: list[Path],
    outs: list[Path],
    data: Path | list[Path],
    manifest_path: Path | list[Path],
    tracking_db: Path,
    split: str = "test",
    threads: int | None = None,
) -> list[dict]:
    """Score each checkpoint on ``data`` (one file, or one per checkpoint: a split per seed); write one JSON per
    checkpoint to ``outs``."""
    if len(checkpoints) != len(outs):
        raise InputError(f"{len(checkpoints)} checkpoint(s) but {len(outs)} output file(s); give one output each")
    remove_temporaries(*outs)  # what a killed evaluation left
    files, manifest_paths = per_checkpoint(checkpoints, data, manifest_path)
    manifests = {m: load_manifest(m, {split: f}) for f, m in zip(files, manifest_paths)}
    states = [load_checkpoint(c) for c in checkpoints]  # fail on a bad file before any work
    results, loaders = [], {}
    for checkpoint, state, out, data, path in zip(checkpoints, states, outs, files, manifest_paths):
        cfg, manifest = state["config"], manifests[path]
        check_split(cfg, manifest, path)
        device = device_for(cfg["train"]["device"])
        if data not in loaders:
            loaders[data] = make_loader(
                data,
                cfg["train"]["eval_batch_size"],
                False,
                device,
                cfg["train"]["num_workers"],
                jit=cfg["train"].get("loader_jit", True),
            )
            if threads and device.type == "cpu":
                torch.set_num_threads(threads)  # after the loader: FFCV's Loader resets torch's thread count
        model = models.load(state, device)
        # the run's precision: bf16 autocast where it trained with it (TF32 then), its memory format
        recipe = cfg["train"]
        compute = Compute.of(recipe, device)
        set_backends(device, compute.amp_dtype, recipe.get("deterministic", False))
        if compute.channels_last:
            channels_last(model)
        mean, std = models.normalisation(model)
        scores = evaluate(model, loaders[data], mean, std, compute)
        result = {
            "study": cfg["study"],
            "variant": cfg["variant"],
            "seed": cfg["seed"],
            "model": cfg["model"],
            "split": split,
            f"{split}_top1": scores["top1"],
            f"{split}_loss": scores["loss"],
            "n": scores["n"],
            # per image, in the split's order: top-1 right or wrong (io.pack_bits), for paired comparisons
            f"{split}_hits": pack_bits(scores["hits"].numpy()),
            "n_params": sum(p.numel() for p in model.parameters()),
            "checkpoint_epoch": state["epoch"],
            "val_top1": state["val_top1"],
            "mlflow_run_id": state["mlflow_run_id"],
            "data_hash": manifest["data_hash"],  # the whole prepared dataset (differs between training fractions)
            "n_train": manifest["splits"]["train"]["size"],  # a split per seed's correction: n_test / n_train
            "data_split": cfg["data"].get("split", "fixed"),  # per_seed: the report pairs by seed
            # the split scored, in the order scored (the FFCV file's order, read sequentially): the report pairs
            # two variants' per-image results only when this is equal (locvit.report.study.Acc.against)
            f"{split}_hash": manifest["splits"][split]["content_sha256"],
            "machine": describe(device),
        }
        write_json(out, result)  # first: the result stands whatever the tracking backend does
        log_evaluation(
            cfg["study"],
            tracking_db,
            state,
            out,
            {f"{split}_top1": scores["top1"], f"{split}_loss": scores["loss"]},
            checkpoint.parent,
            manifest,
            {split: data},
        )
        results.append(result)
    return results
