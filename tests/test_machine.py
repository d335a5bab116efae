"""Where the numbers come from: locvit.device names the CPU, the instruction set torch's kernels use,
torch's build and the GPU, and every run record and benchmark file carries it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from locvit import device


def test_describe_names_the_cpu_its_instruction_set_and_torchs_build():
    d = device.describe("cpu")
    assert d["cpu"] == device.cpu_model() and d["cpu"]
    assert d["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert (d["torch"], d["torch_git"], d["torch_cuda"]) == (
        torch.__version__,
        torch.version.git_version,
        torch.version.cuda,
    )
    assert d["gpu"] is None and json.loads(json.dumps(d)) == d  # a CPU device names no GPU; JSON as it is
    if not torch.cuda.is_available():
        assert device.describe()["gpu"] is None and device.gpu() is None


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_describe_names_the_device_cuda_cudnn_and_triton():
    g = device.describe("cuda:0")["gpu"]
    assert g["name"] == torch.cuda.get_device_name(0) and g["cuda"] == torch.version.cuda
    assert g["cudnn"] == torch.backends.cudnn.version() and g["triton"]


@pytest.mark.e2e
def test_the_record_follows_the_capability_torch_was_capped_to():
    """ATEN_CPU_CAPABILITY=default: torch's generic kernels, and the record says so."""
    code = "import json; from locvit import device; print(json.dumps(device.describe('cpu')))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "ATEN_CPU_CAPABILITY": "default"},
    )
    assert json.loads(out.stdout)["cpu_capability"] == "DEFAULT"


def test_a_training_runs_mlflow_tags_name_the_machine(tmp_path):
    from locvit.tracking import TrainingTracker

    cfg = {
        "study": "s",
        "variant": "v",
        "model": "deit_tiny_patch16_224",
        "seed": 0,
        "train": {"lr": 1e-3, "batch_size": 16, "lr_scale_batch": None},
    }
    tracker = TrainingTracker.for_run(
        cfg,
        tmp_path / "mlflow.db",
        tmp_path,
        {"source": "digits", "data_hash": "0"},
        "cpu",
        10,
        1,
        machine=device.describe("cpu"),
    )
    tags = tracker.tags
    assert tags["machine.cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert tags["machine.cpu"] == device.cpu_model() and tags["machine.torch"] == torch.__version__
    assert not any(k.startswith("machine.gpu") for k in tags)  # none on a CPU run


def test_every_benchmark_file_names_the_machine():
    from benchmarks import common

    assert common.machine() == device.describe()
