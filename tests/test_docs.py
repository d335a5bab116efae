"""The docs against the files they cite, where a change elsewhere would leave them stale.

* A count of malformed study files quoted in the docs (docs/pipeline.md keeps one) equals the
  cases ``test_bad_configs.py`` parametrizes over (``helpers.BAD_CONFIGS``).
* Every test file says what it covers in its module docstring; tests/README.md stays a how-to-run.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from helpers import BAD_CONFIGS

from doctools import doc_tables, model_table, publish

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
README = TESTS / "README.md"
DOCS = [REPO / "README.md", README, REPO / "benchmarks" / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TEST_FILES = sorted(p.name for p in TESTS.glob("test_*.py"))

# "52 malformed study files", "52 files in `tests/bad_configs/`", "52 bad configs" (a line break may split them)
BAD_CONFIG_COUNT = re.compile(
    r"(\d+)\s+(?:malformed\s+study\s+files|files\s+in\s+`tests/bad_configs/`|bad\s+configs?\b)"
)


def test_the_quoted_bad_config_count_is_the_parametrized_corpus():
    cases = BAD_CONFIGS  # what test_bad_configs.py parametrizes over
    assert len(cases) == len(list((TESTS / "bad_configs").glob("*.yaml")))
    assert '@pytest.mark.parametrize("path", BAD_CONFIGS' in (TESTS / "test_bad_configs.py").read_text()
    quoted = {
        doc.relative_to(REPO).as_posix(): [int(n) for n in BAD_CONFIG_COUNT.findall(doc.read_text())] for doc in DOCS
    }
    assert quoted["docs/pipeline.md"], "docs/pipeline.md no longer says how many bad configs there are"
    wrong = {doc: counts for doc, counts in quoted.items() if any(n != len(cases) for n in counts)}
    assert not wrong, f"the docs quote {wrong} bad configs; tests/bad_configs/ has {len(cases)}"


def test_every_test_file_says_what_it_covers():
    """tests/README.md says how to run the suite; what a file covers is its module docstring."""
    bare = [f for f in TEST_FILES if not ast.get_docstring(ast.parse((TESTS / f).read_text()))]
    assert not bare, f"test files without a module docstring: {bare}"
    assert len(README.read_text().splitlines()) <= 60


@pytest.mark.usefixtures("cache_in_tmp")  # the cost tables count the models test_cost counts
def test_quoted_tables_equal_the_files_they_quote():
    """Every `<!-- table: kind file -->` block in README.md and docs/ renders from its committed file
    (doctools/doc_tables.py); the README's demo table is one of them."""
    assert "<!-- table: results benchmarks/results/demo/results.csv -->" in (REPO / "README.md").read_text()
    assert doc_tables.sync(check=True) == [], "run: python -m doctools.doc_tables"


def test_committed_tables_link_to_no_mlflow_server_the_reader_lacks():
    """Copies of a study's report (docs/*/, benchmarks/results/*/) name runs by id, never by a link to the
    MLflow UI of the machine that made them (doctools/publish.py)."""
    run = "a18883462af74210a293978a7f2795c0"
    assert (
        publish.unlink_runs(f"| x | [s0](http://127.0.0.1:5000/#/experiments/1/runs/{run}) |") == "| x | `a1888346` |"
    )
    committed = [*REPO.glob("docs/*/*.md"), *REPO.glob("benchmarks/results/*/*.md")]
    assert committed
    linked = [str(p.relative_to(REPO)) for p in committed if publish.RUN_LINK.search(p.read_text())]
    assert linked == []


def test_the_two_machines_figures_are_the_files():
    """reproducibility.md's Xeon-against-AMD range of mean differences, and 'inside the AMD run's 95 % interval',
    recomputed from the committed per-seed values and the AMD's results table (the README's demo, AVX-512) of the
    same training code."""
    import csv
    import statistics

    results = REPO / "benchmarks" / "results"
    amd = {r["variant"]: r for r in csv.DictReader((results / "demo" / "results.csv").open())}
    seeds: dict[str, list[float]] = {}
    for r in csv.DictReader((results / "demo_xeon" / "results_seeds.csv").open()):
        seeds.setdefault(r["variant"], []).append(float(r["test_top1"]))
    diffs = {v: statistics.mean(x) - float(amd[v]["test_top1_mean"]) for v, x in seeds.items()}
    assert set(diffs) == set(amd)
    text = " ".join((REPO / "docs" / "reproducibility.md").read_text().split())
    assert f"{min(diffs.values()):+.2f} to {max(diffs.values()):+.2f} points from the AMD's".lstrip("+") in text
    for v, x in seeds.items():
        assert float(amd[v]["test_top1_ci95_low"]) <= statistics.mean(x) <= float(amd[v]["test_top1_ci95_high"]), v


def test_a_results_csv_of_an_older_locvit_is_named_with_what_to_do(tmp_path):
    """`locvit results --csv` and the doc tables read a results.csv through read_results_csv: the Xeon's
    file, written before the verdict columns, gets an error naming it and the fix, not a KeyError."""
    from locvit.report.tables import read_results_csv

    old = REPO / "benchmarks" / "results" / "demo_xeon" / "results.csv"
    with pytest.raises(ValueError, match=r"demo_xeon/results\.csv lacks the columns .*delta_ci95_low.*re-run"):
        read_results_csv(old)
    with pytest.raises(FileNotFoundError, match="nothing.csv does not exist"):
        read_results_csv(tmp_path / "nothing.csv")
    assert len(read_results_csv(REPO / "benchmarks" / "results" / "demo" / "results.csv")) == 8


def test_the_system_metrics_cost_claim_is_the_files():
    """tracking.md and the schema say sampling at the default interval costs under 1 % of a run: the benchmark's
    file."""
    import json

    import yaml

    cost = json.loads((REPO / "benchmarks" / "results" / "tracking_cost.json").read_text())
    schema = yaml.safe_load((REPO / "src" / "locvit" / "config" / "params.schema.yaml").read_text())
    default = schema["properties"]["tracking"]["properties"]["system_metrics_s"]["default"]
    assert cost["default_interval_s"] == default and cost["samples_logged"] >= 10
    assert cost["share_of_one_core_at_default"] == pytest.approx(cost["cpu_ms_per_sample"] / 1000 / default, rel=1e-2)
    assert cost["share_of_one_core_at_default"] < 0.01 == cost["goal"]
    assert (
        "goal: under <!-- value benchmarks/results/tracking_cost.json goal/pct"
        in (REPO / "docs" / "tracking.md").read_text()
    )


def test_the_demos_verdict_sentences_are_the_files():
    """The sentences on the demo's verdicts (statistics.md) and on its two instruction sets (reproducibility.md)
    quote both runs' results.csv through value spans, beside the side-by-side table: a re-run with other verdicts
    re-renders them."""
    stats, repro = ((REPO / "docs" / f).read_text() for f in ("statistics.md", "reproducibility.md"))
    demo, avx2 = "benchmarks/results/demo/results.csv", "benchmarks/results/demo_avx2/results.csv"
    assert f"<!-- table: side_by_side {demo},{avx2} -->" in repro
    assert f"<!-- value {avx2} variant=lsa/verdict -->" in repro
    assert f"<!-- value {demo} verdict=undecided/len -->" in stats


def test_the_model_table_is_what_the_models_count():
    """benchmarks/results/model_table.csv (docs/models.md quotes it) holds the params and GMACs the models
    have now, counted on the meta device by doctools/model_table.py, and the papers' numbers."""
    committed = (REPO / "benchmarks" / "results" / "model_table.csv").read_text()
    assert model_table.as_csv(model_table.rows()) == committed, "run: python -m doctools.model_table"


def _results_csv(path: Path, verdicts: dict[str, str]) -> Path:
    """A results.csv with the columns summary_lines reads: a baseline and one row per compared variant."""
    import csv

    columns = [
        "variant",
        "n_seeds",
        "test_top1_mean",
        "test_top1_std",
        "test_top1_ci95_low",
        "test_top1_ci95_high",
        "reference",
        "delta_vs_baseline",
        "delta_ci95_low",
        "delta_ci95_high",
        "p_vs_baseline",
        "p_holm",
        "p_equivalence_holm",
        "mde80",
        "verdict",
        "mlflow_run_ids",
        "missing_seeds",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerow(
            {"variant": "deit", "n_seeds": 3, "test_top1_mean": 97.0, "test_top1_std": 1.0, "verdict": "baseline"}
        )
        for name, verdict in verdicts.items():
            w.writerow(
                {
                    "variant": name,
                    "n_seeds": 3,
                    "test_top1_mean": 98.5,
                    "test_top1_std": 0.5,
                    "reference": "deit",
                    "delta_vs_baseline": 1.5,
                    "delta_ci95_low": 0.25,
                    "delta_ci95_high": 2.75,
                    "mde80": 2.0,
                    "verdict": verdict,
                }
            )
    return path


def test_a_side_by_side_table_says_where_two_runs_verdicts_differ(tmp_path):
    """Two machines' demos (or two protocols' data-efficiency tables) side by side: each comparison's numbers
    from both files, the instruction set a folder's source.json records in its label, and 'no' where the
    verdicts differ; a data-efficiency table keeps one row per fraction and variant."""
    import csv
    import json

    a = _results_csv(tmp_path / "demo" / "results.csv", {"lsa": "better", "ibit": "undecided"})
    b = _results_csv(tmp_path / "demo_avx2" / "results.csv", {"lsa": "undecided", "ibit": "undecided"})
    (b.parent / "source.json").write_text(json.dumps({"machine": {"cpu_capability": "AVX2"}}))
    lines = doc_tables.side_by_side_lines([a, b])
    assert lines[0][1] == "demo: n" and lines[0][5] == "demo_avx2 (AVX2): n" and lines[0][-1] == "same verdict"
    assert [line[0] for line in lines[1:]] == ["deit", "lsa", "ibit"]
    assert lines[2] == [
        "lsa",
        "3",
        "98.50 ± 0.50",
        "+1.50 [+0.25, +2.75]",
        "better",
        "3",
        "98.50 ± 0.50",
        "+1.50 [+0.25, +2.75]",
        "undecided",
        "**no**",
    ]
    assert lines[3][-1] == "yes" and lines[1][-1] == "yes"
    efficiency = REPO / "docs" / "data_efficiency" / "same_epochs" / "data_efficiency.csv"
    both = doc_tables.side_by_side_lines([efficiency, efficiency])
    assert both[0][:2] == ["train fraction", "variant"] and {line[-1] for line in both[1:]} == {"yes"}
    assert len(both) == len(doc_tables.efficiency_lines(list(csv.DictReader(efficiency.open()))))
    with pytest.raises(ValueError, match="two files"):
        doc_tables.side_by_side_lines([a])


@pytest.mark.parametrize("protocol", ["same_epochs", "same_images"])
def test_the_efficiency_studys_whole_data_runs_are_the_demos(protocol):
    """docs/data_efficiency.md: the whole-data rows of each protocol's table are the demo's runs of the same
    models, made on the same machine (their source.json records say so), so their per-seed values are equal."""
    import csv
    import json

    import yaml

    folder = REPO / "docs" / "data_efficiency" / protocol
    demo = REPO / "benchmarks" / "results" / "demo"
    machine = [json.loads((f / "source.json").read_text())["machine"] for f in (folder, demo)]
    assert [(m["cpu"], m["cpu_capability"], m["torch"]) for m in machine] == [
        (machine[1]["cpu"], machine[1]["cpu_capability"], machine[1]["torch"])
    ] * 2
    ours = yaml.safe_load((REPO / "presets" / "data_efficiency.yaml").read_text())["variants"]
    theirs = yaml.safe_load((REPO / "params.yaml").read_text())["variants"]
    twin = {
        name: next(d for d, t in theirs.items() if (t["model"], t["kwargs"]) == (spec["model"], spec["kwargs"]))
        for name, spec in ours.items()
    }

    def seeds(path: Path) -> dict[tuple[str, str], str]:
        return {(r["variant"], r["seed"]): r["test_top1"] for r in csv.DictReader(path.open())}

    efficiency, demo_seeds = seeds(folder / "results_seeds.csv"), seeds(demo / "results_seeds.csv")
    whole = {(twin[v], s): x for (v, s), x in efficiency.items() if v in ours and (twin[v], s) in demo_seeds}
    assert len(whole) == 3 * len(ours)  # the demo's three seeds of every family (same_images trains one more)
    assert whole == {k: demo_seeds[k] for k in whole}
