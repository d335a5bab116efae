"""End to end: the whole Snakemake DAG on the tiny preset, read back as a user would.

One real Snakemake run (prepare -> train x 4 -> evaluate -> analyse -> report, and a
two-round MaiT mask search) in a temporary copy of the workflow; the MLflow runs are
read back with the MLflow client.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml
from helpers import BIN, copy_workflow, env_with_venv, free_port, seed_runs, snakemake, train_cmd

from locvit.io import read_throughput, unpack_bits
from locvit.tracking.tree import PARENT, ROLE, find, study_tags, variant_tags

pytestmark = pytest.mark.e2e
TINY = "presets/tiny.yaml"


RESULTS_DIR = "out/studies"  # not the default: every path must follow params' results_dir


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A finished tiny study (the working directory of the run), its results under RESULTS_DIR."""
    work = copy_workflow(tmp_path_factory.mktemp("study"))
    tiny = yaml.safe_load((work / TINY).read_text())
    (work / TINY).write_text(yaml.safe_dump({**tiny, "results_dir": RESULTS_DIR}, sort_keys=False))
    snakemake(work, "--cores", "2", "all", "--config", f"params={TINY}")
    assert not (work / "results").exists()
    return work


@pytest.fixture(scope="module")
def params(study) -> dict:
    from locvit.config import load_params

    return load_params(study / TINY)


@pytest.fixture(scope="module")
def layout(study, params):
    """Where the study's files are (locvit.layout), as absolute paths."""
    from locvit.layout import StudyLayout

    return StudyLayout(study / StudyLayout.of(params).root)


def test_every_output_is_there(study, params, layout):
    root = layout.root
    for split in ("train", "val", "test"):
        assert (root / "data" / f"{split}.beton").stat().st_size > 0
    for variant in params["variants"]:
        for seed in params["seeds"]:
            run = root / "runs" / variant / f"seed{seed}"
            assert {"best.pt", "last.pt", "metrics.json"} <= {p.name for p in run.iterdir()}
            metrics = json.loads((run / "metrics.json").read_text())
            assert len(metrics["history"]) == params["train"]["epochs"]
            assert (root / "eval" / variant / f"seed{seed}.json").is_file()
            assert (root / "analysis" / variant / f"seed{seed}.json").is_file()
            assert (root / "maps" / variant / f"seed{seed}.npz").is_file()
        profile = json.loads((root / "analysis" / variant / "profile.json").read_text())
        assert profile["params"] > 0 and profile["gmacs"] > 0
        assert "infer_images_per_s" not in profile  # speed comes from the one throughput job, measured alone
    speed = read_throughput(layout.throughput_file)
    assert list(speed) == list(params["variants"]) and all(r["rounds"] >= 3 for r in speed.values())
    assert speed[params["baseline"]]["ratio_vs_baseline"] == 1.0 and next(iter(speed.values()))["device"].startswith(
        "cpu"
    )
    report = json.loads((root / "report" / "report.json").read_text())
    assert {"mait_table2", "mait_table3", "mait_table4"} <= set(report["tables"])
    for name in ("curves", "als_deit_a", "als_mait_b", "similarity_mait_b", "rollout_mait_b"):
        assert (root / "report" / report["figures"][name]["png"]).read_bytes()[:4] == b"\x89PNG"
    assert not list(root.rglob("*.tmp"))  # no temporary file left behind


def test_mlflow_has_one_complete_run_per_variant_and_seed(study, params, layout):
    import mlflow

    from locvit.config.run import run_config

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{layout.tracking_db}")
    exp = client.get_experiment_by_name("tiny")
    assert exp is not None and exp.tags["mlflow.experimentKind"] == "custom_model_development"  # model training
    manifest = json.loads((layout.data_files()["manifest"]).read_text())
    runs = [r for r in seed_runs(client, "tiny") if r.data.tags["variant"] in params["variants"]]
    assert len(runs) == len(params["variants"]) * len(params["seeds"])
    seen = set()
    for run in runs:
        tags, data = run.data.tags, run.data
        seen.add((tags["variant"], int(tags["seed"])))
        assert run.info.status == "FINISHED"
        assert tags["study"] == "tiny" and tags["dataset"] == "digits"
        assert tags["model"] == params["variants"][tags["variant"]]["model"]
        assert len(tags["data_hash"]) == 16 and tags["git_commit"]
        # the machine that made the numbers: its CPU, the instruction set torch's kernels used, torch's build
        assert tags["machine.cpu_capability"] == torch.backends.cpu.get_cpu_capability()
        assert tags["machine.torch"] == torch.__version__ and tags["machine.cpu"]
        record = json.loads(layout.run_files(tags["variant"], int(tags["seed"])).metrics.read_text())["machine"]
        assert record["cpu_capability"] == tags["machine.cpu_capability"] and record["cpu"] == tags["machine.cpu"]
        assert json.loads(tags["run_config"]) == run_config(params, tags["variant"], int(tags["seed"]))
        inputs = {d.dataset.name: d for d in run.inputs.dataset_inputs}  # the UI's Datasets column
        assert set(inputs) == {"digits-train", "digits-val", "digits-test"}
        for split in ("train", "val", "test"):
            dataset = inputs[f"digits-{split}"]
            assert dataset.dataset.digest == tags["data_hash"] == manifest["data_hash"]
            assert json.loads(dataset.dataset.source)["uri"].endswith(f"data/{split}.beton")
            assert {t.key: t.value for t in dataset.tags}["images"] == str(manifest["splits"][split]["size"])
        assert data.params["train.epochs"] == "2" and data.params["model_kwargs.img_size"] == "16"
        assert data.params["variant"] == tags["variant"]
        history = client.get_metric_history(run.info.run_id, "val_top1")
        assert [m.step for m in history] == [0, 1]  # one value per epoch, step = epoch
        assert "test_top1" in data.metrics
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"metrics.json", "checkpoints", "report"} <= artifacts
        assert [a.path for a in client.list_artifacts(run.info.run_id, "checkpoints")] == ["checkpoints/best.pt"]
        figures = {a.path for a in client.list_artifacts(run.info.run_id, "report")}
        assert f"report/als_{tags['variant']}.png" in figures  # the report logs each variant's plots
    assert seen == {(v, s) for v in params["variants"] for s in params["seeds"]}


def test_mlflow_reads_as_the_results_table(study, params, layout):
    """One top-level run (the study's: the params file and the report), one run per variant under it whose
    metrics are its row of results.csv, every seed run under its variant's with MLflow's system metrics."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{layout.tracking_db}")
    exp = client.get_experiment_by_name("tiny").experiment_id
    every = client.search_runs([exp])
    (top,) = [r for r in every if PARENT not in r.data.tags]
    assert top.data.tags[ROLE] == "study" and top.info.run_name == "tiny" and top.info.status == "FINISHED"
    assert top.data.tags["baseline"] == params["baseline"]
    artifacts = {a.path for a in client.list_artifacts(top.info.run_id, "report")}
    assert {f"report/{n}" for n in ("results.md", "results.csv", "index.md", "tables", "figures")} <= artifacts
    assert "tiny.yaml" in {a.path for a in client.list_artifacts(top.info.run_id)}
    rows = {r["variant"]: r for r in csv.DictReader((layout.report / "results.csv").open())}
    speed = read_throughput(layout.throughput_file)
    variants = {r.data.tags["variant"]: r for r in every if r.data.tags.get(ROLE) == "variant"}
    assert set(rows) <= set(variants)  # and the mask search's rounds
    for name, run in variants.items():
        assert run.data.tags[PARENT] == top.info.run_id and run.info.status == "FINISHED" and run.info.run_name == name
        if name not in rows:
            continue
        row, metrics = rows[name], run.data.metrics
        for key in ("test_top1_mean", "test_top1_std", "test_top1_ci95_low", "test_top1_ci95_high", "n_seeds"):
            assert metrics[key] == float(row[key]), (name, key)  # the file's numbers, not recomputed ones
        assert metrics["img_s_vs_baseline"] == speed[name]["ratio_vs_baseline"]
        assert run.data.tags["verdict"] == row["verdict"]
        if row["verdict"] != "baseline":
            for key in ("delta_vs_baseline", "delta_ci95_low", "delta_ci95_high", "p_vs_baseline", "p_holm", "mde80"):
                assert metrics[key] == float(row[key]), (name, key)
            assert run.data.tags["reference"] == row["reference"] == params["baseline"]
        seeds = [r for r in every if r.data.tags.get(PARENT) == run.info.run_id]
        assert sorted(int(r.data.tags["seed"]) for r in seeds) == params["seeds"]
        assert {r.info.run_id for r in seeds} == set(row["mlflow_run_ids"].split())
        for seed in seeds:
            assert seed.data.tags[ROLE] == "seed" and "system/cpu_utilization_percentage" in seed.data.metrics
    by_mean = sorted((r for n, r in variants.items() if n in rows), key=lambda r: -r.data.metrics["test_top1_mean"])
    assert [r.data.tags["variant"] for r in by_mean] == sorted(rows, key=lambda n: -float(rows[n]["test_top1_mean"]))


def test_a_report_rerun_updates_the_tree_in_place_and_a_new_seed_joins_it(study, params, layout, tmp_path, prepared):
    import shutil

    import mlflow

    from locvit.config.jobs import report_config
    from locvit.config.run import run_config
    from locvit.report.build import build_report

    db = tmp_path / "mlflow.db"  # a copy: the browser tests read the study's own
    shutil.copy(layout.tracking_db, db)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    exp = client.get_experiment_by_name("tiny").experiment_id
    before = {r.info.run_id: r for r in client.search_runs([exp])}
    served = "https://mlflow.example.org/ui"  # where the users of this study open the UI
    report = build_report({**report_config(params), "ui_url": served}, layout.root, tmp_path / "report", tracking_db=db)
    after = {r.info.run_id: r for r in client.search_runs([exp])}
    assert set(after) == set(before)  # found by tags: nothing made twice
    for run_id, run in after.items():
        assert run.data.metrics == before[run_id].data.metrics, run.info.run_name
    tree = report["mlflow"]["tree"]
    assert tree["study_run"] == find(client, exp, study_tags("tiny"))[0].info.run_id
    assert tree["compare_link"].startswith(served + "/#/compare-runs?runs=")
    assert tree["study_link"] == f"{served}/#/experiments/{exp}/runs/{tree['study_run']}?workflowType=machine_learning"
    links = re.findall(r"\]\((http[^)]+)\)", (tmp_path / "report" / "results.md").read_text())
    assert links and all(link.startswith(f"{served}/#/experiments/{exp}/runs/") for link in links)

    cfg = run_config(params, "deit_a", 7)  # a seed added to the study: it joins the variant's run
    cfg["train"]["epochs"] = 1  # joining is decided at the run's start; one epoch is enough
    run_dir = tmp_path / "seed7"
    subprocess.run(train_cmd(cfg, prepared, run_dir, db), check=True, env=env_with_venv(), capture_output=True)
    added = client.get_run(json.loads((run_dir / "metrics.json").read_text())["mlflow_run_id"])
    (variant,) = find(client, exp, variant_tags("tiny", "deit_a"))
    assert added.data.tags[PARENT] == variant.info.run_id == tree["variant_runs"]["deit_a"]
    assert len(client.search_runs([exp])) == len(before) + 1


def test_every_run_logs_its_best_checkpoint_as_a_loadable_mlflow_model(study, params, layout):
    import mlflow
    import torch

    from locvit import models

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{layout.tracking_db}")
    exp = client.get_experiment_by_name("tiny")
    logged = {m.source_run_id: m for m in client.search_logged_models([exp.experiment_id])}
    runs = [r for r in seed_runs(client, "tiny") if r.data.tags["variant"] in params["variants"]]
    assert {r.info.run_id for r in runs} <= set(logged)  # the Models tab lists every run's model
    for run in runs:
        model = logged[run.info.run_id]
        metrics = json.loads(
            (layout.run_dir(run.data.tags["variant"], run.data.tags["seed"]) / "metrics.json").read_text()
        )
        assert model.name == "model" and model.status == "READY"
        assert {m.key for m in model.metrics or []} >= {"val_top1", "best_val_top1"}  # linked at the best epoch
        assert all(m.step == metrics["best_epoch"] for m in model.metrics)
    run = runs[0]
    variant, seed = run.data.tags["variant"], run.data.tags["seed"]
    mlflow.set_tracking_uri(f"sqlite:///{layout.tracking_db}")
    loaded = mlflow.pytorch.load_model(f"models:/{logged[run.info.run_id].model_id}").eval()
    ours = models.load(layout.run_dir(variant, seed) / "best.pt", "cpu")
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), ours(x), rtol=0, atol=0)


def test_results_table_matches_the_evaluations(study, params, layout):
    report = layout.report
    rows = list(csv.DictReader((report / "results.csv").open()))
    assert [r["variant"] for r in rows] == list(params["variants"])
    md = (report / "results.md").read_text()
    tex = (report / "results.tex").read_text()
    for row in rows:
        evals = [json.loads((layout.eval_file(row["variant"], s)).read_text()) for s in params["seeds"]]
        accs = [100 * e["test_top1"] for e in evals]
        assert float(row["test_top1_mean"]) == pytest.approx(sum(accs) / len(accs))
        assert int(row["n_seeds"]) == 2 and row["missing_seeds"] == ""
        assert set(row["mlflow_run_ids"].split()) == {e["mlflow_run_id"] for e in evals}
        test_split = json.loads(layout.data_files()["manifest"].read_text())["splits"]["test"]["content_sha256"]
        for e in evals:  # which test images each run got right: as many as its top-1 says
            assert unpack_bits(e["test_hits"], e["n"]).sum() == round(e["test_top1"] * e["n"])
            # the split it scored (the report pairs on it) and the machine it was scored on
            assert (
                e["test_hash"] == test_split
                and e["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
            )
        assert row["verdict"] in ("baseline", "better", "worse", "equivalent", "undecided")
        if row["verdict"] != "baseline":  # each verdict agrees with its interval
            low, high = float(row["delta_ci95_low"]), float(row["delta_ci95_high"])
            assert low < float(row["delta_vs_baseline"]) < high and float(row["mde80"]) > 0
            assert {
                "better": low > 0,
                "worse": high < 0,
                "undecided": True,
                "equivalent": abs(float(row["delta_vs_baseline"])) < params["equivalence_margin"],
            }[row["verdict"]]
        assert f"| {row['variant']} |" in md and row["variant"].replace("_", r"\_") in tex
    assert "±" in md and r"\toprule" in tex


def test_locvit_results_prints_the_statistics(study, params, layout):
    out = subprocess.run(
        [str(BIN / "locvit"), "results", "--params", TINY],
        cwd=study,
        capture_output=True,
        text=True,
        env=env_with_venv(),
    )
    assert out.returncode == 0, out.stderr
    rows = {r["variant"]: r for r in csv.DictReader((layout.report / "results.csv").open())}
    assert "Δ vs deit_a" in out.stdout and "Δ 95% CI" in out.stdout and "MDE" in out.stdout
    line = next(x for x in out.stdout.splitlines() if x.startswith("mait_b "))
    assert f"{float(rows['mait_b']['test_top1_mean']):.2f} ± {float(rows['mait_b']['test_top1_std']):.2f}" in line
    assert f"{rows['mait_b']['verdict']}" in line and rows["deit_a"]["verdict"] == "baseline"
    assert "deit_a is the baseline." in out.stdout and "mait_b vs deit_a:" in out.stdout


def test_rerun_with_nothing_changed_does_nothing(study):
    out = snakemake(study, "--cores", "2", "all", "--config", f"params={TINY}")
    assert "Nothing to be done" in out.stdout + out.stderr


def _planned(dry_run_output: str, rule: str) -> list[str]:
    """The wildcards of every job of ``rule`` in a dry run's output."""
    jobs = dry_run_output.split("\nrule ")[1:]
    return [
        line.strip()
        for job in jobs
        if job.startswith(f"{rule}:")
        for line in job.splitlines()
        if line.strip().startswith("wildcards:")
    ]


def test_changing_one_variant_retrains_only_that_variant(study):
    changed = yaml.safe_load((study / TINY).read_text())
    changed["variants"]["mait_b"]["train"] = {"lr": 0.001}
    (study / "changed.yaml").write_text(yaml.safe_dump(changed))
    out = snakemake(study, "-n", "all", "--config", "params=changed.yaml")
    assert sorted(_planned(out.stdout, "train")) == ["wildcards: variant=mait_b"]  # train_jobs: per_variant
    # (search_* jobs reuse these rules; the search re-runs too: mait_b is its base variant)
    assert [w for w in _planned(out.stdout, "evaluate") if "variant=" in w] == ["wildcards: variant=mait_b"]
    assert [w for w in _planned(out.stdout, "analyse") if "variant=" in w] == ["wildcards: variant=mait_b"]
    assert "rule prepare:" not in out.stdout


def _jobs(dry_run_output: str) -> list[str]:
    """Each job of a dry run as 'rule' or 'rule variant' (empty: nothing to do)."""
    jobs = []
    for job in dry_run_output.split("\nrule ")[1:]:
        rule = job.split(":")[0]
        variant = re.search(r"wildcards:.*variant=(\w+)", job)
        jobs.append(f"{rule} {variant[1]}" if variant else rule)
    return sorted(j for j in jobs if j != "all")


def test_an_upgrade_re_runs_only_the_jobs_whose_computation_changed(study, tmp_path):
    """The finished study planned by an edited copy of locvit (29/34): a comment, a docstring or a reformat
    plans nothing, nor does a real edit to a family no variant runs (Swin); a fix to the report's plots plans
    the report alone; a real edit to MaiT plans mait_b's jobs (the mask search's too: it trains mait_b), the
    throughput job (it measures every variant) and the report, and nothing of deit_a's."""
    work = tmp_path / "work"
    shutil.copytree(study, work, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    src = work / "src" / "locvit"  # copy_workflow's copy of the package: imported first below
    env = {**env_with_venv(), "PYTHONPATH": os.pathsep.join([str(work / "src"), env_with_venv()["PYTHONPATH"]])}

    def plan() -> list[str]:
        proc = subprocess.run(
            [str(BIN / "snakemake"), "-n", "all", "--config", f"params={TINY}"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return _jobs(proc.stdout)

    def edit(path: str, old: str, new: str) -> None:
        text = (src / path).read_text()
        assert old in text, f"{old!r} not in {path}"
        (src / path).write_text(text.replace(old, new, 1))

    assert plan() == []
    edit("models/mait.py", "\n\n", "\n\n# a comment\n")
    edit("io.py", '"""', '"""Another docstring. ')
    edit("train/engine.py", "\n\n\ndef ", "\n\n\n\n\ndef ")  # blank lines: a reformat
    assert plan() == []
    edit("models/swin.py", "\n\n\ndef ", "\n\n\nUNUSED = 2\n\n\ndef ")
    assert plan() == []
    edit("report/plots.py", "\n\n\ndef ", "\n\n\nUNUSED = 2\n\n\ndef ")
    assert plan() == ["report"]
    edit("models/mait.py", "\n\n\ndef ", "\n\n\nUNUSED = 2\n\n\ndef ")
    planned = plan()
    assert {"train mait_b", "evaluate mait_b", "analyse mait_b", "throughput", "report"} <= set(planned), planned
    assert not [j for j in planned if "deit_a" in j or j.startswith("prepare")], planned


def test_status_names_the_change_and_checks_the_runs_fingerprints(study, tmp_path):
    """`locvit status` on the finished study planned by an edited copy of locvit (29/34 items 3 and 4): a
    refactor of the engine's schedule that keeps every number (a local added) re-plans both variants' training for
    locvit's shared code, and `--check` finds every run's fingerprint equal; a real change of the warm-up (one
    step more) makes every fingerprint differ."""
    work = tmp_path / "work"
    shutil.copytree(study, work, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    loop = work / "src" / "locvit" / "train" / "engine.py"  # make_schedule: the run's warm-up and cosine
    env = {**env_with_venv(), "PYTHONPATH": os.pathsep.join([str(work / "src"), env_with_venv()["PYTHONPATH"]])}

    def status() -> str:
        proc = subprocess.run(
            [str(BIN / "locvit"), "status", "--params", TINY, "--check"],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    assert "nothing would re-run" in status()
    text = loop.read_text()
    for old, new in [
        (
            "    return functools.partial(\n        cosine_schedule,",
            "    peak = peak_lr(recipe)\n    return functools.partial(\n        cosine_schedule,",
        ),
        (
            '        lr=peak_lr(recipe),\n        min_lr=recipe["min_lr"],',
            '        lr=peak,\n        min_lr=recipe["min_lr"],',
        ),
    ]:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    loop.write_text(text)
    out = status()
    assert re.search(r"^train deit_a +code: locvit's shared code .* +train: ", out, re.M), out
    assert re.search(r"^train mait_b +code: locvit's shared code", out, re.M), out
    assert out.count("fingerprint equal") == 4 and "differs" not in out, out  # 2 variants x 2 seeds
    warmup = 'warmup_steps=int(round(recipe["warmup_epochs"] * steps_per_epoch))'
    loop.write_text(loop.read_text().replace(warmup, warmup[:-1] + " + 1)"))
    out = status()
    assert out.count("fingerprint differs") == 4 and "fingerprint equal" not in out, out


def test_an_accepted_change_keeps_the_runs_and_a_real_one_retrains(tmp_path, raw_tiny):
    """The upgrade journey's end (29/34 items 5 and 7), on a study of DeiT and MaiT trained by a copy of
    locvit: a MaiT refactor that computes the same (an unused constant) is cleared by the fingerprint and
    accepted; evaluation, analysis and throughput re-run and load the accepted checkpoint, MaiT is not
    retrained, and the runs record why. A report-only fix accepted by hand plans nothing. A real change of the
    warm-up afterwards retrains both variants all the same."""
    work = copy_workflow(tmp_path)
    params = {**raw_tiny, "seeds": [0], "study": "journey", "variants": dict(list(raw_tiny["variants"].items())[:2])}
    params.pop("mask_search", None)
    params["train"] = {**params["train"], "epochs": 1}
    (work / "journey.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    src = work / "src" / "locvit"
    env = {**env_with_venv(), "PYTHONPATH": os.pathsep.join([str(work / "src"), env_with_venv()["PYTHONPATH"]])}

    def run(*args: str) -> str:
        proc = subprocess.run(args, cwd=work, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    def plan() -> list[str]:
        return _jobs(run(str(BIN / "snakemake"), "-n", "all", "--config", "params=journey.yaml"))

    def edit(path: str, old: str, new: str) -> None:
        text = (src / path).read_text()
        assert old in text
        (src / path).write_text(text.replace(old, new, 1))

    run(str(BIN / "snakemake"), "--cores", "2", "all", "--config", "params=journey.yaml")
    runs = work / "results" / "journey" / "runs"
    trained = {p: p.stat().st_mtime_ns for p in runs.rglob("*.pt")}
    edit("models/mait.py", "\n\n\ndef ", "\n\n\nUNUSED = 2\n\n\ndef ")
    assert "train mait_b" in plan()
    out = run(str(BIN / "locvit"), "accept", "--params", "journey.yaml", "--cleared", "--why", "an unused constant")
    assert "accepted train mait_b (fingerprint equal): an unused constant" in out, out
    assert not [j for j in plan() if j.startswith("train")]
    out = run(str(BIN / "snakemake"), "--cores", "2", "all", "--config", "params=journey.yaml")
    assert "rule train" not in out and "rule evaluate" in out  # scored from the accepted best.pt
    assert plan() == []
    metrics = json.loads((runs / "mait_b" / "seed0" / "metrics.json").read_text())
    assert [(a["how"], a["why"]) for a in metrics["code_accepted"]] == [("fingerprint equal", "an unused constant")]
    assert {p: p.stat().st_mtime_ns for p in runs.rglob("*.pt")} == trained  # kept, their times too

    edit("report/plots.py", "\n\n\ndef ", "\n\n\nUNUSED = 2\n\n\ndef ")
    assert plan() == ["report"]
    out = run(str(BIN / "locvit"), "accept", "--params", "journey.yaml", "report", "--why", "a constant")
    assert "accepted report (by hand): a constant" in out and "snakemake -n now plans: nothing" in out, out
    assert plan() == []

    warmup = 'warmup_steps=int(round(recipe["warmup_epochs"] * steps_per_epoch))'
    edit("train/engine.py", warmup, warmup[:-1] + " + 1)")
    out = run(
        str(BIN / "locvit"), "accept", "--params", "journey.yaml", "--cleared", "evaluate deit_a", "--why", "hoped so"
    )
    assert "nothing accepted" in out and out.count("fingerprint differs") == 2, out
    assert "not accepted: evaluate deit_a re-runs for another reason (an input it reads re-runs)" in out, out
    assert {"train deit_a", "train mait_b"} <= set(plan())


def test_bad_config_stops_before_any_job(tmp_path, raw_tiny):
    work = copy_workflow(tmp_path)
    raw_tiny["variants"]["../escape"] = raw_tiny["variants"]["deit_a"]
    raw_tiny["train"]["optimizer"] = "sgd"
    (work / "bad.yaml").write_text(yaml.safe_dump(raw_tiny))
    out = snakemake(work, "--cores", "1", "all", "--config", "params=bad.yaml", check=False)
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "variants: name '../escape' is not safe as a file name" in text
    assert "unknown key 'optimizer' under 'train'" in text
    assert not (work / "results").exists()


#: The one lint the workflow keeps by choice: its jobs get their software from the Python that runs Snakemake
#: (docs/cluster.md, "What the cluster needs"), not from per-rule conda environments or containers.
NO_CONDA = "Specify a conda environment or container for each rule."


def test_lint_is_clean(repo):
    out = snakemake(repo, "--lint", check=False)
    text = out.stdout + out.stderr
    titles = set(re.findall(r"^ {4}\* (.+?):?$", text, re.M))
    assert titles == {NO_CONDA}, text[-4000:]
    linted = re.findall(r"^Lints for rule (\w+)", text, re.M)
    assert len(linted) == len(set(linted)) and "report" in linted and "train" in linted


@pytest.mark.parametrize("preset", sorted(p.name for p in (Path(__file__).parents[1] / "presets").glob("*.yaml")))
def test_every_preset_dry_runs_on_the_cluster_profile(repo, tmp_path, preset):
    """Each paper study stays valid: its whole DAG plans on the SLURM profile."""
    from locvit.config import load_params
    from locvit.config.run import variant_seeds

    params = load_params(repo / "presets" / preset)
    work = copy_workflow(tmp_path)
    out = snakemake(work, "-n", "--profile", "cluster", "all", "--config", f"params=presets/{preset}")
    text = out.stdout + out.stderr
    assert "Using profiles cluster" in text
    if preset == "tiny.yaml":  # the tiny study's training jobs ask the profile's partition for a GPU
        assert "slurm_partition=gpu" in text and "gpu=1" in text
    stats = out.stdout.split("Job stats:")[1]
    # train, and train_<n>seeds for the variants seed_budget gives other seeds
    train_jobs = sum(int(line.split()[1]) for line in stats.splitlines() if re.match(r"^train(_\d+seeds)? ", line))
    per_run = params["train_jobs"] == "per_run"
    assert train_jobs == sum(len(variant_seeds(params, v)) if per_run else 1 for v in params["variants"])
    assert re.search(r"^throughput +1$", stats, re.M)  # the one job that times every variant


def test_training_jobs_per_run_or_per_variant(repo, tmp_path, raw_tiny):
    """train_jobs: a variant's seeds in one job (one process), or a job per run; the same commands otherwise."""
    work = copy_workflow(tmp_path)
    planned = {}
    for mode in ("per_run", "per_variant"):
        (work / f"{mode}.yaml").write_text(yaml.safe_dump({**raw_tiny, "train_jobs": mode}))
        out = snakemake(work, "-n", "-p", "all", "--config", f"params={mode}.yaml")
        planned[mode] = sorted(_planned(out.stdout, "train"))
        if mode == "per_run":
            assert out.stdout.count("--out-dir results/tiny/runs/deit_a/seed") == 2
        else:  # one process trains both seeds, restoring (not retraining) finished ones when re-run
            assert out.stdout.count("--out-dir results/tiny/runs/deit_a/seed0 results/tiny/runs/deit_a/seed1 ") == 1
            assert "--keep-finished" in out.stdout
    assert planned["per_run"] == [f"wildcards: variant={v}, seed={s}" for v in ("deit_a", "mait_b") for s in (0, 1)]
    assert planned["per_variant"] == ["wildcards: variant=deit_a", "wildcards: variant=mait_b"]


def test_a_data_efficiency_study_plans_one_data_folder_per_fraction(repo, tmp_path):
    from locvit.config import load_params
    from locvit.config.run import run_config

    params = load_params(repo / "presets" / "data_efficiency.yaml")
    work = copy_workflow(tmp_path)
    out = snakemake(work, "-n", "all", "--config", "params=presets/data_efficiency.yaml")
    prepared = sorted(
        line.split("output: ")[1].split("/")[2]
        for line in out.stdout.splitlines()
        if "output: results/data_efficiency/data" in line and "manifest.json" in line
    )
    assert prepared == ["data", "data_10pct", "data_25pct", "data_50pct"]
    # deit_25pct trains on the 25 % file and its run configs say so; deit on the whole split
    job = next(j for j in out.stdout.split("\nrule ") if j.startswith("train") and "variant=deit_25pct" in j)
    assert "results/data_efficiency/data_25pct/train.beton" in job
    assert params["variants"]["deit_25pct"]["train_fraction"] == 0.25
    assert params["variants"]["deit"]["train_fraction"] == 1.0
    # fraction_protocol same_images: a fraction f trains 25 / f epochs, and seed_budget {full_runs: 4} gives every
    # fraction 4 seeds (each a full run's images: the study's 3 and one more), so one rule trains every variant
    assert run_config(params, "deit_25pct", 0)["train"]["epochs"] == 100
    assert run_config(params, "deit_10pct", 0)["train"]["epochs"] == 250
    assert run_config(params, "deit", 0)["train"]["epochs"] == 25
    assert job.startswith("train:") and all(f"deit_25pct/seed{s}/best.pt" in job for s in range(4))
    assert all(params["variants"][v]["seeds"] == [0, 1, 2, 3] for v in params["variants"])
    planned = {
        line.split()[0]: int(line.split()[1])
        for line in out.stdout.splitlines()
        if re.match(r"^(train|evaluate|analyse)\w* +\d+$", line)
    }
    assert planned == {rule: 20 for rule in ("train", "evaluate", "analyse")}


def test_mask_search_follows_the_previous_rounds_als(study, params, layout):
    from locvit.analysis.search import next_spec

    search = layout.search
    spec0 = json.loads((search / "round0" / "spec.json").read_text())
    als0 = json.loads((search / "round0" / "analysis.json").read_text())["als"]
    spec1 = json.loads((search / "round1" / "spec.json").read_text())
    expected = next_spec(1, spec0, als0, params["mask_search"]["all_above"], params["mask_search"]["remove_below"])
    assert spec1["masked_heads"] == expected["masked_heads"]
    # Round 1 trained with exactly those masks (its checkpoint's config), and the table reports both rounds.
    import torch

    state = torch.load(search / "round1" / "best.pt", weights_only=True)
    assert state["config"]["model_kwargs"]["masked_heads"] == spec1["masked_heads"]
    table = json.loads((layout.report / "mask_search.json").read_text())
    assert [r["round"] for r in table["rounds"]] == [0, 1]
    assert table["searched_masked_heads"] == spec1["masked_heads"]


def test_html_report_has_every_figure_with_its_caption(study):
    snakemake(study, "--report", "report.html", "--config", f"params={TINY}")
    html = (study / "report.html").read_text()
    assert "Attention Locality Score (MaiT Eq. 3, Fig. 3) of variant" in html
    for name in ("als_mait_b.png", "similarity_mait_b.png", "rollout_deit_a.png", "curves.png", "mait_table2.csv"):
        assert name in html


def test_report_names_a_missing_run(study, params, tmp_path, layout):
    """Re-run the report on a copy of the study with one evaluation removed."""
    import shutil

    copy = tmp_path / "tiny"
    shutil.copytree(layout.root, copy, ignore=shutil.ignore_patterns("data", "mlartifacts"))
    (copy / "eval" / "mait_b" / "seed1.json").unlink()
    out = subprocess.run(
        [
            str(BIN / "locvit"),
            "report",
            "--params",
            str(study / TINY),
            "--study-dir",
            str(copy),
            "--out-dir",
            str(copy / "report"),
            "--tracking-db",
            str(copy / "mlflow.db"),
            "--no-mlflow",
        ],
        capture_output=True,
        text=True,
        env=env_with_venv(),
    )
    assert out.returncode == 0, out.stderr
    assert "missing: mait_b seed 1" in (copy / "report" / "tables" / "mait_table2.md").read_text()
    assert "missing: mait_b seed 1" in (copy / "report" / "results.md").read_text()


# --- The MLflow UI, seen as a user sees it: `locvit mlflow-ui` on the study, driven in headless Chromium. ---

UI_TIMEOUT_MS = 90_000  # the React app is slow to render on 2 busy cores


def _screenshot_dir() -> Path:
    out = Path(os.environ.get("LOCVIT_TEST_ARTIFACTS") or Path(__file__).resolve().parents[1] / "test-artifacts")
    out = out / "mlflow-ui"
    out.mkdir(parents=True, exist_ok=True)
    return out


def _start_ui(study_dir: Path, log: Path, timeout: float = 180) -> tuple[subprocess.Popen, str]:
    """Start `locvit mlflow-ui` on a free port in its own process group; return it once /health answers."""
    port = free_port()
    env = {**env_with_venv(), "MLFLOW_DISABLE_TELEMETRY": "true"}
    with log.open("w") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [str(BIN / "locvit"), "mlflow-ui", "--study-dir", str(study_dir), "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.read().strip() == b"OK":
                    assert f"running on {url}" in log.read_text(), "the UI must bind to 127.0.0.1 by default"
                    return proc, url
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop_ui(proc)
            raise AssertionError(
                f"locvit mlflow-ui did not answer on {url} (exit {proc.returncode}):\n{log.read_text()[-4000:]}"
            )
        time.sleep(0.5)


def _stop_ui(proc: subprocess.Popen) -> None:
    """Kill the UI's whole process group (mlflow runs uvicorn and a job runner as children)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            proc.poll()  # reap the group leader, or the group never looks empty
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def test_mlflow_ui_command_binds_locally_and_names_what_is_missing(tmp_path, monkeypatch):
    from locvit.tracking.ui import ui_command

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = subprocess.run(
        [str(BIN / "locvit"), "mlflow-ui", "--study-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=env_with_venv(),
        timeout=120,
    )
    assert out.returncode == 1 and f"{tmp_path / 'mlflow.db'} does not exist" in out.stderr
    assert "run the pipeline first" in out.stderr
    (tmp_path / "mlflow.db").touch()
    cmd = ui_command(tmp_path)
    assert cmd[:4] == [sys.executable, "-m", "mlflow", "ui"] and all(isinstance(a, str) for a in cmd)
    assert cmd[cmd.index("--host") + 1] == "127.0.0.1"  # never 0.0.0.0 unless asked
    assert cmd[cmd.index("--backend-store-uri") + 1] == f"sqlite:///{tmp_path.resolve() / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    with pytest.raises(ValueError, match="MLFLOW_TRACKING_URI is set .*browse http://tracking.example:5000"):
        ui_command(tmp_path)


@pytest.fixture(scope="module")
def mlflow_ui(layout, browser, tmp_path_factory):
    """The URL of `locvit mlflow-ui` serving the finished study and the link it printed; killed at the end."""
    log = tmp_path_factory.mktemp("ui") / "mlflow-ui.log"
    proc, url = _start_ui(layout.root, log)
    try:
        yield url, re.search(r"browse (\S+)", log.read_text()).group(1)
    finally:
        _stop_ui(proc)


@pytest.fixture
def page(browser, request):
    from playwright.sync_api import expect

    expect.set_options(timeout=UI_TIMEOUT_MS)
    context = browser.new_context(viewport={"width": 1920, "height": 1080})
    context.set_default_timeout(UI_TIMEOUT_MS)
    page = context.new_page()
    failed_before = request.session.testsfailed
    yield page
    if request.session.testsfailed > failed_before:  # this test failed: keep what the browser showed
        page.screenshot(path=_screenshot_dir() / f"failed-{request.node.name}.png", full_page=True)
    context.close()


def _tracked_runs(layout, params: dict) -> tuple[str, dict, int]:
    """The experiment id, its variant runs {run name: run} and its number of runs (mask search included)."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{layout.tracking_db}")
    exp = client.get_experiment_by_name("tiny")
    every = client.search_runs([exp.experiment_id])
    seeds = [r for r in every if r.data.tags.get(ROLE) == "seed"]
    return (
        exp.experiment_id,
        {r.info.run_name: r for r in seeds if r.data.tags["variant"] in params["variants"]},
        len(every),
    )


def _as_shown(x: float) -> str:
    """A metric as the UI prints it (JavaScript's shortest round-trip form; fine for accuracies)."""
    return str(int(x)) if x == int(x) else repr(x)


def _save(page, name: str) -> Path:
    path = _screenshot_dir() / name
    path.unlink(missing_ok=True)
    page.screenshot(path=path, full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    return path


def _close_assistant(page) -> None:
    """MLflow 3 opens an assistant panel beside the page; close it to give the table room (if it is there)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.get_by_role("button", name="Close", exact=True).first.click(timeout=5_000)
    except PlaywrightTimeout:  # no panel (this MLflow version, or already closed): nothing to close
        pass


RUN_NAME = '[col-id="attributes.`Run Name`"]'


def _expand(page, name: str) -> None:
    """Open a parent run's row in the runs table (the button before its name) onto its child runs."""
    row = page.locator("[role=row]").filter(has=page.get_by_role("link", name=name, exact=True))
    row.first.locator(f"{RUN_NAME} button").click()


def _show_columns(page, *metrics: str) -> None:
    page.get_by_role("button", name="Columns", exact=True).click()
    for metric in metrics:
        page.get_by_role("dialog").get_by_text(metric, exact=True).click()
    page.keyboard.press("Escape")


def _cell(page, run_id: str, metric: str):
    return page.locator(f'[role=row][row-id="{run_id}"] [role=gridcell][col-id="metrics.`{metric}`"]')


def test_mlflow_ui_reads_as_the_study(layout, params, mlflow_ui, page):
    """The link `locvit mlflow-ui` prints opens the study's run; its runs table opens onto the variants,
    whose test_top1_mean is results.csv's, and a variant onto its seeds."""
    import mlflow
    from playwright.sync_api import expect

    mlflow_ui, printed = mlflow_ui
    exp_id, runs, n_runs = _tracked_runs(layout, params)
    expected = {f"{v}-seed{s}" for v in params["variants"] for s in params["seeds"]}
    assert set(runs) == expected
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{layout.tracking_db}")
    (study_run,) = find(client, exp_id, study_tags("tiny"))
    variant_runs = {v: find(client, exp_id, variant_tags("tiny", v))[0] for v in params["variants"]}
    rows = {r["variant"]: r for r in csv.DictReader((layout.report / "results.csv").open())}

    page.goto(mlflow_ui)  # the home page lists the experiments
    expect(page.get_by_role("link", name="tiny", exact=True)).to_be_visible()
    _save(page, "experiments.png")

    # The link locvit mlflow-ui prints: the study's run, its variants as child runs.
    assert printed == f"{mlflow_ui}/#/experiments/{exp_id}/runs/{study_run.info.run_id}?workflowType=machine_learning"
    page.goto(printed)
    expect(page.get_by_role("heading", name="tiny")).to_be_visible()
    _close_assistant(page)
    for variant in params["variants"]:
        expect(page.get_by_role("link", name=variant, exact=True).first).to_be_visible()
    _save(page, "study-run.png")

    # The runs table: one row, the study's, which opens onto one row per variant with the table's numbers.
    page.get_by_role("link", name="Runs", exact=True).first.click()
    expect(page).to_have_url(re.compile(rf"#/experiments/{exp_id}/runs\b"))
    expect(page.locator(f'[role=row][row-id="{study_run.info.run_id}"]').first).to_be_visible()
    for variant, run in variant_runs.items():
        expect(page.locator(f'[role=row][row-id="{run.info.run_id}"]')).to_have_count(0)  # folded under the study
    _expand(page, "tiny")
    _show_columns(page, "test_top1_mean", "test_top1", "best_val_top1")
    for variant, run in variant_runs.items():
        cell = _cell(page, run.info.run_id, "test_top1_mean")
        expect(cell).to_be_visible()
        assert f"{float(cell.inner_text()):.2f}" == f"{float(rows[variant]['test_top1_mean']):.2f}", variant
    _save(page, "runs-tree.png")

    for variant in params["variants"]:  # each variant opens onto its seed runs, with their own values
        _expand(page, variant)
    for name, run in runs.items():
        row = page.locator(f'[role=row][row-id="{run.info.run_id}"]')
        expect(row.get_by_role("link", name=name, exact=True)).to_be_visible()
        for metric in ("test_top1", "best_val_top1"):
            text = _cell(page, run.info.run_id, metric).inner_text()
            assert float(text) == pytest.approx(run.data.metrics[metric], abs=1e-6), (name, metric, text)
    _save(page, "runs-tree-seeds.png")


def test_mlflow_ui_compares_two_variants_and_shows_system_metrics(layout, params, mlflow_ui, page):
    """The compare link of the report (and of `locvit mlflow-ui`) opens the variants side by side, then their
    validation curves; a seed run's system metrics are charted."""
    from playwright.sync_api import expect

    mlflow_ui, _ = mlflow_ui
    exp_id, runs, _ = _tracked_runs(layout, params)
    report = json.loads((layout.report / "report.json").read_text())
    link = report["mlflow"]["tree"]["compare_link"]
    assert link.startswith(params["tracking"]["ui_url"])
    page.goto(link.replace(params["tracking"]["ui_url"], mlflow_ui))  # the test's UI listens on another port
    expect(page.get_by_text(f"Comparing {len(params['variants'])} Runs", exact=False)).to_be_visible()
    for variant in params["variants"]:
        expect(page.get_by_text(variant, exact=True).first).to_be_visible()
    _close_assistant(page)
    _save(page, "compare-variants.png")
    # The metrics table renders only the rows in view (a variant run carries every statistic of its row):
    # scroll it until val_loss's row is there.
    charts = page.locator('a[title="Plot chart"]')
    val_loss = charts.filter(has_text=re.compile(r"^val_loss$"))
    for _ in range(40):
        if val_loss.count():
            break
        charts.last.scroll_into_view_if_needed()
        box = charts.last.bounding_box()
        page.mouse.move(box["x"] + 5, box["y"] + 5)
        page.mouse.wheel(0, 400)
        page.wait_for_timeout(300)
    for attempt in range(3):  # the table re-renders rows as they scroll in: a click can land on a row being replaced
        val_loss.click()
        try:
            expect(page).to_have_url(re.compile(r"#/metric\?"), timeout=20_000)
            break
        except AssertionError:
            if attempt == 2:
                raise
    for variant in params["variants"]:  # one curve per variant: the mean over its seeds, per epoch
        expect(page.get_by_text(f"{variant} (val_loss)", exact=True)).to_be_visible()
    _save(page, "compare-curves.png")

    variant, seed = next(iter(params["variants"])), params["seeds"][0]
    run = runs[f"{variant}-seed{seed}"]
    page.goto(f"{mlflow_ui}/#/experiments/{exp_id}/runs/{run.info.run_id}/system-metrics?workflowType=machine_learning")
    expect(page.get_by_text("cpu_utilization_percentage", exact=True).first).to_be_visible()
    expect(page.get_by_text("system_memory_usage_megabytes", exact=True).first).to_be_visible()
    _save(page, "system-metrics.png")


def test_mlflow_ui_shows_a_runs_metrics_and_report_plots(layout, params, mlflow_ui, page):
    from playwright.sync_api import expect

    mlflow_ui, _ = mlflow_ui
    exp_id, runs, _ = _tracked_runs(layout, params)
    variant, seed = next(iter(params["variants"])), params["seeds"][0]
    run = runs[f"{variant}-seed{seed}"]

    page.goto(f"{mlflow_ui}/#/experiments/{exp_id}/runs/{run.info.run_id}?workflowType=machine_learning")
    expect(page.get_by_role("heading", name=f"{variant}-seed{seed}")).to_be_visible()
    _close_assistant(page)
    for metric in ("test_top1", "best_val_top1"):
        value = page.get_by_role("row").filter(has=page.get_by_text(metric, exact=True))
        expect(value.first).to_contain_text(_as_shown(run.data.metrics[metric]))
    _save(page, "run-overview.png")

    page.get_by_role("tab", name="Artifacts").click()
    expect(page).to_have_url(re.compile(rf"/runs/{run.info.run_id}/artifacts"))
    page.get_by_text("report", exact=True).click()  # open the folder the report logs its plots to
    plot = f"als_{variant}.png"
    page.get_by_text(plot, exact=True).click()
    expect(page.get_by_text(f"report/{plot}", exact=True)).to_be_visible()
    image = page.locator("img[src^='blob:']").first  # the preview of the PNG, fetched from the server
    expect(image).to_be_visible()
    assert image.evaluate("img => img.complete && img.naturalWidth") > 0
    _save(page, "run-artifacts.png")


def test_mlflow_ui_models_tab_lists_every_runs_model(layout, params, mlflow_ui, page):
    from playwright.sync_api import expect

    mlflow_ui, _ = mlflow_ui
    exp_id, runs, _ = _tracked_runs(layout, params)
    page.goto(f"{mlflow_ui}/#/experiments/{exp_id}/models?workflowType=machine_learning")
    _close_assistant(page)
    for name in sorted(runs):  # each model row links the run that logged it
        expect(page.get_by_role("link", name=name, exact=True).first).to_be_visible()
    _save(page, "models-tab.png")
