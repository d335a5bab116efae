"""A training run's fingerprint: what its code computes on fixed inputs, recorded when it trained (29/34).

``fingerprint`` builds the run config's model on the CPU from its seed and trains it for ``STEPS`` optimiser
steps of ``BATCH`` fixed images through the run's own feed (RandAugment, random erasing, normalisation),
MixUp/CutMix, loss, gradient clipping, AdamW and EMA (``locvit.train.engine``'s ``train_one_epoch`` and
the optimiser, EMA and schedule a run builds), then scores the fixed images in eval mode with the model and
its EMA. It hashes every number it met: the initial and final weights, the EMA's, the losses, the logits and
the whole learning-rate schedule of the run's epochs. Equal digests: the changed code computes that run as the
old did on these inputs. It cannot see code that runs only later (an epoch boundary, the data loader, a
branch taken at another step or batch size, a GPU kernel): any doubt retrains (docs/pipeline.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random

import numpy as np
import torch

#: Optimiser steps, images per step, and the steps per epoch the schedule is written out at.
STEPS, BATCH, SCHEDULE_STEPS_PER_EPOCH = 3, 4, 10


def fingerprint(cfg: dict) -> str:
    """SHA-256 of what run config ``cfg`` computes on fixed inputs (module docstring); the process's
    generators and thread count are as they were afterwards."""
    from locvit.checkpoint import weights_digest

    threads = torch.get_num_threads()
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        torch.set_num_threads(1)  # CPU reductions split by thread count: one thread, the same bits anywhere
        cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_initialized() else []
        with torch.random.fork_rng(devices=cuda):  # seed_everything seeds CUDA's generators too
            parts = _run(cfg, weights_digest)
    finally:
        torch.set_num_threads(threads)
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def _run(cfg: dict, weights_digest) -> dict:
    from locvit import models
    from locvit.data.augment import make_mixup, make_train_augment
    from locvit.data.feed import TrainFeed
    from locvit.train.engine import (
        Compute,
        EpochBatches,
        StepRecipe,
        make_ema,
        make_optimizer,
        make_schedule,
        train_one_epoch,
        update_ema,
    )
    from locvit.train.state import seed_everything

    recipe, device = cfg["train"], torch.device("cpu")
    size, classes = cfg["data"]["image_size"], cfg["model_kwargs"]["num_classes"]
    seed_everything(cfg["seed"])
    model = models.create(cfg)
    initial = weights_digest(model.state_dict())
    mean, std = models.normalisation(model)
    inputs = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (STEPS, BATCH, 3, size, size), generator=inputs, dtype=torch.uint8)
    labels = torch.randint(0, classes, (STEPS, BATCH), generator=inputs)
    compute = Compute.of(recipe, device)
    augment = make_train_augment(recipe, mean, std, cfg["seed"], 0)
    feed = functools.partial(TrainFeed, augment=augment, compute=compute, mean=mean, std=std, ahead=0)
    optimizer, ema = make_optimizer(model, recipe, device), make_ema(model, recipe)
    lr_at = make_schedule(recipe, SCHEDULE_STEPS_PER_EPOCH)
    stats = train_one_epoch(
        model,
        EpochBatches(list(zip(images, labels)), feed),
        optimizer,
        lr_at,
        recipe=StepRecipe.of(recipe),
        compute=compute,
        mixup=make_mixup(recipe, classes, cfg["seed"], 0),
        on_step=(lambda step, ok: update_ema(ema, model, step, ok)) if ema is not None else None,
    )
    x = compute.inputs(images[0], mean, std)  # the first batch, unaugmented, in eval mode
    return {
        "initial": initial,
        "trained": weights_digest(model.state_dict()),
        "ema": weights_digest(ema.module.state_dict()) if ema is not None else None,
        "loss": float(stats["train_loss"]).hex(),
        "logits": _logits(model, x, compute),
        "ema_logits": _logits(ema.module, x, compute) if ema is not None else None,
        "schedule": [float(lr_at(s)).hex() for s in range(SCHEDULE_STEPS_PER_EPOCH * recipe["epochs"])],
    }


@torch.no_grad()
def _logits(model: torch.nn.Module, x: torch.Tensor, compute) -> str:
    model.eval()
    with compute.autocast(x.device):
        logits = model(x).float()  # (B, num_classes)
    return hashlib.sha256(logits.contiguous().numpy().tobytes()).hexdigest()
