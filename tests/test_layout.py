"""The study layout (locvit.layout): one module says where a study's files live.

The Snakemake rules, the CLI, the report, tracking and the UI ask it; dvc.yaml spells
the same folders with its own templating, checked here against the module. An end-to-end
run with a non-default results_dir: tests/test_pipeline.py (Snakemake) and
tests/test_dvc.py (dvc repro).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from locvit.layout import StudyLayout, per_seed, seed_name

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


def test_snakemake_wildcards_pass_through():
    layout = StudyLayout(Path("r/s"))
    assert str(layout.run_dir("{variant}", "{seed}")) == "r/s/runs/{variant}/seed{seed}"
    assert str(layout.data_files(name="{datadir}")["val"]) == "r/s/{datadir}/val.beton"
    assert seed_name("{seed}") == "seed{seed}"


def test_dvc_yaml_spells_the_layout():
    """Every study path in dvc.yaml is ${results_dir}/${study}/<a path the layout gives>."""
    text = (ROOT / "dvc.yaml").read_text()
    assert "results/" not in text.replace("${results_dir}/", ""), "dvc.yaml hard-codes a results folder"
    used = set(re.findall(r"\$\{results_dir\}/\$\{study\}/([^\s:]+)", text))
    assert used, "dvc.yaml names no study path"
    layout, v = StudyLayout(Path("R")), "${key}"
    known = {layout.data_dir(), *layout.data_files().values(), layout.runs_dir(v), layout.eval, layout.eval_dir(v),
             layout.analysis, layout.analysis_dir(v), layout.maps, layout.maps_dir(v), layout.report,
             layout.tracking_db}
    known = {str(p.relative_to("R")) for p in known}
    report = {u for u in used if u.startswith("report/")}
    assert used - report <= known, f"dvc.yaml paths the layout does not give: {sorted(used - report - known)}"


@pytest.mark.parametrize("module", ["cli", "tracking/ui", "tracking/backend", "tracking/run", "tracking/sync",
                                    "report/study", "report/build"])
def test_no_module_spells_the_layout_itself(module):
    """The folder names of a study appear in locvit.layout only."""
    path = ROOT / "src" / "locvit" / f"{module}.py"
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    for spelled in ('"mlflow.db"', '"mlartifacts"', '/ "eval"', '/ "runs"', '/ "analysis"', '/ "maps"',
                    'f"seed{'):
        assert spelled not in text, f"{path.name} spells {spelled} itself; ask locvit.layout"
