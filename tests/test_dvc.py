"""DVC and Snakemake keep one record (locvit.versioning), in a temporary git + DVC repository.

A one-variant, one-seed tiny study as params.yaml, with a non-default results_dir:

* a `snakemake ... all` ends with `dvc commit -f`: `dvc status` is clean and dvc.lock holds
  the hashes of the data, the checkpoints, the metrics and the report;
* `dvc metrics show` is one row per variant; after a params change `dvc repro train@<variant>`
  rewrites the jobs' config files and retrains that variant only (its stages run their Snakemake
  targets), `snakemake -n all` then plans only what depends on it, and `dvc metrics diff` shows the
  change; a change made through Snakemake lands in dvc.lock; a baseline change re-runs the report
  (and the throughput job, which reports ratios to it) under `dvc repro`, nothing else;
* `dvc plots show` renders the report's figures into one HTML page (checked in headless Chromium);
* `dvc push` to a local remote, `git clone`, `locvit pull`: `snakemake -n all` has nothing to do
  and `locvit results` prints the same table;
* `dvc exp run -S train.lr=...` runs the pipeline and `dvc exp show` lists it with its metrics;
* after push, clone and pull, a change of a training param, a data param or the baseline makes
  `snakemake -n all` plan in the clone exactly what it plans in the original checkout.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import BIN, copy_workflow, env_with_venv

from locvit.layout import StudyLayout

pytestmark = pytest.mark.e2e
RESULTS_DIR = "studies"
STUDY = StudyLayout(Path(RESULTS_DIR) / "tiny")
DVC, SNAKEMAKE, LOCVIT = str(BIN / "dvc"), str(BIN / "snakemake"), str(BIN / "locvit")


def run(cwd: Path, *cmd: str, env: dict | None = None) -> str:
    proc = subprocess.run(list(cmd), cwd=cwd, env=env or env_with_venv(), capture_output=True, text=True, timeout=1200)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout + proc.stderr


def commit(cwd: Path, message: str) -> None:
    run(cwd, "git", "add", "-A")
    run(cwd, "git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", message)


def set_lr(work: Path, lr: float) -> None:
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["variants"]["mait_b"]["train"] = {"lr": lr}
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def planned(work: Path, snakemake: tuple[str, ...] = (SNAKEMAKE,), env: dict | None = None) -> dict[str, int]:
    """`snakemake -n all`'s job counts by rule (empty when there is nothing to do)."""
    out = run(work, *snakemake, "-n", "all", env=env)
    if "Nothing to be done" in out:
        return {}
    table = out[out.index("Job stats:") :].splitlines()[3:]
    counts = dict(line.split() for line in table[: next(i for i, line in enumerate(table) if line.startswith("total"))])
    return {rule: int(n) for rule, n in counts.items() if rule != "all"}


def lock_md5(work: Path, stage: str) -> str:
    return yaml.safe_load((work / "dvc.lock").read_text())["stages"][stage]["outs"][0]["md5"]


@pytest.fixture(scope="module")
def repo_copy(tmp_path_factory, repo) -> Path:
    """A git + DVC repository holding the workflow, with a one-variant, one-seed study as params.yaml."""
    work = copy_workflow(tmp_path_factory.mktemp("dvcrepo"))
    (work / ".gitignore").write_text((repo / ".gitignore").read_text() + f"/{RESULTS_DIR}/\n")
    (work / ".dvcignore").write_text((repo / ".dvcignore").read_text())
    params = yaml.safe_load((work / "presets" / "tiny.yaml").read_text())
    params.update(seeds=[0], results_dir=RESULTS_DIR)  # not the default: dvc.yaml must follow it
    params["train"]["epochs"] = 1  # every stage still runs; a test retrains it once more
    del params["variants"]["deit_a"]
    del params["mask_search"]  # a Snakemake-only part of the DAG (checkpoints); DVC has no stage for it
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(work, "git", "init", "-q")
    run(work, DVC, "init", "-q")
    run(work, DVC, "remote", "add", "-d", "store", str(tmp_path_factory.mktemp("dvcremote")))
    return work


@pytest.fixture(scope="module")
def studied(repo_copy) -> Path:
    """The study run by Snakemake, recorded by DVC, committed to git."""
    out = run(repo_copy, SNAKEMAKE, "--cores", "2", "all")
    assert "DVC: dvc.lock records this run" in out, out[-3000:]
    commit(repo_copy, "study")
    return repo_copy


def test_a_snakemake_run_is_what_dvc_lock_records(studied):
    assert "Data and pipelines are up to date" in run(studied, DVC, "status")
    stages = yaml.safe_load((studied / "dvc.lock").read_text())["stages"]
    assert set(stages) == {"configs", "prepare", "train@mait_b", "evaluate@mait_b", "analyse@mait_b", "report"}
    assert all(out["md5"] for stage in stages.values() for out in stage["outs"])
    metrics = run(studied, DVC, "metrics", "show").splitlines()  # one row per variant, short
    header, rows = metrics[0].split(), [line for line in metrics[1:] if line.strip()]
    assert {"test_top1_mean", "params_m", "gmacs", "infer_img_s", "als_mean", "mad_mean"} <= set(header)
    assert len(rows) == 1 and rows[0].startswith(str(STUDY.report / "metrics" / "mait_b.json"))


def dvc_plans(work: Path, dvc: str, env: dict) -> tuple[set[str], list[str]]:
    """The stages `dvc status` says changed, and those `dvc repro --dry` would run."""
    status = run(work, dvc, "status", env=env)
    changed = (
        set()
        if "Data and pipelines are up to date" in status
        else {line[:-1] for line in status.splitlines() if re.fullmatch(r"[\w@-]+:", line)}
    )
    dry = run(work, dvc, "repro", "--dry", env=env)
    return changed, sorted(line.split("'")[1] for line in dry.splitlines() if line.startswith("Running stage"))


def test_provenance_follows_the_work_not_the_path(studied, tmp_path):
    """What Snakemake and DVC record of the study holds no path of this machine's (the interpreter runs the
    jobs through the environment, a job's code is a digest of its source), so: (a) the same interpreter by
    another path, or the params file by its absolute path, plans nothing; (b) the checkout moved with its results and
    records, run there through the venv linked at another path, plans nothing; (c) a change to the report's code
    alone (in the moved copy, whose src is first on PYTHONPATH: what its jobs run) plans the report and nothing
    else, under Snakemake and DVC."""
    for record in [*(studied / ".snakemake" / "metadata").iterdir(), studied / "dvc.lock"]:
        text = record.read_text(errors="replace")
        assert str(studied) not in text and str(BIN) not in text and str(BIN.resolve()) not in text, record
    venv = tmp_path / "another" / "venv"  # the same venv at another path
    venv.parent.mkdir()
    venv.symlink_to(BIN.parent, target_is_directory=True)
    linked = {**env_with_venv(), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    # (a) python3.11 beside python, and the linked venv's python, in the same checkout
    for python in (BIN / f"python{sys.version_info.major}.{sys.version_info.minor}", venv / "bin" / "python"):
        assert python.is_file() and python != Path(sys.executable)
        assert planned(studied, (str(python), "-m", "snakemake")) == {}, python
    assert dvc_plans(studied, str(venv / "bin" / "dvc"), linked) == (set(), [])
    # (a') the study's params file by its absolute path (the report logs it to MLflow, so no rule param holds it)
    assert planned(studied, (SNAKEMAKE, "--config", f"params={studied / 'params.yaml'}")) == {}
    # (b) the checkout copied elsewhere with its results, .snakemake/ and .dvc/, run through the linked venv
    moved = tmp_path / "moved"
    shutil.copytree(studied, moved, symlinks=True)
    moved_env = {**linked, "PYTHONPATH": os.pathsep.join([str(moved / "src"), linked["PYTHONPATH"]])}
    python = (str(venv / "bin" / "python"), "-m", "snakemake")
    assert planned(moved, python, moved_env) == {}
    assert dvc_plans(moved, str(venv / "bin" / "dvc"), moved_env) == (set(), [])
    # (c) the report's code changed (a module only the report imports: locvit.versioning.command_modules)
    tables = moved / "src" / "locvit" / "report" / "tables.py"
    tables.write_text(tables.read_text() + "\n\nEDITED = True  # a change to the report's code\n")
    assert planned(moved, python, moved_env) == {"report": 1}
    assert dvc_plans(moved, str(venv / "bin" / "dvc"), moved_env) == ({"report"}, ["report"])


def test_dvc_repro_of_one_stage_and_snakemake_agree(studied):
    before = lock_md5(studied, "train@mait_b")
    set_lr(studied, 0.003)
    status = run(studied, DVC, "status")
    assert "configs:" in status and re.search(r"modified:\s+variants", status), status  # params.yaml: every key
    out = run(studied, DVC, "repro", "train@mait_b")  # the configs stage first: it rewrites mait_b's run configs
    assert "Running stage 'configs'" in out and "Running stage 'train@mait_b'" in out
    assert "Running stage 'prepare'" not in out
    assert lock_md5(studied, "train@mait_b") != before
    assert planned(studied) == {"evaluate": 1, "analyse": 1, "report": 1}  # only what depends on it
    run(studied, DVC, "repro")
    assert planned(studied) == {} and "Data and pipelines are up to date" in run(studied, DVC, "status")
    diff = run(studied, DVC, "metrics", "diff")
    assert "mait_b.json" in diff and ("als_mean" in diff or "mad_mean" in diff)  # retrained: other maps

    # A baseline change made through Snakemake lands in dvc.lock; undone, `dvc repro` re-runs the report alone.
    report = lock_md5(studied, "report")
    set_param(studied, "baseline", "mait_b")  # not written out before: null, chosen by the families
    run(studied, SNAKEMAKE, "--cores", "2", "all")
    assert lock_md5(studied, "report") != report and "Data and pipelines are up to date" in run(studied, DVC, "status")
    set_param(studied, "baseline", None)
    out = run(studied, DVC, "repro")
    ran = sorted(line.split("'")[1] for line in out.splitlines() if line.startswith("Running stage"))
    assert ran == ["configs", "report"], out[-3000:]
    assert "Data and pipelines are up to date" in run(studied, DVC, "status")
    commit(studied, "mait_b at lr 0.003")  # the later tests start from a study that is up to date


def test_dvc_plots_render_the_figures_into_one_page(studied, browser):
    run(studied, DVC, "plots", "show", "-o", "dvc_plots")
    page = browser.new_page()
    page.goto((studied / "dvc_plots" / "index.html").as_uri())
    images = page.locator("img")
    assert images.count() >= 3
    sources = [images.nth(i).get_attribute("src") or "" for i in range(images.count())]
    assert any("curves" in s for s in sources), sources  # the training curves of every variant
    assert all(images.nth(i).evaluate("img => img.complete && img.naturalWidth > 0") for i in range(images.count()))
    page.close()


def test_push_clone_pull_leaves_nothing_to_do(studied, pulled_clone):
    table, clone = run(studied, LOCVIT, "results"), pulled_clone
    assert "Data and pipelines are up to date" in run(clone, DVC, "status")
    assert planned(clone) == {}
    assert run(clone, LOCVIT, "results").replace(str(clone), "") == table.replace(str(studied), "")


@pytest.fixture(scope="module")
def pulled_clone(studied) -> Path:
    """The study pushed, cloned with git and pulled (``locvit pull``)."""
    clone = studied.parent / "clone"
    if not clone.exists():
        run(studied, DVC, "push", "-q")
        commit(studied, "pushed")
        run(studied.parent, "git", "clone", "-q", str(studied), str(clone))
        assert not (clone / RESULTS_DIR).exists()
        run(clone, LOCVIT, "pull")
    return clone


def test_dvc_experiments_run_and_list_with_params_and_metrics(studied):
    run(studied, DVC, "exp", "run", "-S", "train.lr=0.003", "--name", "lr3e-3")
    proc = subprocess.run(
        [DVC, "exp", "show", "--json"],
        cwd=studied,
        env=env_with_venv(),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    shown = json.loads(proc.stdout)
    text = json.dumps(shown)
    assert "lr3e-3" in text and "0.003" in text and "test_top1_mean" in text


def set_param(work: Path, key: str, value, section: str | None = None) -> None:
    """Set ``key`` (in ``section``) of params.yaml; None removes it."""
    params = yaml.safe_load((work / "params.yaml").read_text())
    where = params.setdefault(section, {}) if section else params
    if value is None:
        where.pop(key, None)
    else:
        where[key] = value
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


# (section, key, value) of a change, and the jobs it re-runs
CHANGES = [
    ((("variants", "mait_b", "train"), "lr", 0.004), {"train": 1, "evaluate": 1, "analyse": 1, "report": 1}),
    ((("data",), "split_seed", 1), {"prepare": 1, "train": 1, "evaluate": 1, "analyse": 1, "report": 1}),
    (((), "baseline", "mait_b"), {"report": 1, "throughput": 1}),
]


@pytest.mark.parametrize("change,jobs", CHANGES, ids=["train.lr", "data.split_seed", "baseline"])
def test_a_change_is_seen_in_a_pulled_clone_as_in_the_original(studied, pulled_clone, change, jobs):
    """The clone has none of Snakemake's records of past params (.snakemake/ is not pushed): each job's
    config file (locvit.config.jobs), rewritten when its part of params.yaml changes, is what both see.
    Changing the param back and `snakemake --touch` (which accepts the files as they are) restore both."""
    path, key, value = change
    for work in (studied, pulled_clone):
        original = (work / "params.yaml").read_text()
        params = yaml.safe_load(original)
        where = params
        for part in path:
            where = where.setdefault(part, {})
        where[key] = value
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        try:
            assert planned(work) == jobs, (work.name, run(work, SNAKEMAKE, "-n", "--summary", "all")[-3000:])
        finally:
            (work / "params.yaml").write_text(original)
            run(work, SNAKEMAKE, "--touch", "--cores", "1", "all")
        assert planned(work) == {}
