"""Small file helpers shared by every step: atomic writes, content hashes, and the throughput CSV's format.

Every output is written under a temporary name in its folder and renamed into place, so a killed job never
leaves a half-written file; the owning step removes leftovers when it runs again (``remove_temporaries``).
``rename_into_place`` is where the kill tests stop a process. The throughput CSV lives here, below both the
job (torch) and the report (no torch).
"""

from __future__ import annotations

import contextlib
import csv
import functools
import glob
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from io import StringIO
from pathlib import Path
from typing import Any

from locvit.errors import InputError, MissingFileError


@functools.cache
def _umask() -> int:
    """The process's umask (read once: setting it to read it is not thread-safe)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, mode: int | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success.

    On any exception the temporary file is removed and ``path`` is left untouched.
    ``mode``: the file's permissions (default: what open() would give under the umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        fd = os.open(tmp_path, os.O_RDONLY)
        try:
            os.fsync(fd)  # the bytes on disk before the name: a crash leaves the old file or the whole new one
        finally:
            os.close(fd)
        os.chmod(tmp_path, 0o666 & ~_umask() if mode is None else mode)  # mkstemp makes it 0600
        rename_into_place(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def rename_into_place(tmp: Path, path: Path) -> None:
    """The last step of an atomic write: the finished temporary file takes the final name."""
    os.replace(tmp, path)


def temporaries(path: str | os.PathLike) -> list[Path]:
    """The temporary files ``atomic_path`` has (or had, in a killed process) open for ``path``."""
    path = Path(path)
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))


def remove_temporaries(*paths: str | os.PathLike) -> list[Path]:
    """Delete what killed writers of ``paths`` left behind; the deleted files.

    Only for a step that is the only writer of those files while it runs (a Snakemake
    job owns its outputs; a training run's rank 0 owns its folder), never for files that
    other processes write concurrently.
    """
    stale = [tmp for path in paths for tmp in temporaries(path)]
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return stale


#: Environment variable naming the root of locvit's caches (default ``~/.cache/locvit``).
CACHE_ENV = "LOCVIT_CACHE_DIR"


def cache_dir(name: str) -> Path:
    """``$LOCVIT_CACHE_DIR/<name>``, else ``~/.cache/locvit/<name>``: results that are safe to recompute."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "locvit") / name


def cache_file(kind: str, key: Any, code: Iterable[Path] = ()) -> Path:
    """The file in ``cache_dir(kind)`` that remembers an answer: a hash of ``key`` (JSON) and the bytes of
    ``code``, the files that compute it (so a change to them asks again)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode())
    for path in code:
        digest.update(Path(path).read_bytes())
    return cache_dir(kind) / digest.hexdigest()


def remember(path: Path, text: str = "") -> None:
    """Write a cache file; where the cache is read-only, nothing (the answer is computed again next time)."""
    with contextlib.suppress(OSError):
        write_text(path, text)


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
        raise MissingFileError(f"{what} {path} does not exist. {fix}".strip())
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{what} {path} is not valid JSON ({err}). {fix}".strip()) from err


class JobConfig(dict):
    """A job's config (``locvit.config.jobs``) that raises, naming the key, when the job reads a key it lacks.

    A job config holds every key its job reads (a ``get`` with a default is a read too): a job that reads
    one more than its config holds is a config gone out of step with its job, an error rather than a
    silent default. Nested mappings are job configs too; the keys a job reads are recorded in ``read``.
    """

    def __init__(self, data: dict, name: str = "job config", read: set | None = None):
        super().__init__({k: JobConfig(v, f"{name}.{k}", read) if isinstance(v, dict) else v for k, v in data.items()})
        self.name, self.read = name, read if read is not None else set()

    def __getitem__(self, key):
        self.read.add(f"{self.name}.{key}")
        if not super().__contains__(key):
            raise InputError(
                f"{self.name}: no key {key!r}, which its job reads; it holds {', '.join(map(repr, self))}. "
                "Write the job configs again (locvit job-configs; Snakemake does at every start)"
            )
        return super().__getitem__(key)

    def get(self, key, default=None):
        return self[key]

    def __reduce__(self):  # pickles (a DataLoader's workers, deepcopy) as the plain dict it holds
        return dict, (dict(self),)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def verified_sha256(path: str | os.PathLike) -> str:
    """``sha256_file``, remembered per file version (``$LOCVIT_CACHE_DIR/verified``).

    A version is the file's real path, inode, size, modification and change times: any
    write, rename onto it or ``touch`` makes a new version, which is hashed again. So a
    large dataset is read in full once per version and machine (cache), not by every job.
    A corruption that changes none of these (bit rot on the disk itself after the first
    check) is not seen by a later check; ``dvc status`` re-hashes what DVC tracks.
    """
    path = Path(path)
    st = path.stat()
    version = f"{path.resolve()}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}"
    stamp = cache_dir("verified") / hashlib.sha256(version.encode()).hexdigest()
    try:
        recorded = stamp.read_text().strip()
        if len(recorded) == 64:
            return recorded
    except OSError:
        pass
    digest = sha256_file(path)
    try:
        write_text(stamp, digest + "\n")
    except OSError:  # a read-only cache only costs the next job another read
        pass
    return digest


def pack_bits(bits) -> str:
    """A sequence of booleans as text for a JSON file: numpy's packbits (8 to a byte), base64."""
    import base64

    import numpy as np

    return base64.b64encode(np.packbits(np.asarray(bits, dtype=bool)).tobytes()).decode("ascii")


def unpack_bits(text: str, n: int):
    """The ``n`` booleans ``pack_bits`` wrote (a numpy bool array); ValueError when the text cannot hold them."""
    import base64
    import binascii

    import numpy as np

    try:
        raw = np.frombuffer(base64.b64decode(text.encode("ascii"), validate=True), dtype=np.uint8)
    except (binascii.Error, UnicodeEncodeError) as err:
        raise ValueError(f"not the base64 of packed bits: {err}") from err
    if raw.size != (n + 7) // 8:
        raise ValueError(f"{raw.size} bytes of packed bits cannot hold {n} values (expected {(n + 7) // 8})")
    return np.unpackbits(raw, count=n).astype(bool)


# The throughput job's CSV (report/throughput.csv) -----------------------------------------------------

THROUGHPUT_COLUMNS = ("variant", "img_s_median", "img_s_low", "img_s_high", "ratio_vs_baseline", "rounds", "device")


def _format_float(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def write_throughput(path: str | Path, rows: list[tuple]) -> None:
    """Write the CSV atomically: one row per variant, ``(variant, median, low, high, ratio or None, rounds,
    device)`` in ``THROUGHPUT_COLUMNS``' order."""
    text = StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(THROUGHPUT_COLUMNS)
    for variant, median, low, high, ratio, rounds, device in rows:
        writer.writerow([variant, *map(_format_float, (median, low, high, ratio)), rounds, device])
    write_text(path, text.getvalue())


def read_throughput(path: str | Path) -> dict[str, dict]:
    """The throughput CSV: variant -> row; images/s and the ratio as floats (the ratio None when empty),
    ``rounds`` as int. A missing or corrupt file raises an error naming it."""
    path = Path(path)
    fix = "Delete it and run the throughput job again (snakemake --cores all all)."
    if not path.is_file():
        raise MissingFileError(f"throughput file {path} does not exist. {fix}")

    def corrupt(why: str) -> InputError:
        return InputError(f"throughput file {path} is corrupt ({why}). {fix}")

    try:
        lines = list(csv.reader(path.read_text().splitlines()))
    except (UnicodeDecodeError, csv.Error) as err:
        raise corrupt(str(err)) from err
    if not lines or tuple(lines[0]) != THROUGHPUT_COLUMNS:
        raise corrupt(f"its header is {lines[0] if lines else 'missing'}, expected {list(THROUGHPUT_COLUMNS)}")
    if len(lines) == 1:
        raise corrupt("it has no rows")
    rows = {}
    for n, line in enumerate(lines[1:], start=2):
        if len(line) != len(THROUGHPUT_COLUMNS):
            raise corrupt(f"line {n} has {len(line)} fields, expected {len(THROUGHPUT_COLUMNS)}")
        row = dict(zip(THROUGHPUT_COLUMNS, line))
        try:
            for key in THROUGHPUT_COLUMNS[1:4]:
                row[key] = float(row[key])
            row["ratio_vs_baseline"] = float(row["ratio_vs_baseline"]) if row["ratio_vs_baseline"] else None
            row["rounds"] = int(row["rounds"])
        except ValueError as err:
            raise corrupt(f"line {n}: {err}") from err
        if row["variant"] in rows:
            raise corrupt(f"line {n}: variant {row['variant']!r} appears twice")
        rows[row["variant"]] = row
    return rows
