"""The study layout (locvit.layout): one module says where a study's files live.

The Snakemake rules, the CLI, the report, tracking and the UI ask it; dvc.yaml spells
the same folders with its own templating, checked here against the module. An end-to-end
run with a non-default results_dir: tests/test_pipeline.py (Snakemake) and
tests/test_dvc.py (dvc repro). Also what the workflow's files declare beside the layout: each job's code
digest and the Snakefile's minimum Snakemake.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from locvit.layout import REPORT_FILES, ROUND_FILES, SEARCH_TABLE, RunFiles, StudyLayout, per_seed, seed_name
from locvit.versioning import STAGE_COMMANDS, code_digest, dvc_yaml, stage_code

ROOT = Path(__file__).resolve().parents[1]


def test_paths_of_a_study():
    layout = StudyLayout.of({"results_dir": "out/x", "study": "s", "data": {"train_fraction": 1.0}})
    assert layout.root == Path("out/x/s")
    assert layout.data_files()["train"] == Path("out/x/s/data/train.beton")
    assert layout.data_files(1.0)["manifest"] == Path("out/x/s/data/manifest.json")
    assert layout.data_files(0.25)["test"] == Path("out/x/s/data_25pct/test.beton")
    assert layout.run_dir("deit", 2) == Path("out/x/s/runs/deit/seed2")
    assert layout.eval_file("deit", 2) == Path("out/x/s/eval/deit/seed2.json")
    assert layout.analysis_file("deit", 0) == Path("out/x/s/analysis/deit/seed0.json")
    assert layout.profile_file("deit") == Path("out/x/s/analysis/deit/profile.json")
    assert layout.maps_file("deit", 0) == Path("out/x/s/maps/deit/seed0.npz")
    assert layout.search_round(1) == Path("out/x/s/search/round1")
    assert layout.tracking_db == Path("out/x/s/mlflow.db") and layout.artifacts == Path("out/x/s/mlartifacts")
    assert per_seed("a/b", [0, 3], ".json") == [Path("a/b/seed0.json"), Path("a/b/seed3.json")]


def test_dvc_yaml_lists_a_studys_own_model_code(tmp_path, monkeypatch, raw_tiny, capsys):
    """`locvit dvc-yaml` beside a params.yaml with ``model_modules``: the family's file and the user's helper it
    imports are dependencies of every stage that builds models, so editing them re-runs those under `dvc repro`
    as under Snakemake (tests/test_family_plugin.py); `locvit validate` says when dvc.yaml lacks them."""
    from locvit.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_family.py").write_text("import my_helper\n")
    (tmp_path / "my_helper.py").write_text("SIDE = 3\n")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({**raw_tiny, "model_modules": ["my_family"]}))
    (tmp_path / "dvc.yaml").write_text(dvc_yaml())  # the study's dvc.yaml before its family
    assert "dvc.yaml does not list my_family.py, my_helper.py" in _validate_note(main, capsys)
    main(["dvc-yaml"])
    stages = yaml.safe_load((tmp_path / "dvc.yaml").read_text())["stages"]
    deps = {name: stage.get("do", stage)["deps"] for name, stage in stages.items()}
    for name in ("train", "evaluate", "analyse", "report"):
        assert {"my_family.py", "my_helper.py"} <= set(deps[name]), name
    assert not {"my_family.py", "my_helper.py"} & set(deps["configs"] + deps["prepare"])
    assert "dvc.yaml does not list" not in _validate_note(main, capsys)


def _validate_note(main, capsys) -> str:
    capsys.readouterr()
    main(["validate", "--params", "params.yaml"])
    return capsys.readouterr().out


def test_snakemake_wildcards_pass_through():
    layout = StudyLayout(Path("r/s"))
    assert str(layout.run_dir("{variant}", "{seed}")) == "r/s/runs/{variant}/seed{seed}"
    assert str(layout.data_files(name="{datadir}")["val"]) == "r/s/{datadir}/val.beton"
    assert seed_name("{seed}") == "seed{seed}"


def test_dvc_yaml_is_generated_from_the_layout_and_the_imports():
    """dvc.yaml is what `locvit dvc-yaml` writes: every study path from this module (with DVC's
    ${results_dir}/${study} and foreach ${key}), every stage's code from its commands' imports."""
    assert (ROOT / "dvc.yaml").read_text() == dvc_yaml(), "dvc.yaml is stale: run `locvit dvc-yaml`"
    text = (ROOT / "dvc.yaml").read_text()
    assert "results/" not in text.replace("${results_dir}/", ""), "dvc.yaml hard-codes a results folder"
    stages = yaml.safe_load(text)["stages"]
    layout, v = StudyLayout(Path("${results_dir}/${study}")), "${key}"
    assert str(layout.train_configs(v)) in stages["train"]["do"]["deps"]
    assert str(layout.job_config("report")) in stages["report"]["deps"]  # the baseline, the margin, ...
    assert stages["configs"]["params"] == [{"params.yaml": None}]  # every key, written out or a default


def test_each_stage_depends_on_the_code_its_commands_import():
    """Per-stage code: the report's stage holds the report package, evaluation none of it; training holds
    the engine, the analysis stage does not; every stage holds the CLI and the config."""
    code = {stage: set(stage_code(stage)) for stage in STAGE_COMMANDS}
    assert "src/locvit/report/build.py" in code["report"] and not any("report" in c for c in code["evaluate"])
    assert "src/locvit/train/engine.py" in code["train"] and "src/locvit/train/engine.py" not in code["analyse"]
    assert "src/locvit/analysis/analyse.py" in code["analyse"]
    held = [
        any(f == p or f.startswith(p + "/") for p in c)
        for c in code.values()
        for f in ("src/locvit/cli.py", "src/locvit/config/__init__.py")
    ]
    assert all(held)  # a file, or the package folder holding it
    for stage, paths in code.items():
        assert all((ROOT / p).exists() for p in paths), stage


def test_a_jobs_code_digest_follows_the_source_not_its_place(tmp_path):
    """A rule's `code` param (locvit.versioning.code_digest): the same source elsewhere gives the same digest;
    a change to a module only the report imports changes the report's and no other command's."""
    import shutil

    commands = ("prepare", "train", "evaluate", "analyse", "throughput", "report", "search-spec", "search-table")
    here = {c: code_digest(c) for c in commands}
    copy = tmp_path / "elsewhere" / "locvit"
    shutil.copytree(ROOT / "src" / "locvit", copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert {c: code_digest(c, package=copy) for c in commands} == here
    tables = copy / "report" / "tables.py"
    tables.write_text(tables.read_text() + "\nEDITED = True\n")
    changed = {c for c in commands if code_digest(c, package=copy) != here[c]}
    assert changed == {"report"}


def test_the_snakefile_asks_for_the_snakemake_the_suite_runs():
    """min_version at the Snakefile's top: an older Snakemake stops with a message before anything runs."""
    from importlib.metadata import version

    lines = (ROOT / "Snakefile").read_text().splitlines()  # Snakemake's syntax: read as lines
    calls = [(i, m.group(1)) for i, line in enumerate(lines) if (m := re.match(r'min_version\("([^"]+)"\)', line))]
    assert [v for _, v in calls] == [version("snakemake")]
    assert calls[0][0] < next(i for i, line in enumerate(lines) if line.startswith("from locvit"))


@pytest.mark.parametrize(
    "module",
    ["cli", "tracking/ui", "tracking/backend", "tracking/run", "tracking/sync", "report/study", "report/build"],
)
def test_no_module_spells_the_layout_itself(module):
    """The folder names of a study appear in locvit.layout only."""
    path = ROOT / "src" / "locvit" / f"{module}.py"
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    for spelled in ('"mlflow.db"', '"mlartifacts"', '/ "eval"', '/ "runs"', '/ "analysis"', '/ "maps"', 'f"seed{'):
        assert spelled not in text, f"{path.name} spells {spelled} itself; ask locvit.layout"


def spelled_file_names(text: str, names: set[str]) -> list[str]:
    """The string literals of Python source that are one of ``names`` or a path ending in one (an f-string's
    literal parts included); prose that mentions a name (a docstring, a help text) is not a path."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value.strip()
            if not any(c.isspace() for c in value) and any(
                value == n or value.endswith(("/" + n, "}" + n)) for n in names
            ):
                found.append(value)
    return found


def test_no_file_outside_the_layout_spells_a_run_or_study_file_name():
    """A run's files (RunFiles), the report's, the search's: named in locvit.layout only, in src/ and in
    the rules (whose Python is read as Python)."""
    names = {
        "last.pt",
        "best.pt",
        "metrics.json",
        "mlflow_run.json",
        *REPORT_FILES.values(),
        *SEARCH_TABLE.values(),
        *ROUND_FILES.values(),
        "throughput.csv",
    }
    sources = (
        [p for p in (ROOT / "src" / "locvit").rglob("*.py") if p.name != "layout.py"]
        + sorted((ROOT / "workflow" / "rules").glob("*.smk"))
        + [ROOT / "Snakefile"]
    )
    offenders = {}
    for path in sources:
        text = path.read_text()
        if path.suffix != ".py":  # Snakemake's keywords are not Python: check each line's quoted strings
            text = "\n".join(repr(s) for s in re.findall(r"f?\"([^\"\n]*)\"", text))
        found = spelled_file_names(text, names)
        if found:
            offenders[str(path.relative_to(ROOT))] = found
    assert offenders == {}, "spelled outside locvit.layout; ask it (RunFiles, report_file, round_file)"


def test_the_file_name_check_sees_a_spelled_name():
    assert spelled_file_names(
        'x = out / "best.pt"\ny = f"{d}/metrics.json"\n"""mentions best.pt"""', {"best.pt", "metrics.json"}
    ) == ["best.pt", "/metrics.json"]
    assert RunFiles.at("r/s").best == Path("r/s/best.pt") and RunFiles.at("r").record.name == "mlflow_run.json"
