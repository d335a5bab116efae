"""locvit installed as a package, not from this checkout: the wheel holds every file the package reads.

The wheel is built from a copy of the project (pyproject.toml, README.md, src/), installed with
``pip install --no-deps`` into a fresh virtual environment that sees the project environment's
site-packages through a ``.pth`` file (a plain path line: Python adds the folder without running its
own ``.pth`` files, so the editable install of the checkout stays hidden), and run from a folder outside
the checkout with PYTHONPATH unset: ``locvit validate`` of the tiny preset and one epoch of ``locvit
train``. Nothing is installed into the project environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.e2e


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "MLFLOW_TRACKING_URI")}
    return {**env, "PYTHONNOUSERSITE": "1"}


def _run(cmd: list, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv with locvit's wheel installed (and the project venv's packages visible)."""
    tmp = tmp_path_factory.mktemp("install")
    project = tmp / "project"  # a copy: building in place would leave build/ and *.egg-info in the checkout
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, project / name)
    shutil.copytree(REPO / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            tmp / "dist",
            "./project",
        ],
        tmp,
    )
    wheel = next((tmp / "dist").glob("locvit-*.whl"))
    assert "locvit/config/params.schema.yaml" in zipfile.ZipFile(wheel).namelist()

    venv = tmp / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp)
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp).stdout.strip())
    (site / "project_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # pip from the project venv, through the .pth; --ignore-installed: never touch the project's editable locvit
    _run([python, "-m", "pip", "install", "--no-deps", "--ignore-installed", "--no-index", wheel], tmp)
    return python


def test_the_installed_package_is_the_wheel_not_the_checkout(installed, tmp_path):
    out = _run(
        [installed, "-c", "import locvit, locvit.config as c; print(locvit.__file__); print(c.SCHEMA)"], tmp_path
    ).stdout.split()
    site = installed.parents[1] / "lib"
    assert all(Path(p).is_relative_to(site) for p in out), out  # the venv's copy, schema included
    assert not any(str(REPO) in p for p in out)


def test_validate_and_train_one_epoch_from_outside_the_checkout(installed, tmp_path, prepared, tiny_params):
    from locvit.config.run import run_config

    work = tmp_path / "elsewhere"
    work.mkdir()
    shutil.copy(REPO / "presets" / "tiny.yaml", work / "study.yaml")
    locvit = installed.parent / "locvit"
    proc = _run([locvit, "validate", "--params", "study.yaml"], work)
    assert "study.yaml: valid; study 'tiny'" in proc.stdout

    cfg = run_config(tiny_params, "deit_a", 0)
    cfg["train"] = {**cfg["train"], "epochs": 1}
    (work / "run.json").write_text(json.dumps(cfg))
    _run(
        [
            locvit,
            "train",
            "--run-config",
            "run.json",
            "--train-data",
            prepared["train"],
            "--val-data",
            prepared["val"],
            "--manifest",
            prepared["manifest"],
            "--out-dir",
            "run",
            "--tracking-db",
            "mlflow.db",
            "--threads",
            "1",
            "--no-progress",
        ],
        work,
    )
    metrics = json.loads((work / "run" / "metrics.json").read_text())
    assert len(metrics["history"]) == 1 and (work / "run" / "best.pt").is_file()


def _checkout(root: Path, locvit_src: Path, scripts_python: Path) -> Path:
    """A checkout at ``root`` (the Makefile and what its install stamp depends on) whose installed .venv finds
    locvit in ``locvit_src`` (as an editable install's path file does) and whose scripts run ``scripts_python``."""
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, root / name)
    (root / "src" / "locvit").mkdir(parents=True)
    (root / "src" / "locvit" / "__init__.py").write_text("")
    venv = root / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(
        subprocess.check_output(
            [venv / "bin" / "python", "-c", "import site; print(site.getsitepackages()[0])"], text=True
        ).strip()
    )
    (site / "__editable__.locvit.pth").write_text(f"{locvit_src}\n")
    (venv / "bin" / "locvit").write_text(f"#!{scripts_python}\n")
    (venv / ".locvit-installed").touch()  # installed after its inputs: nothing to redo
    return root


def test_make_install_refuses_a_venv_made_for_another_checkout(tmp_path):
    """A checkout copied with its .venv runs the original's code (the editable install and the scripts' interpreter
    point there): make install, which every make target runs first, names what points where and stops."""
    here = tmp_path / "here"
    here.mkdir()
    _checkout(here, here / "src", here / ".venv" / "bin" / "python")
    _run(["make", "--no-print-directory", "install"], here)  # its own: nothing to say
    moved = tmp_path / "moved"
    moved.mkdir()
    _checkout(moved, REPO / "src", REPO / ".venv" / "bin" / "python")
    proc = subprocess.run(
        ["make", "--no-print-directory", "demo"], cwd=moved, env=_env(), capture_output=True, text=True
    )
    assert proc.returncode != 0
    assert (
        f"make: .venv was made for another checkout (its locvit is {(REPO / 'src' / 'locvit').resolve()}; its scripts "
        f"run {REPO / '.venv' / 'bin' / 'python'}), not {moved}; run: rm -rf .venv && make install"
    ) in proc.stderr
