"""``train.device: auto`` where nvidia-smi sees a GPU that torch cannot use stops and says what to install."""

from __future__ import annotations

import pytest
import torch

from locvit import device

SMI = """#!/bin/sh
if [ "$1" = "-L" ]; then
  echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)"
else
  echo "| NVIDIA-SMI 470.256.02   Driver Version: 470.256.02   CUDA Version: 11.4     |"
fi
"""


@pytest.fixture
def stand_in_smi(tmp_path, monkeypatch):
    """An nvidia-smi on PATH that lists one GPU under a driver for CUDA 11.4 (too old for a cu13 torch)."""
    exe = tmp_path / "nvidia-smi"
    exe.write_text(SMI)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    return exe


@pytest.mark.e2e  # runs the stand-in nvidia-smi
@pytest.mark.skipif(torch.cuda.is_available(), reason="torch uses this machine's GPU: auto picks it")
def test_auto_stops_where_nvidia_smi_sees_a_gpu_torch_cannot_use(stand_in_smi):
    assert device.nvidia_smi() == {
        "gpus": ["GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)"],
        "driver": "470.256.02",
        "cuda": "11.4",
    }
    with pytest.raises(device.CudaUnusable) as stop:
        device.device_for("auto")
    message = str(stop.value)
    for says in (
        "nvidia-smi lists 1 GPU(s) (GPU 0: NVIDIA H100",
        "driver 470.256.02 (CUDA 11.4 at most)",
        f"torch {torch.__version__}",
        "Install a torch built for a CUDA this driver supports",
        "train.device: cpu",
    ):
        assert says in message, message
    assert device.device_for("cpu") == torch.device("cpu")  # asked for by name: no question


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch uses this machine's GPU: auto picks it")
def test_auto_is_the_cpu_without_nvidia_smi(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, as on a machine without a GPU
    assert device.nvidia_smi() is None and device.device_for("auto") == torch.device("cpu")
