"""What the tests share besides fixtures (those, and the hooks, are in conftest.py): paths, running the
pipeline's programs, small real-format data, and the table of small model shapes.

Test files import from here (``from helpers import ...``), never from ``conftest`` or from one another
(test_imports.py checks).

Small model shapes
------------------
:data:`FAMILY_SHAPES` holds one small build per model family of locvit's registry
(:func:`locvit.models.family.families`), :data:`ENTRYPOINT_SHAPES` one per timm entrypoint locvit registers
(``@register_model`` in a ``locvit.*`` module). The tests that run every family or every entrypoint read
these two tables (test_models, test_timm_suite, test_analysis, test_host_syncs, test_autocast_dtypes), and
test_models' guard fails while a registered family or entrypoint has no entry (:func:`missing_shapes`),
so a new family is covered by adding one entry to each table it belongs in.

Which timm models need an entry: every family locvit registers, and every entrypoint a ``locvit.*`` module
registers. A timm model of timm's own that a family claims (``deit_*``, ``vit_*``, ``cait_*``: the family
declares the prefixes, :attr:`locvit.models.family.Family.models`) is covered by its family's entry. A timm
model no locvit family claims (a CNN baseline such as ``resnet50`` or ``regnety_040``) needs no entry: no
family-specific code of locvit's runs in it.
"""

from __future__ import annotations

import dataclasses
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


# Small model shapes (module docstring) ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Shape:
    """A timm model at a small size: its name, the keyword arguments that make it small (its own architecture,
    fewer layers, channels and pixels), the input's side (default: ``kwargs["img_size"]``) and, for a family's
    entry, the kinds of attention record its layers give in forward order (``AttentionMap.kind``)."""

    model: str
    kwargs: dict
    size: int | None = None
    kinds: tuple[str, ...] = ()

    def __post_init__(self):
        if self.size is None:
            if "img_size" not in self.kwargs:
                raise ValueError(f"Shape({self.model!r}): give size= where the kwargs hold no img_size")
            object.__setattr__(self, "size", self.kwargs["img_size"])

    def build(self, **kwargs):
        """The model, the caller's keywords over the shape's (``num_classes=...``, an option)."""
        import timm

        import locvit.models  # noqa: F401  registers locvit's families

        return timm.create_model(self.model, **{**self.kwargs, **kwargs})

    def but(self, **kwargs) -> Shape:
        """The same shape with some keyword arguments changed (another option of the family)."""
        return dataclasses.replace(self, kwargs={**self.kwargs, **kwargs})


#: A ViT-like model on a 4 x 4 grid of 8-pixel patches, 3 heads of 8 dimensions, 2 blocks.
VIT = dict(img_size=32, patch_size=8, embed_dim=24, depth=2, num_heads=3)
CAIT = dict(VIT, depth_token_only=1)  # 2 talking-heads layers, then 1 class-attention layer

#: family (``locvit.models.family.families()``) -> one small build of a model it claims, with the family's
#: own attention path switched on (MaiT: hard masks on heads 1, then 0 and 2; LSA: nine shifts).
FAMILY_SHAPES: dict[str, Shape] = {
    "deit": Shape("deit_tiny_patch16_224", VIT, kinds=("softmax",) * 2),
    "mait": Shape(
        "mait_tiny_patch16_224", dict(VIT, masked_heads=[1, [0, 2]], mask_type="hard"), kinds=("softmax",) * 2
    ),
    "mait_cait": Shape("mait_cait_xxs24_224", CAIT, kinds=("talking", "talking", "class")),
    "lsa": Shape(
        "lsa_tiny_cifar",
        dict(
            img_size=16, kernel_size=4, stride=4, padding=0, embed_dims=24, depths=(2, 1), num_heads=3, shifts="axes9"
        ),
        kinds=("shift", "softmax", "softmax"),
    ),
    "ibit": Shape("ibit_tiny_patch16_224", dict(VIT, mask_fit_steps=2000), kinds=("frobenius",) * 2),
    "convit": Shape(
        "convit_tiny",
        dict(img_size=32, patch_size=8, embed_dim=8, num_heads=4, depth=3, local_up_to_layer=2),
        kinds=("gpsa", "gpsa", "softmax"),
    ),
    "cait": Shape("cait_xxs24_224", CAIT, kinds=("talking", "talking", "class")),
    "nest": Shape(
        "nest_tiny_cifar",
        dict(img_size=16, num_levels=3, embed_dims=(24,) * 3, num_heads=(3,) * 3, depths=(1,) * 3),
        kinds=("block",) * 3,
    ),
    # PVT v1: one block per stage on a 32-pixel image; stages 1-3 attend to a pooled key grid, stage 4 to its own.
    "pvt_v1": Shape(
        "pvt_v1_tiny",
        dict(img_size=32, depths=(1, 1, 1, 1)),
        kinds=("pooled_keys", "pooled_keys", "pooled_keys", "softmax"),
    ),
    "localvit": Shape("localvit_tiny_patch16_224", VIT, kinds=("softmax",) * 2),
    # timm's Swin and Twins-SVT, which the swin and twins families claim: windows that divide every stage's grid.
    "swin": Shape(
        "swin_tiny_patch4_window7_224",
        dict(img_size=16, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=2),
        kinds=("block",) * 4,
    ),
    "twins": Shape(
        "twins_svt_small",
        dict(
            img_size=16,
            patch_size=2,
            embed_dims=(16, 32, 32),
            depths=(2, 2, 2),
            num_heads=(1, 2, 2),
            mlp_ratios=(2, 2, 2),
            sr_ratios=(4, 2, 1),
            wss=(4, 2, 2),
        ),
        kinds=("block", "pooled_keys", "block", "pooled_keys", "block", "softmax"),
    ),
    "wrn": Shape("wrn_16_2", dict(depth=10, widen_factor=1), size=32),  # a CNN: no attention layers
    "pyramidnet": Shape("pyramidnet164_a48", dict(depth=11, alpha=12), size=32),  # a CNN: no attention layers
}

#: An entrypoint's own widths and heads, three blocks of 8-pixel patches at 32 pixels.
DEPTH3 = dict(img_size=32, patch_size=8, depth=3)

#: timm entrypoint locvit registers -> its small build: its own widths, heads and stages, fewer blocks and pixels.
ENTRYPOINT_SHAPES: dict[str, Shape] = {
    "mait_xtiny_d24_patch16_224": Shape("mait_xtiny_d24_patch16_224", DEPTH3),
    "mait_tiny_patch16_224": Shape("mait_tiny_patch16_224", DEPTH3),
    "mait_tiny_d24_patch16_224": Shape("mait_tiny_d24_patch16_224", DEPTH3),
    "mait_tiny_d36_patch16_224": Shape("mait_tiny_d36_patch16_224", DEPTH3),
    "mait_xsmall_d24_patch16_224": Shape("mait_xsmall_d24_patch16_224", DEPTH3),
    "mait_small_patch16_224": Shape("mait_small_patch16_224", DEPTH3),
    "mait_small_d24_patch16_224": Shape("mait_small_d24_patch16_224", DEPTH3),
    "mait_cait_xxs24_224": Shape("mait_cait_xxs24_224", DEPTH3),
    "mait_cait_s24_224": Shape("mait_cait_s24_224", DEPTH3),
    "ibit_tiny_patch16_224": Shape("ibit_tiny_patch16_224", DEPTH3),
    "lsa_tiny_cifar": Shape("lsa_tiny_cifar", dict(img_size=16, depths=(1,) * 4)),
    "lsa_small_cifar": Shape("lsa_small_cifar", dict(img_size=16, depths=(1,) * 4)),
    "lsa_base_cifar": Shape("lsa_base_cifar", dict(img_size=16, depths=(1,) * 4)),
    # the ImageNet LSA's stem needs a larger input
    "lsa_tiny_224": Shape("lsa_tiny_224", dict(img_size=112, depths=(1,) * 4)),
    "lsa_small_224": Shape("lsa_small_224", dict(img_size=112, depths=(1,) * 3)),
    "nest_tiny_cifar": Shape("nest_tiny_cifar", dict(img_size=32, depths=(1,) * 4)),
    **{
        name: Shape(name, dict(img_size=32, depths=(1, 1, 1, 1)))
        for name in ("pvt_v1_tiny", "pvt_v1_small", "pvt_v1_medium", "pvt_v1_large")
    },
    "localvit_tiny_patch16_224": Shape("localvit_tiny_patch16_224", DEPTH3),
    "localvit_small_patch16_224": Shape("localvit_small_patch16_224", DEPTH3),
    "wrn_28_10": Shape("wrn_28_10", dict(depth=10, widen_factor=1), size=32),
    "wrn_16_2": Shape("wrn_16_2", dict(depth=10, widen_factor=1), size=32),
    "pyramidnet164_a48": Shape("pyramidnet164_a48", dict(depth=11, alpha=12), size=32),
}


#: timm's own models that a locvit family claims and reads (not locvit entrypoints): the timm suite runs them too.
CLAIMED_MODELS = ("swin_tiny_patch4_window7_224", "twins_svt_small")


def small(name: str, **kwargs) -> tuple:
    """(model, input side): a locvit entrypoint at its :data:`ENTRYPOINT_SHAPES` shape, or a timm baseline at
    32 x 32 (:func:`locvit.models.baselines.create_at_32`); the caller's keywords win."""
    if name in ENTRYPOINT_SHAPES:
        return ENTRYPOINT_SHAPES[name].build(**kwargs), ENTRYPOINT_SHAPES[name].size
    claimed = {shape.model: shape for shape in FAMILY_SHAPES.values() if shape.model not in ENTRYPOINT_SHAPES}
    if name in CLAIMED_MODELS:  # a timm model a locvit family claims: its family's small shape
        return claimed[name].build(**kwargs), claimed[name].size
    from locvit.models.baselines import create_at_32

    return create_at_32(name, **kwargs), 32


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


def missing_shapes(families: dict | None = None, entrypoints: list[str] | None = None) -> list[str]:
    """What :data:`FAMILY_SHAPES` and :data:`ENTRYPOINT_SHAPES` lack against the registries (default: locvit's
    families and entrypoints), and entries that no longer match them; empty when they agree."""
    from locvit.models.family import family_claiming

    families = locvit_families() if families is None else families
    entrypoints = locvit_entrypoints() if entrypoints is None else entrypoints
    problems = [
        f"family {name!r} has no small shape: add one entry to FAMILY_SHAPES in tests/helpers.py"
        for name in sorted(set(families) - set(FAMILY_SHAPES))
    ]
    problems += [
        f"entrypoint {name!r} has no small shape: add one entry to ENTRYPOINT_SHAPES in tests/helpers.py"
        for name in sorted(set(entrypoints) - set(ENTRYPOINT_SHAPES))
    ]
    problems += [
        f"FAMILY_SHAPES[{name!r}]: no such family is registered" for name in set(FAMILY_SHAPES) - set(families)
    ]
    problems += [
        f"ENTRYPOINT_SHAPES[{name!r}]: locvit registers no such entrypoint"
        for name in set(ENTRYPOINT_SHAPES) - set(entrypoints)
    ]
    for name, shape in FAMILY_SHAPES.items():
        claimed = family_claiming(shape.model)
        if name in families and (claimed is None or claimed.name != name):
            problems.append(
                f"FAMILY_SHAPES[{name!r}] builds {shape.model!r}, which family "
                f"{claimed.name if claimed else None!r} claims, not {name!r}"
            )
    problems += [
        f"ENTRYPOINT_SHAPES[{name!r}] builds {shape.model!r}"
        for name, shape in ENTRYPOINT_SHAPES.items()
        if shape.model != name
    ]
    return problems


@functools.cache
def _registered_families() -> frozenset:
    """The families registered once locvit.models is imported: taken once, before the first test (conftest's
    pytest_sessionstart), so a family a test registers for a while is not one of locvit's."""
    import locvit.models  # noqa: F401
    from locvit.models.family import families

    return frozenset(families())
