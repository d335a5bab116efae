"""Every job reads exactly its job config (locvit.job_configs): the report, the throughput job and the mask
search's table run on the config `locvit job-configs` writes for them, read as a locvit.io.JobConfig, so a key
a job reads that its config lacks fails here; and given their config file they read no params file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from locvit.errors import InputError
from locvit.io import JobConfig
from locvit.job_configs import job_configs, report_config, search_table_config, throughput_config
from locvit.layout import StudyLayout


def test_a_job_config_names_a_key_its_job_reads_and_it_lacks():
    cfg = JobConfig({"study": "s", "analysis": {"profile_batch": 8}}, "--throughput-config t.json")
    assert cfg["analysis"]["profile_batch"] == 8 and "baseline" not in cfg
    with pytest.raises(InputError, match=r"--throughput-config t.json: no key 'baseline', which its job reads; "
                                         r"it holds 'study', 'analysis'"):
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
    assert report["variants"]["deit_a"]["seeds"] == [0, 1] and report["variants"]["deit_a"]["recipe"] == \
        {"cutmix": tiny_params["train"]["cutmix"], "mixup": tiny_params["train"]["mixup"]}
    assert "train" not in report and "model_modules" not in report  # per variant, resolved


def test_the_report_reads_only_its_config(tmp_path, tiny_params):
    """The report of a study whose runs wrote nothing yet, on its exact config: every key it reads is there.
    Without a key it reads (the equivalence margin) it fails naming it."""
    from locvit.report.build import build_report

    cfg = JobConfig(report_config(tiny_params), "report config")
    report = build_report(cfg, tmp_path, tmp_path / "report", log_to_mlflow=False)
    assert report["study"] == "tiny" and (tmp_path / "report" / "results.md").is_file()
    assert "report config.equivalence_margin" in cfg.read and "report config.variants" in cfg.read
    lacking = JobConfig({k: v for k, v in report_config(tiny_params).items() if k != "equivalence_margin"},
                        "report config")
    with pytest.raises(InputError, match="report config: no key 'equivalence_margin'"):
        build_report(lacking, tmp_path, tmp_path / "report2", log_to_mlflow=False)


def test_the_search_table_reads_only_its_config(tiny_params):
    from locvit.report.search import table_markdown

    cfg = JobConfig(search_table_config(tiny_params), "search table config")
    rows = [{"round": 0, "masked_heads_per_layer": [1, 1], "masked_heads": 2, "mean_als_masked": 0.5,
             "val_top1": 50.0, "test_top1": 49.0, "mlflow_run_id": "abc", "change": "initial"}]
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
    assert main(["throughput", "--params", nowhere, "--throughput-config", str(layout.job_config("throughput")),
                 "--out", str(layout.throughput_file), "--threads", "1"]) == 0
    assert main(["report", "--params", nowhere, "--report-config", str(layout.job_config("report")),
                 "--study-dir", str(layout.root), "--out-dir", str(layout.report), "--no-mlflow",
                 "--tracking-db", str(layout.tracking_db)]) == 0
    assert Path(layout.report_file("md")).is_file()
    assert "throughput of 2 variant(s)" in capsys.readouterr().out


def test_the_reports_tables_keep_the_order_of_params(tiny_params, tmp_path):
    """The config file's keys are sorted (its content is what re-runs a job); its ``order`` keeps params.yaml's
    order of the variants, which the report's tables follow (the baseline need not sort first)."""
    from locvit.job_configs import encode
    from locvit.report.study import load_study

    names = list(tiny_params["variants"])
    reordered = {**tiny_params, "variants": {n: tiny_params["variants"][n] for n in reversed(names)}}
    written = json.loads(encode(report_config(reordered)))
    assert list(written["variants"]) == sorted(names) and written["order"] == names[::-1]
    assert list(load_study(JobConfig(written, "report config"), tmp_path).variants) == names[::-1]
