"""The results table: one row per variant, its test top-1 over seeds compared with the study's baseline.

Files (a stable interface for users' scripts)::

    results.csv        variant, n_seeds, test_top1_mean, test_top1_std, test_top1_ci95_low,
                       test_top1_ci95_high, reference, delta_vs_baseline, p_vs_baseline, p_holm,
                       mlflow_run_ids, missing_seeds, val_top1_mean, model, params_m
    results_seeds.csv  variant, seed, test_top1 (one row per evaluated run)
    results.md/.tex    the same table for people, with a sentence per variant saying whether
                       its difference to the baseline is significant
    summary.json       the headline numbers per variant (what ``dvc metrics show`` lists)

The baseline is the params' ``baseline`` (default: the first DeiT/ViT variant). Each other
variant's mean is compared with it by Welch's t-test, and the p-values of all variants are
corrected together with Holm's method (:mod:`locvit.report.stats`). A run that the study
defines but whose evaluation file is missing is named, never filled with a number.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from locvit.io import write_json, write_text
from locvit.report import stats
from locvit.report.render import RunLink, Table, to_csv, to_latex, to_markdown
from locvit.report.study import Acc, Study, Variant

KEYS = ["variant", "test_top1", "val_top1_mean", "model", "params_m"]
# results.csv's accuracy columns (the contract): the cell's field -> column, in order.
ACC_CSV = {"n_seeds": "n_seeds", "mean": "test_top1_mean", "std": "test_top1_std", "ci95_low": "test_top1_ci95_low",
           "ci95_high": "test_top1_ci95_high", "reference": "reference", "delta_vs_baseline": "delta_vs_baseline",
           "p_vs_baseline": "p_vs_baseline", "p_holm": "p_holm", "mlflow_run_ids": "mlflow_run_ids",
           "missing_seeds": "missing_seeds"}


def _val_mean(v: Variant) -> float | None:
    vals = [100.0 * e["val_top1"] for e in v.evals.values()]
    return sum(vals) / len(vals) if vals else None


def results_table(study: Study) -> Table:
    """The study's variants with their test top-1 against the baseline (Holm over all variants)."""
    baseline = study.baseline
    rows = [[v.name, study.acc(v), _val_mean(v), v.model, v.n_params() / 1e6 if v.n_params() else None]
            for v in study.variants.values()]
    table = Table("results", f"Results: {study.name}",
                  f"Test top-1 (%) over seeds: n runs, mean ± sample std, 95 % Student-t interval of the mean; the "
                  f"difference of each variant's mean to the baseline's ({baseline or 'none'}), Welch's t-test of "
                  "that difference and its p-value after Holm's correction over the variants. Validation top-1: "
                  "mean over seeds; params in millions.",
                  ["Variant", "Test top-1 (%)", "Val top-1 (%)", "Model", "Params (M)"], rows,
                  keys=KEYS, detail=True, formats={4: ".3f"}, acc_csv=ACC_CSV)
    table.notes = [_verdict(row[1], baseline) for row in table.rows] + table.notes if baseline else [
        "No baseline (no DeiT/ViT variant and no `baseline` key in params): differences are not tested."] + table.notes
    return table


def _verdict(acc: Acc, baseline: str) -> str:
    if not acc.n:
        return f"{acc.variant}: no evaluated seed."
    return stats.verdict(acc.variant, baseline, acc.test, acc.p_holm)


def seeds_csv(study: Study) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["variant", "seed", "test_top1"])
    for v in study.variants.values():
        for seed, value in sorted(v.acc().values.items()):
            writer.writerow([v.name, seed, value])
    return buf.getvalue()


def summary(table: Table) -> dict:
    """Test top-1 per variant as flat numbers (what ``dvc metrics show`` lists)."""
    out = {}
    for row in table.rows:
        acc: Acc = row[1]
        s = acc.summary
        out[acc.variant] = {"test_top1_mean": s.mean if s else None, "test_top1_std": s.std if s else None,
                            "test_top1_ci95_low": s.ci_low if s else None,
                            "test_top1_ci95_high": s.ci_high if s else None, "seeds": acc.n,
                            "delta_vs_baseline": acc.delta, "p_holm": acc.p_holm}
    return out


def write_results(study: Study, out_dir: Path, link: RunLink | None = None) -> Table:
    """results.md/.csv/.tex, results_seeds.csv and summary.json under ``out_dir``."""
    table = results_table(study)
    write_json(out_dir / "summary.json", summary(table))
    write_text(out_dir / "results.md", to_markdown(table, link, level=1))
    write_text(out_dir / "results.csv", to_csv(table))
    write_text(out_dir / "results_seeds.csv", seeds_csv(study))
    write_text(out_dir / "results.tex", to_latex(table))
    return table
