"""Can this node build Triton's launchers? A C compiler and Python's headers.

Triton (behind ``torch.compile``'s inductor backend and the compiled FlexAttention of
MaiT's ``restrict_kernel``) compiles a small C launcher for each kernel the first time
it runs, with the C compiler Triton picks (``$CC``, else ``cc`` or ``gcc`` on PATH)
against ``Python.h``. Without either, a compiled run fails at its first step;
:func:`missing` says so beforehand, with what to install. Inductor on the CPU compiles
C++ with the same compiler, so ``torch.compile`` needs it on any device.

``gpu_node/gpu_check.py`` reports the same probes in its node check.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from locvit.errors import LocvitError

PIECES = ("compiler", "python-headers")


class ToolchainError(LocvitError, ValueError):
    """A compiled path was asked for on a node without the compiler or headers it builds with (a user's
    problem to fix by installing them or turning the compiled path off; ``locvit`` prints it as one line)."""


def probe_compiler() -> dict:
    """The C compiler Triton would use: ``$CC``, else ``cc`` or ``gcc`` on PATH, with its ``--version``'s first line."""
    for exe in (os.environ.get("CC"), "cc", "gcc"):
        path = shutil.which(exe) if exe else None
        if path:
            out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout
            return {"path": path, "version": (out.splitlines() or ["unknown"])[0]}
    return {"path": None, "version": None}


def probe_python_headers() -> dict:
    """Where this Python's headers should be, and whether ``Python.h`` is there."""
    include = sysconfig.get_paths()["include"]
    return {"include": include, "python_h": (Path(include) / "Python.h").is_file()}


def missing_pieces(compiler: dict | None = None, headers: dict | None = None) -> dict[str, str]:
    """Each piece (:data:`PIECES`) this node lacks, mapped to what is missing and what to install; ``{}`` when
    it can build Triton's launchers. Probes afresh (``compiler`` and ``headers``: probes already made)."""
    compiler = compiler if compiler is not None else probe_compiler()
    headers = headers if headers is not None else probe_python_headers()
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    found = {}
    if compiler["path"] is None:
        found["compiler"] = (
            "no C compiler ($CC, cc or gcc on PATH), which Triton builds torch.compile's CUDA "
            "launchers with: install gcc (apt-get install gcc, dnf install gcc, module load gcc, "
            "conda install -c conda-forge gcc) or point $CC at one"
        )
    if not headers["python_h"]:
        found["python-headers"] = (
            f"no Python.h in {headers['include']}, which Triton compiles against: install "
            f"Python {py}'s development headers (apt-get install python{py}-dev, "
            f"dnf install python{py}-devel; a conda environment's python package has them)"
        )
    return found


@functools.cache
def _missing_once() -> tuple[tuple[str, str], ...]:
    return tuple(missing_pieces().items())


def missing() -> dict[str, str]:
    """:func:`missing_pieces`, probed once per process (the node does not change under a run)."""
    return dict(_missing_once())


def describe(found: dict[str, str]) -> str:
    """One line: each missing piece and what to install."""
    return "; ".join(f"{piece}: {what}" for piece, what in found.items())


def require(what: str, way_out: str) -> None:
    """Raise :class:`ToolchainError` when this node lacks the compiler or headers, naming ``what`` needs
    them, what is missing, what to install, and ``way_out`` (how to run without)."""
    found = missing()
    if found:
        raise ToolchainError(
            f"{what} needs a C compiler and Python's headers to build its kernels, and this "
            f"node lacks them: {describe(found)}. Or {way_out}"
        )
