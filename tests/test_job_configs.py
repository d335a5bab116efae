"""Every job reads exactly its job config (locvit.config.jobs): the report, the throughput job and the mask
search's table run on the config `locvit job-configs` writes for them, read as a locvit.io.JobConfig, so a key
a job reads that its config lacks fails here; and given their config file they read no params file."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml
from helpers import copy_workflow, snakemake

from locvit.config import load_schema, validate_params
from locvit.config.jobs import (
    changed_job_configs,
    job_configs,
    report_config,
    search_table_config,
    throughput_config,
    write_job_configs,
    write_plan_copies,
)
from locvit.errors import InputError
from locvit.io import JobConfig
from locvit.layout import StudyLayout


def test_a_job_config_names_a_key_its_job_reads_and_it_lacks():
    cfg = JobConfig({"study": "s", "analysis": {"profile_batch": 8}}, "--throughput-config t.json")
    assert cfg["analysis"]["profile_batch"] == 8 and "baseline" not in cfg
    with pytest.raises(
        InputError,
        match=r"--throughput-config t.json: no key 'baseline', which its job reads; "
        r"it holds 'study', 'analysis'",
    ):
        cfg["baseline"]
    with pytest.raises(InputError, match=r"--throughput-config t.json.analysis: no key 'profile_repeats'"):
        cfg["analysis"].get("profile_repeats", 2)  # a default would hide a config out of step with its job
    assert json.loads(json.dumps(cfg)) == {"study": "s", "analysis": {"profile_batch": 8}}
    assert cfg.read >= {"--throughput-config t.json.analysis", "--throughput-config t.json.baseline"}


def test_job_configs_writes_the_report_throughput_and_search_table_configs(tiny_params):
    layout = StudyLayout.of(tiny_params)
    configs = job_configs(tiny_params)
    assert configs[layout.job_config("report")] == report_config(tiny_params)
    assert configs[layout.job_config("throughput")] == throughput_config(tiny_params)
    assert configs[layout.job_config("search_table")] == search_table_config(tiny_params)
    report = configs[layout.job_config("report")]
    assert set(report["variants"]) == set(tiny_params["variants"])
    assert report["variants"]["deit_a"]["seeds"] == [0, 1] and report["variants"]["deit_a"]["recipe"] == {
        "cutmix": tiny_params["train"]["cutmix"],
        "mixup": tiny_params["train"]["mixup"],
    }
    assert "train" not in report and "model_modules" not in report  # per variant, resolved


def test_the_report_reads_only_its_config(tmp_path, tiny_params):
    """The report of a study whose runs wrote nothing yet, on its exact config: every key it reads is there.
    Without a key it reads (the equivalence margin) it fails naming it."""
    from locvit.report.build import build_report

    cfg = JobConfig(report_config(tiny_params), "report config")
    report = build_report(cfg, tmp_path, tmp_path / "report", log_to_mlflow=False)
    assert report["study"] == "tiny" and (tmp_path / "report" / "results.md").is_file()
    assert "report config.equivalence_margin" in cfg.read and "report config.variants" in cfg.read
    lacking = JobConfig(
        {k: v for k, v in report_config(tiny_params).items() if k != "equivalence_margin"}, "report config"
    )
    with pytest.raises(InputError, match="report config: no key 'equivalence_margin'"):
        build_report(lacking, tmp_path, tmp_path / "report2", log_to_mlflow=False)


def test_the_search_table_reads_only_its_config(tiny_params):
    from locvit.report.search import table_markdown

    cfg = JobConfig(search_table_config(tiny_params), "search table config")
    rows = [
        {
            "round": 0,
            "masked_heads_per_layer": [1, 1],
            "masked_heads": 2,
            "mean_als_masked": 0.5,
            "val_top1": 50.0,
            "test_top1": 49.0,
            "mlflow_run_id": "abc",
            "change": "initial",
        }
    ]
    assert "MaiT mask search: tiny, variant mait_b, seed 0" in table_markdown(rows, cfg)
    with pytest.raises(InputError, match="no key 'study'"):
        table_markdown(rows, JobConfig({"mask_search": tiny_params["mask_search"]}, "search table config"))


def test_the_throughput_job_reads_only_its_config(tmp_path, tiny_params):
    from locvit.analysis.throughput import measure_throughput

    raw = throughput_config(tiny_params)
    raw["analysis"] = {"profile_batch": 2, "profile_repeats": 1, "throughput_rounds": 3}  # a fraction of a second
    rows = measure_throughput(JobConfig(raw, "throughput config"), tmp_path / "throughput.csv", threads=1)
    assert list(rows) == ["deit_a", "mait_b"]
    del raw["models"]["mait_b"]["device"]
    with pytest.raises(InputError, match=r"throughput config.models.mait_b: no key 'device'"):
        measure_throughput(JobConfig(raw, "throughput config"), tmp_path / "again.csv", threads=1)


def test_given_their_config_files_the_jobs_read_no_params_file(tmp_path, tiny_params, capsys):
    """`locvit report --report-config` and `locvit throughput --throughput-config` with --params naming a file
    that does not exist: they run, from their config files alone."""
    from locvit.cli import main

    layout = StudyLayout(tmp_path / "tiny")
    configs = {"report": report_config(tiny_params), "throughput": throughput_config(tiny_params)}
    configs["throughput"]["analysis"] = {"profile_batch": 2, "profile_repeats": 1, "throughput_rounds": 3}
    for job, cfg in configs.items():
        layout.job_config(job).parent.mkdir(parents=True, exist_ok=True)
        layout.job_config(job).write_text(json.dumps(cfg))
    nowhere = str(tmp_path / "no_params.yaml")
    assert (
        main(
            [
                "throughput",
                "--params",
                nowhere,
                "--throughput-config",
                str(layout.job_config("throughput")),
                "--out",
                str(layout.throughput_file),
                "--threads",
                "1",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "report",
                "--params",
                nowhere,
                "--report-config",
                str(layout.job_config("report")),
                "--study-dir",
                str(layout.root),
                "--out-dir",
                str(layout.report),
                "--no-mlflow",
                "--tracking-db",
                str(layout.tracking_db),
            ]
        )
        == 0
    )
    assert Path(layout.report_file("md")).is_file()
    assert "throughput of 2 variant(s)" in capsys.readouterr().out


def test_the_reports_tables_keep_the_order_of_params(tiny_params, tmp_path):
    """The config file's keys are sorted (its content is what re-runs a job); its ``order`` keeps params.yaml's
    order of the variants, which the report's tables follow (the baseline need not sort first)."""
    from locvit.config.jobs import encode
    from locvit.report.study import load_study

    names = list(tiny_params["variants"])
    reordered = {**tiny_params, "variants": {n: tiny_params["variants"][n] for n in reversed(names)}}
    written = json.loads(encode(report_config(reordered)))
    assert list(written["variants"]) == sorted(names) and written["order"] == names[::-1]
    assert list(load_study(JobConfig(written, "report config"), tmp_path).variants) == names[::-1]


def test_only_the_changed_configs_are_written_and_a_plan_copies_them_aside(tmp_path, monkeypatch, raw_tiny):
    """changed_job_configs reads only; write_job_configs writes what it found; a plan's copies go under their
    folder (replacing an earlier plan's), the study's files untouched."""
    monkeypatch.chdir(tmp_path)
    params = validate_params(raw_tiny)
    assert set(changed_job_configs(params)) == set(job_configs(params)) and not Path("results").exists()
    assert set(write_job_configs(params)) == set(job_configs(params)) and changed_job_configs(params) == {}
    raw_tiny["variants"]["deit_a"]["train"] = {"lr": 0.001}
    changed = changed_job_configs(validate_params(raw_tiny))
    layout = StudyLayout.of(params)
    assert set(changed) == {layout.train_config("deit_a", 0), layout.train_config("deit_a", 1)}
    before = {path: (path.read_text(), path.stat().st_mtime_ns) for path in job_configs(params)}
    stale = tmp_path / "plan" / "results" / "earlier.json"
    stale.parent.mkdir(parents=True)
    stale.write_text("{}")
    copies = write_plan_copies(changed, tmp_path / "plan")
    assert {copy.relative_to(tmp_path / "plan") for copy in copies.values()} == set(changed)
    assert json.loads(copies[layout.train_config("deit_a", 0)].read_text())["train"]["lr"] == 0.001
    assert not stale.exists()  # an earlier plan's copy
    assert {path: (path.read_text(), path.stat().st_mtime_ns) for path in job_configs(params)} == before


def _files(work: Path) -> dict[str, int]:
    """Every file of ``work`` but Snakemake's own folder, with its modification time."""
    return {
        str(p.relative_to(work)): p.stat().st_mtime_ns
        for p in work.rglob("*")
        if p.is_file() and ".snakemake" not in p.relative_to(work).parts
    }


LIMITS = {k: v["default"] for k, v in load_schema()["properties"]["limits"]["properties"].items()}


@pytest.mark.e2e
@pytest.mark.parametrize("bound", ["max_seeds_per_variant", "max_runs"])
def test_a_study_at_its_limits_plans_in_under_a_minute_and_writes_nothing(tmp_path, raw_tiny, bound):
    """A study at the default limits (one variant with the most seeds; the most runs, a job each) plans quickly,
    and its dry run leaves every file of the checkout as it was: the job configs it would write are read from
    copies in Snakemake's folder. Every command line stays short enough for any shell (128 KiB, Linux's most for
    one argument, as in `bash -c`): a variant's lists its seeds' files, the report's and throughput's no run's."""
    work = copy_workflow(tmp_path)
    seeds = LIMITS["max_seeds_per_variant"]
    variants = 1 if bound == "max_seeds_per_variant" else LIMITS["max_runs"] // seeds
    del raw_tiny["mask_search"]
    raw_tiny.update(
        seeds=list(range(seeds)),
        train_jobs="per_variant" if variants == 1 else "per_run",
        variants={f"v{i}": raw_tiny["variants"]["deit_a"] for i in range(variants)},
    )
    (work / "bound.yaml").write_text(yaml.safe_dump(raw_tiny))
    before = _files(work)
    start = time.monotonic()
    out = snakemake(work, "-n", "-p", "all", "--config", "params=bound.yaml", timeout=300)
    took = time.monotonic() - start
    assert took < 60, took
    assert _files(work) == before
    trains = sum(1 for line in out.stdout.splitlines() if line.startswith("rule train:"))
    assert trains == (1 if variants == 1 else variants * seeds)
    plan = work / ".snakemake" / "locvit-plan" / "results" / "tiny" / "config" / "train"
    assert len(list(plan.rglob("*.json"))) == variants * seeds
    assert f"the {variants * seeds + 4} missing or changed" in out.stderr  # and prepare, analyse, throughput, report
    commands = [line for line in out.stdout.splitlines() if " -m locvit " in line]
    assert len(commands) >= 5 and max(map(len, commands)) < 128 * 1024  # report's, throughput's: no list of runs


@pytest.mark.e2e
def test_a_dry_run_after_a_change_plans_its_jobs_from_copies(tmp_path, raw_tiny, monkeypatch):
    """The study's configs as a run wrote them, then one variant's lr changed: the dry run plans that variant's
    training from a copy of its new config, and the study's files keep their content and times."""
    work = copy_workflow(tmp_path)
    monkeypatch.chdir(work)
    write_job_configs(validate_params(raw_tiny))
    raw_tiny["variants"]["mait_b"]["train"] = {"lr": 0.001}
    (work / "study.yaml").write_text(yaml.safe_dump(raw_tiny))
    before = _files(work)
    out = snakemake(work, "-n", "-p", "all", "--config", "params=study.yaml")
    assert _files(work) == before
    assert "the 3 missing or changed" in out.stderr  # mait_b's two run configs and the search's (its variant)
    copy = ".snakemake/locvit-plan/results/tiny/config/train/mait_b/seed0.json"
    assert (
        f"--run-config {copy} " in out.stdout
        and "--run-config results/tiny/config/train/deit_a/seed0.json " in out.stdout
    )
    assert json.loads((work / copy).read_text())["train"]["lr"] == 0.001


def test_a_split_per_seed_gives_each_seed_its_own_data_folder(tiny_params):
    """data.split: per_seed: seed k's runs train and are scored on data/seed<k>/, prepared with split_seed + k
    (the same folder for every variant); fixed: one data/ for every seed. dvc.yaml's stages refuse it."""
    from locvit.config import ConfigError
    from locvit.config.run import data_folders
    from locvit.versioning import stage_targets

    data = {**tiny_params["data"], "split_seed": 5}
    fixed = validate_params({**tiny_params, "data": data, "seeds": [0, 2], "train_jobs": "per_run"}, check_models=False)
    assert data_folders(fixed) == {"data": (1.0, 5)}
    assert "split" not in job_configs(fixed)[StudyLayout.of(fixed).train_config("deit_a", 2)]["data"]  # as before
    assert StudyLayout.of(fixed).data_files(seed=2)["test"] == StudyLayout.of(fixed).root / "data" / "test.beton"
    params = validate_params({**fixed, "data": {**data, "split": "per_seed"}}, check_models=False)
    layout = StudyLayout.of(params)
    assert data_folders(params) == {"data/seed0": (1.0, 5), "data/seed2": (1.0, 7)}
    prepares = {p: c for p, c in job_configs(params).items() if p.parent == layout.configs / "prepare" / "data"}
    assert {p.name: c["split_seed"] for p, c in prepares.items()} == {"seed0.json": 5, "seed2.json": 7}
    assert all("split" not in c for c in prepares.values())  # a folder's split is its split_seed
    assert layout.data_files(seed=2)["test"] == layout.root / "data" / "seed2" / "test.beton"
    run = job_configs(params)[layout.train_config("deit_a", 2)]["data"]
    assert run["split"] == "per_seed" and run["split_seed"] == 7  # MLflow records the split it trained on
    with pytest.raises(InputError, match="data.split: per_seed: dvc.yaml's stages describe one split"):
        stage_targets(params, "prepare")
    with pytest.raises(ConfigError, match="data.split: per_seed gives each seed its own training files"):
        validate_params({**params, "train_jobs": "per_variant"}, check_models=False)


def test_a_run_of_a_split_per_seed_reads_only_its_seeds_split():
    """train, evaluate and analyse refuse another seed's files (check_split); a fixed split's run is not checked."""
    from locvit.data.prepare import check_split

    cfg = {"variant": "deit", "seed": 2, "data": {"split": "per_seed", "split_seed": 7}}
    check_split(cfg, {"split_seed": 7}, Path("r/data/seed2/manifest.json"))
    with pytest.raises(InputError, match=r"split seed 5, but deit seed 2 has its own split .* data/seed2/'s files"):
        check_split(cfg, {"split_seed": 5}, Path("r/data/seed0/manifest.json"))
    check_split({**cfg, "data": {"split_seed": 7}}, {"split_seed": 5}, Path("m.json"))
