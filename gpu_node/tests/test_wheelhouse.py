"""The GPU check's wheelhouse (gpu_node/wheelhouse.py, ``make -C gpu_node wheelhouse``) as built in this checkout.

``make test`` builds ``wheelhouse/`` first (the Makefile's ``test: install wheelhouse``), so in CI it is
there; run alone without it, these tests fail and say to run ``make -C gpu_node wheelhouse``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from packaging import tags
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / "wheelhouse"


@pytest.fixture(scope="module")
def wheelhouse():
    from gpu_node import wheelhouse as module

    if not (WHEELHOUSE / "wheelhouse.json").is_file():
        pytest.fail(
            f"{WHEELHOUSE} is not built: run make -C gpu_node wheelhouse (make test builds it before the tests)"
        )
    return module


def _node_tags(glibc: str) -> set[tags.Tag]:
    """What pip on the node (CPython 3.12, Linux x86_64, this glibc) installs."""
    major, minor = map(int, glibc.split(".")[:2])
    platforms = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 16, -1)] + [
        "manylinux2014_x86_64",
        "linux_x86_64",
    ]
    return set(tags.cpython_tags((3, 12), platforms=platforms)) | set(
        tags.compatible_tags((3, 12), "cp312", platforms=platforms)
    )


def test_the_wheelhouse_holds_a_cp312_wheel_of_everything_the_check_imports_within_64_mib(wheelhouse):
    info = json.loads((WHEELHOUSE / "wheelhouse.json").read_text())
    pins = dict(line.strip().split("==") for line in (WHEELHOUSE / "requirements.txt").read_text().splitlines())
    wanted = {**wheelhouse.requirements(), **{n: pins.get(n) for n in wheelhouse.extra_requirements()}}
    assert {"ffcv", "jsonschema", "pytest", "timm", "nvidia-ml-py"} <= set(wanted)
    assert pins == wanted == info["requirements"], "stale: run make -C gpu_node wheelhouse"
    node = _node_tags(info["node_needs"]["glibc"])
    wheels = {}
    for wheel in WHEELHOUSE.glob("*.whl"):
        name, version, _, wheel_tags = parse_wheel_filename(wheel.name)
        assert wheel_tags & node, (
            f"{wheel.name} does not install on CPython 3.12 with glibc {info['node_needs']['glibc']}"
        )
        wheels[canonicalize_name(name)] = str(version)
    assert wheels == pins  # one wheel per pin, at its version, nothing else
    # everything a GPU node is given beside the repository: the wheelhouse (its demo data included)
    carried = sum(p.stat().st_size for p in WHEELHOUSE.rglob("*") if p.is_file())
    assert carried <= wheelhouse.CARRY_LIMIT == 64 * 2**20, f"{carried / 2**20:.1f} MiB"
    assert (WHEELHOUSE / "demo-data.tar.gz").is_file() and not (WHEELHOUSE / "lib").exists()


@pytest.mark.e2e
def test_ffcvs_wheel_carries_its_libraries_and_loads_without_ld_library_path(wheelhouse, tmp_path):
    """Installed with CPython 3.12 from the wheelhouse alone, ffcv's extension finds OpenCV and libjpeg-turbo
    in the wheel (``ffcv.libs/``, through its RPATH), not on the system's paths, and loads with no
    LD_LIBRARY_PATH (ffcv loads it with ctypes, as here)."""
    python = wheelhouse.python312()
    subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--find-links",
            str(WHEELHOUSE),
            "--target",
            str(tmp_path),
            "ffcv",
        ],
        check=True,
        capture_output=True,
    )
    ext = next((tmp_path / "ffcv").glob("_libffcv*.so"))
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    ldd = subprocess.run(["ldd", str(ext)], check=True, capture_output=True, text=True, env=env).stdout
    resolved = dict(re.findall(r"^\s*(\S+) => (\S+)", ldd, flags=re.M))
    bundled = {k: v for k, v in resolved.items() if k.startswith(("libopencv", "libturbojpeg"))}
    assert {k.split("-")[0] for k in bundled} >= {"libopencv_core", "libopencv_imgproc", "libturbojpeg"}, ldd
    assert all(Path(v).resolve().parent == tmp_path / "ffcv.libs" for v in bundled.values()), ldd
    info = json.loads((WHEELHOUSE / "wheelhouse.json").read_text())
    system = {Path(v).name for k, v in resolved.items() if "ffcv.libs" not in v}
    assert set(info["system_libraries"]) <= system  # what the node must have besides, said in wheelhouse.json
    assert "not found" not in ldd
    subprocess.run([python, "-c", f"import ctypes; ctypes.CDLL({str(ext)!r})"], check=True, env=env)
