"""Figures in the docs come from files: the prose check (doctools/doc_figures.py) and value spans.

* No figure (a number with a unit) stands in the prose of README.md, docs/*.md or the READMEs of
  benchmarks/ and tests/ outside a generated table, a value span, code, or a line an allowed pattern
  matches; a planted figure fails the check.
* The allow-list is short, every entry has a reason, and no entry exempts lines wholesale.
* A value span renders the value its key names, from JSON, YAML and CSV, and a stale one is listed.
* The params reference in docs/pipeline.md is rendered from the schema.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from doctools import doc_figures, doc_tables, publish

REPO = Path(__file__).resolve().parents[1]


def test_the_docs_carry_no_figure_outside_a_files_keeping():
    found = doc_figures.check()
    assert found == [], "figures in prose (put each in a value span or a generated table):\n" + "\n".join(found)


@pytest.mark.parametrize(
    "planted",
    [
        "The demo takes 17.0 min on two cores.",
        "It ran 789 tests in 20 min 54 s.",
        "DeiT reaches 97.87 % on the test split.",
        "FFCV feeds 2.91× faster than the DataLoader.",
        "The wheelhouse weighs 25.5 MiB.",
        "Each seed trains 25 epochs on 1,167 images.",
    ],
)
def test_a_planted_figure_fails_the_check(planted):
    text = f"# A doc\n\nSome prose.\n{planted}\n"
    assert doc_figures.figures(text), planted


def test_figures_in_generated_places_pass():
    text = (
        "# A doc\n\n<!-- table: results x.csv -->\n| a | 97.87 % |\n<!-- /table -->\n"
        "took <!-- value benchmarks/results/pipeline.json demo_wall_s -->1021.4<!-- /value --> s\n"
        "```bash\nsleep 5 s\n```\nrun `--epochs 25 epochs`\nthe 95 % interval\n"
    )
    assert doc_figures.figures(text) == []


def test_the_allow_list_is_short_and_each_entry_says_why():
    assert 0 < len(doc_figures.ALLOWED) <= 20
    plain = ["", "Some prose.", "The demo takes 17.0 min on two cores.", "x" * 80]
    for pattern, reason in doc_figures.ALLOWED:
        assert len(reason.split()) >= 5, f"{pattern!r} needs a reason"
        compiled = re.compile(pattern)
        assert not any(compiled.search(line) for line in plain), f"{pattern!r} matches lines wholesale"


def test_a_value_span_renders_its_key(tmp_path, monkeypatch):
    (tmp_path / "a.json").write_text('{"run": {"wall_s": 630.25, "seeds": [0, 1, 2]}}')
    (tmp_path / "b.yaml").write_text("train:\n  epochs: 25\n")
    (tmp_path / "c.csv").write_text("variant,seed,top1\ndeit,0,96.9\ndeit,1,98.6\nconvit,0,84.72\n")
    monkeypatch.setattr(doc_tables, "ROOT", tmp_path)
    assert doc_tables.value("a.json", "run/wall_s/minutes:.1f") == "10.5"
    assert doc_tables.value("a.json", "run/seeds/len") == "3"
    assert doc_tables.value("b.yaml", "train/epochs") == "25"
    assert doc_tables.value("c.csv", "variant=convit/top1:.1f") == "84.7"
    assert doc_tables.value("c.csv", "variant=deit/top1/max") == "98.6"
    with pytest.raises(KeyError, match="no 'nothing'"):
        doc_tables.value("a.json", "run/nothing")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        doc_tables.value("missing.json", "x")


def test_the_params_reference_is_rendered_from_the_schema():
    text = (REPO / "docs" / "pipeline.md").read_text()
    block = re.search(r"<!-- table: params (\S+) -->\n(.*?)<!-- /table -->", text, re.S)
    assert block, "docs/pipeline.md has no generated params reference"
    rendered = doc_tables.render("params", block.group(1))
    assert block.group(2) == rendered
    for key in ("`train.epochs`", "`seeds`", "`tracking.ui_url`", "`resources.gpus`"):
        assert key in rendered, key


@pytest.mark.e2e  # publish records the commit: it runs git
def test_published_results_name_their_commit_and_machine(tmp_path):
    """publish.py writes source.json beside the copies; the docs' `source` block renders it, and a folder
    an earlier locvit published says its origin was not recorded."""
    (tmp_path / "report").mkdir()
    (tmp_path / "report" / "results.csv").write_text("variant\n")
    publish.publish(tmp_path / "report", tmp_path / "copy", ["results.csv"])
    import json

    source = json.loads((tmp_path / "copy" / "source.json").read_text())
    assert source["commit"] and source["machine"]["cpu"]
    lines = doc_tables.source_lines(tmp_path / "copy")
    assert lines[1][0] == source["machine"]["cpu"] and lines[1][2] == source["commit"]
    older = doc_tables.source_lines(tmp_path / "report")
    assert all("not recorded" in cell for cell in older[1])
