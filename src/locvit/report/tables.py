"""The results table: one row per variant, its test top-1 over seeds compared with the study's baseline.

results.csv (a stable interface: its columns are ``render.acc_csv_names`` and the rest, docs/statistics.md),
results_seeds.csv (variant, seed, test_top1), results.md/.tex (with a sentence per variant) and summary.json.
The baseline is params' ``baseline`` (default: the first DeiT/ViT variant); in a data-efficiency study each
variant's reference is the baseline at its training fraction. The statistics are ``locvit.report.stats``',
computed once per study (``Study.comparisons``). A run whose evaluation is missing is named, never filled.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from locvit.errors import InputError, MissingFileError
from locvit.io import write_json, write_text
from locvit.layout import REPORT_FILES
from locvit.report import stats
from locvit.report.render import RunLink, Table, mde_text, points, to_csv, to_latex, to_markdown
from locvit.report.study import Acc, Study, Variant, evaluations

KEYS = ["variant", "test_top1", "val_top1_mean", "model", "params_m"]
# results.csv's accuracy columns (the contract): the cell's field -> column, in order.
ACC_CSV = {
    "n_seeds": "n_seeds",
    "mean": "test_top1_mean",
    "std": "test_top1_std",
    "ci95_low": "test_top1_ci95_low",
    "ci95_high": "test_top1_ci95_high",
    "reference": "reference",
    "delta_vs_baseline": "delta_vs_baseline",
    "delta_ci95_low": "delta_ci95_low",
    "delta_ci95_high": "delta_ci95_high",
    "p_vs_baseline": "p_vs_baseline",
    "p_holm": "p_holm",
    "p_equivalence_holm": "p_equivalence_holm",
    "mde80": "mde80",
    "verdict": "verdict",
    "mlflow_run_ids": "mlflow_run_ids",
    "missing_seeds": "missing_seeds",
    "delta_ci90_low": "delta_ci90_low",
    "delta_ci90_high": "delta_ci90_high",
    "equivalence_margin_min": "equivalence_margin_min",
    "p_improvement": "p_improvement",
    "within_margin": "within_margin",
    "holm_family": "holm_family",
}
# The columns summary_lines reads: a results.csv without them is of an older locvit (columns added since are optional).
REQUIRED = (
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
)


def _val_mean(v: Variant) -> float | None:
    vals = [100.0 * e["val_top1"] for e in v.evals.values()]
    return sum(vals) / len(vals) if vals else None


def results_table(study: Study) -> Table:
    """The study's variants with their test top-1 against the baseline (Holm over all variants)."""
    baseline = study.baseline
    rows = [
        [v.name, study.acc(v), _val_mean(v), v.model, v.n_params() / 1e6 if v.n_params() else None]
        for v in study.variants.values()
    ]
    table = Table(
        "results",
        f"Results: {study.name}",
        f"Test top-1 (%) over seeds: n runs, mean ± sample std, 95 % interval of the mean (seeds and the "
        f"finite test set); the difference of each variant's mean to its reference's (baseline: "
        f"{baseline or 'none'}) with its 95 % interval and the 90 % one two one-sided tests read, the "
        "t-test's p after Holm's correction, the minimum detectable effect (MDE, 80 % power), the smallest "
        "margin the comparison could show equivalence within, the probability of improvement over seed "
        "pairs, the verdict and its Holm family. Validation top-1: mean over seeds; params in millions.",
        ["Variant", "Test top-1 (%)", "Val top-1 (%)", "Model", "Params (M)"],
        rows,
        keys=KEYS,
        detail=True,
        formats={4: ".3f"},
        acc_csv=ACC_CSV,
    )
    table.notes = (
        [_verdict(row[1], baseline) for row in table.rows] + table.notes
        if baseline
        else ["No baseline (no DeiT/ViT variant and no `baseline` key in params): differences are not tested."]
        + table.notes
    )
    table.notes += [row[1].unpaired for row in table.rows if row[1].unpaired]  # the pairing check's finding
    if any(row[1].seed_splits for row in table.rows):
        table.notes.append(
            "Each seed had its own train/test split (data.split: per_seed): intervals and tests are Nadeau and "
            "Bengio's corrected resampled t over the seeds, n - 1 df (docs/statistics.md)."
        )
    return table


def _verdict(acc: Acc, baseline: str) -> str:
    """One sentence a reader can act on: the difference, its interval, the verdict and what it rests on."""
    if not acc.n:
        return f"{acc.variant}: no evaluated seed."
    if acc.verdict == "baseline":
        return (
            f"{acc.variant} is the baseline."
            if acc.variant == baseline
            else f"{acc.variant} is the reference of its training fraction."
        )
    t = acc.test
    if t is None:
        return f"{acc.variant}: not compared with {baseline} (no evaluated seed on one side)."
    head = f"{acc.variant} vs {acc.reference}: {t.delta:+.2f} points"
    if t.p is None:
        return f"{head}, undecided: not tested ({t.why})."
    head += f" [{t.ci_low:+.2f}, {t.ci_high:+.2f}]"
    tost = f"90 % interval [{t.ci90_low:+.2f}, {t.ci90_high:+.2f}]"
    if acc.verdict in ("better", "worse"):
        if acc.within_margin:
            return (
                f"{head}, {acc.verdict} (Holm-adjusted p = {acc.p_holm:.3g}) and within ± {points(t.margin)} "
                f"(two one-sided tests, {tost}, Holm-adjusted p = {acc.p_equivalent_holm:.3g})."
            )
        return f"{head}, {acc.verdict} (Holm-adjusted p = {acc.p_holm:.3g})."
    if acc.verdict == "equivalent":
        return (
            f"{head}, equivalent: within ± {points(t.margin)} (two one-sided tests, {tost}, Holm-adjusted p = "
            f"{acc.p_equivalent_holm:.3g})."
        )
    return (
        f"{head}, undecided: neither a difference (Holm-adjusted p = {acc.p_holm:.3g}) nor equivalence within "
        f"± {points(t.margin)} (p = {acc.p_equivalent_holm:.3g}) is shown; {_sensitivity(acc)}"
    )


def _sensitivity(acc: Acc) -> str:
    """What an undecided comparison could have shown, at its estimated standard error."""
    margin = f"show equivalence within ± {acc.equivalence_bound:.2f} points at best"
    if acc.mde > 100:
        return f"no difference is detectable with these runs (80 % power), and it could {margin}."
    return (
        f"at its estimated standard error this comparison could detect a difference of {acc.mde:.2f} points "
        f"or more (80 % power) and {margin}."
    )


def seeds_csv(study: Study) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["variant", "seed", "test_top1"])
    for v in study.variants.values():
        for seed, value in sorted(v.acc().values.items()):
            writer.writerow([v.name, seed, value])
    return buf.getvalue()


def summary(table: Table) -> dict:
    """Test top-1 per variant as flat numbers, with the comparison's interval and verdict."""
    out = {}
    for row in table.rows:
        acc: Acc = row[1]
        s = acc.summary
        out[acc.variant] = {
            "test_top1_mean": s.mean if s else None,
            "test_top1_std": s.std if s else None,
            "test_top1_ci95_low": s.ci_low if s else None,
            "test_top1_ci95_high": s.ci_high if s else None,
            "seeds": acc.n,
            "delta_vs_baseline": acc.delta,
            "delta_ci95_low": acc.test.ci_low if acc.test else None,
            "delta_ci95_high": acc.test.ci_high if acc.test else None,
            "p_holm": acc.p_holm,
            "mde80": acc.mde,
            "equivalence_margin_min": acc.equivalence_bound,
            "p_improvement": acc.test.p_improvement if acc.test else None,
            "verdict": acc.verdict,
            "within_margin": acc.within_margin,
            "holm_family": acc.family,
        }
    return out


def write_results(study: Study, out_dir: Path, link: RunLink | None = None, notes: list[str] = ()) -> Table:
    """results.md/.csv/.tex, results_seeds.csv, summary.json and evaluations.json under ``out_dir``; ``notes``
    below the table (why its MLflow runs are missing or unlinked)."""
    table = results_table(study)
    table.notes += list(notes)
    write_json(out_dir / REPORT_FILES["evaluations"], evaluations(study))
    write_json(out_dir / REPORT_FILES["summary"], summary(table))
    write_text(out_dir / REPORT_FILES["md"], to_markdown(table, link, level=1))
    write_text(out_dir / REPORT_FILES["csv"], to_csv(table))
    write_text(out_dir / REPORT_FILES["seeds"], seeds_csv(study))
    write_text(out_dir / REPORT_FILES["tex"], to_latex(table))
    return table


def read_results_csv(path: Path) -> list[dict]:
    """The rows of a results.csv, after checking it has the columns ``summary_lines`` reads (a file
    written before the verdict columns lacks them: re-run its report). Columns added since (the 90 %
    interval, the equivalence margin, the probability of improvement, the Holm family) are read where
    present: a row of an older file has no such key."""
    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"{path} does not exist; give a results.csv written by the report step")
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise InputError(
                f"{path} lacks the columns {', '.join(missing)}: it is not a results.csv of this "
                "locvit (an older one has no verdicts); re-run the study's report (locvit report, or "
                "snakemake report) to rewrite it"
            )
        return list(reader)


def num(value: str, fmt: str = ".2f") -> str:
    """A CSV cell as a formatted number, ``–`` where it is empty."""
    return format(float(value), fmt) if value not in ("", None) else "–"


def summary_lines(rows: list[dict]) -> list[list[str]]:
    """results.csv's rows as the short table people read (``locvit results``, the README): a header,
    then per variant n, mean ± std, its interval, Δ to its reference with Δ's interval, MDE and the verdict."""
    refs = sorted({r["reference"] for r in rows if r.get("reference")})
    lines = [
        [
            "variant",
            "n",
            "test top-1 (%)",
            "95% CI",
            f"Δ vs {refs[0]}" if len(refs) == 1 else "Δ vs reference",
            "Δ 95% CI",
            "MDE",
            "verdict",
        ]
    ]
    for r in rows:
        ci = f"[{num(r['test_top1_ci95_low'])}, {num(r['test_top1_ci95_high'])}]" if r["test_top1_ci95_low"] else "–"
        dci = (
            f"[{num(r['delta_ci95_low'], '+.2f')}, {num(r['delta_ci95_high'], '+.2f')}]" if r["delta_ci95_low"] else "–"
        )
        mean = num(r["test_top1_mean"]) + (f" ± {num(r['test_top1_std'])}" if r["test_top1_std"] else "")
        delta = num(r["delta_vs_baseline"], "+.2f") + (f" vs {r['reference']}" if len(refs) > 1 else "")
        lines.append([r["variant"], r["n_seeds"], mean, ci, delta, dci, num(r["mde80"]), r["verdict"] or "–"])
    return lines


def as_markdown(lines: list[list[str]]) -> str:
    """A header and rows as a Markdown table (first column left-aligned, the rest right)."""
    out = ["| " + " | ".join(lines[0]) + " |", "|---|" + "---:|" * (len(lines[0]) - 1)]
    out += ["| " + " | ".join(line) + " |" for line in lines[1:]]
    return "\n".join(out) + "\n"


def as_text(lines: list[list[str]]) -> str:
    """A header and rows as aligned plain text (for the terminal)."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return (
        "\n".join(
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(line, widths))) for line in lines
        )
        + "\n"
    )


def plan_markdown(study: Study, delta: float) -> str:
    """Seeds and test images each comparison of a finished (pilot) study needs to detect ``delta`` points with
    80 % power at its Holm level, from the variance components its per-image hits estimate: the seed part
    shrinks with seeds, the image part only with test images."""
    lines = [
        f"Power plan for a difference of {points(delta)} (80 % power, two-sided, at each Holm family's "
        f"level alpha / m), from the per-image results of study {study.name!r}.",
        "",
        "| Comparison | Holm m | Seeds now | Test images | MDE now | Seed var. per seed (pts²) | "
        "Image var. per image (pts²) | Seeds per variant needed | Test images needed (any seeds) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    skipped = []
    for (name, ref), acc in study.comparisons.items():
        base = study.variants[ref].acc()
        unshared = acc.seed_splits or base.seed_splits  # a split per seed: no images shared by the seeds
        if acc.test is None or acc.test.p is None or acc.hits is None or base.hits is None or not acc.test.paired:
            skipped.append(f"{name} vs {ref}")
            continue
        if unshared:
            skipped.append(f"{name} vs {ref} (a split per seed)")
            continue
        c = stats.components(acc.hits, base.hits)
        images, alpha = acc.hits.shape[0], stats.ALPHA / acc.family_size
        n = stats.seeds_needed(c, delta, images, alpha)
        if images < stats.images_needed(c, delta, alpha):
            need = f"not reachable with {images} test images"
        else:
            need = f"over {stats.MOST_SEEDS:,}" if n is None else str(n)
        lines.append(
            f"| {name} vs {ref} | {acc.family_size} | {acc.n}/{base.n} | {images} | {mde_text(acc.mde)} | "
            f"{c.seed_a + c.seed_b:.3g} | {c.image:.3g} | {need} | {stats.images_needed(c, delta, alpha):,} |"
        )
    lines += [
        "",
        "Seed var.: both sides' seed components (over n seeds each: the seed part); image var.: the paired image "
        "component (over N images: the image part, which seeds do not reduce); the interaction is in the "
        "projection, not shown. One pilot's estimates: a plan, not a promise.",
    ]
    if skipped:
        lines.append(f"Not planned (no per-image results on both sides, or not tested): {', '.join(skipped)}.")
    return "\n".join(lines) + "\n"


def machines_markdown(studies: list[Study], names: list[str]) -> str:
    """Whether the runs of one study on several machines (the same variants, seeds and test images; e.g. two CPU
    kernels) may pool as more runs (``study_from_evaluations``): per variant, each later machine's mean against
    the first's (paired over the test images, each machine's seeds as independent runs, one Holm family per
    machine), and how many test images a seed's runs on the two machines disagree on beside two seeds of one."""
    first = studies[0]
    lines = [
        f"The machine as a factor: each machine's runs against {names[0]}'s, per variant (the same seeds and test "
        "images). Pooling the machines' runs as more runs (locvit stats with several files) assumes no machine "
        "effect, and that a seed's runs on two machines differ as two seeds do.",
        "",
        "| Machine | Variant | Δ vs first (pts) | 95 % interval | p (Holm) | Images disagreeing: a seed on both "
        "machines | two seeds of one machine |",
        "|---|---|---:|---|---:|---:|---:|",
    ]
    for name, other in zip(names[1:], studies[1:]):
        rows = []
        for variant in first.variants:
            a, b = other.variants[variant].acc(), first.variants[variant].acc()
            if a.hits is None or b.hits is None or a.hits.shape[0] != b.hits.shape[0]:
                continue
            test = stats.compare(list(a.values.values()), list(b.values.values()), 0.0, hits=(a.hits, b.hits))
            col_a, col_b = (
                {s: i for i, s in enumerate(sorted(a.values))},
                {s: i for i, s in enumerate(sorted(b.values))},
            )
            same = [(a.hits[:, col_a[s]] != b.hits[:, col_b[s]]).sum() for s in col_a if s in col_b]
            seeds = [(h[:, i] != h[:, j]).sum() for h in (a.hits, b.hits) for i in range(h.shape[1]) for j in range(i)]
            rows.append((variant, test, sum(same) / max(len(same), 1), sum(seeds) / max(len(seeds), 1)))
        for (variant, test, same, seeds), p_holm in zip(rows, stats.holm([t.p for _, t, _, _ in rows])):
            interval = "" if test.ci_low is None else f"[{test.ci_low:+.2f}, {test.ci_high:+.2f}]"
            p = "" if p_holm is None else f"{p_holm:.3g}"
            lines.append(f"| {name} | {variant} | {test.delta:+.2f} | {interval} | {p} | {same:.1f} | {seeds:.1f} |")
    return "\n".join(lines) + "\n"
