"""The machine and its device: what made a number, which device a run takes, its precision, Triton's toolchain.

``describe``: CPU, torch's kernels' instruction set, torch's build and the GPU, in every run record and
benchmark file (docs/reproducibility.md); ``machine``: a local run's sizes, without importing torch where no
GPU driver is; ``device_for``: ``train.device``'s device; ``amp_dtype``, ``set_backends``: bf16 autocast, TF32,
cuDNN's autotuner; ``missing_toolchain``, ``require_toolchain``: a C compiler and Python's headers for Triton.
Torch is imported where used, so the Snakefile's look at the machine stays quick.
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING

from locvit.errors import LocvitError

if TYPE_CHECKING:
    import torch

# Where a number was made ---------------------------------------------------------------------------------
# A run's per-seed accuracies differ between machines although the code and the config are the same: torch
# picks its CPU kernels by the instruction set it finds (``AVX512``, ``AVX2``, ...; ``ATEN_CPU_CAPABILITY``
# caps it), and kernels of different vector widths add floating-point numbers in different orders, so a long
# training run drifts apart. Every run record (metrics.json, its MLflow tags, the evaluation files) and every
# benchmark file names the machine with ``describe``, so that two numbers can be told apart by what made them.


def cpu_model() -> str:
    """The CPU's model name as the kernel reports it (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:  # torch's CPU builds come without it
        return None
    return getattr(triton, "__version__", None)


def gpu(device: torch.device | str | int | None = None) -> dict | None:
    """The GPU ``device`` names (default: the current one): its name, compute capability, the CUDA torch
    runs on, cuDNN and triton; None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    index = torch.device(device).index if isinstance(device, (torch.device, str)) else device
    index = torch.cuda.current_device() if index is None else index
    return {
        "name": torch.cuda.get_device_name(index),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(index))),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": _triton_version(),
    }


def describe(device: torch.device | str | None = None) -> dict:
    """The machine a number comes from, as JSON-ready fields.

    ``cpu``: the model name; ``cpu_capability``: the instruction set torch's CPU kernels use
    (``torch.backends.cpu.get_cpu_capability()``, after ``ATEN_CPU_CAPABILITY``); ``cores``, and
    ``torch_threads`` now; torch's build (``torch``, its ``torch_git`` commit and the ``torch_cuda`` it was
    built with, None for a CPU build), ``python``; ``gpu``: ``gpu`` of ``device`` when it is a CUDA
    device, or (``device`` None) of the current GPU when there is one, else None.
    """
    import torch

    kind = torch.device(device).type if device is not None else None
    return {
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "torch_git": torch.version.git_version,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "gpu": gpu(device) if kind in (None, "cuda") else None,
    }


# A local run's sizes and the GPUs this process sees -------------------------------------------------------

#: A GPU driver's files: without any, the machine has no GPU for torch, which is then not imported (seconds).
GPU_DRIVERS = ("/proc/driver/nvidia/gpus", "/dev/kfd")


@functools.lru_cache(maxsize=1)  # once per process: the Snakefile asks for every training job
def machine() -> dict[str, int]:
    """This machine's CPUs, memory (MB) and the GPUs this process sees (``torch.cuda.device_count``)."""
    import psutil

    return {"cpus": os.cpu_count() or 1, "mem_mb": psutil.virtual_memory().total // 2**20, "gpus": gpu_count()}


def gpu_count() -> int:
    if not any(Path(p).exists() for p in GPU_DRIVERS) or os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    import torch

    return torch.cuda.device_count()


def visible(env: dict[str, str] | None = None) -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` where set, else all that torch counts."""
    env = os.environ if env is None else env
    if env.get("CUDA_VISIBLE_DEVICES") is not None:
        return [d.strip() for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d.strip()]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


# The device a run takes ------------------------------------------------------------------------------------


def device_for(name: str, local_rank: int = 0) -> torch.device:
    """The device of ``train.device`` (``auto``: CUDA when there is one); ``local_rank`` picks the GPU.

    ``auto`` on a machine whose ``nvidia-smi`` lists GPUs that torch cannot use (a driver too old for this
    torch's CUDA, a CPU-only torch) stops with ``CudaUnusable`` saying what to install, instead of
    training on the CPU without a word."""
    import torch

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
        import torch

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


# Precision: bf16 autocast, TF32 and cuDNN's autotuner -------------------------------------------------------
# Training, evaluation and the throughput job read the same recipe keys (``train.amp``, ``train.deterministic``)
# through here, so a figure is measured under the precision the run trains with. ``amp`` on (bf16 autocast;
# ``auto`` is on for CUDA) lets the float32 matmuls and convolutions left outside autocast use TF32; ``amp: off``
# means IEEE float32 everywhere. TF32 is set through torch's legacy switches only: torch's per-backend ones
# (``fp32_precision``, torch >= 2.9) make the legacy getters raise, and Inductor still reads those, so
# ``torch.compile`` failed (pytorch/pytorch#166387, #196728). cuDNN's autotuner (``cudnn.benchmark``) times its
# kernels on the first batch of each shape and keeps the fastest: worth it where shapes are fixed (an epoch
# drops its last partial batch), off under ``train.deterministic`` (bitwise repeats).


def amp_dtype(setting: str | bool, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of ``train.amp`` on ``device`` (None: float32)."""
    import torch

    if setting in ("off", False) or (setting == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


def set_backends(device: torch.device, dtype: torch.dtype | None, deterministic: bool = False) -> dict:
    """TF32 (on where ``dtype`` is an autocast dtype) and cuDNN's autotuner (on unless ``deterministic``)
    for this process's CUDA work; nothing on other devices. What was set, for the record.

    The switches are process-wide and touch no CUDA state, so a CPU-only test can call this with a CUDA device.
    """
    import torch

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


# Triton's toolchain: a C compiler and Python's headers ---------------------------------------------------------
# Triton (behind ``torch.compile``'s inductor backend and the compiled FlexAttention of MaiT's
# ``restrict_kernel``) compiles a small C launcher for each kernel the first time it runs, with the C compiler
# Triton picks (``$CC``, else ``cc`` or ``gcc`` on PATH) against ``Python.h``. Without either, a compiled run
# fails at its first step; ``missing_toolchain`` says so beforehand, with what to install. Inductor on the CPU
# compiles C++ with the same compiler, so ``torch.compile`` needs it on any device. ``gpu_node/gpu_check.py``
# reports the same probes in its node check.

PIECES = ("compiler", "python-headers")


class ToolchainError(LocvitError, ValueError):
    """A compiled path was asked for on a node without the compiler or headers it builds with (a user's
    problem to fix by installing them or turning the compiled path off; ``locvit`` prints it as one line)."""


def probe_compiler() -> dict:
    """The C compiler Triton would use: ``$CC``, else ``cc`` or ``gcc`` on PATH, with its ``--version``'s first line."""
    for exe in (os.environ.get("CC"), "cc", "gcc"):
        path = shutil.which(exe) if exe else None
        if path:
            out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
            return {"path": path, "version": (out.splitlines() or ["unknown"])[0]}
    return {"path": None, "version": None}


def probe_python_headers() -> dict:
    """Where this Python's headers should be, and whether ``Python.h`` is there."""
    include = sysconfig.get_paths()["include"]
    return {"include": include, "python_h": (Path(include) / "Python.h").is_file()}


def missing_pieces(compiler: dict | None = None, headers: dict | None = None) -> dict[str, str]:
    """Each piece (``PIECES``) this node lacks, mapped to what is missing and what to install; ``{}`` when
    it can build Triton's launchers. Probes afresh (``compiler`` and ``headers``: probes already made)."""
    compiler = compiler if compiler is not None else probe_compiler()
    headers = headers if headers is not None else probe_python_headers()
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = {}
    if compiler["path"] is None:
        found["compiler"] = (
            "no C compiler ($CC, cc or gcc on PATH), which Triton builds torch.compile's CUDA "
            "launchers with: install gcc (apt-get install gcc, dnf install gcc, module load gcc, "
            "conda install -c conda-forge gcc) or point $CC at one"
        )
    if not headers["python_h"]:
        found["python-headers"] = (
            f"no Python.h in {headers['include']}, which Triton compiles against: install "
            f"Python {py}'s development headers (apt-get install python{py}-dev, "
            f"dnf install python{py}-devel; a conda environment's python package has them)"
        )
    return found


@functools.cache
def _missing_once() -> tuple[tuple[str, str], ...]:
    return tuple(missing_pieces().items())


def missing_toolchain() -> dict[str, str]:
    """``missing_pieces``, probed once per process (the node does not change under a run)."""
    return dict(_missing_once())


def describe_missing(found: dict[str, str]) -> str:
    """One line: each missing piece and what to install."""
    return "; ".join(f"{piece}: {what}" for piece, what in found.items())


def require_toolchain(what: str, way_out: str) -> None:
    """Raise ``ToolchainError`` when this node lacks the compiler or headers, naming ``what`` needs
    them, what is missing, what to install, and ``way_out`` (how to run without)."""
    found = missing_toolchain()
    if found:
        raise ToolchainError(
            f"{what} needs a C compiler and Python's headers to build its kernels, and this "
            f"node lacks them: {describe_missing(found)}. Or {way_out}"
        )
