"""locvit's model families, registered with timm on import, and the one way to make a model.

Every model is a timm model built by name, any timm classification model that builds at the
data's image size included (:func:`create`). The families (MaiT, LSA, IBiT, Swin, Twins) live in
their own modules; the baselines (DeiT, CaiT, ConViT, NesT) come straight from timm,
with their 32x32 settings (and the NesT paper's CIFAR NesT-T, ``nest_tiny_cifar``) in
``baselines``; the baselines timm lacks have a file each (``pvt``: PVT v1, ``wrn``: CIFAR
wide ResNets, ``pyramidnet``: PyramidNet, ``localvit``: LocalViT). Training, evaluation, analysis and profiling
make models only through :func:`create` (from a run config) and :func:`load` (from a checkpoint).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from locvit.errors import LocvitError
from locvit.models import (
    baselines,  # noqa: F401  (registers nest_tiny_cifar)
    ibit,  # noqa: F401  (registers ibit_* entrypoints)
    localvit,  # noqa: F401  (registers localvit_*: LocalViT, not in timm)
    lsa,  # noqa: F401  (registers lsa_* entrypoints)
    mait,  # noqa: F401  (registers mait_* entrypoints)
    pvt,  # noqa: F401  (registers pvt_v1_*: PVT v1, not in timm)
    pyramidnet,  # noqa: F401  (registers pyramidnet164_a48)
    swin,  # noqa: F401  (the Swin family: timm's swin_*)
    twins,  # noqa: F401  (the Twins family: timm's twins_*)
    wrn,  # noqa: F401  (registers wrn_*: CIFAR wide ResNets)
)

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def import_modules(modules) -> None:
    """Import params' ``model_modules`` (families outside locvit), from PYTHONPATH or the working directory."""
    import importlib

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
    """The model of a run config (:func:`locvit.run_config.run_config`): ``model`` built with ``model_kwargs``,
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
    """The model a checkpoint (a path, or the state :func:`locvit.checkpoint.load_checkpoint` read)
    was trained as, with its weights, in eval mode, on ``device`` (default: its run's ``train.device``)."""
    from locvit.checkpoint import load_checkpoint

    state = checkpoint if isinstance(checkpoint, dict) else load_checkpoint(checkpoint)
    model = create(state["config"])
    model.load_state_dict(state["model"])
    return model.to(device_for(state["config"]["train"]["device"]) if device is None else device).eval()


def device_for(name: str, local_rank: int = 0) -> torch.device:
    """The device of ``train.device`` (``auto``: CUDA when there is one); ``local_rank`` picks the GPU.

    ``auto`` on a machine whose ``nvidia-smi`` lists GPUs that torch cannot use (a driver too old for this
    torch's CUDA, a CPU-only torch) stops with :class:`CudaUnusable` saying what to install, instead of
    training on the CPU without a word."""
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device is 'cuda' but no CUDA device is available; use 'auto' or 'cpu'")
    if name == "auto":
        if not torch.cuda.is_available() and (smi := nvidia_smi()) is not None:
            raise CudaUnusable(smi)
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device("cuda", local_rank) if name == "cuda" else torch.device(name)


class CudaUnusable(LocvitError):
    """``train.device: auto`` where nvidia-smi sees GPUs and torch cannot use them."""

    def __init__(self, smi: dict):
        try:
            torch.cuda.init()
            why = ""
        except Exception as err:  # torch's own reason: no driver found, a driver too old, a CPU-only build
            why = f" ({str(err).strip().splitlines()[0]})"
        built = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA: a CPU-only build"
        super().__init__(
            f"train.device: auto: nvidia-smi lists {len(smi['gpus'])} GPU(s) ({smi['gpus'][0]}) with driver "
            f"{smi['driver'] or '?'} (CUDA {smi['cuda'] or '?'} at most), but torch {torch.__version__} ({built}) "
            f"cannot use them{why}. Install a torch built for a CUDA this driver supports (pytorch.org/get-started: "
            f"pip install torch --index-url https://download.pytorch.org/whl/cuXYZ, XYZ at most the driver's CUDA), "
            f"or a newer NVIDIA driver; train.device: cpu trains on the CPU on purpose"
        )


def nvidia_smi() -> dict | None:
    """What ``nvidia-smi`` reports: ``gpus`` (its ``-L`` lines), ``driver`` and ``cuda`` (the newest CUDA the
    driver supports); None where there is no nvidia-smi, it fails or lists no GPU."""
    import re
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        listed = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
        header = subprocess.run([exe], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = [line.strip() for line in listed.stdout.splitlines() if line.startswith("GPU ")]
    if listed.returncode != 0 or not gpus:
        return None
    driver, cuda = (re.search(rf"{key} Version:\s*(\S+)", header) for key in ("Driver", "CUDA"))
    return {"gpus": gpus, "driver": driver and driver.group(1), "cuda": cuda and cuda.group(1)}


def normalisation(model: torch.nn.Module) -> tuple[tuple, tuple]:
    """The mean and std the model's inputs are normalised with (its timm config; ImageNet's otherwise)."""
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    return tuple(cfg.get("mean", IMAGENET_MEAN)), tuple(cfg.get("std", IMAGENET_STD))
