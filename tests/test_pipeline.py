"""End to end: the whole Snakemake DAG on the tiny preset, read back as a user would.

One real Snakemake run (prepare -> train x 4 -> evaluate -> analyse -> report, and a
two-round MaiT mask search) in a temporary copy of the workflow; the MLflow runs are
read back with the MLflow client.
"""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import BIN, copy_workflow, env_with_venv

pytestmark = pytest.mark.e2e
TINY = "presets/tiny.yaml"


def snakemake(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(BIN / "snakemake"), *args], cwd=cwd, env=env_with_venv(), capture_output=True,
                          text=True, timeout=1200)
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """A finished tiny study (the working directory of the run)."""
    work = copy_workflow(tmp_path_factory.mktemp("study"))
    snakemake(work, "--cores", "2", "all", "--config", f"params={TINY}")
    return work


@pytest.fixture(scope="module")
def params(study) -> dict:
    from locvit.config import load_params

    return load_params(study / TINY)


def test_every_output_is_there(study, params):
    root = study / "results" / "tiny"
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
        assert profile["params"] > 0 and profile["gmacs"] > 0 and profile["train_images_per_s"] > 0
        assert profile["device"].startswith("cpu")
    report = json.loads((root / "report" / "report.json").read_text())
    assert {"mait_table2", "mait_table3", "mait_table4"} <= set(report["tables"])
    for name in ("curves", "als_deit_a", "als_mait_b", "similarity_mait_b", "rollout_mait_b"):
        assert (root / "report" / report["figures"][name]["png"]).read_bytes()[:4] == b"\x89PNG"
    assert not list(root.rglob("*.tmp"))  # no temporary file left behind


def test_mlflow_has_one_complete_run_per_variant_and_seed(study, params):
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{study / 'results' / 'tiny' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny")
    assert exp is not None
    runs = [r for r in client.search_runs([exp.experiment_id]) if r.data.tags["variant"] in params["variants"]]
    assert len(runs) == len(params["variants"]) * len(params["seeds"])
    seen = set()
    for run in runs:
        tags, data = run.data.tags, run.data
        seen.add((tags["variant"], int(tags["seed"])))
        assert run.info.status == "FINISHED"
        assert tags["study"] == "tiny" and tags["dataset"] == "digits"
        assert tags["model"] == params["variants"][tags["variant"]]["model"]
        assert len(tags["data_hash"]) == 16 and tags["git_commit"]
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


def test_results_table_matches_the_evaluations(study, params):
    report = study / "results" / "tiny" / "report"
    rows = list(csv.DictReader((report / "results.csv").open()))
    assert [r["variant"] for r in rows] == list(params["variants"])
    md = (report / "results.md").read_text()
    tex = (report / "results.tex").read_text()
    for row in rows:
        evals = [json.loads((study / "results" / "tiny" / "eval" / row["variant"] / f"seed{s}.json").read_text())
                 for s in params["seeds"]]
        accs = [100 * e["test_top1"] for e in evals]
        assert float(row["test_top1_mean"]) == pytest.approx(sum(accs) / len(accs))
        assert int(row["seeds"]) == 2 and row["missing_seeds"] == ""
        assert set(row["mlflow_run_ids"].split()) == {e["mlflow_run_id"] for e in evals}
        assert f"| {row['variant']} |" in md and row["variant"].replace("_", r"\_") in tex
    assert "±" in md and r"\toprule" in tex


def test_rerun_with_nothing_changed_does_nothing(study):
    out = snakemake(study, "--cores", "2", "all", "--config", f"params={TINY}")
    assert "Nothing to be done" in out.stdout + out.stderr


def _planned(dry_run_output: str, rule: str) -> list[str]:
    """The wildcards of every job of ``rule`` in a dry run's output."""
    jobs = dry_run_output.split("\nrule ")[1:]
    return [line.strip() for job in jobs if job.startswith(f"{rule}:")
            for line in job.splitlines() if line.strip().startswith("wildcards:")]


def test_changing_one_variant_retrains_only_that_variant(study):
    changed = yaml.safe_load((study / TINY).read_text())
    changed["variants"]["mait_b"]["train"] = {"lr": 0.001}
    (study / "changed.yaml").write_text(yaml.safe_dump(changed))
    out = snakemake(study, "-n", "all", "--config", "params=changed.yaml")
    assert sorted(_planned(out.stdout, "train")) == ["wildcards: variant=mait_b, seed=0",
                                                     "wildcards: variant=mait_b, seed=1"]
    # (search_* jobs reuse these rules; the search re-runs too: mait_b is its base variant)
    assert [w for w in _planned(out.stdout, "evaluate") if "variant=" in w] == ["wildcards: variant=mait_b"]
    assert [w for w in _planned(out.stdout, "analyse") if "variant=" in w] == ["wildcards: variant=mait_b"]
    assert "rule prepare:" not in out.stdout


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


def test_lint_is_clean(repo):
    out = snakemake(repo, "--lint")
    assert "Congratulations, your workflow is in a good condition!" in out.stdout + out.stderr


def test_cluster_profile_dry_run(repo, tmp_path):
    work = copy_workflow(tmp_path)
    out = snakemake(work, "-n", "--profile", "cluster", "all", "--config", f"params={TINY}")
    text = out.stdout + out.stderr
    assert "Using profiles cluster" in text
    assert "slurm_partition=gpu" in text and "gpu=1" in text  # training jobs ask for a GPU


@pytest.mark.parametrize("preset", sorted(p.name for p in (Path(__file__).parents[1] / "presets").glob("*.yaml")))
def test_every_preset_dry_runs_on_the_cluster_profile(repo, tmp_path, preset):
    """Each paper study stays valid: its whole DAG plans on the SLURM profile."""
    from locvit.config import load_params

    params = load_params(repo / "presets" / preset)
    work = copy_workflow(tmp_path)
    out = snakemake(work, "-n", "--profile", "cluster", "all", "--config", f"params=presets/{preset}")
    stats = out.stdout.split("Job stats:")[1]
    train_jobs = next(int(line.split()[1]) for line in stats.splitlines() if line.startswith("train "))
    assert train_jobs == len(params["variants"]) * len(params["seeds"])


def test_mask_search_follows_the_previous_rounds_als(study, params):
    from locvit.analysis.search import next_spec

    search = study / "results" / "tiny" / "search"
    spec0 = json.loads((search / "round0" / "spec.json").read_text())
    als0 = json.loads((search / "round0" / "analysis.json").read_text())["als"]
    spec1 = json.loads((search / "round1" / "spec.json").read_text())
    expected = next_spec(1, spec0, als0, params["mask_search"]["all_above"], params["mask_search"]["remove_below"])
    assert spec1["masked_heads"] == expected["masked_heads"]
    # Round 1 trained with exactly those masks (its checkpoint's config), and the table reports both rounds.
    import torch

    state = torch.load(search / "round1" / "best.pt", weights_only=True)
    assert state["config"]["model_kwargs"]["masked_heads"] == spec1["masked_heads"]
    table = json.loads((study / "results" / "tiny" / "report" / "mask_search.json").read_text())
    assert [r["round"] for r in table["rounds"]] == [0, 1]
    assert table["searched_masked_heads"] == spec1["masked_heads"]


def test_html_report_has_every_figure_with_its_caption(study):
    snakemake(study, "--report", "report.html", "--config", f"params={TINY}")
    html = (study / "report.html").read_text()
    assert "Attention Locality Score (MaiT Eq. 3, Fig. 3) of variant" in html
    for name in ("als_mait_b.png", "similarity_mait_b.png", "rollout_deit_a.png", "curves.png", "mait_table2.csv"):
        assert name in html


def test_report_names_a_missing_run(study, params, tmp_path):
    """Re-run the report on a copy of the study with one evaluation removed."""
    import shutil

    copy = tmp_path / "tiny"
    shutil.copytree(study / "results" / "tiny", copy, ignore=shutil.ignore_patterns("data", "mlartifacts"))
    (copy / "eval" / "mait_b" / "seed1.json").unlink()
    out = subprocess.run([str(BIN / "locvit"), "report", "--params", str(study / TINY), "--study-dir", str(copy),
                          "--out-dir", str(copy / "report"), "--tracking-db", str(copy / "mlflow.db"),
                          "--no-mlflow"], capture_output=True, text=True, env=env_with_venv())
    assert out.returncode == 0, out.stderr
    assert "missing: mait_b seed 1" in (copy / "report" / "tables" / "mait_table2.md").read_text()
    assert "missing seed(s) 1" in (copy / "report" / "results.md").read_text()
