"""How a run's numbers are computed on its device: bf16 autocast, TF32 and cuDNN's autotuner.

Training, evaluation and the throughput job read the same recipe keys (``train.amp``,
``train.deterministic``) through here, so a figure is measured under the precision the run
trains with. ``amp`` on (bf16 autocast; ``auto`` is on for CUDA) accepts reduced-precision
matmuls, so the float32 matmuls and convolutions left outside autocast may use TF32 too;
``amp: off`` means float32 everywhere, TF32 included (IEEE float32). cuDNN's autotuner
(``cudnn.benchmark``) times its kernels on the first batch of each shape and keeps the
fastest: worth it where the shapes are fixed (a training epoch drops its last partial batch),
and off under ``train.deterministic``, where another pick per run would break the bitwise repeat.
"""

from __future__ import annotations

import torch


def amp_dtype(setting: str | bool, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``train.amp`` on ``device`` (None: float32)."""
    if setting in ("off", False) or (setting == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


def set_backends(device: torch.device, dtype: torch.dtype | None, deterministic: bool = False) -> dict:
    """TF32 (on where ``dtype`` is an autocast dtype) and cuDNN's autotuner (on unless ``deterministic``)
    for this process's CUDA work; nothing on other devices. What was set, for the record."""
    if device.type != "cuda":
        return {}
    precision = "tf32" if dtype is not None else "ieee"
    # torch >= 2.9's per-backend switches (the older allow_tf32 flags must not be mixed with them)
    torch.backends.cuda.matmul.fp32_precision = precision
    torch.backends.cudnn.conv.fp32_precision = precision
    torch.backends.cudnn.benchmark = not deterministic
    return {"fp32_precision": precision, "cudnn_benchmark": not deterministic}
