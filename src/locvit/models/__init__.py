"""locvit's model families, registered with timm on import, and the one way to make a model.

Importing this package imports every module in its folder: a family is one file (its model, its
``@register_model`` entrypoints and its ``Family``), found there. Every model
is a timm model built by name, any timm classification model that builds at the data's image size
included. Training, evaluation, analysis and profiling make models only through ``create`` (from
a run config) and ``load`` (from a checkpoint).
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from typing import Any

import torch

for _module in pkgutil.iter_modules(__path__):  # each family registers itself on import
    importlib.import_module(f"{__name__}.{_module.name}")

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def import_modules(modules) -> None:
    """Import params' ``model_modules`` (families outside locvit), from PYTHONPATH or the working directory."""
    from locvit.model_modules import working_dir_on_path

    for module in modules:
        with working_dir_on_path() as cwd:
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise ImportError(
                    f"cannot import {module!r} (looked in the working directory {cwd} and on "
                    f"PYTHONPATH): {err}; put {module.replace('.', '/')}.py there or fix the "
                    "name"
                ) from err


def create(cfg: dict) -> torch.nn.Module:
    """The model of a run config (``locvit.config.run.run_config``): ``model`` built with ``model_kwargs``,
    after importing the config's ``model_modules`` (families outside locvit).

    ``img_size`` (the data's image size, which the pipeline always puts in ``model_kwargs``) goes only to
    models that take it: timm's ViTs and Swins build their patch grid from it, its CNNs (ResNet, RegNet,
    ConvNeXt, EfficientNet) and PVT v2 take none and run at any size. timm's entrypoints all read
    ``**kwargs``, so whether the model takes it shows only when the model's constructor refuses it.
    """
    import timm

    import_modules(cfg.get("model_modules", ()))
    kwargs = dict(cfg["model_kwargs"])
    try:
        return timm.create_model(cfg["model"], pretrained=False, **kwargs)
    except TypeError as err:
        if "img_size" not in kwargs or "unexpected keyword argument 'img_size'" not in str(err):
            raise
    del kwargs["img_size"]  # refused at the constructor's call, before any weight was made
    return timm.create_model(cfg["model"], pretrained=False, **kwargs)


def load(checkpoint: str | Path | dict[str, Any], device: str | torch.device | None = None) -> torch.nn.Module:
    """The model a checkpoint (a path, or the state ``locvit.checkpoint.load_checkpoint`` read)
    was trained as, with its weights, in eval mode, on ``device`` (default: its run's ``train.device``)."""
    from locvit.checkpoint import load_checkpoint
    from locvit.device import device_for

    state = checkpoint if isinstance(checkpoint, dict) else load_checkpoint(checkpoint)
    model = create(state["config"])
    model.load_state_dict(state["model"])
    return model.to(device_for(state["config"]["train"]["device"]) if device is None else device).eval()


def normalisation(model: torch.nn.Module) -> tuple[tuple, tuple]:
    """The mean and std the model's inputs are normalised with (its timm config; ImageNet's otherwise)."""
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    return tuple(cfg.get("mean", IMAGENET_MEAN)), tuple(cfg.get("std", IMAGENET_STD))
