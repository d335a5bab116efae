"""MLflow's SQLite databases, built and upgraded whole or not at all.

MLflow's alembic migrations commit one at a time, so a process killed while creating or upgrading a file left
one no later process could open. ``ensure`` migrates a copy under a temporary name and renames it into place
when whole; call it under the file's ``lock`` (the only writer of the temporary names). A file left half-built
by another tool gets an error saying what to do, by whether it holds work. Upgrading MLflow while an older
MLflow's jobs still write the file is not supported (their later writes miss the upgraded copy).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Words of SQLite's answer to a migration re-run on a database where it was cut short.
HALF_BUILT = ("already exists", "duplicate column")


@dataclass(frozen=True)
class Schema:
    """One kind of MLflow SQLite database."""

    what: str  # "MLflow tracking database", for messages
    version_table: str  # where alembic records a file's schema revision
    head: Callable[[], str]  # this MLflow's revision
    build: Callable[[str], None]  # create or upgrade the schema at a URI to head, in place
    work: str  # the table whose rows a file must not lose ("runs", "users")


def _tracking_head() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def _build_tracking(uri: str) -> None:
    import mlflow
    from mlflow.db import upgrade  # `mlflow db upgrade`: creates an empty database, upgrades an older one

    upgrade.callback(uri)
    mlflow.MlflowClient(tracking_uri=uri)  # and the store's own set-up (its Default experiment)


def _auth_head() -> str:
    from alembic.script import ScriptDirectory
    from mlflow.server.auth.db.utils import _get_alembic_config

    return ScriptDirectory.from_config(_get_alembic_config("")).get_current_head()


def _build_auth(uri: str) -> None:
    from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

    SqlAlchemyStore().init_db(uri)  # migrates to head, as the server's basic-auth app does on start


TRACKING = Schema("MLflow tracking database", "alembic_version", _tracking_head, _build_tracking, "runs")
AUTH = Schema("MLflow basic-auth database", "alembic_version_auth", _auth_head, _build_auth, "users")


def lock(path: Path):
    """The file lock beside a SQLite database (``<file>.lock``) under which ``ensure`` runs."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(f"{path}.lock")


def _query(path: Path, sql: str):
    """The first row of a read-only query on ``path``, or None when a table it names is missing."""
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as con:
        try:
            return con.execute(sql).fetchone()
        except sqlite3.OperationalError:
            return None


def revision(path: Path, schema: Schema) -> str | None:
    """The schema revision recorded in ``path``, None when it records none."""
    row = _query(path, f"SELECT version_num FROM {schema.version_table}")
    return row[0] if row else None


def head(schema: Schema) -> str:
    """This MLflow's revision of ``schema``, remembered per MLflow version: alembic reads every migration
    script to find it, a third of a second in each process that logs."""
    from importlib.metadata import PackageNotFoundError, version

    from locvit.io import cache_file, remember

    try:
        stamp = cache_file("mlflow-heads", [schema.what, version("mlflow")])
    except PackageNotFoundError:  # MLflow installed under another distribution's name: asked every time
        return schema.head()
    if stamp.is_file() and (known := stamp.read_text().strip()):
        return known
    found = schema.head()
    remember(stamp, found)
    return found


def ensure(path: Path, schema: Schema = TRACKING) -> None:
    """Bring the SQLite file ``path`` to this MLflow's ``schema``, whole or not at all (module doc).

    A missing file is built, an older one upgraded, each under a temporary name; a file at
    head is left as it is. Raises RuntimeError, naming the file, for one whose migrations
    were cut short in place.
    """
    from locvit.io import atomic_path, remove_temporaries

    if path.exists() and revision(path, schema) == head(schema):
        return
    for stale in remove_temporaries(path):  # a killed build's copy (we hold the lock: nobody else writes them)
        Path(f"{stale}-journal").unlink(missing_ok=True)  # and SQLite's journal of it
    try:
        with atomic_path(path) as tmp:
            if path.exists():
                with (
                    contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as src,
                    contextlib.closing(sqlite3.connect(tmp)) as dst,
                ):
                    src.backup(dst)
            schema.build(f"sqlite:///{tmp}")
    except Exception as err:
        if path.exists() and "can't locate revision" in str(err).lower():
            raise RuntimeError(
                f"{path} was written by a newer MLflow than this one (its {schema.what} is at schema "
                f"revision {revision(path, schema)}, unknown here): install that MLflow in this "
                f"environment"
            ) from err
        if not (path.exists() and any(s in str(err).lower() for s in HALF_BUILT)):
            raise
        raise RuntimeError(half_built(path, schema, err)) from err


def half_built(path: Path, schema: Schema, err: BaseException) -> str:
    """What to do about a file whose migrations were cut short in place (by another tool)."""
    rows = _query(path, f"SELECT count(*) FROM {schema.work}")
    held = rows[0] if rows else 0
    reason = f"upgrading it fails with: {str(err).splitlines()[0]}"
    if not held:
        return (
            f"{path} is a half-built {schema.what} (a process was killed while MLflow built its tables in "
            f"place; {reason}). It holds no {schema.work}: delete it and run the step again, which builds it "
            f"whole"
        )
    return (
        f"{path} is an {schema.what} whose upgrade to this MLflow's schema was cut short in place (a process "
        f"was killed while MLflow migrated it; {reason}). It holds {schema.work} ({held}), so do not delete it: "
        f"restore it from a backup (or reinstall the MLflow that wrote it, revision {revision(path, schema)}), "
        f"then run the step again, which upgrades a copy and renames it into place when whole"
    )
