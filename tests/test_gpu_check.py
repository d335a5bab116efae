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


def _check(tmp_path, hide: dict, *args, timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict]:
    results = tmp_path / "results"
    results.mkdir()
    (results / "gpu.json").write_text("an older result\n")
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--results-dir", str(results), *args], cwd=REPO, env=hide["env"], capture_output=True,
                          text=True, timeout=timeout)
    assert sorted(p.name for p in results.iterdir()) == ["gpu.json"]  # replaced whole, no temporary left
    return proc, json.loads((results / "gpu.json").read_text())


@pytest.mark.e2e
def test_the_first_visit_plan_runs_on_cpu_within_its_deadline_with_only_the_node_packages(tmp_path):
    """``gpu_check.py --device cpu --quick``: the default plan (the first visit) under its default deadline (the
    plan's limit), in a process that sees only what an offline GPU node has; every section ran, each printed one
    line."""
    hide = _hide_others(tmp_path)
    assert {"mlflow", "snakemake", "dvc", "sklearn", "scipy", "pandas"} <= set(hide["hidden"])
    limit = gpu_check.PLAN_LIMITS["first-visit"]
    proc, r = _check(tmp_path, hide, "--allow-skipped", "cuda_tests")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.startswith("gpu-check: node: ")  # the node is reported before any section
    assert r["errors"] == {} and r["problems"] == [] and r["machine"]["gpu"] is None and r["device"] == "cpu"
    assert r["sections_run"] == list(gpu_check.PLANS["first-visit"]) and r["deadline_s"] == limit
    assert sum(r["section_seconds"].values()) < limit
    lines = [line for line in proc.stdout.splitlines() if re.match(r"gpu-check: \w+ \(\d+ s of \d+\): ", line)]
    assert [line.split()[1] for line in lines] == r["sections_run"], proc.stdout  # one line a section, in order
    assert r["ffcv"]["available"] is True
    assert r["node"]["missing"] == {} and r["node"]["needs"] == {"glibc": "2.35", "glibcxx": "3.4.30", "timm": "1.0.31"}
    assert r["allowed"] == {"skipped": ["cuda_tests"], "no_ffcv": False}
    for name in r["sections_run"]:  # every figure says where it came from
        assert {"gpu", "cuda", "cudnn", "triton", "torch"} <= set(r[name]["provenance"]), name
    assert r["provenance"]["torch"] == __import__("torch").__version__

    probes = r["node_probes"]
    assert probes["venv_with_ensurepip"]["ok"] and probes["make"]["path"] and probes["compiler"]["path"]
    t = r["cuda_tests"]  # the CUDA-marked tests were collected and skipped (no CUDA here): not run
    assert t["ok"] and "tests/test_augment.py" in t["files"] and t["counts"].get("skipped", 0) >= 1
    assert not t["counts"].get("passed") and t["ran"] is False and "no CUDA-marked test ran" in t["reason"]
    # without --allow-skipped cuda_tests the same result is a problem: the default is strict
    strict = gpu_check.problems({**r, "allowed": {"skipped": [], "no_ffcv": False}})
    assert len(strict) == 1 and strict[0].startswith("cuda_tests: did not run") and "--allow-skipped" in strict[0]

    for name, families in (("throughput", gpu_check.FAMILIES), ("mfu", gpu_check.MFU_FAMILIES)):
        tp = r[name]
        assert set(tp["families"]) == set(families) and tp["compile"] is False  # no compile on the CPU
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
        assert row["flex_vs_dense_max_abs_diff"] < 1e-5  # the same weights: the same attention
        for k in ("flex_ms", "dense_masked_ms", "full_fused_ms", "dense_masked_over_flex"):
            assert _finite_positive(row[k]), k
    assert _finite_positive(r["augmentation"]["images_per_s"])


@pytest.mark.e2e
def test_the_second_visit_plan_on_cpu_with_only_the_node_packages(tmp_path, demo_data):
    """The longer sections: the demo trained through locvit train (without MLflow), the feed over a synthetic file
    it writes itself (no scikit-learn on the node: locvit's FFCV writer), every image checked, and the cost of
    deterministic kernels."""
    hide = _hide_others(tmp_path)
    proc, r = _check(tmp_path, hide, "--plan", "second-visit", "--demo-data", str(demo_data))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert r["errors"] == {} and r["problems"] == [] and r["sections_run"] == list(gpu_check.PLANS["second-visit"])

    d = r["demo_training"]  # locvit train without MLflow: tracking fails, training goes on
    assert d["ran"] and d["ok"] and list(d["runs"]) == ["deit"]
    run = d["runs"]["deit"]
    assert run["tracking"] == "failed" and [h["epoch"] for h in run["history"]] == [0, 1]
    assert all(_finite_positive(h["train_images_per_s"]) and 0 <= h["val_top1"] <= 1 for h in run["history"])

    f = r["feed"]
    assert f["ran"] and f["jit"] is True and "write_beton" in f["file"] and "scikit-learn" in f["file"]
    assert f["integrity"]["ok"] and f["integrity"]["images_checked"] == f["images"] == 96
    assert f["batches_timed"] >= 12 and _finite_positive(f["loader_images_per_s"])
    assert _finite_positive(f["feed_augment_images_per_s"])

    det = r["deterministic_cost"]
    assert _finite_positive(det["slowdown"]) and set(det["step_ms"]) == {"default", "deterministic"}


def test_budgets_fit_the_visit_and_the_docs_render_them():
    """Every section has a budget in one plan; the first visit's fit 7 minutes, the second's 8 (one command of a
    visit each); benchmarks/doc_tables.py reads the table from the source without importing torch."""
    assert set(gpu_check.BUDGETS) == set(gpu_check.SECTIONS)
    assert gpu_check.PLAN_LIMITS == {"first-visit": 7 * 60, "second-visit": 8 * 60}
    for plan, limit in gpu_check.PLAN_LIMITS.items():
        assert sum(gpu_check.BUDGETS[n][1] for n in gpu_check.PLANS[plan]) <= limit, plan
    import doc_tables

    assert doc_tables.python_literals(REPO / "benchmarks" / "gpu_check.py", ("BUDGETS", "PLAN_LIMITS")) == {
        "BUDGETS": gpu_check.BUDGETS, "PLAN_LIMITS": gpu_check.PLAN_LIMITS}
    assert "<!-- table: budgets benchmarks/gpu_check.py -->" in (REPO / "docs" / "benchmarks.md").read_text()


@pytest.mark.e2e  # the check records its commit (git) and probes the node's compiler
def test_gpu_json_holds_every_section_before_and_after_each_and_the_deadline_skips_by_budget(tmp_path, monkeypatch):
    """gpu.json is on disk before the first section and rewritten after each: a command cut in the middle leaves
    every figure measured so far and names the sections it did not reach. A section whose budget is over the time
    left to the deadline is skipped and says why."""
    import torch

    monkeypatch.setattr(gpu_check.common, "RESULTS", tmp_path)
    seen, real = [], gpu_check.augmentation

    def observed(device, s):  # what a cut at this moment would leave
        seen.append(json.loads((tmp_path / "gpu.json").read_text()))
        return real(device, s)

    monkeypatch.setattr(gpu_check, "augmentation", observed)
    # augmentation fits (setting up, the imports of triton and FFCV included, may take a while on a busy CPU);
    # deterministic_cost's budget is over the deadline itself
    deadline = gpu_check.BUDGETS["augmentation"][1] + 55
    assert deadline < gpu_check.BUDGETS["deterministic_cost"][1]
    r = gpu_check.run_check(torch.device("cpu"), quick=True, sections=["augmentation", "deterministic_cost"],
                            deadline_s=deadline)
    (before,) = seen
    for name in ("augmentation", "deterministic_cost"):
        assert before[name]["ran"] is False and "not reached" in before[name]["reason"]
    assert any(p.startswith("augmentation: did not run") for p in before["problems"])
    after = json.loads((tmp_path / "gpu.json").read_text())
    assert _finite_positive(after["augmentation"]["images_per_s"]) and after["augmentation"]["provenance"]
    skipped = after["deterministic_cost"]
    assert skipped["ran"] is False and skipped["skipped_for"] == "deadline"
    assert f"under its budget of {gpu_check.BUDGETS['deterministic_cost'][1]} s" in skipped["reason"]
    assert r["problems"] == after["problems"] and len(after["problems"]) == 1
    assert after["problems"][0].startswith("deterministic_cost: did not run")


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
              "glibc 2.31; the wheelhouse's ffcv and its libraries need glibc >= 2.35"),
    "libstdcxx": (lambda mp, tmp: mp.setattr(gpu_check, "libstdcxx_path",
                                             lambda: (str(_fake_libstdcxx(tmp, "29")), "the test's")),
                  "GLIBCXX_3.4.29 at most; the wheelhouse's libraries need GLIBCXX_3.4.30 (gcc 12's): install gcc 12's"),
    "timm": (lambda mp, tmp: mp.setitem(sys.modules, "timm", SimpleNamespace(__version__="0.9.16")),
             "timm 0.9.16; locvit pins timm==1.0.31 (pyproject.toml): install it"),
}


@pytest.mark.e2e  # the check records its commit (git) and probes the node's compiler
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


@pytest.mark.e2e  # the check records its commit (git) and probes the node's compiler
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
    assert wheelhouse.node_needs() == {"glibc": "2.35", "glibcxx": "3.4.30", "timm": "1.0.31"}
    assert wheelhouse.node_needs({"glibc": "2.36", "glibcxx": "3.4.29"})["glibc"] == "2.36"  # raised, never lowered
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
