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
from types import SimpleNamespace

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


@pytest.mark.e2e
def test_quick_check_on_cpu_with_only_the_node_packages(tmp_path, demo_data):
    hide = _hide_others(tmp_path)
    assert {"mlflow", "snakemake", "dvc", "sklearn", "scipy", "pandas"} <= set(hide["hidden"])
    results = tmp_path / "results"
    results.mkdir()
    (results / "gpu.json").write_text("an older result\n")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--demo-data", str(demo_data), "--results-dir", str(results),
                           "--allow-skipped", "cuda_tests"],  # no CUDA here: every CUDA-marked test skips
                          cwd=REPO, env=hide["env"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("gpu-check: node: ")  # the node is reported before any section
    assert sorted(p.name for p in results.iterdir()) == ["gpu.json"]  # replaced whole, no temporary left
    r = json.loads((results / "gpu.json").read_text())
    assert r["errors"] == {} and r["problems"] == [] and r["machine"]["gpu"] is None and r["device"] == "cpu"
    assert r["sections_run"] == list(gpu_check.SECTIONS)
    assert r["ffcv"]["available"] is True
    assert r["node"]["missing"] == {} and r["node"]["needs"] == {"glibc": "2.34", "glibcxx": "3.4.30", "timm": "1.0.31"}
    assert r["allowed"] == {"skipped": ["cuda_tests"], "no_ffcv": False}

    t = r["cuda_tests"]  # the CUDA-marked tests were collected and skipped (no CUDA here): not run
    assert t["ok"] and "tests/test_augment.py" in t["files"] and t["counts"].get("skipped", 0) >= 1
    assert not t["counts"].get("passed") and t["ran"] is False and "no CUDA-marked test ran" in t["reason"]
    # without --allow-skipped cuda_tests the same result is a problem: the default is strict
    strict = gpu_check.problems({**r, "allowed": {"skipped": [], "no_ffcv": False}})
    assert len(strict) == 1 and strict[0].startswith("cuda_tests: did not run") and "--allow-skipped" in strict[0]

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


@pytest.mark.e2e
def test_without_ffcv_the_check_says_so_and_fails_unless_allowed(tmp_path, demo_data):
    hide = _hide_others(tmp_path, also=("ffcv",))
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--sections", "demo_training", "augmentation", "feed", "--demo-data", str(demo_data),
                           "--results-dir", str(tmp_path)], cwd=REPO, env=hide["env"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((tmp_path / "gpu.json").read_text())
    assert r["ffcv"]["available"] is False and "ffcv" in r["ffcv"]["reason"]
    for section in ("demo_training", "feed"):
        assert r[section]["ran"] is False and "FFCV cannot be imported" in r[section]["reason"]
    assert "synthetic" in r["feed"]["reason"] and _finite_positive(r["augmentation"]["images_per_s"])
    # one line for FFCV, naming the sections it kept from running and the flag that accepts it
    assert len(r["problems"]) == 1, r["problems"]
    assert r["problems"][0].startswith("ffcv: cannot be imported") and "demo_training and feed" in r["problems"][0]
    assert "--allow-no-ffcv" in r["problems"][0]
    # the same run, allowed (by the flag, or by allowing both sections to skip), has no problem
    assert gpu_check.problems({**r, "allowed": {"skipped": [], "no_ffcv": True}}) == []
    assert gpu_check.problems({**r, "allowed": {"skipped": ["demo_training", "feed"], "no_ffcv": False}}) == []
    assert len(gpu_check.problems({**r, "allowed": {"skipped": ["feed"], "no_ffcv": False}})) == 1


def test_a_section_that_did_not_run_is_a_problem_unless_allowed():
    payload = {"errors": {}, "sections_run": ["demo_training", "augmentation"], "ffcv": {"available": True},
               "demo_training": {"ran": False, "reason": "locvit prepare failed: no scikit-learn"},
               "augmentation": {"images_per_s": 1.0}}
    found = gpu_check.problems(payload)
    assert found == ["demo_training: did not run (locvit prepare failed: no scikit-learn); "
                     "--allow-skipped demo_training accepts that"]
    assert gpu_check.problems({**payload, "allowed": {"skipped": ["demo_training"]}}) == []
    # --allow-no-ffcv does not cover a section that skipped for another reason
    assert gpu_check.problems({**payload, "allowed": {"no_ffcv": True}}) == found


def _fake_libstdcxx(folder: Path, newest: str) -> Path:
    lib = folder / "libstdc++.so.6"
    lib.write_bytes(b"\x7fELF\0" + b"\0".join(f"GLIBCXX_3.4.{n}".encode() for n in range(20, int(newest) + 1)))
    return lib


# Each piece of the node missing or too old in turn: (piece, how the node stand-in lacks it, what the message says)
NODE_LACKS = {
    "compiler": (lambda mp, tmp: (mp.setenv("PATH", str(tmp)), mp.delenv("CC", raising=False)), "install gcc"),
    "python-headers": (lambda mp, tmp: mp.setattr(gpu_check.sysconfig, "get_paths", lambda: {"include": str(tmp)}),
                       "development headers"),
    "glibc": (lambda mp, tmp: mp.setattr(gpu_check.os, "confstr", lambda name: "glibc 2.31"),
              "glibc 2.31; the wheelhouse's ffcv and its libraries need glibc >= 2.34"),
    "libstdcxx": (lambda mp, tmp: mp.setattr(gpu_check, "libstdcxx_path",
                                             lambda: (str(_fake_libstdcxx(tmp, "29")), "the test's")),
                  "GLIBCXX_3.4.29 at most; the wheelhouse's libraries need GLIBCXX_3.4.30 (gcc 12's): install gcc 12's"),
    "timm": (lambda mp, tmp: mp.setitem(sys.modules, "timm", SimpleNamespace(__version__="0.9.16")),
             "timm 0.9.16; locvit pins timm==1.0.31 (pyproject.toml): install it"),
}


@pytest.mark.e2e  # node_report probes the compiler (cc --version)
@pytest.mark.parametrize("piece", list(NODE_LACKS))
def test_a_node_without_a_piece_stops_before_any_section(piece, tmp_path, monkeypatch):
    assert set(NODE_LACKS) == set(gpu_check.NODE_PIECES)
    ran = []
    monkeypatch.setattr(gpu_check, "run_check", lambda *a, **k: ran.append(k) or {"problems": [], "path": "gpu.json"})
    argv = ["--device", "cpu", "--quick", "--results-dir", str(tmp_path)]
    assert gpu_check.node_report()["missing"] == {}  # this machine has every piece
    lack, says = NODE_LACKS[piece]
    lack(monkeypatch, tmp_path)
    assert list(gpu_check.node_report()["missing"]) == [piece]
    with pytest.raises(SystemExit) as stop:
        gpu_check.main(argv)
    message = str(stop.value.code)
    assert "no section ran" in message and f"  {piece}: " in message and says in message, message
    assert f"--allow-missing {piece}" in message and ran == []
    gpu_check.main([*argv, "--allow-missing", piece])  # allowed by name: the sections run
    assert len(ran) == 1 and ran[0]["node"]["missing"] == {piece: ran[0]["node"]["missing"][piece]}


def test_the_allow_flags_take_known_names_only(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["--allow-skipped", "cuda_tests,nonsense"])
    assert "nonsense: not one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        gpu_check.main(["--allow-missing", "gcc"])
    assert "gcc: not one of" in capsys.readouterr().err


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
    assert set(pins) & set(node) == {"timm"}  # carried at pyproject.toml's pin over the node's own
    assert pins["timm"] == wheelhouse.pinned("timm") == "1.0.31"
    assert wheelhouse.node_needs() == {"glibc": "2.34", "glibcxx": "3.4.30", "timm": "1.0.31"}
    assert wheelhouse.node_needs({"glibc": "2.35", "glibcxx": "3.4.29"})["glibc"] == "2.35"  # raised, never lowered
    assert wheelhouse.node_needs({"glibcxx": "3.4.29"})["glibcxx"] == "3.4.30"
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
