"""A GPU visit rehearsed on the CPU (gpu_node/visit.py, gpu_check.py, wheelhouse.py): the first visit at tiny
sizes on the node stand-in's Python (3.12 with the node's torch, no make, no venv), the wheelhouse installed with
pip --target, a planted hang cut at its group's timeout, the budgets against the deadline, what counts as a
problem, the bf16 peaks by name and the wheelhouse's list. Run by ``make -C gpu_node test``; nothing downloaded.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from gpu_node import gpu_check, visit, wheelhouse

REPO = Path(__file__).resolve().parents[2]

# What a node has under the name of this machine's packages: opencv-python's cv2 stands in
# for the node's opencv-python-headless (same module, same libraries FFCV needs).
SAME_AS_NODE = {"opencv-python"}


def _node_visible() -> set[str]:
    return set(wheelhouse.closure(wheelhouse.NODE_HAS)) | set(wheelhouse.requirements()) | {"locvit"} | SAME_AS_NODE


def _hide_others(folder: Path, also: tuple[str, ...] = ()) -> dict:
    """A sitecustomize in ``folder`` that makes every top-level module of a distribution the node
    would not have (and the modules ``also``) fail to import; the environment to run a process under it."""
    visible = _node_visible()
    hidden = sorted(
        {
            m
            for m, dists in md.packages_distributions().items()
            if not any(canonicalize_name(d) in visible for d in dists) and m.isidentifier()
        }
        | set(also)
    )
    (folder / "sitecustomize.py").write_text(
        textwrap.dedent(f"""
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
    """)
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), str(REPO / "src")]))
    return {"env": env, "hidden": hidden}


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> Path:
    """The demo's prepared splits (locvit prepare reads the digits with scikit-learn, which the node lacks:
    the wheelhouse carries them prepared)."""
    out = tmp_path_factory.mktemp("demo-data")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "locvit",
            "prepare",
            "--params",
            str(REPO / "params.yaml"),
            "--train",
            str(out / "train.beton"),
            "--val",
            str(out / "val.beton"),
            "--test",
            str(out / "test.beton"),
            "--manifest",
            str(out / "manifest.json"),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return out


def _finite_positive(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def node_python() -> str:
    """The GPU node's Python stand-in: CPython 3.12 with the node's torch and packages only (``.venv-node``, which
    ``make -C gpu_node test`` builds from gpu_node/node-packages.txt), or ``LOCVIT_NODE_PYTHON``."""
    found = os.environ.get("LOCVIT_NODE_PYTHON") or str(REPO / ".venv-node" / "bin" / "python")
    if not Path(found).is_file():
        pytest.fail(f"no node stand-in at {found}: run make -C gpu_node test (it builds .venv-node)")
    return found


def node_env(tmp_path: Path, **extra) -> dict:
    """A process environment like the node's: no make on PATH, Python's venv and ensurepip unimportable (a
    sitecustomize), nothing of this checkout's venv on PYTHONPATH."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("cc", "gcc", "git", "ldconfig", "sh", "bash"):  # what a node has; make is left out
        found = shutil.which(tool) or shutil.which(tool, path="/sbin:/usr/sbin")
        if found:
            (bin_ / tool).symlink_to(found)
    site = tmp_path / "hide"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        textwrap.dedent("""
        import importlib.machinery, sys
        class _Hide:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("venv", "ensurepip"):
                    return importlib.machinery.ModuleSpec(name, self)
            def create_module(self, spec):
                raise ModuleNotFoundError(f"No module named {spec.name!r} (not on the GPU node)", name=spec.name)
            def exec_module(self, module):
                pass
        sys.meta_path.insert(0, _Hide())
    """)
    )
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "PATH": str(bin_), "PYTHONPATH": str(site), **extra}


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


@pytest.mark.e2e
def test_the_first_visit_runs_on_the_nodes_python_without_make_or_venv_and_brings_its_files_home(tmp_path):
    """``python3 -m gpu_node.visit --device cpu --quick``: the wheelhouse installed with pip --target into the
    node stand-in's Python (3.12, the node's torch); every group in a process of its own within the deadline; at
    most 8 files, flat, under the folder named; the summary table printed last."""
    results, deadline = tmp_path / "results", 400
    proc = subprocess.run(
        [
            node_python(),
            "-m",
            "gpu_node.visit",
            "--device",
            "cpu",
            "--quick",
            "--results-dir",
            str(results),
            "--site",
            str(tmp_path / "site"),
            "--deadline-s",
            str(deadline),
        ],
        cwd=REPO,
        env=node_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=deadline + 60,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    files = _files(results)
    assert (
        [p.name for p in files]
        == sorted([f"{g}.json" for g, _ in visit.GROUPS["first-visit"]] + ["summary.md", "visit.json"])
        and len(files) <= 8
        and all(p.parent == results for p in files)
    )
    summary = (results / "summary.md").read_text()
    assert proc.stdout.endswith(summary) and len(summary.splitlines()) <= visit.SUMMARY_LINES
    r = json.loads((results / "visit.json").read_text())
    assert r["problems"] == [] and r["seconds"] < deadline and r["facts"]["make"] is None
    assert r["facts"]["python"].startswith("3.12") and r["node"]["provenance"]["torch"].startswith("2.11")
    i = r["install"]
    assert i["ok"] and i["with"] == "pip --target" and i["missing"] == {} and "ffcv" in " ".join(i["wheels"])
    assert [g for g in r["groups"]] == [g for g, _ in visit.GROUPS["first-visit"]]
    for name, g in r["groups"].items():
        assert g["ran"] and g["returncode"] == 0 and not g["timed_out"] and g["seconds"] <= g["timeout_s"], name
    groups = {g: json.loads((results / f"{g}.json").read_text()) for g in r["groups"]}
    for found in groups.values():  # every figure says where it came from, and from which commit
        assert found["errors"] == {} and found["commit"] == r["facts"]["commit"]
        for name in found["sections_run"]:
            assert {"gpu", "cuda", "torch"} <= set(found[name]["provenance"]), name

    smoke = groups["smoke"]["smoke"]  # locvit's own step learned a fixed batch; ffcv imported
    assert smoke["ok"] and smoke["last_loss"] < 0.5 * smoke["first_loss"] and smoke["steps"] == 20
    assert smoke["ffcv"]["available"] and _finite_positive(smoke["gemm"]["tflops"])
    t = groups["tests"]["cuda_tests"]  # collected and skipped (no CUDA here): not run, allowed on the CPU
    assert t["ok"] and t["ran"] is False and t["counts"].get("skipped", 0) >= 1
    eager = groups["eager"]
    for label, row in eager["throughput"]["families"].items():
        assert "error" not in row and _finite_positive(row["images_per_s"]), label
        assert row["mfu"] is None and _finite_positive(row["mfu_of_measured_peak"]), label
    assert eager["lsa_vs_nest"]["ratio"] == pytest.approx(
        eager["lsa_vs_nest"]["lsa_tiny_images_per_s"] / eager["lsa_vs_nest"]["nest_tiny_images_per_s"]
    )
    for tokens, row in groups["flex"]["restrict_attention"]["by_patch_tokens"].items():
        assert row["flex_kernel_used"] == "flex" and row["flex_matches_dense"] and row["mask_applied"], tokens
        assert row["flex_vs_unmasked_max_abs_diff"] > 100 * row["flex_vs_dense_max_abs_diff"], tokens
    assert set(groups["mfu"]["mfu"]["families"]) == set(gpu_check.MFU_FAMILIES)


@pytest.mark.e2e
def test_a_slow_section_is_cut_at_its_groups_timeout_and_the_others_keep_their_figures(tmp_path):
    """A section planted to hang (augmentation) is cut with its process at the group's hard timeout; the figures
    its group saved before it, and the groups after it, are kept; the cut is a problem."""
    (tmp_path / "planted").mkdir()
    (tmp_path / "planted" / "slow_worker.py").write_text(
        textwrap.dedent("""
        import time
        from gpu_node import gpu_check
        gpu_check.augmentation = lambda device, s: time.sleep(3600)
        gpu_check.main()
    """)
    )
    script = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        from gpu_node import visit
        visit.BUDGETS = {{**visit.BUDGETS, "augmentation": ("first-visit", 5, "planted")}}
        groups = (("eager", ("throughput", "augmentation")), ("flex", ("restrict_attention",)))
        r = visit.visit("first-visit", Path({str(tmp_path / "results")!r}), "cpu", True, 300, visit.REPO / "wheelhouse",
                        None, groups=groups, worker="slow_worker")
        print(json.dumps(r))
    """)
    env = node_env(tmp_path)
    env["PYTHONPATH"] += os.pathsep + str(tmp_path / "planted")
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env={**env, "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    eager, flex = r["groups"]["eager"], r["groups"]["flex"]
    assert eager["timed_out"] and eager["returncode"] is None and eager["seconds"] < eager["timeout_s"] + 15
    assert eager["timeout_s"] <= 2 * visit.group_budget(("throughput", "augmentation"))
    saved = json.loads((tmp_path / "results" / "eager.json").read_text())
    assert _finite_positive(saved["throughput"]["families"]["deit_tiny"]["images_per_s"])  # kept from before
    assert saved["augmentation"]["ran"] is False and "not reached" in saved["augmentation"]["reason"]
    assert flex["returncode"] == 0 and not flex["timed_out"]  # the next group ran as planned
    assert any(p.startswith("eager: cut at its timeout") for p in r["problems"])


def test_a_visit_at_its_budgets_fits_its_deadline_and_each_timeout_leaves_the_later_groups_theirs():
    for plan in visit.GROUPS:
        assert visit.plan_seconds(plan) <= visit.DEADLINE_S, plan
        assert [s for _, sections in visit.GROUPS[plan] for s in sections] == list(visit.PLANS[plan])
    assert visit.timeout_for(100, later=200, left=500) == 200  # twice its budget where there is room
    assert visit.timeout_for(100, later=350, left=500) == 150  # what the later groups leave
    assert visit.timeout_for(100, later=450, left=500) == 100  # its own budget before the later ones' spare
    assert visit.timeout_for(100, later=450, left=60) == 60  # never past the deadline
    assert "<!-- table: budgets gpu_node/visit.py -->" in (REPO / "docs" / "gpu.md").read_text()


@pytest.mark.e2e
def test_without_pip_the_wheelhouse_is_unpacked_and_imports(tmp_path):
    """A node whose Python has no pip: each wheel unpacked (a wheel is a zip of its installed files)."""
    script = (
        "import json, sys; from pathlib import Path; from gpu_node import visit; "
        f"print(json.dumps(visit.install(visit.REPO / 'wheelhouse', Path({str(tmp_path / 'site')!r}), pip=False)))"
    )
    proc = subprocess.run(
        [node_python(), "-c", script],
        cwd=REPO,
        env=node_env(tmp_path, PYTHONPATH=str(REPO)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    assert r["ok"] and r["with"] == "zipfile" and r["missing"] == {}, r


def test_a_section_that_did_not_run_is_a_problem_unless_allowed():
    payload = {
        "errors": {},
        "sections_run": ["demo_training", "augmentation"],
        "ffcv": {"available": True},
        "demo_training": {"ran": False, "reason": "locvit prepare failed: no scikit-learn"},
        "augmentation": {"images_per_s": 1.0},
    }
    found = gpu_check.problems(payload)
    assert found == [
        "demo_training: did not run (locvit prepare failed: no scikit-learn); "
        "--allow-skipped demo_training accepts that"
    ]
    assert gpu_check.problems({**payload, "allowed": {"skipped": ["demo_training"]}}) == []
    # --allow-no-ffcv does not cover a section that skipped for another reason
    assert gpu_check.problems({**payload, "allowed": {"no_ffcv": True}}) == found


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


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA GeForce GTX 1080", None),
    ],
)
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
