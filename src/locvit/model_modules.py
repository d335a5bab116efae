"""params' ``model_modules`` (model families outside locvit) are found on PYTHONPATH or in the working directory.

A study keeps its family beside ``params.yaml`` and its jobs run there, so the working directory goes first on
``sys.path`` only while such a module is looked up or imported. Its content is provenance like locvit's own
(``module_files``): a rule's code digest and a checkpoint's ``model_code`` hold it by name and content, never
by place.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib
import importlib.util
import os
import site
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path


@contextlib.contextmanager
def working_dir_on_path() -> Iterator[str]:
    """The working directory first on ``sys.path`` for the block; yields it."""
    cwd = os.getcwd()
    sys.path.insert(0, cwd)
    try:
        yield cwd
    finally:
        sys.path.remove(cwd)  # the first occurrence: the one inserted here


#: What ``module_digests`` gives a module that is not found.
NOT_FOUND = "missing"


def module_files(modules: Iterable[str]) -> dict[str, Path | None]:
    """The files of ``modules`` (params' ``model_modules``), wherever they are, and of the modules they import,
    transitively, that are a user's code (``user_code``: a helper beside the family), by module name,
    sorted; None for a named module that is not found.

    Found as a job imports them (the working directory first, ``working_dir_on_path``), without
    importing anything; imports are read from the source (``ast``), inside functions too.
    """
    importlib.invalidate_caches()  # a file written since the last look (a test, an editor) is seen
    files: dict[str, Path | None] = {}
    with working_dir_on_path():
        todo = list(modules)
        named, seen = set(todo), set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            path = module_file(name)
            if name not in named and (path is None or not user_code(name, path)):
                continue
            files[name] = path
            if path is not None and path.suffix == ".py" and name.split(".")[0] != "locvit":
                todo += _imports(name, path)  # a family file of locvit's: its own digests cover what it imports
    return dict(sorted(files.items()))


def module_digests(modules: Iterable[str]) -> dict[str, str]:
    """``{module: source_digest of its file}`` of ``module_files``; ``NOT_FOUND`` for a named module that is
    not found."""
    return {name: source_digest(path) if path else NOT_FOUND for name, path in module_files(modules).items()}


def source_digest(path: Path) -> str:
    """SHA-256 (16 hex digits) of what a Python file computes: its syntax tree without comments, docstrings,
    formatting or the order of a run of imports. A file that does not parse counts by its bytes.

    Written by hand: no library canonicalises a syntax tree, and ``ast.dump`` changes with Python (3.13
    leaves out empty fields), so the tree is written here field by field, empty ones left out everywhere.
    """
    stat = path.stat()
    key = (str(path), stat.st_ino, stat.st_mtime_ns, stat.st_size)  # a file parsed once per process
    if key not in _DIGESTS:
        data = path.read_bytes()
        try:
            _DIGESTS[key] = hashlib.sha256(_canonical(ast.parse(data)).encode()).hexdigest()[:16]
        except (SyntaxError, ValueError):
            _DIGESTS[key] = bytes_digest(path)
    return _DIGESTS[key]


_DIGESTS: dict[tuple, str] = {}


def bytes_digest(path: Path) -> str:
    """SHA-256 (16 hex digits) of a file's bytes: a module's digest as locvit recorded it before 29/34."""
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


_DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
_IMPORTS = (ast.Import, ast.ImportFrom)


def _canonical(node: object) -> str:
    if isinstance(node, list):
        return "[" + ",".join(_canonical(item) for item in node) + "]"
    if not isinstance(node, ast.AST):
        return repr(node)
    fields = []
    for name, value in ast.iter_fields(node):
        if value is None or value == [] or name in ("type_comment", "kind"):  # kind: a u"" prefix
            continue
        if name == "body" and isinstance(node, _DOCUMENTED) and _is_docstring(value[0]):
            value = value[1:]
        if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
            fields.append(f"{name}=[{','.join(_statements(value))}]")
        elif name == "names" and isinstance(node, _IMPORTS):
            fields.append(f"{name}={sorted(_canonical(alias) for alias in value)}")
        else:
            fields.append(f"{name}={_canonical(value)}")
    return f"{type(node).__name__}({','.join(fields)})"


def _statements(body: list) -> list[str]:
    """The statements' canonical texts, each run of consecutive imports sorted (isort's order or another)."""
    out, run = [], []
    for statement in body:
        if isinstance(statement, _IMPORTS):
            run.append(_canonical(statement))
            continue
        out += sorted(run) + [_canonical(statement)]
        run = []
    return out + sorted(run)


def _is_docstring(statement: ast.stmt) -> bool:
    return (
        isinstance(statement, ast.Expr)
        and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str)
    )


def module_file(name: str) -> Path | None:
    """The file of module ``name`` as Python would find it now, without importing it or its packages (a
    package's ``__init__.py``); None when it is not found or has no file (built in, frozen, a namespace)."""
    parts, spec, locations = name.split("."), None, None
    for i in range(1, len(parts) + 1):
        if i > 1 and not locations:
            return None  # the parent is no package
        spec = _find_spec(".".join(parts[:i]), locations)
        if spec is None:
            return None
        locations = spec.submodule_search_locations and list(spec.submodule_search_locations)
    return Path(spec.origin) if spec.has_location and spec.origin else None


def _find_spec(name: str, path: list[str] | None):
    """``sys.meta_path``'s spec of ``name``, asked afresh (``importlib.util.find_spec`` would answer from
    ``sys.modules``: the file imported earlier, not the one there now)."""
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        try:
            spec = find(name, path) if find else None
        except Exception:  # noqa: BLE001 - a finder that cannot answer (an installer's shim) has not found it
            spec = None
        if spec is not None:
            return spec
    return None


def user_code(name: str, path: Path) -> bool:
    """Whether module ``name`` at ``path`` is a user's code: not locvit (its own digests cover it), not the
    standard library's and not an installed package's (under a site-packages or dist-packages folder)."""
    if name.split(".")[0] == "locvit":
        return False
    path = path.resolve()
    return not any(path.is_relative_to(root) for root in _installed_roots(tuple(sys.path)))


@functools.cache
def _installed_roots(search_path: tuple[str, ...]) -> set[Path]:
    """This interpreter's library folders, and every folder on ``sys.path`` named site-packages or dist-packages:
    another environment's packages reached by a ``.pth`` file or PYTHONPATH (a cluster's module system), which
    would otherwise count as a user's code and be walked, all of torch with them."""
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths}
    roots |= set(getattr(site, "getsitepackages", list)())
    roots |= {getattr(site, "getusersitepackages", lambda: "")()} - {""}
    roots |= {p for p in search_path if Path(p).name in ("site-packages", "dist-packages")}
    return {Path(root).resolve() for root in roots}


def _imports(name: str, path: Path) -> list[str]:
    """The modules ``name``'s source imports, absolute, with the packages above them (Python runs their
    ``__init__`` first) and, for ``from m import x``, ``m.x`` too (x may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return []  # its content counts all the same; importing it fails, and says where
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            try:
                base = (
                    importlib.util.resolve_name("." * node.level + (node.module or ""), package)
                    if node.level
                    else node.module
                )
            except (ImportError, ValueError):
                continue  # a relative import beyond the top: it fails when run, too
            found += [base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"]
    parts = [m.split(".") for m in found if m]
    return [".".join(p[:i]) for p in parts for i in range(1, len(p) + 1)]
