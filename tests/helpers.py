"""What the tests share besides fixtures (those, and the hooks, are in conftest.py): paths, running the
pipeline's programs, small real-format data, and locvit's own families and entrypoints.

Test files import from here (``from helpers import ...``), never from ``conftest`` or from one another
(test_imports.py checks).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
#: Each lane's test counts and wall time as `make test` last ran it (conftest's --record-lane), where git ignores it.
DURATIONS = REPO / "test-artifacts" / "durations.json"
#: The bad-config corpus (test_bad_configs.py refuses each; docs/pipeline.md says how many).
BAD_CONFIGS = sorted((Path(__file__).parent / "bad_configs").glob("*.yaml"))


#: Families written outside locvit, copied beside a study's params (tests/plugins).
PLUGINS = Path(__file__).parent / "plugins"
_SHAPE = {"patch_size": 4, "embed_dim": 32, "depth": 2, "num_heads": 2}
#: The variants of conftest's ``plugin_study``: models no test preset uses, and the two plugin families.
PLUGIN_VARIANTS = {
    "deit_a": {"model": "deit_tiny_patch16_224", "kwargs": _SHAPE},
    "resnet": {"model": "resnet18", "kwargs": {"layers": [1, 1, 1, 1], "channels": [8, 16, 32, 64], "stem_width": 8}},
    # 16 px in 4-px patches: a 4 x 4 grid, then 2 x 2; windows of 2 divide both.
    "swin": {
        "model": "swin_tiny_patch4_window7_224",
        "kwargs": {"embed_dim": 16, "depths": [2, 2], "num_heads": [1, 2], "window_size": 2},
    },
    "linear": {"model": "linear_vit", "kwargs": _SHAPE},
    "wrn": {"model": "wrn_16_2", "kwargs": {}},  # WRN-16-2, locvit's CIFAR wide ResNet at its smallest size
    # PVT v1 in 2-px patches: stages of 8, 4, 2, 1 patches, keys pooled by 8, 4, 2 to one cell, then global
    "pvt": {
        "model": "pvt_v1_tiny",
        "kwargs": {"patch_size": 2, "embed_dims": [16, 32, 32, 32], "depths": [1, 1, 1, 1], "num_heads": [1, 2, 2, 2]},
    },
    "toy": {"model": "toy_window_vit", "kwargs": _SHAPE},
}


# Running the pipeline's programs ---------------------------------------------------------------------------


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


def snakemake(cwd: Path, *args: str, check: bool = True, timeout: float = 1200) -> subprocess.CompletedProcess:
    """Run the venv's snakemake in ``cwd``; with ``check``, fail with the end of its output."""
    proc = subprocess.run(
        [str(BIN / "snakemake"), *args], cwd=cwd, env=env_with_venv(), capture_output=True, text=True, timeout=timeout
    )
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
    """``cfg`` written as a job's JSON config file (what Snakemake hands a job, locvit.config.jobs)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(cfg))
    return str(path)


def train_cmd(cfg: dict, prepared: dict, out_dir, db) -> list[str]:
    """`locvit train` of one run config (written beside ``out_dir``) on the prepared tiny data (one thread,
    no progress bar)."""
    run_config = config_file(cfg, Path(out_dir).with_name(f"{Path(out_dir).name}.config.json"))
    return [
        sys.executable,
        "-m",
        "locvit",
        "train",
        "--run-config",
        run_config,
        "--train-data",
        str(prepared["train"]),
        "--val-data",
        str(prepared["val"]),
        "--manifest",
        str(prepared["manifest"]),
        "--out-dir",
        str(out_dir),
        "--tracking-db",
        str(db),
        "--threads",
        "1",
        "--no-progress",
    ]


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
    proc = subprocess.run(
        [str(BIN / "python"), "-c", CREATE_AND_DIE, how, str(db), str(at)],
        env=env_with_venv(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


# The MLflow UI's browser ----------------------------------------------------------------------------------

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


# Small data in the real formats ---------------------------------------------------------------------------


def cifar10_batches(per_batch: int = 20, test: int = 30, seed: int = 0) -> dict[str, bytes]:
    """A CIFAR-10 python release in miniature: file name -> pickled bytes, in the real format."""
    rng = np.random.default_rng(seed)
    files = {}
    for name, n in ({f"data_batch_{i}": per_batch for i in range(1, 6)} | {"test_batch": test}).items():
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)  # rows: R plane, G plane, B plane
        files[name] = pickle.dumps({b"data": data, b"labels": [i % 10 for i in range(n)]})
    files["batches.meta"] = pickle.dumps({b"label_names": [f"c{i}".encode() for i in range(10)]})
    return files


def cifar10_archive(root, **kwargs):
    """``root/cifar-10-python.tar.gz`` laid out as the published one; returns (path, its MD5)."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "cifar-10-python.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, blob in cifar10_batches(**kwargs).items():
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))
    return path, hashlib.md5(path.read_bytes()).hexdigest()


def fake_imagefolder(folder, classes=("cat", "dog", "eel"), per_class=(4, 2), val=True):
    """Class folders of real JPEG/PNG files of different shapes (landscape and portrait)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in zip(("train", "val") if val else ("train",), per_class):
        for name in classes:
            (folder / split / name).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, size=(12 + 8 * i, 20, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / split / name / f"{name}_{i}.{'JPEG' if i % 2 else 'png'}")
    (folder / "train" / classes[0] / "notes.txt").write_text("not an image")  # ignored
    return folder


# locvit's registry ------------------------------------------------------------------------------------------


def locvit_families() -> dict:
    """The model families locvit itself registers (a test may register one of its own for a while)."""
    import locvit.models  # noqa: F401  registers locvit's families
    from locvit.models.family import families

    return {name: f for name, f in families().items() if f.name in _registered_families()}


def locvit_entrypoints() -> list[str]:
    """The timm entrypoints a ``locvit.*`` module registers."""
    from timm.models._registry import _model_entrypoints

    import locvit.models  # noqa: F401

    return sorted(name for name, fn in _model_entrypoints.items() if fn.__module__.startswith("locvit."))


@functools.cache
def _registered_families() -> frozenset:
    """The families registered once locvit.models is imported: taken once, before the first test (conftest's
    pytest_sessionstart), so a family a test registers for a while is not one of locvit's."""
    import locvit.models  # noqa: F401
    from locvit.models.family import families

    return frozenset(families())
