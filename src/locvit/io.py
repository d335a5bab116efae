"""Small file helpers shared by every step: atomic writes and content hashes.

Every file a step produces is written to a temporary name in the same folder and
renamed into place, so a killed job never leaves a half-written output that a later
step would trust.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is left untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


#: Environment variable naming the root of locvit's caches (default ``~/.cache/locvit``).
CACHE_ENV = "LOCVIT_CACHE_DIR"


def cache_dir(name: str) -> Path:
    """``$LOCVIT_CACHE_DIR/<name>``, else ``~/.cache/locvit/<name>``: results that are safe to recompute."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "locvit") / name


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text``, atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def read_json(path: str | os.PathLike, what: str = "file", fix: str = "") -> Any:
    """Read JSON, turning a missing or corrupt file into an error that names it."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path} does not exist. {fix}".strip())
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{what} {path} is not valid JSON ({err}). {fix}".strip()) from err


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
