"""DVC: `dvc repro train@<variant>` in a git repository, push to a local-path remote, pull back.

As the README says: the remote is added to the repository's DVC config and committed
with dvc.lock; a fresh `git clone` then runs `dvc pull`, `dvc status` (DVC's hashes say
the study is consistent) and `snakemake --touch all`, after which `snakemake -n all`
finds nothing to re-run. The touch is needed: DVC restores files with new mtimes in no
particular order, and Snakemake >= 9.18 re-runs a job whose input is newer than its
output and has no recorded checksum (none in a fresh clone) whatever the rerun-triggers
say (snakemake issues #2328, #4134).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import BIN, copy_workflow, env_with_venv
from locvit.layout import StudyLayout

pytestmark = pytest.mark.e2e
RESULTS_DIR = "studies"
STUDY = StudyLayout(Path(RESULTS_DIR) / "tiny")


def run(cwd: Path, *cmd: str) -> str:
    proc = subprocess.run(list(cmd), cwd=cwd, env=env_with_venv(), capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory, repo) -> Path:
    """A git repository holding the workflow, with a one-variant, one-seed study as params.yaml."""
    work = copy_workflow(tmp_path_factory.mktemp("dvcrepo"))
    (work / ".gitignore").write_text((repo / ".gitignore").read_text() + f"/{RESULTS_DIR}/\n")
    params = yaml.safe_load((work / "presets" / "tiny.yaml").read_text())
    params["seeds"] = [0]
    params["results_dir"] = RESULTS_DIR  # not the default: dvc.yaml must follow it
    del params["variants"]["deit_a"]
    del params["mask_search"]  # a Snakemake-only part of the DAG (checkpoints); DVC has no stage for it
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(work, "git", "init", "-q")
    run(work, str(BIN / "dvc"), "init", "-q")
    remote = tmp_path_factory.mktemp("dvcremote")
    run(work, str(BIN / "dvc"), "remote", "add", "-d", "store", str(remote))
    return work


def commit(cwd: Path, message: str) -> None:
    run(cwd, "git", "add", "-A")
    run(cwd, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)


def test_repro_one_stage_push_remove_pull(repo_copy):
    dvc = str(BIN / "dvc")
    out = run(repo_copy, dvc, "repro", "train@mait_b")
    assert "Running stage 'prepare'" in out and "Running stage 'train@mait_b'" in out
    best = repo_copy / STUDY.run_dir("mait_b", 0) / "best.pt"
    digest = sha(best)
    lock = yaml.safe_load((repo_copy / "dvc.lock").read_text())
    assert {"prepare", "train@mait_b"} <= set(lock["stages"])

    run(repo_copy, dvc, "repro")  # evaluate@mait_b, analyse@mait_b and report
    metrics = json.loads(run(repo_copy, dvc, "metrics", "show", "--json").splitlines()[0])
    files = metrics[""]["data"]
    assert "test_top1" in files[str(STUDY.eval_file("mait_b", 0))]["data"]
    assert files[str(STUDY.profile_file("mait_b"))]["data"]["gmacs"] > 0
    assert "test_top1_mean" in json.dumps(files[str(STUDY.report / "summary.json")])
    plots = json.loads(run(repo_copy, dvc, "plots", "show", "--json").splitlines()[0])  # (stderr follows)
    assert "errors" not in plots and "als_mait_b.png" in json.dumps(plots)
    run(repo_copy, dvc, "push", "-q")
    commit(repo_copy, "study: dvc.lock")

    clone = repo_copy.parent / "clone"
    run(repo_copy.parent, "git", "clone", "-q", str(repo_copy), str(clone))
    assert not (clone / RESULTS_DIR).exists()
    run(clone, dvc, "pull", "-q")
    pulled = clone / STUDY.run_dir("mait_b", 0) / "best.pt"
    assert sha(pulled) == digest  # the checkpoint came back from the remote
    assert "up to date" in run(clone, dvc, "status")
    summary = json.loads((clone / STUDY.report / "summary.json").read_text())
    assert summary["mait_b"]["seeds"] == 1
    run(clone, str(BIN / "snakemake"), "--touch", "--cores", "1", "all")
    out = run(clone, str(BIN / "snakemake"), "-n", "all")
    assert "Nothing to be done" in out, out[-3000:]
    assert sha(pulled) == digest  # touching changed no content
