"""How a run's numbers are computed on its device: bf16 autocast, TF32 and cuDNN's autotuner.

Training, evaluation and the throughput job read the same recipe keys (``train.amp``,
``train.deterministic``) through here, so a figure is measured under the precision the run trains with.
``amp`` on (bf16 autocast; ``auto`` is on for CUDA) lets the float32 matmuls and convolutions left outside
autocast use TF32; ``amp: off`` means IEEE float32 everywhere. TF32 is set through torch's legacy switches
only: torch's per-backend ones (``fp32_precision``, torch >= 2.9) make the legacy getters raise, and Inductor
still reads those, so ``torch.compile`` failed (pytorch/pytorch#166387, #196728). cuDNN's autotuner
(``cudnn.benchmark``) times its kernels on the first batch of each shape and keeps the fastest: worth it where
shapes are fixed (an epoch drops its last partial batch), off under ``train.deterministic`` (bitwise repeats).
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
    for this process's CUDA work; nothing on other devices. What was set, for the record.

    The switches are process-wide and touch no CUDA state, so a CPU-only test can call this with a CUDA device.
    """
    if device.type != "cuda":
        return {}
    tf32 = dtype is not None
    # "high": TF32 for float32 matmuls (every backend's: oneDNN's too, on CPUs that have it); "highest": IEEE
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32  # convolutions
    torch.backends.cudnn.benchmark = not deterministic
    return {
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_allow_tf32": tf32,
        "cudnn_benchmark": not deterministic,
    }
