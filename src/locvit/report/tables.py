"""The results table: one row per variant, test top-1 mean ± std over seeds.

Written as Markdown, CSV and LaTeX. A run that the study defines but whose
evaluation file is missing is named in the row, never filled with a number.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path

from locvit.io import read_json, write_json, write_text
from locvit.report.render import tex_escape
from locvit.report.study import mean_std as study_mean_std


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for a single value, as this table prints it)."""
    mean, std = study_mean_std(values)
    return mean, 0.0 if std is None else std


def collect_rows(params: dict, eval_files: list[Path]) -> list[dict]:
    """Group evaluation results by variant, in the order of ``params['variants']``."""
    results: dict[tuple[str, int], dict] = {}
    for path in eval_files:
        result = read_json(path, "evaluation file", "Re-run its evaluate step.")
        results[(result["variant"], int(result["seed"]))] = result
    rows = []
    for name, spec in params["variants"].items():
        found = [results[(name, s)] for s in params["seeds"] if (name, s) in results]
        missing = [s for s in params["seeds"] if (name, s) not in results]
        accs = [100.0 * r["test_top1"] for r in found]
        row = {
            "variant": name,
            "model": spec["model"],
            "params_m": found[0]["n_params"] / 1e6 if found else None,
            "seeds": len(found),
            "test_top1_mean": mean_std(accs)[0] if accs else None,
            "test_top1_std": mean_std(accs)[1] if accs else None,
            "val_top1_mean": mean_std([100.0 * r["val_top1"] for r in found])[0] if found else None,
            "mlflow_run_ids": [r["mlflow_run_id"] for r in found],
            "missing_seeds": missing,
        }
        rows.append(row)
    return rows


def _acc_cell(row: dict, pm: str = "±") -> str:
    if row["test_top1_mean"] is None:
        return "missing"
    cell = f"{row['test_top1_mean']:.2f}"
    if row["seeds"] > 1:
        cell += f" {pm} {row['test_top1_std']:.2f}"
    return cell


def _missing_note(row: dict) -> str:
    return f"missing seed(s) {', '.join(map(str, row['missing_seeds']))}" if row["missing_seeds"] else ""


def to_markdown(rows: list[dict], study: str) -> str:
    lines = [
        f"# Results: {study}",
        "",
        "Test top-1 in %, mean ± sample std over seeds (n = seeds). Params in millions.",
        "",
        "| Variant | Model | Params (M) | Seeds | Test top-1 (%) | Val top-1 (%) | MLflow run ids | Notes |",
        "|---|---|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        params = f"{r['params_m']:.3f}" if r["params_m"] is not None else "-"
        val = f"{r['val_top1_mean']:.2f}" if r["val_top1_mean"] is not None else "-"
        ids = ", ".join(f"`{i}`" for i in r["mlflow_run_ids"]) or "-"
        lines.append(f"| {r['variant']} | `{r['model']}` | {params} | {r['seeds']} | {_acc_cell(r)} | {val} | {ids} | "
                     f"{_missing_note(r)} |")
    return "\n".join(lines) + "\n"


def to_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    fields = ["variant", "model", "params_m", "seeds", "test_top1_mean", "test_top1_std", "val_top1_mean",
              "mlflow_run_ids", "missing_seeds"]
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({**r, "mlflow_run_ids": " ".join(r["mlflow_run_ids"]),
                         "missing_seeds": " ".join(map(str, r["missing_seeds"]))})
    return buf.getvalue()


def to_latex(rows: list[dict], study: str) -> str:
    lines = [
        r"\begin{table}[t]", r"\centering",
        rf"\caption{{Results of study \texttt{{{tex_escape(study)}}}: test top-1 (\%), mean $\pm$ std over seeds.}}",
        r"\begin{tabular}{llrrr}", r"\toprule",
        r"Variant & Model & Params (M) & Seeds & Top-1 (\%) \\", r"\midrule",
    ]
    pm = r"$\pm$"
    for r in rows:
        params = f"{r['params_m']:.3f}" if r["params_m"] is not None else "--"
        acc = _acc_cell(r, pm)
        lines.append(rf"{tex_escape(r['variant'])} & \texttt{{{tex_escape(r['model'])}}} & {params} & {r['seeds']} & {acc} \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def summary(rows: list[dict]) -> dict:
    """Test top-1 per variant as flat numbers (what ``dvc metrics show`` lists)."""
    return {r["variant"]: {"test_top1_mean": r["test_top1_mean"], "test_top1_std": r["test_top1_std"],
                           "seeds": r["seeds"]} for r in rows}


def write_tables(params: dict, eval_files: list[Path], out_md: Path, out_csv: Path, out_tex: Path,
                 out_summary: Path) -> list[dict]:
    rows = collect_rows(params, eval_files)
    write_json(out_summary, summary(rows))
    write_text(out_md, to_markdown(rows, params["study"]))
    write_text(out_csv, to_csv(rows))
    write_text(out_tex, to_latex(rows, params["study"]))
    return rows
