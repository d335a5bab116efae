"""Shared fixtures: the repository root, a prepared tiny digits set, small configs."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from locvit import logs

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
logs.configure()  # locvit's messages on stdout and stderr, as the CLI sends them


@pytest.fixture(autouse=True)
def no_tracking_uri_from_another_test():
    """mlflow.set_tracking_uri sets MLFLOW_TRACKING_URI in this process, and locvit lets that variable win over
    a run's --tracking-db: without this, a test that trains in-process would log to the last test's backend."""
    before = os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    if before is not None:
        os.environ["MLFLOW_TRACKING_URI"] = before


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def tiny_params() -> dict:
    """The validated tiny preset."""
    from locvit.config import load_params

    return load_params(REPO / "presets" / "tiny.yaml")


@pytest.fixture
def raw_tiny() -> dict:
    """The tiny preset as written (unvalidated), for tests that break it."""
    return copy.deepcopy(yaml.safe_load((REPO / "presets" / "tiny.yaml").read_text()))


@pytest.fixture(scope="session")
def prepared(tmp_path_factory, tiny_params) -> dict:
    """The tiny preset's data prepared once: paths of the three splits and the manifest."""
    from locvit.data.prepare import prepare

    out = tmp_path_factory.mktemp("data")
    paths = {s: out / f"{s}.beton" for s in ("train", "val", "test")}
    manifest = prepare(tiny_params["data"], paths, out / "manifest.json")
    return {**paths, "manifest": out / "manifest.json", "manifest_data": manifest, "dir": out}


def copy_workflow(dest: Path) -> Path:
    """Copy what a user's checkout needs to run the pipeline (not results, not .venv)."""
    for name in ("Snakefile", "params.yaml", "dvc.yaml"):
        shutil.copy2(REPO / name, dest / name)
    for name in ("workflow", "profiles", "cluster", "presets", "src"):
        shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dest


FAULT_HOOKS = Path(__file__).parent / "faultinject"  # its sitecustomize installs LOCVIT_KILL_AT & co.


def env_with_venv() -> dict:
    """The environment for subprocesses: our venv's bin first on PATH (for `locvit`, `dvc`), and the
    fault-injection hooks on PYTHONPATH (inert unless a test sets LOCVIT_KILL_AT, _HOLD_AT or _NAN_AT)."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAULT_HOOKS), env.get("PYTHONPATH")]))
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("locvit-cache")


@pytest.fixture
def cache_in_tmp(session_cache, monkeypatch) -> Path:
    """locvit's cache (IBiT's mask fits, model checks) in a folder shared by this session's tests, never
    ~/.cache; use it with ``pytestmark = pytest.mark.usefixtures("cache_in_tmp")``."""
    monkeypatch.setenv("LOCVIT_CACHE_DIR", str(session_cache))
    return session_cache


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's package, driven by Playwright; nothing downloaded)."""
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's `chromium` package (apt-get install chromium) "
                    f"to check pages in a browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("playwright is missing: pip install -e '.[test]'")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


def snakemake(cwd: Path, *args: str, check: bool = True, timeout: float = 1200) -> subprocess.CompletedProcess:
    """Run the venv's snakemake in ``cwd``; with ``check``, fail with the end of its output."""
    proc = subprocess.run([str(BIN / "snakemake"), *args], cwd=cwd, env=env_with_venv(), capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def seed_runs(client, study: str) -> list:
    """The training runs of a study's experiment (not the study and variant runs above them)."""
    exp = client.get_experiment_by_name(study)
    return client.search_runs([exp.experiment_id], filter_string="tags.`locvit.role` = 'seed'")


def config_file(cfg: dict, path) -> str:
    """``cfg`` written as a job's JSON config file (what Snakemake hands a job, locvit.job_configs)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(cfg))
    return str(path)


def train_cmd(cfg: dict, prepared: dict, out_dir, db) -> list[str]:
    """`locvit train` of one run config (written beside ``out_dir``) on the prepared tiny data (one thread,
    no progress bar)."""
    run_config = config_file(cfg, Path(out_dir).with_name(f"{Path(out_dir).name}.config.json"))
    return [sys.executable, "-m", "locvit", "train", "--run-config", run_config,
            "--train-data", str(prepared["train"]), "--val-data", str(prepared["val"]),
            "--manifest", str(prepared["manifest"]), "--out-dir", str(out_dir), "--tracking-db", str(db),
            "--threads", "1", "--no-progress"]


#: A process that creates an MLflow database and SIGKILLs itself at its k-th CREATE TABLE; argv: how
#: ("setup": the tracking store through locvit, "mlflow": MLflow alone builds it in place, "auth": the
#: server's login store through locvit), the file, k.
CREATE_AND_DIE = """
import os, signal, sys
from sqlalchemy import event
from sqlalchemy.engine import Engine

created = 0

@event.listens_for(Engine, "after_cursor_execute")
def die_half_way(conn, cursor, statement, *args):
    global created
    created += statement.lstrip().upper().startswith("CREATE TABLE")
    if created == int(sys.argv[3]):
        os.kill(os.getpid(), signal.SIGKILL)

how, db = sys.argv[1:3]
if how == "setup":
    from locvit.tracking.backend import setup
    setup("study", db)
elif how == "auth":
    from pathlib import Path
    from locvit.tracking import sqlite
    sqlite.ensure(Path(db), sqlite.AUTH)
else:
    import mlflow
    mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
"""


def create_and_die(how: str, db: Path, at: int) -> None:
    """Run :data:`CREATE_AND_DIE`; it must have died at the ``at``-th table."""
    proc = subprocess.run([str(BIN / "python"), "-c", CREATE_AND_DIE, how, str(db), str(at)], env=env_with_venv(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
