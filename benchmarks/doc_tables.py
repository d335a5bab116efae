"""Keep the tables the docs quote equal to the committed files they quote.

A quoted table sits between two markers that name its file::

    <!-- table: results benchmarks/results/demo/results.csv -->
    | variant | n | ... |
    <!-- /table -->

``results`` renders a results.csv as ``locvit results --csv`` does; ``efficiency`` renders a
data-efficiency table (report/tables/data_efficiency.csv) one row per fraction and variant;
``throughput`` a report/throughput.csv; ``pipeline`` the demo's wall time and per-rule job
time from a bench_pipeline.py result (pipeline.json); ``tests`` each lane of ``make test`` (tests/durations.json,
written by it): tests, outcomes, wall time, commit and machine.
Run from the repository root: ``python benchmarks/doc_tables.py`` rewrites every block of
README.md, tests/README.md and docs/*.md from its file; ``--check`` only lists the blocks that differ
(tests/test_docs.py runs it, so a doc cannot drift from its file).
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

from locvit.io import write_text
from locvit.report.tables import as_markdown, num, read_results_csv, summary_lines

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- table: (\w+) (\S+) -->\n)(.*?)(<!-- /table -->)", re.S)


def efficiency_lines(rows: list[dict]) -> list[list[str]]:
    """A data-efficiency CSV (one row per variant, a column group per fraction) as one line per
    fraction and variant: n, mean ± std, interval, Δ to the baseline at that fraction, MDE, verdict."""
    fractions = [k for k in rows[0] if k.endswith("% of train")]
    lines = [["train fraction", "variant", "n", "test top-1 (%)", "95% CI", "Δ vs reference", "Δ 95% CI", "MDE",
              "verdict"]]
    for f in fractions:
        for r in rows:
            if not r[f"{f} n"]:
                continue
            mean = num(r[f]) + (f" ± {num(r[f'{f} std'])}" if r[f"{f} std"] else "")
            ci = f"[{num(r[f'{f} ci95_low'])}, {num(r[f'{f} ci95_high'])}]" if r[f"{f} ci95_low"] else "–"
            delta = f"{num(r[f'{f} delta'], '+.2f')} vs {r[f'{f} reference']}" if r[f"{f} reference"] else "–"
            dci = (f"[{num(r[f'{f} delta_ci95_low'], '+.2f')}, {num(r[f'{f} delta_ci95_high'], '+.2f')}]"
                   if r[f"{f} delta_ci95_low"] else "–")
            lines.append([f.replace(" of train", ""), r["Variant"], r[f"{f} n"], mean, ci, delta, dci,
                          num(r[f"{f} mde80"]), r[f"{f} verdict"] or "–"])
    return lines


def throughput_lines(rows: list[dict]) -> list[list[str]]:
    """A throughput.csv: images/s (median over rounds, the rounds' range) and the ratio to the baseline."""
    lines = [["variant", "images/s", "rounds' range", "× baseline"]]
    for r in rows:
        lines.append([r["variant"], f"{float(r['img_s_median']):,.0f}",
                      f"{float(r['img_s_low']):,.0f}-{float(r['img_s_high']):,.0f}", num(r["ratio_vs_baseline"])])
    return lines


def pipeline_lines(path: Path) -> list[list[str]]:
    """A pipeline.json's demo from scratch: its wall time, then per rule the jobs and their summed job time
    (for training, the epochs' share and the rest), and MLflow's share of the job time where recorded."""
    import json

    data = json.loads(path.read_text())
    lines = [["rule", "jobs", "job time (s)", "of it in epochs (s)", "around the epochs (s)"]]
    for rule, r in data["demo_breakdown"].items():
        if rule != "all":
            lines.append([rule, str(r["jobs"]), f"{r['job_s']:,.1f}", f"{r['epochs_s']:,.1f}" if "epochs_s" in r else "",
                          f"{r['other_s']:,.1f}" if "other_s" in r else ""])
    total = sum(r["job_s"] for r in data["demo_breakdown"].values())
    lines.append(["all jobs", str(sum(r["jobs"] for rule, r in data["demo_breakdown"].items() if rule != "all")),
                  f"{total:,.1f}", "", ""])
    lines.append(["wall time", "", f"{data['demo_wall_s']:,.1f} ({data['demo_wall_s'] / 60:.1f} min)", "", ""])
    if "demo_mlflow" in data:  # MLflow's calls in every job, and the system-metrics sampler
        m = data["demo_mlflow"]
        lines.append(["of all jobs: MLflow", "", f"{m['total_s']:,.1f} ({100 * m['share_of_job_time']:.1f} %)", "",
                      f"training {m['train_s']:,.1f}, evaluation {m['evaluate_s']:,.1f}, report {m['report_s']:,.1f}, "
                      f"system metrics {m['system_metrics_s']:,.2f}"])
    return lines


def test_lanes_lines(path: Path) -> list[list[str]]:
    """tests/durations.json: per lane of ``make test``, its marker expression, tests, outcomes and wall time, and
    the commit and machine it ran on; then the two lanes together."""
    import json

    lanes = json.loads(path.read_text())["lanes"]
    lines = [["lane", "pytest -m", "tests", "passed", "skipped", "failed or errors", "wall time", "commit", "machine"]]
    for name in ("fast", "rest"):
        if name not in lanes:
            lines.append([name, "", "", "", "", "", "not recorded yet: run make test", "", ""])
            continue
        r = lanes[name]
        lines.append([name, f"`{r['marker']}`", str(r["tests"]), str(r["passed"]), str(r["skipped"]),
                      str(r["failed"] + r["error"]), f"{r['wall_s'] / 60:.1f} min ({r['wall_s']:,.0f} s)",
                      f"`{r['commit'][:12]}`" + (" with uncommitted changes" if r["commit"].endswith("-dirty") else ""),
                      r["machine"]])
    return lines


RENDER = {"results": summary_lines, "efficiency": efficiency_lines, "throughput": throughput_lines}
FILE_RENDER = {"pipeline": pipeline_lines, "tests": test_lanes_lines}  # kinds that read the file themselves


def render(kind: str, source: str) -> str:
    path = ROOT / source
    if kind not in RENDER and kind not in FILE_RENDER:
        raise ValueError(f"table kind {kind!r} (in a '<!-- table: ... -->' marker); allowed: "
                         f"{', '.join([*RENDER, *FILE_RENDER])}")
    if not path.is_file():
        raise FileNotFoundError(f"{source} (quoted by a '<!-- table: ... -->' marker) does not exist")
    if kind in FILE_RENDER:
        return as_markdown(FILE_RENDER[kind](path))
    rows = read_results_csv(path) if kind == "results" else list(csv.DictReader(path.open(newline="")))
    return as_markdown(RENDER[kind](rows))


def docs() -> list[Path]:
    return [ROOT / "README.md", ROOT / "tests" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def sync(check: bool) -> list[str]:
    """Rewrite (or, with ``check``, only compare) every quoted table; the blocks that differed."""
    stale = []
    for doc in docs():
        text = doc.read_text()
        new = BLOCK.sub(lambda m: m.group(1) + render(m.group(2), m.group(3)) + m.group(5), text)
        if new != text:
            stale += [f"{doc.relative_to(ROOT)}: {m.group(3)}" for m in BLOCK.finditer(text)
                      if m.group(4) != render(m.group(2), m.group(3))]
            if not check:
                write_text(doc, new)
    return stale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="list the tables that differ from their files; change nothing")
    args = parser.parse_args()
    stale = sync(args.check)
    for line in stale:
        print(("differs from its file: " if args.check else "rewritten: ") + line)
    sys.exit(1 if stale and args.check else 0)


if __name__ == "__main__":
    main()
