"""The GPU check's CPU side (benchmarks/gpu_check.py, benchmarks/wheelhouse.py).

No GPU here: the whole check runs on the CPU at tiny sizes (--quick) in a process that can
import only what an offline GPU node would have (its packages plus the wheelhouse's; every
other distribution installed here is hidden), and the wheelhouse's list is checked against
this environment. Nothing is downloaded.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu_check  # noqa: E402
import wheelhouse  # noqa: E402

# What a node has under the name of this machine's packages: opencv-python's cv2 stands in
# for the node's opencv-python-headless (same module, same libraries FFCV needs).
SAME_AS_NODE = {"opencv-python"}


def _node_visible() -> set[str]:
    return set(wheelhouse.closure(wheelhouse.NODE_HAS)) | set(wheelhouse.requirements()) | {"locvit"} | SAME_AS_NODE


def _hide_others(folder: Path, also: tuple[str, ...] = ()) -> dict:
    """A sitecustomize in ``folder`` that makes every top-level module of a distribution the node
    would not have (and the modules ``also``) fail to import; the environment to run a process under it."""
    visible = _node_visible()
    hidden = sorted({m for m, dists in md.packages_distributions().items()
                     if not any(canonicalize_name(d) in visible for d in dists) and m.isidentifier()} | set(also))
    (folder / "sitecustomize.py").write_text(textwrap.dedent(f"""
        import importlib.machinery, sys
        HIDDEN = set({hidden!r})
        class _Hide:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in HIDDEN:
                    return importlib.machinery.ModuleSpec(name, self)
            def create_module(self, spec):
                raise ModuleNotFoundError(f"No module named {{spec.name!r}} (not on the GPU node)", name=spec.name)
            def exec_module(self, module):
                pass
        sys.meta_path.insert(0, _Hide())
    """))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(REPO / "src")]))
    return {"env": env, "hidden": hidden}


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> Path:
    """The demo's prepared splits (locvit prepare reads the digits with scikit-learn, which the node lacks:
    the wheelhouse carries them prepared)."""
    out = tmp_path_factory.mktemp("demo-data")
    subprocess.run([sys.executable, "-m", "locvit", "prepare", "--params", str(REPO / "params.yaml"),
                    "--train", str(out / "train.beton"), "--val", str(out / "val.beton"), "--test",
                    str(out / "test.beton"), "--manifest", str(out / "manifest.json")],
                   cwd=REPO, check=True, capture_output=True)
    return out


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_quick_check_on_cpu_with_only_the_node_packages(tmp_path, demo_data):
    hide = _hide_others(tmp_path)
    assert {"mlflow", "snakemake", "dvc", "sklearn", "scipy", "pandas"} <= set(hide["hidden"])
    results = tmp_path / "results"
    results.mkdir()
    (results / "gpu.json").write_text("an older result\n")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--demo-data", str(demo_data), "--results-dir", str(results)],
                          cwd=REPO, env=hide["env"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in results.iterdir()) == ["gpu.json"]  # replaced whole, no temporary left
    r = json.loads((results / "gpu.json").read_text())
    assert r["errors"] == {} and r["problems"] == [] and r["machine"]["gpu"] is None and r["device"] == "cpu"
    assert r["sections_run"] == list(gpu_check.SECTIONS)
    assert r["ffcv"]["available"] is True

    t = r["cuda_tests"]  # the CUDA-marked tests ran and skipped (no CUDA here)
    assert t["ok"] and "tests/test_augment.py" in t["files"] and t["counts"].get("skipped", 0) >= 1
    assert not t["counts"].get("passed")

    d = r["demo_training"]  # locvit train without MLflow: tracking fails, training goes on
    assert d["ran"] and d["ok"] and list(d["runs"]) == ["deit"]
    run = d["runs"]["deit"]
    assert run["tracking"] == "failed" and [h["epoch"] for h in run["history"]] == [0, 1]
    assert all(_finite_positive(h["train_images_per_s"]) and 0 <= h["val_top1"] <= 1 for h in run["history"])

    tp = r["throughput"]
    assert set(tp["families"]) == set(gpu_check.FAMILIES)
    assert tp["peak_bf16_tflops"] is None and "cpu" in tp["peak_note"]
    for label, row in tp["families"].items():
        assert "error" not in row, (label, row)
        assert _finite_positive(row["images_per_s"]) and _finite_positive(row["gmacs_forward"]), label
        assert row["train_flops_per_image"] == pytest.approx(6e9 * row["gmacs_forward"])
        assert row["mfu"] is None and row["compiled"] is False
    ln = r["lsa_vs_nest"]
    assert ln["paper_ratio"] == 2.7 and ln["ratio"] == pytest.approx(
        ln["lsa_tiny_images_per_s"] / ln["nest_tiny_images_per_s"])

    ra = r["restrict_attention"]
    assert list(ra["by_patch_tokens"]) == ["16", "64"] and ra["pass"].startswith("forward only")
    for row in ra["by_patch_tokens"].values():
        assert row["flex_kernel_used"] == "flex"  # eager FlexAttention in eval mode on the CPU
        for k in ("flex_ms", "dense_masked_ms", "full_fused_ms", "dense_masked_over_flex"):
            assert _finite_positive(row[k]), k

    assert _finite_positive(r["augmentation"]["images_per_s"])
    f = r["feed"]
    assert f["ran"] and _finite_positive(f["loader_images_per_s"]) and _finite_positive(f["loader_augment_images_per_s"])


def test_without_ffcv_the_check_says_so_and_measures_synthetic_batches(tmp_path, demo_data):
    hide = _hide_others(tmp_path, also=("ffcv",))
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--sections", "demo_training", "augmentation", "feed", "--demo-data", str(demo_data),
                           "--results-dir", str(tmp_path)], cwd=REPO, env=hide["env"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((tmp_path / "gpu.json").read_text())
    assert r["ffcv"]["available"] is False and "ffcv" in r["ffcv"]["reason"]
    for section in ("demo_training", "feed"):
        assert r[section]["ran"] is False and "FFCV cannot be imported" in r[section]["reason"]
    assert "synthetic" in r["feed"]["reason"] and _finite_positive(r["augmentation"]["images_per_s"])
    assert r["problems"] == []


def test_a_failing_section_is_recorded_and_the_others_still_run(tmp_path, monkeypatch):
    import torch

    monkeypatch.setattr(gpu_check.common, "RESULTS", tmp_path)
    # lsa_vs_nest reads the throughput section, which is not run: it fails, augmentation still runs
    r = gpu_check.run_check(torch.device("cpu"), quick=True, sections=["lsa_vs_nest", "augmentation"])
    assert r["lsa_vs_nest"] is None and "KeyError" in r["errors"]["lsa_vs_nest"]
    assert len(r["problems"]) == 1 and r["problems"][0].startswith("lsa_vs_nest: KeyError")
    assert _finite_positive(r["augmentation"]["images_per_s"])
    assert json.loads((tmp_path / "gpu.json").read_text())["errors"] == r["errors"]


@pytest.mark.parametrize("name, peak", [("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 PCIe", 756.0),
                                        ("NVIDIA H200", 989.0), ("NVIDIA A100-SXM4-80GB", 312.0),
                                        ("NVIDIA GeForce GTX 1080", None)])
def test_bf16_peak_by_device_name(name, peak):
    found, note = gpu_check.peak_for_name(name)
    assert found == peak
    assert ("unknown GPU" in note and "MFU is null" in note) if peak is None else name in note


def test_wheelhouse_list_pins_what_is_installed_here_and_leaves_out_the_node_packages():
    pins = wheelhouse.requirements()
    node = wheelhouse.closure(wheelhouse.NODE_HAS)
    assert {"ffcv", "jsonschema", "pytest", "rpds-py"} <= set(pins)
    assert not set(pins) & set(node)
    assert {"torch", "timm", "numba", "numpy", "pyyaml", "torchvision"} <= set(node)
    for name, version in pins.items():
        assert md.version(name) == version, name
    # what the check does not need stays out (a few tens of MiB, not hundreds)
    assert not {"mlflow", "snakemake", "dvc", "scikit-learn", "scipy", "pandas", "matplotlib"} & set(pins)
    assert not {"fastargs", "terminaltables", "pytorch-pfn-extras", "opencv-python"} & set(pins)  # ffcv's, unused


def test_cuda_marker_is_registered_and_on_the_cuda_tests(pytestconfig):
    assert any(m.startswith("cuda:") for m in pytestconfig.getini("markers"))
    files = gpu_check.cuda_test_files()
    assert REPO / "tests" / "test_augment.py" in files
    for f in (REPO / "tests").glob("test_*.py"):  # a test that skips without CUDA carries the marker
        if re.search(r"skipif\(\s*not torch\.cuda\.is_available\(\)", f.read_text()):
            assert f in files, f"{f.name} skips without CUDA but has no @pytest.mark.cuda"
