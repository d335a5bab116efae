"""The suite's own rules, checked on its files and on a planted test.

* A test that starts a process carries ``e2e`` (so ``make test-fast``, ``-m "not e2e ..."``, starts none):
  conftest's hook fails a test without the marker that starts one, whether through subprocess, os.system or
  multiprocessing, and whether or not the test catches what the start raised. Shown on a planted file run by
  pytest in a process of its own, under the real conftest.
* No test file imports another test file or ``conftest`` (what tests share is in helpers.py); conftest holds
  fixtures and hooks only. Read from each file's syntax tree.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from helpers import REPO

TESTS = Path(__file__).resolve().parent
PYTHON_FILES = sorted(TESTS.glob("*.py"))
TEST_MODULES = {p.stem for p in TESTS.glob("test_*.py")}

PLANTED = """
import multiprocessing
import os
import subprocess
import sys

import pytest


def test_runs_a_program():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_catches_what_the_start_raised():
    try:
        subprocess.run(["true"])
    except BaseException:
        pass


def test_calls_os_system():
    os.system("true")


def test_starts_a_multiprocessing_process():
    process = multiprocessing.get_context("fork").Process(target=int)
    process.start()
    process.join()


def test_starts_none():
    assert sum([1, 2]) == 3


@pytest.mark.e2e
def test_marked_runs_a_program():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


@pytest.mark.e2e  # runs pytest on the planted file
def test_a_test_that_starts_a_process_without_the_e2e_marker_fails(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text(PLANTED)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO / "src"), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-c",
            str(REPO / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            f"--junitxml={tmp_path / 'junit.xml'}",
            str(planted),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    cases = {case.get("name"): case for case in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")}
    failed = {
        name: (case.find("failure").get("message", "") + (case.find("failure").text or ""))
        for name, case in cases.items()
        if case.find("failure") is not None
    }
    assert set(cases) == {
        "test_runs_a_program",
        "test_catches_what_the_start_raised",
        "test_calls_os_system",
        "test_starts_a_multiprocessing_process",
        "test_starts_none",
        "test_marked_runs_a_program",
    }, proc.stdout[-3000:]
    assert set(failed) == {
        "test_runs_a_program",
        "test_catches_what_the_start_raised",
        "test_calls_os_system",
        "test_starts_a_multiprocessing_process",
    }, proc.stdout[-3000:]
    assert proc.returncode == 1
    for name, what in (
        ("test_runs_a_program", "subprocess.Popen"),
        ("test_catches_what_the_start_raised", "subprocess.Popen ['true']"),
        ("test_calls_os_system", "os.system"),
        ("test_starts_a_multiprocessing_process", "a multiprocessing Process"),
    ):
        assert f"test_planted.py::{name} starts a process ({what}" in failed[name], failed[name]
        assert "without the e2e marker: mark it @pytest.mark.e2e" in failed[name]


def _imports(path: Path) -> set[str]:
    """The top-level module names ``path`` imports, lazily (inside a function) or not."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=path.name)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_test_file_imports_another_or_conftest():
    found = {p.name: sorted(_imports(p) & (TEST_MODULES | {"conftest"})) for p in PYTHON_FILES}
    assert {name: modules for name, modules in found.items() if modules} == {}, (
        "move what the files share into tests/helpers.py"
    )
    assert "helpers" in _imports(TESTS / "test_models.py")  # the check reads real imports


def test_the_check_sees_each_way_of_importing(tmp_path):
    for line in (
        "import test_data",
        "from conftest import REPO",
        "def f():\n    from test_models import small",
        "import conftest as c",
    ):
        (tmp_path / "x.py").write_text(line + "\n")
        assert _imports(tmp_path / "x.py") & (TEST_MODULES | {"conftest"}), line


def test_conftest_holds_fixtures_and_hooks_only():
    tree = ast.parse((TESTS / "conftest.py").read_text())
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    other = [
        f.name
        for f in functions
        if not f.name.startswith(("pytest_", "_")) and not any("fixture" in ast.unparse(d) for d in f.decorator_list)
    ]
    assert other == [], f"conftest.py defines {other}: helpers go in tests/helpers.py"
    assert not [n.name for n in tree.body if isinstance(n, ast.ClassDef)]


def _make_variable(name: str) -> str:
    line = next(line for line in (REPO / "Makefile").read_text().splitlines() if line.startswith(f"{name} :="))
    return line.split(":=", 1)[1].strip()


def test_make_tests_two_lanes_run_every_non_cluster_test_once_the_fast_lane_first():
    """make test-fast is `-m "not e2e and not cluster and not cuda"` and nothing else; make test runs it, then the
    rest: for every combination of markers, a test is in exactly one lane unless it is a cluster test (in none);
    CI runs make test first and ends with make test-cluster."""
    from _pytest.mark.expression import Expression

    fast, rest = _make_variable("FAST_LANE"), _make_variable("REST_LANE")
    assert fast == "not e2e and not cluster and not cuda"
    makefile = (REPO / "Makefile").read_text()
    fast_only = '\t$(BIN)/python -m pytest -q -m "$(FAST_LANE)" -n $(WORKERS)\n'  # test-fast: no other deselection
    assert fast_only in makefile
    test_recipe = makefile.split("\ntest: install\n")[1].split("\n\n")[0].splitlines()
    lanes = [re.search(r'-m "([^"]+)"', line).group(1) for line in test_recipe if "pytest" in line]
    assert lanes == ["$(FAST_LANE)", "$(REST_LANE)"]
    for e2e in (False, True):
        for cluster in (False, True):
            for cuda in (False, True):
                marks = {"e2e": e2e, "cluster": cluster, "cuda": cuda}
                lanes = [
                    Expression.compile(lane).evaluate(lambda name, **kw: marks.get(name, False))
                    for lane in (fast, rest)
                ]
                assert sum(lanes) == (0 if cluster else 1), (marks, lanes)
    ci = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line.startswith("make")]
    assert ci[0] == "make test" and ci[-1] == "make test-cluster"
    assert "make -C gpu_node test" in ci  # the GPU node's tools, with their wheelhouse, in a step of their own
