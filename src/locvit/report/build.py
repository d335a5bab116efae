"""The report step: every table and figure of one study, and their MLflow artifacts.

``build_report`` writes under ``out_dir`` results.md/.csv/.tex, summary.json, results_seeds.csv,
tables/<name>.md/.csv/.tex (``papers.PAPER_TABLES``), figures/<name>.png and pdf/<name>.pdf, index.md (all on
one page) and report.json (what was written, captions, what was skipped and why, what reached MLflow). What the
study cannot fill is not written, and an earlier report's files not written again are removed. With
``log_to_mlflow`` the tables link every run, per-variant figures are logged to that variant's runs and the run
tree is filled (``publish_tree``); a failure to reach MLflow is a warning, the files are written regardless.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from locvit.io import write_json, write_text
from locvit.layout import REPORT_FILES, StudyLayout
from locvit.report import plots
from locvit.report.papers import PAPER_TABLES
from locvit.report.render import RunLink, to_csv, to_latex, to_markdown
from locvit.report.study import Study, load_study
from locvit.report.tables import write_results

log = logging.getLogger(__name__)

DEFAULT_UI = "http://127.0.0.1:5000"  # `mlflow ui` / `mlflow server` default address


def build_report(
    config: dict,
    study_dir: str | Path,
    out_dir: str | Path,
    log_to_mlflow: bool = True,
    extra_studies: Sequence[tuple[dict, str | Path]] = (),
    tracking_db: str | Path | None = None,
    ui_base: str | None = None,
    params_file: str | Path | None = None,
) -> dict:
    """Write the study's report (config: ``locvit.config.jobs.report_config``); return what report.json records.

    extra_studies: (report config, study_dir) of other studies for the accuracy-against-fraction figure;
    tracking_db default: the study's ``mlflow.db`` (``MLFLOW_TRACKING_URI`` wins); ui_base default: the config's
    ``ui_url``; params_file is logged to the study's run as it is, unread.
    """
    study_dir, out_dir = Path(study_dir), Path(out_dir)
    ui_base = ui_base or config["ui_url"] or DEFAULT_UI
    study = load_study(config, study_dir)
    started = time.perf_counter()
    db = Path(tracking_db or StudyLayout(study_dir).tracking_db)
    client, unreachable = _tracking_client(study, db) if log_to_mlflow else (None, None)
    link = _run_links(client, study, ui_base) if client else None
    mlflow_notes = [f"MLflow links: none; the tracking backend {unreachable} when this report was built."] * bool(
        unreachable
    )
    if runs_note := _untracked(study_dir, db):  # runs trained while the backend did not answer
        mlflow_notes.append(runs_note)
    mlflow_s = time.perf_counter() - started
    previous = _previous_files(out_dir)
    for sub in ("tables", "figures", "pdf"):  # declared outputs of the step, so present even when empty
        (out_dir / sub).mkdir(parents=True, exist_ok=True)
    report = {"study": study.name, "tables": {}, "figures": {}, "skipped": {}, "mlflow": {}}

    results = write_results(study, out_dir, link, mlflow_notes)
    write_variant_metrics(study, out_dir / "metrics")
    report["tables"]["results"] = {ext: REPORT_FILES[ext] for ext in ("md", "csv", "tex")}

    index = [f"# Report: {study.name}", "", to_markdown(results, link)]
    for name, builder in PAPER_TABLES.items():
        table = builder(study)
        if isinstance(table, str):
            report["skipped"][name] = table
            continue
        md = to_markdown(table, link)
        for ext, text in (("md", md), ("csv", to_csv(table)), ("tex", to_latex(table))):
            write_text(out_dir / "tables" / f"{name}.{ext}", text)
        report["tables"][name] = {"title": table.title, **{ext: f"tables/{name}.{ext}" for ext in ("md", "csv", "tex")}}
        index.append(md)

    figures = _figures(study, extra_studies, out_dir / "figures", report["skipped"])
    index.append("## Figures\n")
    for fig in figures:
        report["figures"][fig.name] = {
            "png": _rel(fig.png, out_dir),
            "pdf": _rel(fig.pdf, out_dir) if fig.pdf else None,
            "caption": fig.caption,
            "variant": fig.variant,
        }
        index += [f"![{fig.name}]({_rel(fig.png, out_dir)})", "", fig.caption, ""]
    if client:
        started = time.perf_counter()
        report["mlflow"] = _log_figures(client, study, figures)
        mlflow_s += time.perf_counter() - started

    write_text(out_dir / REPORT_FILES["index"], "\n".join(index) + "\n")
    _remove_stale(out_dir, previous, report)
    if client:
        started = time.perf_counter()
        report["mlflow"]["tree"] = publish_tree(client, study, out_dir, params_file, ui_base)
        report["mlflow"]["seconds"] = round(mlflow_s + time.perf_counter() - started, 3)  # what tracking cost
    write_json(out_dir / REPORT_FILES["record"], report)
    return report


def write_variant_metrics(study: Study, folder: Path) -> None:
    """``metrics/<variant>.json``: the headline numbers of one variant, for ``dvc metrics show``
    (one row per variant): test top-1 mean and std over seeds (%), params (M), GMACs, inference
    images/s and its ratio to the baseline's (the throughput job's), mean ALS and mean attention
    distance (px). A number the study lacks is left out."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in set(folder.glob("*.json")) - {folder / f"{v}.json" for v in study.variants}:
        stale.unlink()
    for v in study.variants.values():
        acc, profile, speed = v.acc(), v.profile or {}, (study.throughput or {}).get(v.name, {})
        locality = {
            key: [a[key] for a in v.analyses.values() if a.get(key) is not None] for key in ("als_mean", "mad_mean")
        }
        values = {
            "test_top1_mean": acc.mean,
            "test_top1_std": acc.std,
            "params_m": profile["params"] / 1e6 if "params" in profile else None,
            "gmacs": profile.get("gmacs"),
            "infer_img_s": speed.get("img_s_median"),
            "img_s_vs_baseline": speed.get("ratio_vs_baseline"),
            **{key: sum(xs) / len(xs) if xs else None for key, xs in locality.items()},
        }
        write_json(folder / f"{v.name}.json", {k: round(float(x), 4) for k, x in values.items() if x is not None})


def _figures(study: Study, extra_studies, out_dir: Path, skipped: dict) -> list[plots.FigureFile]:
    figures = []
    studies = [study] + [load_study(p, d) for p, d in extra_studies]
    for name, draw, why in (
        ("curves", lambda: plots.curves(study, out_dir), "no training history (runs/*/metrics.json)"),
        (
            "attention_distance",
            lambda: plots.attention_distance(study, out_dir),
            "no analysis with a mean attention distance (analysis/*/seed*.json)",
        ),
        (
            "accuracy_vs_depth",
            lambda: plots.accuracy_vs_depth(study, out_dir),
            "needs one family at two or more depths (with profiles and evaluations)",
        ),
        (
            "accuracy_vs_fraction",
            lambda: plots.accuracy_vs_fraction(studies, out_dir),
            "needs a variant trained on two or more fractions of the training split (train_fractions, or other "
            "studies' data.train_fraction passed as extra_studies)",
        ),
    ):
        fig = draw()
        if fig:
            figures.append(fig)
        else:
            skipped[name] = why
    for v in study.variants.values():
        figures += [fig for draw in plots.VARIANT_FIGURES if (fig := draw(v, out_dir))]
        figures += plots.extras(v, out_dir)
        if v.no_locality:  # its ALS, similarity and rollout figures: nothing to draw, and why
            skipped[f"attention_{v.name}"] = f"{v.name}: {v.no_locality}"
    return figures


def _rel(path: Path, root: Path) -> str:
    return str(path.relative_to(root))


def _previous_files(out_dir: Path) -> set[str]:
    """Files the last report wrote under tables/ and figures/ (from its report.json)."""
    try:
        old = json.loads((out_dir / REPORT_FILES["record"]).read_text())
    except (OSError, ValueError):
        return set()
    files = {p for t in old.get("tables", {}).values() for k, p in t.items() if k in ("md", "csv", "tex")}
    files |= {p for f in old.get("figures", {}).values() for k in ("png", "pdf") if (p := f.get(k))}
    return {p for p in files if p.startswith(("tables/", "figures/"))}


def _remove_stale(out_dir: Path, previous: set[str], report: dict) -> None:
    now = {p for t in report["tables"].values() for k, p in t.items() if k in ("md", "csv", "tex")}
    now |= {p for f in report["figures"].values() for k in ("png", "pdf") if (p := f.get(k))}
    for rel in sorted(previous - now):
        (out_dir / rel).unlink(missing_ok=True)


def _tracking_client(study: Study, db: Path):
    """An MlflowClient on the study's backend and None, or None (with a warning) and why when it cannot be reached."""
    from locvit import tracking

    try:
        with tracking.bounded_http():
            return tracking.connect(study.name, db), None
    except Exception as err:  # any backend problem: the report is still written
        log.warning(f"MLflow backend not reachable ({err}); tables without run links, figures not logged")
        return None, f"{tracking.safe_uri(tracking.default_uri(db))} did not answer ({err})"


def _untracked(study_dir: Path, db: Path) -> str | None:
    from locvit.tracking.run import untracked  # MLflow's modules only when a report is built

    return untracked(study_dir, db)


def _run_links(client, study: Study, ui_base: str) -> RunLink:
    """Run id -> its page in the MLflow UI's model-training view (the experiment read from the run)."""
    from locvit import tracking

    run_ids = [run_id for v in study.variants.values() for run_id in v.run_ids().values()]
    with tracking.bounded_http():
        experiments, unknown = tracking.experiments_of(client, run_ids)
    if unknown:
        log.warning(
            f"{len(unknown)} MLflow run(s) not in the tracking backend (e.g. {unknown[0]}); "
            "their tables show the run id without a link"
        )
    return {run_id: tracking.ui_link(ui_base, exp, run_id) for run_id, exp in experiments.items()}.get


#: What the study's MLflow run keeps of the report (artifact folder ``report/``).
STUDY_ARTIFACTS = tuple(REPORT_FILES[role] for role in ("md", "csv", "seeds", "index", "summary"))


def publish_tree(client, study: Study, out_dir: Path, params_file: str | Path | None, ui_base: str) -> dict:
    """The study's MLflow run tree settled (``locvit.tracking.tree.adopt``) and filled: each variant
    run gets its row of results.csv as metrics at step 0 (the file's values, so a row of the UI's table
    reads as the file does) with its verdict and reference as tags, the throughput job's ratio to the
    baseline, and its seeds' mean training curves (``CURVES``, step = epoch); the study run gets the params file
    and the report (tables, figures) as artifacts. Both are marked FINISHED. A re-run of the report updates the
    same runs. Returns the ids and links (study run, compare view of the variant runs), or the error when the
    backend failed."""
    from locvit import tracking
    from locvit.report.tables import read_results_csv
    from locvit.tracking import tree

    try:
        with tracking.bounded_http():
            exp = tracking.retry(client.get_experiment_by_name, study.name).experiment_id
            ids = tree.adopt(client, exp, study.name, {v.name: v.run_ids().values() for v in study.variants.values()})
            for row in read_results_csv(out_dir / REPORT_FILES["csv"]):
                run_id = ids[row["variant"]]
                metrics = {k: float(x) for k, x in row.items() if k not in RESULT_TEXT and x not in ("", None)}
                speed = (study.throughput or {}).get(row["variant"], {})
                if speed.get("ratio_vs_baseline") is not None:
                    metrics["img_s_vs_baseline"] = speed["ratio_vs_baseline"]
                tracking.log_metrics(run_id, metrics, step=0)
                for epoch, means in _mean_history(study.variants[row["variant"]]).items():  # the compare view's curves
                    tracking.log_metrics(run_id, means, step=epoch)
                tracking.set_tags(
                    run_id,
                    {
                        "verdict": row["verdict"],
                        "reference": row["reference"] or "–",
                        "model": row["model"],
                        "holm_family": row.get("holm_family") or "–",
                        "within_margin": row.get("within_margin") or "–",
                    },
                )
                tracking.retry(client.set_terminated, run_id, status="FINISHED")
            study_id = ids[""]
            for run in tree.find(client, exp, {tree.ROLE: "variant", "study": study.name}):
                if run.info.status == "RUNNING":  # a mask search's rounds: the report runs after all training
                    tracking.retry(client.set_terminated, run.info.run_id, status="FINISHED")
            tracking.set_tags(study_id, {"baseline": study.config["baseline"], "variants": str(len(study.variants))})
            files = [out_dir / name for name in STUDY_ARTIFACTS if (out_dir / name).is_file()]
            failed = tracking.log_files(client, study_id, files, "report")
            for sub in ("tables", "figures"):
                failed += tracking.log_files(client, study_id, sorted((out_dir / sub).glob("*")), f"report/{sub}")
            if params_file:
                failed += tracking.log_files(client, study_id, [params_file])
            tracking.retry(client.set_terminated, study_id, status="FINISHED")
    except Exception as err:  # any backend problem: the report on disk is complete
        log.warning(f"the study's MLflow run tree was not updated ({type(err).__name__}: {err})")
        return {"error": f"{type(err).__name__}: {err}"}
    variant_ids = [ids[v] for v in study.variants]
    return {
        "study_run": study_id,
        "variant_runs": {v: ids[v] for v in study.variants},
        "study_link": tracking.ui_link(ui_base, exp, study_id),
        "compare_link": tracking.compare_link(ui_base, exp, variant_ids),
        "failed": failed,
    }


#: The per-epoch metrics a variant's run carries as the mean over its seeds (its curves in the UI).
CURVES = ("train_loss", "train_top1", "val_loss", "val_top1")


def _mean_history(variant) -> dict[int, dict[str, float]]:
    """Epoch -> the mean over the variant's seeds of each of ``CURVES`` (epochs every seed reached)."""
    histories = [m["history"] for m in variant.metrics.values() if m and m.get("history")]
    if not histories:
        return {}
    out = {}
    for epoch in range(min(len(h) for h in histories)):
        rows = [h[epoch] for h in histories]
        out[rows[0]["epoch"]] = {k: sum(r[k] for r in rows) / len(rows) for k in CURVES if all(k in r for r in rows)}
    return out


#: results.csv's columns that are not numbers (tags, or not for MLflow).
RESULT_TEXT = {
    "variant",
    "reference",
    "verdict",
    "mlflow_run_ids",
    "missing_seeds",
    "model",
    "within_margin",
    "holm_family",
}


def _log_figures(client, study: Study, figures: list[plots.FigureFile]) -> dict:
    """Each variant's figures, logged to every run of the variant (under ``report/``)."""
    from locvit import tracking

    logged, failed = 0, []
    with tracking.bounded_http():
        for fig in figures:
            if fig.variant is None:
                continue
            paths = [p for p in (fig.png, fig.pdf) if p]
            for seed, run_id in sorted(study.variants[fig.variant].run_ids().items()):
                errors = tracking.log_files(client, run_id, paths, "report")
                logged += len(paths) - len(errors)
                failed += [f"{fig.variant} seed {seed}: {e}" for e in errors]
    if failed:
        log.warning(f"{len(failed)} figure(s) not logged to MLflow (kept on disk): " + "; ".join(failed[:3]))
    return {"artifacts_logged": logged, "failed": failed}
