"""Fixtures and hooks only (helpers are in helpers.py): the repository root, a prepared tiny digits set, small
configs, locvit's cache in a session folder, a headless browser; and the check that a test which starts a
process carries the ``e2e`` marker."""

from __future__ import annotations

import copy
import functools
import json
import multiprocessing.process
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from helpers import CHROMIUM, CHROMIUM_ARGS, DURATIONS, REPO, locvit_families

from locvit.errors import configure_logging

configure_logging()  # locvit's messages on stdout and stderr, as the CLI sends them


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


@pytest.fixture(scope="session")
def plugin_study(tmp_path_factory):
    """One finished study (layout, params) shared by test_models and test_family_plugin: the models no preset
    trains (timm's, locvit's CNNs, PVT v1) and two families written outside locvit (tests/plugins: linear
    attention, a toy window ViT) named in ``model_modules``; one seed, one epoch, no mask search."""
    import shutil

    from helpers import PLUGIN_VARIANTS, PLUGINS, copy_workflow, snakemake

    from locvit.layout import StudyLayout

    work = copy_workflow(tmp_path_factory.mktemp("plugins"))
    for name in ("linear_family", "toy_family"):
        shutil.copy(PLUGINS / f"{name}.py", work / f"{name}.py")
    params = yaml.safe_load((work / "presets" / "tiny.yaml").read_text())
    del params["mask_search"]
    params["train"]["epochs"] = 1
    params.update(study="plugins", seeds=[0], model_modules=["linear_family", "toy_family"], variants=PLUGIN_VARIANTS)
    (work / "plugins.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    snakemake(work, "--cores", "2", "all", "--config", "params=plugins.yaml")
    return StudyLayout(work / "results" / "plugins"), params


@pytest.fixture(scope="session")
def session_cache(tmp_path_factory) -> Path:
    """One folder for the session, shared by its xdist workers (locvit's cache files are written whole, then
    renamed): a model one worker counted, another reads."""
    base = tmp_path_factory.getbasetemp()
    cache = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "locvit-cache"
    cache.mkdir(exist_ok=True)
    return cache


@pytest.fixture
def cache_in_tmp(session_cache, monkeypatch) -> Path:
    """locvit's cache (IBiT's mask fits, model checks) in a folder shared by this session's tests, never
    ~/.cache; use it with ``pytestmark = pytest.mark.usefixtures("cache_in_tmp")``."""
    monkeypatch.setenv("LOCVIT_CACHE_DIR", str(session_cache))
    return session_cache


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium (Debian's package, driven by Playwright; nothing downloaded)."""
    if not CHROMIUM.is_file():
        pytest.skip(
            f"{CHROMIUM} is missing: install Debian's `chromium` package (apt-get install chromium) "
            f"to check pages in a browser"
        )
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


# Every test that starts a process carries `e2e` --------------------------------------------------------------
# `-m "not e2e"` (make test-fast) is the lane without processes: while a test's setup, call or teardown runs,
# starting a process (subprocess.Popen and everything built on it, os.system, os.fork, a multiprocessing
# Process) from a test without the marker fails it, naming the test and what it started. A `cluster` test is
# exempt too: it runs only under make test-cluster, never in a lane of make test.
#
# Two exemptions, by what they are, not by test: library internals of an in-process call.
# * FFCV writes a file only through its DatasetWriter's worker processes (forked inside
#   `DatasetWriter.from_indexed_dataset` and joined before it returns): preparing data, the `prepared`
#   fixture's included, is an in-process call here.
# * ctypes.util.find_library runs `ldconfig -p` to find a shared library (importing torch does, and whichever
#   test imports a module first would otherwise be the one that "started" it).
E2E_EXEMPT_TARGET_MODULES = ("ffcv.writer",)
E2E_EXEMPT_CALLERS = ("ctypes.util",)
PROCESS_GUARD = pytest.StashKey[list]()
_guard = threading.local()  # .depth > 0 inside a start already checked (os.fork under a Process's start)
_running: dict = {}  # "item": the test whose setup, call or teardown is running


def _guarded(what: str, start, exempt=lambda *args, **kwargs: False):
    @functools.wraps(start)
    def guarded(*args, **kwargs):
        item = _running.get("item")
        if (
            item is not None
            and getattr(_guard, "depth", 0) == 0
            and item.get_closest_marker("e2e") is None
            and item.get_closest_marker("cluster") is None
            and not exempt(*args, **kwargs)
        ):
            command = f" {args[1]!r:.200}" if what == "subprocess.Popen" else ""  # _execute_child(self, args, ...)
            message = (
                f"{item.nodeid} starts a process ({what}{command}) without the e2e marker: mark it "
                "@pytest.mark.e2e (make test-fast runs -m 'not e2e', the tests that start no process)"
            )
            item.stash[PROCESS_GUARD].append(message)
            pytest.fail(message, pytrace=True)
        _guard.depth = getattr(_guard, "depth", 0) + 1
        try:
            return start(*args, **kwargs)
        finally:
            _guard.depth -= 1

    guarded.__wrapped__ = start
    return guarded


def _ffcv_writer(process, *args, **kwargs) -> bool:
    return getattr(getattr(process, "_target", None), "__module__", None) in E2E_EXEMPT_TARGET_MODULES


def _library_lookup(*args, **kwargs) -> bool:
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") not in E2E_EXEMPT_CALLERS:
        frame = frame.f_back
    return frame is not None


_GUARDED = [
    (subprocess.Popen, "_execute_child", "subprocess.Popen", _library_lookup),
    (multiprocessing.process.BaseProcess, "start", "a multiprocessing Process", _ffcv_writer),
    (os, "system", "os.system", None),
    (os, "fork", "os.fork", None),
]


def _share_the_cores(workers: int) -> None:
    """In each of ``workers`` xdist workers: thread pools (torch's OpenMP, numpy's BLAS; the processes a test
    starts, through OMP_NUM_THREADS) at the worker's share of the cores. At their default, one per core, the
    two workers' threads spin-wait on each other: test_presets and test_stats took 40 % more CPU, 38 % more time."""
    if not workers:
        return
    import torch
    from threadpoolctl import threadpool_limits

    share = max(1, (os.cpu_count() or 1) // workers)  # as xdist counts them for -n auto; any OS
    os.environ["OMP_NUM_THREADS"] = str(share)
    torch.set_num_threads(share)
    threadpool_limits(share)


def pytest_configure(config):
    _share_the_cores(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0")))
    for owner, attr, what, exempt in _GUARDED:
        original = getattr(owner, attr)
        setattr(owner, attr, _guarded(what, original, exempt or (lambda *a, **k: False)))


def pytest_unconfigure(config):
    for owner, attr, _, _ in _GUARDED:
        setattr(owner, attr, getattr(owner, attr).__wrapped__)


def pytest_sessionstart(session):
    """The probes a process makes once and remembers, made before the first test (as a run makes them before its
    first step), so that no test "starts" them by running first: the C toolchain (``cc --version``,
    :func:`locvit.device.missing_toolchain`), the commit a run records (``git rev-parse``, ``git status``), the
    processor's name (``uname -p``, Python's platform module, for profiles and MLflow's system tags) and GitPython's
    ``git version`` (on its import, when MLflow first reads a run's git commit). A test that probes afresh
    starts a process of its own. On a GPU node that lacks MLflow and GitPython (a GPU visit, gpu_node/visit.py, runs the
    CUDA-marked tests there) those two probes are skipped: no test there can make them either."""
    import platform

    from locvit import device

    device.missing_toolchain()
    platform.processor()
    try:
        import git  # noqa: F401  GitPython, MLflow's

        from locvit.tracking.run import git_commit
    except ImportError:
        pass
    else:
        git_commit()
    locvit_families()  # which families are locvit's, before a test registers one of its own
    session.stash[LANE_START] = time.monotonic()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[PROCESS_GUARD] = []
    _running["item"] = item
    try:
        yield
    finally:
        _running.pop("item", None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A start the test caught (or one in another thread) still fails it."""
    outcome = yield
    report = outcome.get_result()
    violations = item.stash.get(PROCESS_GUARD, [])
    if violations and report.passed and call.when == "call":
        report.outcome, report.longrepr = "failed", "\n".join(violations)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: unknown where xdist is absent (a GPU node)
def pytest_xdist_make_scheduler(config, log):
    """make test's rest lane (``--dist loadfile``): a file's tests on one worker, so a module-scoped study is built
    once, and the files that use ``plugin_study`` (a session fixture) on one worker, so it is built once too.
    (xdist's loadgroup would say it with marks, but it renames tests in a way pytest 9 no longer reads.)"""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    shared = {
        f"tests/{path.name}"
        for path in Path(__file__).parent.glob("test_*.py")
        if "plugin_study" in path.read_text(encoding="utf-8")
    }

    class SharedStudies(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return "plugin_study" if scope in shared else scope

    return SharedStudies(config, log)


# `make test` records each lane's counts and wall time -------------------------------------------------------
LANE_START = pytest.StashKey[float]()


def pytest_addoption(parser):
    parser.addoption(
        "--record-lane",
        metavar="NAME",
        default=None,
        help="write this session's test counts and wall time as lane NAME into "
        "test-artifacts/durations.json (make test; git ignores it)",
    )


def pytest_sessionfinish(session, exitstatus):
    """With ``--record-lane``: the lane's marker expression, counts, wall time, commit and machine, replacing that
    lane's entry in test-artifacts/durations.json (one current record per lane, no history)."""
    lane = session.config.getoption("record_lane")
    if not lane or LANE_START not in session.stash or hasattr(session.config, "workerinput"):  # an xdist worker
        return
    from locvit.io import write_text
    from locvit.tracking.run import git_commit

    stats = session.config.pluginmanager.get_plugin("terminalreporter").stats
    count = {
        outcome: len([r for r in stats.get(outcome, []) if getattr(r, "when", "call") in ("call", "setup")])
        for outcome in ("passed", "failed", "skipped", "error")
    }
    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            None,
        )
        if Path("/proc/cpuinfo").is_file()
        else None
    )
    data = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {"lanes": {}}
    data["lanes"][lane] = {
        "marker": session.config.getoption("markexpr"),
        "tests": len(session.items),
        **count,
        "wall_s": round(time.monotonic() - session.stash[LANE_START], 1),
        "commit": git_commit(),
        "machine": f"{cpu or _processor()}, {os.cpu_count()} cores",
        **_slowest(stats),
    }
    DURATIONS.parent.mkdir(parents=True, exist_ok=True)
    write_text(DURATIONS, json.dumps(data, indent=2) + "\n")


def _slowest(stats: dict, most: int = 20) -> dict:
    """The lane's files and tests by time spent (setup, call and teardown; a shared fixture counts where it is
    first built), slowest first: where to look for a faster suite."""
    per_test: dict[str, float] = {}
    for reports in stats.values():
        for r in reports:
            if hasattr(r, "duration") and hasattr(r, "nodeid"):
                per_test[r.nodeid] = per_test.get(r.nodeid, 0.0) + r.duration
    per_file: dict[str, float] = {}
    for nodeid, seconds in per_test.items():
        per_file[nodeid.split("::")[0]] = per_file.get(nodeid.split("::")[0], 0.0) + seconds

    def top(d: dict[str, float]) -> dict[str, float]:
        return {k: round(v, 1) for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:most]}

    return {"slowest_files_s": top(per_file), "slowest_tests_s": top(per_test)}


def _processor() -> str:
    import platform

    return platform.processor() or platform.machine()
