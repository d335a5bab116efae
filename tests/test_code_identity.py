"""A job's code is what the code its variant runs computes (locvit.versioning.job_code, 29/34).

A module counts by its syntax tree (``locvit.model_modules.source_digest``): a comment, a docstring, a
reformat or a reordered run of imports changes no digest; a constant, an operator or a default does. A job
counts its own variant's family and no other. End to end on a finished study (a package edited in a copy,
``snakemake -n``): tests/test_pipeline.py's upgrade test; a user's family: tests/test_family_plugin.py.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from locvit.config import load_params
from locvit.model_modules import source_digest
from locvit.versioning import PACKAGE, job_code

REPO = Path(__file__).resolve().parents[1]

SOURCE = '''"""A module."""

import os
import math
from pathlib import Path, PurePath


def scale(x, factor=2):
    """Scale x."""
    return x * factor + math.pi  # the offset
'''

#: Edits that change nothing a module computes.
SAME = {
    "a comment": ("    return x", "    # why: see the paper\n    return x"),
    "a docstring": ('"""Scale x."""', '"""Scale x by a factor (the pipeline\'s default: two)."""'),
    "no docstring": ('    """Scale x."""\n', ""),
    "the module's docstring": ('"""A module."""', '"""A module, described at length."""'),
    "reordered imports": ("import os\nimport math\n", "import math\nimport os\n"),
    "reordered names": ("Path, PurePath", "PurePath, Path"),
    "formatting": ("x * factor + math.pi", "(x*factor\n            + math.pi)"),
    "quotes": ('"""Scale x."""', "'''Scale x.'''"),
}
#: Edits that change what it computes.
OTHER = {
    "a constant": ("math.pi", "math.e"),
    "an operator": ("x * factor", "x ** factor"),
    "a default": ("factor=2", "factor=3"),
    "an import": ("import os\n", "import os.path\n"),
}


@pytest.mark.parametrize("edit", list(SAME) + list(OTHER))
def test_a_modules_digest_follows_what_it_computes(tmp_path, edit):
    path = tmp_path / "module.py"
    path.write_text(SOURCE)
    before = source_digest(path)
    old, new = {**SAME, **OTHER}[edit]
    assert old in SOURCE
    path.write_text(SOURCE.replace(old, new))
    compile(path.read_text(), str(path), "exec")  # still Python
    assert (source_digest(path) == before) == (edit in SAME)


def test_a_file_that_does_not_parse_counts_by_its_bytes(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("def f(:\n")
    before = source_digest(path)
    path.write_text("def f(:  # a comment\n")
    assert source_digest(path) != before


@pytest.fixture
def copy(tmp_path) -> Path:
    """A copy of locvit's package whose files a test edits."""
    return shutil.copytree(PACKAGE, tmp_path / "locvit", ignore=shutil.ignore_patterns("__pycache__"))


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


JOBS = [("prepare", None), ("report", None), ("throughput", None)] + [
    (c, v) for c in ("train", "evaluate", "analyse") for v in ("deit", "mait_sch1", "convit", "lsa")
]


def codes(params: dict, package: Path) -> dict:
    return {(c, v): job_code(params, c, None if v is None else [v], package=package) for c, v in JOBS}


def changed(params: dict, package: Path, before: dict) -> set:
    return {job for job, code in codes(params, package).items() if code != before[job]}


def test_a_job_counts_the_family_its_variant_runs_and_no_other(copy):
    """On the demo's study: an edit to Swin (no variant of the demo's) re-runs nothing; one to MaiT its
    variants' jobs and the throughput job (it measures every variant); one to the report the report alone; a
    comment in io.py (imported by every job) nothing."""
    params = load_params(REPO / "params.yaml", check_models=False)
    before = codes(params, copy)
    assert before == codes(params, PACKAGE)  # the same source elsewhere: the same code
    edit(copy / "io.py", "\n\n", "\n\n# a comment that changes nothing\n")
    edit(copy / "models" / "mait.py", '"""', '"""A docstring changed: ')
    assert changed(params, copy, before) == set()
    edit(copy / "models" / "swin.py", "def ", "UNUSED = 1\n\n\ndef ")
    assert changed(params, copy, before) == set()
    edit(copy / "models" / "mait.py", "def ", "SCALE = 2\n\n\ndef ")
    assert changed(params, copy, before) == {
        *((c, "mait_sch1") for c in ("train", "evaluate", "analyse")),
        ("throughput", None),
    }
    before = codes(params, copy)
    edit(copy / "report" / "plots.py", "def ", "DPI = 100\n\n\ndef ")
    assert changed(params, copy, before) == {("report", None)}
    edit(copy / "data" / "ffcv_io.py", "def ", "CHUNK = 1\n\n\ndef ")  # the data path: read by every job of data
    assert ("prepare", None) in changed(params, copy, before)


@pytest.mark.e2e
def test_ruff_format_changes_no_digest(copy):
    """The project's own formatter, run on every module of a copy with a shorter line length (it rewraps)."""
    before = {path.relative_to(copy): source_digest(path) for path in copy.rglob("*.py")}
    subprocess.run([sys.executable, "-m", "ruff", "format", "--quiet", "--line-length", "60", str(copy)], check=True)
    assert any(path.read_text() != (PACKAGE / name).read_text() for name, path in ((p, copy / p) for p in before))
    assert {path.relative_to(copy): source_digest(path) for path in copy.rglob("*.py")} == before


DRY_RUN = """\
rule train:
    input: results/st/config/train/mait_b/seed0.json
    output: results/st/runs/mait_b/seed0/best.pt
    jobid: 3
    reason: Params have changed since last execution: Union of exclusive params before and now across all output: \
before: '05e3dcf8 locvit.models.mait=d11230bc' now: '05e3dcf8 locvit.models.mait=aaaa0000'
    wildcards: variant=mait_b
    resources: tmpdir=/tmp

rule throughput:
    jobid: 5
    reason: Params have changed since last execution: Union of exclusive params before and now across all output: \
before: '1111 locvit.models.mait=d1' now: '2222 locvit.models.mait=d1'

checkpoint search_spec:
    jobid: 6
    reason: Missing output files: results/st/search/round0/spec.json
    wildcards: round=0

rule evaluate_10seeds:
    jobid: 4
    reason: Input files updated by another job: results/st/runs/mait_b/seed0/best.pt
    wildcards: variant=mait_b

rule all:
    jobid: 0
    reason: Input files updated by another job: results/st/report/results.md
"""


def test_status_reads_each_job_of_a_dry_run_and_names_what_changed():
    from locvit.status import SHARED, planned_jobs, why

    jobs = planned_jobs(DRY_RUN)
    assert [(j.name, j.cost_class) for j in jobs] == [
        ("train mait_b", "train"),
        ("throughput", "report"),
        ("search_spec", "report"),
        ("evaluate_10seeds mait_b", "evaluate"),
    ]
    assert [why(j) for j in jobs] == [
        "code: locvit.models.mait",
        f"code: {SHARED}",
        "not run yet",
        "an input it reads re-runs",
    ]
